"""Tool calls and reasoning through the real sglang-router 0.3.2 and sim workers that parse with SGLang's own
DeepSeek-V4 detector and reasoning parser; the tool-call gate of `pdstack smoke` against each sim fault."""

from __future__ import annotations

import json

import pytest
from sim_helpers import post, start_pd

from pdstack.controller.gates import gates_tools

pytestmark = pytest.mark.slow

PARSERS = ["--tool-call-parser", "deepseekv4", "--reasoning-parser", "deepseek-v4"]


@pytest.fixture(scope="module")
def agent_pd(tmp_path_factory):
    stack, s = start_pd(tmp_path_factory.mktemp("tools"), sim_extra=PARSERS)
    with stack:
        yield s


def _faults(s, **kw):
    for p in (s.prefill, s.decode):
        p.fault(**kw)


def test_sglangs_detector_turns_the_markup_into_tool_calls(agent_pd):
    body = {"model": "m", "messages": [{"role": "user", "content": gates_tools.ASK}], "tools": [gates_tools.TOOL]}
    status, raw = post(agent_pd.router.url + "/v1/chat/completions", body)
    assert status == 200, raw
    choice = json.loads(raw)["choices"][0]
    assert choice["finish_reason"] == "tool_calls"
    call = choice["message"]["tool_calls"][0]
    assert call["function"]["name"] == "get_weather" and call["id"].startswith("call_")
    assert json.loads(call["function"]["arguments"]) == {"city": "Paris", "days": 3}
    assert "DSML" not in (choice["message"]["content"] or "")


def test_tool_gate_passes_with_the_parsers_on(agent_pd):
    r = gates_tools.run_tool_gate(agent_pd.router.url, timeout=20)
    assert r.passed, r.message
    assert [c.name for c in r.checks] == ["tool_call", "tool_call_stream", "tool_result_turn", "reasoning",
                                          "reasoning_stream"]


def test_malformed_tool_arguments_fail_the_gate(agent_pd):
    _faults(agent_pd, malformed_tool_args=True)
    try:
        r = gates_tools.run_tool_gate(agent_pd.router.url, timeout=20, reasoning=False)
    finally:
        _faults(agent_pd, malformed_tool_args=None)
    assert not r.passed
    bad = {c.name: c.detail for c in r.checks if not c.passed}
    assert set(bad) >= {"tool_call", "tool_call_stream"}, bad
    assert "do not match the get_weather schema" in bad["tool_call"] and "'3,'" in bad["tool_call"], bad


def test_reasoning_leaking_into_content_fails_the_gate(agent_pd):
    _faults(agent_pd, leak_reasoning=True)
    try:
        r = gates_tools.run_tool_gate(agent_pd.router.url, timeout=20)
    finally:
        _faults(agent_pd, leak_reasoning=None)
    bad = {c.name: c.detail for c in r.checks if not c.passed}
    assert set(bad) == {"reasoning", "reasoning_stream"}, bad
    assert "reasoning leaked into content" in bad["reasoning"]


def test_parsers_off_fail_the_gate_naming_the_parser(tmp_path):
    stack, s = start_pd(tmp_path)
    with stack:
        r = gates_tools.run_tool_gate(s.router.url, timeout=20)
    bad = {c.name: c.detail for c in r.checks if not c.passed}
    assert {"tool_call", "tool_call_stream", "reasoning"} <= set(bad), bad
    assert "is --tool-call-parser on?" in bad["tool_call"] and "DSML" in bad["tool_call"]
    assert "is --reasoning-parser on?" in bad["reasoning"]
