"""Value checks the schemas share (variables.py, tune_overlay.py, tune/settings.py): numbers in range, and an
extra_args mapping read against the pinned upstreams' own parsers. Each returns the problem's message, or None."""

from __future__ import annotations

from typing import Any

from pdstack.controller.load import rules
from pdstack.controller.load.schema import as_number


def positive(v: Any) -> str | None:
    return None if v > 0 else f"{v} must be > 0"


def non_negative(v: Any) -> str | None:
    return None if v >= 0 else f"{v} must be >= 0; set 0 or more"


def extra_args(which: str):
    """The check of an extra_args mapping for SGLang's ("sglang") or the router's ("router") parser: flag names
    without dashes; values that follow a flag do not look like flags; a flag whose parser type is int or float gets
    a number, not a quoted one (every range check then sees the number the parser gets)."""
    def check(v: dict) -> str | None:
        from pdstack.controller.load import flags

        bad = [k for k in v if not isinstance(k, str) or k.startswith("-") or not k]
        if bad:
            return (f"keys {bad!r} must be flag names without the leading dashes, e.g. "
                    "'mem-fraction-static: 0.85' for --mem-fraction-static 0.85")
        parser = flags.sglang_parser() if which == "sglang" else flags.router_parser()
        out = []
        for key, value in v.items():
            for item in value if isinstance(value, list) else [value]:
                msg = rules.flag_like_problem(item) or number_for_flag(flags.action_for(parser, f"--{key}"), item)
                if msg:
                    out.append(f"{key}: {msg}")
        return "; ".join(out) or None
    return check


def number_for_flag(action: Any, item: Any) -> str | None:
    kind = getattr(action, "type", None)
    if kind not in (int, float) or isinstance(item, dict | list) or item is None:
        return None
    if isinstance(item, bool):
        return None  # a bare flag (true) or none (false): the flag's own parser judges it
    if isinstance(item, str):
        if as_number(item.strip()) is not None:
            return f"{item!r} is a quoted number; write it without quotes ({item.strip()}) so every check sees it"
        try:
            float(item)
        except ValueError:
            return None  # not a number at all: the flag's own parser refuses it, in its words
        return f"{item!r} is not a finite number; write a number"
    if kind is int and isinstance(item, float):
        return f"{item!r} is not a whole number; the flag takes an integer"
    return None
