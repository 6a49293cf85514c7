"""The Invoke tasks agree on their default inventory, and --dry is honest (echo the commands, or refuse)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
INVOKE = Path(sys.executable).parent / "invoke"


def invoke(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(INVOKE), *args], cwd=ROOT, capture_output=True, text=True, timeout=120)


def test_plan_deploy_and_rollback_default_to_ansible_cfgs_inventory():
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    default = cfg.get("defaults", "inventory")
    plan = invoke("--dry", "plan")
    assert plan.returncode == 0, plan.stderr
    assert f"pdstack plan -i {default}" in plan.stdout + plan.stderr
    for task, playbook in (("deploy", "site.yml"), ("rollback", "playbooks/rollback.yml")):
        r = invoke("--dry", task)
        out = r.stdout + r.stderr
        assert r.returncode == 0 and f"ansible-playbook {playbook}" in out, out
        assert " -i " not in out, f"{task} without -i must use ansible.cfg's inventory ({default}): {out}"


@pytest.mark.parametrize("task", [["build"], ["demo"], ["testhost.up"], ["testhost.down"]])
def test_dry_refuses_tasks_it_cannot_show(task):
    r = invoke("--dry", *task)
    assert r.returncode == 2, (r.returncode, r.stdout, r.stderr)
    assert "--dry cannot show this task without running it" in r.stderr
