"""The P2P gate for a GPU host, run inside the serving image before serving: copy bandwidth between the GPU pairs
the plan uses (within each TP group, and each prefill GPU to its decode counterpart) and an all-reduce in each TP
group, against floors from the recorded topology; a pair under its floor fails, naming the two GPUs and the numbers.

    python3 -m pdstack.image.p2p --plan /etc/pdstack/plan.json [--json]     the gate (exit 0 pass, 1 fail, 2 misuse)
    python3 -m pdstack.image.p2p --self-test [--json]                      one GPU: its own device-to-device copy

In the serving image it is /opt/pdstack/tools/pdstack/image/p2p.py (PYTHONPATH=/opt/pdstack/tools; the build
context carries it, pdstack/controller/imagebuild/inputs.py PROD_TOOLS). No role runs it yet: the serving phase's
call on GPU hosts waits for one to try it on.

Floors (docs/facts.md#pcie-host-settings): on 8x RTX PRO 6000 Blackwell PCIe boxes others measured about 54-56 GB/s
between GPUs of one NUMA node and 39-51 GB/s across nodes (local-inference-lab/rtx6kpro, hardware/pcie-bandwidth.md);
a pair passes at `--margin` (0.8) of the low end: 43.2 GB/s within a node, 31.2 across. The all-reduce's bus
bandwidth (size * 2(n-1)/n / time, NCCL's busbw) must reach the margin of the slowest link in its group.
Only torch is needed (the serving image has it); torch is imported when a measurement runs, so the pairs and
verdicts are testable without a GPU.
"""

from __future__ import annotations

import argparse
import itertools
import json
import sys
from typing import Any

SAME_NODE_GBS, CROSS_NODE_GBS = 54.0, 39.0  # the low ends of the published ranges (see the docstring)
MARGIN = 0.8
GB = 1e9


def floor_gbs(node_a: int, node_b: int, margin: float = MARGIN) -> float:
    return round(margin * (SAME_NODE_GBS if node_a == node_b else CROSS_NODE_GBS), 2)


def pairs_from_plan(plan: dict[str, Any]) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(copy pairs, all-reduce groups) of this host's part of the plan. A pair: {a, b, node_a, node_b, why}; a
    group: {server, gpus, nodes}. Within a TP group every pair; prefill to decode GPU by GPU in order."""
    servers = plan.get("servers") or []
    pairs, seen, groups = [], set(), []
    for s in servers:
        gpus, node = list(s["gpus"]), int(s["numa_node"])
        groups.append({"server": s["name"], "gpus": gpus, "nodes": [node] * len(gpus)})
        for a, b in itertools.combinations(gpus, 2):
            if (a, b) not in seen:
                seen.add((a, b))
                pairs.append({"a": a, "b": b, "node_a": node, "node_b": node, "why": f"TP group of {s['name']}"})
    for p, d in itertools.product([s for s in servers if s["role"] == "prefill"],
                                  [s for s in servers if s["role"] == "decode"]):
        for a, b in zip(p["gpus"], d["gpus"], strict=False):
            if (min(a, b), max(a, b)) not in seen and a != b:
                seen.add((min(a, b), max(a, b)))
                pairs.append({"a": a, "b": b, "node_a": int(p["numa_node"]), "node_b": int(d["numa_node"]),
                              "why": f"KV transfer {p['name']} -> {d['name']}"})
    return pairs, groups


def judge(pairs: list[dict[str, Any]], groups: list[dict[str, Any]], margin: float = MARGIN) -> list[str]:
    """Every failure as one line naming the GPUs, the measured number and the floor. Needs pairs measured
    (gbs_ab, gbs_ba) and groups measured (busbw_gbs)."""
    out = []
    for p in pairs:
        floor = floor_gbs(p["node_a"], p["node_b"], margin)
        for d, key in (("->", "gbs_ab"), ("<-", "gbs_ba")):
            if p.get(key) is not None and p[key] < floor:
                out.append(f"GPU {p['a']} {d} GPU {p['b']} ({p['why']}): {p[key]:.1f} GB/s, under its floor "
                           f"{floor:.1f} GB/s ({'one NUMA node' if p['node_a'] == p['node_b'] else 'across nodes'})")
    for g in groups:
        floor = min((floor_gbs(a, b, margin) for a, b in itertools.combinations(g["nodes"], 2)), default=0.0)
        if g.get("busbw_gbs") is not None and len(g["gpus"]) > 1 and g["busbw_gbs"] < floor:
            out.append(f"all-reduce over GPUs {g['gpus']} ({g['server']}): bus bandwidth {g['busbw_gbs']:.1f} GB/s, "
                       f"under its floor {floor:.1f} GB/s")
    return out


def _timed(torch: Any, fn: Any, device: int, iters: int) -> float:
    """Seconds per call of fn, by CUDA events on `device`, after two warm-up calls."""
    with torch.cuda.device(device):
        for _ in range(2):
            fn()
        torch.cuda.synchronize()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(iters):
            fn()
        end.record()
        torch.cuda.synchronize()
        return start.elapsed_time(end) / 1e3 / iters


def copy_gbs(torch: Any, src: int, dst: int, nbytes: int, iters: int = 20) -> float:
    """GB/s of copying nbytes from GPU src to GPU dst (src == dst: within one GPU; each byte read and written)."""
    a = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{src}")
    b = torch.empty(nbytes, dtype=torch.uint8, device=f"cuda:{dst}")
    return nbytes / _timed(torch, lambda: b.copy_(a, non_blocking=True), src, iters) / GB


def allreduce_busbw(torch: Any, gpus: list[int], nbytes: int, iters: int = 10) -> float:
    """NCCL all-reduce bus bandwidth over `gpus` in one process (torch.cuda.nccl), GB/s."""
    import torch.cuda.nccl as nccl

    n = len(gpus)
    bufs = [torch.ones(nbytes // 4, dtype=torch.float32, device=f"cuda:{g}") for g in gpus]

    def run() -> None:
        nccl.all_reduce(bufs)

    seconds = _timed(torch, run, gpus[0], iters)
    return nbytes * 2 * (n - 1) / n / seconds / GB


def measure(plan: dict[str, Any], nbytes: int, margin: float) -> dict[str, Any]:
    import torch

    pairs, groups = pairs_from_plan(plan)
    for p in pairs:
        p["gbs_ab"] = round(copy_gbs(torch, p["a"], p["b"], nbytes), 2)
        p["gbs_ba"] = round(copy_gbs(torch, p["b"], p["a"], nbytes), 2)
        p["floor_gbs"] = floor_gbs(p["node_a"], p["node_b"], margin)
    for g in groups:
        g["busbw_gbs"] = round(allreduce_busbw(torch, g["gpus"], nbytes), 2) if len(g["gpus"]) > 1 else None
    failures = judge(pairs, groups, margin)
    return {"pairs": pairs, "groups": groups, "failures": failures, "passed": not failures}


def self_test(nbytes: int) -> dict[str, Any]:
    """What one GPU allows: its own device-to-device copy bandwidth (no peer)."""
    import torch

    if not torch.cuda.is_available():
        return {"error": "no CUDA device visible to torch"}
    gbs = copy_gbs(torch, 0, 0, nbytes)
    return {"gpu": torch.cuda.get_device_name(0), "torch": torch.__version__, "cuda": torch.version.cuda,
            "bytes": nbytes, "d2d_copy_gbs": round(gbs, 1),
            "note": "bytes copied per second within GPU 0; each byte is read and written, so the memory traffic "
                    "is twice this"}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python3 -m pdstack.image.p2p", description=__doc__.splitlines()[0])
    ap.add_argument("--plan", help="this host's plan (/etc/pdstack/plan.json): its servers' GPUs and NUMA nodes")
    ap.add_argument("--self-test", action="store_true", help="one GPU: its own device-to-device copy bandwidth")
    ap.add_argument("--mib", type=int, default=256, help="buffer size per copy, MiB (default 256)")
    ap.add_argument("--margin", type=float, default=MARGIN, help="fraction of the published low end a pair must reach")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    if not a.self_test and not a.plan:
        ap.error("give --plan PLAN.json (the gate) or --self-test")
    if a.self_test:
        out = self_test(a.mib * 2**20)
        print(json.dumps(out) if a.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
        return 1 if "error" in out else 0
    with open(a.plan) as f:
        out = measure(json.load(f), a.mib * 2**20, a.margin)
    if a.json:
        print(json.dumps(out))
    else:
        for p in out["pairs"]:
            print(f"GPU {p['a']} <-> GPU {p['b']} ({p['why']}): {p['gbs_ab']:.1f} / {p['gbs_ba']:.1f} GB/s, "
                  f"floor {p['floor_gbs']:.1f}")
        for g in out["groups"]:
            if g["busbw_gbs"] is not None:
                print(f"all-reduce {g['gpus']} ({g['server']}): bus bandwidth {g['busbw_gbs']:.1f} GB/s")
        print("\n".join(f"FAIL {x}" for x in out["failures"]) or "P2P gate passed")
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
