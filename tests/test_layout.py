"""The package is grouped by where its code runs, and the imports respect it (docs/layout.md):

- hostside/ runs with a host's own python3 (the watchdog, probe, facts script): it imports no other part of pdstack;
- image/ runs inside the prod image, which holds only the package root, errors and image/ (imagebuild/inputs.py);
- controller/ runs on the control node and never depends on the test engine (testing/): the test engine and the
  tests depend on it, not the other way round.

Inside controller/, the stages run one way down (docs/pipeline.md, The controller's stages): no stage imports a later
one or a driver, the planner, renderers and gates import no check, no two pdstack modules import each other (function
-local imports count), no private name crosses a module, and no module re-exports a name: each is imported from the
module that defines it. Every import form is read as the module it imports.
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[1] / "pdstack"
ALLOWED = {  # group -> the pdstack modules (prefixes) its code may import
    "hostside": ("pdstack.hostside",),
    "image": ("pdstack.image", "pdstack.errors"),
    "controller": ("pdstack.controller", "pdstack.hostside", "pdstack.image", "pdstack.errors", "pdstack.switches",
                   "pdstack.upstream"),
}


def module_name(path: Path, root: Path = PKG.parent) -> str:
    """The dotted module a file under `root` is (a package's __init__.py is the package)."""
    return ".".join(path.relative_to(root).with_suffix("").parts).removesuffix(".__init__")


def is_module(name: str, root: Path = PKG.parent) -> bool:
    """`name` is a module or package under `root` (not a name defined in one)."""
    p = root.joinpath(*name.split("."))
    return p.with_suffix(".py").is_file() or (p / "__init__.py").is_file()


def imports(path: Path, root: Path = PKG.parent) -> list[tuple[int, str, str | None, str | None]]:
    """(line, module, name, bound) of every pdstack import in a file, at any depth (function-local imports too),
    each resolved to the module it actually imports: `from pdstack.a import b` is the module pdstack.a.b when b is
    a submodule, else the name b of pdstack.a; relative imports resolve against the file's own package.
    `name` is the imported name (None: the module itself, "*": every public name); `bound` is the local name the
    import binds (`import pdstack.a.b as z`, `from pdstack.a import b`, `from pdstack.a import X as Y`), None for
    `import pdstack.a` (it binds `pdstack`) and `*`."""
    own = module_name(path, root) if path.is_relative_to(root) else ""
    package = own if path.name == "__init__.py" else own.rpartition(".")[0]
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None, a.asname) for a in node.names if a.name.split(".")[0] == "pdstack"]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parent = ".".join(package.split(".")[:len(package.split(".")) - node.level + 1])
                base = f"{parent}.{base}".strip(".")
            if base.split(".")[0] != "pdstack":
                continue
            for a in node.names:
                sub = f"{base}.{a.name}"
                if a.name != "*" and is_module(sub, root):
                    out.append((node.lineno, sub, None, a.asname or a.name))
                else:
                    out.append((node.lineno, base, a.name, None if a.name == "*" else a.asname or a.name))
    return sorted(out, key=lambda t: t[0])


def pdstack_imports(path: Path, root: Path = PKG.parent) -> list[tuple[int, str]]:
    """(line, module) of every pdstack import in a file, each resolved to the module actually imported."""
    return [(line, mod) for line, mod, _name, _bound in imports(path, root)]


@pytest.mark.parametrize("group", sorted(ALLOWED))
def test_each_group_imports_only_what_runs_where_it_runs(group):
    allowed = ALLOWED[group]
    bad = [f"{p.relative_to(PKG.parent)}:{line}: imports {mod}" for p in sorted((PKG / group).rglob("*.py"))
           for line, mod in pdstack_imports(p)
           if not any(mod == a or mod.startswith(a + ".") for a in allowed) and mod != "pdstack"]
    assert not bad, f"pdstack/{group}/ may import only {allowed}:\n" + "\n".join(bad)


def test_the_check_sees_a_function_local_import(tmp_path):
    f = tmp_path / "m.py"
    f.write_text("def f():\n    from pdstack.testing.sim.vocab import TOKENIZER_DIR\n    import pdstack.testing\n")
    assert pdstack_imports(f) == [(2, "pdstack.testing.sim.vocab"), (3, "pdstack.testing")]


# The controller's pipeline, one way down (pdstack/controller/pipeline.py): a stage imports only from the stages
# above it, so the checks never reach into the planner and the planner never into what renders or gates its output.
STAGES = ("load", "check", "plan", "render", "gates")
# Beside the stages: locks is a leaf utility.
SIDE = {"locks": "load"}
# The drivers below every stage: pipeline.py runs load -> render; tune/ runs the pipeline and the gates in a loop;
# status/ reads the inventory and what the hosts report (`pdstack status`); imagebuild/ (`invoke build`) pins the
# plan's argv through the pipeline.
DRIVERS = ("pipeline", "tune", "status", "imagebuild")


def _stage(mod: str) -> int | None:
    parts = mod.split(".")
    if parts[:2] != ["pdstack", "controller"] or len(parts) < 3:
        return None
    if parts[2] in STAGES:
        return STAGES.index(parts[2])
    if parts[2] in SIDE:
        return STAGES.index(SIDE[parts[2]])
    if parts[2] in DRIVERS:
        return len(STAGES)  # the drivers: they run every stage, and no stage imports them
    return None


def test_the_controller_is_its_pipeline_stages_and_nothing_else():
    ctl = PKG / "controller"
    loose = sorted(p.name for p in ctl.iterdir()
                   if p.suffix == ".py" and p.stem not in ("__init__", "pipeline", "locks"))
    dirs = sorted(p.name for p in ctl.iterdir() if p.is_dir() and p.name != "__pycache__")
    assert not loose, f"controller/ modules outside a stage folder: {loose}"
    assert dirs == sorted([*STAGES, "imagebuild", "tune", "status"]), dirs


def stage_violations(root: Path = PKG.parent) -> list[str]:
    """Every import by a stage (or side pipeline) of a later stage or of a driver."""
    bad = []
    for p in sorted((root / "pdstack" / "controller").rglob("*.py")):
        mod = module_name(p, root)
        own = _stage(mod)
        if own is None:
            continue
        for line, imp in pdstack_imports(p, root):
            other = _stage(imp)
            if other is not None and other > own:
                bad.append(f"{p.relative_to(root)}:{line}: {mod.split('.')[2]} imports {imp} (a later stage)")
    return bad


def test_each_stage_imports_only_the_stages_above_it():
    bad = stage_violations()
    assert not bad, "one way down: load -> check -> plan -> render -> gates\n" + "\n".join(bad)


# What the planner, the renderers and the gates need from the checks' tables and the facts lives above them all,
# in load/: they import no check (the checks have run before them; only the drivers and the image build, which runs
# the stages itself, call the checks).
NO_CHECKS = ("plan", "render", "gates")


def check_importers(root: Path = PKG.parent) -> list[str]:
    """Every import of a check module by the planner, a renderer or a gate."""
    return [f"{p.relative_to(root)}:{line}: {stage} imports {imp}" for stage in NO_CHECKS
            for p in sorted((root / "pdstack" / "controller" / stage).rglob("*.py"))
            for line, imp in pdstack_imports(p, root)
            if imp == "pdstack.controller.check" or imp.startswith("pdstack.controller.check.")]


def test_the_planner_renderers_and_gates_import_no_checks():
    bad = check_importers()
    assert not bad, "move what they share with the checks above both, into load/:\n" + "\n".join(bad)


def import_cycles(root: Path = PKG.parent) -> list[list[str]]:
    """The import cycles between pdstack modules (function-local imports count: hiding an import in a function
    does not break the cycle): one path round each strongly connected set of modules."""
    graph = {module_name(p, root): {m for _line, m in pdstack_imports(p, root)} - {module_name(p, root)}
             for p in sorted((root / "pdstack").rglob("*.py"))}
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    sccs = []

    def visit(v: str) -> None:  # Tarjan's strongly connected components
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in sorted(graph.get(v, ())):
            if w not in graph:
                continue
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            scc = []
            while True:
                w = stack.pop()
                scc.append(w)
                if w == v:
                    break
            if len(scc) > 1:
                sccs.append(sorted(scc))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return [_round(scc, graph) for scc in sccs]


def _round(scc: list[str], graph: dict[str, set[str]]) -> list[str]:
    """One cycle through the first module of `scc`, as a path that ends where it starts."""
    start, members = scc[0], set(scc)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & members):
            if w == start:
                return paths[v] + [start]
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return scc


def test_no_import_cycles_between_pdstack_modules():
    cycles = import_cycles()
    assert not cycles, "move the shared piece to a module both can import:\n" + "\n".join(
        " -> ".join(c) for c in cycles)


def private_crossings(root: Path = PKG.parent) -> list[str]:
    """Every private name (`_x`) imported from, or read off, another pdstack module, and every `import *`."""
    bad = []
    for p in sorted((root / "pdstack").rglob("*.py")):
        where = p.relative_to(root)
        bound = {}
        for line, mod, name, alias in imports(p, root):
            if name == "*":
                bad.append(f"{where}:{line}: from {mod} import * (import the names it uses)")
            elif name is not None and name.startswith("_") and not name.startswith("__"):
                bad.append(f"{where}:{line}: imports {mod}.{name}, private to {mod}")
            elif name is None:
                bound[alias or mod.split(".")[0]] = mod if alias else mod.split(".")[0]
        for node in ast.walk(ast.parse(p.read_text(), str(p))):
            if not isinstance(node, ast.Attribute) or not node.attr.startswith("_") or node.attr.startswith("__"):
                continue
            chain, v = [], node.value
            while isinstance(v, ast.Attribute):
                chain.insert(0, v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in bound:
                mod = ".".join([bound[v.id], *chain])
                if is_module(mod, root):
                    bad.append(f"{where}:{node.lineno}: reads {mod}.{node.attr}, private to {mod}")
    return bad


def test_no_private_name_crosses_a_module_and_no_import_star():
    bad = private_crossings()
    assert not bad, "make the name public in the module that owns it:\n" + "\n".join(bad)


def top_names(mod: str, root: Path = PKG.parent) -> tuple[set[str], dict[str, str]]:
    """The names a module defines at its top level, and those it imports from pdstack modules (name -> module)."""
    p = root.joinpath(*mod.split("."))
    p = p.with_suffix(".py") if p.with_suffix(".py").is_file() else p / "__init__.py"
    tree = ast.parse(p.read_text(), str(p))
    body = [n for s in tree.body for n in (s, *getattr(s, "body", ()), *getattr(s, "orelse", ()))
            if not isinstance(s, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef) or n is s]
    defined = {n.name for n in body if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)}
    defined |= {x.id for n in body if isinstance(n, ast.Assign | ast.AnnAssign | ast.AugAssign)
                for tg in getattr(n, "targets", [getattr(n, "target", None)]) for x in ast.walk(tg)
                if isinstance(x, ast.Name)}
    imported = {bound: m for line, m, name, bound in imports(p, root) if name not in (None, "*")
                and line in {n.lineno for n in tree.body}}
    return defined, imported


def definer(mod: str, name: str, root: Path = PKG.parent) -> str:
    """The module that defines `name`, following the imports that carry it from `mod`."""
    seen = set()
    while mod not in seen:
        seen.add(mod)
        defined, imported = top_names(mod, root)
        if name in defined or name not in imported:
            return mod
        mod = imported[name]
    return mod


def reexports(root: Path = PKG.parent) -> list[str]:
    """Every re-export: a pdstack name (or module) a module imports and never reads, one it lists in `__all__`
    without defining, and every import of a name from, or read of a name off, a module that only imports it."""
    bad = []
    for p in sorted((root / "pdstack").rglob("*.py")):
        where, tree = p.relative_to(root), ast.parse(p.read_text(), str(p))
        reads = {n.id for n in ast.walk(tree) if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)}
        defined, imported = top_names(module_name(p, root), root)
        listed = [(n.lineno, e.value) for n in tree.body if isinstance(n, ast.Assign)
                  and any(isinstance(tg, ast.Name) and tg.id == "__all__" for tg in n.targets)
                  for e in getattr(n.value, "elts", []) if isinstance(e, ast.Constant)]
        bound = {}
        for line, mod, name, alias in imports(p, root):
            local = alias or mod.split(".")[0]
            if name is None:
                bound[local] = mod if alias else mod.split(".")[0]
            if name != "*" and local not in reads:
                what = mod if name is None else f"{definer(mod, name, root)}.{name}"
                bad.append(f"{where}:{line}: imports {what} and never reads it (callers import it from there)")
            elif name not in (None, "*") and definer(mod, name, root) != mod:
                bad.append(f"{where}:{line}: imports {mod}.{name}, defined in {definer(mod, name, root)}")
        for line, name in listed:
            if name in imported and name not in defined:
                bad.append(f"{where}:{line}: lists {name} in __all__, defined in {definer(imported[name], name, root)}")
        for node in ast.walk(tree):
            chain, v = [], node.value if isinstance(node, ast.Attribute) else None
            while isinstance(v, ast.Attribute):
                chain.insert(0, v.attr)
                v = v.value
            if isinstance(v, ast.Name) and v.id in bound and is_module(mod := ".".join([bound[v.id], *chain]), root):
                if not is_module(f"{mod}.{node.attr}", root) and definer(mod, node.attr, root) != mod:
                    bad.append(f"{where}:{node.lineno}: reads {mod}.{node.attr}, defined in "
                               f"{definer(mod, node.attr, root)}")
    return bad


def test_no_module_re_exports_a_name():
    bad = reexports()
    assert not bad, "import each name from the module that defines it:\n" + "\n".join(bad)


def _plant(root: Path, files: dict[str, str]) -> Path:
    for rel, text in {"pdstack/__init__.py": "", "pdstack/controller/__init__.py": "", **files}.items():
        f = root / rel
        f.parent.mkdir(parents=True, exist_ok=True)
        for d in f.relative_to(root).parents:  # every folder on the way is a package
            if d != Path(".") and not (root / d / "__init__.py").exists():
                (root / d / "__init__.py").write_text("")
        f.write_text(text)
    return root


def test_the_reader_resolves_every_import_form(tmp_path):
    root = _plant(tmp_path, {
        "pdstack/controller/pipeline.py": "X = 1\n",
        "pdstack/controller/load/a.py": "Y = 1\n",
        "pdstack/controller/load/b.py": ("from pdstack.controller import pipeline\n"
                                         "from . import a\n"
                                         "from .a import Y\n"
                                         "import pdstack.controller.load.a as z\n"
                                         "from ..pipeline import X\n"
                                         "def f():\n    from pdstack import controller\n"),
    })
    assert pdstack_imports(root / "pdstack/controller/load/b.py", root) == [
        (1, "pdstack.controller.pipeline"), (2, "pdstack.controller.load.a"), (3, "pdstack.controller.load.a"),
        (4, "pdstack.controller.load.a"), (5, "pdstack.controller.pipeline"), (7, "pdstack.controller")]


@pytest.mark.parametrize("form", ["from pdstack.controller import pipeline", "from .. import pipeline",
                                  "import pdstack.controller.plan.p as p", "from pdstack.controller.render import r"])
def test_the_stage_rule_catches_a_stage_importing_down(tmp_path, form):
    root = _plant(tmp_path, {"pdstack/controller/pipeline.py": "", "pdstack/controller/plan/p.py": "",
                             "pdstack/controller/render/r.py": "",
                             "pdstack/controller/check/c.py": f"def f():\n    {form}\n"})
    assert len(stage_violations(root)) == 1, stage_violations(root)


@pytest.mark.parametrize("form", ["from pdstack.controller.check import tables", "from ..check.tables import X",
                                  "import pdstack.controller.check.tables as t"])
def test_the_no_checks_rule_catches_a_renderer_importing_a_check(tmp_path, form):
    root = _plant(tmp_path, {"pdstack/controller/check/tables.py": "X = 1\n",
                             "pdstack/controller/render/r.py": form + "\n"})
    assert len(check_importers(root)) == 1, check_importers(root)


def test_the_cycle_rule_catches_a_cycle_hidden_in_a_function(tmp_path):
    root = _plant(tmp_path, {"pdstack/controller/load/a.py": "from pdstack.controller.load.b import Y\n",
                             "pdstack/controller/load/b.py": "def f():\n    from . import a\n",
                             "pdstack/controller/load/c.py": "from pdstack.controller.load import a\n"})
    assert import_cycles(root) == [["pdstack.controller.load.a", "pdstack.controller.load.b",
                                    "pdstack.controller.load.a"]]


@pytest.mark.parametrize("use", ["from pdstack.controller.load.a import _x", "from .a import _x",
                                 "from pdstack.controller.load import a\nv = a._x",
                                 "import pdstack.controller.load.a as m\nv = m._x",
                                 "import pdstack.controller.load.a\nv = pdstack.controller.load.a._x",
                                 "from pdstack.controller.load.a import *"])
def test_the_privacy_rule_catches_a_private_crossing(tmp_path, use):
    root = _plant(tmp_path, {"pdstack/controller/load/a.py": "_x = 1\nX = 2\n",
                             "pdstack/controller/load/b.py": use + "\n"})
    assert len(private_crossings(root)) == 1, private_crossings(root)
    (root / "pdstack/controller/load/b.py").write_text("from pdstack.controller.load import a\nv = a.X, a.__name__\n")
    assert not private_crossings(root)


@pytest.mark.parametrize("use", ["from pdstack.controller.load.a import X", "from .a import X as Y",
                                 "from pdstack.controller.load import a", "import pdstack.controller.load.a as m",
                                 "from pdstack.controller.load.a import X\nv = X\n__all__ = ['X', 'v']"])
def test_the_reexport_rule_catches_a_re_export(tmp_path, use):
    root = _plant(tmp_path, {"pdstack/controller/load/a.py": "X = 1\n",
                             "pdstack/controller/load/b.py": use + "\n",
                             "pdstack/controller/load/c.py": "from pdstack.controller.load import b\nv = b.Z\n"})
    assert len(reexports(root)) == 1, reexports(root)
    assert reexports(root)[0].startswith(f"pdstack/controller/load/b.py:{1 + 2 * ('__all__' in use)}: ")
    assert "pdstack.controller.load.a" in reexports(root)[0], reexports(root)
    (root / "pdstack/controller/load/b.py").write_text(
        "from pdstack.controller.load.a import X\nZ = X\n__all__ = ['Z']\n")
    assert not reexports(root)


@pytest.mark.parametrize(("use", "said"), [
    ("from pdstack.controller.load.b import X\nv = X", "1: imports"),
    ("from pdstack.controller.load import b\nv = b.X", "2: reads"),
    ("import pdstack.controller.load.b\nv = pdstack.controller.load.b.X", "2: reads")])
def test_the_reexport_rule_catches_a_name_taken_from_a_module_that_only_imports_it(tmp_path, use, said):
    root = _plant(tmp_path, {"pdstack/controller/load/a.py": "X = 1\n",
                             "pdstack/controller/load/b.py": "from pdstack.controller.load.a import X\nY = X\n",
                             "pdstack/controller/load/c.py": use + "\n"})
    assert reexports(root) == [f"pdstack/controller/load/c.py:{said} pdstack.controller.load.b.X, "
                               "defined in pdstack.controller.load.a"]


def test_no_module_of_pdstack_is_over_about_450_lines():
    big = {str(p.relative_to(PKG.parent)): n for p in PKG.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 450}
    assert not big, f"split these along their sections: {big}"
