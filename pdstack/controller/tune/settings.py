"""tune.yml: the candidates `invoke tune` tries, the sweep it measures each with, and what "fastest" means.

It lives beside the inventory it tunes (inventory/local -> inventory/local.tune.yml; not inside the directory, where
Ansible would read it as inventory). Read strictly (load/yamlsafe.py: no duplicate keys, aliases or YAML 1.1 traps),
typed by the same schema code as the inventory; every problem is listed with its path before any host changes:

    objective: c1_decode_tps          # or aggregate_tps (then tpot_p99_ms_max bounds it)
    tpot_p99_ms_max: null
    start_timeout_s: 1800             # a candidate's server must answer /health within this, else it failed to start
    sweep:
      concurrency: [1, 4, 16, 64]
      shapes: [{input: 1024, output: 256}, {input: 8192, output: 256}, {input: 32768, output: 256}]
      prompts_per_level: 2            # requests per point: max(min_prompts, prompts_per_level x concurrency)
      min_prompts: 4
      warmup_prompts: 4               # C=1 requests first, not counted (peers read C=1 low right after graph capture)
      warmup_wait_s: 30
    accuracy_max_drop: 0.05           # the accuracy gate: disqualified more than this below the baseline's score
    goodput_tpot_ms: 50               # the report's goodput: requests with TPOT within this
    restart_s: 600                    # the estimate: one restart with the weights load on the real host
    candidates:
      - name: upstream-recipe
        description: SGLang's cookbook cell for this GPU
        source: sgl-project/sglang docs_new/src/snippets/configs/deepseek-ai/deepseek-v4.jsx
        servers:                      # pdstack_tune.servers: prefill | decode | all | a server name
          all: {extra_args: {moe-runner-backend: marlin}, env: {}}
        topology: {gpu01: [...]}      # optional: the host's whole server list (pdstack_servers' schema)
`--skip NAME` (the command line) leaves a candidate out; a name the file lacks is an error.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdstack.controller.load import rules, yamlsafe
from pdstack.controller.load.field_checks import non_negative, positive  # the inventory's own value rules
from pdstack.controller.load.schema import Field, Schema
from pdstack.errors import InventoryError

OBJECTIVES = ("c1_decode_tps", "aggregate_tps")


def _levels(v: list) -> str | None:
    if not v or not all(isinstance(c, int) and not isinstance(c, bool) and c >= 1 for c in v):
        return f"{v!r}: a list of integers >= 1, e.g. [1, 4, 16, 64]"
    return "list each level once" if len(set(v)) != len(v) else None


SHAPE = Schema("shape", {
    "input": Field((int,), "prompt tokens of each request", check=positive),
    "output": Field((int,), "tokens each request decodes (ignore_eos)", check=positive),
})

SWEEP = Schema("sweep", {
    "concurrency": Field((list,), "requests in flight, one point each", default=lambda: [1, 4, 16, 64],
                         check=_levels),
    "shapes": Field((list,), "input/output lengths, one point each", item_schema=SHAPE,
                    default=lambda: [{"input": 1024, "output": 256}, {"input": 8192, "output": 256},
                                     {"input": 32768, "output": 256}]),
    "prompts_per_level": Field((int,), "requests per point: this x the concurrency (at least min_prompts)",
                               default=2, check=positive),
    "min_prompts": Field((int,), "requests per point at least", default=4, check=positive),
    "warmup_prompts": Field((int,), "C=1 requests of the first shape before the sweep, not counted", default=4,
                            check=non_negative),
    "warmup_wait_s": Field((int, float), "seconds to wait after the warm-up (after CUDA-graph capture a peer read "
                           "C=1 low for ~30 s)", default=30, check=non_negative),
})

CANDIDATE = Schema("candidate", {
    "name": Field((str,), "the candidate's name (its results directory)", check=rules.name_problem),
    "description": Field((str,), "what it tries and why", default=""),
    "servers": Field((dict,), "which servers change: prefill, decode, all or a server name -> {extra_args, env} "
                     "({}: none, as with a candidate that changes only index_k_dtype)"),
    "index_k_dtype": Field((str,), "the candidate's index-key layout and reader (pdstack_model.index_k_dtype); unset: "
                           "the inventory's", default=None, choices=("bf16", "fp8-torch", "fp8-tilelang")),
    "topology": Field((dict,), "host -> the server list that replaces its pdstack_servers (a topology candidate: "
                      "server count, GPUs, TP sizes, ports); unset: the inventory's servers", default=None),
    "source": Field((str,), "where the lever comes from (a cookbook page, a peer's benchmark file)", default=""),
})

TUNE_FILE = Schema("tune.yml", {
    "objective": Field((str,), "what the winner maximises", default="c1_decode_tps", choices=OBJECTIVES),
    "tpot_p99_ms_max": Field((int, float), "aggregate_tps: only points whose TPOT p99 is at most this count",
                             default=None, check=positive),
    "start_timeout_s": Field((int,), "seconds a candidate's servers have to answer /health", default=1800,
                             check=positive),
    "sweep": Field((dict,), "the load of every candidate's measurement", default=dict, schema=SWEEP),
    "accuracy_max_drop": Field((int, float), "a candidate whose accuracy-gate score (a fraction of the shipped set) "
                               "falls more than this below the baseline's is disqualified", default=0.05,
                               check=non_negative),
    "goodput_tpot_ms": Field((int, float), "the report's goodput counts requests whose TPOT is within this (ms per "
                             "output token; 50 = 20 tok/s per user)", default=50, check=positive),
    "restart_s": Field((int, float), "the estimate's seconds for one restart with weights load on the real host "
                       "(docs/tune.md)", default=600, check=positive),
    "candidates": Field((list,), "the named overlays to try", item_schema=CANDIDATE),
})


def default_path(inventory: str | Path) -> Path:
    """inventory/local -> inventory/local.tune.yml (beside the directory, not in it)."""
    inv = Path(inventory)
    return inv.parent / f"{inv.name}.tune.yml"


def load(path: str | Path, objective: str | None = None, tpot_p99_ms_max: float | None = None,
         skip: list[str] | None = None) -> dict[str, Any]:
    """tune.yml read strictly, validated, defaults filled; `objective`/`tpot_p99_ms_max` (the command line) win;
    `skip` names candidates left out (each must exist). Raises InventoryError listing every problem."""
    p = Path(path)
    problems: list[str] = []
    if not p.is_file():
        raise InventoryError([f"{p}: no such tune file; write one beside the inventory (see "
                              "inventory/local.tune.yml and docs/tune.md) or pass --tune FILE"])
    node = yamlsafe.read_file(p, str(p), problems)
    if problems:
        raise InventoryError(problems)
    raw = yamlsafe.construct(node)
    cfg = TUNE_FILE.validate(raw, "", problems)
    if objective is not None:
        cfg["objective"] = objective
    if tpot_p99_ms_max is not None:
        cfg["tpot_p99_ms_max"] = tpot_p99_ms_max
    if cfg.get("objective") not in OBJECTIVES:
        problems.append(f"objective: {cfg.get('objective')!r} is not one of {', '.join(OBJECTIVES)}")
    if cfg.get("objective") == "aggregate_tps" and cfg.get("tpot_p99_ms_max") is None:
        problems.append("objective aggregate_tps needs tpot_p99_ms_max (the TPOT p99 bound a point must meet); "
                        "set it in the tune file or pass --tpot-p99-ms-max")
    candidates = cfg.get("candidates") or []
    if isinstance(candidates, list):
        if not candidates:
            problems.append("candidates: empty; list at least one named overlay")
        names = [c.get("name") for c in candidates if isinstance(c, dict)]
        dup = sorted({n for n in names if names.count(n) > 1 and n is not None})
        if dup:
            problems.append(f"candidates: names used twice: {', '.join(map(str, dup))}; each needs its own")
        if "baseline" in names:
            problems.append("candidates: 'baseline' is the name of the plan as the inventory has it (measured "
                            "first); call the candidate something else")
        unknown = [n for n in skip or [] if n not in names]
        if unknown:
            problems.append(f"--skip {', '.join(unknown)}: no such candidate; the file has "
                            f"{', '.join(map(str, names))}")
        cfg["skipped"] = [n for n in skip or [] if n in names]
        cfg["candidates"] = [c for c in candidates if not isinstance(c, dict) or c.get("name") not in cfg["skipped"]]
        if candidates and not cfg["candidates"]:
            problems.append(f"--skip: leaves no candidate to try (skipped {', '.join(cfg['skipped'])})")
    sweep = cfg.get("sweep") or {}
    if 1 not in (sweep.get("concurrency") or [1]):
        problems.append("sweep.concurrency: must include 1 (the C=1 decode figure every report gives)")
    if problems:
        raise InventoryError([f"{p}: {m}" for m in problems])
    return cfg


def points(sweep: dict[str, Any]) -> list[dict[str, int]]:
    """Every point of the sweep: {input, output, concurrency, prompts}, shape by shape, concurrency ascending."""
    return [{"input": s["input"], "output": s["output"], "concurrency": c,
             "prompts": max(sweep["min_prompts"], sweep["prompts_per_level"] * c)}
            for s in sweep["shapes"] for c in sorted(sweep["concurrency"])]
