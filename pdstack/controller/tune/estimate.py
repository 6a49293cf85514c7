"""What a tune run costs on the real host, said before it starts, and the candidate checks that need a plan's numbers.

Per candidate (the baseline has no restart):
  restart     tune.yml restart_s: drain, stop, start with the weights load and CUDA-graph capture, probe (docs/tune.md
              gives the figure behind the default)
  recall      the smoke gate's grid at pdstack_smoke.prefill_tps (load/recall_grid.py's model, as `pdstack plan`)
  accuracy    the shipped question set (gates/accuracy.py: 64 tokens an answer at the decode rate)
  sweep       per point: prompts x (input / prefill tok/s + output / decode tok/s) / concurrency, plus the warm-up
              and its wait; the decode rate is pdstack_smoke.bench.baseline_tps (the deployment's C=1 figure, per
              request), the same for every level (a lower bound at high concurrency, where steps slow down)
"""

from __future__ import annotations

from typing import Any

from pdstack.controller.gates import accuracy
from pdstack.controller.load import recall_grid
from pdstack.controller.tune import settings


def sweep_s(cfg: dict[str, Any], prefill_tps: float, decode_tps: float) -> float:
    sw = cfg["sweep"]
    t = sw["warmup_wait_s"] + sw["warmup_prompts"] * (sw["shapes"][0]["input"] / prefill_tps
                                                       + sw["shapes"][0]["output"] / decode_tps)
    for p in settings.points(sw):
        t += p["prompts"] * (p["input"] / prefill_tps + p["output"] / decode_tps) / p["concurrency"]
    return round(t, 1)


def run_estimate(cfg: dict[str, Any], smoke: dict[str, Any]) -> dict[str, Any]:
    """{per_candidate: {restart_s, recall_s, accuracy_s, sweep_s, total_s}, baseline_s, candidates, restore_s,
    total_s, skipped}: the whole run on the real host."""
    decode = float(smoke.get("baseline") or 64.0)
    rec = recall_grid.estimate(smoke, prefill_tps=smoke["prefill_tps"], decode_tps=smoke.get("baseline"),
                               concurrency=smoke["concurrency"], context_length=smoke["context_length"])
    one = {"restart_s": float(cfg["restart_s"]), "recall_s": float(rec["estimate_s"]),
           "accuracy_s": accuracy.estimate_s(len(accuracy.questions()), decode),
           "sweep_s": sweep_s(cfg, smoke["prefill_tps"], decode)}
    measure = one["recall_s"] + one["accuracy_s"] + one["sweep_s"]
    n = len(cfg["candidates"])
    total = measure + n * (one["restart_s"] + measure) + one["restart_s"]
    return {"per_candidate": {**one, "total_s": round(one["restart_s"] + measure, 1)}, "baseline_s": round(measure, 1),
            "candidates": [c["name"] for c in cfg["candidates"]], "restore_s": one["restart_s"],
            "total_s": round(total, 1), "skipped": list(cfg.get("skipped") or []), "decode_tps": decode,
            "prefill_tps": smoke["prefill_tps"]}


def _dur(s: float) -> str:
    return f"{s / 3600:.1f} h" if s >= 3600 else f"{s / 60:.0f} min" if s >= 120 else f"{s:.0f} s"


def lines(est: dict[str, Any]) -> list[str]:
    p = est["per_candidate"]
    out = [f"estimate on the real host ({est['prefill_tps']:g} prefill tok/s, {est['decode_tps']:g} decode tok/s per "
           f"request): per candidate restart {_dur(p['restart_s'])} + recall {_dur(p['recall_s'])} + accuracy "
           f"{_dur(p['accuracy_s'])} + sweep {_dur(p['sweep_s'])} = {_dur(p['total_s'])}",
           f"estimate: baseline {_dur(est['baseline_s'])} + {len(est['candidates'])} candidate(s) x "
           f"{_dur(p['total_s'])} + restore {_dur(est['restore_s'])} = {_dur(est['total_s'])} in all"]
    if est["skipped"]:
        out.append(f"skipped by name (--skip): {', '.join(est['skipped'])}")
    return out


def admission_problems(plan: dict[str, Any], admission: dict[str, Any]) -> list[str]:
    """The front door's admission against what the candidate's decodes can run: when every decode caps its batch
    (--max-running-requests), the front door must not let more requests in than they hold together, or the rest
    wait inside the router where the front door cannot see them (a topology with fewer decodes is the usual way)."""
    limit = admission.get("max_concurrent_requests", -1)
    caps = []
    for s in plan.get("servers") or []:
        if s.get("role") != "decode":
            continue
        argv = [str(a) for a in s.get("argv") or []]
        cap = next((argv[i + 1] for i, a in enumerate(argv[:-1]) if a == "--max-running-requests"), None)
        if cap is None or not cap.isdigit():
            return []  # a decode without a cap: SGLang sizes it from memory, nothing to hold the front door to
        caps.append(int(cap))
    if caps and limit > sum(caps):
        return [f"pdstack_router.admission.max_concurrent_requests {limit} is more than the candidate's "
                f"{len(caps)} decode server(s) run at once (--max-running-requests {' + '.join(map(str, caps))} = "
                f"{sum(caps)}): give the decodes room for it, or tune with an inventory whose admission fits"]
    return []
