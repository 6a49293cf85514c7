"""The watchdog against sim prefill + decode behind the real router: a decode wedge (/health 200) is found by the
probe and fixed by restarting decode; a permanent fault costs at most R restarts. "Service control" restarts the
sim process on the same port (what `systemctl restart pdstack-server-<name>.service` does on a host)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "sim"))
from sim_helpers import FAST, start_pd  # noqa: E402

from pdstack.hostside import probe, watchdog  # noqa: E402
from pdstack.testing.sim.launch import SimProcess, http_get  # noqa: E402

pytestmark = pytest.mark.slow


class SimServices:
    """Restart = stop the sim process, start a new one on the same ports with the same flags (faults reset). The new
    process replaces the old in the PDStack, whose cleanup (start_pd's ExitStack) stops it."""

    def __init__(self, stack, tmp_path, permanent_decode_fault: dict | None = None):
        self.stack, self.tmp_path, self.permanent = stack, tmp_path, permanent_decode_fault
        self.restarted: list[str] = []

    def restart(self, unit: str) -> tuple[bool, str]:
        self.restarted.append(unit)
        role = "decode" if "decode" in unit else "prefill"
        old = getattr(self.stack, role)
        old.stop()
        new = SimProcess(role, self.tmp_path, list(FAST), port=old.port, bootstrap_port=old.bootstrap_port)
        setattr(self.stack, role, new)  # before start: the PDStack's cleanup stops whatever it holds
        new.start()
        if self.permanent and role == "decode":
            new.fault(**self.permanent)
        return True, ""


def config(s, tmp_path, **over) -> watchdog.Config:
    return watchdog.Config.from_dict({
        "router_url": s.router.url,
        "servers": [{"name": "prefill-0", "role": "prefill", "url": s.prefill.url,
                     "unit": "pdstack-server-prefill-0.service"},
                    {"name": "decode-0", "role": "decode", "url": s.decode.url,
                     "unit": "pdstack-server-decode-0.service"}],
        "failures_before_restart": 2, "max_restarts_per_hour": 2, "ready_timeout_s": 30, "ready_poll_s": 0.2,
        "probe_first_token_timeout_s": 1.5, "probe_stall_timeout_s": 1.0, "probe_timeout_s": 10,
        "state_file": str(tmp_path / "state.json"), "textfile": str(tmp_path / "pdstack_watchdog.prom"), **over})


def test_wedged_decode_is_restarted_and_the_probe_passes_again(tmp_path):
    stack, s = start_pd(tmp_path, router_extra=["--request-timeout-secs", "10"])
    with stack:
        cfg = config(s, tmp_path)
        svc = SimServices(s, tmp_path)
        assert watchdog.run_once(cfg, services=svc) == watchdog.EXIT_OK
        s.decode.fault(wedge_decode=True)
        assert http_get(s.decode.url + "/health")[0] == 200  # /health does not see it
        assert watchdog.run_once(cfg, services=svc) == watchdog.EXIT_FAILING  # 1 of K=2
        state = json.loads((tmp_path / "state.json").read_text())
        assert state["last_probe_code"] == probe.DECODE and state["consecutive_failures"] == 1
        assert watchdog.run_once(cfg, services=svc) == watchdog.EXIT_RECOVERED
        assert svc.restarted == ["pdstack-server-decode-0.service"]  # decode only; prefill untouched
        assert probe.probe(s.router.url, first_token_timeout=3).ok
        prom = (tmp_path / "pdstack_watchdog.prom").read_text()
        assert "pdstack_watchdog_probe_ok 1" in prom
        assert 'pdstack_watchdog_restarts_total{unit="pdstack-server-decode-0.service"} 1' in prom


def test_permanent_fault_does_not_cause_a_restart_storm(tmp_path):
    stack, s = start_pd(tmp_path, router_extra=["--request-timeout-secs", "10"])
    with stack:
        cfg = config(s, tmp_path, failures_before_restart=1)
        svc = SimServices(s, tmp_path, permanent_decode_fault={"fail_transfer": True})
        s.decode.fault(fail_transfer=True)
        codes = [watchdog.run_once(cfg, services=svc) for _ in range(5)]
        assert len(svc.restarted) == cfg.max_restarts_per_hour == 2, svc.restarted
        assert codes[-1] == watchdog.EXIT_ALERT
        assert "pdstack_watchdog_alert 1" in (tmp_path / "pdstack_watchdog.prom").read_text()
