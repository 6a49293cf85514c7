"""Check rendered argv against the pinned upstreams' own argument parsers, with abbreviations disabled.

SGLang's parser accepts `--tp` only as an argparse abbreviation of --tp-size; with allow_abbrev=False it is an
unknown flag, which is what we want: a unit must spell every flag exactly (docs/facts.md, SGLang 0.5.23).

Building SGLang's parser imports torch (~6 s), so it is built once per SGLang install and checkout and kept as data
in build/cache (parser_cache.py); later processes get an equal parser from there without importing SGLang.
"""

from __future__ import annotations

import argparse
import functools
import json
from pathlib import Path

from pdstack.controller.load import parser_cache


class _Rejected(ValueError):
    pass


Rejected = _Rejected  # what a strict parser raises instead of exiting


class _StrictParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2
        raise _Rejected(message)


def _bare_sglang_parser() -> argparse.ArgumentParser:
    return _StrictParser(prog="sglang.launch_server", allow_abbrev=False, add_help=False)


def live_sglang_parser() -> argparse.ArgumentParser:
    """SGLang's own add_cli_args on a strict parser: what the cache holds (imports SGLang's server_args, and torch)."""
    from pdstack.upstream import sglang_module

    try:
        ServerArgs = sglang_module("sglang.srt.server_args").ServerArgs
    except ImportError as e:  # pragma: no cover - the venv always has it
        raise RuntimeError("sglang==0.5.23 is needed to check SGLang flags: run ./dev.sh setup "
                           "(it installs it with --no-deps)") from e
    p = _bare_sglang_parser()
    ServerArgs.add_cli_args(p)
    return p


@functools.cache
def sglang_parser() -> argparse.ArgumentParser:
    """SGLang 0.5.23's launch_server parser, from build/cache when it holds this install's (parser_cache.py)."""
    return parser_cache.cached("sglang", _bare_sglang_parser, live_sglang_parser, dist="sglang",
                               code=[Path(__file__)], env_prefixes=("SGLANG_", "SGL_"))


@functools.cache
def router_parser() -> argparse.ArgumentParser:
    from sglang_router.router_args import RouterArgs

    p = _StrictParser(prog="sglang_router.launch_router", allow_abbrev=False, add_help=False)
    RouterArgs.add_cli_args(p, use_router_prefix=False)
    return p


def _check(parser: argparse.ArgumentParser, flags: list[str]) -> str | None:
    try:
        parser.parse_args(flags)
    except _Rejected as e:
        return str(e)
    return None


def check_sglang(flags: list[str]) -> str | None:
    """None when SGLang 0.5.23's parser accepts `flags` exactly; else its error message."""
    return _check(sglang_parser(), flags)


def check_router(flags: list[str]) -> str | None:
    """None when sglang-router 0.3.2's parser accepts `flags` exactly; else its error message."""
    return _check(router_parser(), flags)


def sglang_options() -> set[str]:
    return {o for a in sglang_parser()._actions for o in a.option_strings}


def action_for(parser: argparse.ArgumentParser, option: str) -> argparse.Action | None:
    """The parser's action for `option` (exactly as spelled: no abbreviations), or None."""
    return parser._option_string_actions.get(option)


def sglang_choices(option: str) -> tuple[str, ...]:
    """The choices SGLang 0.5.23's own parser allows for `option` (e.g. --tool-call-parser)."""
    a = action_for(sglang_parser(), option)
    if a is None:
        raise KeyError(option)
    return tuple(a.choices or ())


def dests_set(parser: argparse.ArgumentParser, argv: list[str]) -> dict[str, str]:
    """{dest: option} for every option that appears in `argv`: what an argv sets, by meaning, not by spelling
    (--model and --model-path both set model_path)."""
    out: dict[str, str] = {}
    for word in argv:
        if word.startswith("--"):
            a = action_for(parser, word.split("=", 1)[0])
            if a is not None:
                out.setdefault(a.dest, word.split("=", 1)[0])
    return out


_JSON_TYPES = {"loads", "json_list_type", "parse_cuda_graph_config_arg"}


def takes_json(action: argparse.Action) -> bool:
    """True when the flag's value is JSON (its type parses JSON, or its help says it is a JSON dictionary)."""
    if getattr(action.type, "__name__", "") in _JSON_TYPES:
        return True
    h = (action.help or "").lower()
    return "json string" in h or "json format" in h or "inline json" in h or "as json" in h or h.startswith("json")


def takes_many(action: argparse.Action) -> bool:
    return action.nargs in ("*", "+") or isinstance(action.nargs, int) and action.nargs > 1


class Unrenderable(ValueError):
    """An extra_args value the argv cannot carry as meant (render/encoders.py's argv encoder, kept here because the
    load stage renders extra_args). `key`: the extra_args key."""

    def __init__(self, key: str, message: str):
        self.key = key
        super().__init__(f"extra_args.{key}: {message}")


def _number(word: str) -> bool:
    try:
        float(word)
    except ValueError:
        return False
    return True


def argv_word(key: str, value, item: int | None = None) -> str:
    """One argv word of extra_args.KEY: no NUL (execve ends a word there); a list item of a multi-value flag must not
    start with '-' (argparse ends the list there and reads the rest as flags: `[x-request-id, --decode, URL]` adds a
    decode worker), nor may a single value that is not a number."""
    if isinstance(value, dict | list):
        try:
            w = json.dumps(value, separators=(",", ":"), ensure_ascii=True, allow_nan=False)
        except ValueError as e:
            raise Unrenderable(key, f"{value!r} is not JSON ({e})") from None
    elif isinstance(value, float) and value != value or value in (float("inf"), float("-inf")):
        raise Unrenderable(key, f"{value!r} is not a number a flag can take")
    else:
        w = str(value)
    at = f"list item {item} ({w!r})" if item is not None else f"value {w!r}"
    if "\x00" in w:
        raise Unrenderable(key, f"{at} holds a NUL byte, which no argv word can carry")
    if w.startswith("-") and (item is not None or not _number(w)):
        raise Unrenderable(key, f"{at} starts with '-': SGLang's and the router's parsers would read it as a flag "
                           "(argparse's last-wins then overrides the plan); write each flag as its own extra_args key")
    return w


def render_value(value, action: argparse.Action | None = None, key: str | None = None) -> list[str]:
    """The words one extra_args value becomes after its flag. Raises Unrenderable for a word the argv cannot carry
    as a value (see argv_word); `key` (default: the action's flag) names it."""
    if key is None:
        key = next((o[2:] for o in (action.option_strings if action else ()) if o.startswith("--")), "?")
    if isinstance(value, dict) or isinstance(value, list) and action is not None and takes_json(action):
        return [argv_word(key, value)]
    if isinstance(value, list):
        return [argv_word(key, v, i) for i, v in enumerate(value)]
    return [argv_word(key, value)]


def render_extra(args: dict, parser: argparse.ArgumentParser | None = None) -> list[str]:
    """{'mem-fraction-static': 0.85, 'enable-foo': True, 'disable-bar': False} -> ['--mem-fraction-static', '0.85',
    '--enable-foo']. false drops a bare flag; a list gives several values; a mapping (or a list, for a flag that
    takes JSON) is written as compact JSON. Raises Unrenderable (naming the key) for a value that would read as a
    flag."""
    out: list[str] = []
    for key, value in args.items():
        flag = f"--{key}"
        if value is True:
            out.append(flag)
            continue
        action = action_for(parser, flag) if parser is not None else None
        if value is False and action is not None and f"--no-{key}" in action.option_strings:
            out.append(f"--no-{key}")  # a default-on switch turned off
        elif value is False or value is None:
            continue
        else:
            out += [flag, *render_value(value, action, key)]
    return out
