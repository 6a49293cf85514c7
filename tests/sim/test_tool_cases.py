"""The tools gate's judgement of one answer (tool_cases.check), without servers: each class of wrong answer is named,
with the argument path and both values."""

from __future__ import annotations

import copy
import json

import pytest

from pdstack.controller.gates import tool_cases
from pdstack.controller.gates.tool_cases import CASES

BY_NAME = {c.name: c for c in CASES}


def message(calls, content="", finish="tool_calls", ids=None) -> dict:
    ids = ids or [f"call_{i}" for i in range(len(calls))]
    return {"content": content, "finish_reason": finish, "tool_calls": [
        {"id": i, "type": "function", "function": {"name": n, "arguments": json.dumps(a, ensure_ascii=False)}}
        for i, (n, a) in zip(ids, calls, strict=True)] or None}


@pytest.mark.parametrize("case", [c for c in CASES if c.want], ids=lambda c: c.name)
def test_the_wanted_calls_pass_in_any_order(case):
    assert tool_cases.check(message(list(case.want)), case) is None
    assert tool_cases.check(message(list(reversed(case.want))), case) is None


def _set(calls, path, value):
    calls = copy.deepcopy(list(calls))
    obj = calls[path[0]][1]
    for k in path[1:-1]:
        obj = obj[k]
    obj[path[-1]] = value
    return calls


@pytest.mark.parametrize(("case", "path", "value", "says"), [
    ("tool_call", (0, "days"), 3, "get_weather.days: got 3, want 5"),
    ("tool_call", (0, "days"), 5.0, "get_weather.days: got 5.0, want 5"),
    ("tool_call", (0, "days"), "5", "get_weather.days: got '5', want 5"),
    ("tool_call", (0, "city"), "Zurich", "get_weather.city: got 'Zurich', want 'Zürich'"),
    ("nested_args", (0, "trip", "stops"), [], "plan_trip.trip.stops: got [] (0 items)"),
    ("nested_args", (0, "trip", "stops", 1), "Zurich", "plan_trip.trip.stops[1]: got 'Zurich', want 'Zürich'"),
    ("nested_args", (0, "trip", "nights"), 3, "plan_trip.trip.nights: got 3, want 4"),
    ("parallel_calls", (1, "timezone"), "Asia/Tokio", "get_time.timezone: got 'Asia/Tokio'"),
])
def test_a_wrong_value_is_named_with_its_path(case, path, value, says):
    c = BY_NAME[case]
    problem = tool_cases.check(message(_set(c.want, path, value)), c)
    assert problem is not None and says in problem, problem


def test_missing_and_unexpected_keys_and_calls_are_named():
    c = BY_NAME["parallel_calls"]
    (w, t) = c.want
    assert "get_weather.days: missing, want 2" in tool_cases.check(message([(w[0], {"city": "Paris"}), t]), c)
    extra = ("get_time", {**t[1], "city": "Rome"})
    assert "get_time.city: unexpected ('Rome')" in tool_cases.check(message([w, extra]), c)
    assert "no call of get_time" in tool_cases.check(message([w]), c)
    assert "unexpected call of get_weather" in tool_cases.check(message([w, t, w]), c)
    assert "names 'nope', not an offered tool" in tool_cases.check(message([w, t, ("nope", {})]), c)


def test_ids_must_be_present_and_distinct():
    c = BY_NAME["parallel_calls"]
    assert "not distinct" in tool_cases.check(message(list(c.want), ids=["call_a", "call_a"]), c)
    assert "without an id" in tool_cases.check(message(list(c.want), ids=["call_a", None]), c)


def test_a_text_answer_or_raw_markup_fails_a_call_case():
    c = BY_NAME["tool_call"]
    assert "no tool_calls" in tool_cases.check(message([], content="<｜DSML｜tool_calls>", finish="stop"), c)
    assert "raw '｜DSML｜' in content" in tool_cases.check(message(list(c.want), content="｜DSML｜"), c)
    assert "do not match the get_weather schema" in tool_cases.check(message([("get_weather", {"city": "x"})]), c)
    bad = {**message(list(c.want)), "tool_calls": [{"id": "c", "function": {"name": "get_weather",
                                                                              "arguments": '{"city": "x",'}}]}
    assert "are not JSON" in tool_cases.check(bad, c)


def test_tool_choice_none_wants_plain_text():
    c = BY_NAME["tool_choice_none"]
    assert tool_cases.check(message([], content="I cannot call tools here.", finish="stop"), c) is None
    assert "answered with tool calls" in tool_cases.check(message([tool_cases.WEATHER_CALL]), c)
    assert "raw '｜DSML｜'" in tool_cases.check(message([], content="<｜DSML｜tool_calls>", finish="stop"), c)
    assert "empty content" in tool_cases.check(message([], content="", finish="stop"), c)


def test_tool_choice_required_wants_any_valid_call():
    c = BY_NAME["tool_choice_required"]
    assert tool_cases.check(message([("get_weather", {"city": "Oslo", "days": 1})]), c) is None
    assert "no tool_calls" in tool_cases.check(message([], content="It is sunny.", finish="stop"), c)
    assert c.messages()[-1]["role"] == "tool"  # asked after a tool result


def test_must_pass_prompts_carry_the_values_a_guess_gets_wrong():
    asks = " ".join(c.ask for c in CASES)
    assert "days=5." in asks and any(ord(ch) > 127 for ch in asks) and '"stops": [' in asks
    assert tool_cases.WEATHER_CALL[1]["days"] != 3  # the sim's default integer
