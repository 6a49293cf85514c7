"""Start and stop TEST ENGINE processes (and the real sglang-router in front of them) on 127.0.0.1.

Used by the tests (tests/sim, the smoke tools, the watchdog). Every process gets bounded start and stop timeouts and
is killed (process group) on exit, whatever happens: use it as a context manager, or stop() it in a finally.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from pathlib import Path

from pdstack.controller.plan.planner import ROUTER_PROGRAM
from pdstack.errors import PdstackError

LOCALHOST = "127.0.0.1"


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((LOCALHOST, 0))
        return s.getsockname()[1]


def _answers(port: int) -> bool:
    """Something accepts connections on loopback `port`."""
    try:
        with socket.create_connection((LOCALHOST, port), timeout=0.2):
            return True
    except OSError:
        return False


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
        log = Path(log_dir) / f"sim-{role}-{self.port}.log"
        while log.exists():  # a restart on the same port keeps the earlier log
            log = log.with_name(log.stem + "+.log")
        super().__init__(f"sim {role}:{self.port}", argv, log)

    def fault(self, **changes) -> dict:
        status, body = http_post_json(self.url + "/_sim/fault", changes)
        if status != 200:
            raise PdstackError(f"{self.name}: POST /_sim/fault {changes} -> {status} {body}")
        return body


# the plan's router launcher (pdstack.controller.plan.planner.ROUTER_PROGRAM: upstream's, without importing sglang)
ROUTER_LAUNCHER = [sys.executable, "-c", ROUTER_PROGRAM]


class RouterProcess(ServerProcess):
    """The real sglang-router (Rust) in PD mode in front of sim workers."""

    ready_path = "/readiness"  # 200 once healthy workers are registered
    # a bound, not an expected time: on a slow 2-core machine under the whole suite's load the admission stack's
    # router has needed more than 30 s (docs/log.md); a start that works returns as soon as /readiness is 200
    ready_timeout_s = 60.0

    def __init__(self, prefills: list[SimProcess], decodes: list[SimProcess], log_dir: Path,
                 extra: list[str] | None = None, port: int | None = None, metrics_port: int | None = None):
        self.port, self.metrics_port = port or free_port(), metrics_port or free_port()
        argv = [*ROUTER_LAUNCHER, "--pd-disaggregation"]
        for p in prefills:
            argv += ["--prefill", p.url, str(p.bootstrap_port) if p.bootstrap_port else "none"]
        for d in decodes:
            argv += ["--decode", d.url]
        argv += ["--host", LOCALHOST, "--port", str(self.port), "--prometheus-host", LOCALHOST,
                 "--prometheus-port", str(self.metrics_port), "--log-level", "warn", *list(extra or [])]
        log = Path(log_dir) / f"router-{self.port}.log"
        while log.exists():  # a restart on the same port keeps the earlier log
            log = log.with_name(log.stem + "+.log")
        super().__init__(f"router:{self.port}", argv, log)


class FrontDoorProcess(ManagedProcess):
    """The real HAProxy (Debian's haproxy, master-worker in the foreground) with the config pdstack renders for
    the plan's front door, in front of a RouterProcess. `settings` override the front-door values the planner
    would give (max_concurrent_requests, queue_size, queue_timeout_secs, retry_after_secs, ...)."""

    HAPROXY = "/usr/sbin/haproxy"

    def __init__(self, router: RouterProcess, log_dir: Path, api_key: str | None = None, **settings):
        self._router, self._log_dir, self._api_key, self._settings = router, Path(log_dir), api_key, settings
        self._configure()

    def _configure(self) -> None:
        """Pick two free ports and write the config for them. `noreuseport` (test stacks only): HAProxy binds with
        SO_REUSEPORT by default, so a port another loopback stack of the same run picked would be shared silently;
        without it the second bind fails and start() picks again."""
        from pdstack.controller.render import frontdoor

        router, log_dir, api_key, settings = self._router, self._log_dir, self._api_key, self._settings
        self.port, self.metrics_port = free_port(), free_port()
        self.fd = {"bind": LOCALHOST, "port": self.port, "backend_address": LOCALHOST,
                   "backend_port": router.port, "max_concurrent_requests": 8, "queue_size": 16,
                   "queue_timeout_secs": 10, "retry_after_secs": 1, "server_timeout_secs": 60,
                   "client_timeout_secs": 60,
                   "hard_stop_after_secs": 60, "max_connections": 4096, "metrics_bind": LOCALHOST,
                   "metrics_port": self.metrics_port, **settings}
        self.config_path = Path(log_dir) / f"haproxy-{self.port}.cfg"
        key_file = None
        if api_key:  # what roles/frontdoor writes from the Vault variable
            key_file = Path(log_dir) / f"haproxy-{self.port}.keys"
            key_file.write_text(f"Bearer {api_key}\n")
            key_file.chmod(0o600)
        # the maintenance switch (an empty ACL file) and the runtime API socket, as roles/frontdoor renders them
        self.maintenance_file = Path(log_dir) / f"haproxy-{self.port}-maintenance.acl"
        self.maintenance_file.write_text("")
        # a short directory of its own: a unix socket path must stay under 108 bytes (pytest's tmp paths are long)
        self._socket_dir = Path(tempfile.mkdtemp(prefix="pdstack-haproxy-"))
        self.socket_path = self._socket_dir / "admin.sock"
        text = frontdoor.haproxy_config(self.fd, log="stdout format raw local0", stats_socket=str(self.socket_path),
                                        api_key_file=str(key_file) if key_file else None,
                                        maintenance_file=str(self.maintenance_file))
        assert "\nglobal\n" in text, text[:200]
        self.config_path.write_text(text.replace("\nglobal\n", "\nglobal\n    noreuseport\n", 1))
        if not Path(self.HAPROXY).exists():
            raise PdstackError(f"{self.HAPROXY} not found: apt-get install haproxy (./dev.sh setup does)")
        check = subprocess.run([self.HAPROXY, "-c", "-f", str(self.config_path)], capture_output=True, text=True)
        if check.returncode != 0:
            raise PdstackError(f"haproxy -c rejects {self.config_path}:\n{check.stdout}{check.stderr}")
        ManagedProcess.__init__(self, f"haproxy:{self.port}", [self.HAPROXY, "-W", "-db", "-f", str(self.config_path)],
                                log_dir / f"haproxy-{self.port}.log")

    @property
    def url(self) -> str:
        return f"http://{LOCALHOST}:{self.port}"

    @property
    def metrics_url(self) -> str:
        return f"http://{LOCALHOST}:{self.metrics_port}/metrics"

    def start(self, timeout: float = 10.0, attempts: int = 3) -> FrontDoorProcess:
        """Returns once HAProxy answers and counts the router as UP; stops it before raising otherwise. A port
        another process took between free_port() and HAProxy's bind is picked again (up to `attempts` times)."""
        super().start()
        deadline = time.monotonic() + 3
        while self.alive() and time.monotonic() < deadline and not _answers(self.metrics_port):
            time.sleep(0.05)
        if not self.alive() and "cannot bind socket" in self.log_tail() and attempts > 1:
            self.stop()
            self._configure()
            return self.start(timeout, attempts - 1)
        try:
            self.wait_http(f"http://{LOCALHOST}:{self.metrics_port}/health", timeout)
            # the router is a server HAProxy health-checks (rise 1, every 2 s): wait until it is up
            deadline = time.monotonic() + timeout
            while self.metric("haproxy_server_status", proxy="pdstack_router", state="UP") != 1:
                if time.monotonic() > deadline:
                    raise PdstackError(f"{self.name}: the router never came up as a server:\n{self.log_tail()}")
                time.sleep(0.1)
        except BaseException:
            self.stop()
            raise
        return self

    def metric(self, name: str, **labels) -> float | None:
        """One sample of HAProxy's Prometheus exporter (summed over the samples matching `labels`)."""
        from prometheus_client.parser import text_string_to_metric_families

        status, raw = http_get(self.metrics_url, timeout=5)
        if status != 200:
            raise PdstackError(f"{self.metrics_url}: {status}")
        total = None
        for fam in text_string_to_metric_families(raw.decode()):
            for s in fam.samples:
                if s.name == name and all(s.labels.get(k) == v for k, v in labels.items()):
                    total = (total or 0.0) + s.value
        return total

    def runtime(self, command: str) -> str:
        """One command on HAProxy's runtime API (its stats socket), as `socat stdio SOCKET` sends it."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
            s.settimeout(5)
            s.connect(str(self.socket_path))
            s.sendall(command.encode() + b"\n")
            out = b""
            while chunk := s.recv(65536):
                out += chunk
        return out.decode()

    def maintenance(self, on: bool) -> None:
        """The maintenance switch, as roles/serving flips it around a restart of the only server of a role."""
        from pdstack.controller.render import frontdoor

        verb = "add" if on else "del"
        out = self.runtime(f"{verb} acl {self.maintenance_file} {frontdoor.MAINTENANCE_ON}").strip()
        if out and not (not on and "not found" in out.lower()):
            raise PdstackError(f"{self.name}: {verb} acl: {out}")

    def reload(self) -> None:
        """What `systemctl reload haproxy` does to Debian's master-worker unit: SIGUSR2 to the master."""
        os.kill(self.proc.pid, signal.SIGUSR2)

    def stop(self, timeout: float = 5.0) -> int | None:
        try:
            return super().stop(timeout)
        finally:
            shutil.rmtree(self._socket_dir, ignore_errors=True)
