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
this file and of the builder's (flags.py), and the environment variables under the upstream's prefixes (SGLang reads
e.g. SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE while it adds --sampling-backend's choices); hashed, not stored. The file
repeats the key, so a file of another key (or a truncated, corrupt one) is ignored and written again.

Callables in the parser (a flag's `type`, an action's class) are stored by module and qualified name and come back:
- stdlib or builtins (str, int, json.loads, argparse's own actions): the object itself;
- from an upstream module whose own top-level imports (and its packages') are all standard library (SGLang's
  arg_groups/argparse_actions.py: the deprecated-flag and LoRA actions): imported, the real class;
- a plain top-level function that needs only stdlib globals (sglang.srt.utils.common's human_readable_int, the type
  of --context-length, which every plan's argv carries, and nullable_str: common.py imports torch;
  parse_cuda_graph_backend_arg): its source, compiled alone with its imports; kept only when its bytecode equals the
  live function's;
- anything else (json_list_type needs orjson; the --cuda-graph-config parser reads its module's tables): a lazy
  stand-in with the real __name__, __qualname__ and __module__ (what error messages and flags.takes_json read) that
  imports the real one when a flag of that type is parsed; an action class becomes the real class when first called.

Before a spec is written, the parser rebuilt from it is compared with the live one (every action's class, by name,
and attributes, the option table, the groups, the parser's own settings); a parser that does not come back equal,
or holds a value JSON cannot carry, is not cached: that process, and the next, use the live parser.
"""

from __future__ import annotations

import argparse
import builtins
import contextlib
import hashlib
import importlib
import importlib.util
import json
import os
import sys
import types
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from pdstack.controller.load import cache_trust

FORMAT = 1  # of the spec file: bump it when what describe() writes changes meaning
CACHE_DIR_ENV = "PDSTACK_CACHE_DIR"
KEEP = 8  # spec files of one parser kept (the newest), so keys that alternate (two SGLANG_ settings) both hit
ROOT = Path(__file__).resolve().parents[3]  # the checkout: build/ lives here

# parser attributes that hold the actions (compared action by action) rather than settings
_STRUCTURE = {"_actions", "_option_string_actions", "_action_groups", "_mutually_exclusive_groups", "_optionals",
              "_positionals", "_registries"}


class Uncacheable(ValueError):
    """The parser holds something the spec cannot carry exactly."""


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
    for path in [Path(__file__), *code]:
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
            refs.append(_ref(obj))
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


def _lookup(obj: Any, qualname: str) -> Any:
    for part in qualname.split("."):
        obj = getattr(obj, part)
    return obj


def _import(module: str) -> types.ModuleType:
    """importlib.import_module, but an SGLang module skips sglang/__init__.py (pdstack/upstream.py)."""
    if module.startswith("sglang."):
        from pdstack.upstream import sglang_module

        return sglang_module(module)
    return importlib.import_module(module)


def _ref(obj: Any) -> dict[str, Any]:
    module, qualname = getattr(obj, "__module__", None), getattr(obj, "__qualname__", None)
    if not isinstance(module, str) or not isinstance(qualname, str) or "<" in qualname:
        raise Uncacheable(f"{obj!r} has no importable name")
    try:
        found = _lookup(sys.modules[module], qualname)
    except (KeyError, AttributeError):
        found = None
    if found is not obj:
        raise Uncacheable(f"{module}.{qualname} is not {obj!r}")
    out: dict[str, Any] = {"module": module, "qualname": qualname,
                           "kind": "action" if isinstance(obj, type) and issubclass(obj, argparse.Action)
                           else "callable"}
    if cache_trust.stdlib(module) or _light(module):
        return {**out, "how": "import"}
    if isinstance(obj, types.FunctionType) and (source := _function_source(obj)) is not None:
        return {**out, "how": "source", **source}
    return {**out, "how": "lazy"}


def _stdlib_imports_only(path: str) -> bool:
    """True when the module at `path` imports only standard-library modules when it is imported (imports inside
    functions run later, when called)."""
    import ast

    try:
        tree = ast.parse(Path(path).read_text())
    except (OSError, SyntaxError, UnicodeDecodeError):
        return False
    todo = list(tree.body)
    while todo:
        node = todo.pop()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda):
            continue
        if isinstance(node, ast.Import) and not all(cache_trust.stdlib(a.name) for a in node.names):
            return False
        if isinstance(node, ast.ImportFrom) and (node.level or not cache_trust.stdlib(node.module or "")):
            return False
        todo.extend(ast.iter_child_nodes(node))
    return True


def _light(module: str) -> bool:
    """An upstream module that imports nothing but the standard library, nor do the packages above it that
    _import runs (SGLang's top-level __init__ is skipped; a namespace package has no file and runs nothing)."""
    parts = module.split(".")
    for i in range(2 if parts[0] == "sglang" else 1, len(parts) + 1):
        m = sys.modules.get(".".join(parts[:i]))
        f = getattr(m, "__file__", None)
        if m is None or f is not None and not (f.endswith(".py") and _stdlib_imports_only(f)):
            return False
    return True


def _code_names(code: types.CodeType) -> set[str]:
    names = set(code.co_names)
    for c in code.co_consts:
        if isinstance(c, types.CodeType):
            names |= _code_names(c)
    return names


def _function_source(func: types.FunctionType) -> dict[str, Any] | None:
    """How to compile `func` alone: its source and the stdlib imports of the globals it reads; None unless the
    result has func's exact bytecode, defaults and globals."""
    import ast

    if func.__closure__ or func.__dict__ or func.__qualname__ != func.__name__:
        return None
    filename = func.__code__.co_filename
    try:
        text = Path(filename).read_text()
        tree = ast.parse(text)
    except (OSError, SyntaxError, UnicodeDecodeError):
        return None
    defs = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == func.__name__]
    if not defs or defs[-1].decorator_list or defs[-1].end_lineno is None:
        return None
    node = defs[-1]
    imports = []
    for name in sorted(_code_names(func.__code__) & set(func.__globals__)):
        v = func.__globals__[name]
        if isinstance(v, types.ModuleType) and cache_trust.stdlib(v.__name__) and "." not in v.__name__:
            imports.append(f"import {v.__name__}" + (f" as {name}" if name != v.__name__ else ""))
        elif (isinstance(getattr(v, "__module__", None), str) and cache_trust.stdlib(v.__module__)
              and getattr(v, "__qualname__", None) and "." not in v.__qualname__
              and getattr(sys.modules.get(v.__module__), v.__qualname__, None) is v):
            imports.append(f"from {v.__module__} import {v.__qualname__}"
                           + (f" as {name}" if name != v.__qualname__ else ""))
        else:
            return None  # a global that is not a stdlib import: the module's own (or a third party's)
    if len(imports) >= node.lineno:
        return None
    spec = {"imports": imports, "lineno": node.lineno, "filename": filename,
            "source": "".join(text.splitlines(keepends=True)[node.lineno - 1:node.end_lineno]),
            "flags": func.__code__.co_flags & cache_trust.future_flags()}
    try:
        f = _compile(spec, func.__module__, func.__name__)
    except Exception:  # noqa: BLE001 - whatever fails here, the lazy stand-in is the answer
        return None
    same = (f.__code__ == func.__code__ and f.__defaults__ == func.__defaults__
            and f.__kwdefaults__ == func.__kwdefaults__ and f.__annotations__ == func.__annotations__
            and f.__doc__ == func.__doc__
            and all(f.__globals__.get(n) is func.__globals__[n] for n in _code_names(func.__code__)
                    if n in func.__globals__))
    return spec if same else None


def _compile(spec: dict[str, Any], module: str, name: str) -> types.FunctionType:
    # the imports first (a name bound by an import compiles to the same bytecode as in the module), then the def
    # at its own line, so tracebacks name the real file and line
    imports = "".join(f"{i}\n" for i in spec["imports"])
    text = imports + "\n" * (spec["lineno"] - 1 - len(spec["imports"])) + spec["source"]
    ns: dict[str, Any] = {"__name__": module, "__builtins__": builtins}
    exec(compile(text, spec["filename"], "exec", flags=spec["flags"], dont_inherit=True), ns)
    return ns[name]


# --- rebuilding ------------------------------------------------------------------------------------------------

class _Lazy:
    """A callable standing in for MODULE.QUALNAME (a flag's type): the same names; imports the real one when
    called."""

    def __init__(self, module: str, qualname: str):
        self.__module__, self.__qualname__, self.__name__ = module, qualname, qualname.rsplit(".", 1)[-1]
        self._real: Any = None

    def __call__(self, *args, **kwargs):
        if self._real is None:
            self._real = _lookup(_import(self.__module__), self.__qualname__)
        return self._real(*args, **kwargs)

    def __repr__(self) -> str:
        return f"<{self.__module__}.{self.__qualname__}, imported when called>"


def _lazy_action(module: str, qualname: str) -> type[argparse.Action]:
    """An action class standing in for MODULE.QUALNAME: the same names; an instance becomes the real class the
    first time it is called (its attributes are the real action's already)."""

    def real(self: argparse.Action) -> argparse.Action:
        self.__class__ = _lookup(_import(module), qualname)
        return self

    def __call__(self, parser, namespace, values, option_string=None):
        return real(self)(parser, namespace, values, option_string)

    def format_usage(self):
        return real(self).format_usage()

    cls = type(qualname.rsplit(".", 1)[-1], (argparse.Action,), {"__call__": __call__, "format_usage": format_usage,
                                                                    "__module__": module})
    cls.__qualname__ = qualname
    return cls


_RESOLVED: dict[str, Any] = {}  # one stand-in per name and process, shared by every parser rebuilt


def _resolve(ref: dict[str, Any]) -> Any:
    cache_trust.check_ref(ref)
    k = json.dumps(ref, sort_keys=True)
    if k not in _RESOLVED:
        module, qualname, how = ref["module"], ref["qualname"], ref["how"]
        if how == "import":
            _RESOLVED[k] = _lookup(_import(module), qualname)
        elif how == "source":
            _RESOLVED[k] = _compile(ref, module, qualname)
        elif how == "lazy":
            _RESOLVED[k] = _lazy_action(module, qualname) if ref["kind"] == "action" else _Lazy(module, qualname)
        else:
            raise ValueError(f"unknown ref {ref!r}")
    return _RESOLVED[k]


def rebuild(spec: dict[str, Any], fresh: Callable[[], argparse.ArgumentParser]) -> argparse.ArgumentParser:
    """`fresh()` with the spec's actions added as the upstream's add_argument calls left them."""
    refs = [_resolve(r) for r in spec["refs"]]

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
