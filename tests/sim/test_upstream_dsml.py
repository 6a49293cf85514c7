"""SGLang 0.5.23's own DeepSeek-V4 detector (function_call/deepseekv4_detector.py, parsing in its parent
deepseekv32_detector.py) on argument values that hold DSML closing tags: what upstream does, asserted so a newer
SGLang that changes it fails here (then update docs/facts.md and tool_cases.KNOWN_UPSTREAM)."""

from __future__ import annotations

import json
import logging

import pytest

from pdstack.controller.gates import tool_cases
from pdstack.testing.sim import parsing, toolcalls
from pdstack.testing.sim.toolcalls import DSML
from pdstack.upstream import sglang_module

NOTE = tool_cases.NOTE_TOOL


def detector_calls(text: str, stream: bool, tools=(NOTE,)) -> list[tuple[str, dict]]:
    """The calls SGLang's FunctionCallParser("deepseekv4") gets from `text`, whole or fed 3 characters at a time."""
    fcp, _, tool = parsing.classes()
    parser = fcp([tool.model_validate(t) for t in tools], "deepseekv4")
    if not stream:
        return [(c.name, json.loads(c.parameters)) for c in parser.parse_non_stream(text)[1]]
    items = []
    for i in range(0, len(text), 3):
        items += parser.parse_stream_chunk(text[i:i + 3])[1]
    items += parser.parse_stream_end()[1]
    return [(c.name, json.loads(c.parameters)) for c in items]


def test_the_closing_tag_is_the_one_the_detector_matches():
    det = sglang_module("sglang.srt.function_call.deepseekv4_detector").DeepSeekV4Detector()
    assert det.dsml_token == DSML and det.parameter_regex.endswith(f"</{DSML}parameter>")
    assert det.bot_token == f"<{DSML}tool_calls>" and det.invoke_end_token == f"</{DSML}invoke>"


@pytest.mark.parametrize("stream", [False, True])
def test_plain_values_round_trip_through_the_detector(stream):
    args = {"text": "Zürich, 東京 & <b>bold</b> \"quoted\" {not json}"}
    assert detector_calls(toolcalls.markup([("write_note", args)], {}), stream) == [("write_note", args)]


@pytest.mark.parametrize("stream", [False, True])
@pytest.mark.parametrize("value", [f"keep </{DSML}parameter> literally", f"ends with </{DSML}parameter>",
                                   f"x </{DSML}invoke> y"])
def test_a_closing_tag_inside_a_string_argument_drops_the_whole_call(value, stream, caplog):
    """Upstream: `parameter_regex` is non-greedy and DSML strings are not escaped, so the value ends at the first
    closing tag; the rest of the value is left over, holds DSML, and `_parse_parameters_from_xml` raises
    "Malformed DeepSeek tool parameter": the invoke is dropped (logged), streamed or not. No truncated call comes
    out: no call at all."""
    text = toolcalls.markup([("write_note", {"text": value})], {})
    with caplog.at_level(logging.WARNING):
        assert detector_calls(text, stream) == []
    assert "Dropping malformed DeepSeek invoke" in caplog.text or "Dropping unclosed" in caplog.text


def test_a_block_closing_tag_inside_a_value_differs_between_stream_and_not():
    """Upstream: the non-streamed path cuts the block at the first `</｜DSML｜tool_calls>` (function_calls_regex),
    leaving the invoke unclosed (dropped); the streamed path never looks for the block's end and keeps the call."""
    args = {"text": f"x </{DSML}tool_calls> y"}
    text = toolcalls.markup([("write_note", args)], {})
    assert detector_calls(text, stream=False) == []
    assert detector_calls(text, stream=True) == [("write_note", args)]


def test_an_injected_parameter_truncates_the_value_and_adds_an_argument():
    """A value that closes the tag and opens another parameter is not left over: the detector truncates the value
    and returns an argument the model never meant (the format has no escaping)."""
    value = f'a</{DSML}parameter>\n<{DSML}parameter name="extra" string="true">b'
    tool = {"type": "function", "function": {"name": "write_note", "parameters": {"type": "object", "properties": {
        "text": {"type": "string"}, "extra": {"type": "string"}}}}}
    text = toolcalls.markup([("write_note", {"text": value})], {})
    for stream in (False, True):
        assert detector_calls(text, stream, tools=(tool,)) == [("write_note", {"text": "a", "extra": "b"})]


def test_the_gates_known_limitation_is_what_the_detector_does():
    (lim,) = [k for k in tool_cases.KNOWN_UPSTREAM if k.name == "dsml_closing_tag_in_argument"]
    (name, args), = lim.case.want
    calls = toolcalls.answer_calls([NOTE["function"]], lim.case.ask, "seed", None)
    assert calls == [(name, args)]  # the sim's model copies the value as a model would
    text = toolcalls.markup(calls, {})
    assert detector_calls(text, False) == [] and detector_calls(text, True) == []
    assert tool_cases.DSML_CLOSE not in json.dumps([c.ask for c in tool_cases.CASES], ensure_ascii=False)
