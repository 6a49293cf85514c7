"""The tool-call gate of `pdstack smoke`: a function-call round trip through the router, as an agent client does it.

Turn 1 (non-streamed, then streamed) offers one tool and asks for it: finish_reason must be `tool_calls`, the call
must name the tool, and its arguments must parse as JSON and match the tool's schema (jsonschema). Turn 2 sends the
tool's result back: the answer must be plain content (finish_reason `stop`, no tool call, no raw DSML or think tags).
With the reasoning parser on, a thinking request (chat_template_kwargs {"thinking": true}, DeepSeek-V4's switch)
must come back with `reasoning_content` apart from `content`, streamed and not.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from dataclasses import asdict, dataclass, field

import jsonschema

from pdstack.controller.gates import apikey

TOOL = {"type": "function", "function": {
    "name": "get_weather", "description": "Current weather of a city, for a number of days.",
    "parameters": {"type": "object", "properties": {
        "city": {"type": "string", "description": "city name"},
        "days": {"type": "integer", "minimum": 1, "maximum": 14, "description": "days of forecast"}},
        "required": ["city", "days"], "additionalProperties": False}}}
ASK = "Call get_weather for city=Paris and days=3."
TOOL_RESULT = "sunny, 21 C"
THINK_QUESTION = "The secret code for Alice is 4821. What is the secret code for Alice?"
MARKUP = ("｜DSML｜", "<think>", "</think>")
THINK_MAX_TOKENS = 2048


class GateHTTPError(Exception):
    pass


class ApiKeyRefused(GateHTTPError):
    """The front door answered 401/403: the API key, not the model (apikey.refused says which and what to do)."""


def _check(status: int, raw: str, headers: dict[str, str] | None) -> None:
    if status != 200:
        if refusal := apikey.refused(status, headers):
            raise ApiKeyRefused(refusal)
        raise GateHTTPError(f"HTTP {status}: {raw[:300]}")


def post_json(url: str, path: str, body: dict, timeout: float, headers: dict[str, str] | None = None) -> dict:
    """POST and parse a JSON answer (non-stream). `headers`: sent with it (the front door's API key)."""
    status, raw = _post(url, path, body, timeout, headers)
    _check(status, raw, headers)
    return json.loads(raw)


def _post(url: str, path: str, body: dict, timeout: float,
          headers: dict[str, str] | None = None) -> tuple[int, str]:
    u = urllib.parse.urlsplit(url)
    conn = http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)
    try:
        conn.request("POST", path, json.dumps(body), {"Content-Type": "application/json", **(headers or {})})
        r = conn.getresponse()
        return r.status, r.read().decode("utf-8", "replace")
    finally:
        conn.close()


def stream_chat(url: str, body: dict, timeout: float, headers: dict[str, str] | None = None) -> dict:
    """A streamed chat completion folded into one message: content, reasoning_content, tool_calls, finish_reason."""
    status, raw = _post(url, "/v1/chat/completions", {**body, "stream": True}, timeout, headers)
    _check(status, raw, headers)
    content, reasoning, calls, finish = "", "", {}, None
    for block in raw.split("\n\n"):
        block = block.strip()
        if not block.startswith("data: ") or block == "data: [DONE]":
            continue
        ev = json.loads(block[6:])
        if "error" in ev:
            raise GateHTTPError(f"stream error: {ev['error']}")
        for c in ev.get("choices") or []:
            d = c.get("delta") or {}
            content += d.get("content") or ""
            reasoning += d.get("reasoning_content") or ""
            for tc in d.get("tool_calls") or []:
                slot = calls.setdefault(tc.get("index", 0), {"id": None, "name": "", "arguments": ""})
                slot["id"] = tc.get("id") or slot["id"]
                fn = tc.get("function") or {}
                slot["name"] += fn.get("name") or ""
                slot["arguments"] += fn.get("arguments") or ""
            finish = c.get("finish_reason") or finish
    tool_calls = [{"id": v["id"], "type": "function", "function": {"name": v["name"], "arguments": v["arguments"]}}
                  for _, v in sorted(calls.items())] or None
    return {"content": content or None, "reasoning_content": reasoning or None, "tool_calls": tool_calls,
            "finish_reason": finish}


def chat(url: str, body: dict, timeout: float, stream: bool, headers: dict[str, str] | None = None) -> dict:
    if stream:
        return stream_chat(url, body, timeout, headers)
    out = post_json(url, "/v1/chat/completions", body, timeout, headers)
    choice = out["choices"][0]
    return {**choice["message"], "finish_reason": choice["finish_reason"]}


def check_tool_call(msg: dict, tool: dict = TOOL) -> tuple[str | None, dict | None]:
    """(problem or None, the parsed arguments) of a turn that must be a call of `tool`."""
    fn = tool["function"]
    if msg.get("finish_reason") != "tool_calls" or not msg.get("tool_calls"):
        return (f"finish_reason {msg.get('finish_reason')!r} with no tool_calls (want tool_calls); content: "
                f"{(msg.get('content') or '')[:200]!r} (is --tool-call-parser on?)"), None
    call = msg["tool_calls"][0]["function"]
    if call.get("name") != fn["name"]:
        return f"called {call.get('name')!r}, want {fn['name']!r}", None
    try:
        args = json.loads(call.get("arguments") or "")
    except ValueError as e:
        return f"arguments are not JSON ({e}): {call.get('arguments')!r}", None
    try:
        jsonschema.validate(args, fn["parameters"])
    except jsonschema.ValidationError as e:
        return f"arguments {call.get('arguments')} do not match the {fn['name']} schema: {e.message}", args
    return None, args


def _markup(text: str | None) -> str | None:
    return next((m for m in MARKUP if m in (text or "")), None)


@dataclass
class Check:
    name: str
    passed: bool
    detail: str
    seconds: float


@dataclass
class ToolGateResult:
    passed: bool
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    refused: str | None = None  # the front door refused the API key: that, not the checks, is the message

    @property
    def message(self) -> str:
        if self.refused:
            return self.refused
        bad = [c for c in self.checks if not c.passed]
        if not bad:
            return f"{len(self.checks)} checks passed ({', '.join(c.name for c in self.checks)})"
        return "; ".join(f"{c.name}: {c.detail}" for c in bad)

    def to_dict(self) -> dict:
        return {"passed": self.passed, "seconds": self.seconds, "message": self.message,
                "checks": [asdict(c) for c in self.checks]}


def run_tool_gate(url: str, *, model: str = "default", reasoning: bool = True, timeout: float = 120.0,
                  max_tokens: int = 512, headers: dict[str, str] | None = None) -> ToolGateResult:
    """`headers`: sent with every request (the front door's API key, apikey.py)."""
    t0 = time.monotonic()
    checks: list[Check] = []
    refused: list[str] = []
    base = {"model": model, "temperature": 0, "max_tokens": max_tokens}
    ask = [{"role": "user", "content": ASK}]

    def run(name: str, fn) -> None:
        t = time.monotonic()
        try:
            problem = fn()
        except ApiKeyRefused as e:
            problem = str(e)
            refused.append(problem)
        except (GateHTTPError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            problem = f"{type(e).__name__}: {e}"
        checks.append(Check(name, problem is None, problem or "ok", round(time.monotonic() - t, 3)))

    first: dict = {}

    def turn1(stream: bool):
        def go():
            msg = chat(url, {**base, "messages": ask, "tools": [TOOL]}, timeout, stream, headers)
            problem, _ = check_tool_call(msg)
            if problem is None and not stream:
                first.update(msg)
            return problem
        return go

    def turn2():
        if not first:
            return "skipped: turn 1 gave no tool call"
        call = first["tool_calls"][0]
        messages = [*ask, {"role": "assistant", "content": first.get("content") or "", "tool_calls": [
            {"id": call["id"], "type": "function", "function": call["function"]}]},
            {"role": "tool", "tool_call_id": call["id"], "content": TOOL_RESULT}]
        msg = chat(url, {**base, "messages": messages, "tools": [TOOL]}, timeout, False, headers)
        if msg.get("tool_calls") or msg.get("finish_reason") != "stop":
            return (f"finish_reason {msg.get('finish_reason')!r}, tool_calls {msg.get('tool_calls')!r}; "
                    "want a plain answer")
        if not (msg.get("content") or "").strip():
            return "empty content"
        if m := _markup(msg.get("content")):
            return f"raw {m!r} in content: {msg['content'][:200]!r}"
        return None

    def think(stream: bool):
        def go():
            # a real model may think for a while: room for it, so the answer is not cut off (finish "length")
            msg = chat(url, {**base, "max_tokens": max(max_tokens, THINK_MAX_TOKENS),
                             "messages": [{"role": "user", "content": THINK_QUESTION}],
                             "chat_template_kwargs": {"thinking": True}}, timeout, stream, headers)
            if not (msg.get("reasoning_content") or "").strip():
                return (f"no reasoning_content with thinking on: reasoning leaked into content "
                        f"{(msg.get('content') or '')[:200]!r} (is --reasoning-parser on?)")
            if m := _markup(msg.get("content")):
                return f"raw {m!r} in content: {msg['content'][:200]!r}"
            if "4821" not in (msg.get("content") or ""):
                return f"content {(msg.get('content') or '')[:200]!r} lacks the answer (4821)"
            return None
        return go

    run("tool_call", turn1(False))
    run("tool_call_stream", turn1(True))
    run("tool_result_turn", turn2)
    if reasoning:
        run("reasoning", think(False))
        run("reasoning_stream", think(True))
    return ToolGateResult(all(c.passed for c in checks), checks, round(time.monotonic() - t0, 3),
                          refused[0] if refused else None)
