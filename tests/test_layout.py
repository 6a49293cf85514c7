"""The package is grouped by where its code runs, and the imports respect it (docs/layout.md):

- hostside/ runs with a host's own python3 (the watchdog, probe, facts script): it imports no other part of pdstack;
- image/ runs inside the prod image, which holds only the package root, errors and image/ (imagebuild/inputs.py);
- controller/ runs on the control node and never depends on the test engine (testing/): the test engine and the
  tests depend on it, not the other way round.
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


def pdstack_imports(path: Path) -> list[tuple[int, str]]:
    """(line, module) of every pdstack import in a file, at any depth (function-local imports too)."""
    out = []
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name) for a in node.names if a.name.split(".")[0] == "pdstack"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "pdstack":
            out += [(node.lineno, node.module)] + [(node.lineno, f"{node.module}.{a.name}") for a in node.names
                                                   if node.module == "pdstack"]
    return out


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
# Side pipelines beside the stages: the image build reads the plan; locks is a leaf utility.
SIDE = {"imagebuild": "plan", "locks": "load"}
# The drivers below every stage: pipeline.py runs load -> render; tune/ runs the pipeline and the gates in a loop;
# status/ reads the inventory and what the hosts report (`pdstack status`).
DRIVERS = ("pipeline", "tune", "status")


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


def test_each_stage_imports_only_the_stages_above_it():
    bad = []
    for p in sorted((PKG / "controller").rglob("*.py")):
        mod = ".".join(p.relative_to(PKG.parent).with_suffix("").parts).removesuffix(".__init__")
        own = _stage(mod)
        if own is None:
            continue
        for line, imp in pdstack_imports(p):
            other = _stage(imp)
            if other is not None and other > own:
                bad.append(f"{p.relative_to(PKG.parent)}:{line}: {mod.split('.')[2]} imports {imp} (a later stage)")
    assert not bad, "one way down: load -> check -> plan -> render -> gates\n" + "\n".join(bad)



def test_no_module_of_pdstack_is_over_about_450_lines():
    big = {str(p.relative_to(PKG.parent)): n for p in PKG.rglob("*.py")
           if (n := len(p.read_text().splitlines())) > 470}  # "about 450"
    assert not big, f"split these along their sections: {big}"
