"""Start and stop TEST ENGINE processes (and the real sglang-router in front of them) on 127.0.0.1.

Used by the tests (tests/sim, the smoke tools, the watchdog). Every process gets bounded start and stop timeouts and
is killed (process group) on exit, whatever happens: use it as a context manager, or stop() it in a finally.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

from pdstack.errors import PdstackError

LOCALHOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def http_get(url: str, timeout: float = 2.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (local URLs only)
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def http_post_json(url: str, body: dict, timeout: float = 10.0) -> tuple[int, dict | str]:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310
            status, raw = r.status, r.read()
    except urllib.error.HTTPError as e:
        status, raw = e.code, e.read()
    try:
        return status, json.loads(raw)
    except ValueError:
        return status, raw.decode("utf-8", "replace")


class ManagedProcess:
    """A child process in its own process group, with its output in a log file. A context manager: leaving the
    `with` block stops it, however the block ends."""

    def __init__(self, name: str, argv: list[str], log_path: Path, env: dict | None = None):
        self.name, self.argv, self.log_path = name, argv, Path(log_path)
        self.env = env
        self.proc: subprocess.Popen | None = None
        self._log = None
        self._stopped = False

    def __enter__(self) -> ManagedProcess:
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def start(self) -> ManagedProcess:
        self._log = open(self.log_path, "wb")  # noqa: SIM115 (closed in stop)
        self._stopped = False
        self.proc = subprocess.Popen(self.argv, stdout=self._log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                     start_new_session=True, env=self.env)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def log_tail(self, n: int = 40) -> str:
        try:
            lines = self.log_path.read_text("utf-8", "replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])

    def wait_http(self, url: str, timeout: float, ok=(200,)) -> None:
        deadline = time.monotonic() + timeout
        last = None
        while time.monotonic() < deadline:
            if not self.alive():
                raise PdstackError(f"{self.name} exited with {self.proc.returncode} while starting:\n{self.log_tail()}")
            try:
                status, _ = http_get(url, timeout=1.0)
                if status in ok:
                    return
                last = status
            except OSError as e:
                last = e
            time.sleep(0.1)
        raise PdstackError(f"{self.name} not ready at {url} after {timeout:g}s (last: {last}):\n{self.log_tail()}")

    def stop(self, timeout: float = 5.0) -> int | None:
        """SIGTERM the process group, SIGKILL it after `timeout`; returns the exit code. A second call does nothing
        (the group's id may belong to someone else by then)."""
        if self.proc is None or self._stopped:
            return None if self.proc is None else self.proc.returncode
        self._stopped = True
        if self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(timeout)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(5)
        else:  # the leader is gone; make sure nothing it started lingers
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, signal.SIGKILL)
        if self._log is not None:
            self._log.close()
        return self.proc.returncode


class ServerProcess(ManagedProcess):
    """A ManagedProcess serving HTTP on 127.0.0.1:`port`. start() returns once GET `ready_path` answers 200; when it
    does not (exit, timeout), start() stops the process before it raises."""

    ready_path = "/"
    ready_timeout_s = 20.0
    port: int

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    def start(self, timeout: float | None = None) -> ServerProcess:
        super().start()
        try:
            self.wait_http(self.url + self.ready_path, self.ready_timeout_s if timeout is None else timeout)
        except BaseException:
            self.stop()
            raise
        return self


class SimProcess(ServerProcess):
    """One `pdstack sim` process. role: prefill | decode | mono."""

    ready_path = "/server_info"

    def __init__(self, role: str, log_dir: Path, extra: list[str] | None = None, port: int | None = None,
                 bootstrap_port: int | None = None):
        self.role = role
        self.port = port or free_port()
        self.bootstrap_port = bootstrap_port or (free_port() if role == "prefill" else None)
        mode = {"prefill": "prefill", "decode": "decode", "mono": "null"}[role]
        argv = [sys.executable, "-m", "pdstack", "sim", "--host", LOCALHOST, "--port", str(self.port),
                "--disaggregation-mode", mode, "--enable-metrics"]
        if self.bootstrap_port is not None:
            argv += ["--disaggregation-bootstrap-port", str(self.bootstrap_port)]
        argv += list(extra or [])
        super().__init__(f"sim {role}:{self.port}", argv, Path(log_dir) / f"sim-{role}-{self.port}.log")

    def fault(self, **changes) -> dict:
        status, body = http_post_json(self.url + "/_sim/fault", changes)
        if status != 200:
            raise PdstackError(f"{self.name}: POST /_sim/fault {changes} -> {status} {body}")
        return body


class RouterProcess(ServerProcess):
    """The real sglang-router (Rust) in PD mode in front of sim workers."""

    ready_path = "/readiness"  # 200 once healthy workers are registered
    ready_timeout_s = 30.0

    def __init__(self, prefills: list[SimProcess], decodes: list[SimProcess], log_dir: Path,
                 extra: list[str] | None = None):
        self.port, self.metrics_port = free_port(), free_port()
        argv = [sys.executable, "-m", "sglang_router.launch_router", "--pd-disaggregation"]
        for p in prefills:
            argv += ["--prefill", p.url, str(p.bootstrap_port) if p.bootstrap_port else "none"]
        for d in decodes:
            argv += ["--decode", d.url]
        argv += ["--host", LOCALHOST, "--port", str(self.port), "--prometheus-host", LOCALHOST,
                 "--prometheus-port", str(self.metrics_port), "--log-level", "warn", *list(extra or [])]
        super().__init__(f"router:{self.port}", argv, Path(log_dir) / f"router-{self.port}.log")
