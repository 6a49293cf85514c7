"""The TEST ENGINE model's tool calls (no processes): argument values copied from the prompt, several calls per
answer, tool_choice's constraint, the garble fault, and max_tokens absent as SGLang's scheduler computes it."""

from __future__ import annotations

import json
import re

import jsonschema
import pytest

from pdstack.controller.gates import tool_cases
from pdstack.testing.sim import model, parsing, toolcalls
from pdstack.testing.sim.config import SimConfig
from pdstack.testing.sim.engine import Engine
from pdstack.testing.sim.faults import Faults
from pdstack.testing.sim.metrics import SimMetrics

TOOLS = [tool_cases.TOOL, tool_cases.TIME_TOOL, tool_cases.TRIP_TOOL]
FNS = [t["function"] for t in TOOLS]
PARAM_RE = re.compile(r'<｜DSML｜parameter name="([^"]+)" string="(true|false)">(.*?)</｜DSML｜parameter>', re.S)
INVOKE_RE = re.compile(r'<｜DSML｜invoke name="([^"]+)">(.*?)</｜DSML｜invoke>', re.S)


def calls_of(text: str) -> list[tuple[str, dict]]:
    """The calls in a DSML block, decoded as the format says (string="true": as is, else JSON)."""
    return [(name, {k: v if s == "true" else json.loads(v) for k, s, v in PARAM_RE.findall(body)})
            for name, body in INVOKE_RE.findall(text)]


def ask(content: str, tools=TOOLS, constraint=None, history=(), **kw) -> model.Answer:
    return model.answer(model.render_chat([*history, {"role": "user", "content": content}], tools=list(tools)), 0,
                        constraint=constraint, **kw)


@pytest.mark.parametrize(("said", "want"), [
    ("days=5.", 5), ("days=12!", 12), ("days=7?", 7), ("days=9", 9), ("days=4, city=Oslo", 4), ("days=6;", 6)])
def test_an_integer_keeps_its_value_at_the_end_of_a_sentence(said, want):
    (_, args), = calls_of(ask(f"Call get_weather for city=Oslo and {said}").text)
    assert args["days"] == want and isinstance(args["days"], int)


@pytest.mark.parametrize("city", ["Zürich", "São Paulo", "東京", "Москва", "Kraków-Płaszów"])
def test_strings_come_back_exactly_non_ascii_and_with_spaces_when_quoted(city):
    (_, args), = calls_of(ask(f"Call get_weather for city={json.dumps(city, ensure_ascii=False)} and days=2.").text)
    assert args == {"city": city, "days": 2}


@pytest.mark.parametrize("trip", [
    {"origin": "Genève", "stops": ["Bern", "Zürich"], "nights": 4},
    {"origin": "a", "stops": [], "nights": 1, "extra": {"deep": [1, {"x": None}]}},
    {"origin": "名古屋", "stops": ["大阪"], "nights": 10}])
def test_objects_and_arrays_given_as_json_are_copied(trip):
    (name, args), = calls_of(ask(f"Call plan_trip with trip={json.dumps(trip, ensure_ascii=False)}.").text)
    assert name == "plan_trip" and args == {"trip": trip}


def test_defaults_fill_what_the_prompt_does_not_say_and_match_the_schema():
    for fn in FNS:
        (name, args), = calls_of(ask(f"Call {fn['name']} please.").text)
        assert name == fn["name"]
        jsonschema.validate(args, fn["parameters"])
    (_, args), = calls_of(ask("Call get_weather please.").text)
    assert args["days"] == 3  # the default the gate's prompt must not equal


def test_several_calls_in_one_answer_in_the_order_asked_with_shared_and_own_arguments():
    text = ask("For days=6: call get_weather for city=Paris, then call get_time for timezone=Asia/Tokyo "
               "and call get_weather for city=Lima and days=1.").text
    assert calls_of(text) == [("get_weather", {"city": "Paris", "days": 6}), ("get_time", {"timezone": "Asia/Tokyo"}),
                              ("get_weather", {"city": "Lima", "days": 1})]
    assert text.count("<｜DSML｜tool_calls>") == 1  # one block, several invokes (DeepSeek-V4's parallel calls)


def test_a_tool_name_inside_a_json_value_is_not_a_call():
    trip = {"origin": "call get_time", "stops": ["call get_weather"], "nights": 2}
    assert calls_of(ask(f"Call plan_trip with trip={json.dumps(trip)}.").text) == [("plan_trip", {"trip": trip})]


def test_named_choice_gives_exactly_that_call_and_required_calls_even_after_a_tool_result():
    named = toolcalls.constraint_of({"type": "function", "function": {"name": "get_time"}})
    two = "Call get_weather for city=Paris and days=2. Then call get_time for timezone=Asia/Tokyo."
    assert calls_of(ask(two, constraint=named).text) == [("get_time", {"timezone": "Asia/Tokyo"})]
    # a named tool the turn does not ask for: still exactly one call of it
    assert [n for n, _ in calls_of(ask("Call get_weather for city=Rome.", constraint=named).text)] == ["get_time"]
    history = [{"role": "user", "content": two}, {"role": "assistant", "content": "", "tool_calls": [
        {"id": "call_1", "type": "function", "function": {"name": "get_time", "arguments": '{"timezone": "x"}'}}]},
        {"role": "tool", "content": "12:00"}]
    prompt = model.render_chat(history, tools=TOOLS)
    assert model.answer(prompt, 0).kind == "tool_result"  # auto: text after the result
    required = model.answer(prompt, 0, constraint=toolcalls.constraint_of("required"))
    assert required.kind == "tool_call" and len(calls_of(required.text)) == 2
    one = model.answer(prompt, 0, constraint=toolcalls.constraint_of("required", parallel_tool_calls=False))
    assert len(calls_of(one.text)) == 1
    assert toolcalls.constraint_of("auto") is None and toolcalls.constraint_of("none") is None


def test_without_tools_a_call_request_gets_plain_text():
    ans = ask("Call get_weather for city=Paris and days=2.", tools=[])
    assert ans.kind == "no_tools" and ans.natural_end and "DSML" not in ans.text


@pytest.mark.parametrize("content", [tool_cases.ASK, tool_cases.ASK_NESTED, tool_cases.ASK_TWO])
def test_garble_changes_one_value_per_call_and_keeps_it_schema_valid(content):
    good, bad = calls_of(ask(content).text), calls_of(ask(content, garble_tool_arg=True).text)
    assert [n for n, _ in good] == [n for n, _ in bad]
    for (name, g), (_, b) in zip(good, bad, strict=True):
        jsonschema.validate(b, next(f for f in FNS if f["name"] == name)["parameters"])
        assert len(tool_cases.diff(g, b, name)) == 1, (g, b)


@pytest.mark.parametrize("value", ["x", "", 5, 2.5, True, False, [1, 2], [], {"a": "b"}, {}])
def test_garble_keeps_the_type_and_changes_the_value(value):
    out = toolcalls.garble(value)
    assert type(out) is type(value) and out != value


def _engine(**cfg) -> Engine:
    return Engine(SimConfig(**cfg), SimMetrics(SimConfig(**cfg)), Faults())


@pytest.mark.parametrize(("context", "total", "n_prompt"), [(131072, 1_000_000, 100), (4096, 1_000_000, 4000),
                                                          (131072, 2048, 100), (131072, 2048, 2000)])
def test_max_tokens_absent_is_up_to_the_context_as_sglangs_scheduler(context, total, n_prompt):
    # Scheduler.init_req_max_new_tokens: min(1 << 30, max_req_len - input - 1), max_req_len = min(ctx, total) - 1;
    # then the empty-pool clip: total - ceil(input / 64) * 64 - 64 - 1
    want = max(0, min(min(context, total) - 1 - n_prompt - 1, total - -(-n_prompt // 64) * 64 - 64 - 1))
    assert _engine(context_length=context, max_total_tokens=total).default_max_new_tokens(n_prompt) == want


def test_a_seven_argument_call_without_max_tokens_ends_by_itself():
    props = {f"a{i}": {"type": "string"} for i in range(7)}
    tool = {"type": "function", "function": {"name": "seven", "parameters": {
        "type": "object", "properties": props, "required": list(props)}}}
    content = "Call seven with " + " and ".join(f"a{i}=value{i}" for i in range(7)) + "."
    prompt = model.render_chat([{"role": "user", "content": content}], tools=[tool])
    eng = _engine()
    n = eng.default_max_new_tokens(model.count_tokens(prompt))
    pieces, why = model.output_pieces(prompt, model.answer(prompt, 0), n)
    assert why == "stop" and n > 128
    assert calls_of("".join(pieces)) == [("seven", {f"a{i}": f"value{i}" for i in range(7)})]



@pytest.mark.parametrize(("body", "says"), [
    ({"tool_choice": "required"}, "Tools cannot be empty if tool choice is set to required."),
    ({"tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "Tools cannot be empty if tool choice is set to a specific tool."),
    ({"tools": [tool_cases.TOOL], "tool_choice": {"type": "function", "function": {"name": "get_time"}}},
     "Tool 'get_time' not found in tools list."),
    ({"tools": [tool_cases.TOOL], "tool_choice": "sometimes"}, "tool_choice must be"),
    ({"tools": [tool_cases.TOOL], "tool_choice": {"type": "function"}}, "want {'type': 'function'"),
])
def test_a_tool_choice_the_tools_cannot_honour_gets_sglangs_message(body, says):
    with pytest.raises(ValueError, match=re.escape(says)):
        parsing.tool_choice(body)


def test_tool_choice_defaults_and_the_tools_the_prompt_shows():
    tools = [tool_cases.TOOL, tool_cases.TIME_TOOL]
    assert parsing.tool_choice({}) == "none" and parsing.tool_choice({"tools": tools}) == "auto"
    assert parsing.prompt_tools({"tools": tools}, "none") is None
    assert parsing.prompt_tools({"tools": tools}, "auto") == tools == parsing.prompt_tools({"tools": tools}, "required")
    named = parsing.tool_choice({"tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_time"}}})
    assert parsing.prompt_tools({"tools": tools}, named) == [tool_cases.TIME_TOOL]


def test_auto_calls_only_when_the_turn_names_a_tool_required_always_calls():
    needle = "The secret code for Alice is 4821. What is the secret code for Alice?"
    auto = ask(needle)
    assert auto.kind == "needle_hit" and "DSML" not in auto.text  # tools offered, none asked for: text
    assert ask("What does get_time say for timezone=UTC?").kind == "tool_call"  # a tool named: its call
    forced = ask(needle, constraint=toolcalls.constraint_of("required"))
    assert [n for n, _ in calls_of(forced.text)] == [FNS[0]["name"]]
