"""pdstack.testing.parallel (loaded by the root conftest.py): each group of test files that share fixed-name test
hosts is one xdist unit, collected first, so under `invoke test`'s two workers a worker starts it at once, in file
order."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

PLAIN = "".join(f"def test_{c}():\n    pass\n\n" for c in "abcde")
SECOND = "".join(f"def test_{n}():\n    pass\n\n" for n in ("x", "y", "z"))
GROUPED = "".join(f"def test_{n}():\n    pass\n\n" for n in ("first", "second", "third", "fourth", "fifth"))


def run(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_1plain.py").write_text(PLAIN)
    (tmp_path / "test_2grouped.py").write_text(GROUPED)
    (tmp_path / "test_0second.py").write_text(SECOND)
    # two groups: test_2grouped.py alone, then test_0second.py (collected after it, whatever the file names say)
    (tmp_path / "pytest.ini").write_text("[pytest]\npdstack_shared_host_tests =\n    test_2grouped.py\n"
                                         "    test_0second.py\n")
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


def test_under_two_workers_a_group_runs_on_one_worker(tmp_path):
    r = run(tmp_path, "-n", "2", "--dist", "loadgroup", "-v")
    assert r.returncode == 0, r.stdout
    workers = {}
    for line in r.stdout.splitlines():  # "[gw0] [ 25%] PASSED test_2grouped.py::test_first"
        if "PASSED" in line and line.startswith("[gw"):
            workers[line.split("PASSED")[1].strip()] = line.split("]")[0].strip("[")
    assert len(workers) == 13, r.stdout
    for group in ("test_2grouped.py::", "test_0second.py::"):  # one worker ran each whole group (xdist's plain
        assert len({w for t, w in workers.items() if t.startswith(group)}) == 1, workers  # scheduling splits it)
    assert set(workers.values()) == {"gw0", "gw1"}, workers
