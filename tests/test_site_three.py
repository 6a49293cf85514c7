"""site.yml for real across three systemd test hosts (inventory/test/three-host: prefill on pdstack-three-1, decode
on pdstack-three-2, router + monitoring on pdstack-three-3), deploying the sim image (the TEST ENGINE) with the real
sglang-router behind the front door.

The hosts first run the one-host layout on pdstack-three-1 (inventory/test/one-host, its host renamed), so the
three-host deploy is a layout change: what the new plan does not hold (the one-host decode on host 1) must be gone.
Then the watchdog on host 3 un-wedges decode on host 2 through its restricted key, within its documented bound.

Its hosts have a prefix of their own (pdstack-three), so this file runs beside tests/test_site.py on another worker
(pyproject.toml's pdstack_shared_host_tests, pdstack/testing/parallel.py). Slow: CI runs it.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from site_helpers import (
    ROOT,
    await_watchdog_restart,
    booted_hosts,
    completion,
    container_id,
    host_file,
    layout_copy,
    playbook,
    post,
    saved_sim_image,
    sh,
    vaulted,
    wait_serving,
)

pytestmark = pytest.mark.slow

PREFIX = "pdstack-three"  # inventory/test/three-host names these hosts
THREE = ROOT / "inventory" / "test" / "three-host"


@pytest.fixture(scope="module")
def hosts():
    saved_sim_image()  # where inventory/test points (build/manifest-sim.json, build/images/sim.tar)
    yield from booted_hosts(PREFIX, 3)


def one_host_on(host: str, dest: Path) -> Path:
    """inventory/test/one-host with its one host renamed to `host`: the same layout, under a directory name of its
    own (its controller state is build/state/<that name>, apart from tests/test_site.py's one-host runs)."""
    layout_copy("one-host", dest)
    (dest / "host_vars" / "pdstack-test-1").rename(dest / "host_vars" / host)
    hosts_yml = dest / "hosts.yml"
    text = hosts_yml.read_text()
    assert text.count("pdstack-test-1") == 3, text  # all:hosts, router and monitoring
    hosts_yml.write_text(text.replace("pdstack-test-1", host))
    return dest


@pytest.fixture(scope="module")
def one_host_first(hosts, tmp_path_factory):
    """The one-host layout deployed on pdstack-three-1, as a host would have it before the layout changes; its
    inventory as an operator keeps secrets: group_vars/all/router.yml encrypted whole with ansible-vault and the
    served name an inline !vault value, the password given to ansible-playbook its usual way."""
    secrets = tmp_path_factory.mktemp("vault")
    inv = one_host_on("pdstack-three-1", tmp_path_factory.mktemp("layouts") / "one-host-on-three")
    pw = vaulted(inv, secrets, "group_vars/all/router.yml", "group_vars/all/model.yml", "served_name")
    assert (inv / "group_vars/all/router.yml").read_text().startswith("$ANSIBLE_VAULT;")
    assert "served_name: !vault |" in (inv / "group_vars/all/model.yml").read_text()
    r = playbook(inv, "--vault-password-file", str(pw))
    assert r.returncode == 0, r.stdout[-6000:]
    for unit in ("pdstack-server-prefill-0", "pdstack-server-decode-0", "pdstack-router"):
        assert sh("pdstack-three-1", "systemctl", "is-active", unit).stdout.strip() == "active", unit
    return r


def test_three_host_layout_serves_across_hosts(hosts, one_host_first):
    r = playbook(THREE)
    assert r.returncode == 0, r.stdout[-6000:]
    p1 = json.loads(host_file("pdstack-three-1", "/etc/pdstack/plan.json"))
    p2 = json.loads(host_file("pdstack-three-2", "/etc/pdstack/plan.json"))
    p3 = json.loads(host_file("pdstack-three-3", "/etc/pdstack/plan.json"))
    assert [s["role"] for s in p1["servers"]] == ["prefill"] and p1["router"] is None
    assert [s["role"] for s in p2["servers"]] == ["decode"] and p2["router"] is None
    assert p3["servers"] == [] and p3["router"]["decode"][0]["url"] == "http://pdstack-three-2:30001"
    # the one-host layout's decode on host 1 was removed: only what the plan holds runs there
    assert sh("pdstack-three-1", "systemctl", "is-active", "pdstack-server-decode-0").stdout.strip() != "active"
    code, body = completion(f"http://{hosts['pdstack-three-3']}:8000")
    assert code == 200, body
    assert "recall  PASS" in r.stdout

    # the watchdog on host 3 reaches decode on host 2 with its own key, which may only restart pdstack server units
    keys = host_file("pdstack-three-2", "/root/.ssh/authorized_keys")
    forced = 'restrict,command="/usr/bin/python3 -I /usr/local/lib/pdstack/pdstack-hostside.pyz restart-unit"'
    assert forced in keys, keys
    ssh = ["ssh", "-i", "/root/.ssh/pdstack_watchdog", "-o", "BatchMode=yes", "-o", "StrictHostKeyChecking=yes",
           "-o", "UserKnownHostsFile=/etc/pdstack/watchdog_known_hosts", "root@pdstack-three-2"]
    denied = sh("pdstack-three-3", *ssh, "id")
    assert denied.returncode == 2 and "refused" in denied.stderr, (denied.returncode, denied.stdout, denied.stderr)
    denied = sh("pdstack-three-3", *ssh, "restart", "ssh.service")
    assert denied.returncode == 2, denied.stderr
    # a wedged decode on host 2 (its /health still 200) is found and restarted from host 3 within the bound
    before = container_id("pdstack-three-2", "pdstack-decode-0")
    code, body = post(f"http://{hosts['pdstack-three-2']}:30001/_sim/fault", {"wedge_decode": True})
    assert code == 200, body
    took, bound = await_watchdog_restart("pdstack-three-2", before, watchdog_host="pdstack-three-3")
    print(f"three hosts: wedge -> new decode container: {took:.1f} s (bound {bound} + 15 s)")
    code, body = wait_serving(f"http://{hosts['pdstack-three-3']}:8000", 90)
    assert code == 200, body
