"""Mono-mode (non-PD) admission: --max-queued-requests as SGLang enforces it, and ignored in PD mode."""

from __future__ import annotations

import json
import threading
import time

import pytest
from sim_helpers import FAST, parse_sse, post, scrape, start_pd

from pdstack.testing.sim.launch import SimProcess

pytestmark = pytest.mark.slow


def _fire(url: str, bodies: list[tuple[str, dict]], gap_s: float, after: dict | None = None) -> list:
    """Send requests `gap_s` apart from threads; returns their (status, text) in order.
    `after` maps an index to a callable run right after that request was sent."""
    results: list = [None] * len(bodies)

    def one(i: int, path: str, body: dict) -> None:
        results[i] = post(url + path, body, timeout=30)

    threads = []
    for i, (path, body) in enumerate(bodies):
        th = threading.Thread(target=one, args=(i, path, body))
        th.start()
        threads.append(th)
        time.sleep(gap_s)
        if after and i in after:
            after[i]()
    for th in threads:
        th.join(40)
    return results


def test_mono_max_queued_requests_rejects_with_sglang_shapes(tmp_path):
    sim = SimProcess("mono", tmp_path, [*FAST, "--max-queued-requests", "1", "--fault-slow-prefill-s", "1.5"])
    try:
        sim.start()
        gen = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}
        chat = {"model": "m", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 2, "stream": True}
        bodies = [("/generate", gen), ("/generate", gen),  # one prefilling, one queued
                  ("/generate", gen), ("/generate", {**gen, "stream": True}), ("/v1/chat/completions", chat)]
        seen = {}
        results = _fire(sim.url, bodies, gap_s=0.15, after={1: lambda: seen.update(scrape(sim.url))})
        assert seen["sglang:num_running_reqs"] == 1 and seen["sglang:num_queue_reqs"] == 1
        assert [r[0] for r in results[:2]] == [200, 200], results[:2]
        status, raw = results[2]
        assert status == 503 and json.loads(raw) == {"object": "error", "message": "The request queue is full.",
                                                     "type": "503", "param": None, "code": 503}
        status, raw = results[3]
        events = parse_sse(raw)
        assert status == 200 and events[-1] == "[DONE]"
        fr = events[-2]["meta_info"]["finish_reason"]
        assert fr["type"] == "abort" and fr["status_code"] == 503 and fr["message"] == "The request queue is full."
        status, raw = results[4]
        events = parse_sse(raw)
        assert status == 200 and events[-2]["error"]["type"] == "SERVICE_UNAVAILABLE"
        assert events[-2]["error"]["message"] == "The request queue is full."
        m = scrape(sim.url)
        assert m["sglang:num_aborted_requests_total"] == 3
        assert m["sglang:num_requests_total"] == 2
        assert m["sglang:num_running_reqs"] == 0 and m["sglang:num_queue_reqs"] == 0
    finally:
        sim.stop()


def test_max_queued_requests_is_ignored_in_pd_mode(tmp_path):
    flags = ["--max-queued-requests", "1"]
    stack, s = start_pd(tmp_path, sim_extra=flags, prefill_extra=["--fault-slow-prefill-s", "0.4"])
    with stack:
        gen = {"text": "hello", "sampling_params": {"max_new_tokens": 2}}
        results = _fire(s.router.url, [("/generate", gen)] * 4, gap_s=0.05)
        assert [r[0] for r in results] == [200] * 4, results
        assert scrape(s.prefill.url)["sglang:num_aborted_requests_total"] == 0


def test_timing_model_prefill_and_decode_rates(tmp_path):
    """e2e ~ prompt/prefill_rate + slow_prefill + (tokens-1)/decode_rate; the first token comes out of the prefill."""
    sim = SimProcess("mono", tmp_path, ["--prefill-tokens-per-s", "1000", "--decode-tokens-per-s", "50"])
    try:
        sim.start()
        prompt = " ".join(["river"] * 200)  # 200 tokens -> 0.2 s of prefill
        t0 = time.monotonic()
        status, raw = post(sim.url + "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 11}})
        wall = time.monotonic() - t0
        assert status == 200, raw
        expected = 200 / 1000 + 10 / 50  # 0.4 s
        assert expected - 0.02 <= wall < expected + 1.0, wall
        m = scrape(sim.url)
        assert m["sglang:time_to_first_token_seconds_count"] == 1
        assert 0.18 <= m["sglang:time_to_first_token_seconds_sum"] < 0.2 + 0.5
        # the same prompt again hits the prefix cache: 192 of 200 tokens (3 pages of 64) are cached
        status, raw = post(sim.url + "/generate", {"text": prompt, "sampling_params": {"max_new_tokens": 1}})
        assert json.loads(raw)["meta_info"]["cached_tokens"] == 192
        assert scrape(sim.url)["sglang:cache_hit_rate"] > 0
    finally:
        sim.stop()


def test_crash_after_flag_exits_with_the_given_code(tmp_path):
    sim = SimProcess("mono", tmp_path, ["--fault-crash-after-s", "1", "--fault-crash-exit-code", "7"])
    try:
        sim.start()
        assert sim.proc.wait(10) == 7
    finally:
        sim.stop()
