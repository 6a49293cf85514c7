"""Needle-in-the-top-512 under fp8+scale vs bf16 index keys, on a synthetic DSV4 indexer (CPU, torch).

Model (one trial): a query of 64 heads x 128 dims and positive head weights; N - 1 distractor keys; the indexer
score of a key k is ``sum_h w_h * relu(q_h . k)`` (DeepSeek-V4's lightning indexer). Keys are
``common * mu + z`` with ``mu`` a unit-RMS direction shared by every token of the trial and ``z`` standard
normal per token: ``common`` = 0 is isotropic, larger values model the anisotropy real attention keys have
(a large shared component, small token-specific differences). The needle is a fresh key rescaled (the score is
positively homogeneous) so that, in float64, it beats the best distractor by ``margin`` standard deviations of
the distractor scores. Each layout then stores every key its way -- fp8 e4m3 with one fp32 scale per token
(amax / 448, SGLang 0.5.23's 132 B/token layout) or bf16 (256 B/token) -- and scores the dequantised keys in
float32 with the same exact query. The needle is recalled if fewer than 512 distractors score >= it.
N counts compressed positions including the needle, so N <= 512 is always recalled (top-k takes them all).
All N share one draw per trial (prefixes of the same distractors) and both layouts see the same draws.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

HEADS = 64
HEAD_DIM = 128
TOPK = 512
FP8_MAX = 448.0
LAYOUTS = ("fp8", "bf16")

# Outside the source tree: a run never rewrites the committed results.json / recall.png beside this file.
DEFAULT_OUT = Path(__file__).resolve().parents[2] / "build" / "recall_experiment"
DEFAULT_NS = (256, 512, 1024, 2048, 4096, 8192, 16384)
DEFAULT_MARGINS = (0.01, 0.03, 0.1, 0.3, 1.0)
DEFAULT_COMMONS = (0.0, 16.0, 64.0)


@dataclass
class Config:
    ns: tuple[int, ...] = DEFAULT_NS
    margins: tuple[float, ...] = DEFAULT_MARGINS  # in standard deviations of the distractor scores
    commons: tuple[float, ...] = DEFAULT_COMMONS  # shared-component scale of the keys (0 = isotropic)
    trials: int = 300
    seed: int = 0
    topk: int = TOPK
    threads: int = 2


@dataclass
class Cell:
    common: float
    n: int
    margin: float
    trials: int
    recalled: dict[str, int] = field(default_factory=dict)

    def rate(self, layout: str) -> float:
        return self.recalled[layout] / self.trials


def quantize_fp8(k: torch.Tensor) -> torch.Tensor:
    """Per-token fp8 e4m3 + fp32 scale (scale = max(1e-4, amax) / 448), returned dequantised in float32."""
    k = k.float()
    scale = k.abs().amax(-1, keepdim=True).clamp_min(1e-4) / FP8_MAX
    return (k / scale).clamp(-FP8_MAX, FP8_MAX).to(torch.float8_e4m3fn).float() * scale


def store(k: torch.Tensor, layout: str) -> torch.Tensor:
    """What the indexer reads back for keys ``k`` in ``layout``, as float32."""
    if layout == "fp8":
        return quantize_fp8(k)
    if layout == "bf16":
        return k.to(torch.bfloat16).float()
    raise ValueError(f"layout must be one of {LAYOUTS}, got {layout!r}")


def indexer_scores(keys: torch.Tensor, q: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """sum_h w_h * relu(q_h . k) for each key: keys [N, D], q [H, D], w [H] -> [N], in keys' dtype."""
    return torch.relu(keys @ q.T.to(keys.dtype)) @ w.to(keys.dtype)


def draw_trial(gen: torch.Generator, n_max: int, common: float):
    """(q [H, D], w [H], distractors [n_max - 1, D], needle direction [D]) in float64."""
    q = torch.randn(HEADS, HEAD_DIM, generator=gen, dtype=torch.float64) / math.sqrt(HEAD_DIM)
    w = torch.rand(HEADS, generator=gen, dtype=torch.float64) + 0.1
    mu = torch.randn(HEAD_DIM, generator=gen, dtype=torch.float64)
    mu = mu / mu.pow(2).mean().sqrt()
    keys = torch.randn(n_max, HEAD_DIM, generator=gen, dtype=torch.float64) + common * mu
    # needle direction: the best of 64 fresh keys, so the rescaled needle stays close to a typical key
    fresh = torch.randn(64, HEAD_DIM, generator=gen, dtype=torch.float64) + common * mu
    direction = fresh[indexer_scores(fresh, q, w).argmax()]
    return q, w, keys[: n_max - 1], direction


def run_trial(cfg: Config, gen: torch.Generator, common: float):
    """({(N, margin, layout): recalled?}, {layout: score error sd / distractor score sd}) for one draw."""
    q, w, distractors, direction = draw_trial(gen, max(cfg.ns), common)
    exact = indexer_scores(distractors, q, w)  # float64
    stored = {lay: indexer_scores(store(distractors, lay), q.float(), w.float()) for lay in LAYOUTS}
    dir_score = indexer_scores(direction[None], q, w)[0]
    out = {}
    for n in cfg.ns:
        d = n - 1
        best, spread = exact[:d].max(), exact[:d].std()
        for margin in cfg.margins:
            needle = direction * ((best + margin * spread) / dir_score)  # exact score = best + margin * std
            for lay in LAYOUTS:
                s = indexer_scores(store(needle[None], lay), q.float(), w.float())[0]
                beaten_by = int((stored[lay][:d] >= s).sum())
                out[(n, margin, lay)] = beaten_by < cfg.topk
    noise = {lay: float((stored[lay].double() - exact).std() / exact.std()) for lay in LAYOUTS}
    return out, noise


def run(cfg: Config, progress=None) -> tuple[list[Cell], dict[float, dict[str, float]]]:
    """(cells, noise): recall counts per (common, N, margin); mean score-noise/score-spread per common, layout."""
    torch.set_num_threads(cfg.threads)
    cells = {
        (c, n, m): Cell(c, n, m, cfg.trials, dict.fromkeys(LAYOUTS, 0))
        for c in cfg.commons
        for n in cfg.ns
        for m in cfg.margins
    }
    noise = {c: dict.fromkeys(LAYOUTS, 0.0) for c in cfg.commons}
    total = len(cfg.commons) * cfg.trials
    done, t0 = 0, time.monotonic()
    for ci, common in enumerate(cfg.commons):
        gen = torch.Generator().manual_seed(cfg.seed * 1000 + ci)
        for _ in range(cfg.trials):
            recalled, trial_noise = run_trial(cfg, gen, common)
            for (n, m, lay), ok in recalled.items():
                cells[(common, n, m)].recalled[lay] += int(ok)
            for lay in LAYOUTS:
                noise[common][lay] += trial_noise[lay] / cfg.trials
            done += 1
            if progress:
                progress(done, total, time.monotonic() - t0)
    return list(cells.values()), noise


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    """95% Wilson interval of a binomial rate."""
    if n == 0:
        return 0.0, 1.0
    p = k / n
    den = 1 + z * z / n
    mid = (p + z * z / (2 * n)) / den
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / den
    return max(0.0, mid - half), min(1.0, mid + half)


def table(cells: list[Cell], common: float) -> str:
    rows = [c for c in cells if c.common == common]
    margins = sorted({c.margin for c in rows})
    ns = sorted({c.n for c in rows})
    by = {(c.n, c.margin): c for c in rows}
    head = "| N | " + " | ".join(f"margin {m:g} sd: fp8 / bf16" for m in margins) + " |"
    sep = "|---:|" + "---:|" * len(margins)
    lines = [head, sep]
    for n in ns:
        vals = [f"{100 * by[(n, m)].rate('fp8'):.0f}% / {100 * by[(n, m)].rate('bf16'):.0f}%" for m in margins]
        lines.append(f"| {n} | " + " | ".join(vals) + " |")
    return "\n".join(lines)


def plot(cells: list[Cell], path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    commons = sorted({c.common for c in cells})
    fig, axes = plt.subplots(1, len(commons), figsize=(6 * len(commons), 4.5), squeeze=False, sharey=True)
    margins = sorted({c.margin for c in cells})
    colors = plt.cm.viridis([i / max(1, len(margins) - 1) for i in range(len(margins))])
    for ax, common in zip(axes[0], commons, strict=True):
        for color, m in zip(colors, margins, strict=True):
            rows = sorted((c for c in cells if c.common == common and c.margin == m), key=lambda c: c.n)
            ns = [c.n for c in rows]
            ax.plot(ns, [100 * c.rate("fp8") for c in rows], "--o", color=color, ms=3, label=f"fp8, {m:g} sd")
            ax.plot(ns, [100 * c.rate("bf16") for c in rows], "-s", color=color, ms=3, label=f"bf16, {m:g} sd")
        ax.set_xscale("log", base=2)
        ax.axvline(TOPK, color="grey", lw=0.8)
        ax.set_title(f"keys = {common:g} x shared + N(0, 1)" if common else "isotropic keys N(0, 1)")
        ax.set_xlabel("compressed positions N")
        ax.grid(alpha=0.3)
    axes[0][0].set_ylabel("needle in top-512 (%)")
    axes[0][-1].legend(fontsize=7, ncol=2, loc="lower left")
    fig.suptitle("Synthetic DSV4 indexer: needle recall, fp8+scale (dashed) vs bf16 (solid) keys")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def _progress(done: int, total: int, elapsed: float) -> None:
    eta = elapsed / done * (total - done)
    sys.stderr.write(f"\r  trial {done}/{total}  {elapsed:5.1f}s elapsed, ETA {eta:5.1f}s ")
    if done == total:
        sys.stderr.write("\n")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kernels.recall_experiment.experiment",
                                 description=__doc__.split("\n")[0])  # fmt: skip
    ap.add_argument("--out", type=Path, default=DEFAULT_OUT,
                    help=f"directory for results.json and recall.png (default {DEFAULT_OUT}; the committed copies "
                         "beside this file are updated by hand)")  # fmt: skip
    ap.add_argument("--trials", type=int, default=Config.trials, help="draws per key distribution")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--threads", type=int, default=2, help="torch CPU threads")
    ap.add_argument("--quick", action="store_true", help="small N and few trials (tests, smoke runs)")
    args = ap.parse_args(argv)
    cfg = Config(trials=args.trials, seed=args.seed, threads=args.threads)
    if args.quick:
        cfg = Config(ns=(256, 512, 2048, 4096), margins=(0.03, 0.3), trials=min(args.trials, 12), seed=args.seed)
    t0 = time.monotonic()
    cells, noise = run(cfg, progress=_progress)
    args.out.mkdir(parents=True, exist_ok=True)
    doc = {
        "config": asdict(cfg),
        "seconds": round(time.monotonic() - t0, 1),
        "score_noise_over_spread": {str(c): v for c, v in noise.items()},
        "cells": [{**asdict(c), **{f"rate_{lay}": c.rate(lay) for lay in LAYOUTS}} for c in cells],
    }
    (args.out / "results.json").write_text(json.dumps(doc, indent=1))
    plot(cells, args.out / "recall.png")
    for common in cfg.commons:
        ratios = ", ".join(f"{lay} {noise[common][lay]:.2g}" for lay in LAYOUTS)
        print(f"\nkeys: {common:g} x shared component + N(0, 1); recall of the needle in the top-{cfg.topk}")
        print(f"score error sd / distractor score sd: {ratios}")
        print(table(cells, common))
    print(f"\n{doc['seconds']} s; wrote {args.out / 'results.json'} and {args.out / 'recall.png'}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
