"""site.yml for real: ansible-playbook against local systemd test hosts (Docker containers booted with systemd).

Covers the preflight and facts phases: a bad inventory fails before any host changes, a good one deploys, the
second run and check mode report changed=0, and each host gets its part of the plan. Slow (boots hosts): CI runs it.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
PREFIX = "pdstack-test"  # inventory/test/* name these hosts


def _engine_or_skip():
    docker = pytest.importorskip("docker")
    try:
        docker.from_env().ping()
    except Exception as e:  # CI starts dockerd (./dev.sh); a developer machine may not run one
        if os.environ.get("CI"):
            pytest.fail(f"CI=true but no Docker engine is reachable ({e}); .ci/run must start it (./dev.sh setup)")
        pytest.skip(f"no Docker engine reachable ({e}); ./dev.sh setup starts one")


@pytest.fixture(scope="module")
def hosts():
    _engine_or_skip()
    from pdstack import testhost
    testhost.down(prefix=PREFIX)  # a previous run killed mid-way leaves nothing behind
    names = testhost.up(count=3, prefix=PREFIX)
    try:
        yield names
    finally:
        testhost.down(prefix=PREFIX)


def playbook(inventory: Path | str, *args: str, timeout: int = 600) -> subprocess.CompletedProcess:
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_FORCE_COLOR": "0", "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(BIN / "ansible-playbook"), "site.yml", "-i", str(inventory), *args], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=timeout)


def recap(out: str) -> dict[str, dict[str, int]]:
    rows = {}
    for m in re.finditer(r"^(\S+)\s+: ((?:\w+=\d+\s*)+)$", out, re.M):
        rows[m.group(1)] = {k: int(v) for k, v in re.findall(r"(\w+)=(\d+)", m.group(2))}
    assert rows, f"no PLAY RECAP in:\n{out[-3000:]}"
    return rows


def host_file(host: str, path: str) -> str | None:
    r = subprocess.run(["docker", "exec", host, "cat", path], capture_output=True, text=True, timeout=60)
    return r.stdout if r.returncode == 0 else None


def broken_copy(tmp_path: Path, layout: str, edit) -> Path:
    inv = tmp_path / layout
    shutil.copytree(ROOT / "inventory" / "test" / layout, inv, symlinks=False)
    f = inv / "host_vars" / "pdstack-test-1" / "servers.yml"
    data = yaml.safe_load(f.read_text())
    edit(data["pdstack_servers"])
    f.write_text(yaml.safe_dump(data))
    return inv


@pytest.mark.parametrize("edit, message", [
    (lambda s: s[0].update(tp_size=2), "tp_size: 2 does not match its 1 GPUs"),  # static: no host contact at all
    (lambda s: s[0].update(gpus=[5]), "GPU(s) [5] do not exist; host pdstack-test-1 has 2 GPU(s)"),  # topology
], ids=["static", "topology"])
def test_bad_inventory_fails_before_any_host_changes(hosts, tmp_path, edit, message):
    inv = broken_copy(tmp_path, "one-host", edit)
    r = playbook(inv)
    assert r.returncode != 0
    assert message in r.stdout, r.stdout[-3000:]
    for h in hosts:  # fresh hosts: nothing of pdstack's may exist on them after a failed preflight
        assert host_file(h, "/etc/pdstack/plan.json") is None
        assert host_file(h, "/etc/ansible/facts.d/pdstack.fact") is None


def test_one_host_deploys_idempotently_and_check_mode_changes_nothing(hosts):
    inv = ROOT / "inventory" / "test" / "one-host"
    first = playbook(inv)
    assert first.returncode == 0, first.stdout[-4000:]
    assert recap(first.stdout)["pdstack-test-1"]["changed"] > 0
    assert "prefill prefill-0 on pdstack-test-1" in first.stdout  # the summary prints the plan
    second = playbook(inv)
    assert second.returncode == 0, second.stdout[-4000:]
    assert all(r["changed"] == 0 for r in recap(second.stdout).values()), second.stdout[-2000:]
    check = playbook(inv, "--check")
    assert check.returncode == 0, check.stdout[-4000:]
    assert all(r["changed"] == 0 for r in recap(check.stdout).values())

    plan = json.loads(host_file("pdstack-test-1", "/etc/pdstack/plan.json"))
    assert [s["name"] for s in plan["servers"]] == ["prefill-0", "decode-0"]
    assert plan["router"]["prefill"][0]["url"] == "http://pdstack-test-1:30000"
    local = json.loads(subprocess.run(["docker", "exec", "pdstack-test-1", "/etc/ansible/facts.d/pdstack.fact"],
                                      capture_output=True, text=True, timeout=60, check=True).stdout)
    assert local["gpu_source"] == "simulated" and len(local["gpus"]) == 2


def test_three_host_layout_splits_the_plan_per_host(hosts):
    inv = ROOT / "inventory" / "test" / "three-host"
    r = playbook(inv)
    assert r.returncode == 0, r.stdout[-4000:]
    assert set(recap(r.stdout)) >= {"pdstack-test-1", "pdstack-test-2", "pdstack-test-3"}
    p1 = json.loads(host_file("pdstack-test-1", "/etc/pdstack/plan.json"))
    p2 = json.loads(host_file("pdstack-test-2", "/etc/pdstack/plan.json"))
    p3 = json.loads(host_file("pdstack-test-3", "/etc/pdstack/plan.json"))
    assert [s["role"] for s in p1["servers"]] == ["prefill"] and p1["router"] is None
    assert [s["role"] for s in p2["servers"]] == ["decode"] and p2["router"] is None
    assert p3["servers"] == []
    assert p3["router"]["decode"][0]["url"] == "http://pdstack-test-2:30001"
    assert "--prefill" in p3["router"]["argv"] and "http://pdstack-test-1:30000" in p3["router"]["argv"]


def test_tags_select_phases(hosts):
    r = playbook(ROOT / "inventory" / "test" / "one-host", "--tags", "preflight")
    assert r.returncode == 0, r.stdout[-3000:]
    assert "Facts | install the facts script" not in r.stdout
    assert "Preflight | topology checks and the plan" in r.stdout
