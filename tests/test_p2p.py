"""The P2P gate: the pairs, groups and floors the planner puts in plan.p2p for recorded topologies
(pdstack/controller/plan/p2p_plan.py), and pdstack/image/p2p.py's verdicts on measurement JSON and its gate-file
checks; the measurements themselves need CUDA GPUs and skip here with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdstack.controller import pipeline
from pdstack.controller.load import inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.plan import p2p_plan
from pdstack.controller.plan.text import render_text
from pdstack.image import p2p

ROOT = Path(__file__).resolve().parents[1]
TOPO = ROOT / "tests" / "topologies"


def plan_of(inv: str, topo: str) -> dict:
    dep = inventory.load(ROOT / inv)
    return pipeline.make_plan(dep, load_facts(TOPO / topo, list(dep.hosts))).to_dict()


def reference_gate() -> dict:
    return plan_of("inventory/production", "reference-2node-8gpu.json")["p2p"]["gpu01"]


def test_the_reference_plan_measures_each_tp_group_and_prefill_to_decode():
    gate = reference_gate()
    assert gate["run"] and gate["reason"] == "" and gate["devices"] == list(range(8))
    within = [(p["a"], p["b"], p["floor_gbs"]) for p in gate["pairs"] if p["why"].startswith("TP group")]
    across = [(p["a"], p["b"], p["node_a"], p["node_b"], p["floor_gbs"], p["placement"])
              for p in gate["pairs"] if p["why"].startswith("KV transfer")]
    assert [(a, b) for a, b, _ in within] == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3),
                                              (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)]
    assert {f for *_, f in within} == {43.2}  # each TP group sits on one NUMA node: 0.8 x 54
    assert across == [(a, a + 4, 0, 1, 31.2, "across NUMA nodes") for a in range(4)]  # 0.8 x 39
    assert all(p["why"] == "KV transfer prefill-0 -> decode-0" for p in gate["pairs"][12:])
    assert [(g["server"], g["gpus"], g["floor_gbs"]) for g in gate["groups"]] == [
        ("prefill-0", [0, 1, 2, 3], 43.2), ("decode-0", [4, 5, 6, 7], 43.2)]
    assert "rtx6kpro" in gate["source"] and gate["margin"] == 0.8


def test_the_plan_text_and_so_the_deploy_summary_names_each_hosts_gate():
    dep = inventory.load(ROOT / "inventory/production")
    text = render_text(pipeline.make_plan(dep, load_facts(TOPO / "reference-2node-8gpu.json",
                                                                    list(dep.hosts))))
    assert "host gpu01: P2P gate before the servers start: 16 GPU pair(s) over GPUs 0,1,2,3,4,5,6,7, 2 all-reduce " \
        "group(s); floors 43.2 GB/s one NUMA node, 31.2 GB/s across NUMA nodes" in text.splitlines()
    dep = inventory.load(ROOT / "inventory/local")
    text = render_text(pipeline.make_plan(dep, load_facts(TOPO / "single-node-4gpu.json", list(dep.hosts))))
    assert "host pdstack-local-1: P2P gate: skipped (the sim test engine uses no GPU, nothing to measure: the gate " \
        "runs with the sglang engine)" in text.splitlines()


def test_floors_follow_each_gpus_recorded_numa_node():
    """Interleaved topology (GPUs alternate nodes): a TP group over 0-3 straddles nodes, so its pairs and its
    all-reduce get the across-nodes floor except 0-2 and 1-3; a GPU with no NUMA node (-1) gets the lower floor."""
    facts = json.loads((TOPO / "interleaved-2node-8gpu.json").read_text())
    servers = [{"name": "p", "role": "prefill", "gpus": [0, 1, 2, 3]}, {"name": "d", "role": "decode", "gpus": [4, 6]}]
    gate = p2p_plan.host_gate(servers, facts, "sglang")
    floors = {(p["a"], p["b"]): p["floor_gbs"] for p in gate["pairs"]}
    assert floors == {(0, 1): 31.2, (0, 2): 43.2, (0, 3): 31.2, (1, 2): 31.2, (1, 3): 43.2, (2, 3): 31.2,
                      (4, 6): 43.2, (0, 4): 43.2, (1, 6): 31.2}
    assert [(g["gpus"], g["floor_gbs"]) for g in gate["groups"]] == [([0, 1, 2, 3], 31.2), ([4, 6], 43.2)]
    assert gate["devices"] == [0, 1, 2, 3, 4, 6]
    facts["gpus"][0]["numa_node"] = -1
    p01 = p2p_plan.host_gate(servers, facts, "sglang")["pairs"][0]
    assert (p01["node_a"], p01["placement"], p01["floor_gbs"]) == (None, "NUMA node unknown", 31.2)


def test_the_sim_engine_and_one_gpu_servers_have_nothing_to_measure_and_say_why():
    local = plan_of("inventory/local", "single-node-4gpu.json")
    (gate,) = local["p2p"].values()
    assert not gate["run"] and gate["reason"].startswith("the sim test engine uses no GPU")
    facts = json.loads((TOPO / "single-node-4gpu.json").read_text())
    one = [{"name": "p", "role": "prefill", "gpus": [0]}, {"name": "q", "role": "prefill", "gpus": [1]}]
    gate = p2p_plan.host_gate(one, facts, "sglang")
    assert not gate["run"] and gate["reason"].startswith("no GPU pair in use on this host") and not gate["pairs"]
    assert p2p_plan.host_gate([], facts, "sglang")["reason"] == "no server on this host"
    # one GPU each, but prefill to decode is a pair the KV transfer crosses
    pd = [{"name": "p", "role": "prefill", "gpus": [0]}, {"name": "d", "role": "decode", "gpus": [1]}]
    gate = p2p_plan.host_gate(pd, facts, "sglang")
    assert gate["run"] and [(p["a"], p["b"], p["floor_gbs"]) for p in gate["pairs"]] == [(0, 1, 43.2)]
    assert gate["groups"] == []


def measured(gate: dict, same: float, cross: float, busbw: float) -> tuple[list, list]:
    pairs = [dict(p, gbs_ab=same if p["node_a"] == p["node_b"] else cross,
                  gbs_ba=same if p["node_a"] == p["node_b"] else cross) for p in gate["pairs"]]
    return pairs, [dict(g, busbw_gbs=busbw) for g in gate["groups"]]


def test_a_pair_or_group_under_its_floor_fails_naming_the_gpus_and_numbers():
    pairs, groups = measured(reference_gate(), 55.0, 45.0, 50.0)
    assert p2p.judge(pairs, groups) == []
    pairs[1]["gbs_ba"] = 12.3  # GPU 0 <- GPU 2
    pairs[-1]["gbs_ab"] = 30.0  # GPU 3 -> GPU 7, across nodes: floor 31.2
    groups[1]["busbw_gbs"] = 20.0
    assert p2p.judge(pairs, groups) == [
        "GPU 0 <- GPU 2 (TP group of prefill-0): 12.30 GB/s, under its floor 43.20 GB/s (one NUMA node)",
        "GPU 3 -> GPU 7 (KV transfer prefill-0 -> decode-0): 30.00 GB/s, under its floor 31.20 GB/s "
        "(across NUMA nodes)",
        "all-reduce over GPUs [4, 5, 6, 7] (decode-0): bus bandwidth 20.00 GB/s, under its floor 43.20 GB/s"]
    # exactly at the floor passes; just under fails
    pairs, groups = measured(reference_gate(), 43.2, 31.2, 43.2)
    assert p2p.judge(pairs, groups) == []
    pairs[0]["gbs_ab"] = 43.19
    assert p2p.judge(pairs, groups) == [
        "GPU 0 -> GPU 1 (TP group of prefill-0): 43.19 GB/s, under its floor 43.20 GB/s (one NUMA node)"]


def test_the_report_names_every_pair_then_the_verdict():
    pairs, groups = measured(reference_gate(), 55.0, 45.0, 50.0)
    pairs[4]["gbs_ab"] = 9.5  # GPU 1 -> GPU 3
    out = {"pairs": pairs, "groups": groups, "failures": p2p.judge(pairs, groups), "passed": False}
    lines = p2p.report(out).splitlines()
    assert lines[0] == "GPU 0 <-> GPU 1 (TP group of prefill-0, one NUMA node): 55.0 / 55.0 GB/s, floor 43.2"
    assert "all-reduce [0, 1, 2, 3] (prefill-0): bus bandwidth 50.0 GB/s, floor 43.2" in lines
    assert lines[-1] == ("FAIL GPU 1 -> GPU 3 (TP group of prefill-0): 9.50 GB/s, under its floor 43.20 GB/s "
                         "(one NUMA node)")
    assert p2p.report({"error": "no CUDA"}) == "P2P gate could not measure: no CUDA"


def test_a_gate_file_that_does_not_fit_is_refused_naming_what(tmp_path, capsys):
    assert p2p.check_gate([], "g.json") == ["g.json: not a JSON object; write this host's plan.p2p entry "
                                           "(pdstack plan --json)"]
    assert p2p.check_gate({"devices": [0]}, "g.json")[0] == ("g.json: pairs missing; regenerate it from the plan "
                                                             "(the serving role writes it)")
    gate = reference_gate() | {"devices": [0, 1, 2, 3]}
    assert p2p.check_gate(gate, "g.json") == ["g.json: GPU(s) [4, 5, 6, 7] measured but not in devices [0, 1, 2, 3]; "
                                              "regenerate it from the plan"]
    f = tmp_path / "gate.json"
    f.write_text(json.dumps(gate))
    with pytest.raises(SystemExit) as e:
        p2p.main(["--gate", str(f)])
    assert e.value.code == 2 and "not in devices" in capsys.readouterr().err
    f.write_text("{")
    with pytest.raises(SystemExit) as e:
        p2p.main(["--gate", str(f)])
    assert e.value.code == 2 and f"--gate {f}:" in capsys.readouterr().err


def test_the_cli_needs_a_gate_or_the_self_test(capsys):
    with pytest.raises(SystemExit) as e:
        p2p.main([])
    assert e.value.code == 2 and "--gate" in capsys.readouterr().err


def _cuda_gpus() -> int:
    try:
        import torch
    except ImportError:
        return 0
    return torch.cuda.device_count() if torch.cuda.is_available() else 0


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_gpus() < 1, reason="needs a CUDA GPU (this machine has none); run `python -m "
                    "pdstack.image.p2p --self-test --json` on a GPU host (docs/log.md has the measured number)")
def test_self_test_on_one_gpu_measures_its_copy_bandwidth(capsys):
    assert p2p.main(["--self-test", "--json", "--mib", "64"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["d2d_copy_gbs"] > 10


@pytest.mark.gpu
@pytest.mark.skipif(_cuda_gpus() < 8, reason="needs a GPU host with 8 GPUs (the reference plan's); multi-GPU "
                    "measurement waits for one")
def test_the_gate_on_the_reference_plan():
    out = p2p.measure(reference_gate(), 64 * 2**20)
    assert out["passed"], out["failures"]
