"""The suite's time budget (tests/time_budget.json): the slowest tests with the seconds they are expected to take.

A pytest plugin (conftest.py loads it). At the end of a run it prints, in the terminal summary:
  * every test that took longer than BUDGET_FLOOR_S and is not in the budget file: a new slow test, to be added
    there (with its measured seconds) in the change that adds it, so it shows up in review and in the note;
  * every budgeted test that took more than twice its budget;
  * the run's total test time and the budget's total.
It never fails a run: timings depend on the machine (2 cores here); the file is the record, the summary the signal.
`PDSTACK_DURATIONS_OUT=FILE` also writes every test's duration (setup + call + teardown) as JSON, which is how the
budget file is refreshed: `PDSTACK_DURATIONS_OUT=/tmp/d.json ./dev.sh test` then `python -m
pdstack.testing.timebudget /tmp/d.json > tests/time_budget.json`.
"""

from __future__ import annotations

import json
import os
import sys
from collections import defaultdict
from pathlib import Path

import pytest

BUDGET_FILE = Path(__file__).resolve().parents[2] / "tests" / "time_budget.json"
BUDGET_FLOOR_S = 20.0  # tests faster than this are not budgeted one by one

_durations: dict[str, float] = defaultdict(float)


def load_budget(path: Path = BUDGET_FILE) -> dict[str, float]:
    if not path.exists():
        return {}
    return {k: float(v) for k, v in json.loads(path.read_text())["tests"].items()}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    _durations[report.nodeid] += report.duration


def report_lines(durations: dict[str, float], budget: dict[str, float]) -> list[str]:
    """What the summary says about `durations` against `budget` (a pure function: tests/test_timebudget.py)."""
    lines = []
    new = sorted(((d, t) for t, d in durations.items() if d > BUDGET_FLOOR_S and t not in budget), reverse=True)
    for d, t in new:
        lines.append(f"NEW SLOW TEST (not in tests/time_budget.json): {t} took {d:.0f} s; add it with its seconds")
    over = sorted(((d, t) for t, d in durations.items() if t in budget and d > 2 * budget[t] and d > BUDGET_FLOOR_S),
                  reverse=True)
    for d, t in over:
        lines.append(f"OVER BUDGET: {t} took {d:.0f} s, budget {budget[t]:.0f} s")
    ran = [t for t in budget if t in durations]
    lines.append(f"test time {sum(durations.values()) / 60:.1f} min over {len(durations)} tests; the budgeted "
                 f"{len(ran)} of them {sum(durations[t] for t in ran) / 60:.1f} min against "
                 f"{sum(budget[t] for t in ran) / 60:.1f} min budgeted")
    return lines


def pytest_terminal_summary(terminalreporter, exitstatus, config) -> None:
    if not _durations or hasattr(config, "workerinput"):  # under xdist the controller gets every worker's reports
        return
    terminalreporter.section("time budget")
    for line in report_lines(dict(_durations), load_budget()):
        terminalreporter.write_line(line)
    out = os.environ.get("PDSTACK_DURATIONS_OUT")
    if out:
        Path(out).write_text(json.dumps(dict(sorted(_durations.items())), indent=1) + "\n")


def budget_from(durations: dict[str, float], command: str) -> dict:
    """A budget file's content from measured durations: every test over the floor, rounded up to 5 s."""
    tests = {t: float(5 * (int(d) // 5 + 1)) for t, d in sorted(durations.items(), key=lambda kv: -kv[1])
             if d > BUDGET_FLOOR_S}
    return {"measured_with": command, "floor_s": BUDGET_FLOOR_S, "tests": tests}


if __name__ == "__main__":
    src = json.loads(Path(sys.argv[1]).read_text())
    cmd = sys.argv[2] if len(sys.argv) > 2 else "PDSTACK_DURATIONS_OUT=FILE ./dev.sh test"
    print(json.dumps(budget_from(src, cmd), indent=1))
