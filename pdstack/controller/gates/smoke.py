"""`pdstack smoke`: the deploy gate. Probe, recall and bench against the router, every result kept in one directory:

    OUT/probe.json  OUT/recall.json  OUT/recall.png (the heatmap)  OUT/bench.json  OUT/summary.json  OUT/summary.txt

The gate fails (exit 1) when the probe fails, the recall horizon is under --min-horizon, or C=1 decode tokens/s is
below baseline x (1 - tolerance) (or bench requests fail). The smoke role (roles/smoke) runs this on the control node
after every deploy, with OUT = build/smoke/<inventory>/<timestamp>, and fails the play with the summary.

Settings: the inventory schema's pdstack_smoke defaults (smoke_settings.DEFAULTS, which recall and bench use too),
then the inventory's pdstack_smoke (-i; with --vars from the variables Ansible resolved, as the smoke role passes
them, so `ansible-playbook -e` reaches the gate), then the flags given.

The front door's API key, when the deployment has one, comes from PDSTACK_API_KEY_FILE / PDSTACK_API_KEY (apikey.py;
the smoke role passes a mode-0600 file) and goes with every request of every gate; a gate the front door refuses
says so ("the front door refused the API key"), not that the model failed.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdstack.controller.gates import agent_gates, apikey, bench, heatmap, recall, recall_report, results, smoke_settings
from pdstack.controller.gates.smoke_settings import DEFAULTS
from pdstack.controller.load import inventory
from pdstack.errors import InventoryError
from pdstack.hostside import probe


def run_smoke(url: str, out: Path, *, cfg: dict, probe_first_token_timeout: float, probe_stall_timeout: float,
              agent: dict | None = None, headers: dict[str, str] | None = None) -> tuple[bool, dict, str]:
    """Every gate against `url`, results in `out`. `cfg`: settings() (smoke_settings' keys); `headers`: sent with
    every request (apikey.from_env())."""
    tokenizer, timeout, min_horizon = cfg["tokenizer"], cfg["timeout"], cfg["min_horizon"]
    lengths, depths, baseline_tps = cfg["lengths"], cfg["depths"], cfg["baseline"]
    out.mkdir(parents=True, exist_ok=True)
    lines, gates = [], {}

    pr = probe.probe(url, first_token_timeout=probe_first_token_timeout, stall_timeout=probe_stall_timeout,
                     total_timeout=max(timeout, probe_first_token_timeout + probe_stall_timeout), headers=headers)
    results.write_json(out / "probe.json", pr.to_dict())
    gates["probe"] = {"passed": pr.ok, "stage": pr.stage, "exit_code": pr.code, "message": pr.message}
    lines.append(f"probe   {'PASS' if pr.ok else 'FAIL'}  [{pr.stage}] {pr.message}")

    print(recall.estimate_line(cfg), file=sys.stderr, flush=True)
    rr = recall.run_with(url, cfg, headers=headers, progress=recall.print_progress())
    results.write_json(out / "recall.json", rr.to_dict())
    png = heatmap.draw(rr, out / "recall.png")
    counts = rr.counts()
    gates["recall"] = {"passed": rr.passed, "horizon": rr.horizon(), "min_horizon": min_horizon, "counts": counts,
                       "heatmap": str(png)}
    lines.append(f"recall  {'PASS' if rr.passed else 'FAIL'}  horizon {rr.horizon()} tokens (min {min_horizon}; "
                 f"grid {recall_report.kilo(min(lengths))}..{recall_report.kilo(max(lengths))} x {len(depths)} "
                 "depths); "
                 f"{'+'.join(rr.variants)}, prompts built in {rr.build_s:.1f} s; "
                 + ", ".join(f"{v} {k}" for k, v in counts.items() if v)
                 + (f"; {rr.auth_refused}" if rr.auth_refused else ""))

    br = bench.run_bench(url, concurrency=cfg["bench_concurrency"], requests=cfg["bench_requests"],
                         max_new_tokens=cfg["bench_tokens"], timeout=timeout, baseline_tps=baseline_tps,
                         tolerance=cfg["tolerance"],
                         progress=lambda m: print(m, file=sys.stderr, flush=True), headers=headers)
    results.write_json(out / "bench.json", br.to_dict())
    c1 = br.c1
    gates["bench"] = {"passed": br.passed, "c1_decode_tps": c1.decode_tps_per_request, "baseline_tps": baseline_tps,
                      "floor_tps": br.floor_tps, "ttft_p50_s": c1.ttft_s["p50"], "itl_p50_s": c1.itl_s["p50"]}
    tps = "-" if c1.decode_tps_per_request is None else f"{c1.decode_tps_per_request:.1f}"
    ttft = "-" if c1.ttft_s["p50"] is None else f"{c1.ttft_s['p50'] * 1000:.0f} ms"
    base = f" vs baseline {baseline_tps:g} (floor {br.floor_tps:.1f})" if baseline_tps else ""
    lines.append(f"bench   {'PASS' if br.passed else 'FAIL'}  C=1 decode {tps} tok/s{base}, TTFT p50 {ttft}"
                 + ("; requests failed: " + "; ".join(e for lv in br.levels for e in lv.errors) if br.failed else ""))

    agent_gates.run_agent_gates(url, out, agent or {}, tokenizer=tokenizer, timeout=timeout, gates=gates, lines=lines,
                                 headers=headers)

    passed = all(g["passed"] for g in gates.values())
    failed = [k for k, g in gates.items() if not g["passed"]]
    head = f"pdstack smoke {url}: " + ("PASS" if passed else f"FAIL ({', '.join(failed)})")
    text = "\n".join([head, *("  " + line for line in lines), f"  heatmap: {png}", f"  results: {out}"])
    summary = {"url": url, "passed": passed, "failed": failed, "gates": gates, "dir": str(out), "heatmap": str(png)}
    results.write_json(out / "summary.json", summary)
    (out / "summary.txt").write_text(text + "\n")
    return passed, summary, text


def register(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS  # the inventory schema's pdstack_smoke defaults; -i takes them from the inventory instead
    p.add_argument("--url", required=True, help="router URL")
    p.add_argument("--out", required=True, help="directory for probe/recall/bench JSON, the heatmap and the summary")
    p.add_argument("--inventory", "-i", metavar="DIR",
                   help="take every setting below that is not given from the inventory's pdstack_smoke (and recall "
                        "concurrency from pdstack_router.admission.max_concurrent_requests)")
    p.add_argument("--vars", metavar="FILE",
                   help="with -i: read pdstack_smoke from these resolved variables (the JSON the preflight role "
                        "writes, extra vars included) instead of the inventory's files; the smoke role passes it")
    p.add_argument("--lengths", type=recall.int_list,
                   help=f"recall lengths (default {','.join(map(recall_report.kilo, d['lengths']))})")
    p.add_argument("--depths", type=recall.depth_list,
                   help=f"recall depths, %% (default {','.join(f'{x:g}' for x in d['depths'])})")
    p.add_argument("--tokenizer", help="directory with the model's tokenizer.json (default: the inventory's "
                                        "pdstack_smoke.tokenizer; one is required)")
    p.add_argument("--variant", type=recall.variant_list,
                   help=f"recall case kinds, e.g. single,multikey (default {recall.kinds(d['variant'])})")
    p.add_argument("--needles", type=int, help=f"needles per prompt, multi/multikey (default {d['needles']})")
    p.add_argument("--jitter", type=int, help=f"recall length jitter, tokens (default {d['jitter']})")
    p.add_argument("--full", action="store_true",
                   help="the longer recall grid (pdstack_smoke.full over grid; after an upgrade): not held to "
                        "pdstack_smoke.recall_budget_s")
    p.add_argument("--concurrency", type=int,
                   help=f"recall requests in flight, within router admission (default {d['concurrency']})")
    p.add_argument("--min-horizon", type=int, help=f"recall gate, tokens (default {d['min_horizon']})")
    p.add_argument("--baseline", type=float, help="C=1 decode tokens/s baseline (default: none, report only)")
    p.add_argument("--tolerance", type=float,
                   help=f"allowed shortfall below the baseline, fraction (default {d['tolerance']:g})")
    p.add_argument("--bench-concurrency", type=bench.ints,
                   help=f"bench sweep levels (default {','.join(map(str, d['bench_concurrency']))})")
    p.add_argument("--bench-requests", type=int, help=f"bench requests per level (default {d['bench_requests']})")
    p.add_argument("--bench-tokens", type=int, help=f"tokens per bench request (default {d['bench_tokens']})")
    p.add_argument("--timeout", type=float, help=f"seconds per request (default {d['timeout']:g})")
    p.add_argument("--probe-first-token-timeout", type=float, default=60.0)
    p.add_argument("--probe-stall-timeout", type=float, default=15.0)
    p.add_argument("--no-tools", dest="tools", action="store_const", const=False,
                   help="skip the tool-call gate (default: on)")
    p.add_argument("--no-reasoning", dest="reasoning", action="store_const", const=False,
                   help="skip the reasoning checks of the tool-call gate (default: on when the reasoning parser is)")
    p.add_argument("--no-churn", dest="churn", action="store_const", const=False,
                   help="skip the answers-under-churn gate (default: on)")
    p.add_argument("--churn-lengths", type=recall.int_list,
                   help="needle lengths of the churn gate (default 1K,4K,16K)")
    p.add_argument("--admission-limit", type=int,
                   help="router max_concurrent_requests the churn gate holds the front door at (default: inventory's)")
    p.add_argument("--model", help="model name in OpenAI requests (default: the inventory's served_name)")
    p.epilog = "exit codes: 0 every gate passed, 1 a gate failed (summary says which), 2 usage or bad inventory"


def deployment(args: argparse.Namespace) -> inventory.Deployment | None:
    """The inventory -i names (with --vars: the variables Ansible resolved), loaded once for every setting of the
    run (smoke_settings and the agent gates'); None without -i."""
    if args.vars and not args.inventory:
        raise InventoryError(["--vars FILE needs -i/--inventory DIR: the inventory whose variables it holds"])
    return inventory.load(args.inventory, args.vars) if args.inventory else None


def settings(args: argparse.Namespace, dep: inventory.Deployment | None) -> dict:
    """What this run uses: the schema's defaults, then the inventory's pdstack_smoke (`dep`, from deployment()),
    then the flags given."""
    cfg = dict(DEFAULTS)
    if dep is not None:
        cfg.update(smoke_settings.from_deployment(dep))
    if args.full:
        cfg.update(cfg["full"])
    cfg.update({k: v for k, v in vars(args).items() if k in DEFAULTS and v is not None and k != "full"})
    return cfg


def run(args: argparse.Namespace) -> int:
    headers = apikey.from_env()  # before any request: a key file others can read is a usage error (exit 2)
    dep = deployment(args)
    cfg = settings(args, dep)
    agent = agent_gates.settings_from_deployment(dep) if dep is not None else {}
    if not cfg["tokenizer"]:
        print(f"pdstack smoke: {smoke_settings.NO_TOKENIZER}", file=sys.stderr)
        return 2
    agent.update({k: v for k, v in {"tools": args.tools, "reasoning": args.reasoning, "churn": args.churn,
                                    "churn_lengths": args.churn_lengths, "admission_limit": args.admission_limit,
                                    "model": args.model}.items() if v is not None})
    try:
        passed, _, text = run_smoke(
            args.url, Path(args.out), cfg=cfg, probe_first_token_timeout=args.probe_first_token_timeout,
            probe_stall_timeout=args.probe_stall_timeout, agent=agent, headers=headers)
    except (FileNotFoundError, ImportError) as e:
        print(f"pdstack smoke: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0 if passed else 1
