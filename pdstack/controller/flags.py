"""Check rendered argv against the pinned upstreams' own argument parsers, with abbreviations disabled.

SGLang's parser accepts `--tp` only as an argparse abbreviation of --tp-size; with allow_abbrev=False it is an
unknown flag, which is what we want: a unit must spell every flag exactly (FACTS.md).
"""

from __future__ import annotations

import argparse
import functools


class _Rejected(ValueError):
    pass


class _StrictParser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse would print usage and exit 2
        raise _Rejected(message)


@functools.cache
def sglang_parser() -> argparse.ArgumentParser:
    try:
        from sglang.srt.server_args import ServerArgs
    except ImportError as e:  # pragma: no cover - the venv always has it
        raise RuntimeError("sglang==0.5.23 is needed to check SGLang flags: run ./dev.sh setup "
                           "(it installs it with --no-deps)") from e
    p = _StrictParser(prog="sglang.launch_server", allow_abbrev=False, add_help=False)
    ServerArgs.add_cli_args(p)
    return p


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


def render_extra(args: dict) -> list[str]:
    """{'mem-fraction-static': 0.85, 'enable-foo': True, 'disable-bar': False} -> ['--mem-fraction-static', '0.85',
    '--enable-foo']. false drops a bare flag; a list gives several values."""
    out: list[str] = []
    for key, value in args.items():
        flag = f"--{key}"
        if value is True:
            out.append(flag)
        elif value is False or value is None:
            continue
        elif isinstance(value, list):
            out += [flag, *map(str, value)]
        else:
            out += [flag, str(value)]
    return out
