"""The suite's leak detector (pdstack.testing.leaks, loaded by the root conftest.py), run for real: a pytest session
in a subprocess whose tests leave processes behind fails, names each one with the test it appeared in, and kills
it; a session that stops what it started passes."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[1]

LEAKY = textwrap.dedent('''
    import subprocess

    def test_leaks_a_child_in_its_own_session():
        subprocess.Popen(["sleep", "3607"], start_new_session=True)  # what ManagedProcess does, never stopped

    def test_leaks_an_orphan():
        # re-parented to init: found by its env marker. The test returns once the orphan runs `sleep` (under the
        # whole suite's load the detector's end-of-test scan once came before it and named the next test)
        subprocess.run(["sh", "-c", "sleep 3608 & while ! pgrep -fx 'sleep 3608' >/dev/null; do sleep 0.05; done"],
                       check=True, timeout=30)

    def test_stops_what_it_started():
        p = subprocess.Popen(["sleep", "3609"])
        p.kill()
        p.wait()
''')

CLEAN = textwrap.dedent('''
    import sys

    from pdstack.testing.sim.launch import ManagedProcess

    def test_a_managed_process_is_stopped_even_when_the_test_fails(tmp_path):
        with ManagedProcess("sleeper", ["sleep", "3610"], tmp_path / "log").start():
            assert False, "on purpose"

    def test_started_and_stopped(tmp_path):
        p = ManagedProcess("child", [sys.executable, "-c", "import time; time.sleep(3611)"], tmp_path / "log").start()
        p.stop()
''')


def run_session(tmp_path: Path, source: str, *args: str) -> subprocess.CompletedProcess:
    (tmp_path / "test_inner.py").write_text(source)
    env = {**os.environ, "PYTHONPATH": str(ROOT), "PDSTACK_LEAK_GRACE_S": "0.5"}
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "pdstack.testing.leaks", "-p", "no:cacheprovider",
                           "--rootdir", str(tmp_path), *args, str(tmp_path / "test_inner.py")], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)


def sleepers(*secs: int) -> list[psutil.Process]:
    want = {f"sleep {s}" for s in secs}
    out = []
    for p in psutil.process_iter(["cmdline"]):
        if " ".join(p.info["cmdline"] or []) in want:
            out.append(p)
    return out


def test_a_session_that_leaves_processes_behind_fails_and_names_them(tmp_path):
    r = run_session(tmp_path, LEAKY)
    out = r.stdout
    assert r.returncode == 1, out
    assert "3 passed, 2 leaked" in out, out  # every test passed; the session still fails
    assert "processes left behind" in out
    assert "(appeared during test_inner.py::test_leaks_a_child_in_its_own_session): sleep 3607" in out, out
    assert "(appeared during test_inner.py::test_leaks_an_orphan): sleep 3608" in out, out
    assert "sleep 3609" not in out
    deadline = time.monotonic() + 5
    while sleepers(3607, 3608) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sleepers(3607, 3608), "the detector must terminate what it reports"


def test_a_session_that_stops_what_it_started_passes(tmp_path):
    r = run_session(tmp_path, CLEAN)
    assert r.returncode == 1 and "1 failed, 1 passed in" in r.stdout, r.stdout  # the on-purpose failure only
    assert "leaked" not in r.stdout and "processes left behind" not in r.stdout, r.stdout
    assert not sleepers(3610)


def test_under_xdist_a_worker_that_leaves_processes_behind_fails_the_run(tmp_path):
    """`invoke test` runs two pytest-xdist workers; xdist ignores a worker's exit status, so the worker hands its
    findings to the controller, which fails the run with them."""
    r = run_session(tmp_path, LEAKY, "-n", "2")
    out = r.stdout
    assert r.returncode == 1, out
    assert "3 passed, 2 leaked" in out, out
    assert "processes left behind" in out
    assert "test_inner.py::test_leaks_a_child_in_its_own_session): sleep 3607" in out, out
    assert "test_inner.py::test_leaks_an_orphan): sleep 3608" in out, out
    deadline = time.monotonic() + 5
    while sleepers(3607, 3608) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert not sleepers(3607, 3608)


def test_under_xdist_a_clean_run_reports_no_leak(tmp_path):
    r = run_session(tmp_path, CLEAN, "-n", "2")
    assert r.returncode == 1 and "1 failed, 1 passed in" in r.stdout, r.stdout
    assert "leaked" not in r.stdout and "processes left behind" not in r.stdout, r.stdout
