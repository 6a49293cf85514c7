"""The P2P gate for a GPU host, run inside the serving image before its servers start: copy bandwidth both ways
between the GPU pairs the plan uses (within each TP group, and each prefill GPU to its decode counterpart) and an
NCCL all-reduce in each TP group, against the floors the plan carries; a pair under its floor fails, naming the two
GPUs and the numbers.

    python3 -m pdstack.image.p2p --gate /etc/pdstack/p2p.json [--json]   the gate (exit 0 pass, 1 fail, 2 misuse)
    python3 -m pdstack.image.p2p --self-test [--json]                   one GPU: its own device-to-device copy

The gate file is this host's plan.p2p entry (pdstack/controller/plan/p2p_plan.py computes the pairs, groups and
floors from the recorded topology; roles/serving/tasks/p2p.yml writes it and runs this with `docker run
--gpus "device=<devices>"`). GPU numbers are the host's (nvidia-smi's): inside the container the gate's `devices`
are CUDA ordinals 0.. in that order (CUDA_DEVICE_ORDER=PCI_BUS_ID, which is nvidia-smi's order).

In the serving image it is /opt/pdstack/tools/pdstack/image/p2p.py (PYTHONPATH=/opt/pdstack/tools; the build context
carries it, pdstack/controller/imagebuild/inputs.py PROD_TOOLS). Only torch is needed (the image has it), imported when
a measurement runs, so the verdicts are testable without a GPU.
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

GB = 1e9


def judge(pairs: list[dict[str, Any]], groups: list[dict[str, Any]]) -> list[str]:
    """Every failure as one line naming the GPUs, the measured number and the floor. Pairs carry their floor_gbs and
    what was measured (gbs_ab: a -> b, gbs_ba: b -> a); groups their floor_gbs and busbw_gbs."""
    out = []
    for p in pairs:
        for d, key in (("->", "gbs_ab"), ("<-", "gbs_ba")):
            if p.get(key) is not None and p[key] < p["floor_gbs"]:
                out.append(f"GPU {p['a']} {d} GPU {p['b']} ({p['why']}): {p[key]:.2f} GB/s, under its floor "
                           f"{p['floor_gbs']:.2f} GB/s ({p['placement']})")
    for g in groups:
        if g.get("busbw_gbs") is not None and g["busbw_gbs"] < g["floor_gbs"]:
            out.append(f"all-reduce over GPUs {g['gpus']} ({g['server']}): bus bandwidth {g['busbw_gbs']:.2f} GB/s, "
                       f"under its floor {g['floor_gbs']:.2f} GB/s")
    return out


def check_gate(gate: Any, where: str) -> list[str]:
    """What is wrong with a gate file (the plan's p2p entry of one host), each naming the field and the fix."""
    if not isinstance(gate, dict):
        return [f"{where}: not a JSON object; write this host's plan.p2p entry (pdstack plan --json)"]
    bad = [f"{where}: {k} missing; regenerate it from the plan (the serving role writes it)"
           for k in ("devices", "pairs", "groups") if not isinstance(gate.get(k), list)]
    if bad:
        return bad
    used = {g for p in gate["pairs"] for g in (p.get("a"), p.get("b"))} | {g for x in gate["groups"]
                                                                           for g in x.get("gpus", [])}
    missing = sorted(used - set(gate["devices"]), key=str)
    return [f"{where}: GPU(s) {missing} measured but not in devices {gate['devices']}; regenerate it from the plan"
            ] if missing else []


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


def measure(gate: dict[str, Any], nbytes: int) -> dict[str, Any]:
    """Measure the gate's pairs both ways and its groups' all-reduce (host GPU numbers mapped to the container's
    ordinals through gate["devices"]), then judge them against their floors."""
    import torch

    ordinal = {g: i for i, g in enumerate(gate["devices"])}
    if torch.cuda.device_count() < len(ordinal):
        return {"error": f"the container sees {torch.cuda.device_count()} CUDA device(s), the gate needs "
                         f"{len(ordinal)} (host GPUs {gate['devices']}): run it with --gpus \"device=...\" of them",
                "passed": False}
    pairs = [dict(p) for p in gate["pairs"]]
    groups = [dict(g) for g in gate["groups"]]
    for p in pairs:
        a, b = ordinal[p["a"]], ordinal[p["b"]]
        p["gbs_ab"] = round(copy_gbs(torch, a, b, nbytes), 2)
        p["gbs_ba"] = round(copy_gbs(torch, b, a, nbytes), 2)
    for g in groups:
        g["busbw_gbs"] = round(allreduce_busbw(torch, [ordinal[x] for x in g["gpus"]], nbytes), 2)
    failures = judge(pairs, groups)
    return {"pairs": pairs, "groups": groups, "failures": failures, "passed": not failures}


def report(out: dict[str, Any]) -> str:
    """The gate's result for people: one line per pair and group, then the failures or that it passed."""
    if "error" in out:
        return f"P2P gate could not measure: {out['error']}"
    lines = [f"GPU {p['a']} <-> GPU {p['b']} ({p['why']}, {p['placement']}): {p['gbs_ab']:.1f} / {p['gbs_ba']:.1f} "
             f"GB/s, floor {p['floor_gbs']:.1f}" for p in out["pairs"]]
    lines += [f"all-reduce {g['gpus']} ({g['server']}): bus bandwidth {g['busbw_gbs']:.1f} GB/s, floor "
              f"{g['floor_gbs']:.1f}" for g in out["groups"]]
    return "\n".join(lines + ([f"FAIL {x}" for x in out["failures"]] or ["P2P gate passed"]))


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
    ap.add_argument("--gate", help="this host's plan.p2p entry (/etc/pdstack/p2p.json): pairs, groups, floors")
    ap.add_argument("--self-test", action="store_true", help="one GPU: its own device-to-device copy bandwidth")
    ap.add_argument("--mib", type=int, default=256, help="buffer size per copy, MiB (default 256)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    a = ap.parse_args(argv)
    if not a.self_test and not a.gate:
        ap.error("give --gate GATE.json (the gate) or --self-test")
    if a.self_test:
        out = self_test(a.mib * 2**20)
        print(json.dumps(out) if a.json else "\n".join(f"{k}: {v}" for k, v in out.items()))
        return 1 if "error" in out else 0
    try:
        with open(a.gate) as f:
            gate = json.load(f)
    except (OSError, ValueError) as e:
        ap.error(f"--gate {a.gate}: {e}")
    problems = check_gate(gate, a.gate)
    if problems:
        ap.error("; ".join(problems))
    out = measure(gate, a.mib * 2**20)
    print(json.dumps({**out, "report": report(out).splitlines()}) if a.json else report(out))
    return 0 if out["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
