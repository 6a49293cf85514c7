"""What a tune run concludes: the winner, the Markdown report, the plots, and the host_vars change to commit.

The winner is the best candidate by the objective among those that qualify: recall gate passed, every point of the
sweep answered without an error. A candidate that loses recall is never chosen, whatever its speed; "baseline" (the
plan as the inventory has it, measured first) is a candidate like the others, and wins ties (no change is the
cheaper change).

  c1_decode_tps   the C=1 point of the first shape: per-request decode tok/s (median over its requests)
  aggregate_tps   the best aggregate output tok/s over the points whose TPOT p99 <= tpot_p99_ms_max

Besides its own shapes, the report gives every point in the shape SGLang's cookbook reports DeepSeek V4 (random input
8,192 / output 1,024 at concurrency 1, 16 and 64, after a warm-up) where the sweep has those points: TTFT, TPOT
and ITL p50/p99, output tok/s, output tok/s per GPU (the candidate's GPUs, all servers) and goodput: output tok/s
x the share of requests whose TPOT (1 / their decode tok/s) is within goodput_tpot_ms. pareto.png plots output
tok/s per GPU against TPOT p99 for every point, the winner marked, the published anchors beside.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

# Published figures for DeepSeek-V4-Flash on RTX PRO 6000 Blackwell, beside ours in every report (docs/tune.md,
# "Anchors", says where each is from). (label, concurrency, tok/s low, tok/s high, what is measured)
ANCHORS = [
    ("field deployment (hand-built, this repo's reference)", 1, 64.0, 64.0, "per-request decode"),
    ("peer, TP4, no speculation", 1, 155.0, 178.0, "per-request decode"),
    ("peer, TP4, MTP2", 1, 288.0, 299.0, "per-request decode"),
    ("peer, TP4 first boot -> graphs + tuned config", 1, 72.9, 234.8, "per-request decode"),
    ("peer, TP4, no speculation", 64, 2531.0, 2903.0, "aggregate"),
    ("stock SGLang, TP2", 1, 58.0, 58.0, "per-request decode"),
    ("vLLM fork, TP2, full graphs", 1, 148.0, 153.0, "per-request decode"),
    ("vLLM fork, TP4, full graphs", 1, 179.0, 184.0, "per-request decode"),
    ("vLLM fork, TP4, DSpark K5", 1, 260.0, 301.0, "per-request decode"),
    ("peer ladder TP2: piecewise graphs", 1, 77.1, 77.1, "per-request decode"),
    ("peer ladder TP2: full decode graphs", 1, 109.3, 109.3, "per-request decode"),
    ("peer ladder TP2: speculation + Marlin W4A16", 1, 202.7, 202.7, "per-request decode"),
]
COOKBOOK_SHAPE = (8192, 1024)
COOKBOOK_CONCURRENCY = (1, 16, 64)


def derive(p: dict[str, Any], gpus: int, tpot_ms: float) -> dict[str, Any]:
    """A point's per-GPU output tok/s and goodput (output tok/s x the share of requests with TPOT <= tpot_ms)."""
    per_req = p.get("decode_tps_per_request") or []
    agg = p.get("aggregate_tps")
    share = (sum(1000.0 / v <= tpot_ms for v in per_req if v) / len(per_req)) if per_req else None
    return {"tps_per_gpu": None if agg is None or not gpus else round(agg / gpus, 2),
            "goodput_tps": None if agg is None or share is None else round(agg * share, 2)}


def qualifies(c: dict[str, Any]) -> tuple[bool, str]:
    """(may it win, why not)."""
    if c["status"] != "measured":
        return False, c["status"]
    if not c["recall"]["passed"]:
        return False, f"lost recall (horizon {c['recall']['horizon']} < {c['recall']['min_horizon']} tokens)"
    if c.get("disqualified_because"):  # the accuracy gate's verdict (gates/accuracy.py), set when measured
        return False, c["disqualified_because"]
    bad = [p for p in c["points"] if p["errors"]]
    if bad:
        return False, f"{sum(p['errors'] for p in bad)} request(s) failed under load"
    return True, ""


def score(c: dict[str, Any], objective: str, tpot_p99_ms_max: float | None) -> float | None:
    pts = c.get("points") or []
    if not pts:
        return None
    if objective == "c1_decode_tps":
        first = (pts[0]["input"], pts[0]["output"])
        c1 = [p for p in pts if (p["input"], p["output"]) == first and p["concurrency"] == 1]
        return c1[0]["decode_tps_per_request_p50"] if c1 else None
    ok = [p["aggregate_tps"] for p in pts if p["aggregate_tps"] is not None and p["tpot_ms_p99"] is not None
          and p["tpot_ms_p99"] <= (tpot_p99_ms_max or float("inf"))]
    return max(ok) if ok else None


def pick_winner(candidates: list[dict[str, Any]], objective: str, tpot_p99_ms_max: float | None) -> str | None:
    best, best_score = None, None
    for c in candidates:  # baseline first: a tie keeps it
        ok, why = qualifies(c)
        c["qualified"], c["disqualified_because"] = ok, why
        c["score"] = score(c, objective, tpot_p99_ms_max) if c["status"] == "measured" else None
        if ok and c["score"] is not None and (best_score is None or c["score"] > best_score):
            best, best_score = c["name"], c["score"]
    return best


def fixed(v: Any, nd: int = 1) -> str:
    """A number to `nd` decimals for the report's tables; "-" when the run did not measure it."""
    return "-" if v is None else f"{v:.{nd}f}"


def _cell(text: str, n: int = 160) -> str:
    """One table cell of a free text: one line, no pipes, cut (results.json keeps the whole text)."""
    one = " ".join(str(text).split()).replace("|", "/")
    return one if len(one) <= n else one[: n - 3] + "..."


def table(results: dict[str, Any]) -> str:
    rows = ["| candidate | verdict | recall horizon | accuracy | in/out | C | decode tok/s/req | aggregate tok/s | "
            "tok/s/GPU | goodput | prefill tok/s | TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p50/p99 ms | errors |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for c in results["candidates"]:
        verdict = ("WINNER" if c["name"] == results["winner"] else "qualified" if c.get("qualified")
                   else f"out: {c.get('disqualified_because') or c['status']}")
        rec = c.get("recall") or {}
        horizon = f"{rec.get('horizon')} (min {rec.get('min_horizon')})" if rec else "-"
        acc = c.get("accuracy")
        acc = f"{acc['correct']}/{acc['total']}" if acc else "-"
        if not c.get("points"):
            rows.append(f"| {c['name']} | {verdict} | {horizon} | {acc} | - | - | - | - | - | - | - | - | - | - | "
                        f"{_cell(c.get('error', ''))} |")
            continue
        for p in c["points"]:
            rows.append(f"| {c['name']} | {verdict} | {horizon} | {acc} | {p['input']}/{p['output']} | "
                        f"{p['concurrency']} | {fixed(p['decode_tps_per_request_p50'])} | "
                        f"{fixed(p['aggregate_tps'])} | {fixed(p.get('tps_per_gpu'))} | "
                        f"{fixed(p.get('goodput_tps'))} | {fixed(p['prefill_tps'], 0)} | "
                        f"{fixed(p['ttft_ms_p50'])}/{fixed(p['ttft_ms_p99'])} | "
                        f"{fixed(p['tpot_ms_p50'])}/{fixed(p['tpot_ms_p99'])} | "
                        f"{fixed(p['itl_ms_p50'])}/{fixed(p['itl_ms_p99'])} | {p['errors']} |")
    return "\n".join(rows)


def anchors_md() -> str:
    rows = ["| published figure | C | tok/s | what |", "|---|---|---|---|"]
    rows += [f"| {label} | {c} | {lo:g}{'' if lo == hi else f'-{hi:g}'} | {what} |"
             for label, c, lo, hi, what in ANCHORS]
    return "\n".join(rows)


def cookbook_md(results: dict[str, Any]) -> str:
    """The cookbook's shape (input 8,192 / output 1,024 at C 1, 16, 64), one row per candidate and level."""
    rows = ["| candidate | GPUs | C | TTFT p50/p99 ms | TPOT p50/p99 ms | ITL p50/p99 ms | output tok/s | tok/s/GPU | "
            f"goodput (TPOT <= {results.get('goodput_tpot_ms', '-')} ms) |", "|---|---|---|---|---|---|---|---|---|"]
    for c in results["candidates"]:
        for p in c.get("points") or []:
            if (p["input"], p["output"]) != COOKBOOK_SHAPE or p["concurrency"] not in COOKBOOK_CONCURRENCY:
                continue
            rows.append(f"| {c['name']} | {c.get('gpus', '-')} | {p['concurrency']} | {fixed(p['ttft_ms_p50'])}/"
                        f"{fixed(p['ttft_ms_p99'])} | {fixed(p['tpot_ms_p50'])}/{fixed(p['tpot_ms_p99'])} | "
                        f"{fixed(p['itl_ms_p50'])}/{fixed(p['itl_ms_p99'])} | {fixed(p['aggregate_tps'])} | "
                        f"{fixed(p.get('tps_per_gpu'))} | {fixed(p.get('goodput_tps'))} |")
    if len(rows) == 2:
        return ("The sweep has no point of the cookbook's shape (add {input: 8192, output: 1024} and concurrency 1, "
                "16, 64 to sweep: inventory/production.tune.yml does).")
    return "\n".join(rows)


def pareto(results: dict[str, Any], out: Path) -> Path:
    """pareto.png: output tok/s per GPU against TPOT p99, every measured point; the winner's filled, the
    non-dominated front drawn; the published anchors where they give both (TPOT = 1000 / per-request tok/s at C=1)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 5))
    front = []
    for c in results["candidates"]:
        pts = [(p["tpot_ms_p99"], p["tps_per_gpu"]) for p in c.get("points") or []
               if p.get("tpot_ms_p99") is not None and p.get("tps_per_gpu") is not None]
        if not pts:
            continue
        win = c["name"] == results["winner"]
        ax.scatter(*zip(*pts, strict=True), s=60 if win else 25, marker="*" if win else "o",
                   label=c["name"] + (" (winner)" if win else ""), zorder=3 if win else 2)
        front += pts
    best = []
    for x, y in sorted(front):
        if not best or y > best[-1][1]:
            best.append((x, y))
    if best:
        ax.step(*zip(*best, strict=True), where="post", color="black", alpha=0.4, label="Pareto front")
    for label, conc, lo, hi, what in ANCHORS:
        # C=1 figures of a known TP size and a narrow range (a before/after range is no one point)
        if what == "per-request decode" and conc == 1 and ("TP4" in label or "TP2" in label) and hi <= 1.3 * lo:
            gpus = 4 if "TP4" in label else 2
            mid = (lo + hi) / 2
            ax.scatter([1000.0 / mid], [mid / gpus], marker="x", color="grey")
            ax.annotate(label, (1000.0 / mid, mid / gpus), fontsize=6, color="grey")
    ax.set_xlabel("TPOT p99 (ms, lower is better)")
    ax.set_ylabel("output tok/s per GPU")
    ax.set_xscale("log")
    ax.grid(alpha=0.3)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    ax.set_title(f"pdstack tune {results['inventory']} {results['run']} (grey x: published, C=1)", fontsize=9)
    fig.tight_layout()
    path = out / "pareto.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plots(results: dict[str, Any], out: Path) -> list[Path]:
    """throughput.png (decode tok/s per request and aggregate vs concurrency, anchors beside) and ttft.png (TTFT
    p50 vs input length at C=1)."""
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    measured = [c for c in results["candidates"] if c.get("points")]
    fig, (a1, a2) = plt.subplots(1, 2, figsize=(12, 4.5))
    for c in measured:
        shape = (c["points"][0]["input"], c["points"][0]["output"])
        pts = [p for p in c["points"] if (p["input"], p["output"]) == shape]
        xs = [p["concurrency"] for p in pts]
        a1.plot(xs, [p["decode_tps_per_request_p50"] or 0 for p in pts], marker="o", label=c["name"])
        a2.plot(xs, [p["aggregate_tps"] or 0 for p in pts], marker="o", label=c["name"])
    for label, conc, lo, hi, what in ANCHORS:
        ax = a1 if what == "per-request decode" else a2
        ax.errorbar([conc], [(lo + hi) / 2], yerr=[[(hi - lo) / 2], [(hi - lo) / 2]], fmt="x", color="grey",
                    capsize=4)
        ax.annotate(label, (conc, hi), fontsize=6, color="grey")
    for ax, what in ((a1, "decode tok/s per request (p50)"), (a2, "aggregate output tok/s")):
        ax.set_xscale("log", base=2)
        ax.set_xlabel("concurrency")
        ax.set_ylabel(what)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7)
    fig.suptitle(f"pdstack tune {results['inventory']} {results['run']} (first shape; grey: published anchors)")
    fig.tight_layout()
    thr = out / "throughput.png"
    fig.savefig(thr, dpi=110)
    plt.close(fig)

    fig, ax = plt.subplots(figsize=(6, 4.5))
    for c in measured:
        pts = sorted((p for p in c["points"] if p["concurrency"] == 1), key=lambda p: p["input"])
        ax.plot([p["input"] for p in pts], [p["ttft_ms_p50"] or 0 for p in pts], marker="o", label=c["name"])
    ax.set_xscale("log", base=2)
    ax.set_xlabel("input tokens (C=1)")
    ax.set_ylabel("TTFT p50 (ms)")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=7)
    fig.tight_layout()
    ttft = out / "ttft.png"
    fig.savefig(ttft, dpi=110)
    plt.close(fig)
    return [thr, ttft, pareto(results, out)]


def winner_change(results: dict[str, Any], servers_by_host: dict[str, list[dict[str, Any]]], out: Path) -> Path | None:
    """The winner's servers as host_vars files (out/winner/host_vars/<host>/servers.yml), ready to copy over the
    inventory's, plus CHANGE.md saying which keys it adds. None when the baseline won (nothing to change)."""
    win = next((c for c in results["candidates"] if c["name"] == results["winner"]), None)
    if win is None or win["name"] == "baseline":
        return None
    d = out / "winner"
    lines = [f"# tune winner: {win['name']}", "", win.get("description") or "", "",
             f"Objective {results['objective']}: {fixed(win['score'])} (baseline: "
             f"{fixed(next((c.get('score') for c in results['candidates'] if c['name'] == 'baseline'), None))}).", "",
             "Copy host_vars/<host>/servers.yml over the inventory's (comments there are not carried), or add these "
             "keys by hand:", ""]
    for host, servers in servers_by_host.items():
        f = d / "host_vars" / host / "servers.yml"
        f.parent.mkdir(parents=True, exist_ok=True)
        f.write_text(f"---\n# written by `invoke tune` ({results['run']}): candidate {win['name']}\n"
                     + yaml.safe_dump({"pdstack_servers": servers}, sort_keys=False, width=120))
        if host in (win["overlay"].get("topology") or {}):
            lines.append(f"- host_vars/{host}: the server list replaced (topology): "
                         + ", ".join(f"{s['name']} ({s.get('role')}, GPUs {s.get('gpus')}, TP {s.get('tp_size')})"
                                     for s in servers))
        for s in servers:
            for sel, change in win["overlay"]["servers"].items():
                if sel in ("all", s.get("role"), s.get("name")):
                    for key in ("extra_args", "env"):
                        for k, v in (change.get(key) or {}).items():
                            lines.append(f"- host_vars/{host} server {s['name']}: {key}.{k}: {v!r}")
    (d / "CHANGE.md").write_text("\n".join(lines) + "\n")
    return d


def markdown(results: dict[str, Any], plot_paths: list[Path], change: Path | None) -> str:
    win = results["winner"]
    out = [f"# pdstack tune: {results['inventory']}, run {results['run']}", "",
           f"Objective: **{results['objective']}**"
           + (f" (TPOT p99 <= {results['tpot_p99_ms_max']:g} ms)" if results.get("tpot_p99_ms_max") else ""),
           f"Winner: **{win or 'none qualified'}**"
           + (f" (host_vars change: {change})" if change else " (the inventory's plan stays)" if win else ""), "",
           table(results), "", "## The cookbook's shape (random 8,192 in / 1,024 out, warm-up first)", "",
           cookbook_md(results), "", "## Anchors (published, other deployments of this model on these GPUs)", "",
           anchors_md(), "", "## Plots", ""]
    out += [f"![{p.stem}]({p.name})" for p in plot_paths]
    out += ["", f"Restored after the run: {results.get('restored')}", ""]
    return "\n".join(out)
