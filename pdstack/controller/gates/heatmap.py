"""The recall heatmap (recall.png): depth x context length, coloured by the fraction of needles recalled, drawn with
matplotlib from a `pdstack recall` report (gates/recall.py). `pdstack smoke`, `pdstack tune` and `pdstack recall
--heatmap` write it."""

from __future__ import annotations

from pathlib import Path

from pdstack.controller.gates.recall_report import MARK, RecallReport, kilo

# one panel per case kind of the report (gates/recall.py says what each asks)
KIND_TITLES = {"single": "single needle", "multikey": "look-alike keys, one asked", "multi": "multi-needle, each asked"}


def draw(report: RecallReport, path: str | Path) -> Path:
    """Depth (rows, 0 % on top) x context length (columns), coloured by the fraction of needles recalled, as the
    public NIAH harnesses draw it; cells that did not pass carry their letter (X wrong, T, E, R)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.colors import LinearSegmentedColormap

    cmap = LinearSegmentedColormap.from_list("niah", ["#F0496E", "#EBB839", "#0CD79F"])
    nv = len(report.variants)
    fig, axes = plt.subplots(1, nv, figsize=(max(6.0, 1.1 * len(report.lengths) + 2.5) * nv,
                                               0.42 * len(report.depths) + 2.2), squeeze=False)
    for ax, v in zip(axes[0], report.variants, strict=True):
        grid = [[0.0] * len(report.lengths) for _ in report.depths]
        for i, d in enumerate(report.depths):
            for j, n in enumerate(report.lengths):
                c = next((c for c in report.cells if c.variant == v and c.length == n and c.depth == d), None)
                grid[i][j] = c.score if c else float("nan")
                if c and c.status != "pass":
                    ax.text(j, i, MARK[c.status], ha="center", va="center", color="black", fontsize=9)
        im = ax.imshow(grid, cmap=cmap, vmin=0, vmax=1, aspect="auto")
        ax.set_xticks(range(len(report.lengths)), [kilo(n) for n in report.lengths])
        ax.set_yticks(range(len(report.depths)), [f"{d:g}%" for d in report.depths])
        ax.set_xlabel("context length (tokens)")
        ax.set_ylabel("needle depth (% of the document)")
        h = report.horizon(v)
        ax.set_title(f"{KIND_TITLES.get(v, v)}: horizon {kilo(h) if h else 0} tokens")
        if h and h < max(report.lengths):
            x = report.lengths.index(h) + 0.5
            ax.axvline(x, color="black", linestyle="--", linewidth=1.2)
        fig.colorbar(im, ax=ax, label="fraction recalled")
    fig.suptitle(f"pdstack recall {report.url}  (min horizon {report.min_horizon}: "
                 f"{'PASS' if report.passed else 'FAIL'})", fontsize=10)
    fig.tight_layout()
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(p, dpi=110)
    plt.close(fig)
    return p
