"""What the tool-call gate asks for and what it accepts: the tools, the prompts, the exact calls they must give, and
the known upstream limitations (probed and reported, never failing the gate).

The prompts are plain sentences a real model follows as the sim's model does (pdstack/testing/sim/toolcalls.py):
`call NAME`, then `key=value` pairs, JSON for objects, arrays and strings with spaces. Each must-pass case checks a
value a model or a parser gets wrong when it guesses: a non-ASCII string, an integer that is not the sim's default
(3) at the end of a sentence, an object holding an array, two calls in one answer with distinct ids.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from pdstack.controller.load.schema import jsonschema_module

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city, for a number of days.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "city name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14, "description": "days of forecast"}},
        "required": ["city", "days"], "additionalProperties": False}}}
TIME_TOOL = {"type": "function", "function": {
    "name": "get_time", "description": "Current local time in an IANA time zone.",
    "parameters": {"type": "object", "properties": {"timezone": {"type": "string", "description": "e.g. Europe/Rome"}},
                   "required": ["timezone"], "additionalProperties": False}}}
TRIP_TOOL = {"type": "function", "function": {
    "name": "plan_trip", "description": "Plan a trip: where it starts, where it stops, how many nights.",
    "parameters": {"type": "object", "properties": {"trip": {
        "type": "object", "properties": {
            "origin": {"type": "string"}, "stops": {"type": "array", "items": {"type": "string"}, "minItems": 1},
            "nights": {"type": "integer", "minimum": 1}},
        "required": ["origin", "stops", "nights"], "additionalProperties": False}},
        "required": ["trip"], "additionalProperties": False}}}
NOTE_TOOL = {"type": "function", "function": {
    "name": "write_note", "description": "Save a note.",
    "parameters": {"type": "object", "properties": {"text": {"type": "string"}}, "required": ["text"],
                   "additionalProperties": False}}}

ASK = "Call get_weather for city=Zürich and days=5."
ASK_NESTED = 'Call plan_trip with trip={"origin": "Genève", "stops": ["Bern", "Zürich"], "nights": 4}.'
# both in one answer: "then" would let a real model wait for the first result before the second call
ASK_TWO = ("Make both calls at once, in one answer: call get_weather for city=Paris and days=2, and call get_time "
           "for timezone=Asia/Tokyo.")
WEATHER_CALL = ("get_weather", {"city": "Zürich", "days": 5})
TRIP_CALL = ("plan_trip", {"trip": {"origin": "Genève", "stops": ["Bern", "Zürich"], "nights": 4}})
TWO_CALLS = (("get_weather", {"city": "Paris", "days": 2}), ("get_time", {"timezone": "Asia/Tokyo"}))
TOOL_RESULT = "sunny, 21 C"
MARKUP = ("｜DSML｜", "<think>", "</think>")
DSML_CLOSE = "</｜DSML｜parameter>"  # deepseekv32_detector.py parameter_regex's closer (deepseekv4 inherits it)


@dataclass(frozen=True)
class Case:
    """One chat turn and what must come back. `want`: the exact calls (order free); None: no call at all (plain
    text); `any_call`: one call or more of the offered tools, schema-valid, values not checked (a model chooses)."""

    name: str
    ask: str
    tools: tuple[dict, ...]
    tool_choice: str | dict | None = None  # None: not sent (SGLang: "auto" with tools)
    want: tuple[tuple[str, dict], ...] | None = None
    any_call: bool = False
    after_result: bool = False  # asked after a tool result (the history holds WEATHER_CALL and TOOL_RESULT)

    def messages(self) -> list[dict]:
        msgs = [{"role": "user", "content": self.ask}]
        if self.after_result:
            name, args = WEATHER_CALL
            msgs += [{"role": "assistant", "content": "", "tool_calls": [{
                "id": "call_gate0", "type": "function",
                "function": {"name": name, "arguments": json.dumps(args, ensure_ascii=False)}}]},
                {"role": "tool", "tool_call_id": "call_gate0", "content": TOOL_RESULT}]
        return msgs

    def body(self, base: dict) -> dict:
        body = {**base, "messages": self.messages(), "tools": list(self.tools)}
        if self.tool_choice is not None:
            body["tool_choice"] = self.tool_choice
        return body


CASES = (
    Case("tool_call", ASK, (TOOL,), want=(WEATHER_CALL,)),
    Case("nested_args", ASK_NESTED, (TRIP_TOOL,), want=(TRIP_CALL,)),
    Case("parallel_calls", ASK_TWO, (TOOL, TIME_TOOL), want=TWO_CALLS),
    Case("tool_choice_none", ASK, (TOOL,), "none"),
    Case("tool_choice_named", ASK_TWO, (TOOL, TIME_TOOL), {"type": "function", "function": {"name": "get_time"}},
         want=(TWO_CALLS[1],)),
    Case("tool_choice_required", ASK, (TOOL,), "required", any_call=True, after_result=True),
)


@dataclass(frozen=True)
class KnownLimitation:
    """An upstream behaviour the gate knows: probed with `case` and reported, never a gate failure (docs/facts.md)."""

    name: str
    upstream: str
    effect: str
    case: Case


KNOWN_UPSTREAM = (
    KnownLimitation(
        "dsml_closing_tag_in_argument",
        "SGLang 0.5.23 sglang/srt/function_call/deepseekv32_detector.py DeepSeekV32Detector._parse_parameters_from_xml "
        "(DeepSeekV4Detector inherits it)",
        f"a string argument holding {DSML_CLOSE} ends the parameter there (non-greedy parameter_regex; the DSML "
        "format has no escaping) and the left-over tag makes the detector drop the whole call: no tool_calls",
        Case("dsml_in_argument", f'Call write_note with text="keep {DSML_CLOSE} literally".', (NOTE_TOOL,),
             want=(("write_note", {"text": f"keep {DSML_CLOSE} literally"}),))),
)


def diff(want, got, path: str) -> list[str]:
    """Where `got` differs from `want`, each as `path: got X, want Y` (types count: 5 is not 5.0 nor "5")."""
    if isinstance(want, dict) and isinstance(got, dict):
        out = []
        for k in want:
            out += diff(want[k], got[k], f"{path}.{k}") if k in got else [f"{path}.{k}: missing, want {want[k]!r}"]
        out += [f"{path}.{k}: unexpected ({got[k]!r})" for k in got if k not in want]
        return out
    if isinstance(want, list) and isinstance(got, list):
        if len(want) != len(got):
            return [f"{path}: got {got!r} ({len(got)} items), want {want!r} ({len(want)})"]
        return [d for i, (w, g) in enumerate(zip(want, got, strict=True)) for d in diff(w, g, f"{path}[{i}]")]
    if type(want) is not type(got) or want != got:
        return [f"{path}: got {got!r}, want {want!r}"]
    return []


def _markup(text: str | None) -> str | None:
    return next((m for m in MARKUP if m in (text or "")), None)


def _schema(tools: tuple[dict, ...], name: str) -> dict | None:
    return next((t["function"].get("parameters") or {} for t in tools if t["function"]["name"] == name), None)


def parsed_calls(msg: dict, case: Case) -> tuple[list[str], list[tuple[str, dict]]]:
    """(problems, [(name, arguments)]) of the calls in a message: each must name an offered tool, carry an id
    of its own, and have JSON arguments that match that tool's schema."""
    problems, calls, ids = [], [], []
    for i, tc in enumerate(msg.get("tool_calls") or []):
        fn = tc.get("function") or {}
        name, raw = fn.get("name"), fn.get("arguments")
        ids.append(tc.get("id"))
        schema = _schema(case.tools, name)
        if schema is None:
            problems.append(f"call {i} names {name!r}, not an offered tool")
            continue
        try:
            args = json.loads(raw or "")
        except ValueError as e:
            problems.append(f"{name} arguments are not JSON ({e}): {raw!r}")
            continue
        jsonschema = jsonschema_module()
        try:
            jsonschema.validate(args, schema)
        except jsonschema.ValidationError as e:
            problems.append(f"arguments {raw} do not match the {name} schema: {e.message}")
        calls.append((name, args))
    if not all(ids):
        problems.append(f"a tool call without an id: ids {ids}")
    elif len(set(ids)) != len(ids):
        problems.append(f"tool call ids are not distinct: {ids}")
    return problems, calls


def check(msg: dict, case: Case) -> str | None:
    """None when the message is what `case` wants, else what differed."""
    content = msg.get("content") or ""
    if case.want is None and not case.any_call:
        if msg.get("tool_calls") or msg.get("finish_reason") == "tool_calls":
            return (f"tool_choice {case.tool_choice!r} answered with tool calls (finish_reason "
                    f"{msg.get('finish_reason')!r}): {msg.get('tool_calls')!r}; want plain text")
        if m := _markup(content):
            return f"raw {m!r} in content: {content[:200]!r}"
        return None if content.strip() else "empty content; want a plain answer"
    if msg.get("finish_reason") != "tool_calls" or not msg.get("tool_calls"):
        return (f"finish_reason {msg.get('finish_reason')!r} with no tool_calls (want tool_calls); content: "
                f"{content[:200]!r} (is --tool-call-parser on?)")
    problems, calls = parsed_calls(msg, case)
    if m := _markup(content):
        problems.append(f"raw {m!r} in content: {content[:200]!r}")
    if case.any_call:
        return "; ".join(problems) or None
    left = list(calls)
    for name, args in case.want:
        got = next((c for c in left if c[0] == name), None)
        if got is None:
            problems.append(f"no call of {name} (calls: {[c[0] for c in calls]}, want {[w[0] for w in case.want]})")
            continue
        left.remove(got)
        problems += diff(args, got[1], name)
    problems += [f"unexpected call of {n} {json.dumps(a, ensure_ascii=False)}" for n, a in left]
    return "; ".join(problems) or None
