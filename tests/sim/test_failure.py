"""Failure behaviour chosen, not inherited (issue 15), with the router flags the planner renders for inventory/local,
behind the front door (real HAProxy), in front of a sim prefill + decode; all on 127.0.0.1.

- prefill killed and restarted: 0.3.2's circuit breaker opens on both workers; with --cb-timeout-duration-secs 10
  (pdstack_router.circuit_breaker.timeout_secs) the first success comes within 15 s of the new prefill's /health.
- router stopped with requests in flight: it drains for --shutdown-grace-period-secs; what finishes within it
  completes with [DONE], a longer stream is cut at the end of it; meanwhile the front door answers new requests
  with 503 + Retry-After, named router-down (not busy) for clients and the probe; a router started again serves.
- the front door's maintenance switch (a planned restart of the only server of a role): streams in flight finish,
  new requests get 503 + Retry-After (X-Pdstack-Refusal: maintenance) at once, none hangs; off, it serves again.
- wedged decode, with the time budget chained as the planner renders it (HAProxy's server timeout is
  pdstack_router.request_timeout_secs, the router's own 30 s later): a stream is cut once it has been silent for the
  budget, a non-stream request gets the front door's 504 JSON at the budget (once, not budget x attempts: the router
  never retries it); either way its front-door slot is freed.
"""

from __future__ import annotations

import os
import signal
import threading
import time

import pytest

from pdstack.controller.plan import planner
from pdstack.hostside import probe
from pdstack.testing import admission
from pdstack.testing.admission import DECODE_TPS, request
from pdstack.testing.sim.launch import http_get

pytestmark = pytest.mark.slow


def _flag(flags: list[str], name: str) -> int:
    return int(flags[flags.index(name) + 1])


def test_prefill_killed_and_restarted_serves_within_15_s_of_its_health(tmp_path):
    flags = admission.rendered_router_flags()
    assert _flag(flags, "--cb-timeout-duration-secs") == 10
    with admission.Stack(tmp_path, router_extra=flags) as st:
        fd = st.with_frontdoor(max_concurrent_requests=8, queue_size=16, queue_timeout_secs=10)
        assert request(fd.url, 8)["status"] == 200
        os.killpg(st.prefill.proc.pid, signal.SIGKILL)
        st.prefill.proc.wait(5)
        t0, results = time.monotonic(), []
        while time.monotonic() - t0 < 10:  # clients keep coming while prefill is down (the breaker opens)
            out: list[dict] = []
            ths = [threading.Thread(target=lambda o=out: o.append(request(fd.url, 8, timeout=60))) for _ in range(6)]
            for t in ths:
                t.start()
            for t in ths:
                t.join()
            results += out
        assert all(r["status"] not in (0, 200) for r in results), results
        assert max(r["seconds"] for r in results) < 20, results  # refused, not hung
        st.restart_prefill()
        assert http_get(st.prefill.url + "/health")[0] == 200
        healthy = time.monotonic()
        while True:
            r = request(fd.url, 8, timeout=30)
            if r["status"] == 200:
                break
            assert time.monotonic() - healthy < 15, f"no success 15 s after prefill's /health: {r}"
            time.sleep(0.25)
        assert time.monotonic() - healthy < 15
        print(f"prefill restarted: first success {time.monotonic() - healthy:.1f} s after its /health "
              f"(refused while down: {sorted({r['status'] for r in results})})")


def test_router_stop_drains_in_flight_within_its_grace_and_the_front_door_answers_503(tmp_path):
    grace = 6
    flags = [*admission.rendered_router_flags(), "--shutdown-grace-period-secs", str(grace)]
    with admission.Stack(tmp_path, router_extra=flags) as st:
        fd = st.with_frontdoor(max_concurrent_requests=8, queue_size=16, queue_timeout_secs=10)
        out: dict[str, list] = {"short": [], "long": []}

        def stream(kind: str, seconds: float) -> None:
            out[kind].append(request(fd.url, int(seconds * DECODE_TPS), stream=True, timeout=60))

        ths = [threading.Thread(target=stream, args=("short", 3.0)) for _ in range(3)]
        ths.append(threading.Thread(target=stream, args=("long", 3 * grace)))
        for t in ths:
            t.start()
        time.sleep(0.5)
        stopper = threading.Thread(target=lambda: st.router.stop(timeout=grace + 10))
        t_stop = time.monotonic()
        stopper.start()
        time.sleep(0.5)
        during = request(fd.url, 4, timeout=30)  # a new client while the router drains / is gone
        for t in ths:
            t.join(60)
        stopper.join(30)
        stopped_after = time.monotonic() - t_stop
        # requests that finish within the grace period complete
        assert [r["status"] for r in out["short"]] == [200] * 3, out["short"]
        assert all(r["tail"].rstrip().endswith("data: [DONE]") for r in out["short"]), out["short"]
        # a stream longer than the grace period is cut when it ends (no [DONE]); the router is gone by then
        assert out["long"] and not out["long"][0]["tail"].rstrip().endswith("data: [DONE]"), out["long"]
        assert stopped_after < grace + 3, stopped_after
        print(f"router stop: gone after {stopped_after:.1f} s (grace {grace} s); a new request meanwhile: "
              f"{during['status']} in {during['seconds']:.2f} s")
        # the front door: 503 + Retry-After, not hung (HAProxy retries a refused connection 3 times, 1 s apart, until
        # its health check takes the router out, ~4 s; then at once)
        assert during["status"] == 503 and during["retry_after"] == "1" and during["seconds"] < 5, during
        # ... and it says "router down", not "busy" (X-Pdstack-Refusal, the body's type): once at the first refused
        # connection (observe layer4), then at once for the next
        assert during["refusal"] == "router-down" and '"type": "router_down"' in during["body"], during
        after = request(fd.url, 4, timeout=30)
        assert (after["status"], after["refusal"]) == (503, "router-down") and after["seconds"] < 0.5, after
        pr = probe.probe(fd.url, first_token_timeout=3, stall_timeout=2, total_timeout=5)
        assert pr.code == probe.ROUTER_DOWN and "router down" in pr.message, pr  # the smoke/liveness gates' words
        print(f"router down: the first new request refused with router-down in {during['seconds']:.2f} s, the next "
              f"in {after['seconds']:.3f} s")
        st.restart_router()
        deadline = time.monotonic() + 10
        while (r := request(fd.url, 4))["status"] != 200:
            assert time.monotonic() < deadline, r
            time.sleep(0.2)


def test_wedged_decode_cuts_streams_at_the_budget_answers_504_once_and_frees_the_slot(tmp_path):
    budget = 3
    router_timeout = budget + planner.ROUTER_TIMEOUT_MARGIN_SECS  # as the planner renders it
    flags = [*admission.rendered_router_flags(), "--request-timeout-secs", str(router_timeout)]
    with admission.Stack(tmp_path, router_extra=flags) as st:
        fd = st.with_frontdoor(max_concurrent_requests=2, queue_size=0, queue_timeout_secs=10,
                               server_timeout_secs=budget)
        st.decode.fault(wedge_decode=True)
        s = request(fd.url, 8, stream=True, timeout=60)
        assert s["status"] in (200, 504) and "[DONE]" not in s["tail"], s
        assert budget - 0.5 < s["seconds"] < budget + 1, s
        n = request(fd.url, 8, timeout=60)
        assert n["status"] == 504 and n["refusal"] == "gateway-timeout", n
        assert budget - 0.5 < n["seconds"] < budget + 1, n  # one attempt: the router's own timeout is later
        assert fd.metric("haproxy_server_current_sessions", proxy="pdstack_router") == 0
        st.decode.fault(wedge_decode=False)
        assert request(fd.url, 8)["status"] == 200


def test_maintenance_switch_refuses_new_requests_at_once_while_in_flight_ones_finish(tmp_path):
    with admission.Stack(tmp_path, router_extra=admission.rendered_router_flags()) as st:
        fd = st.with_frontdoor(max_concurrent_requests=8, queue_size=16, queue_timeout_secs=10)
        assert request(fd.url, 4)["status"] == 200
        streams: list[dict] = []
        ths = [threading.Thread(target=lambda: streams.append(request(fd.url, int(3 * DECODE_TPS), stream=True,
                                                                       timeout=60))) for _ in range(3)]
        for t in ths:
            t.start()
        time.sleep(0.5)
        fd.maintenance(True)
        during = [request(fd.url, 4, timeout=30) for _ in range(5)]
        assert fd.metric("haproxy_server_current_sessions", proxy="pdstack_router") == 3  # still streaming
        for t in ths:
            t.join(60)
        assert [r["status"] for r in streams] == [200] * 3, streams
        assert all(r["tail"].rstrip().endswith("data: [DONE]") for r in streams), streams
        for r in during:
            assert (r["status"], r["retry_after"], r["refusal"]) == (503, "1", "maintenance"), r
            assert '"type": "maintenance"' in r["body"] and r["seconds"] < 0.5, r
        pr = probe.probe(fd.url, first_token_timeout=3, stall_timeout=2, total_timeout=5)
        assert pr.code == probe.ADMISSION and "maintenance" in pr.message, pr  # busy, not broken: no restart
        fd.maintenance(False)
        assert request(fd.url, 4)["status"] == 200
        print(f"maintenance: new requests refused in <= {max(r['seconds'] for r in during) * 1000:.1f} ms while 3 "
              "streams finished")
