"""The host firewall's nft script from the plan, checked by the real `nft -c` (Debian's nftables; needs root)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from pdstack.controller import pipeline
from pdstack.controller.load import inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.render import firewall

ROOT = Path(__file__).resolve().parents[1]
NFT = shutil.which("nft") or "/usr/sbin/nft"


def _plan(inv: str, topo: str) -> dict:
    dep = inventory.load(ROOT / inv)
    return pipeline.make_plan(dep, load_facts(ROOT / "tests/topologies" / topo, list(dep.hosts))).to_dict()


def test_protected_ports_are_every_pdstack_listener_but_the_front_door():
    plan = _plan("inventory/production", "reference-2node-8gpu.json")
    host = plan["router"]["host"]
    ports = firewall.protected_ports(plan, host)
    fd = plan["router"]["frontdoor"]
    assert set(ports) == {30000, 8998, 30001, plan["router"]["prometheus_port"], plan["router"]["internal_port"],
                          fd["metrics_port"]}
    assert fd["port"] not in ports and 22 not in ports
    assert firewall.peer_hosts(plan) == [host]


@pytest.mark.skipif(not Path(NFT).exists() or os.geteuid() != 0, reason="needs nftables and root for nft -c")
def test_the_script_passes_nft_check_and_touches_only_its_table(tmp_path):
    plan = _plan("inventory/production", "reference-2node-8gpu.json")
    host = plan["router"]["host"]
    for peers, admin in ((["192.0.2.10"], ["10.0.0.0/8", "2001:db8::/32"]), ([], [])):
        text = firewall.nft_ruleset(plan, host, peers, admin)
        assert "flush ruleset" not in text and "policy accept" in text and "dport 22" not in text
        assert "reject with tcp reset" in text
        f = tmp_path / "pdstack.nft"
        f.write_text(text)
        r = subprocess.run([NFT, "-c", "-f", str(f)], capture_output=True, text=True, timeout=30)
        assert r.returncode == 0, r.stderr
    with pytest.raises(ValueError):
        firewall.nft_ruleset(plan, host, ["not-an-address"], [])


def test_peer_names_are_the_plans_addresses_and_the_monitoring_hosts():
    plan = _plan("inventory/production", "reference-2node-8gpu.json")
    names = firewall.peer_names(plan)
    assert set(names) == {s["address"] for s in plan["servers"]} | {plan["router"]["address"]}
    plan["monitoring_hosts"] = ["mon01"]
    assert "mon01" in firewall.peer_names(plan)
    assert "10.9.9.9" in firewall.peer_names(plan, {"mon01": "10.9.9.9", "elsewhere": "10.1.1.1"})
    assert "10.1.1.1" not in firewall.peer_names(plan, {"mon01": "10.9.9.9", "elsewhere": "10.1.1.1"})
