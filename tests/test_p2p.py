"""The P2P gate (pdstack/image/p2p.py): the pairs and groups it measures for a plan, the floors by NUMA placement,
its verdict lines; the measurements themselves need CUDA GPUs and skip here with the reason."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pdstack.controller import pipeline
from pdstack.controller.load import inventory
from pdstack.image import p2p

ROOT = Path(__file__).resolve().parents[1]


def reference_plan() -> dict:
    dep = inventory.load(ROOT / "inventory" / "production")
    return pipeline.make_plan(dep, pipeline.load_facts(ROOT / "tests/topologies/reference-2node-8gpu.json",
                                                       list(dep.hosts))).to_dict()


def test_the_reference_plan_measures_each_tp_group_and_prefill_to_decode():
    pairs, groups = p2p.pairs_from_plan(reference_plan())
    within = [(p["a"], p["b"]) for p in pairs if p["why"].startswith("TP group")]
    across = [(p["a"], p["b"], p["node_a"], p["node_b"]) for p in pairs if p["why"].startswith("KV transfer")]
    assert within == [(0, 1), (0, 2), (0, 3), (1, 2), (1, 3), (2, 3), (4, 5), (4, 6), (4, 7), (5, 6), (5, 7), (6, 7)]
    assert across == [(0, 4, 0, 1), (1, 5, 0, 1), (2, 6, 0, 1), (3, 7, 0, 1)]
    assert [(g["gpus"], g["nodes"]) for g in groups] == [([0, 1, 2, 3], [0] * 4), ([4, 5, 6, 7], [1] * 4)]


def test_floors_are_the_published_low_ends_times_the_margin():
    assert p2p.floor_gbs(0, 0) == 43.2 and p2p.floor_gbs(0, 1) == 31.2 and p2p.floor_gbs(1, 1, margin=1.0) == 54.0


def test_a_pair_or_group_under_its_floor_fails_naming_the_gpus_and_numbers():
    pairs, groups = p2p.pairs_from_plan(reference_plan())
    for p in pairs:
        p["gbs_ab"] = p["gbs_ba"] = 55.0 if p["node_a"] == p["node_b"] else 45.0
    for g in groups:
        g["busbw_gbs"] = 50.0
    assert p2p.judge(pairs, groups) == []
    pairs[1]["gbs_ba"] = 12.3  # GPU 0 <- GPU 2
    pairs[-1]["gbs_ab"] = 30.0  # GPU 3 -> GPU 7, across nodes: floor 31.2
    groups[1]["busbw_gbs"] = 20.0
    assert p2p.judge(pairs, groups) == [
        "GPU 0 <- GPU 2 (TP group of prefill-0): 12.3 GB/s, under its floor 43.2 GB/s (one NUMA node)",
        "GPU 3 -> GPU 7 (KV transfer prefill-0 -> decode-0): 30.0 GB/s, under its floor 31.2 GB/s (across nodes)",
        "all-reduce over GPUs [4, 5, 6, 7] (decode-0): bus bandwidth 20.0 GB/s, under its floor 43.2 GB/s"]


def test_the_cli_needs_a_plan_or_the_self_test(capsys):
    with pytest.raises(SystemExit) as e:
        p2p.main([])
    assert e.value.code == 2 and "--plan" in capsys.readouterr().err


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
    out = p2p.measure(reference_plan(), 64 * 2**20, p2p.MARGIN)
    assert out["passed"], out["failures"]
