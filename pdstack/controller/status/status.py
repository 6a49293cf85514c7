"""`pdstack status -i INVENTORY`: one read-only look at a deployment's health, for the operator's first look.

It reaches the hosts the way site.yml does: `ansible all -i INVENTORY -m script` runs the host-side artifact's
`status-collect` (pdstack/hostside/status_collect.py in build/state/<inventory>/pdstack-hostside.pyz, built here as
the preflight builds it) with each host's python3, from a temporary copy (Ansible's inventory and connection, no
second list of addresses); the collector only reads. The controller adds the last smoke result
(build/smoke/<inventory>/latest), judges (status_judge.py) and renders (status_view.py). Exit 0 all well, 1
attention, 2 bad inventory, 3 a host cannot be reached.
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from pdstack.controller.load import inventory, rules
from pdstack.controller.render import hostside
from pdstack.controller.status import status_judge, status_view
from pdstack.errors import InventoryError, PdstackError

ROOT = Path(__file__).resolve().parents[3]


def collector(source: str) -> Path:
    """The host-side artifact the collector runs from: the preflight's, build/state/<inventory>/pdstack-hostside.pyz."""
    return ROOT / "build" / "state" / Path(source).resolve().name / hostside.FILENAME


def check_inventory(source: str) -> tuple[list[str], list[str], dict[str, dict[str, Any]]]:
    """The inventory read strictly (the files preflight reads first): its hosts, its monitoring group and each
    host's address (ansible_host, for an unreachable host's next step). InventoryError
    (exit 2) on a bad one, before any host is contacted."""
    if not Path(source).is_dir():
        raise InventoryError([f"-i {source}: not an inventory directory (expected hosts.yml with group_vars/ and "
                              "host_vars/, e.g. inventory/production)"])
    hostvars, groups, _ = inventory.load_located(source)
    if not hostvars:
        raise InventoryError([f"inventory {source}: no hosts; list the GPU host(s) in hosts.yml"])
    reach = {h: str(hv.get("ansible_host") or h) for h, hv in hostvars.items()}
    return sorted(hostvars), sorted(h for h in groups.get("monitoring") or [] if h in hostvars), reach


def ports(source: str) -> tuple[int, int]:
    """(Prometheus, dcgm-exporter) ports: the plan's dcgm port when this controller planned the inventory, else the
    roles' defaults (load/rules.py, the one source of those ports)."""
    dcgm = rules.role_port("dcgm_exporter", "dcgm_exporter_port")
    plan = ROOT / "build" / "state" / Path(source).resolve().name / "plan.json"
    try:
        dcgm = int(json.loads(plan.read_text())["monitoring"]["dcgm_exporter_port"])
    except (OSError, ValueError, KeyError, TypeError):
        pass
    return rules.role_port("prometheus", "prometheus_listen"), dcgm


def ansible_command(source: str) -> list[str]:
    """The ad-hoc run of the collector, its artifact built first (this checkout's code; the same bytes leave the
    preflight's file as it is)."""
    ansible = Path(sys.executable).parent / "ansible"
    prometheus_port, dcgm_port = ports(source)
    hostside.build(collector(source))
    args = (f"{shlex.quote(str(collector(source)))} status-collect --prometheus-port {prometheus_port} "
            f"--dcgm-port {dcgm_port}")
    # absolute: ansible runs in the repo root (its ansible.cfg), the operator anywhere; a hung host gives up alone
    return [str(ansible) if ansible.exists() else "ansible", "all", "-i", str(Path(source).resolve()), "-T", "10",
            "--task-timeout", "30", "-m", "ansible.builtin.script",
            "-a", json.dumps({"cmd": args, "executable": "/usr/bin/python3"})]


def ansible_env() -> dict[str, str]:
    """The json callback for the ad-hoc run (and only it: ansible.cfg's profile_tasks would print into stdout)."""
    return {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_STDOUT_CALLBACK": "ansible.posix.json",
            "ANSIBLE_LOAD_CALLBACK_PLUGINS": "1", "ANSIBLE_CALLBACKS_ENABLED": "ansible.posix.json",
            "ANSIBLE_NOCOLOR": "1", "ANSIBLE_DEPRECATION_WARNINGS": "0", "ANSIBLE_LOCALHOST_WARNING": "0"}


def parse_ansible(stdout: str, hosts: list[str]) -> dict[str, dict[str, Any]]:
    """The json callback's output -> {host: the collector's report | {"unreachable": msg} | {"failed": msg}}."""
    try:
        doc = json.loads(stdout[stdout.index("{"):])
        results = doc["plays"][0]["tasks"][0]["hosts"]
    except (ValueError, KeyError, IndexError, TypeError) as e:
        raise PdstackError(f"ansible's output is not the json callback's ({e}): {stdout[-500:]}") from None
    out: dict[str, dict[str, Any]] = {}
    for host in hosts:
        r = results.get(host)
        if r is None:
            out[host] = {"unreachable": "ansible returned no result for it"}
        elif r.get("unreachable"):
            out[host] = {"unreachable": (r.get("msg") or "unreachable").strip()[:300]}
        elif r.get("failed") and "rc" not in r:  # the collector never ran: the connection failed or hung
            out[host] = {"unreachable": (r.get("msg") or "no result").strip()[:300]}
        elif r.get("failed") or r.get("rc"):
            out[host] = {"failed": (r.get("stderr") or r.get("msg") or f"rc {r.get('rc')}").strip()[-300:]}
        else:
            try:
                out[host] = json.loads(r.get("stdout") or "")
            except ValueError as e:
                out[host] = {"failed": f"its output is not JSON ({e}): {(r.get('stdout') or '')[:200]}"}
    return out


def collect_hosts(source: str, hosts: list[str], timeout_s: float = 60.0) -> dict[str, dict[str, Any]]:
    try:
        p = subprocess.run(ansible_command(source), capture_output=True, text=True, env=ansible_env(), cwd=ROOT,
                           timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return {h: {"unreachable": f"no answer within {timeout_s:g} s"} for h in hosts}
    except OSError as e:
        raise PdstackError(f"cannot run ansible ({e}); run pdstack from the venv (./dev.sh setup)") from None
    if p.returncode not in (0, 2, 4, 8) or "{" not in p.stdout:  # 2 failed, 4 unreachable: per host below
        if "Unable to parse" in p.stderr or "inventory" in p.stderr.lower() and p.returncode == 5:
            raise InventoryError([f"ansible cannot read inventory {source}: {p.stderr.strip()[-400:]}"])
        raise PdstackError(f"ansible exited {p.returncode}: {(p.stderr or p.stdout).strip()[-600:]}")
    return parse_ansible(p.stdout, hosts)


def smoke_result(source: str, root: Path = ROOT / "build" / "smoke", now: float | None = None) -> dict | None:
    """The controller's last smoke summary for this inventory, with its age; None when none ran here."""
    f = root / Path(source).resolve().name / "latest" / "summary.json"
    if not f.exists():
        return None
    try:
        s = json.loads(f.read_text())
    except (OSError, ValueError) as e:
        return {"error": f"{f}: unreadable ({e})"}
    now = time.time() if now is None else now
    g = s.get("gates") or {}
    recall, bench = g.get("recall") or {}, g.get("bench") or {}
    return {"passed": bool(s.get("passed")), "failed": s.get("failed") or [], "dir": s.get("dir") or str(f.parent),
            "age_s": now - f.stat().st_mtime,
            "verdicts": {k: bool(v.get("passed")) for k, v in g.items() if isinstance(v, dict)},
            "horizon": recall.get("horizon"), "min_horizon": recall.get("min_horizon"),
            "c1_tps": bench.get("c1_decode_tps"), "floor_tps": bench.get("floor_tps")}


def snapshot(source: str, collect=None, smoke=None) -> dict[str, Any]:
    """One look: every host's report, the smoke result, the findings and the exit code."""
    t0 = time.monotonic()
    hosts, monitoring, reach = check_inventory(source)
    reports = (collect or collect_hosts)(source, hosts)
    view: dict[str, Any] = {"inventory": source, "time": time.time(), "hosts": reports,
                            "monitoring_hosts": monitoring, "reach": reach, "prometheus_port": ports(source)[0],
                            "smoke": (smoke or smoke_result)(source)}
    findings = status_judge.judge(view)
    view["findings"] = [f.to_dict() for f in findings]
    view["exit_code"] = status_judge.exit_code(findings)
    view["seconds"] = round(time.monotonic() - t0, 2)
    return view


def _sleep(seconds: float) -> None:
    time.sleep(seconds)


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("-i", "--inventory", required=True, help="inventory directory, e.g. inventory/production")
    p.add_argument("--json", action="store_true", help="print the whole view as JSON (for scripts)")
    p.add_argument("--watch", type=float, metavar="N", help="refresh every N seconds until interrupted")
    p.add_argument("--color", choices=("auto", "always", "never"), default="auto",
                   help="colour the table (auto: only on a terminal, and not with NO_COLOR set)")


def run(args: argparse.Namespace) -> int:
    color = args.color == "always" or (args.color == "auto" and sys.stdout.isatty() and not os.environ.get("NO_COLOR"))
    if args.watch is not None and args.watch <= 0:
        raise InventoryError([f"--watch {args.watch:g}: give the refresh interval in seconds, > 0"])
    code = status_judge.EXIT_OK
    try:
        while True:
            view = snapshot(args.inventory)
            code = view["exit_code"]
            if args.json:
                print(json.dumps(view, indent=1, default=str), flush=True)
            else:
                if args.watch and sys.stdout.isatty():
                    print("\x1b[H\x1b[2J", end="")
                print(status_view.render(view, color=color), flush=True)
            if not args.watch:
                return code
            _sleep(args.watch)
    except KeyboardInterrupt:  # --watch ends with Ctrl-C: the last look's exit code
        return code
