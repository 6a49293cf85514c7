"""The watchdog's decisions with a fake clock, fake probe, fake /health and fake service control (no processes)."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from pdstack.hostside import drain, watchdog_state
from pdstack.hostside import probe as P
from pdstack.hostside import watchdog as W
from pdstack.hostside.watchdog_state import read_hold


class FakeClock:
    def __init__(self, t: float = 1_000_000.0):
        self.t = t

    def time(self) -> float:
        return self.t

    def sleep(self, s: float) -> None:
        self.t += s


class World:
    """The deployment as the watchdog sees it: a probe outcome, /health codes, and units it may restart."""

    def __init__(self, clock: FakeClock):
        self.clock = clock
        self.wedged = False  # decode wedge: probe fails at stage decode until decode restarts
        self.permanent = False  # a fault no restart fixes
        self.health_codes: dict[str, int | None] = {}
        self.restarts: list[tuple[float, str]] = []
        self.probes = 0
        self.ready_after_s = 0.0
        self.restarted_at: dict[str, float] = {}

    def probe(self) -> P.ProbeResult:
        self.probes += 1
        if self.wedged or self.permanent:
            return P.ProbeResult(code=P.DECODE, stage="decode", message="no first token while decode runs it")
        return P.ProbeResult(code=P.OK, stage="ok", message="fine", ttft_s=0.01, tokens=16)

    def health(self, url: str) -> int | None:
        for unit, t in self.restarted_at.items():
            if unit.split("-")[-1].split(".")[0] in url and self.clock.time() - t < self.ready_after_s:
                return 503  # starting
        for key, code in self.health_codes.items():
            if key in url:
                return code
        return 200

    def restart(self, unit: str) -> tuple[bool, str]:
        self.restarts.append((self.clock.time(), unit))
        self.restarted_at[unit] = self.clock.time()
        if "decode" in unit:
            self.wedged = False
        return True, ""


CFG = {
    "router_url": "http://router:8000",
    "servers": [
        {"name": "prefill-0", "role": "prefill", "url": "http://h:30000", "unit": "pdstack-server-prefill-0.service"},
        {"name": "decode-0", "role": "decode", "url": "http://h:30001", "unit": "pdstack-server-decode-0.service"},
    ],
    "failures_before_restart": 3, "max_restarts_per_hour": 3, "ready_timeout_s": 60, "ready_poll_s": 1,
    "state_file": "", "textfile": "",
}


def make(tmp_path, **over):
    cfg = W.Config.from_dict({**CFG, "state_file": str(tmp_path / "state.json"),
                              "textfile": str(tmp_path / "wd.prom"), **over})
    clock = FakeClock()
    world = World(clock)
    return cfg, clock, world


def step(cfg, clock, world) -> int:
    return W.run_once(cfg, probe=world.probe, health=world.health, services=world, clock=clock)


def test_healthy_does_nothing(tmp_path):
    cfg, clock, world = make(tmp_path)
    for _ in range(5):
        assert step(cfg, clock, world) == W.EXIT_OK
        clock.t += 60
    assert world.restarts == []
    prom = (tmp_path / "wd.prom").read_text()
    assert "pdstack_watchdog_probe_ok 1" in prom and "pdstack_watchdog_alert 0" in prom


def test_wedge_restarts_decode_after_k_failures_then_recovers(tmp_path):
    cfg, clock, world = make(tmp_path)
    world.wedged = True
    world.ready_after_s = 5  # decode answers 503 for 5 s after its restart
    assert step(cfg, clock, world) == W.EXIT_FAILING
    clock.t += 60
    assert step(cfg, clock, world) == W.EXIT_FAILING
    clock.t += 60
    assert world.restarts == []
    assert step(cfg, clock, world) == W.EXIT_RECOVERED  # the K-th failure: restart decode, wait, probe passes
    assert [u for _, u in world.restarts] == ["pdstack-server-decode-0.service"]  # prefill untouched
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["consecutive_failures"] == 0 and state["restarts_total"] == {"pdstack-server-decode-0.service": 1}
    assert clock.t - world.restarts[0][0] >= 5  # it waited for readiness before probing
    prom = (tmp_path / "wd.prom").read_text()
    assert 'pdstack_watchdog_restarts_total{unit="pdstack-server-decode-0.service"} 1' in prom
    assert "pdstack_watchdog_restarts_last_hour 1" in prom


def test_decode_then_prefill_when_decode_restart_is_not_enough(tmp_path):
    cfg, clock, world = make(tmp_path, failures_before_restart=1, max_restarts_per_hour=10)
    world.permanent = True
    assert step(cfg, clock, world) == W.EXIT_RESTARTED
    assert [u for _, u in world.restarts] == ["pdstack-server-decode-0.service", "pdstack-server-prefill-0.service"]


def test_no_restart_while_health_is_not_200(tmp_path):
    cfg, clock, world = make(tmp_path, failures_before_restart=1)
    world.wedged = True
    world.health_codes["30001"] = 503  # decode starting/down: systemd's business
    for _ in range(5):
        assert step(cfg, clock, world) == W.EXIT_FAILING
        clock.t += 60
    assert world.restarts == []
    assert json.loads((tmp_path / "state.json").read_text())["consecutive_failures"] == 0


def test_a_server_down_resets_the_count_so_it_takes_k_fresh_failures_once_all_are_up(tmp_path):
    """Failures while a server is down (restarting under systemd, or by a person) do not carry over: once every
    /health says 200 again (the router may still be about to take it back) it takes K more failures to restart."""
    cfg, clock, world = make(tmp_path)  # K = 3
    world.wedged = True
    assert [step(cfg, clock, world) for _ in range(2)] == [W.EXIT_FAILING] * 2  # 2 of 3
    world.health_codes["30000"] = None  # the prefill goes down
    for _ in range(3):
        assert step(cfg, clock, world) == W.EXIT_FAILING
        clock.t += 60
    del world.health_codes["30000"]
    assert [step(cfg, clock, world) for _ in range(2)] == [W.EXIT_FAILING] * 2
    assert world.restarts == []
    assert json.loads((tmp_path / "state.json").read_text())["consecutive_failures"] == 2
    assert step(cfg, clock, world) == W.EXIT_RECOVERED
    assert [u for _, u in world.restarts] == ["pdstack-server-decode-0.service"]


def hold_for(tmp_path, seconds: float, reason: str = "rolling restart of prefill-0") -> Path:
    """The hold file as the serving role writes it (drain.py `hold`: the writer; the watchdog reads it)."""
    path = tmp_path / "run" / "watchdog-hold.json"
    out = drain.hold(str(path), seconds, reason)
    assert out["changed"] and path.exists()
    return path


def test_a_planned_restart_holds_the_watchdog_no_probe_no_restart_count_cleared(tmp_path):
    """While roles/serving's rolling restart holds it, a step neither probes nor restarts, and clears the count the
    failures before the hold built; released, it probes again and needs K fresh failures."""
    hold_file = tmp_path / "run" / "watchdog-hold.json"
    cfg, clock, world = make(tmp_path, hold_file=str(hold_file))
    clock.t = time.time()  # the hold's "until" is wall-clock (drain.py runs on the host)
    world.wedged = True
    assert [step(cfg, clock, world) for _ in range(2)] == [W.EXIT_FAILING] * 2  # 2 of K = 3
    probes = world.probes
    hold_for(tmp_path, 300)
    for _ in range(4):  # the restart's 20 minutes... of steps, within the hold
        assert step(cfg, clock, world) == W.EXIT_OK
        clock.t += 30
    assert world.probes == probes and world.restarts == []
    state = json.loads((tmp_path / "state.json").read_text())
    assert state["consecutive_failures"] == 0 and state["held_reason"] == "rolling restart of prefill-0"
    assert "pdstack_watchdog_held 1" in (tmp_path / "wd.prom").read_text()
    assert drain.release(str(hold_file))["changed"] and not drain.release(str(hold_file))["changed"]
    assert [step(cfg, clock, world) for _ in range(2)] == [W.EXIT_FAILING] * 2
    assert world.probes == probes + 2 and world.restarts == []
    assert "pdstack_watchdog_held 0" in (tmp_path / "wd.prom").read_text()
    assert step(cfg, clock, world) == W.EXIT_RECOVERED


def test_a_holds_reason_reaches_the_journal_and_state_as_one_bounded_line(tmp_path):
    hold_file = hold_for(tmp_path, 60, "rolling restart of x\nFAKE: restarting everything\x1b[31m" + "y" * 500)
    until, reason = read_hold(str(hold_file), time.time())
    assert "\n" not in reason and "\x1b" not in reason and len(reason) == 200
    assert reason.startswith("rolling restart of x FAKE: restarting everything")


def test_a_hold_written_while_the_kth_probe_ran_stops_the_restart(tmp_path):
    hold_file = tmp_path / "run" / "watchdog-hold.json"
    cfg, clock, world = make(tmp_path, hold_file=str(hold_file), failures_before_restart=1)
    clock.t = time.time()
    world.wedged = True
    fails = world.probe

    def probe_then_a_rollout_begins():
        res = fails()
        hold_for(tmp_path, 300)
        return res

    world.probe = probe_then_a_rollout_begins
    assert step(cfg, clock, world) == W.EXIT_OK
    assert world.restarts == [] and world.probes == 1


@pytest.mark.parametrize("content, why", [
    (None, "lapsed"),  # written with 1 s, read 2 s later: a play killed before its release
    ('{"until": 1e300}', "reaches"),
    ('{"until": "tomorrow"}', "no numeric"),
    ('{"until": NaN}', "no numeric"),
    ("[1, 2]", "no numeric"),
    ("not json", "unreadable"),
])
def test_a_lapsed_or_bad_hold_file_does_not_silence_the_watchdog(tmp_path, caplog, content, why):
    hold_file = tmp_path / "run" / "watchdog-hold.json"
    cfg, clock, world = make(tmp_path, hold_file=str(hold_file), failures_before_restart=1)
    clock.t = time.time()
    if content is None:
        hold_for(tmp_path, 1)
        clock.t += 2
    else:
        hold_file.parent.mkdir(parents=True)
        hold_file.write_text(content)
    world.wedged = True
    assert step(cfg, clock, world) == W.EXIT_RECOVERED  # probed, and restarted
    assert why in caplog.text and str(hold_file) in caplog.text
    assert hold_file.exists() == (content is not None)  # a lapsed hold is removed; a bad one is left for a person


def test_the_writer_and_the_reader_of_a_hold_agree_on_its_longest(tmp_path, monkeypatch, capsys):
    """drain.py's `hold` takes its bound from watchdog_state (one constant): a change there moves both."""
    assert watchdog_state.MAX_HOLD_S == 6 * 3600 and not hasattr(drain, "MAX_HOLD_S")
    path = tmp_path / "hold.json"
    monkeypatch.setattr(watchdog_state, "MAX_HOLD_S", 100)
    assert drain.main(["hold", "--file", str(path), "--seconds", "101", "--reason", "x"]) == 1
    assert "at most 100 s" in capsys.readouterr().err and not path.exists()
    assert drain.main(["hold", "--file", str(path), "--seconds", "100", "--reason", "x"]) == 0
    until, reason = watchdog_state.read_hold(str(path), time.time())
    assert reason == "x" and until <= time.time() + 100


@pytest.mark.parametrize("seconds", ["0", "-5", "nan", "inf", "999999"])
def test_drain_hold_refuses_a_hold_of_no_or_unbounded_length(tmp_path, capsys, seconds):
    path = tmp_path / "hold.json"
    assert drain.main(["hold", "--file", str(path), "--seconds", seconds, "--reason", "x"]) == 1
    assert "a hold lasts more than 0 and at most 21600 s" in capsys.readouterr().err and not path.exists()
    assert drain.main(["hold", "--file", str(path), "--seconds", "90", "--reason", 'a "quoted"\nreason']) == 0
    got = json.loads(path.read_text())
    assert got["reason"] == 'a "quoted"\nreason' and 85 < got["until"] - time.time() <= 90


@pytest.mark.parametrize("code", [P.ROUTER_DOWN, P.ADMISSION])
def test_router_down_and_admission_never_restart(tmp_path, code):
    cfg, clock, world = make(tmp_path, failures_before_restart=1)
    world.probe = lambda: P.ProbeResult(code=code, stage=P.STAGES[code], message="x")
    for _ in range(5):
        assert step(cfg, clock, world) == W.EXIT_FAILING
        clock.t += 60
    assert world.restarts == []
    assert json.loads((tmp_path / "state.json").read_text())["consecutive_failures"] == 0


def test_permanent_fault_is_no_restart_storm(tmp_path):
    """A fault no restart fixes, the timer firing every minute for 3 hours: R restarts, then an alert, then none."""
    cfg, clock, world = make(tmp_path)
    world.permanent = True
    codes = []
    for _ in range(180):
        codes.append(step(cfg, clock, world))
        clock.t += 60
    assert len(world.restarts) == cfg.max_restarts_per_hour == 3
    assert codes[-1] == W.EXIT_ALERT
    prom = (tmp_path / "wd.prom").read_text()
    assert "pdstack_watchdog_alert 1" in prom and "pdstack_watchdog_probe_ok 0" in prom
    # once a probe passes, the alert clears and the watchdog is armed again
    world.permanent = False
    assert step(cfg, clock, world) == W.EXIT_OK
    assert "pdstack_watchdog_alert 0" in (tmp_path / "wd.prom").read_text()


def test_restart_budget_is_per_hour(tmp_path):
    cfg, clock, world = make(tmp_path, failures_before_restart=1, max_restarts_per_hour=2)
    prefill_less = {**CFG, "servers": [CFG["servers"][1]]}
    cfg = W.Config.from_dict({**prefill_less, "failures_before_restart": 1, "max_restarts_per_hour": 2,
                              "state_file": str(tmp_path / "s.json"), "textfile": ""})
    for _ in range(2):  # two wedges, each fixed by one restart
        world.wedged = True
        assert step(cfg, clock, world) == W.EXIT_RECOVERED
        clock.t += 600
    world.wedged = True
    assert step(cfg, clock, world) == W.EXIT_ALERT  # a third within the hour: alert, no restart
    assert len(world.restarts) == 2
    world.wedged = False
    assert step(cfg, clock, world) == W.EXIT_OK
    clock.t += 3600
    world.wedged = True
    assert step(cfg, clock, world) == W.EXIT_RECOVERED  # an hour later the budget is back
    assert len(world.restarts) == 3


def test_reset_and_bad_config(tmp_path, caplog):
    cfg_file = tmp_path / "wd.json"
    cfg_file.write_text(json.dumps({**CFG, "state_file": str(tmp_path / "s.json"), "textfile": ""}))
    (tmp_path / "s.json").write_text(json.dumps({"alert": True, "consecutive_failures": 9}))
    assert W.main(["--config", str(cfg_file), "--reset"]) == 0
    assert json.loads((tmp_path / "s.json").read_text())["alert"] is False
    cfg_file.write_text(json.dumps({**CFG, "failures_before_restrat": 2}))
    assert W.main(["--config", str(cfg_file)]) == W.EXIT_CONFIG
    assert "failures_before_restrat" in caplog.text


def test_role_template_renders_a_valid_config(tmp_path):
    """roles/watchdog's watchdog.json.j2 on a two-host plan: local decode via systemctl, remote prefill via ssh."""
    from pathlib import Path

    import jinja2

    root = Path(__file__).resolve().parents[1]
    env = jinja2.Environment(extensions=["jinja2.ext.do"])
    env.filters["to_json"] = json.dumps
    tpl = env.from_string((root / "roles/watchdog/templates/etc/pdstack/watchdog.json.j2").read_text())
    plan = {"router": {"port": 8000, "internal_url": "http://127.0.0.1:8001"},
            "rollout": {"watchdog_hold_file": "/run/pdstack/watchdog-hold.json"}, "servers": [
        {"name": "prefill-0", "role": "prefill", "url": "http://10.0.0.2:30000", "host": "gpu02",
         "address": "10.0.0.2", "unit": "pdstack-server-prefill-0.service"},
        {"name": "decode-0", "role": "decode", "url": "http://10.0.0.1:30001", "host": "gpu01",
         "address": "10.0.0.1", "unit": "pdstack-server-decode-0.service"}]}
    text = tpl.render(watchdog_plan=plan, inventory_hostname="gpu01", ansible_managed="Ansible managed",
                      watchdog_failures_before_restart=3, watchdog_max_restarts_per_hour=3,
                      watchdog_ready_timeout_s=1800,
                      watchdog_probe_first_token_timeout_s=60, watchdog_probe_stall_timeout_s=15,
                      watchdog_probe_timeout_s=120, watchdog_state_dir="/var/lib/pdstack",
                      watchdog_textfile_dir="/var/lib/prometheus/node-exporter",
                      watchdog_ssh_key="/root/.ssh/pdstack_watchdog",
                      watchdog_ssh_known_hosts="/etc/pdstack/watchdog_known_hosts")
    cfg = W.Config.from_dict(json.loads(text))
    # the router itself, past the front door: a probe must not be refused by admission when a wedge holds every slot
    assert cfg.router_url == "http://127.0.0.1:8001" and cfg.failures_before_restart == 3
    assert cfg.hold_file == "/run/pdstack/watchdog-hold.json"  # where roles/serving's rollout writes its hold
    by = {s.name: s for s in cfg.servers}
    assert by["decode-0"].restart_argv is None
    # the other host: ssh with the watchdog's own key and strict host keys; its forced command reads "restart UNIT"
    argv = by["prefill-0"].restart_argv
    assert argv[:3] == ["ssh", "-i", "/root/.ssh/pdstack_watchdog"] and "StrictHostKeyChecking=yes" in argv
    assert "UserKnownHostsFile=/etc/pdstack/watchdog_known_hosts" in argv
    assert argv[-3:] == ["root@10.0.0.2", "restart", "pdstack-server-prefill-0.service"]
    svc = W.Systemctl(systemctl="/bin/true", argv_by_unit={"u": ["/bin/false"]})
    assert svc.restart("other")[0] and not svc.restart("u")[0]


def test_worst_case_wedge_to_restart_bound():
    """docs/failure.md ("Wedge to watchdog restart") states these: production defaults 405 s; the test layouts 50 s."""
    import yaml

    root = Path(__file__).resolve().parents[1]

    def bound(variables: str) -> float:  # the role's watchdog_* variables as a YAML file sets them
        v = yaml.safe_load((root / variables).read_text())
        return W.worst_case_restart_s(interval_s=v["watchdog_interval_s"],
                                      failures_before_restart=v["watchdog_failures_before_restart"],
                                      first_token_timeout_s=v["watchdog_probe_first_token_timeout_s"],
                                      stall_timeout_s=v["watchdog_probe_stall_timeout_s"], servers=2)

    assert bound("roles/watchdog/defaults/main.yml") == 3 * (60 + 5 + 60 + 2 * 5) == 405
    assert bound("inventory/test/common/group_vars/all/watchdog.yml") == 2 * (5 + 5 + 5 + 2 * 5) == 50


def test_restart_unit_forced_command_accepts_only_this_hosts_server_units(tmp_path):
    """pdstack/hostside/restart_unit.py: the only thing the watchdog's key may run on a serving host."""
    from pdstack.hostside import restart_unit as R

    plan = tmp_path / "plan.json"
    plan.write_text(json.dumps({"servers": [{"unit": "pdstack-server-decode-0.service"}]}))
    log = tmp_path / "calls"
    fake = tmp_path / "systemctl"
    fake.write_text(f"#!/bin/sh\necho \"$@\" >> {log}\n")
    fake.chmod(0o755)

    def run(cmd: str) -> int:
        return R.main({"SSH_ORIGINAL_COMMAND": cmd}, plan_path=str(plan), systemctl=str(fake))

    assert run("restart pdstack-server-decode-0.service") == 0
    assert log.read_text() == "restart pdstack-server-decode-0.service\n"
    for bad in ("", "bash", "restart pdstack-server-prefill-0.service", "stop pdstack-server-decode-0.service",
                "restart pdstack-server-decode-0.service; rm -rf /", "restart sshd.service",
                "restart pdstack-server-decode-0.service extra", "restart ../pdstack-server-decode-0.service"):
        assert run(bad) == 2, bad
    assert log.read_text() == "restart pdstack-server-decode-0.service\n"  # nothing else ran
    assert R.allowed_units(str(tmp_path / "missing.json")) == set()
