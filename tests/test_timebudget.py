"""The suite's time budget (pdstack/testing/timebudget.py, tests/time_budget.json)."""

from __future__ import annotations

import ast
import json
from pathlib import Path

from pdstack.testing import timebudget

ROOT = Path(__file__).resolve().parents[1]


def test_a_new_slow_test_and_an_overrun_are_named():
    budget = {"tests/test_a.py::test_old": 60.0}
    lines = timebudget.report_lines({"tests/test_a.py::test_old": 200.0, "tests/test_b.py::test_new": 45.0,
                                     "tests/test_b.py::test_fast": 1.0}, budget)
    assert any("NEW SLOW TEST" in x and "tests/test_b.py::test_new took 45 s" in x for x in lines), lines
    assert not any("test_fast" in x for x in lines), lines
    assert any("OVER BUDGET: tests/test_a.py::test_old took 200 s, budget 60 s" in x for x in lines), lines
    assert lines[-1].startswith("test time 4.1 min over 3 tests"), lines[-1]


def test_within_budget_says_nothing_but_the_total():
    lines = timebudget.report_lines({"tests/test_a.py::test_old": 70.0}, {"tests/test_a.py::test_old": 60.0})
    assert len(lines) == 1 and "1.0 min budgeted" in lines[0], lines


def test_budget_from_rounds_up_and_keeps_only_slow_tests():
    b = timebudget.budget_from({"t::a": 21.2, "t::b": 3.0, "t::c": 100.0}, "cmd")
    assert b["tests"] == {"t::c": 105.0, "t::a": 25.0} and b["measured_with"] == "cmd"


def test_every_budgeted_test_exists():
    """A renamed or deleted test must leave the budget file too (parametrised ids: the function must exist)."""
    data = json.loads((ROOT / "tests" / "time_budget.json").read_text())
    assert data["tests"], "the budget lists the slowest tests"
    missing = []
    for nodeid in data["tests"]:
        path, _, name = nodeid.partition("::")
        f = ROOT / path
        func = name.split("[")[0].split("::")[-1]
        if not f.exists() or func not in {n.name for n in ast.walk(ast.parse(f.read_text()))
                                          if isinstance(n, ast.FunctionDef | ast.AsyncFunctionDef)}:
            missing.append(nodeid)
    assert not missing, f"tests/time_budget.json names tests that do not exist: {missing}"
