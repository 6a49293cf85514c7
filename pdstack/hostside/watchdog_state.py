"""The watchdog's state between timer runs, its metrics, and the hold of a planned restart (stdlib only).

pdstack/hostside/watchdog.py decides; this module keeps what it decided: the state file (failure count, restart
history, alert; JSON, written atomically), the same state as node_exporter textfile metrics (`pdstack_watchdog_*`),
and `read_hold`, which reads the hold file a rolling restart writes (pdstack/hostside/drain.py `hold`; the watchdog's
docstring says why a planned restart holds it). roles/watchdog installs it beside watchdog.py and probe.py.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pdstack.hostside import atomic

log = logging.getLogger("pdstack.hostside.watchdog")

HOUR_S = 3600.0


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
    held_until: float = 0.0  # the hold that stood at the last run (0: none)
    held_reason: str = ""

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
        atomic.write(path, json.dumps(asdict(self), indent=1) + "\n")


# The longest hold one planned restart may write (drain.py `hold` refuses more); a file that reaches further is not
# a planned restart's, and the watchdog ignores it.
MAX_HOLD_S = 6 * 3600


def read_hold(path: str, now: float) -> tuple[float, str] | None:
    """The hold a planned restart wrote (pdstack/hostside/drain.py `hold`): (until, reason) while it stands, else
    None. A lapsed, unreadable or implausible file is no hold (logged): a bad file must not silence the watchdog."""
    if not path:
        return None
    try:
        data = json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        log.warning("hold file %s unreadable (%s); not held", path, e)
        return None
    until = data.get("until") if isinstance(data, dict) else None
    if isinstance(until, bool) or not isinstance(until, int | float) or until != until:
        log.warning("hold file %s has no numeric \"until\"; not held", path)
        return None
    if until <= now:
        # a play stopped before it released the hold: said once, then the file goes
        log.warning("hold file %s lapsed %.0f s ago (%s) without a release; removed, not held", path, now - until,
                    _printable(data.get("reason", "")))
        with contextlib.suppress(OSError):
            os.unlink(path)
        return None
    if until - now > MAX_HOLD_S:
        log.warning("hold file %s reaches %.0f s ahead, more than %d s; not held", path, until - now, MAX_HOLD_S)
        return None
    return float(until), _printable(data.get("reason", ""))


def _printable(reason: object) -> str:
    # the reason goes to the journal and the metrics' state file: one line, no control characters, bounded
    return "".join(c if c.isprintable() else " " for c in str(reason))[:200]


def textfile(st: State, max_restarts_per_hour: int, now: float) -> str:
    """The state as node_exporter's textfile collector reads it (pdstack_watchdog_*)."""
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
        f"pdstack_watchdog_max_restarts_per_hour {max_restarts_per_hour}",
        "# HELP pdstack_watchdog_restarts_total Unit restarts by the watchdog (since its state was reset).",
        "# TYPE pdstack_watchdog_restarts_total counter",
        *[f'pdstack_watchdog_restarts_total{{unit="{u}"}} {n}' for u, n in sorted(st.restarts_total.items())],
        "# HELP pdstack_watchdog_held 1 when a planned restart held the last run (no probe, no restart).",
        "# TYPE pdstack_watchdog_held gauge",
        f"pdstack_watchdog_held {1 if st.held_until > now else 0}",
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
