"""`pdstack probe` against sim prefill + decode behind the real sglang-router: each failure names its stage."""

from __future__ import annotations

import sys
import threading
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "sim"))
from sim_helpers import post, start_pd  # noqa: E402

from pdstack import cli  # noqa: E402
from pdstack.hostside import probe  # noqa: E402
from pdstack.testing.sim.launch import free_port, http_get  # noqa: E402

pytestmark = pytest.mark.slow
FAST_PROBE = {"first_token_timeout": 1.5, "stall_timeout": 1.0, "total_timeout": 10.0}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    # router request timeout 10 s, so the probe's own deadlines (1-2 s) decide; admission: 1 slot, no queue
    st, s = start_pd(tmp_path_factory.mktemp("probe"),
                     router_extra=["--request-timeout-secs", "10", "--max-concurrent-requests", "1",
                                   "--queue-size", "0"])
    with st:
        yield s


def run_probe(s, **kw):
    return probe.probe(s.router.url, prefill=[s.prefill.url], decode=[s.decode.url], **{**FAST_PROBE, **kw})


def test_ok_and_cli_exit_code(stack, capsys):
    r = run_probe(stack)
    assert r.ok and r.tokens == 16 and r.ttft_s is not None and "pdstack probe is" in r.text
    assert cli.main(["probe", "--url", stack.router.url, "--first-token-timeout", "2"]) == 0
    assert "PASS" in capsys.readouterr().out


def test_decode_wedge_found_while_health_says_200(stack):
    stack.decode.fault(wedge_decode=True)
    try:
        assert http_get(stack.decode.url + "/health")[0] == 200
        r = run_probe(stack)
        assert r.code == probe.DECODE and "wedged" in r.message, r
        # without the servers' URLs it still fails, as "no first token"
        r = probe.probe(stack.router.url, **FAST_PROBE)
        assert r.code == probe.PREFILL_TRANSFER, r
    finally:
        stack.reset_faults()
    assert run_probe(stack).ok


def test_slow_prefill_is_prefill_stage(stack):
    stack.prefill.fault(slow_prefill_s=3)
    try:
        r = run_probe(stack)
        assert r.code == probe.PREFILL_TRANSFER, r
    finally:
        stack.reset_faults()


def test_transfer_failure_is_an_abort(stack):
    stack.decode.fault(fail_transfer=True)
    try:
        r = run_probe(stack)
        assert r.code == probe.ABORTED and "transfer failed" in r.message, r
    finally:
        stack.reset_faults()


def test_admission_refusal_is_not_a_failure_of_the_servers(stack):
    stack.prefill.fault(slow_prefill_s=3)
    hog = threading.Thread(target=post, args=(stack.router.url + "/generate", {"text": "hold the only slot"}, 20))
    try:
        hog.start()
        import time
        time.sleep(0.5)
        r = run_probe(stack)
        assert r.code == probe.ADMISSION and r.http_status == 429, r
    finally:
        stack.reset_faults()
        hog.join(20)


def test_front_door_refusals_are_admission_too(stack, tmp_path):
    """Through the real HAProxy front door: 503 + Retry-After after its queue timeout is busy, not broken."""
    from pdstack.testing.sim.launch import FrontDoorProcess

    fd = FrontDoorProcess(stack.router, tmp_path, max_concurrent_requests=1, queue_size=1, queue_timeout_secs=1)
    try:
        fd.start()
        stack.prefill.fault(slow_prefill_s=4)
        hog = threading.Thread(target=post, args=(fd.url + "/generate", {"text": "hold the only slot"}, 20))
        hog.start()
        import time
        time.sleep(0.5)
        r = probe.probe(fd.url, **FAST_PROBE)  # waits in the queue, then 503 + Retry-After
        assert r.code == probe.ADMISSION and r.http_status == 503, r
    finally:
        stack.reset_faults()
        hog.join(20)
        fd.stop()


def test_router_down():
    r = probe.probe(f"http://127.0.0.1:{free_port()}", **FAST_PROBE)
    assert r.code == probe.ROUTER_DOWN
    assert cli.main(["probe", "--url", f"http://127.0.0.1:{free_port()}"]) == probe.ROUTER_DOWN
