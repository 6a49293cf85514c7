"""A JSON copy of an upstream argparse parser, so that checking flags does not import torch every time.

flags.sglang_parser() is SGLang 0.5.23's own launch_server parser, and building it imports torch
(sglang.srt.arg_groups.model_override_base -> sglang.srt.platforms): ~6 s in every `pdstack preflight --static` and
`pdstack plan`, which the preflight role runs in every playbook run (and the test suite runs site.yml dozens of
times). The parser itself is data: its actions, each a class and its attributes (option_strings, dest, nargs, const,
default, type, choices, required, help, metavar and the class's own, e.g. new_flag). So the first process builds the
live parser and writes that data to build/cache/<name>-parser-<key>.json (PDSTACK_CACHE_DIR moves it; a directory
it cannot write just means no cache); later processes rebuild an equal parser from it in milliseconds.

The key: the installed distribution's version and the sha256 of its dist-info RECORD (read with importlib.metadata,
without importing it), where its package is found, the Python version (argparse's internals), FORMAT, the bytes of
this file, of parser_refs.py and of the builder's (flags.py), and the environment variables under the upstream's
prefixes (SGLang reads e.g. SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE while it adds --sampling-backend's choices);
hashed, not stored. The file repeats the key, so a file of another key (or a truncated, corrupt one) is ignored and
written again.

Callables in the parser (a flag's `type`, an action's class) are stored by module and qualified name and come back
as the objects themselves, their source compiled alone, or lazy stand-ins (load/parser_refs.py).

Before a spec is written, the parser rebuilt from it is compared with the live one (every action's class, by name,
and attributes, the option table, the groups, the parser's own settings); a parser that does not come back equal,
or holds a value JSON cannot carry, is not cached: that process, and the next, use the live parser.
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import sys
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pdstack.controller.load import parser_refs
from pdstack.controller.load.parser_refs import Uncacheable

FORMAT = 1  # of the spec file: bump it when what describe() writes changes meaning
CACHE_DIR_ENV = "PDSTACK_CACHE_DIR"
KEEP = 8  # spec files of one parser kept (the newest), so keys that alternate (two SGLANG_ settings) both hit
ROOT = Path(__file__).resolve().parents[3]  # the checkout: build/ lives here

# parser attributes that hold the actions (compared action by action) rather than settings
_STRUCTURE = {"_actions", "_option_string_actions", "_action_groups", "_mutually_exclusive_groups", "_optionals",
              "_positionals", "_registries"}


def cache_dir() -> Path | None:
    """$PDSTACK_CACHE_DIR, else build/cache of the checkout; None outside a checkout (an installed pdstack)."""
    env = os.environ.get(CACHE_DIR_ENV)
    if env:
        return Path(env)
    if (ROOT / "pyproject.toml").is_file() and (ROOT / "pdstack").is_dir():
        return ROOT / "build" / "cache"
    return None


def _sha256(data: bytes | str) -> str:
    return hashlib.sha256(data.encode() if isinstance(data, str) else data).hexdigest()


def dist_fingerprint(dist: str) -> dict[str, Any]:
    """The installed distribution `dist`, without importing it: its version, the sha256 of its RECORD (every file
    it installed, with their hashes) and where its package is found. Raises Uncacheable when there is none."""
    import importlib.metadata  # (40 ms: only when a parser is asked for)
    import importlib.util

    try:
        d = importlib.metadata.distribution(dist)
    except importlib.metadata.PackageNotFoundError:
        raise Uncacheable(f"{dist} is not installed") from None
    record = d.read_text("RECORD")
    spec = importlib.util.find_spec(dist)
    if record is None or spec is None:
        raise Uncacheable(f"{dist} has no RECORD or no package")
    return {"version": d.version, "record_sha256": _sha256(record),
            "package": list(spec.submodule_search_locations or [spec.origin])}


def key(name: str, dist: str, code: Iterable[Path], env_prefixes: tuple[str, ...]) -> dict[str, Any]:
    h = hashlib.sha256()
    for path in [Path(__file__), Path(parser_refs.__file__), *code]:
        h.update(Path(path).read_bytes())
    env = sorted((k, v) for k, v in os.environ.items() if k.startswith(env_prefixes)) if env_prefixes else []
    return {"format": FORMAT, "name": name, "python": sys.version, "dist": dist, **dist_fingerprint(dist),
            "code_sha256": h.hexdigest(), "env_sha256": _sha256(json.dumps(env))}


def cached(name: str, fresh: Callable[[], argparse.ArgumentParser], build: Callable[[], argparse.ArgumentParser],
           *, dist: str, code: Iterable[Path] = (), env_prefixes: tuple[str, ...] = ()) -> argparse.ArgumentParser:
    """The parser `build()` makes (`fresh()` plus the upstream's actions), from the cache when it holds this key's
    spec; else `build()` itself, whose spec is then written for the next process."""
    try:
        k = key(name, dist, code, env_prefixes)
    except (ValueError, OSError):  # Uncacheable, or a `sglang` module without a spec in sys.modules
        return build()  # nothing to key on: build() says what is missing
    where = cache_dir()
    path = where / f"{name}-parser-{_sha256(json.dumps(k, sort_keys=True))[:20]}.json" if where else None
    if path is not None:
        p = load(path, k, fresh)
        if p is not None:
            return p
    live = build()
    if path is not None:
        save(path, k, live, fresh)
    return live


def load(path: Path, k: dict[str, Any], fresh: Callable[[], argparse.ArgumentParser]) -> argparse.ArgumentParser | None:
    """The parser of the spec at `path`, or None when there is none, it is of another key, or it does not read."""
    try:
        spec = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return None
    if not isinstance(spec, dict) or spec.get("key") != k:
        return None
    try:
        return rebuild(spec, fresh)
    except Exception:  # noqa: BLE001 - a damaged file of the right key: build live and write it again
        return None


def save(path: Path, k: dict[str, Any], live: argparse.ArgumentParser,
         fresh: Callable[[], argparse.ArgumentParser]) -> bool:
    """Write `live`'s spec to `path` when the parser rebuilt from it equals `live`; False when it was not."""
    import tempfile

    try:
        text = json.dumps({"key": k, **describe(live)}, separators=(",", ":"))
        if signature(rebuild(json.loads(text), fresh)) != signature(live):
            return False
    except Exception:  # noqa: BLE001 - Uncacheable, or a stand-in that does not resolve: the live parser it is
        return False
    tmp = None
    try:  # atomically: a reader sees the old file or the new one
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=f".{path.name}.", suffix=".tmp")
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)  # mkstemp makes it 0600: the cache is the checkout's, like the rest of build/
        os.replace(tmp, path)
    except OSError:  # not writable (a read-only checkout): no cache, nothing else changes
        if tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
        return False
    # each edit of flags.py (or SGLang upgrade, or SGLANG_* setting) is a new key: keep the newest few files
    with contextlib.suppress(OSError):  # (another process pruning at the same time: next time)
        mine = path.parent.glob(f"{path.name.rsplit('-', 1)[0]}-*.json")
        for old in sorted(mine, key=lambda f: f.stat().st_mtime, reverse=True)[KEEP:]:
            old.unlink()
    return True


# --- describing a parser -----------------------------------------------------------------------------------------

def describe(parser: argparse.ArgumentParser) -> dict[str, Any]:
    """The parser's actions as JSON-able data: {"refs": [...], "actions": [{"class": ref, "attrs": {...}}]}."""
    refs: list[dict[str, Any]] = []
    index: dict[int, int] = {}

    def ref(obj: Any) -> dict[str, Any]:
        if id(obj) not in index:
            index[id(obj)] = len(refs)
            refs.append(parser_refs.ref_of(obj))
        return {"t": "ref", "i": index[id(obj)]}

    def enc(v: Any) -> Any:
        if v is None or type(v) in (bool, int, float, str):
            return v  # json writes inf and nan as Infinity and NaN and reads them back
        if type(v) is list:
            return [enc(x) for x in v]
        if type(v) in (tuple, set, frozenset):
            return {"t": type(v).__name__, "v": [enc(x) for x in v]}
        if type(v) is dict:
            return {"t": "dict", "v": [[enc(a), enc(b)] for a, b in v.items()]}
        if callable(v):
            return ref(v)
        raise Uncacheable(f"{v!r} ({type(v).__name__}) is not a value the spec can carry")

    actions = [{"class": ref(type(a)), "attrs": {n: enc(v) for n, v in vars(a).items() if n != "container"}}
               for a in parser._actions]
    return {"refs": refs, "actions": actions}


# --- rebuilding a parser -----------------------------------------------------------------------------------------

def rebuild(spec: dict[str, Any], fresh: Callable[[], argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """`fresh()` with the spec's actions added as the upstream's add_argument calls left them."""
    refs = [parser_refs.resolve(r) for r in spec["refs"]]

    def dec(v: Any) -> Any:
        if v == argparse.SUPPRESS:
            return argparse.SUPPRESS  # argparse asks `help is SUPPRESS`, `default is not SUPPRESS`: the object itself
        if isinstance(v, list):
            return [dec(x) for x in v]
        if not isinstance(v, dict):
            return v
        t = v["t"]
        if t == "ref":
            return refs[v["i"]]
        if t == "dict":
            return {dec(a): dec(b) for a, b in v["v"]}
        return {"tuple": tuple, "set": set, "frozenset": frozenset}[t](dec(x) for x in v["v"])

    p = fresh()
    for entry in spec["actions"]:
        cls = refs[entry["class"]["i"]]
        a = cls.__new__(cls)  # not __init__: the attributes are what it left (BooleanOptionalAction adds to help)
        a.__dict__.update({n: dec(v) for n, v in entry["attrs"].items()})
        p._add_action(a)  # what add_argument ends with: the option table, the group, conflict checks
    return p


def signature(parser: argparse.ArgumentParser) -> Any:
    """What a parser is, comparable with ==: callables by name (a stand-in equals its original), argparse.SUPPRESS
    by identity, every other value with its type (True is not 1). A set's order is not compared: it is its hashes'
    (PYTHONHASHSEED's), in the live parser as in a rebuilt one."""
    index = {id(a): i for i, a in enumerate(parser._actions)}
    groups = {id(g): i for i, g in enumerate([*parser._action_groups, *parser._mutually_exclusive_groups])}

    def val(v: Any) -> Any:
        if v is argparse.SUPPRESS:
            return ("SUPPRESS",)  # by identity, as argparse tests it
        if type(v) in (list, tuple):
            return type(v).__name__, tuple(val(x) for x in v)
        if type(v) in (set, frozenset):
            return type(v).__name__, frozenset(val(x) for x in v)
        if type(v) is dict:
            return "dict", tuple((val(a), val(b)) for a, b in v.items())
        if callable(v) and hasattr(v, "__qualname__"):
            return "callable", getattr(v, "__module__", None), v.__qualname__
        return type(v).__name__, v

    return {
        "parser": {n: val(v) for n, v in vars(parser).items() if n not in _STRUCTURE},
        "registries": {n: val(dict(r)) for n, r in parser._registries.items()},
        "groups": [(val(getattr(g, "title", None)), val(getattr(g, "description", None)),
                    val(getattr(g, "required", None)), tuple(index[id(a)] for a in g._group_actions))
                   for g in [*parser._action_groups, *parser._mutually_exclusive_groups]],
        "options": sorted((o, index[id(a)]) for o, a in parser._option_string_actions.items()),
        "actions": [(val(type(a)), groups.get(id(getattr(a, "container", None))),
                     sorted((n, val(v)) for n, v in vars(a).items() if n != "container")) for a in parser._actions],
    }
