"""A pytest plugin: the test session FAILS when a process that its tests started is still alive at its end.

Loaded for the whole suite by the repository's root conftest.py (or `pytest -p pdstack.testing.leaks`). A process
counts as started by the session when it is

- a descendant of the pytest process (whatever its process group or session: `ManagedProcess` starts every sim and
  router in a session of its own), or
- marked: its environment carries PDSTACK_TEST_SESSION=<this session's token>, which the plugin puts into
  os.environ at start, so every child inherits it. That finds orphans too (a double fork, or a child whose parent
  died, is re-parented to init and no longer a descendant).

After each test the plugin notes which new processes appeared during it, so the report can name the test. At the
end it waits a few seconds (PDSTACK_LEAK_GRACE_S, default 3) for stragglers, then lists what is still alive (pid,
the test it appeared in, its command line), terminates it (SIGTERM, then SIGKILL), and sets the exit status to 1.
Under pytest-xdist (`invoke test` runs two workers) each worker checks its own tests' processes and hands what it
found to the controller (xdist ignores a worker's exit status), which reports it and fails the run; the controller
runs no test, so it does not scan (its workers are its descendants until the very end).
"""

from __future__ import annotations

import os
import signal
import time
import uuid

import psutil
import pytest

MARK = "PDSTACK_TEST_SESSION"
_KEY = pytest.StashKey[tuple]()  # (the detector, the MARK value before this session)
_WORKER_LEAKS = pytest.StashKey[list]()  # on the xdist controller: (count, message) from each worker


def _alive(p: psutil.Process) -> bool:
    try:
        return p.is_running() and p.status() != psutil.STATUS_ZOMBIE
    except psutil.Error:
        return False


def _cmdline(p: psutil.Process) -> str:
    try:
        return " ".join(p.cmdline()) or f"[{p.name()}]"
    except psutil.Error:
        return "?"


class LeakDetector:
    def __init__(self, token: str, grace_s: float):
        self.token, self.grace_s = token, grace_s
        self.me = psutil.Process()
        self.seen_in: dict[int, str] = {}  # pid -> nodeid of the test during which it first appeared

    def descendants(self) -> list[psutil.Process]:
        try:
            return [p for p in self.me.children(recursive=True) if _alive(p)]
        except psutil.Error:
            return []

    def marked(self) -> list[psutil.Process]:
        out = []
        for p in psutil.process_iter():
            if p.pid == self.me.pid:
                continue
            try:
                if p.environ().get(MARK) == self.token and _alive(p):
                    out.append(p)
            except psutil.Error:  # gone, or not ours to read
                continue
        return out

    def left(self) -> list[psutil.Process]:
        found = {p.pid: p for p in (*self.descendants(), *self.marked())}
        return [found[pid] for pid in sorted(found)]

    def note(self, nodeid: str) -> None:
        for p in self.left():
            self.seen_in.setdefault(p.pid, nodeid)

    def wait_left(self) -> list[psutil.Process]:
        deadline = time.monotonic() + self.grace_s
        left = self.left()
        while left and time.monotonic() < deadline:
            time.sleep(0.2)
            left = self.left()
        return left

    def terminate(self, procs: list[psutil.Process]) -> None:
        mine = os.getpgrp()
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in procs:
                try:
                    pgid = os.getpgid(p.pid)
                    if pgid != mine and pgid == p.pid:  # a group leader of its own group: take what it started too
                        os.killpg(pgid, sig)
                    else:
                        p.send_signal(sig)
                except (ProcessLookupError, psutil.Error):
                    pass
            _, procs = psutil.wait_procs(procs, timeout=3)
            if not procs:
                return


def pytest_configure(config: pytest.Config) -> None:
    token = uuid.uuid4().hex
    config.stash[_KEY] = (LeakDetector(token, float(os.environ.get("PDSTACK_LEAK_GRACE_S", "3"))),
                          os.environ.get(MARK))
    os.environ[MARK] = token


def pytest_unconfigure(config: pytest.Config) -> None:
    _, previous = config.stash.get(_KEY, (None, None))
    if previous is None:
        os.environ.pop(MARK, None)
    else:
        os.environ[MARK] = previous


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item: pytest.Item, nextitem):
    yield
    item.config.stash[_KEY][0].note(item.nodeid)


def _xdist_controller(config: pytest.Config) -> bool:
    return config.pluginmanager.hasplugin("dsession") and not hasattr(config, "workerinput")


@pytest.hookimpl(optionalhook=True)
def pytest_testnodedown(node, error) -> None:
    """xdist, on the controller: a worker finished; keep what its leak check found."""
    found = getattr(node, "workeroutput", {}).get("pdstack_leaks")
    if found:
        node.config.stash.setdefault(_WORKER_LEAKS, []).append((found["count"], f"[{node.gateway.id}] {found['msg']}"))


def _report(session: pytest.Session, count: int, msg: str) -> None:
    tr = session.config.pluginmanager.get_plugin("terminalreporter")
    if tr is not None:
        tr.ensure_newline()
        tr.write_sep("=", "processes left behind", red=True, bold=True)
        tr.write_line(msg)
        tr.stats.setdefault("leaked", []).extend(range(count))  # the last line then says "N passed, M leaked"
    else:
        print(msg)
    session.exitstatus = pytest.ExitCode.TESTS_FAILED


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus) -> None:
    if _xdist_controller(session.config):
        found = session.config.stash.get(_WORKER_LEAKS, [])
        if found:
            _report(session, sum(n for n, _ in found), "\n".join(msg for _, msg in found))
        return
    det: LeakDetector = session.config.stash[_KEY][0]
    left = det.wait_left()
    if not left:
        return
    lines = [f"pid {p.pid} (appeared during {det.seen_in.get(p.pid, 'an unknown test; orphaned')}): {_cmdline(p)}"
             for p in left]
    det.terminate(left)
    msg = (f"{len(left)} process(es) started by this test session were still alive at its end (now terminated); "
           "every test must stop what it started, on failure too:\n" + "\n".join(lines))
    if hasattr(session.config, "workeroutput"):  # an xdist worker: the controller reports it and fails the run
        session.config.workeroutput["pdstack_leaks"] = {"count": len(left), "msg": msg}
    _report(session, len(left), msg)
