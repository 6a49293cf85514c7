"""`pdstack status` without a host: the judging of every problem class (exit 1, a line naming it and the next
command), notes that leave the exit code alone, the table and JSON, exit 2 on a bad inventory before any host is
contacted, exit 3 on an unreachable host (through the real ansible), and the host collector's parsers on recorded
output (a deployed local host's report, HAProxy's `show stat`, dcgm-exporter's metrics)."""

from __future__ import annotations

import json
import socket
import subprocess
import threading
import time
from pathlib import Path

import pytest
import site_helpers

from pdstack import cli
from pdstack.controller.status import status, status_judge, status_view
from pdstack.hostside import status_collect as sc

DATA = Path(__file__).resolve().parent / "status_data"
ROOT = Path(__file__).resolve().parents[1]
HOST = "pdstack-local-1"
INV = "inventory/local"


def monitoring_units(name: str, prometheus: str = "") -> dict:
    """The collector's monitoring_units from a recorded `systemctl show` (tests/status_data); `prometheus` given:
    its unit's ActiveState/SubState set to that (e.g. "active/running")."""
    units = {k: v for k, v in sc.parse_systemctl_show((DATA / f"systemctl-show-monitoring-{name}.txt").read_text())
             .items() if v["LoadState"] == "loaded"}
    if prometheus:
        units["prometheus.service"].update(zip(("ActiveState", "SubState"), prometheus.split("/"), strict=True))
    return units


def healthy() -> dict:
    """A deployed local host's report, recorded by status_collect.py (tests/status_data), with a fresh clock and
    its monitoring units running (the recorded report predates monitoring_units)."""
    rep = json.loads((DATA / "healthy-local-host.json").read_text())
    rep["watchdog"]["state"]["last_run"] = time.time() - 10
    rep["monitoring_units"] = monitoring_units("stopped", prometheus="active/running")
    return rep


def smoke_ok() -> dict:
    return {"passed": True, "failed": [], "dir": "build/smoke/local/x", "age_s": 600.0,
            "verdicts": {"probe": True, "recall": True, "bench": True}, "horizon": 16000, "min_horizon": 8000,
            "c1_tps": 61.2, "floor_tps": 48.0}


def view_of(rep: dict, smoke: dict | None = None, **hosts: dict) -> dict:
    return {"inventory": INV, "time": time.time(), "hosts": {HOST: rep, **hosts}, "monitoring_hosts": [HOST],
            "reach": {HOST: "172.30.0.2", "gpu02": "10.0.0.12"}, "prometheus_port": 9090,
            "smoke": smoke_ok() if smoke is None else smoke}


def judged(view: dict) -> tuple[int, list[status_judge.Finding]]:
    f = status_judge.judge(view)
    return status_judge.exit_code(f), f


def test_the_healthy_recorded_host_is_all_well():
    code, findings = judged(view_of(healthy()))
    assert code == 0, findings
    assert [f for f in findings if f.level != status_judge.NOTE] == []


def _server(rep: dict, name: str) -> dict:
    return next(s for s in rep["servers"] if s["name"] == name)


def _stop(rep):
    rep["units"]["pdstack-server-decode-0.service"].update(ActiveState="inactive", SubState="dead", Result="success")


def _failed(rep):
    rep["units"]["pdstack-server-decode-0.service"].update(ActiveState="failed", SubState="failed",
                                                           Result="exit-code")


def _health(rep):
    _server(rep, "decode-0")["health"] = {"status": None, "seconds": 3.0, "error": "timed out"}


def _health_503(rep):
    _server(rep, "prefill-0")["health"] = {"status": 503, "seconds": 0.01, "error": None}


def _image_tag(rep):
    rep["docker"]["containers"]["pdstack-decode-0"]["image_ref"] = "pdstack/sim:other"


def _image_id(rep):
    rep["docker"]["containers"]["pdstack-prefill-0"]["image_id"] = "sha256:" + "0" * 64


def _no_container(rep):
    del rep["docker"]["containers"]["pdstack-decode-0"]


def _worker_missing(rep):
    rep["router"]["workers"] = [w for w in rep["router"]["workers"] if w["worker_type"] != "decode"]


def _worker_unhealthy(rep):
    rep["router"]["workers"][0]["is_healthy"] = False


def _circuit(rep):
    rep["router"]["circuit"]["http://pdstack-local-1:30001"] = 1.0


def _router_unit(rep):
    rep["units"]["pdstack-router.service"].update(ActiveState="activating", SubState="auto-restart")


def _workers_down(rep):
    rep["router"].update(workers=None, workers_status=None, workers_error="Connection refused")


def _maintenance(rep):
    rep["frontdoor"]["maintenance"] = True


def _router_down(rep):
    rep["frontdoor"]["router_status"] = "DOWN"


def _no_socket(rep):
    rep["frontdoor"] = {"error": "HAProxy's runtime API /run/haproxy/admin.sock: [Errno 2] No such file"}


def _refusing(rep):
    rep["prometheus"]["refused_5m"][HOST] = {"queue-full": 40, "maintenance": 0, "queue-timeout/router-down": 3}
    rep["prometheus"]["requests_5m"][HOST] = 200


def _router_down_refusals(rep):
    rep["prometheus"]["refused_5m"][HOST] = {"queue-full": 0, "maintenance": 50, "queue-timeout/router-down": 30}
    rep["prometheus"]["requests_5m"][HOST] = 200


def _backoff(rep):
    st = rep["watchdog"]["state"]
    now = time.time()
    st.update(alert=True, alert_reason="3 restart(s) in the last hour reached max_restarts_per_hour 3",
              consecutive_failures=5, last_probe_code=14, last_probe_stage="decode",
              restarts=[[now - 300, "pdstack-server-decode-0.service"]] * 3)


def _probe_failing(rep):
    rep["watchdog"]["state"].update(consecutive_failures=1, last_probe_code=14, last_probe_stage="decode",
                                    last_probe_message="no token for 5 s")


def _timer(rep):
    rep["units"]["pdstack-watchdog.timer"].update(ActiveState="inactive", SubState="dead")


def _alert(rep):
    rep["prometheus"]["alerts"] = [{"name": "PdstackDecodeWedged", "state": "firing", "labels": {},
                                    "summary": "Decode decode-0 is wedged", "active_at": "2026-12-02T10:00:00Z"}]


def _not_deployed(rep):
    rep["plan"], rep["plan_error"] = None, "/etc/pdstack/plan.json does not exist (not deployed here)"


def _prometheus_stopped(rep):  # `systemctl stop prometheus` on the monitoring host: nothing answers on 9090
    rep["prometheus"], rep["monitoring_units"] = None, monitoring_units("stopped")


def _grafana_failed(rep):
    rep["monitoring_units"]["grafana-server.service"].update(ActiveState="failed", SubState="failed",
                                                             Result="exit-code")


def _reboot_pending(rep):  # deployed with pdstack_host.reboot_policy warn before the host was rebooted
    rep["plan"]["host_settings"] = {"reboot_policy": "warn", "pending_reboot": [
        "kernel argument iommu=pt (not in /proc/cmdline: the GRUB drop-in takes effect at the next boot)"]}


def _collector_failed(rep):
    rep.clear()
    rep["failed"] = "/usr/bin/python3: not found"


PROBLEMS = [  # (mutation, words the finding's line names, words its next command holds)
    (_stop, "unit pdstack-server-decode-0.service is inactive/dead", "journalctl -u pdstack-server-decode-0"),
    (_failed, "is failed/failed (result exit-code)", "invoke deploy -i inventory/local"),
    (_health, "/health on port 30001 answers nothing: timed out", "journalctl -u pdstack-server-decode-0"),
    (_health_503, "/health on port 30000 answers 503", "journalctl -u pdstack-server-prefill-0"),
    (_image_tag, "runs image pdstack/sim:other", "invoke deploy -i inventory/local"),
    (_image_id, "runs image pdstack/sim:41c18af7c1c59e75 (sha256:0000000000", "invoke rollback"),
    (_no_container, "no container pdstack-decode-0", "journalctl -u pdstack-server-decode-0"),
    (_worker_missing, "decode decode-0 (http://pdstack-local-1:30001) is not among the router's workers",
     "invoke deploy"),
    (_worker_unhealthy, "marks decode decode-0 (http://pdstack-local-1:30001) unhealthy", "journalctl -u pdstack-rou"),
    (_circuit, "circuit breaker of http://pdstack-local-1:30001 is open", "journalctl -u pdstack-router"),
    (_router_unit, "unit pdstack-router.service is activating/auto-restart", "journalctl -u pdstack-router"),
    (_workers_down, "/workers answers nothing: Connection refused", "journalctl -u pdstack-router"),
    (_maintenance, "maintenance switch is on", "systemctl reload haproxy"),
    (_router_down, "marks the router DOWN", "journalctl -u pdstack-router"),
    (_no_socket, "runtime API /run/haproxy/admin.sock", "journalctl -u haproxy"),
    (_refusing, "refused 43 of 200 requests in the last 5 minutes (queue-full 40, queue-timeout/router-down 3)",
     "pdstack_router.admission"),
    (_router_down_refusals, "refused 30 of 200 requests in the last 5 minutes (queue-timeout/router-down 30)",
     "journalctl -u pdstack-router"),
    (_backoff, "backing off: gave up restarting (3 restart(s)", "--reset"),
    (_probe_failing, "failed at decode (exit 14, 1 in a row): no token for 5 s", "journalctl -u pdstack-watchdog"),
    (_timer, "timer pdstack-watchdog.timer is inactive", "--tags watchdog_run"),
    (_alert, "firing since 2026-12-02T10:00:00Z: Decode decode-0 is wedged", "/alerts"),
    (_not_deployed, "not deployed: /etc/pdstack/plan.json does not exist", "invoke deploy -i inventory/local"),
    (_prometheus_stopped, "does not answer on 127.0.0.1:9090 (unit prometheus.service inactive/dead (result "
     "success)): no alert is evaluated", "journalctl -u prometheus -n 50 --no-pager'; then invoke deploy -i "
     "inventory/local --tags monitoring"),
    (_grafana_failed, "unit grafana-server.service failed/failed (result exit-code): the dashboards do not answer",
     "journalctl -u grafana-server"),
    (_reboot_pending, "waits for a reboot (as of its last deploy) and serves without them (pdstack_host.reboot_policy"
     " warn): kernel argument iommu=pt", "ssh 172.30.0.2 systemctl reboot), then invoke deploy -i inventory/local"),
    (_collector_failed, "the status collector failed: /usr/bin/python3: not found", "/usr/bin/python3 --version"),
]


@pytest.mark.parametrize("mutate, what, nxt", PROBLEMS, ids=[m.__name__.strip("_") for m, _, _ in PROBLEMS])
def test_each_problem_needs_attention_with_its_line_and_next_command(mutate, what, nxt):
    rep = healthy()
    mutate(rep)
    code, findings = judged(view_of(rep))
    assert code == status_judge.EXIT_ATTENTION, findings
    hits = [f for f in findings if f.level == status_judge.ATTENTION and what in f.what]
    assert hits, [f.what for f in findings]
    assert all(nxt in f.next for f in hits), [f.next for f in hits]
    # and the table shows the same line and its next command
    text = status_view.render({**view_of(rep), "findings": [f.to_dict() for f in findings]})
    assert what in text and "next: " in text and "ATTENTION" in text


def test_a_failed_smoke_run_needs_attention():
    code, findings = judged(view_of(healthy(), smoke={**smoke_ok(), "passed": False, "failed": ["recall"]}))
    assert code == 1 and any("failed: recall" in f.what and "summary.txt" in f.next for f in findings)


@pytest.mark.parametrize("mutate, what", [
    (lambda r: r["restarts_1h"].update({"pdstack-server-decode-0.service": 2}), "restarted 2x in the last hour"),
    (lambda r: r["prometheus"].update(alerts=[{"name": "PdstackTargetDown", "state": "pending", "labels": {},
                                               "summary": "down", "active_at": "t"}]), "pending since t"),
    (lambda r: r["prometheus"]["refused_5m"][HOST].update({"queue-full": 2}), "refused 2 request(s)"),
    (lambda r: r["watchdog"]["state"].update(restarts=[[time.time() - 60, "pdstack-server-decode-0.service"]]),
     "restarted 1 unit(s) in the last hour (budget 3)"),
    (lambda r: r["prometheus"]["refused_5m"][HOST].update({"maintenance": 3}), "with its maintenance switch on"),
    (lambda r: r["watchdog"]["state"].update(held_until=time.time() + 125, held_reason="rolling restart of decode-0"),
     "held at its last run by a planned restart (rolling restart of decode-0): no probe, no restart, for 2"),
], ids=["restarts", "pending-alert", "few-refusals", "watchdog-restarted", "maintenance-refusals", "watchdog-held"])
def test_notes_are_shown_but_leave_the_exit_code_at_0(mutate, what):
    rep = healthy()
    mutate(rep)
    code, findings = judged(view_of(rep))
    assert code == 0, findings
    assert any(f.level == status_judge.NOTE and what in f.what for f in findings), [f.what for f in findings]


def test_no_smoke_result_is_a_note():
    code, findings = judged(view_of(healthy(), smoke={}))
    assert code == 0 and any(f.where == "smoke" and f.level == status_judge.NOTE for f in findings)


def test_an_unreachable_host_is_exit_3_even_with_attention_elsewhere():
    rep = healthy()
    _stop(rep)
    code, findings = judged(view_of(rep, **{"gpu02": {"unreachable": "Failed to connect to the host via ssh"}}))
    assert code == status_judge.EXIT_UNREACHABLE
    f = next(f for f in findings if f.level == status_judge.UNREACHABLE)
    assert f.where == "gpu02" and "ssh" in f.what and "monitoring host" not in f.what
    # the next step is about reaching it (its address, ssh, Ansible's own view of the connection), not its Python
    assert f.next.startswith("reach it first: ssh 10.0.0.12") and "ansible gpu02 -i inventory/local -m ping -vvv" \
        in f.next and "python" not in f.next


def test_a_stopped_prometheus_is_attention_only_on_a_monitoring_host_and_the_alerts_line_says_why():
    rep = healthy()
    _prometheus_stopped(rep)
    view = view_of(rep)
    code, findings = judged(view)
    assert code == status_judge.EXIT_ATTENTION
    assert [f.where for f in findings if f.level == status_judge.ATTENTION] == [f"prometheus on {HOST}"]
    text = status_view.render({**view, "findings": [f.to_dict() for f in findings]})
    assert f"ALERTS  no Prometheus answered: nothing evaluates the alerts ({HOST}: prometheus.service inactive/dead" \
        in text and "all well" not in text
    # a GPU host outside the monitoring group has no Prometheus by design: all well
    assert judged({**view, "monitoring_hosts": ["gpu02"]}) == (0, [])
    # an older collector's report (no monitoring_units): still attention, the unit's state unknown
    rep.pop("monitoring_units")
    assert any("its unit's state unknown" in f.what for f in judged(view_of(rep))[1])


def test_an_unreachable_monitoring_host_says_nothing_evaluates_the_alerts():
    code, findings = judged(view_of(healthy(), gpu02={"unreachable": "Connection timed out"})
                            | {"monitoring_hosts": ["gpu02"]})
    assert code == status_judge.EXIT_UNREACHABLE
    assert any(f.where == "gpu02" and "a monitoring host: nothing evaluates the alerts" in f.what for f in findings)


def test_the_collector_keeps_only_the_monitoring_units_installed(monkeypatch):
    for name, want in (("stopped", {"prometheus.service": "inactive", "grafana-server.service": "active"}),
                       ("gpu-host", {})):
        text = (DATA / f"systemctl-show-monitoring-{name}.txt").read_text()
        monkeypatch.setattr(sc, "_run", lambda argv, timeout=10.0, t=text: (0, t, ""))
        assert {k: v["ActiveState"] for k, v in sc.monitoring_units().items()} == want
    monkeypatch.setattr(sc, "_run", lambda argv, timeout=10.0: (1, "", "System has not been booted with systemd"))
    assert "not been booted with systemd" in sc.monitoring_units()["error"]


def test_a_monitoring_host_without_grafana_installed_is_healthy():
    """grafana_enabled: false (the test hosts) leaves no grafana-server unit: no finding; an installed one that is
    not running is one (above)."""
    rep = healthy()
    rep["monitoring_units"].pop("grafana-server.service")
    assert judged(view_of(rep)) == (0, [])


def test_the_watchdog_restarts_outside_the_hour_do_not_count():
    rep = healthy()
    rep["watchdog"]["state"]["restarts"] = [[time.time() - 4000, "pdstack-server-decode-0.service"]]
    assert judged(view_of(rep)) == (0, [])


# ---------------------------------------------------------------- rendering


def _snapshot(monkeypatch, reports: dict, smoke: dict | None = None):
    monkeypatch.setattr(status, "collect_hosts", lambda source, hosts: reports)
    monkeypatch.setattr(status, "smoke_result", lambda source: smoke_ok() if smoke is None else smoke)


def test_table_colour_only_when_asked_and_every_part_shown(monkeypatch):
    rep = healthy()
    _maintenance(rep)
    view = status.snapshot(INV, collect=lambda s, h: {HOST: rep}, smoke=lambda s: smoke_ok())
    plain, colored = status_view.render(view), status_view.render(view, color=True)
    assert "\x1b[" not in plain and "\x1b[31m" in colored
    for part in ("SERVERS", "decode-0", "(= plan)", "ROUTER", "circuit closed", "FRONT DOOR", "maintenance ON",
                 "WATCHDOG", "restarts last hour 0/3", "SMOKE  passed", "recall horizon 16000", "ALERTS  0 firing"):
        assert part in plain, (part, plain)


def test_the_watchdog_line_says_a_planned_restart_holds_it_and_not_once_it_lapsed():
    rep, now = healthy(), time.time()
    rep["watchdog"]["state"].update(held_until=now + 60, held_reason="rolling restart of prefill-0")
    assert ": held by a planned restart (rolling restart of prefill-0)" in \
        status_view.watchdog(HOST, rep, now)[0]
    assert ": ok" in status_view.watchdog(HOST, rep, now + 61)[0]


def test_cli_json_prints_the_view_with_findings_and_exit_code(monkeypatch, capsys):
    rep = healthy()
    _image_tag(rep)
    _snapshot(monkeypatch, {HOST: rep})
    code = cli.main(["status", "-i", INV, "--json"])
    out = json.loads(capsys.readouterr().out)
    assert code == 1 and out["exit_code"] == 1
    assert out["hosts"][HOST]["docker"]["containers"]["pdstack-decode-0"]["image_ref"] == "pdstack/sim:other"
    assert any("runs image pdstack/sim:other" in f["what"] for f in out["findings"])


def test_cli_table_on_a_pipe_has_no_colour_and_exit_0(monkeypatch, capsys):
    _snapshot(monkeypatch, {HOST: healthy()})
    assert cli.main(["status", "-i", INV]) == 0
    out = capsys.readouterr().out
    assert "all well" in out and "\x1b[" not in out


def test_watch_refreshes_until_interrupted(monkeypatch, capsys):
    _snapshot(monkeypatch, {HOST: healthy()})
    sleeps = []

    def sleep(s):
        sleeps.append(s)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    monkeypatch.setattr(status, "_sleep", sleep)
    assert cli.main(["status", "-i", INV, "--watch", "2"]) == 0
    assert sleeps == [2, 2] and capsys.readouterr().out.count("pdstack status") == 2


# ---------------------------------------------------------------- exit 2: bad inventory, nothing contacted


def _no_ansible(*a, **k):
    raise AssertionError("ansible ran for a bad inventory")


@pytest.mark.parametrize("make, message", [
    (lambda d: d / "missing", "not an inventory directory"),
    (lambda d: (d / "hosts.yml").write_text("all:\n  hosts: {}\n") and d, "no hosts"),
    (lambda d: (d / "hosts.yml").write_text("all:\n  hosts:\n    a:\n    a:\n") and d, "hosts.yml"),
    (lambda d: (d / "hosts.yml").write_text("all: [unclosed\n") and d, "hosts.yml"),
], ids=["no-dir", "no-hosts", "duplicate-key", "bad-yaml"])
def test_a_bad_inventory_is_exit_2_before_any_host_is_contacted(tmp_path, monkeypatch, capsys, make, message):
    monkeypatch.setattr(status.subprocess, "run", _no_ansible)
    inv = make(tmp_path)
    assert cli.main(["status", "-i", str(inv)]) == 2
    err = capsys.readouterr().err
    assert "InventoryError" in err and message in err, err


def test_watch_needs_a_positive_interval(capsys):
    assert cli.main(["status", "-i", INV, "--watch", "0"]) == 2
    assert "--watch 0" in capsys.readouterr().err


# ---------------------------------------------------------------- exit 3: through the real ansible


def test_an_unreachable_host_through_ansible_is_exit_3(tmp_path, capsys):
    with socket.socket() as s:  # a port nothing listens on: ssh is refused at once
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    (tmp_path / "hosts.yml").write_text(f"all:\n  hosts:\n    gone-1:\n      ansible_host: 127.0.0.1\n"
                                        f"      ansible_port: {port}\n      ansible_user: root\n")
    t0 = time.monotonic()
    assert cli.main(["status", "-i", str(tmp_path), "--json"]) == 3
    out = json.loads(capsys.readouterr().out)
    assert "unreachable" in out["hosts"]["gone-1"], out["hosts"]
    assert out["findings"][0]["level"] == "unreachable" and out["findings"][0]["where"] == "gone-1"
    assert time.monotonic() - t0 < 30


def test_parse_ansible_maps_each_host_outcome():
    doc = {"plays": [{"tasks": [{"hosts": {
        "ok": {"rc": 0, "stdout": json.dumps({"host": "ok", "plan": None})},
        "down": {"unreachable": True, "msg": "Failed to connect"},
        "bad": {"rc": 1, "failed": True, "stderr": "Traceback: boom"},
        "hung": {"failed": True, "msg": "The script action failed to execute in the expected time frame (30) and was "
                 "terminated"},
        "junk": {"rc": 0, "stdout": "not json"}}}]}]}
    got = status.parse_ansible("warning line\n" + json.dumps(doc), ["ok", "down", "bad", "hung", "junk", "absent"])
    assert "expected time frame" in got["hung"]["unreachable"]  # the collector never ran: not its Python's fault
    assert got["ok"] == {"host": "ok", "plan": None}
    assert got["down"] == {"unreachable": "Failed to connect"}
    assert got["bad"] == {"failed": "Traceback: boom"}
    assert "not JSON" in got["junk"]["failed"] and "no result" in got["absent"]["unreachable"]


def test_the_ansible_command_runs_the_collector_with_the_hosts_python():
    argv = status.ansible_command("inventory/production")
    assert argv[1:3] == ["all", "-i"] and argv[3] == str((Path.cwd() / "inventory/production").resolve())
    assert "ansible.builtin.script" in argv
    args = json.loads(argv[-1])
    collector = status.collector("inventory/production")  # the host-side artifact, its `status-collect`
    assert args["executable"] == "/usr/bin/python3" and f"{collector} status-collect " in args["cmd"]
    assert collector.exists() and "--dcgm-port" in args["cmd"] and "--prometheus-port 9090" in args["cmd"]


def test_the_ports_are_the_roles_defaults_or_the_plans(tmp_path, monkeypatch):
    from pdstack.controller.load import rules
    default = (rules.role_port("prometheus", "prometheus_listen"), rules.role_port("dcgm_exporter",
                                                                                   "dcgm_exporter_port"))
    monkeypatch.setattr(status, "ROOT", tmp_path)
    assert status.ports("inventory/production") == default
    plan = tmp_path / "build" / "state" / "production" / "plan.json"
    plan.parent.mkdir(parents=True)
    plan.write_text(json.dumps({"monitoring": {"dcgm_exporter_port": 19400}}))
    assert status.ports("inventory/production") == (default[0], 19400)


def test_smoke_result_reads_the_latest_summary(tmp_path):
    d = tmp_path / "one-host" / "latest"
    d.mkdir(parents=True)
    (d / "summary.json").write_text(json.dumps({
        "passed": False, "failed": ["bench"], "dir": "/x", "gates": {
            "recall": {"passed": True, "horizon": 4000, "min_horizon": 4000},
            "bench": {"passed": False, "c1_decode_tps": 20.0, "floor_tps": 44.8}}}))
    s = status.smoke_result("inventory/test/one-host", root=tmp_path)
    assert s["passed"] is False and s["failed"] == ["bench"] and s["verdicts"] == {"recall": True, "bench": False}
    assert s["horizon"] == 4000 and s["c1_tps"] == 20.0 and 0 <= s["age_s"] < 60
    assert status.smoke_result("inventory/local", root=tmp_path) is None
    (d / "summary.json").write_text("{")
    assert "unreadable" in status.smoke_result("inventory/test/one-host", root=tmp_path)["error"]


# ---------------------------------------------------------------- the host collector's parsers


def test_systemctl_show_blocks_and_timestamps():
    text = ("Id=a.service\nActiveState=active\nSubState=running\nNRestarts=2\n"
            "ActiveEnterTimestamp=Wed 2026-12-02 13:57:34 UTC\n\nId=b.timer\nActiveState=inactive\n"
            "ActiveEnterTimestamp=\n")
    units = sc.parse_systemctl_show(text)
    assert set(units) == {"a.service", "b.timer"} and units["a.service"]["NRestarts"] == "2"
    assert sc.systemd_timestamp(units["a.service"]["ActiveEnterTimestamp"]) == 1796219854.0
    assert sc.systemd_timestamp("") is None and sc.systemd_timestamp("n/a") is None


def test_restarts_in_the_last_hour_skip_the_first_start():
    now = 1_800_000_000.0

    def e(unit, ago_s):
        return json.dumps({"UNIT": unit, "__REALTIME_TIMESTAMP": str(int((now - ago_s) * 1e6))})

    lines = [e("a", 7200), e("a", 1800), e("a", 60), e("b", 600), e("c", 5000), e("c", 4000), "garbage"]
    assert sc.restarts_last_hour("\n".join(lines), now) == {"a": 2, "b": 0, "c": 0}


def test_haproxy_show_stat_recorded_on_a_deployed_front_door():
    stat = sc.parse_haproxy_stat((DATA / "haproxy-show-stat.csv").read_text())
    assert {"pdstack/FRONTEND", "pdstack_router/router", "pdstack_refuse/BACKEND"} <= set(stat)
    c = sc.frontdoor_counts(stat)
    assert c["router_status"] == "UP" and c["slots"] == 8 and c["queue_limit"] == 16
    assert c["in_flight"] == int(stat["pdstack_router/router"]["scur"]) and c["requests_total"] > 0
    assert set(c["refused_total"]) == {"queue-full", "maintenance", "queue-timeout/router-down"}
    assert sc.frontdoor_counts({})["router_status"] == "absent"


def test_dcgm_gpus_from_the_recorded_exporter_output():
    gpus = sc.dcgm_gpus((ROOT / "monitoring" / "recorded" / "dcgm-exporter-8x-rtx-pro-6000.prom").read_text())
    assert [g["gpu"] for g in gpus] == [str(i) for i in range(8)]
    assert all({"fb_used_mib", "fb_free_mib", "util_pct"} <= set(g) for g in gpus)


def test_prom_text_labels_with_commas_and_quotes():
    text = 'm{a="x,y",b="q\\"z"} 3\nm 4\n# HELP m x\nother 1\n'
    assert sc.parse_prom_text(text, ("m",)) == [("m", {"a": "x,y", "b": 'q\\"z'}, 3.0), ("m", {}, 4.0)]


def test_the_front_door_is_read_over_its_runtime_socket(tmp_path):
    """A fake runtime API on a unix socket, answering `show stat` and `show acl` as HAProxy 2.6 does."""
    path = str(tmp_path / "admin.sock")
    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(path)
    srv.listen(4)
    seen = []

    def serve():
        for _ in range(2):
            conn, _ = srv.accept()
            with conn:
                cmd = conn.recv(4096).decode().strip()
                seen.append(cmd)
                conn.sendall((DATA / "haproxy-show-stat.csv").read_bytes() if cmd == "show stat"
                             else b"0x55d0c8a1b2c0 on\n\n")

    t = threading.Thread(target=serve, daemon=True)
    t.start()
    got = sc.frontdoor({"runtime_socket": path, "maintenance_file": "/etc/haproxy/m.acl"})
    t.join(5)
    srv.close()
    assert seen == ["show stat", "show acl /etc/haproxy/m.acl"]
    assert got["maintenance"] is True and got["router_status"] == "UP"
    assert "error" in sc.frontdoor({"runtime_socket": str(tmp_path / "none.sock")})


def test_collect_without_a_plan_says_not_deployed(tmp_path):
    rep = sc.collect(str(tmp_path / "plan.json"), prometheus_port=1, dcgm_port=1, images_path=str(tmp_path / "i.json"))
    assert rep["plan"] is None and "does not exist" in rep["plan_error"]
    assert rep["servers"] == [] and rep["router"] is None and rep["prometheus"] is None


def test_collect_copies_the_plans_index_keys_and_reader(tmp_path):
    (tmp_path / "plan.json").write_text(json.dumps({"inventory": "x", "environment": "production", "model": {
        "index_k_dtype": "fp8-torch", "index_reader": "reader: SGLang's torch fp8_paged_mqa_logits_torch"}}))
    rep = sc.collect(str(tmp_path / "plan.json"), prometheus_port=1, dcgm_port=1, images_path=str(tmp_path / "i.json"))
    assert rep["plan"]["index_keys"] == "fp8-torch" and "torch" in rep["plan"]["index_reader"]
    assert rep["plan"]["profile"] == "production"


def test_the_table_names_the_profile_in_force():
    """The profile (derived: production's checks unless the test engine runs) the deployed plan says, per host."""
    rep = healthy()
    rep["plan"] = {**rep["plan"], "profile": "production", "engine": "sglang"}
    view = status.snapshot(INV, collect=lambda s, h: {HOST: rep}, smoke=lambda s: smoke_ok())
    assert "PROFILE  production (engine sglang)" in status_view.render(view)
    rep["plan"] = {**rep["plan"], "profile": "test", "engine": "sim"}
    view = status.snapshot(INV, collect=lambda s, h: {HOST: rep}, smoke=lambda s: smoke_ok())
    assert "PROFILE  test (engine sim)" in status_view.render(view)


def test_the_collector_runs_as_a_script_with_only_the_standard_library(tmp_path):
    r = subprocess.run(["python3", "-I", str(site_helpers.hostside_artifact()), "status-collect", "--plan",
                        str(tmp_path / "none.json"), "--prometheus-port", "1", "--dcgm-port", "1"],
                       capture_output=True, text=True, timeout=60, cwd="/")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["plan"] is None


def test_the_table_says_which_index_keys_and_reader_the_deployed_plan_set():
    """The plan's index_k_dtype and index_reader (status_collect copies them from the host's plan.json)."""
    rep = healthy()
    rep["plan"] = {**rep["plan"], "index_keys": "fp8-tilelang",
                   "index_reader": "fp8 keys + fp32 scale, 132 B/token; reader: SGLang's TileLang"}
    view = status.snapshot(INV, collect=lambda s, h: {HOST: rep}, smoke=lambda s: smoke_ok())
    assert "INDEX KEYS  fp8-tilelang: fp8 keys + fp32 scale, 132 B/token; reader: SGLang's TileLang" in \
        status_view.render(view)
    rep["plan"] = {k: v for k, v in rep["plan"].items() if not k.startswith("index_")}  # a plan from before: no line
    assert "INDEX KEYS" not in status_view.render(status.snapshot(INV, collect=lambda s, h: {HOST: rep},
                                                                  smoke=lambda s: smoke_ok()))
