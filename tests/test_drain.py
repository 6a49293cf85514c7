"""pdstack/hostside/drain.py, the steps of a rolling restart, against the real sglang-router 0.3.2 and Debian's
HAProxy in front of sim workers (pdstack.testing.admission.Stack), run as the hosts run it:
`python3 -I pdstack-hostside.pyz drain`."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
import time

import pytest
import site_helpers

from pdstack.hostside import drain
from pdstack.testing import admission
from pdstack.testing.sim.launch import free_port, http_get

pytestmark = pytest.mark.slow
ARTIFACT = site_helpers.hostside_artifact()  # drain runs as its `drain` command, as on the hosts


def run(*args: str) -> tuple[int, dict | None, str]:
    """drain.py as restart.yml runs it: the host-side artifact's `drain` in an isolated interpreter (-I: no
    site-packages, no PYTHONPATH), stdlib only."""
    r = subprocess.run([sys.executable, "-I", str(ARTIFACT), "drain", *args], capture_output=True, text=True,
                       timeout=120)
    return r.returncode, (json.loads(r.stdout) if r.returncode == 0 else None), r.stderr


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    with admission.Stack(tmp_path_factory.mktemp("drain")) as s:
        s.with_frontdoor()
        yield s


def _urls(stack) -> list[str]:
    return [w["url"] for w in drain.workers(stack.router.url) or []]


def test_mode_follows_the_router_and_the_front_door_socket(stack, tmp_path):
    sock = str(stack.frontdoor.socket_path)
    assert run("mode", "--router", stack.router.url, "--drain", "router", "--socket", sock)[1]["mode"] == "router"
    assert run("mode", "--router", stack.router.url, "--drain", "frontdoor", "--socket", sock)[1]["mode"] == "frontdoor"
    acl = str(stack.frontdoor.maintenance_file)
    assert run("mode", "--router", stack.router.url, "--drain", "frontdoor", "--socket", sock,
               "--acl", acl)[1]["mode"] == "frontdoor"
    # a HAProxy that does not carry the switch (Debian's own config, same socket: the front door phase not run yet)
    rc, out, _ = run("mode", "--router", stack.router.url, "--drain", "frontdoor", "--socket", sock,
                     "--acl", str(tmp_path / "other.acl"))
    assert (rc, out["mode"]) == (0, "none") and "not configured yet" in out["reason"], out
    rc, out, _ = run("mode", "--router", stack.router.url, "--drain", "frontdoor", "--socket", str(tmp_path / "no"))
    assert (rc, out["mode"]) == (0, "none") and "socket" in out["reason"], out
    rc, out, _ = run("mode", "--router", f"http://127.0.0.1:{free_port()}", "--drain", "router", "--socket", sock)
    assert (rc, out["mode"]) == (0, "none") and "does not answer" in out["reason"], out


def test_out_then_in_through_the_routers_worker_api(stack):
    decode = stack.decode.url
    assert decode in _urls(stack)
    rc, out, err = run("out", "--router", stack.router.url, "--worker-url", decode, "--timeout", "20")
    assert rc == 0 and out["changed"] is True, err
    assert decode not in _urls(stack)
    rc, out, _ = run("out", "--router", stack.router.url, "--worker-url", decode)
    assert (rc, out["changed"]) == (0, False), out  # a second run: nothing to take out
    # the plan's rollout.worker for a decode server (planner.rollout_plan)
    worker = json.dumps({"url": decode, "worker_type": "decode"})
    rc, out, err = run("in", "--router", stack.router.url, "--worker", worker, "--timeout", "30")
    assert rc == 0 and out["changed"] is True, err
    listed = [w for w in drain.workers(stack.router.url) if w["url"] == decode]
    assert len(listed) == 1 and listed[0]["is_healthy"], listed
    rc, out, _ = run("in", "--router", stack.router.url, "--worker", worker, "--timeout", "30")
    assert (rc, out["changed"]) == (0, False), out
    assert admission.request(stack.router.url, 4)["status"] == 200  # it serves again through the router


def test_in_refuses_what_is_not_a_worker_and_names_a_worker_that_never_gets_healthy(stack):
    rc, _, err = run("in", "--router", stack.router.url, "--worker", "{not json")
    assert rc == 1 and "--worker is not JSON" in err, err
    rc, _, err = run("in", "--router", stack.router.url, "--worker", "[1]")
    assert rc == 1 and "JSON object" in err, err
    ghost = f"http://127.0.0.1:{free_port()}"
    rc, _, err = run("in", "--router", stack.router.url, "--worker",
                     json.dumps({"url": ghost, "worker_type": "decode"}), "--timeout", "3")
    assert rc == 1 and ghost in err, err
    run("out", "--router", stack.router.url, "--worker-url", ghost)
    assert ghost not in _urls(stack)


def test_wait_sees_a_request_in_flight_and_then_the_drain(stack):
    metrics = stack.decode.url + "/metrics"
    rc, out, _ = run("wait", "--metrics", metrics, "--gauges", "server", "--timeout", "5")
    # idle: drained on the second poll (two zeros in a row, drain.QUIET_POLLS), not the first
    assert (rc, out["drained"], out["polls"]) == (0, True, drain.QUIET_POLLS), out
    # a long generation keeps one request running on decode (the sim decodes admission.DECODE_TPS tokens/s)
    t = threading.Thread(target=admission.request, args=(stack.router.url, 400), daemon=True)
    t.start()
    deadline = time.monotonic() + 10
    while drain.in_flight(metrics, "server") in (0, None) and time.monotonic() < deadline:
        time.sleep(0.1)
    rc, out, _ = run("wait", "--metrics", metrics, "--gauges", "server", "--timeout", "1")
    assert (rc, out["drained"]) == (0, False) and out["in_flight"] >= 1, out
    t.join(timeout=120)
    rc, out, _ = run("wait", "--metrics", metrics, "--gauges", "server", "--timeout", "10")
    assert out["drained"] is True, out
    fd_metrics = f"http://127.0.0.1:{stack.frontdoor.metrics_port}/metrics"
    rc, out, _ = run("wait", "--metrics", fd_metrics, "--gauges", "frontdoor", "--timeout", "5")
    assert out["drained"] is True, out
    _, text = http_get(fd_metrics)
    assert drain.GAUGES["frontdoor"].findall(text.decode()), "the exporter's gauges drain.py sums are there"


def test_maintenance_switch_through_the_runtime_socket(stack):
    sock, acl = str(stack.frontdoor.socket_path), str(stack.frontdoor.maintenance_file)
    url = stack.frontdoor.url
    assert admission.request(url, 4)["status"] == 200
    rc, out, err = run("maintenance", "on", "--socket", sock, "--acl", acl)
    assert rc == 0 and out["changed"], err
    try:
        r = admission.request(url, 4)
        assert r["status"] == 503 and r.get("refusal") == "maintenance", r
    finally:
        rc, out, err = run("maintenance", "off", "--socket", sock, "--acl", acl)
    assert rc == 0 and out["changed"], err
    assert admission.request(url, 4)["status"] == 200
    rc, out, _ = run("maintenance", "off", "--socket", sock, "--acl", acl)
    assert (rc, out["changed"]) == (0, False), out  # off when it is off: nothing to undo
    rc, _, err = run("maintenance", "on", "--socket", sock, "--acl", "/nonexistent.acl")
    assert rc == 1 and "refused" in err, err
    rc, _, err = run("maintenance", "on", "--socket", "/nonexistent.sock", "--acl", acl)
    assert rc == 1 and "runtime API" in err, err


def test_a_restarts_first_and_last_steps_hold_and_release_with_the_switch(stack, tmp_path):
    """restart.yml's first task (`mode --hold-*`) and its `always` task (`finish`), against the real router and
    HAProxy: the hold is written whatever the mode; finish switches maintenance off and releases, and a front door
    that cannot be switched still releases the hold (exit 0, the error in the JSON)."""
    sock, acl = str(stack.frontdoor.socket_path), str(stack.frontdoor.maintenance_file)
    hold_file = tmp_path / "run" / "watchdog-hold.json"
    hold = ["--hold-file", str(hold_file), "--hold-seconds", "120", "--hold-reason", "rolling restart of decode-0"]
    t0 = time.time()
    rc, out, err = run("mode", "--router", stack.router.url, "--drain", "frontdoor", "--socket", sock, "--acl", acl,
                       *hold)
    assert rc == 0 and out["mode"] == "frontdoor" and out["hold"]["changed"], err
    written = json.loads(hold_file.read_text())
    assert written["reason"] == "rolling restart of decode-0" and t0 + 119 <= written["until"] <= time.time() + 121
    assert run("maintenance", "on", "--socket", sock, "--acl", acl)[0] == 0
    assert admission.request(stack.frontdoor.url, 4)["status"] == 503
    rc, out, err = run("finish", "--hold-file", str(hold_file), "--socket", sock, "--acl", acl)
    assert rc == 0 and out["maintenance"]["changed"] and out["release"]["changed"] and out["changed"], (out, err)
    assert not hold_file.exists() and admission.request(stack.frontdoor.url, 4)["status"] == 200
    # no router answers: mode none, the hold is still written (a plain restart's probes fail too)
    rc, out, _ = run("mode", "--router", f"http://127.0.0.1:{free_port()}", "--drain", "router", "--socket", sock,
                     *hold)
    assert (rc, out["mode"]) == (0, "none") and hold_file.exists(), out
    rc, out, err = run("finish", "--hold-file", str(hold_file), "--socket", "/nonexistent.sock", "--acl", acl)
    assert rc == 0 and "runtime API" in out["maintenance"]["error"] and "runtime API" in err, (out, err)
    assert out["release"]["changed"] and not hold_file.exists()
    # a hold that cannot be written fails the first step (exit 1): the restart does not start
    rc, _, err = run("mode", "--router", stack.router.url, "--drain", "router", "--socket", sock,
                     "--hold-file", "/proc/pdstack/hold.json", "--hold-seconds", "60", "--hold-reason", "x")
    assert rc == 1 and "hold file" in err, err
    # the three --hold-* go together; finish's --socket and --acl too (usage: exit 2)
    assert run("mode", "--router", stack.router.url, "--drain", "router", "--socket", sock,
               "--hold-file", str(hold_file))[0] == 2
    assert run("finish", "--hold-file", str(hold_file), "--socket", sock)[0] == 2
    assert not hold_file.exists()


def test_a_runtime_command_cannot_carry_a_second_command():
    with pytest.raises(drain.Failed, match="line break"):
        drain.runtime_api("/nonexistent.sock", "add acl /x on\nshow info")
