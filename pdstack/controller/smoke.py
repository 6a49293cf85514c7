"""`pdstack smoke`: the deploy gate. Probe, recall and bench against the router, every result kept in one directory:

    OUT/probe.json  OUT/recall.json  OUT/recall.png (the heatmap)  OUT/bench.json  OUT/summary.json  OUT/summary.txt

The gate fails (exit 1) when the probe fails, the recall horizon is under --min-horizon, or C=1 decode tokens/s is
below baseline x (1 - tolerance) (or bench requests fail). The smoke role (roles/smoke) runs this on the control node
after every deploy, with OUT = build/smoke/<inventory>/<timestamp>, and fails the play with the summary.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from pdstack.controller import agent_gates, bench, recall
from pdstack.hostside import probe


def run_smoke(url: str, out: Path, *, lengths: list[int], depths: list[float], tokenizer: str, variants: list[str],
              needles: int, concurrency: int, min_horizon: int, baseline_tps: float | None, tolerance: float,
              bench_concurrency: list[int], bench_requests: int, bench_tokens: int, timeout: float,
              probe_first_token_timeout: float, probe_stall_timeout: float, agent: dict | None = None
              ) -> tuple[bool, dict, str]:
    out.mkdir(parents=True, exist_ok=True)
    lines, gates = [], {}

    pr = probe.probe(url, first_token_timeout=probe_first_token_timeout, stall_timeout=probe_stall_timeout,
                     total_timeout=max(timeout, probe_first_token_timeout + probe_stall_timeout))
    (out / "probe.json").write_text(json.dumps(pr.to_dict(), indent=1) + "\n")
    gates["probe"] = {"passed": pr.ok, "stage": pr.stage, "exit_code": pr.code, "message": pr.message}
    lines.append(f"probe   {'PASS' if pr.ok else 'FAIL'}  [{pr.stage}] {pr.message}")

    rr = recall.run_recall(url, lengths=lengths, depths=depths, tokenizer=tokenizer, variants=variants,
                           needles=needles, concurrency=concurrency, timeout=timeout, min_horizon=min_horizon,
                           progress=recall.print_progress())
    (out / "recall.json").write_text(json.dumps(rr.to_dict(), indent=1) + "\n")
    png = recall.heatmap(rr, out / "recall.png")
    counts = rr.counts()
    gates["recall"] = {"passed": rr.passed, "horizon": rr.horizon(), "min_horizon": min_horizon, "counts": counts,
                       "heatmap": str(png)}
    lines.append(f"recall  {'PASS' if rr.passed else 'FAIL'}  horizon {rr.horizon()} tokens (min {min_horizon}; "
                 f"grid {recall._k(min(lengths))}..{recall._k(max(lengths))} x {len(depths)} depths); "
                 + ", ".join(f"{v} {k}" for k, v in counts.items() if v))

    br = bench.run_bench(url, concurrency=bench_concurrency, requests=bench_requests, max_new_tokens=bench_tokens,
                         timeout=timeout, baseline_tps=baseline_tps, tolerance=tolerance,
                         progress=lambda m: print(m, file=sys.stderr, flush=True))
    (out / "bench.json").write_text(json.dumps(br.to_dict(), indent=1) + "\n")
    c1 = br.c1
    gates["bench"] = {"passed": br.passed, "c1_decode_tps": c1.decode_tps_per_request, "baseline_tps": baseline_tps,
                      "floor_tps": br.floor_tps, "ttft_p50_s": c1.ttft_s["p50"], "itl_p50_s": c1.itl_s["p50"]}
    tps = "-" if c1.decode_tps_per_request is None else f"{c1.decode_tps_per_request:.1f}"
    ttft = "-" if c1.ttft_s["p50"] is None else f"{c1.ttft_s['p50'] * 1000:.0f} ms"
    base = f" vs baseline {baseline_tps:g} (floor {br.floor_tps:.1f})" if baseline_tps else ""
    lines.append(f"bench   {'PASS' if br.passed else 'FAIL'}  C=1 decode {tps} tok/s{base}, TTFT p50 {ttft}"
                 + ("; requests failed: " + "; ".join(e for lv in br.levels for e in lv.errors) if br.failed else ""))

    agent_gates.run_agent_gates(url, out, agent or {}, tokenizer=tokenizer, timeout=timeout, gates=gates, lines=lines)

    passed = all(g["passed"] for g in gates.values())
    failed = [k for k, g in gates.items() if not g["passed"]]
    head = f"pdstack smoke {url}: " + ("PASS" if passed else f"FAIL ({', '.join(failed)})")
    text = "\n".join([head, *("  " + line for line in lines), f"  heatmap: {png}", f"  results: {out}"])
    summary = {"url": url, "passed": passed, "failed": failed, "gates": gates, "dir": str(out), "heatmap": str(png)}
    (out / "summary.json").write_text(json.dumps(summary, indent=1) + "\n")
    (out / "summary.txt").write_text(text + "\n")
    return passed, summary, text


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--url", required=True, help="router URL")
    p.add_argument("--out", required=True, help="directory for probe/recall/bench JSON, the heatmap and the summary")
    p.add_argument("--inventory", "-i", metavar="DIR",
                   help="take every setting below that is not given from the inventory's pdstack_smoke (and recall "
                        "concurrency from pdstack_router.admission.max_concurrent_requests)")
    p.add_argument("--lengths", type=recall._int_list, help="recall lengths (default 1K..32K)")
    p.add_argument("--depths", type=recall._depth_list, help="recall depths, %% (default 0,10,...,100)")
    p.add_argument("--tokenizer", help="directory with the model's tokenizer.json (default: the sim's)")
    p.add_argument("--variant", choices=("single", "multi", "both"), help="needle variants (default both)")
    p.add_argument("--needles", type=int, help="needles per prompt, multi variant (default 3)")
    p.add_argument("--concurrency", type=int, help="recall requests in flight, within router admission (default 4)")
    p.add_argument("--min-horizon", type=int, help="recall gate, tokens (default 0)")
    p.add_argument("--baseline", type=float, help="C=1 decode tokens/s baseline (default: none, report only)")
    p.add_argument("--tolerance", type=float, help="allowed shortfall below the baseline, fraction (default 0.2)")
    p.add_argument("--bench-concurrency", type=bench._ints, help="bench sweep levels (default 1,2,4)")
    p.add_argument("--bench-requests", type=int, help="bench requests per level (default 3)")
    p.add_argument("--bench-tokens", type=int, help="tokens per bench request (default 128)")
    p.add_argument("--timeout", type=float, help="seconds per request (default 300)")
    p.add_argument("--probe-first-token-timeout", type=float, default=60.0)
    p.add_argument("--probe-stall-timeout", type=float, default=15.0)
    p.add_argument("--no-tools", dest="tools", action="store_const", const=False,
                   help="skip the tool-call gate (default: on)")
    p.add_argument("--no-reasoning", dest="reasoning", action="store_const", const=False,
                   help="skip the reasoning checks of the tool-call gate (default: on when the reasoning parser is)")
    p.add_argument("--no-churn", dest="churn", action="store_const", const=False,
                   help="skip the answers-under-churn gate (default: on)")
    p.add_argument("--churn-lengths", type=recall._int_list,
                   help="needle lengths of the churn gate (default 1K,4K,16K)")
    p.add_argument("--admission-limit", type=int,
                   help="router max_concurrent_requests the churn gate holds the front door at (default: inventory's)")
    p.add_argument("--model", help="model name in OpenAI requests (default: the inventory's served_name)")
    p.epilog = "exit codes: 0 every gate passed, 1 a gate failed (summary says which), 2 usage or bad inventory"


DEFAULTS = {"lengths": recall.DEFAULT_LENGTHS, "depths": recall.DEFAULT_DEPTHS, "tokenizer": str(recall.SIM_TOKENIZER),
            "variant": "both", "needles": 3, "concurrency": 4, "min_horizon": 0, "baseline": None, "tolerance": 0.2,
            "bench_concurrency": [1, 2, 4], "bench_requests": 3, "bench_tokens": 128, "timeout": 300.0}


def _deployment(path: str):
    from pdstack.controller import inventory

    return inventory.load(path)


def settings_from_inventory(path: str) -> dict:
    """pdstack_smoke (defaults filled by the inventory schema) as smoke CLI settings."""
    dep = _deployment(path)
    sm, adm = dep.smoke, dep.router["admission"]
    conc = sm["concurrency"] or (adm["max_concurrent_requests"] if adm["max_concurrent_requests"] > 0 else 4)
    out = {"lengths": sm["grid"]["lengths"], "depths": sm["grid"]["depths"], "variant": sm["grid"]["variant"],
           "needles": sm["grid"]["needles"], "concurrency": conc, "min_horizon": sm["min_horizon"],
           "baseline": sm["bench"]["baseline_tps"], "tolerance": sm["bench"]["tolerance"],
           "bench_concurrency": sm["bench"]["concurrency"], "bench_requests": sm["bench"]["requests"],
           "bench_tokens": sm["bench"]["max_new_tokens"], "timeout": float(sm["timeout_s"])}
    if sm["tokenizer"]:
        out["tokenizer"] = sm["tokenizer"]
    return out


def run(args: argparse.Namespace) -> int:
    cfg = dict(DEFAULTS)
    if args.inventory:
        cfg.update(settings_from_inventory(args.inventory))
    cfg.update({k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None})
    variants = ["single", "multi"] if cfg["variant"] == "both" else [cfg["variant"]]
    agent = agent_gates.settings_from_deployment(_deployment(args.inventory)) if args.inventory else {}
    agent.update({k: v for k, v in {"tools": args.tools, "reasoning": args.reasoning, "churn": args.churn,
                                    "churn_lengths": args.churn_lengths, "admission_limit": args.admission_limit,
                                    "model": args.model}.items() if v is not None})
    try:
        passed, _, text = run_smoke(
            args.url, Path(args.out), lengths=cfg["lengths"], depths=cfg["depths"], tokenizer=cfg["tokenizer"],
            variants=variants, needles=cfg["needles"], concurrency=cfg["concurrency"],
            min_horizon=cfg["min_horizon"], baseline_tps=cfg["baseline"], tolerance=cfg["tolerance"],
            bench_concurrency=cfg["bench_concurrency"], bench_requests=cfg["bench_requests"],
            bench_tokens=cfg["bench_tokens"], timeout=cfg["timeout"],
            probe_first_token_timeout=args.probe_first_token_timeout, probe_stall_timeout=args.probe_stall_timeout,
            agent=agent)
    except (FileNotFoundError, ImportError) as e:
        print(f"pdstack smoke: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0 if passed else 1
