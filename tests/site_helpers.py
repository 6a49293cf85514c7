"""Helpers of the tests that run site.yml against systemd test hosts (tests/test_site.py, tests/test_site_three.py,
tests/test_site_rollouts.py, tests/test_image_pull.py, tests/test_site_model.py)."""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent


def hostside_artifact() -> Path:
    """The host-side artifact as the preflight builds it (pdstack-hostside.pyz), for tests that run host code the
    way a host does. In the temp dir under a name that carries its sha256, so parallel workers share one file."""
    from pdstack.controller.render import hostside
    sha = hashlib.sha256(hostside.build_bytes()).hexdigest()
    dest = Path(tempfile.gettempdir()) / f"pdstack-hostside-{sha[:16]}.pyz"
    hostside.build(dest)
    return dest


def engine_or_skip() -> None:
    docker = pytest.importorskip("docker")
    try:
        docker.from_env().ping()
    except Exception as e:  # CI starts dockerd (./dev.sh); a developer machine may not run one
        if os.environ.get("CI"):
            pytest.fail(f"CI=true but no Docker engine is reachable ({e}); .ci/run must start it (./dev.sh setup)")
        pytest.skip(f"no Docker engine reachable ({e}); ./dev.sh setup starts one")


def playbook(inventory: Path | str, *args: str, timeout: int = 900, book: str = "site.yml"
             ) -> subprocess.CompletedProcess:
    """`ansible-playbook BOOK -i INVENTORY ARGS...` from the repo root (site.yml, or one phase's playbook)."""
    from pdstack.testing import mirror
    mirror.ensure()  # the sim inventories' model phase fetches from it (a no-op while nginx serves)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(BIN / "ansible-playbook"), book, "-i", str(inventory), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def recap(out: str) -> dict[str, dict[str, int]]:
    rows = {}
    for m in re.finditer(r"^(\S+)\s+: ((?:\w+=\d+\s*)+)$", out, re.M):
        rows[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    assert rows, f"no PLAY RECAP in:\n{out[-3000:]}"
    return rows


def changed_tasks(out: str) -> list[str]:
    """The tasks a playbook run reported changed (TASK header, then the changed line): for assertion messages."""
    found, task = [], ""
    for line in out.splitlines():
        if line.startswith("TASK ["):
            task = line.split("]", 1)[0] + "]"
        elif line.startswith("changed: ["):
            found.append(f"{task} {line[:120]}")
    return found


def sh(host: str, *cmd: str, timeout: int = 60) -> subprocess.CompletedProcess:
    return subprocess.run(["docker", "exec", host, *cmd], capture_output=True, text=True, timeout=timeout)


def host_file(host: str, path: str) -> str | None:
    r = sh(host, "cat", path)
    return r.stdout if r.returncode == 0 else None


def container_id(host: str, name: str) -> str | None:
    """The container's id, or None while it does not exist (between a stop and systemd's restart)."""
    r = sh(host, "docker", "inspect", "--format", "{{.Id}}", name)
    return r.stdout.strip() if r.returncode == 0 else None


def post(url: str, body: dict, timeout: float = 60) -> tuple[int, str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            return r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode(errors="replace")
    except (urllib.error.URLError, TimeoutError, ConnectionError) as e:
        return -1, str(e)


def completion(router: str, max_tokens: int = 8, timeout: float = 60) -> tuple[int, str]:
    return post(f"{router}/v1/completions", {"model": "deepseek-v4-flash", "prompt": "Hello there",
                                             "max_tokens": max_tokens}, timeout=timeout)


def saved_sim_image() -> dict:
    """The sim image built and saved where inventory/test points (build/manifest-sim.json, build/images/sim.tar)."""
    engine_or_skip()
    from pdstack.controller.imagebuild.pipeline import build
    return build("sim", save=str(ROOT / "build" / "images" / "sim.tar"))


def layout_copy(layout: str, dest: Path) -> Path:
    """inventory/test/<layout> copied to `dest` (its group_vars symlink followed), the model lock's path made
    absolute (in the layout it is relative to inventory/test/<layout>): a copy a test may edit. Its directory name is
    the layout's name for the controller's state (build/state/<name>)."""
    shutil.copytree(ROOT / "inventory" / "test" / layout, dest, symlinks=False)
    model = dest / "group_vars" / "all" / "model.yml"
    m = yaml.safe_load(model.read_text())
    m["pdstack_model"]["source"]["lock"] = str(ROOT / "inventory" / "locks" / "pdstack-sim.json")
    model.write_text(yaml.safe_dump(m, sort_keys=False))
    return dest


def vaulted(inv: Path, secrets: Path, whole: str, inline: str, key: str) -> Path:
    """Encrypt `inv`/`whole` whole and turn `key` of `inv`/`inline` (an indented `key: value` line) into an inline
    !vault value, both with ansible-vault itself; the password file (in `secrets`, outside the inventory)."""
    pw = secrets / "vault-pass"
    pw.write_text("a test vault password\n")
    vault = str(BIN / "ansible-vault")
    subprocess.run([vault, "encrypt", "--vault-password-file", str(pw), str(inv / whole)], check=True,
                   capture_output=True)
    f = inv / inline
    m = re.search(rf"^( +){re.escape(key)}: (.+)$", f.read_text(), re.M)
    assert m, (inline, key)
    enc = subprocess.run([vault, "encrypt_string", "--vault-password-file", str(pw), "--name", key,
                          str(yaml.safe_load(m[2]))], check=True, capture_output=True, text=True).stdout
    f.write_text(f.read_text().replace(m[0], "\n".join(m[1] + ln for ln in enc.strip().splitlines())))
    return pw


def booted_hosts(prefix: str, count: int):
    """A fixture body: `count` fresh systemd test hosts named PREFIX-N (a killed run's leftovers removed first),
    yielded as {name: ip}, removed at the end."""
    from pdstack.testing.testhost import hosts
    hosts.down(prefix=prefix)
    hosts.up(count=count, prefix=prefix)
    try:
        yield {row["name"]: row["ip"] for row in hosts.status(prefix)}
    finally:
        hosts.down(prefix=prefix)


def wait_serving(router: str, deadline_s: float) -> tuple[int, str]:
    end = time.monotonic() + deadline_s
    while True:
        code, body = completion(router, timeout=20)
        if code == 200 or time.monotonic() > end:
            return code, body
        time.sleep(2)


def await_watchdog_restart(host: str, before: str | None, watchdog_host: str) -> tuple[float, float]:
    """(seconds, bound) until the watchdog (on `watchdog_host`) replaced `host`'s wedged pdstack-decode-0 container
    `before`. docs/failure.md's bound for inventory/test (probe every 5 s, 2 failures before a restart, 5 s first-token
    deadline) + 15 s for the unit's restart (docker stop/run of the sim); past it the test fails with the journal."""
    from pdstack.hostside.watchdog import worst_case_restart_s

    wd = yaml.safe_load((ROOT / "inventory/test/common/group_vars/all/watchdog.yml").read_text())
    bound = worst_case_restart_s(interval_s=wd["watchdog_interval_s"],
                                 failures_before_restart=wd["watchdog_failures_before_restart"],
                                 first_token_timeout_s=wd["watchdog_probe_first_token_timeout_s"],
                                 stall_timeout_s=wd["watchdog_probe_stall_timeout_s"], servers=2)
    wedged = time.monotonic()
    while time.monotonic() < wedged + bound + 15:
        cur = container_id(host, "pdstack-decode-0")
        if cur and cur != before:
            return time.monotonic() - wedged, bound
        time.sleep(1)
    journal = sh(watchdog_host, "journalctl", "-u", "pdstack-watchdog", "-n", "30", "--no-pager").stdout
    pytest.fail(f"the watchdog on {watchdog_host} did not restart decode on {host} within {bound} + 15 s:\n{journal}")
