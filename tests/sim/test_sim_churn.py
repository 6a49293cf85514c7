"""The answers-under-churn gate against sim workers behind the real sglang-router 0.3.2: it passes on a healthy
stack and fails, showing both answers, when the decode's stale_kv fault hands an aborted request's KV pages on."""

from __future__ import annotations

import pytest
from sim_helpers import scrape, start_pd

from pdstack.controller.gates import churn
from pdstack.testing.sim.vocab import TOKENIZER_DIR as SIM_TOKENIZER

pytestmark = pytest.mark.slow

# prefill slow enough that a client can leave mid-prefill (4K tokens: 0.2 s), decode fast
TIMING = ["--prefill-tokens-per-s", "20000", "--tool-call-parser", "deepseekv4", "--recall-horizon", "0"]
ADMISSION = ["--max-concurrent-requests", "4", "--queue-size", "8", "--queue-timeout-secs", "5"]


def _gate(s, rounds: int = 2):
    return churn.run_churn_gate(s.router.url, tokenizer=SIM_TOKENIZER, lengths=[1000, 4000],
                                admission_limit=4, timeout=20, rounds=rounds)


def test_answers_hold_under_churn_and_the_victims_really_were_aborted(tmp_path):
    stack, s = start_pd(tmp_path, sim_extra=TIMING, router_extra=ADMISSION)
    with stack:
        r = _gate(s)
        aborted = scrape(s.decode.url).get("sglang:num_aborted_requests_total", 0)
    assert r.passed, r.message
    assert set(r.alone) == {"needle@1K", "needle@4K", "tool_call"}
    assert "The secret code for" in r.alone["needle@4K"] and "get_weather(" in r.alone["tool_call"]
    assert r.churn.victims_sent >= 4 and r.churn.victims_aborted_before_first_token >= 2, r.message
    assert aborted >= 2  # the disconnects reached the decode worker through the router
    assert r.seconds < 60, r.seconds


def test_stale_kv_changes_an_answer_and_fails_the_gate_showing_both(tmp_path):
    stack, s = start_pd(tmp_path, sim_extra=TIMING, router_extra=ADMISSION)
    with stack:
        s.decode.fault(stale_kv=True)
        # every fixed prompt that gets its KV while an aborted victim's late write is on the way is hit
        r = _gate(s)
    assert not r.passed
    assert r.diffs and all(d["alone"] != d["churn"] for d in r.diffs)
    assert "answers changed under churn" in r.message and "alone '" in r.message and "vs under churn" in r.message
