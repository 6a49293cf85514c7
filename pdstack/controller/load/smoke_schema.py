"""The schema of pdstack_smoke: the smoke phase after every deploy (recall grid, bench, agent gates).

The recall grid's cells and their cost on the real host are load/recall_grid.py's; the gate is gates/recall.py.
"""

from __future__ import annotations

from typing import Any

from pdstack.controller.load.schema import Field, Schema

KINDS = ("single", "multikey", "multi")  # recall case kinds (gates/recall.py says what each asks)


def _positive(v: Any) -> str | None:
    return None if v > 0 else f"{v} must be > 0"


def _tokens(v: Any) -> str | None:
    return None if v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0 for x in v) \
        else f"{v!r} must be a list of token counts > 0"


def _depths(v: Any) -> str | None:
    return None if v and all(isinstance(x, int | float) and 0 <= x <= 100 for x in v) \
        else f"{v!r} must be a list of percentages 0-100"


def _kinds(v: Any) -> str | None:
    if isinstance(v, str):
        v = ["single", "multi"] if v == "both" else [v]
    bad = [k for k in v if k not in KINDS]
    return None if v and not bad else (f"{v!r}: give single, multikey, multi (a list of them) or both "
                                       "(= [single, multi])")


GRID_FIELDS = {
    "lengths": Field((list,), "recall context lengths, tokens (a length at the model's context_length is built "
                     "to fit it with its answer)", default=lambda: [1000, 2000, 4000, 8000, 16000, 32000],
                     check=_tokens),
    "depths": Field((list,), "needle depths, % of the document", default=lambda: [0, 25, 50, 75, 100],
                    check=_depths),
    "variant": Field((str, list), "case kinds: single (one needle), multikey (look-alike keys, one asked for), "
                     "multi (--needles needles, each asked); a list of them, or both (= [single, multi])",
                     default="both", check=_kinds),
    "needles": Field((int,), "needles (keys) per prompt in the multi and multikey kinds", default=3,
                     check=_positive),
    "jitter": Field((int,), "each cell's prompt is its length minus 0..jitter tokens (cells cycle the offsets, so "
                    "every residue mod jitter+1 is asked at each length)", default=3,
                    check=lambda v: None if 0 <= v <= 64 else f"{v} must be 0-64 tokens"),
}
SMOKE_GRID = Schema("grid", GRID_FIELDS)
SMOKE_FULL = Schema("full", {k: Field(f.types, f.doc, default=None, check=f.check)
                             for k, f in GRID_FIELDS.items()})

SMOKE_BENCH = Schema("bench", {
    "baseline_tps": Field((int, float), "expected C=1 decode tokens/s (the reference: ~64); unset: report only",
                          default=None, check=_positive),
    "tolerance": Field((int, float), "allowed shortfall below the baseline, a fraction", default=0.2,
                       check=lambda v: None if 0 <= v < 1 else f"{v} must be in [0, 1)"),
    "concurrency": Field((list,), "concurrency levels of the sweep (keep within router admission)",
                         default=lambda: [1, 2, 4],
                         check=lambda v: None if v and all(isinstance(x, int) and not isinstance(x, bool) and x > 0
                                                           for x in v)
                         else f"{v!r} must be a list of concurrency levels > 0, e.g. [1, 2, 4]"),
    "requests": Field((int,), "requests per level", default=3, check=_positive),
    "max_new_tokens": Field((int,), "tokens each bench request decodes", default=128, check=_positive),
})

SMOKE_AGENT = Schema("agent", {
    "tools": Field((bool,), "the tool-call gate: a function-call round trip, streamed and not", default=True),
    "reasoning": Field((bool,), "its reasoning checks; unset: on when the plan renders a reasoning parser",
                       default=None),
    "churn": Field((bool,), "the answers-under-churn gate", default=True),
    "churn_lengths": Field((list,), "needle prompt lengths of the churn gate, tokens",
                           default=lambda: [1000, 4000, 16000], check=_tokens),
    "churn_rounds": Field((int,), "times each fixed prompt is asked under churn", default=2, check=_positive),
})

SMOKE = Schema("pdstack_smoke", {
    "agent": Field((dict,), "the agent gates: tool calls and reasoning, answers under churn", default=dict,
                   schema=SMOKE_AGENT),
    "enabled": Field((bool,), "run the smoke phase after a deploy", default=True),
    "min_horizon": Field((int,), "recall horizon (tokens) under which the deploy fails", default=0),
    "grid": Field((dict,), "the recall grid", default=dict, schema=SMOKE_GRID),
    "full": Field((dict,), "the longer recall grid of `pdstack smoke --full` / `pdstack recall --full` (after an "
                  "upgrade): its keys replace the grid's", default=dict, schema=SMOKE_FULL),
    "prefill_tps": Field((int, float), "uncached prefill tokens/s the recall estimate uses (the plan prints it)",
                         default=8000, check=_positive),
    "recall_budget_s": Field((int, float), "seconds the default grid's estimated recall time must fit (the check "
                             "refuses a grid over it; --full is not held to it)", default=600, check=_positive),
    "concurrency": Field((int,), "recall requests in flight; default: the router's max_concurrent_requests "
                         "(4 when admission is off)", default=None, check=_positive),
    "timeout_s": Field((int, float), "seconds per smoke request", default=300, check=_positive),
    "tokenizer": Field((str,), "directory on the controller with the model's tokenizer.json (the smoke tools "
                       "need one; the sim test engine's is pdstack/testing/sim/tokenizer)", default=None),
    "bench": Field((dict,), "the throughput check", default=dict, schema=SMOKE_BENCH),
})
