"""The sim's OpenAI layer parses its output with SGLang 0.5.23's own classes, as serving_chat.py does:
`FunctionCallParser` (function_call/function_call_parser.py, here with deepseekv4_detector.py) for `tool_calls`,
and `ReasoningParser` (parser/reasoning_parser.py) for `reasoning_content`, streamed or not. Nothing here
re-implements them; they are imported through pdstack.upstream (no sglang/__init__.py).

As SGLang: the reasoning parser runs when --reasoning-parser is set and the request does not turn
`separate_reasoning` off; DeepSeek-V4's reasoning is "explicit_thinking" (on only with chat_template_kwargs
{"thinking": true}). Tool calls are parsed when --tool-call-parser is set and the request has tools (tool_choice
not "none"); a parsed call turns finish_reason "stop" into "tool_calls".
"""

from __future__ import annotations

import functools
import uuid

from pdstack.upstream import sglang_module


@functools.cache
def classes():
    """(FunctionCallParser, ReasoningParser, Tool): importing them takes seconds (torch, via xgrammar)."""
    fcp = sglang_module("sglang.srt.function_call.function_call_parser").FunctionCallParser
    rp = sglang_module("sglang.srt.parser.reasoning_parser").ReasoningParser
    tool = sglang_module("sglang.srt.entrypoints.openai.protocol").Tool
    return fcp, rp, tool


def thinking_requested(body: dict) -> bool:
    return (body.get("chat_template_kwargs") or {}).get("thinking") is True


def tool_choice(body: dict):
    """The request's tool_choice as SGLang 0.5.23 settles and validates it (protocol.py ChatCompletionRequest
    set_tool_choice_default: absent -> "auto" with tools, else "none"; serving_chat.py _validate_request).
    Raises ValueError with SGLang's message for a choice the request's tools cannot honour."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    choice = body.get("tool_choice")
    if choice is None:
        return "auto" if body.get("tools") is not None else "none"
    if isinstance(choice, str):
        if choice not in ("auto", "required", "none"):
            raise ValueError(f"tool_choice must be 'auto', 'required', 'none' or a named function, got {choice!r}")
        if choice == "required" and not tools:
            raise ValueError("Tools cannot be empty if tool choice is set to required.")
        return choice
    name = (choice.get("function") or {}).get("name") if isinstance(choice, dict) else None
    if not isinstance(name, str):
        raise ValueError(f"tool_choice {choice!r}: want {{'type': 'function', 'function': {{'name': ...}}}}")
    if not tools:
        raise ValueError("Tools cannot be empty if tool choice is set to a specific tool.")
    if not any((t.get("function") or {}).get("name") == name for t in tools):
        raise ValueError(f"Tool '{name}' not found in tools list.")
    return {"type": "function", "function": {"name": name}}


def prompt_tools(body: dict, choice) -> list | None:
    """The tools the chat template renders (serving_chat.py _process_messages): none for "none", only the named one
    for a named choice, else all."""
    tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
    if not tools or choice == "none":
        return None
    if isinstance(choice, dict):
        return [t for t in tools if (t.get("function") or {}).get("name") == choice["function"]["name"]] or None
    return tools


class ChatParsing:
    """Per-request parsing state of one chat completion."""

    def __init__(self, body: dict, tool_call_parser: str | None, reasoning_parser: str | None):
        self.tools = [t for t in body.get("tools") or [] if isinstance(t, dict)]
        self.thinking = thinking_requested(body)
        self.reasoning = None
        self.calls = None
        self.has_tool_calls = False
        self._ids: dict[int, str] = {}
        fcp, rp, tool = classes() if (tool_call_parser or reasoning_parser) else (None, None, None)
        self._stream = bool(body.get("stream"))
        if reasoning_parser and body.get("separate_reasoning", True):
            self.reasoning = rp(model_type=reasoning_parser, stream_reasoning=bool(body.get("stream_reasoning", True)),
                                force_reasoning=self.thinking)
        choice = tool_choice(body)
        # serving_chat.py _tool_call_parsing_active: parser on, tools given, tool_choice not "none"; the parser gets
        # every tool and, as _process_tool_calls passes it, the tool_choice (deepseekv4 owns its format, so a
        # "required" / named answer is parsed by the same detector: FunctionCallParser.owns_tool_format)
        if tool_call_parser and self.tools and choice != "none":
            self._tools = [tool.model_validate(t) for t in self.tools]
            self.calls = fcp(self._tools, tool_call_parser,
                             tool_choice=choice["function"] if isinstance(choice, dict) else choice)

    def _call_id(self, index: int) -> str:
        """serving_chat.py _process_tool_call_id (every parser but kimi_k2/kimi_k3): a fresh uuid per call; streamed,
        only the call's first delta (the one with its name) carries it."""
        return self._ids.setdefault(index, f"call_{uuid.uuid4().hex[:24]}")

    # ---- whole text (non-stream)
    def parse(self, text: str, finish: str) -> tuple[str | None, str | None, list | None, str]:
        """(content, reasoning_content, tool_calls, finish_reason) of a complete answer."""
        reasoning = None
        if self.reasoning is not None:
            reasoning, text = self.reasoning.parse_non_stream(text)
        tool_calls = None
        if self.calls is not None and self.calls.has_tool_call(text):
            try:
                text, items = self.calls.parse_non_stream(text)
            except Exception:  # SGLang logs and keeps the text (serving_chat._process_tool_calls)
                items = []
            if items:
                tool_calls = [{"id": self._call_id(i), "index": i, "type": "function",
                               "function": {"name": c.name, "arguments": c.parameters}} for i, c in enumerate(items)]
                if finish == "stop":
                    finish = "tool_calls"
        return text, reasoning or None, tool_calls, finish

    # ---- streaming
    def feed(self, delta: str, final: bool = False) -> list[dict]:
        """OpenAI `delta` objects for one piece of output (final: flush what the parsers hold back)."""
        out: list[dict] = []
        if self.reasoning is not None:
            reasoning, delta = self.reasoning.parse_stream_chunk(delta)
            if final:
                r2, n2 = self.reasoning.parse_stream_end()
                reasoning, delta = (reasoning or "") + (r2 or ""), (delta or "") + (n2 or "")
            if reasoning:
                out.append({"reasoning_content": reasoning})
        if self.calls is None:
            if delta:
                out.append({"content": delta})
            return out
        normal, items = self.calls.parse_stream_chunk(delta or "")
        if final:
            end_text, end_items = self.calls.parse_stream_end()
            normal, items = (normal or "") + end_text, list(items) + list(end_items)
        if normal:
            out.append({"content": normal})
        for c in items:
            self.has_tool_calls = True
            first = bool(c.name)
            out.append({"tool_calls": [{"id": self._call_id(c.tool_index) if first else None, "index": c.tool_index,
                                        "type": "function" if first else None,
                                        "function": {"name": c.name if first else None,
                                                     "arguments": c.parameters}}]})
        return out
