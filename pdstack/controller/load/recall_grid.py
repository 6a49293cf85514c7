"""The recall grid's cells and their cost on the real host: one source for the gate (gates/recall.py builds these
cells), the plan (`pdstack plan` prints the estimate before anything runs) and the checks (the default grid must fit
pdstack_smoke.recall_budget_s).

A cell is (kind, length, depth). Its prompt has `length` tokens less its jitter offset: cells cycle the offsets
0..jitter in grid order (kinds, then lengths, then depths), so each length asks several residues of the prompt length
and a fault that only one residue shows (vLLM issue 55927: prompt length = 3 mod 4) is caught. A length at or past
the model's context_length is built to fit it with the answer (context_length - ANSWER_ROOM tokens).

The estimate is linear: every prompt's tokens at the uncached prefill rate (pdstack_smoke.prefill_tps; each prompt
has a fresh prefix, so nothing is cached), plus each request's answer at the C=1 decode rate over the recall
concurrency. Attention grows faster than linearly past ~32K tokens, so the longest cells may take longer than this.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pdstack.controller.load.smoke_schema import KINDS

ANSWER_ROOM = 64  # tokens kept free under context_length: the answer (32) and the BOS, with room to spare
ANSWER_TOKENS = 32  # the recall gate's max_new_tokens
DEFAULT_DECODE_TPS = 64.0  # C=1 decode tokens/s when the inventory gives no bench baseline (the reference's)
# recall requests in flight when the router's admission control is off (max_concurrent_requests -1)
CONCURRENCY_WITHOUT_ADMISSION = 4


def concurrency(smoke: dict[str, Any], admission: dict[str, Any]) -> int:
    """Recall requests in flight: pdstack_smoke.concurrency, else the router's admission limit."""
    limit = admission["max_concurrent_requests"]
    return smoke["concurrency"] or (limit if limit > 0 else CONCURRENCY_WITHOUT_ADMISSION)


def kinds(variant: str | list[str]) -> list[str]:
    """pdstack_smoke.grid.variant as a list of case kinds, in KINDS order."""
    given = [variant] if isinstance(variant, str) else list(variant)
    given += ["single", "multi"] if "both" in given else []
    return [k for k in KINDS if k in given]


@dataclass(frozen=True)
class CellSpec:
    kind: str
    length: int  # the grid's length (the horizon is counted in these)
    depth: float
    tokens: int  # the prompt's token count: length (capped by the context) less the jitter offset
    requests: int  # multi asks each of its needles in its own request; single and multikey ask one


def cells(grid: dict[str, Any], context_length: int | None = None, seed: int = 0) -> list[CellSpec]:
    jitter, needles = int(grid.get("jitter", 0)), int(grid["needles"])
    cap = context_length - ANSWER_ROOM if context_length else None
    out = []
    for kind in kinds(grid["variant"]):
        for length in sorted(grid["lengths"]):
            for depth in grid["depths"]:
                top = min(length, cap) if cap else length
                tokens = max(1, top - (len(out) + seed) % (jitter + 1))
                out.append(CellSpec(kind, length, depth, tokens, needles if kind == "multi" else 1))
    return out


def full_grid(grid: dict[str, Any], full: dict[str, Any] | None) -> dict[str, Any]:
    """The --full grid: pdstack_smoke.full's keys over the default grid's."""
    return {**grid, **{k: v for k, v in (full or {}).items() if v is not None}}


def estimate(grid: dict[str, Any], *, prefill_tps: float, decode_tps: float | None, concurrency: int,
             context_length: int | None = None) -> dict[str, Any]:
    """{cells, requests, prompt_tokens, estimate_s} of one run of `grid` on the real host (the model above)."""
    cs = cells(grid, context_length)
    requests = sum(c.requests for c in cs)
    tokens = sum(c.tokens * c.requests for c in cs)
    decode = requests * ANSWER_TOKENS / (decode_tps or DEFAULT_DECODE_TPS) / max(1, concurrency)
    return {"cells": len(cs), "requests": requests, "prompt_tokens": tokens,
            "estimate_s": round(tokens / prefill_tps + decode)}


def smoke_estimates(smoke: dict[str, Any], context_length: int, concurrency: int) -> dict[str, Any]:
    """The default and the --full grid of a filled pdstack_smoke, each with its estimate (the plan's `recall`)."""
    kw = {"prefill_tps": smoke["prefill_tps"], "decode_tps": smoke["bench"]["baseline_tps"],
          "concurrency": concurrency, "context_length": context_length}
    grid, full = smoke["grid"], full_grid(smoke["grid"], smoke.get("full"))
    return {"min_horizon": smoke["min_horizon"], "prefill_tps": smoke["prefill_tps"],
            "budget_s": smoke["recall_budget_s"],
            "grid": {**_shown(grid), **estimate(grid, **kw)}, "full": {**_shown(full), **estimate(full, **kw)}}


def _shown(grid: dict[str, Any]) -> dict[str, Any]:
    return {"lengths": sorted(grid["lengths"]), "depths": list(grid["depths"]), "kinds": kinds(grid["variant"]),
            "needles": grid["needles"], "jitter": grid.get("jitter", 0)}
