"""Extra vars (-e) read by the inventory's rules before Ansible templates them (issue 45, class 3)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from pdstack.controller.load import extra_vars, inventory

ROOT = Path(__file__).resolve().parents[1]


def test_each_form_of_e_is_read_strictly_and_named_by_its_position(tmp_path: Path):
    f = tmp_path / "vars.yml"
    f.write_text("pdstack_router:\n  port: 030001\n")
    problems, origins = extra_vars.check([
        "pdstack_environment=local",
        '{"pdstack_smoke": {"min_horizon": "{{ lookup(\'pipe\', \'id\') }}"}}',
        f"@{f}",
        "pdstack_tag={{ lookup('env', 'HOME') }} other=1",
        '{"frontdoor_api_key": "s3cret-key-0123456789"}',
    ])
    text = "\n".join(problems)
    assert "pdstack_smoke.min_horizon (-e #2:1)" in text and "is a Jinja template" in text, text
    assert f"pdstack_router.port (-e @{f}:2): 030001 is read by YAML 1.1 as the number 12289" in text, text
    assert "pdstack_tag (-e #4): \"{{ lookup('env', 'HOME') }}\" is a Jinja template" in text, text
    assert origins["pdstack_environment"] == "-e #1" and origins["pdstack_router"] == f"-e @{f}:1"
    assert "frontdoor_api_key" not in origins and "s3cret" not in text + json.dumps(origins)


def test_an_e_cannot_stand_in_for_what_the_preflight_computes(tmp_path: Path):
    """An -e outranks set_fact: `-e preflight_plan=...` would replace the checked plan every role reads. Each of
    the preflight's outputs given by -e, in any of the three forms, is refused naming the -e."""
    f = tmp_path / "vars.yml"
    f.write_text("pdstack_environment: local\nfacts_topology: {}\n")
    problems, _ = extra_vars.check(['preflight_plan={}', '{"preflight_plan_file": "/tmp/p.json"}', f"@{f}",
                                    "preflight_vars_file=x other=1"])
    text = "\n".join(problems)
    for name, where in (("preflight_plan", "-e #1"), ("preflight_plan_file", "-e #2"),
                        ("facts_topology", f"-e @{f}:2"), ("preflight_vars_file", "-e #4")):
        assert f"{name} ({where}): the preflight computes {name}" in text, text
    assert len(problems) == 4, problems
    private, _ = extra_vars.check(["__preflight_bad_key_hosts=[]", '{"_serving_x": 1}'])
    assert [p.split(" (")[0] for p in private] == ["__preflight_bad_key_hosts", "_serving_x"], private
    assert "private variable" in private[0], private
    assert extra_vars.check(["pdstack_environment=local", "serving_model_changed=true"])[0] == []


def test_a_resolved_inventory_names_the_e_a_value_came_from(tmp_path: Path):
    """What the preflight role writes (resolved variables + where the -e values set them): the checks' messages
    name the -e, not an inventory file, and an -e override of a protected setting is said out loud."""
    hv = json.loads(subprocess.run([sys.executable, "-c", "from pdstack.controller.load import inventory; import json;"
                                    "h, g = inventory.load_hostvars('inventory/local'); print(json.dumps([h, g]))"],
                                   cwd=ROOT, capture_output=True, text=True, check=True).stdout)
    hostvars, groups = hv
    for v in hostvars.values():
        v["pdstack_router"] = {**v["pdstack_router"], "admission": {"max_concurrent_requests": 0}}
    f = tmp_path / "inventory.json"
    f.write_text(json.dumps({"hostvars": hostvars, "groups": groups, "extra_vars": {"pdstack_router": "-e #2"}}))
    r = subprocess.run([sys.executable, "-m", "pdstack", "preflight", "--static", "-i", "inventory/local", "--vars",
                        str(f)], cwd=ROOT, capture_output=True, text=True, env={**os.environ})
    out = r.stdout + r.stderr
    assert r.returncode == 2 and "max_concurrent_requests: must be -1 (off) or > 0, got 0 (-e #2)" in out, out
    for v in hostvars.values():
        v["pdstack_router"]["admission"] = {"max_concurrent_requests": 8}
    f.write_text(json.dumps({"hostvars": hostvars, "groups": groups, "extra_vars": {"pdstack_router": "-e #2"}}))
    dep = inventory.load(ROOT / "inventory" / "local", f)
    assert any("pdstack_router comes from -e #2, which wins over the inventory's files" in w for w in dep.warnings)


def test_pdstack_plan_reads_e_as_ansible_playbook_does_and_names_it(tmp_path: Path):
    """`pdstack plan -e` goes through Ansible's own extra-vars reading (the values it resolves are the plan's); a
    value an -e sets is named by its position, and an -e that would switch production's checks off is refused."""
    plan = [sys.executable, "-m", "pdstack", "plan", "-i", "inventory/production", "--facts",
            "tests/topologies/reference-2node-8gpu.json"]
    r = subprocess.run([*plan, "-e", "pdstack_environment=local"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "pdstack_environment: local (-e #1) would switch production's checks off" \
        in r.stderr, r.stderr
    r = subprocess.run([*plan, "-e", '{"pdstack_router": {"port": 0}}'], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and "(-e #1)" in r.stderr and "pdstack_router.port" in r.stderr, r.stderr
    f = tmp_path / "x.yml"
    f.write_text("pdstack_router:\n  port: 030001\n")
    r = subprocess.run([*plan, "-e", f"@{f}"], cwd=ROOT, capture_output=True, text=True)
    assert r.returncode == 2 and f"pdstack_router.port (-e @{f}:2)" in r.stderr, r.stderr
