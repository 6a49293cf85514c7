"""A parser's callables in a parser cache file (load/parser_cache.py): how each is stored, by module and qualified
name, and how it comes back.

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

Every ref read from a file is checked (load/cache_trust.py) before it is resolved.
"""

from __future__ import annotations

import argparse
import builtins
import importlib
import json
import sys
import types
from pathlib import Path
from typing import Any

from pdstack.controller.load import cache_trust


class Uncacheable(ValueError):
    """The parser holds something the spec cannot carry exactly."""


# --- storing a callable ------------------------------------------------------------------------------------------

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


def ref_of(obj: Any) -> dict[str, Any]:
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


# --- bringing a callable back ------------------------------------------------------------------------------------

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


def resolve(ref: dict[str, Any]) -> Any:
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
