"""The real sglang-router 0.3.2 in PD mode in front of a sim prefill + sim decode (processes on 127.0.0.1)."""

from __future__ import annotations

import json
import threading
import time

import pytest
from prometheus_client.parser import text_string_to_metric_families
from sim_helpers import TRUNCATED, families, parse_sse, post, scrape, start_pd

from pdstack.testing.sim import model
from pdstack.testing.sim.launch import http_get

pytestmark = pytest.mark.slow

NEEDLE_PROMPT = "Notes. The secret code for Alice is 4821. More notes here. What is the secret code for Alice?"
ANSWER = "The secret code for Alice is 4821."


def _text(path: str, stream: bool, status: int, raw: str) -> tuple[str, str]:
    """(generated text, finish reason type) of a response in any of the API forms."""
    assert status == 200, raw
    if not stream:
        body = json.loads(raw)
        if path == "/generate":
            return body["text"], body["meta_info"]["finish_reason"]["type"]
        choice = body["choices"][0]
        return (choice["message"]["content"] if "message" in choice else choice["text"]), choice["finish_reason"]
    events = parse_sse(raw)
    assert events[-1] == "[DONE]" and all(e != "[DONE]" for e in events[:-1])
    events = events[:-1]
    assert not any("error" in e for e in events), events
    if path == "/generate":
        return events[-1]["text"], events[-1]["meta_info"]["finish_reason"]["type"]
    text, finish = "", None
    for e in events:
        for c in e["choices"]:
            text += c.get("text") or (c.get("delta") or {}).get("content") or ""
            finish = c["finish_reason"] or finish
    return text, finish


def _request(path: str, prompt: str, stream: bool, max_tokens: int = 64) -> dict:
    if path == "/generate":
        return {"text": prompt, "stream": stream, "sampling_params": {"max_new_tokens": max_tokens}}
    if path == "/v1/completions":
        return {"model": "pdstack-sim", "prompt": prompt, "stream": stream, "max_tokens": max_tokens}
    return {"model": "pdstack-sim", "messages": [{"role": "user", "content": prompt}], "stream": stream,
            "max_tokens": max_tokens}


@pytest.mark.parametrize("stream", [False, True], ids=["plain", "stream"])
@pytest.mark.parametrize("path", ["/generate", "/v1/completions", "/v1/chat/completions"])
def test_every_api_form_flows_through_the_router(pd, path, stream):
    status, raw = post(pd.router.url + path, _request(path, NEEDLE_PROMPT, stream))
    text, finish = _text(path, stream, status, raw)
    assert text == ANSWER and finish == "stop"
    # filler: max_tokens decides the length
    status, raw = post(pd.router.url + path, _request(path, "Tell me a story.", stream, max_tokens=7))
    text, finish = _text(path, stream, status, raw)
    assert finish == "length" and len(model.pieces(text)) == 7


def test_needle_within_horizon_is_answered_and_beyond_is_wrong(pd):
    """The shared stack runs with --recall-horizon 200 (distance counted from the needle to the prompt's end)."""
    def ask(pad_words: int) -> str:
        pad = " ".join(model.FILLER_WORDS[i % len(model.FILLER_WORDS)] for i in range(pad_words))
        prompt = f"{pad} The secret code for Bob is 7Q9Z. {pad} What is the secret code for Bob?"
        status, raw = post(pd.router.url + "/generate", _request("/generate", prompt, False))
        return _text("/generate", False, status, raw)[0]

    assert ask(50) == "The secret code for Bob is 7Q9Z."
    far = ask(400)
    assert far.startswith("The secret code for Bob is ") and far != "The secret code for Bob is 7Q9Z."


PD_METRICS = {
    "sglang:num_running_reqs": "gauge", "sglang:num_queue_reqs": "gauge", "sglang:token_usage": "gauge",
    "sglang:gen_throughput": "gauge", "sglang:cache_hit_rate": "gauge",
    "sglang:num_prefill_bootstrap_queue_reqs": "gauge", "sglang:num_prefill_inflight_queue_reqs": "gauge",
    "sglang:num_decode_prealloc_queue_reqs": "gauge", "sglang:num_decode_transfer_queue_reqs": "gauge",
    "sglang:hicache_host_used_tokens": "gauge", "sglang:hicache_host_total_tokens": "gauge",
    "sglang:time_to_first_token_seconds": "histogram", "sglang:inter_token_latency_seconds": "histogram",
    "sglang:e2e_request_latency_seconds": "histogram", "sglang:kv_transfer_latency_ms": "histogram",
    "sglang:generation_tokens": "counter", "sglang:num_aborted_requests": "counter",
    "sglang:num_bootstrap_failed_reqs": "counter", "sglang:num_transfer_failed_reqs": "counter",
}


def test_metrics_have_sglang_names_and_move_with_requests(pd):
    for sim in (pd.prefill, pd.decode):
        fams = families(sim.url)
        for name, typ in PD_METRICS.items():
            assert fams.get(name) == typ, f"{sim.name}: {name} is {fams.get(name)}, want {typ}"
    d0, p0 = scrape(pd.decode.url), scrape(pd.prefill.url)
    n, max_tokens = 3, 9
    for i in range(n):
        status, raw = post(pd.router.url + "/generate", _request("/generate", f"story number {i}", False, max_tokens))
        assert status == 200, raw
    d1, p1 = scrape(pd.decode.url), scrape(pd.prefill.url)
    assert d1["sglang:generation_tokens_total"] - d0["sglang:generation_tokens_total"] == n * max_tokens
    assert d1["sglang:num_requests_total"] - d0["sglang:num_requests_total"] == n
    assert d1["sglang:e2e_request_latency_seconds_count"] - d0["sglang:e2e_request_latency_seconds_count"] == n
    assert d1["sglang:inter_token_latency_seconds_count"] - d0["sglang:inter_token_latency_seconds_count"] == \
        n * (max_tokens - 1)
    assert p1["sglang:kv_transfer_latency_ms_count"] - p0["sglang:kv_transfer_latency_ms_count"] == n
    assert p1["sglang:prompt_tokens_total"] - p0["sglang:prompt_tokens_total"] == n * 3
    assert d1["sglang:gen_throughput"] > 0
    assert d1["sglang:hicache_host_total_tokens"] > 0


def test_decode_503_gives_router_503_after_retries(fresh_pd):
    s = fresh_pd
    s.decode.fault(reject_status=503)
    before = scrape(s.decode.url)["sglang:num_aborted_requests_total"]
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
    assert status == 503, raw
    attempts = scrape(s.decode.url)["sglang:num_aborted_requests_total"] - before
    assert attempts >= 2, f"router tried decode {attempts} times; expected retries"
    # streaming: the router answers 503 at once with an SSE-looking body that is not valid JSON
    # (docs/facts.md#sglang-router-032, "When decode refuses")
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", True, 3))
    assert status == 503, raw
    with pytest.raises(ValueError):
        parse_sse(raw)
    s.decode.fault(reject_status=None)
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
    assert status == 200, raw


def test_wedged_decode_keeps_health_and_router_gives_502(fresh_pd):
    s = fresh_pd
    s.decode.fault(wedge_decode=True)
    t0 = time.monotonic()
    result = {}
    th = threading.Thread(target=lambda: result.update(r=post(s.router.url + "/generate",
                                                               _request("/generate", "hi", False, 3))))
    th.start()
    time.sleep(0.5)
    assert http_get(s.decode.url + "/health")[0] == 200
    assert scrape(s.decode.url)["sglang:num_running_reqs"] >= 1  # stuck requests hold their slots
    th.join(30)
    status, raw = result["r"]
    elapsed = time.monotonic() - t0
    assert status == 502, raw
    assert elapsed >= 2 * 2 - 0.5, f"502 after {elapsed:.1f}s; expected ~request-timeout (2 s) x attempts"
    # streaming: 200 + headers, then nothing until the router's request timeout cuts the body off (no retry)
    t0 = time.monotonic()
    status, raw = post(s.router.url + "/v1/completions", _request("/v1/completions", "hi", True, 3))
    assert status == 200 and raw.endswith(TRUNCATED) and "data:" not in raw, raw
    assert 1.5 <= time.monotonic() - t0 < 4
    s.decode.fault(wedge_decode=False)
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
    assert status == 200, raw


@pytest.mark.parametrize("side", ["prefill", "decode"])
def test_transfer_failure_aborts_the_request(fresh_pd, side):
    s = fresh_pd
    getattr(s, side).fault(fail_transfer=True)
    before = scrape(s.decode.url)["sglang:num_transfer_failed_reqs_total"]
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
    assert status == 500 and "Decode transfer failed" in raw, raw
    status, raw = post(s.router.url + "/v1/chat/completions", _request("/v1/chat", "hi", True, 3))
    assert status == 200, raw
    events = parse_sse(raw)
    assert events[-1] == "[DONE]"
    err = [e for e in events[:-1] if "error" in e]
    assert err and err[0]["error"]["code"] == 500 and err[0]["error"]["type"] == "INTERNAL_SERVER_ERROR"
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", True, 3))
    events = parse_sse(raw)
    assert events[-2]["meta_info"]["finish_reason"]["type"] == "abort"
    assert events[-2]["meta_info"]["finish_reason"]["status_code"] == 500
    assert scrape(s.decode.url)["sglang:num_transfer_failed_reqs_total"] - before >= 3


def test_bootstrap_failure_and_crashed_prefill_abort_the_request(fresh_pd):
    s = fresh_pd
    s.prefill.fault(fail_bootstrap=True)
    before = scrape(s.decode.url)["sglang:num_bootstrap_failed_reqs_total"]
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
    assert status == 500 and "Decode handshake failed" in raw, raw
    assert scrape(s.decode.url)["sglang:num_bootstrap_failed_reqs_total"] - before >= 1
    assert scrape(s.prefill.url)["sglang:num_bootstrap_failed_reqs_total"] >= 1
    s.prefill.fault(fail_bootstrap=False)
    # crash: the admin call answers, then the process exits non-zero
    s.prefill.fault(crash=True, crash_exit_code=3)
    s.prefill.proc.wait(10)
    assert s.prefill.proc.returncode == 3
    # plain: decode cannot reach the prefill's bootstrap server -> aborted (500) through the router
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
    assert status == 500 and "Decode handshake failed" in raw, raw
    assert scrape(s.decode.url)["sglang:num_bootstrap_failed_reqs_total"] - before >= 2
    # stream: the router itself notices the dead prefill and answers 502 prefill_server_error
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", True, 3))
    assert status == 502 and "prefill_server_error" in raw, raw


def test_decode_503_with_default_retries_opens_the_circuit_breaker(tmp_path):
    """Router defaults: --retry-max-retries 5 means 5 attempts in all; --cb-failure-threshold 10 failures open it."""
    stack, s = start_pd(tmp_path, prefill_extra=["--bootstrap-timeout-s", "0.2"],
                        router_extra=["--retry-max-retries", "5", "--retry-max-backoff-ms", "30000"])
    with stack:
        s.decode.fault(reject_status=503)
        for _ in range(2):
            before = scrape(s.decode.url)["sglang:num_aborted_requests_total"]
            status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
            assert status == 503 and "decode_unavailable" in raw, raw
            assert scrape(s.decode.url)["sglang:num_aborted_requests_total"] - before == 5
        status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
        assert status == 503 and "server_selection_failed" in raw and "circuits open" in raw, raw
        status, raw = http_get(f"http://127.0.0.1:{s.router.metrics_port}/metrics")
        cb = {sm.labels["worker"]: sm.value for f in text_string_to_metric_families(raw.decode())
              if f.name == "smg_worker_cb_state" for sm in f.samples}
        # both breakers are open (1), the prefill's too although only decode failed
        assert cb == {s.prefill.url: 1, s.decode.url: 1}


def test_prefill_that_never_gets_the_request_leaves_decode_to_abort(fresh_pd):
    """Prefill answers 503 without starting the request: decode waits --bootstrap-timeout-s (1 s) for KV, aborts."""
    s = fresh_pd
    s.prefill.fault(reject_status=503)
    before = scrape(s.decode.url)["sglang:num_transfer_failed_reqs_total"]
    t0 = time.monotonic()
    status, raw = post(s.router.url + "/generate", _request("/generate", "hi", False, 3))
    assert status == 500 and "Decode transfer failed" in raw and "did not arrive" in raw, raw
    assert time.monotonic() - t0 >= 1.0
    assert scrape(s.decode.url)["sglang:num_transfer_failed_reqs_total"] - before >= 1
    assert scrape(s.decode.url)["sglang:generation_tokens_total"] == 0  # no token before a handover


def test_info_endpoints_say_test_engine_and_point_at_the_shipped_tokenizer(pd):
    from pdstack.testing.sim.vocab import TOKENIZER_DIR

    for sim, mode in ((pd.prefill, "prefill"), (pd.decode, "decode")):
        for path in ("/health", "/health_generate", "/ready"):
            assert http_get(sim.url + path)[0] == 200
        for path in ("/server_info", "/get_server_info", "/model_info"):
            status, raw = http_get(sim.url + path)
            info = json.loads(raw)
            assert status == 200 and info["test_engine"] is True and "TEST ENGINE" in info["engine"]
            assert info["model_path"] == str(TOKENIZER_DIR) and info["disaggregation_mode"] == mode
        status, raw = http_get(sim.url + "/v1/models")
        assert status == 200 and json.loads(raw)["data"][0]["id"] == "pdstack-sim"
        status, raw = http_get(sim.url + "/_sim/fault")
        assert status == 200 and json.loads(raw)["wedge_decode"] is False
    status, raw = post(pd.decode.url + "/_sim/fault", {"no_such_fault": True})
    assert status == 400 and "unknown fault" in raw
    # a PD server refuses requests that did not come through the router (no bootstrap info)
    status, raw = post(pd.decode.url + "/generate", {"text": "hi"})
    assert status == 400 and "bootstrap_room" in raw
