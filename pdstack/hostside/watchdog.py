"""`pdstack watchdog`: un-wedge a PD deployment whose /health still says 200.

A wedged decode keeps answering /health with 200 (docs/facts.md#the-deployment, Liveness), so neither systemd nor
the router notices it. A systemd timer on the router host runs one watchdog step every interval
(`pdstack-watchdog.timer` -> a oneshot service, so runs never overlap). Each step:

 1. runs the deep probe (pdstack/hostside/probe.py) through the router;
 2. pass: resets the failure count (and clears an alert);
 3. fail with a stage a restart can fix (13 prefill/transfer, 14 decode, 15 aborted, 12 http-error, 16 wrong-answer):
    counts it. After K consecutive failures (`failures_before_restart`), and only while every server's /health says
    200 (a server that is down or starting is systemd's and the serving role's business, not ours), it restarts the
    decode units, waits for their /health and the router's /readiness, probes again; still failing, it does the same
    with the prefill units. Router down (10) and admission refusals (11, busy) never restart anything.
 4. backoff: at most R unit restarts in any hour (`max_restarts_per_hour`). A restart that would exceed it is not done:
    the watchdog raises its alert (`pdstack_watchdog_alert 1`) and stops restarting until a probe passes again or an
    operator runs `pdstack watchdog --reset`. So a permanent fault costs R restarts, then an alert, never a storm.

State (failure count, restart times, alert) persists in a JSON file between timer runs; metrics go to node_exporter's
textfile collector (`pdstack_watchdog_*`, written atomically); every action is logged (stderr -> the journal).

It runs with the router host's own python3 (stdlib only: this module + pdstack/hostside/probe.py, installed by
roles/watchdog into /usr/local/lib/pdstack/python), not in the serving image: it must reach systemctl on the host to
restart pdstack-server-<name>.service, and it must work exactly when the serving containers do not.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

from pdstack.hostside import probe as probe_mod

log = logging.getLogger("pdstack.hostside.watchdog")

HOUR_S = 3600.0
# exit codes of `pdstack watchdog` (one step)
EXIT_OK, EXIT_FAILING, EXIT_RESTARTED, EXIT_RECOVERED, EXIT_ALERT, EXIT_CONFIG = 0, 1, 3, 0, 4, 2
# Probe results a restart of the servers can fix. Not: router down (10) and admission refusals (11: busy).
RESTART_STAGES = frozenset({probe_mod.HTTP_ERROR, probe_mod.PREFILL_TRANSFER, probe_mod.DECODE, probe_mod.ABORTED,
                            probe_mod.WRONG_ANSWER})


class Clock(Protocol):
    def time(self) -> float: ...
    def sleep(self, s: float) -> None: ...


class RealClock:
    def time(self) -> float:
        return time.time()

    def sleep(self, s: float) -> None:
        time.sleep(s)


class Services(Protocol):
    def restart(self, unit: str) -> tuple[bool, str]: ...


class Systemctl:
    """Restarts units with systemctl (the watchdog runs as root on the router host). A server on another host
    carries its own restart_argv (e.g. ssh HOST systemctl restart UNIT)."""

    def __init__(self, systemctl: str = "/bin/systemctl", timeout_s: float = 600.0,
                 argv_by_unit: dict[str, list[str]] | None = None):
        self.systemctl, self.timeout_s = systemctl, timeout_s
        self.argv_by_unit = argv_by_unit or {}

    def restart(self, unit: str) -> tuple[bool, str]:
        argv = self.argv_by_unit.get(unit) or [self.systemctl, "restart", unit]
        try:
            p = subprocess.run(argv, capture_output=True, text=True,
                               timeout=self.timeout_s, check=False)
        except (OSError, subprocess.TimeoutExpired) as e:
            return False, str(e)
        return p.returncode == 0, (p.stderr or p.stdout).strip()


def http_status(url: str, timeout: float = 5.0) -> int | None:
    """GET url -> HTTP status; None when nothing answers."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (deployment URLs)
            return r.status
    except urllib.error.HTTPError as e:
        return e.code
    except (OSError, urllib.error.URLError, ValueError):
        return None


@dataclass
class Server:
    name: str
    role: str  # prefill | decode
    url: str
    unit: str
    restart_argv: list[str] | None = None  # default: systemctl restart UNIT on this host


@dataclass
class Config:
    router_url: str
    servers: list[Server]
    failures_before_restart: int = 3  # K
    max_restarts_per_hour: int = 3  # R (unit restarts in any 3600 s)
    ready_timeout_s: float = 1800.0  # after a restart: /health 200 and router /readiness 200 within this
    ready_poll_s: float = 5.0
    probe_first_token_timeout_s: float = 60.0
    probe_stall_timeout_s: float = 15.0
    probe_timeout_s: float = 120.0
    state_file: str = "/var/lib/pdstack/watchdog.json"
    textfile: str = "/var/lib/prometheus/node-exporter/pdstack_watchdog.prom"

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Config:
        d = {k: v for k, v in d.items() if not k.startswith("_")}  # "_comment": the ansible_managed line
        servers = [Server(**s) for s in d.pop("servers", [])]
        known = set(cls.__dataclass_fields__) - {"servers"}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown watchdog config keys {unknown}; known: {sorted(known)}")
        cfg = cls(servers=servers, **d)
        if not any(s.role == "decode" for s in servers) or not cfg.router_url:
            raise ValueError("watchdog config needs router_url and at least one decode server")
        if cfg.failures_before_restart < 1 or cfg.max_restarts_per_hour < 0:
            raise ValueError("failures_before_restart must be >= 1 and max_restarts_per_hour >= 0")
        return cfg


@dataclass
class State:
    consecutive_failures: int = 0
    restarts: list[list] = field(default_factory=list)  # [timestamp, unit] of every restart in the last hour
    restarts_total: dict[str, int] = field(default_factory=dict)
    alert: bool = False
    alert_reason: str = ""
    last_probe_code: int | None = None
    last_probe_stage: str = ""
    last_probe_message: str = ""
    last_probe_ttft_s: float | None = None
    last_run: float = 0.0
    last_restart: float = 0.0
    last_recovery: float = 0.0

    @classmethod
    def load(cls, path: str) -> State:
        try:
            data = json.loads(Path(path).read_text())
            return cls(**{k: v for k, v in data.items() if k in cls.__dataclass_fields__})
        except FileNotFoundError:
            return cls()
        except (OSError, ValueError, TypeError) as e:
            log.warning("watchdog state %s unreadable (%s); starting fresh", path, e)
            return cls()

    def save(self, path: str) -> None:
        _atomic_write(path, json.dumps(asdict(self), indent=1) + "\n")


def _atomic_write(path: str, text: str) -> None:
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    try:
        with os.fdopen(fd, "w") as f:
            f.write(text)
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise


ProbeFn = Callable[[], probe_mod.ProbeResult]
HealthFn = Callable[[str], "int | None"]


class Watchdog:
    def __init__(self, cfg: Config, *, probe: ProbeFn | None = None, health: HealthFn | None = None,
                 services: Services | None = None, clock: Clock | None = None, state: State | None = None):
        self.cfg = cfg
        self.clock = clock or RealClock()
        self.services = services or Systemctl(argv_by_unit={s.unit: s.restart_argv for s in cfg.servers
                                                            if s.restart_argv})
        self.health = health or http_status
        self.state = state if state is not None else State()
        decode_urls = [s.url for s in cfg.servers if s.role == "decode"]
        prefill_urls = [s.url for s in cfg.servers if s.role == "prefill"]
        self.probe = probe or (lambda: probe_mod.probe(
            cfg.router_url, first_token_timeout=cfg.probe_first_token_timeout_s,
            stall_timeout=cfg.probe_stall_timeout_s, total_timeout=cfg.probe_timeout_s,
            prefill=prefill_urls, decode=decode_urls))

    # ---------------------------------------------------------------- one timer run
    def step(self) -> int:
        """One probe and what follows from it. Returns the exit code (see EXIT_*)."""
        st, cfg = self.state, self.cfg
        now = self.clock.time()
        st.last_run = now
        st.restarts = [r for r in st.restarts if now - r[0] < HOUR_S]
        res = self._probe()
        if res.ok:
            if st.consecutive_failures or st.alert:
                log.info("probe passes again after %d failure(s)%s", st.consecutive_failures,
                         "; alert cleared" if st.alert else "")
            st.consecutive_failures, st.alert, st.alert_reason = 0, False, ""
            return EXIT_OK
        if res.code not in RESTART_STAGES:
            st.consecutive_failures = 0  # not the servers' fault: do not build up towards a restart
            log.warning("probe failed at %s (exit %d): %s; no restart for this stage", res.stage, res.code,
                        res.message)
            return EXIT_FAILING
        st.consecutive_failures += 1
        log.warning("probe failed at %s (exit %d), %d/%d: %s", res.stage, res.code, st.consecutive_failures,
                    cfg.failures_before_restart, res.message)
        if st.consecutive_failures < cfg.failures_before_restart:
            return EXIT_FAILING
        if st.alert:
            log.error("ALERT stands (%s): not restarting; fix it, then `pdstack watchdog --reset`", st.alert_reason)
            return EXIT_ALERT
        unhealthy = {s.name: self.health(s.url.rstrip("/") + "/health") for s in cfg.servers}
        unhealthy = {n: c for n, c in unhealthy.items() if c != 200}
        if unhealthy:
            log.warning("not restarting: /health is not 200 on %s; a server that is down or starting is left to "
                        "systemd (Restart=on-failure) and the serving role",
                        ", ".join(f"{n} ({c or 'no answer'})" for n, c in unhealthy.items()))
            return EXIT_FAILING
        return self._recover()

    def _probe(self) -> probe_mod.ProbeResult:
        res = self.probe()
        st = self.state
        st.last_probe_code, st.last_probe_stage, st.last_probe_message = res.code, res.stage, res.message
        st.last_probe_ttft_s = res.ttft_s
        return res

    def _recover(self) -> int:
        """Restart decode, then prefill, each followed by readiness waits and a probe; stop when a probe passes."""
        cfg, st = self.cfg, self.state
        for role in ("decode", "prefill"):
            units = [s for s in cfg.servers if s.role == role]
            if not units:
                continue
            for s in units:
                if len(st.restarts) >= cfg.max_restarts_per_hour:
                    st.alert = True
                    st.alert_reason = (f"{len(st.restarts)} restart(s) in the last hour reached "
                                       f"max_restarts_per_hour {cfg.max_restarts_per_hour}; last probe: "
                                       f"{st.last_probe_stage}: {st.last_probe_message}")
                    log.error("ALERT: giving up restarts: %s", st.alert_reason)
                    return EXIT_ALERT
                self._restart(s)
            if not self._wait_ready(units):
                return EXIT_RESTARTED
            res = self._probe()
            if res.ok:
                st.consecutive_failures = 0
                st.last_recovery = self.clock.time()
                log.info("recovered: probe passes after restarting %s (%s)", role,
                         ", ".join(s.unit for s in units))
                return EXIT_RECOVERED
            log.warning("probe still fails after restarting %s: %s (exit %d): %s", role, res.stage, res.code,
                        res.message)
        return EXIT_RESTARTED

    def _restart(self, s: Server) -> None:
        now = self.clock.time()
        st = self.state
        log.warning("restarting %s (%s %s): probe failed %d times in a row while /health says 200",
                    s.unit, s.role, s.name, st.consecutive_failures)
        ok, detail = self.services.restart(s.unit)
        st.restarts.append([now, s.unit])
        st.restarts_total[s.unit] = st.restarts_total.get(s.unit, 0) + 1
        st.last_restart = now
        if not ok:
            log.error("systemctl restart %s failed: %s", s.unit, detail)

    def _wait_ready(self, servers: list[Server]) -> bool:
        deadline = self.clock.time() + self.cfg.ready_timeout_s
        pending = [s.url.rstrip("/") + "/health" for s in servers] + [self.cfg.router_url.rstrip("/") + "/readiness"]
        while pending:
            pending = [u for u in pending if self.health(u) != 200]
            if not pending:
                break
            if self.clock.time() >= deadline:
                log.error("not ready %gs after the restart: %s", self.cfg.ready_timeout_s, ", ".join(pending))
                return False
            self.clock.sleep(self.cfg.ready_poll_s)
        log.info("ready: %s /health 200, router /readiness 200", ", ".join(s.name for s in servers))
        return True

    # ---------------------------------------------------------------- metrics
    def textfile(self) -> str:
        st, now = self.state, self.clock.time()
        recent = len([r for r in st.restarts if now - r[0] < HOUR_S])
        lines = [
            "# HELP pdstack_watchdog_probe_ok 1 when the last deep probe passed.",
            "# TYPE pdstack_watchdog_probe_ok gauge",
            f"pdstack_watchdog_probe_ok {1 if st.last_probe_code == 0 else 0}",
            "# HELP pdstack_watchdog_probe_exit_code Exit code of the last probe (0 ok, 13 prefill/transfer, "
            "14 decode, ...).",
            "# TYPE pdstack_watchdog_probe_exit_code gauge",
            f"pdstack_watchdog_probe_exit_code {st.last_probe_code if st.last_probe_code is not None else -1}",
            "# HELP pdstack_watchdog_probe_ttft_seconds Time to first token of the last probe.",
            "# TYPE pdstack_watchdog_probe_ttft_seconds gauge",
            f"pdstack_watchdog_probe_ttft_seconds {st.last_probe_ttft_s if st.last_probe_ttft_s is not None else -1}",
            "# HELP pdstack_watchdog_consecutive_failures Probe failures in a row.",
            "# TYPE pdstack_watchdog_consecutive_failures gauge",
            f"pdstack_watchdog_consecutive_failures {st.consecutive_failures}",
            "# HELP pdstack_watchdog_restarts_last_hour Unit restarts by the watchdog in the last hour.",
            "# TYPE pdstack_watchdog_restarts_last_hour gauge",
            f"pdstack_watchdog_restarts_last_hour {recent}",
            "# HELP pdstack_watchdog_max_restarts_per_hour The restart budget; at it, the watchdog alerts and stops.",
            "# TYPE pdstack_watchdog_max_restarts_per_hour gauge",
            f"pdstack_watchdog_max_restarts_per_hour {self.cfg.max_restarts_per_hour}",
            "# HELP pdstack_watchdog_restarts_total Unit restarts by the watchdog (since its state was reset).",
            "# TYPE pdstack_watchdog_restarts_total counter",
            *[f'pdstack_watchdog_restarts_total{{unit="{u}"}} {n}' for u, n in sorted(st.restarts_total.items())],
            "# HELP pdstack_watchdog_alert 1 when the watchdog gave up restarting (budget spent); needs a person.",
            "# TYPE pdstack_watchdog_alert gauge",
            f"pdstack_watchdog_alert {1 if st.alert else 0}",
            "# HELP pdstack_watchdog_last_run_timestamp_seconds When the watchdog last ran.",
            "# TYPE pdstack_watchdog_last_run_timestamp_seconds gauge",
            f"pdstack_watchdog_last_run_timestamp_seconds {st.last_run:.3f}",
            "# HELP pdstack_watchdog_last_restart_timestamp_seconds When it last restarted a unit (0: never).",
            "# TYPE pdstack_watchdog_last_restart_timestamp_seconds gauge",
            f"pdstack_watchdog_last_restart_timestamp_seconds {st.last_restart:.3f}",
        ]
        return "\n".join(lines) + "\n"


def run_once(cfg: Config, **kw) -> int:
    """Load state, one step, save state and metrics (also when the step raised)."""
    wd = Watchdog(cfg, state=State.load(cfg.state_file), **kw)
    try:
        return wd.step()
    finally:
        wd.state.save(cfg.state_file)
        if cfg.textfile:
            try:
                _atomic_write(cfg.textfile, wd.textfile())
            except OSError as e:
                log.error("cannot write %s: %s", cfg.textfile, e)


def register(p: argparse.ArgumentParser) -> None:
    p.add_argument("--config", required=True, help="watchdog JSON (roles/watchdog renders /etc/pdstack/watchdog.json)")
    p.add_argument("--reset", action="store_true", help="clear the failure count, restart history and alert, then exit")
    p.add_argument("--loop", type=float, default=0, metavar="S",
                   help="run a step every S seconds for --count steps (the timer is the normal way; for tests)")
    p.add_argument("--count", type=int, default=1, help="steps with --loop (bounded; default 1)")
    p.epilog = ("exit codes: 0 ok or recovered, 1 probe failing (no restart yet or not restartable), 2 bad config, "
                "3 restarted but still failing, 4 alert: restart budget spent, gave up")


def run(args: argparse.Namespace) -> int:
    logging.basicConfig(level=logging.INFO, format="pdstack-watchdog: %(levelname)s %(message)s", stream=sys.stderr)
    try:
        cfg = Config.from_dict(json.loads(Path(args.config).read_text()))
    except (OSError, ValueError, TypeError) as e:
        log.error("bad config %s: %s", args.config, e)
        return EXIT_CONFIG
    if args.reset:
        State().save(cfg.state_file)
        log.info("state reset (%s)", cfg.state_file)
        return EXIT_OK
    code = EXIT_OK
    for i in range(max(1, args.count if args.loop else 1)):
        if i:
            time.sleep(args.loop)
        code = run_once(cfg)
    return code


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="pdstack-watchdog", allow_abbrev=False)
    register(p)
    return run(p.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())


def worst_case_restart_s(*, interval_s: float, failures_before_restart: int, first_token_timeout_s: float,
                         stall_timeout_s: float, servers: int, timer_accuracy_s: float = 5.0,
                         health_timeout_s: float = 5.0) -> float:
    """Upper bound, seconds, from a server wedging (its /health still 200) to the watchdog restarting it.

    Worst case: the wedge comes just after a run's probe passed. The timer (OnUnitActiveSec, a oneshot, so runs never
    overlap) starts the next run at most interval + AccuracySec after the previous one ended; a probe through a wedge
    fails within max(first-token, stall) timeout; the K-th failing run then checks every server's /health (each
    within health_timeout_s) and restarts. So K x (interval + accuracy + max(first token, stall)) + servers x health.
    The restart itself (the unit's stop + start) and the server's load time come on top (docs/failure.md,
    "Wedge to watchdog restart")."""
    fail_s = max(first_token_timeout_s, stall_timeout_s)
    return failures_before_restart * (interval_s + timer_accuracy_s + fail_s) + servers * health_timeout_s
