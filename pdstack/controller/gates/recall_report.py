"""A `pdstack recall` run's report: each cell's graded answers, the horizon, the table and JSON it prints, and
the marks both the table and the heatmap (gates/heatmap.py) draw a cell with. gates/recall.py runs the cells."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from pdstack.controller.gates import apikey

STATUSES = ("pass", "wrong", "timeout", "http", "refused")
MARK = {"pass": ".", "wrong": "X", "timeout": "T", "http": "E", "refused": "R"}


@dataclass
class Outcome:
    key: str
    depth: float
    status: str
    answer: str = ""
    latency_s: float = 0.0
    http_status: int | None = None
    detail: str = ""


@dataclass
class Cell:
    variant: str
    length: int
    depth: float
    prompt_tokens: int
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def status(self) -> str:
        """pass when every needle passed; else the worst outcome (refused < http < timeout < wrong)."""
        got = {o.status for o in self.outcomes}
        for s in ("wrong", "timeout", "http", "refused"):
            if s in got:
                return s
        return "pass" if got else "http"

    @property
    def score(self) -> float:
        return sum(o.status == "pass" for o in self.outcomes) / max(1, len(self.outcomes))


@dataclass
class RecallReport:
    url: str
    tokenizer: str
    lengths: list[int]
    depths: list[float]
    variants: list[str]
    needles: int
    cells: list[Cell]
    min_horizon: int
    elapsed_s: float = 0.0
    build_s: float = 0.0  # the controller's own cost: tokenizer load, prompt building and counting

    def horizon(self, variant: str | None = None) -> int:
        """Longest length L such that every cell at every length <= L passes (all variants unless one is named)."""
        best = 0
        for length in sorted(self.lengths):
            cells = [c for c in self.cells if c.length == length and (variant is None or c.variant == variant)]
            if not cells or any(c.status != "pass" for c in cells):
                break
            best = length
        return best

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for c in self.cells:
            for o in c.outcomes:
                out[o.status] += 1
        return out

    @property
    def auth_refused(self) -> str | None:
        """The front door's API-key refusal (apikey.refused), when it answered any request with 401/403."""
        return next((o.detail for c in self.cells for o in c.outcomes
                     if o.http_status in apikey.REFUSED_STATUSES), None)

    @property
    def passed(self) -> bool:
        return self.horizon() >= self.min_horizon

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "tokenizer": self.tokenizer, "lengths": self.lengths, "depths": self.depths,
            "variants": self.variants, "needles": self.needles, "min_horizon": self.min_horizon,
            "horizon": self.horizon(), "horizon_by_variant": {v: self.horizon(v) for v in self.variants},
            "passed": self.passed, "counts": self.counts(), "elapsed_s": round(self.elapsed_s, 3),
            "build_s": round(self.build_s, 3),
            "cells": [{**{k: v for k, v in asdict(c).items() if k != "outcomes"}, "status": c.status,
                       "score": c.score, "outcomes": [asdict(o) for o in c.outcomes]} for c in self.cells],
        }

    def table(self) -> str:
        """Depth rows x length columns per variant; '.' pass, X wrong, T timeout, E HTTP error, R refused."""
        out = []
        for v in self.variants:
            out.append(f"{v} recall (rows: depth %, columns: context tokens; . pass  X wrong  T timeout  "
                       "E HTTP error  R refused)")
            out.append("depth " + "".join(f"{kilo(n):>7}" for n in self.lengths))
            for d in self.depths:
                row = []
                for n in self.lengths:
                    c = next((c for c in self.cells if c.variant == v and c.length == n and c.depth == d), None)
                    row.append(MARK[c.status] if c else "-")
                out.append(f"{d:>4g}% " + "".join(f"{m:>7}" for m in row))
            out.append(f"horizon ({v}): {self.horizon(v)} tokens")
            out.append("")
        counts = self.counts()
        out.append("answers: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES))
        verdict = "PASS" if self.passed else "FAIL"
        out.append(f"recall horizon {self.horizon()} tokens (min {self.min_horizon}): {verdict}")
        if self.auth_refused:
            out.append(self.auth_refused)
        return "\n".join(out)


def kilo(n: int) -> str:
    """A token count as the grid prints it: 4000 -> 4K, 1500 -> 1.5K, 1050 and 999 as they are."""
    return f"{n / 1000:g}K" if n >= 1000 and n % 100 == 0 else str(n)
