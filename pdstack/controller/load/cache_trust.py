"""What a parser cache file (load/parser_cache.py) may name: it is data, and nothing in it decides what code runs.

A cache file lives under build/cache or PDSTACK_CACHE_DIR, which anyone who can set an environment variable can
point elsewhere. So every ref in it is checked before it is resolved: it may name only a few standard-library objects
(the pinned parsers' flag types and argparse's own actions) or an object of the upstream packages themselves (code
that is installed, as importing it would run); a `source` ref (an upstream function compiled alone, to avoid
importing torch) runs only when its text is, byte for byte, the function in the installed upstream file it names,
with standard-library imports only. Anything else makes the whole file unreadable: the live parser is built instead.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import operator
import sys
from pathlib import Path
from typing import Any


def stdlib(module: str) -> bool:
    return module.split(".")[0] in sys.stdlib_module_names or module == "builtins"


def future_flags() -> int:
    """The compiler flags of every `from __future__ import`: a code object's co_flags say which its module had."""
    future = importlib.import_module("__future__")
    return functools.reduce(operator.or_, (getattr(future, f).compiler_flag for f in future.all_feature_names))


# the standard-library objects a ref may name besides argparse's actions
_SAFE_STDLIB = {("builtins", "str"), ("builtins", "int"), ("builtins", "float"), ("json", "loads")}
UPSTREAM_PACKAGES = ("sglang", "sglang_router")


class UntrustedRef(ValueError):
    """A cache ref that names code outside what the cache may name."""


def _upstream_root(module: str) -> Path | None:
    top = module.split(".")[0]
    if top not in UPSTREAM_PACKAGES:
        return None
    spec = importlib.util.find_spec(top)  # a top-level package: found without importing it
    return Path(spec.origin).resolve().parent if spec is not None and spec.origin else None


def check_ref(ref: Any) -> None:
    """Raises UntrustedRef unless `ref` names what the cache may name (above)."""
    import ast

    if not isinstance(ref, dict) or not all(isinstance(ref.get(k), str) for k in ("module", "qualname", "how")):
        raise UntrustedRef(f"not a ref: {ref!r}")
    module, qualname, how = ref["module"], ref["qualname"], ref["how"]
    upstream = module.split(".")[0] in UPSTREAM_PACKAGES
    if how in ("import", "lazy"):
        if upstream or (module, qualname) in _SAFE_STDLIB:
            return
        if module == "argparse" and qualname.endswith("Action") and ref.get("kind") == "action":
            return
        raise UntrustedRef(f"{module}.{qualname} is not an object the cache may name")
    if how != "source" or not upstream:
        raise UntrustedRef(f"{module}.{qualname}: {how!r} refs are upstream functions only")
    root = _upstream_root(module)
    filename, lineno, source = ref.get("filename"), ref.get("lineno"), ref.get("source")
    if root is None or not isinstance(filename, str) or not isinstance(lineno, int) or not isinstance(source, str):
        raise UntrustedRef(f"{module}.{qualname}: no upstream file to check its source against")
    path = Path(filename).resolve()
    if not path.is_relative_to(root) or path.suffix != ".py":
        raise UntrustedRef(f"{module}.{qualname}: {filename} is not a file of the installed {root.name}")
    lines = path.read_text().splitlines(keepends=True)
    if "".join(lines[lineno - 1:lineno - 1 + len(source.splitlines())]) != source:
        raise UntrustedRef(f"{module}.{qualname}: its source is not the installed {filename}'s at line {lineno}")
    for line in ref.get("imports") or []:
        tree = ast.parse(line) if isinstance(line, str) else None
        stmt = tree.body[0] if tree is not None and len(tree.body) == 1 else None
        names = ([a.name for a in stmt.names] if isinstance(stmt, ast.Import)
                 else [stmt.module or ""] if isinstance(stmt, ast.ImportFrom) and not stmt.level else None)
        if not names or not all(stdlib(n) for n in names):
            raise UntrustedRef(f"{module}.{qualname}: import {line!r} is not a standard-library import")
    if not isinstance(ref.get("flags"), int) or ref["flags"] & ~future_flags():
        raise UntrustedRef(f"{module}.{qualname}: compiler flags beyond __future__'s")
