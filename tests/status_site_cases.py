"""`pdstack status` against the deployed one-host layout: slow cases written to be pasted into tests/test_site.py.

They use test_site's module fixture `one_host` (inventory/test/one-host deployed on pdstack-test-1) and `hosts`
({name: ip}), and only the helpers of tests/site_helpers.py. Paste them after the one-host tests and before
test_three_host_layout_serves_across_hosts (that deploy replaces pdstack-test-1's plan); the healthy case first, as
here: it needs the last one-host deploy's smoke to have passed (test_parsers_off...'s last run does). Each case
restores what it changed before it returns (it waits until the problem it made is gone from the view).
The names are prefixed `status`/`_status` so that nothing clashes with test_site's own.

This file is not collected by pytest on its own (no `test_` prefix in its name); to try the cases against the local
demo host instead: `STATUS_CASES_LOCAL=1 python tests/status_site_cases.py` (after `./dev.sh demo`).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import time
import urllib.error
import urllib.request

from site_helpers import BIN, ROOT, host_file, sh

STATUS_INVENTORY = ROOT / "inventory" / "test" / "one-host"
STATUS_HOST = "pdstack-test-1"
STATUS_RULE = "/etc/prometheus/rules/pdstack-status-test.yml"
STATUS_ACL = "/etc/haproxy/pdstack-maintenance.acl"
STATUS_SOCKET = "/run/haproxy/admin.sock"
STATUS_WATCHDOG = ("PYTHONPATH=/usr/local/lib/pdstack/python python3 -m pdstack.hostside.watchdog "
                   "--config /etc/pdstack/watchdog.json")


def _status() -> tuple[int, dict, float]:
    """`pdstack status -i <one-host> --json`: (exit code, the view, seconds)."""
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    t0 = time.monotonic()
    r = subprocess.run([str(BIN / "python"), "-m", "pdstack", "status", "-i", str(STATUS_INVENTORY), "--json"],
                       cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    took = time.monotonic() - t0
    assert r.returncode in (0, 1), (r.returncode, r.stdout[-2000:], r.stderr[-2000:])
    return r.returncode, json.loads(r.stdout), took


def _lines(view: dict, level: str = "attention") -> list[str]:
    return [f"{f['where']}: {f['what']}" for f in view["findings"] if f["level"] == level]


def _status_until(pred, timeout: float, what: str) -> tuple[int, dict]:
    """Poll `pdstack status` until pred(code, view); fail naming what it waited for and the last view's lines."""
    end = time.monotonic() + timeout
    while True:
        code, view, _ = _status()
        if pred(code, view):
            return code, view
        if time.monotonic() > end:
            raise AssertionError(f"{what}: not within {timeout:g} s; last exit {code}, findings:\n"
                                 + "\n".join(_lines(view) + _lines(view, "note")))
        time.sleep(2)


def _has(text: str):
    return lambda code, view: code == 1 and any(text in line for line in _lines(view))


def _gone(text: str):
    return lambda code, view: not any(text in line for line in _lines(view))


def _status_serving(ip: str, timeout: float = 120) -> None:
    """A completion through the front door answers 200 (the stack serves again)."""
    body = json.dumps({"model": "deepseek-v4-flash", "prompt": "Hello there", "max_tokens": 8}).encode()
    end = time.monotonic() + timeout
    while True:
        req = urllib.request.Request(f"http://{ip}:8000/v1/completions", data=body,
                                     headers={"Content-Type": "application/json"})
        try:
            with urllib.request.urlopen(req, timeout=20) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        assert time.monotonic() < end, f"the front door at {ip}:8000 does not serve within {timeout:g} s"
        time.sleep(2)


def test_status_healthy_view_is_exit_0_in_under_5_s(one_host, hosts):
    _status_serving(hosts[STATUS_HOST])
    code, view = _status_until(lambda c, v: c == 0, 180, "a healthy view (exit 0)")
    code, view, took = _status()
    assert code == 0 and _lines(view) == [], _lines(view)
    assert took < 5.0, f"pdstack status took {took:.1f} s (the issue: under 5 s)"
    rep = view["hosts"][STATUS_HOST]
    assert {s["name"]: s["health"]["status"] for s in rep["servers"]} == {"prefill-0": 200, "decode-0": 200}
    assert rep["frontdoor"]["router_status"] == "UP" and rep["frontdoor"]["maintenance"] is False
    assert {w["worker_type"] for w in rep["router"]["workers"] if w["is_healthy"]} == {"prefill", "decode"}
    assert view["smoke"]["passed"] is True, view["smoke"]
    assert not [a for a in rep["prometheus"]["alerts"] if a["state"] == "firing"], rep["prometheus"]["alerts"]


def test_status_stopped_decode_unit(one_host, hosts):
    assert sh(STATUS_HOST, "systemctl", "stop", "pdstack-server-decode-0").returncode == 0
    try:
        _, view = _status_until(_has("unit pdstack-server-decode-0.service is inactive/dead"), 30, "stopped decode")
        f = next(f for f in view["findings"] if "is inactive/dead" in f["what"])
        assert "journalctl -u pdstack-server-decode-0.service" in f["next"] and "invoke deploy" in f["next"]
    finally:
        assert sh(STATUS_HOST, "systemctl", "start", "pdstack-server-decode-0").returncode == 0
    _status_serving(hosts[STATUS_HOST])
    _status_until(_gone("pdstack-server-decode-0.service is"), 60, "decode active again")


def test_status_wedged_decode_the_watchdog_backs_off_from(one_host, hosts):
    """Wedge decode (the sim's fault; /health stays 200) again after each watchdog restart until the watchdog's
    restart budget is spent and it backs off (its alert): status says so and how to reset it."""
    decode = f"http://{hosts[STATUS_HOST]}:30001"
    budget = json.loads(host_file(STATUS_HOST, "/etc/pdstack/watchdog.json"))["max_restarts_per_hour"]
    try:
        for _ in range(budget + 1):
            before = sh(STATUS_HOST, "docker", "inspect", "--format", "{{.Id}}", "pdstack-decode-0").stdout.strip()
            _status_post(f"{decode}/_sim/fault", {"wedge_decode": True})
            end = time.monotonic() + 150
            while time.monotonic() < end:
                state = json.loads(host_file(STATUS_HOST, "/var/lib/pdstack/watchdog.json") or "{}")
                now = sh(STATUS_HOST, "docker", "inspect", "--format", "{{.Id}}", "pdstack-decode-0").stdout.strip()
                if state.get("alert") or (now and now != before):
                    break
                time.sleep(2)
            if state.get("alert"):
                break
            _status_until(lambda c, v: all(s["health"]["status"] == 200 for s in v["hosts"][STATUS_HOST]["servers"]),
                          90, "decode back after the watchdog's restart")
        assert state.get("alert"), f"the watchdog did not back off after {budget + 1} wedges: {state}"
        _, view = _status_until(_has("backing off: gave up restarting"), 30, "the watchdog's backoff")
        f = next(f for f in view["findings"] if "backing off" in f["what"])
        assert "--reset" in f["next"] and f["where"] == f"watchdog on {STATUS_HOST}", f
        assert view["hosts"][STATUS_HOST]["servers"][1]["health"]["status"] == 200  # /health does not see it
    finally:  # a fresh decode (no fault), then the watchdog's state reset: its budget and alert as before
        sh(STATUS_HOST, "systemctl", "restart", "pdstack-server-decode-0", timeout=120)
        sh(STATUS_HOST, "sh", "-c", f"{STATUS_WATCHDOG} --reset")
    _status_serving(hosts[STATUS_HOST])
    _status_until(_gone("watchdog on"), 90, "the watchdog well again")


def _status_post(url: str, body: dict) -> None:
    req = urllib.request.Request(url, data=json.dumps(body).encode(), headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(req, timeout=30) as r:
        assert r.status == 200


def test_status_running_image_differs_from_the_plan(one_host, hosts):
    """decode runs the plan's image under another tag (a systemd drop-in in /run, removed after): the view names
    both images and the deploy that rolls it back to the plan's."""
    plan_image = json.loads(host_file(STATUS_HOST, "/etc/pdstack/plan.json"))["image"]
    other = "pdstack/sim:status-other"
    unit = "pdstack-server-decode-0.service"
    text = host_file(STATUS_HOST, f"/etc/systemd/system/{unit}")
    exec_start = re.search(r"^ExecStart=(?:.*\\\n)*.*$", text, re.M).group(0)  # with its continuation lines
    assert plan_image in exec_start, exec_start
    dropin = f"/run/systemd/system/{unit}.d"
    override = "[Service]\nExecStart=\n" + exec_start.replace(plan_image, other) + "\n"
    assert sh(STATUS_HOST, "docker", "tag", plan_image, other).returncode == 0
    try:
        sh(STATUS_HOST, "mkdir", "-p", dropin)
        r = subprocess.run(["docker", "exec", "-i", STATUS_HOST, "sh", "-c", f"cat > {dropin}/status-test.conf"],
                           input=override, text=True, capture_output=True, timeout=60)
        assert r.returncode == 0, r.stderr
        sh(STATUS_HOST, "systemctl", "daemon-reload")
        assert sh(STATUS_HOST, "systemctl", "restart", unit, timeout=120).returncode == 0
        _, view = _status_until(_has(f"runs image {other}"), 90, "decode on another image")
        f = next(f for f in view["findings"] if f"runs image {other}" in f["what"])
        assert f["where"] == f"decode-0 on {STATUS_HOST}" and f"the plan says {plan_image}" in f["what"]
        assert "invoke deploy" in f["next"]
        assert not any("prefill-0" in line and "runs image" in line for line in _lines(view))
    finally:
        sh(STATUS_HOST, "rm", "-rf", dropin)
        sh(STATUS_HOST, "systemctl", "daemon-reload")
        sh(STATUS_HOST, "systemctl", "restart", unit, timeout=120)
        sh(STATUS_HOST, "docker", "rmi", other)
    _status_serving(hosts[STATUS_HOST])
    _status_until(_gone("runs image"), 90, "decode on the plan's image again")


def test_status_firing_alert(one_host, hosts):
    """A rule that always fires, added to Prometheus' rules directory (removed after)."""
    rule = ("groups:\n  - name: pdstack-status-test\n    rules:\n      - alert: PdstackStatusTestAlert\n"
            "        expr: vector(1)\n        labels: {severity: warning}\n"
            "        annotations: {summary: \"the status test's alert\"}\n")
    r = subprocess.run(["docker", "exec", "-i", STATUS_HOST, "sh", "-c", f"cat > {STATUS_RULE}"], input=rule,
                       text=True, capture_output=True, timeout=60)
    assert r.returncode == 0, r.stderr
    try:
        assert sh(STATUS_HOST, "systemctl", "reload", "prometheus").returncode == 0
        _, view = _status_until(_has("firing since"), 90, "the test alert firing")
        f = next(f for f in view["findings"] if f["where"] == "alert PdstackStatusTestAlert")
        assert f["level"] == "attention" and "the status test's alert" in f["what"] and "/alerts" in f["next"]
    finally:
        sh(STATUS_HOST, "rm", "-f", STATUS_RULE)
        sh(STATUS_HOST, "systemctl", "reload", "prometheus")
    _status_until(lambda c, v: not any(f["where"] == "alert PdstackStatusTestAlert" for f in v["findings"]), 90,
                  "the test alert gone")


def test_status_front_door_refusing(one_host, hosts):
    """The front door's maintenance switch on (HAProxy's runtime API, as a rolling restart sets it): new requests
    get 503 maintenance, and the view says the front door refuses and how to clear it."""
    ip = hosts[STATUS_HOST]
    before = _status()[1]["hosts"][STATUS_HOST]["frontdoor"]["refused_total"]["maintenance"]
    assert sh(STATUS_HOST, "sh", "-c", f"echo 'add acl {STATUS_ACL} on' | socat - {STATUS_SOCKET}").returncode == 0
    try:
        req = urllib.request.Request(f"http://{ip}:8000/v1/models")
        try:
            urllib.request.urlopen(req, timeout=10)
            raise AssertionError("the front door served with its maintenance switch on")
        except urllib.error.HTTPError as e:
            assert e.code == 503 and e.headers.get("X-Pdstack-Refusal") == "maintenance", (e.code, dict(e.headers))
        code, view, _ = _status()
        assert code == 1 and any("maintenance switch is on" in line for line in _lines(view)), _lines(view)
        f = next(f for f in view["findings"] if "maintenance switch is on" in f["what"])
        assert f["where"] == f"front door on {STATUS_HOST}" and "systemctl reload haproxy" in f["next"]
        assert view["hosts"][STATUS_HOST]["frontdoor"]["refused_total"]["maintenance"] > before
    finally:
        sh(STATUS_HOST, "sh", "-c", f"echo 'del acl {STATUS_ACL} on' | socat - {STATUS_SOCKET}")
    _status_serving(ip)
    _status_until(_gone("maintenance switch is on"), 30, "the maintenance switch off")


if __name__ == "__main__" and os.environ.get("STATUS_CASES_LOCAL"):
    import sys

    from pdstack.testing import testhost
    STATUS_INVENTORY, STATUS_HOST = ROOT / "inventory" / "local", "pdstack-local-1"
    local = {row["name"]: row["ip"] for row in testhost.status("pdstack-local")}
    names = sys.argv[1:] or [n for n in list(globals()) if n.startswith("test_status_")]
    for name in names:
        t0 = time.monotonic()
        globals()[name](None, local)
        print(f"{name}: passed in {time.monotonic() - t0:.1f} s", flush=True)
