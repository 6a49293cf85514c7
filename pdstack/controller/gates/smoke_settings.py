"""The settings of the smoke tools (`pdstack smoke`, `recall`, `bench`), read from `pdstack_smoke`.

One source of defaults: the inventory schema (variables.SMOKE). `DEFAULTS` are the settings of an inventory that sets
no `pdstack_smoke` at all; the three CLIs take their argparse defaults from it, and `pdstack smoke -i` from the
inventory (`--vars`: from the variables Ansible resolved, extra vars included), which `pdstack smoke` loads once.

No built-in tokenizer: prompts are built to exact token counts with the model's own, so the tools ask for one
(`--tokenizer`, `pdstack_smoke.tokenizer`, or with -i the model phase's copy of the lock's tokenizer files).
Controller code does not reach into the test engine (pdstack/testing/): the inventories that deploy the sim
(inventory/local, inventory/test) and the tests name its tokenizer directory.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path
from typing import Any

from pdstack.controller.load import inventory, recall_grid, variables
from pdstack.controller.load.smoke_schema import SMOKE
from pdstack.errors import InventoryError

NO_TOKENIZER = ("no tokenizer: give --tokenizer DIR (pdstack_smoke.tokenizer with -i), the model's tokenizer "
                "directory on the controller; prompts are built to exact token counts with it (for the sim test "
                "engine: pdstack/testing/sim/tokenizer)")
ROOT = Path(__file__).resolve().parents[3]  # the checkout: build/ lives here


def settings(smoke: dict[str, Any], admission: dict[str, Any]) -> dict[str, Any]:
    """A defaults-filled pdstack_smoke (and the router's admission) as flat settings of the smoke tools."""
    grid, bench = smoke["grid"], smoke["bench"]
    return {"lengths": list(grid["lengths"]), "depths": list(grid["depths"]),
            "tokenizer": smoke["tokenizer"], "variant": recall_grid.kinds(grid["variant"]),
            "needles": grid["needles"], "jitter": grid["jitter"], "context_length": None,
            "prefill_tps": smoke["prefill_tps"], "recall_budget_s": smoke["recall_budget_s"],
            "full": {k: v for k, v in (smoke.get("full") or {}).items() if v is not None},
            "concurrency": recall_grid.concurrency(smoke, admission),
            "min_horizon": smoke["min_horizon"], "timeout": float(smoke["timeout_s"]),
            "baseline": bench["baseline_tps"], "tolerance": bench["tolerance"],
            "bench_concurrency": list(bench["concurrency"]), "bench_requests": bench["requests"],
            "bench_tokens": bench["max_new_tokens"]}


def _schema_defaults(schema) -> dict[str, Any]:
    problems: list[str] = []
    out = schema.validate({}, schema.name, problems)
    if problems:  # a schema field without a default: a programming error, not a user's
        raise InventoryError(problems)
    return out


DEFAULTS = settings(_schema_defaults(SMOKE), _schema_defaults(variables.ADMISSION))


def model_tokenizer_dir(dep: inventory.Deployment) -> Path:
    """Where the model phase keeps the controller's copy of the lock's tokenizer files (roles/model,
    tasks_from: tokenizer): build/state/<inventory>/tokenizer, the preflight role's state directory."""
    return ROOT / "build" / "state" / Path(dep.source).name / "tokenizer"


def from_deployment(dep: inventory.Deployment) -> dict[str, Any]:
    """The settings of a loaded inventory (inventory.load: its files, or the preflight role's resolved variables).
    Without pdstack_smoke.tokenizer, an inventory whose model phase fetches a lock uses that phase's tokenizer copy."""
    out = settings(dep.smoke, dep.router["admission"])
    out["context_length"] = dep.model["context_length"]
    if not out["tokenizer"] and dep.model_lock is not None:
        out["tokenizer"] = str(model_tokenizer_dir(dep))
    return out



def list_type(convert: Callable[[str], Any], valid: Callable[[Any], bool], what: str) -> Callable[[str], list]:
    """An argparse type for a list given as `1,2,4` or `1 2 4`: items converted, sorted, no repeats, all valid."""
    def parse(text: str) -> list:
        try:
            out = sorted({convert(part) for part in text.replace(",", " ").split()})
        except ValueError:
            out = []
        if not out or not all(valid(v) for v in out):
            raise argparse.ArgumentTypeError(f"{text!r}: {what}")
        return out
    return parse
