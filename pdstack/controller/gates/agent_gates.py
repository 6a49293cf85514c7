"""The agent gates of `pdstack smoke` (tool calls + reasoning, answers under churn), wired in with one call.

Each writes its JSON (tools.json, churn.json) into the smoke directory and adds a gate and a summary line with its
time cost. Defaults: pdstack_smoke.agent in the inventory (inventory.py AGENT).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from pdstack.controller.gates import churn, gates_tools

DEFAULTS = {"tools": True, "reasoning": None, "churn": True, "churn_lengths": churn.DEFAULT_LENGTHS,
            "churn_rounds": 2, "model": "default", "admission_limit": -1, "parsers": {}}


def settings_from_deployment(dep) -> dict:
    from pdstack.controller.load import variables

    ag = dep.smoke.get("agent") or {}
    parsers = {k: variables.parser_setting(dep.model, k) for k in ("tool_call_parser", "reasoning_parser")}
    reasoning = ag.get("reasoning")
    return {"tools": ag.get("tools", True),
            "reasoning": parsers["reasoning_parser"] is not None if reasoning is None else reasoning,
            "churn": ag.get("churn", True), "churn_lengths": ag.get("churn_lengths") or churn.DEFAULT_LENGTHS,
            "churn_rounds": ag.get("churn_rounds") or 2, "model": dep.model["served_name"],
            "admission_limit": dep.router["admission"]["max_concurrent_requests"], "parsers": parsers}


def run_agent_gates(url: str, out: Path, cfg: dict, *, tokenizer: str, timeout: float, gates: dict,
                    lines: list[str], headers: dict[str, str] | None = None) -> None:
    cfg = {**DEFAULTS, **{k: v for k, v in cfg.items() if v is not None}}
    if cfg["tools"]:
        print("smoke: tool-call gate ...", file=sys.stderr, flush=True)
        limit = cfg["admission_limit"]  # checks side by side, never more than the front door lets through at once
        tr = gates_tools.run_tool_gate(url, model=cfg["model"], reasoning=cfg["reasoning"] is not False,
                                       timeout=timeout, headers=headers,
                                       concurrency=min(gates_tools.CONCURRENCY, limit) if limit > 0 else
                                       gates_tools.CONCURRENCY)
        msg = tr.message
        off = [k for k, v in cfg["parsers"].items() if k in cfg["parsers"] and v is None]
        if not tr.passed and off and not tr.refused:
            msg += "; the inventory turns " + ", ".join(f"pdstack_model.{k}" for k in off) + " off"
        (out / "tools.json").write_text(json.dumps({**tr.to_dict(), "message": msg}, indent=1) + "\n")
        gates["tools"] = {"passed": tr.passed, "seconds": tr.seconds, "message": msg}
        lines.append(f"tools   {'PASS' if tr.passed else 'FAIL'}  {msg} ({tr.seconds:.1f} s)")
    if cfg["churn"]:
        print("smoke: answers-under-churn gate ...", file=sys.stderr, flush=True)
        cr = churn.run_churn_gate(url, tokenizer=tokenizer, lengths=cfg["churn_lengths"], model=cfg["model"],
                                  admission_limit=cfg["admission_limit"], timeout=timeout,
                                  rounds=cfg["churn_rounds"], headers=headers)
        (out / "churn.json").write_text(json.dumps(cr.to_dict(), indent=1) + "\n")
        gates["churn"] = {"passed": cr.passed, "seconds": cr.seconds, "message": cr.message,
                          "diffs": cr.diffs}
        lines.append(f"churn   {'PASS' if cr.passed else 'FAIL'}  {cr.message} ({cr.seconds:.1f} s)")
