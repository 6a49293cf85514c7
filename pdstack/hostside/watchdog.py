"""`pdstack watchdog`: un-wedge a PD deployment whose /health still says 200.

A wedged decode keeps answering /health with 200 (docs/facts.md#the-deployment, Liveness), so neither systemd nor
the router notices it. A systemd timer on the router host runs one watchdog step every interval
(`pdstack-watchdog.timer` -> a oneshot service, so runs never overlap). Each step:

 1. runs the deep probe (pdstack/hostside/probe.py) through the router;
 2. pass: resets the failure count (and clears an alert);
 3. fail with a stage a restart can fix (13 prefill/transfer, 14 decode, 15 aborted, 12 http-error, 16 wrong-answer):
    counts it, but only while every server's /health says 200 (a server that is down or starting is systemd's and
    the serving role's business, not ours: its failure resets the count). After K consecutive counted failures
    (`failures_before_restart`) it restarts the decode units, waits for their /health and the router's /readiness,
    probes again; still failing, it does the same with the prefill units. Router down (10) and admission refusals
    (11, busy) never restart anything.
 4. backoff: at most R unit restarts in any hour (`max_restarts_per_hour`). A restart that would exceed it is not done:
    the watchdog raises its alert (`pdstack_watchdog_alert 1`) and stops restarting until a probe passes again or an
    operator runs `pdstack watchdog --reset`. So a permanent fault costs R restarts, then an alert, never a storm.

Since a server that is down resets the count, after a crash (systemd restarts the server) the watchdog needs K fresh
failures before it acts, not one probe sent before the router has taken the server back.

A planned restart (roles/serving's rolling restart) holds the watchdog: the serving role writes the plan's
`rollout.watchdog_hold_file` ({"until": epoch, "reason"}; pdstack/hostside/drain.py `mode --hold-*`, or `hold`)
before it drains a server and removes it once the server serves again (`finish`, or `release`); while it stands (at
most until its `until`, so a play killed half way holds nothing for long) a step neither probes nor restarts and
clears the count. Without it, the probes sent while the only prefill restarts fail (the router's 502 "Prefill server
error", seen in the journal of tests/test_site_rollouts.py's host) and count towards restarting the decodes, then
the prefill, behind the back of a rollout that believes it is done.

State (failure count, restart times, alert) persists in a JSON file between timer runs; metrics go to node_exporter's
textfile collector (`pdstack_watchdog_*`, written atomically; both in pdstack/hostside/watchdog_state.py, with the
hold file's reader); every action is logged (stderr -> the journal).

It runs with the router host's own python3 (stdlib only: this module, watchdog_state.py and probe.py, installed by
roles/watchdog into /usr/local/lib/pdstack/python), not in the serving image: it must reach systemctl on the host to
restart pdstack-server-<name>.service, and it must work exactly when the serving containers do not.
"""

from __future__ import annotations

import argparse
import json
import logging
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pdstack.hostside import atomic
from pdstack.hostside import probe as probe_mod
from pdstack.hostside.watchdog_state import HOUR_S, State, read_hold, textfile

log = logging.getLogger("pdstack.hostside.watchdog")

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
    hold_file: str = ""  # the plan's rollout.watchdog_hold_file; "" = never held

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
        if self._held(now):
            return EXIT_OK
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
        unhealthy = {s.name: self.health(s.url.rstrip("/") + "/health") for s in cfg.servers}
        unhealthy = {n: c for n, c in unhealthy.items() if c != 200}
        if unhealthy:
            st.consecutive_failures = 0
            log.warning("probe failed at %s (exit %d): %s; not counted: /health is not 200 on %s (a server that is "
                        "down or starting is left to systemd's Restart=on-failure and the serving role; the count "
                        "starts again once all answer 200)", res.stage, res.code, res.message,
                        ", ".join(f"{n} ({c or 'no answer'})" for n, c in unhealthy.items()))
            return EXIT_FAILING
        st.consecutive_failures += 1
        log.warning("probe failed at %s (exit %d), %d/%d: %s", res.stage, res.code, st.consecutive_failures,
                    cfg.failures_before_restart, res.message)
        if st.consecutive_failures < cfg.failures_before_restart:
            return EXIT_FAILING
        if st.alert:
            log.error("ALERT stands (%s): not restarting; fix it, then `pdstack watchdog --reset`", st.alert_reason)
            return EXIT_ALERT
        if self._held(self.clock.time()):  # a rolling restart began while this step probed
            return EXIT_OK
        return self._recover()

    def _held(self, now: float) -> bool:
        """A planned restart holds the watchdog (read_hold): no probe, no restart, the count cleared."""
        st = self.state
        hold = read_hold(self.cfg.hold_file, now)
        st.held_until, st.held_reason = hold if hold else (0.0, "")
        if hold:
            if st.consecutive_failures:
                log.info("failure count %d cleared", st.consecutive_failures)
            st.consecutive_failures = 0
            log.info("held for %.0f s more by a planned restart (%s): no probe, no restart", hold[0] - now, hold[1])
        return hold is not None

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

def run_once(cfg: Config, **kw) -> int:
    """Load state, one step, save state and metrics (also when the step raised)."""
    wd = Watchdog(cfg, state=State.load(cfg.state_file), **kw)
    try:
        return wd.step()
    finally:
        wd.state.save(cfg.state_file)
        if cfg.textfile:
            try:
                atomic.write(cfg.textfile, textfile(wd.state, cfg.max_restarts_per_hour, wd.clock.time()))
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
    fails within max(first-token, stall) timeout; each failing run then checks every server's /health (each within
    health_timeout_s) before it counts the failure, and the K-th restarts. So
    K x (interval + accuracy + max(first token, stall) + servers x health).
    The restart itself (the unit's stop + start) and the server's load time come on top (docs/failure.md,
    "Wedge to watchdog restart")."""
    fail_s = max(first_token_timeout_s, stall_timeout_s)
    return failures_before_restart * (interval_s + timer_accuracy_s + fail_s + servers * health_timeout_s)
