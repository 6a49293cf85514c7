"""pdstack.testing.parallel (loaded by the root conftest.py): each group of test files that share fixed-name test
hosts is one xdist unit, collected first, so under `invoke test`'s workers a worker starts it at once, in file
order; with more groups than workers, the groups past the last worker share its unit."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLAIN = "".join(f"def test_{c}():\n    pass\n\n" for c in "abcde")
SECOND = "".join(f"def test_{n}():\n    pass\n\n" for n in ("x", "y", "z"))
GROUPED = "".join(f"def test_{n}():\n    pass\n\n" for n in ("first", "second", "third", "fourth", "fifth"))


THIRD = "".join(f"def test_{n}():\n    pass\n\n" for n in ("p", "q"))


def run(tmp_path: Path, *args: str, third: bool = False) -> subprocess.CompletedProcess:
    (tmp_path / "test_1plain.py").write_text(PLAIN)
    (tmp_path / "test_2grouped.py").write_text(GROUPED)
    (tmp_path / "test_0second.py").write_text(SECOND)
    # two groups: test_2grouped.py alone, then test_0second.py (collected after it, whatever the file names say);
    # `third`: a third group, test_3third.py
    if third:
        (tmp_path / "test_3third.py").write_text(THIRD)
    (tmp_path / "pytest.ini").write_text("[pytest]\npdstack_shared_host_tests =\n    test_2grouped.py\n"
                                         "    test_0second.py\n" + ("    test_3third.py\n" if third else ""))
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "pdstack.testing.parallel", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), *args, str(tmp_path)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def test_grouped_tests_are_collected_first_in_file_order(tmp_path):
    r = run(tmp_path, "--collect-only", "-q")
    assert r.returncode == 0, r.stdout
    ids = [line for line in r.stdout.splitlines() if "::" in line]
    assert ids == [*(f"test_2grouped.py::test_{n}" for n in ("first", "second", "third", "fourth", "fifth")),
                   *(f"test_0second.py::test_{n}" for n in "xyz"),
                   *(f"test_1plain.py::test_{c}" for c in "abcde")], r.stdout


def workers_of(r: subprocess.CompletedProcess) -> dict[str, str]:
    """{test id: the xdist worker that ran it} from a -v run's output."""
    assert r.returncode == 0, r.stdout
    workers = {}
    for line in r.stdout.splitlines():  # "[gw0] [ 25%] PASSED test_2grouped.py::test_first"
        if "PASSED" in line and line.startswith("[gw"):
            workers[line.split("PASSED")[1].strip()] = line.split("]")[0].strip("[")
    return workers


def test_under_two_workers_a_group_runs_on_one_worker(tmp_path):
    r = run(tmp_path, "-n", "2", "--dist", "loadgroup", "-v")
    workers = workers_of(r)
    assert len(workers) == 13, r.stdout
    for group in ("test_2grouped.py::", "test_0second.py::"):  # one worker ran each whole group (xdist's plain
        assert len({w for t, w in workers.items() if t.startswith(group)}) == 1, workers  # scheduling splits it)
    assert set(workers.values()) == {"gw0", "gw1"}, workers


def test_three_groups_run_side_by_side_on_three_workers_and_the_last_two_share_one_on_two(tmp_path):
    grouped, second, third = "test_2grouped.py::", "test_0second.py::", "test_3third.py::"
    three = workers_of(run(tmp_path, "-n", "3", "--dist", "loadgroup", "-v", third=True))
    assert len(three) == 15, three
    on = {g: {w for t, w in three.items() if t.startswith(g)} for g in (grouped, second, third)}
    assert all(len(ws) == 1 for ws in on.values()), on  # each group on one worker ...
    assert len(set().union(*on.values())) == 3, on  # ... and each on its own
    two = workers_of(run(tmp_path, "-n", "2", "--dist", "loadgroup", "-v", third=True))
    on = {g: {w for t, w in two.items() if t.startswith(g)} for g in (grouped, second, third)}
    assert on[second] == on[third] and len(on[second]) == 1, on  # the third joins the last worker's unit
    assert len(on[grouped]) == 1 and on[grouped] != on[second], on
