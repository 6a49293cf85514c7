"""The package is grouped by where its code runs, and the imports respect it (README, "Layout"):

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
