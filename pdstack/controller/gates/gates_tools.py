"""The tool-call gate of `pdstack smoke`: what agent clients do with tools, through the router, streamed and not.

Each case of tool_cases.CASES (exact argument values: non-ASCII text, a non-default integer at a sentence's end, an
object holding an array; two calls in one answer with distinct ids; tool_choice "none" -> plain text without markup,
a named function -> exactly that call, "required" -> a call even after a tool result) runs non-streamed and streamed
(the deltas assembled as a client does). The round trip sends turn 1's call and the tool's result back: the answer
must be plain content. With the reasoning parser on, a thinking request (chat_template_kwargs {"thinking": true},
DeepSeek-V4's switch) must come back with `reasoning_content` apart from `content`, streamed and not. Known upstream
limitations (tool_cases.KNOWN_UPSTREAM) are probed and reported in `known`, never failing the gate.

The checks are independent requests, so they run side by side (CONCURRENCY at a time, at most the front door's
admission limit) (as an agent client's do),
and are recorded in the order above: the first case's pair alone first (a refused API key ends the gate there),
then the other cases, then the round trip (it needs turn 1's call) beside the reasoning pair, then the known
limitations. So the gate takes about as long as its longest chain of dependent requests, not the sum of them all.
"""

from __future__ import annotations

import http.client
import json
import time
import urllib.parse
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass, field

from pdstack.controller.gates import apikey, tool_cases
from pdstack.controller.gates.tool_cases import ASK, CASES, KNOWN_UPSTREAM, MARKUP, TOOL, TOOL_RESULT, Case

THINK_QUESTION = "The secret code for Alice is 4821. What is the secret code for Alice?"
THINK_MAX_TOKENS = 2048
CONCURRENCY = 4  # checks in flight at once (at most the front door's max_concurrent_requests: agent_gates.py)
__all__ = ["ToolGateResult", "check_tool_call", "run_tool_gate"]


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
    """(problem or None, the parsed arguments) of a turn that must be one schema-valid call of `tool`."""
    case = Case("tool_call", "", (tool,), any_call=True)
    problem = tool_cases.check(msg, case)
    calls = msg.get("tool_calls") or []
    if problem is None and calls[0]["function"].get("name") != tool["function"]["name"]:
        problem = f"called {calls[0]['function'].get('name')!r}, want {tool['function']['name']!r}"
    try:
        args = json.loads(calls[0]["function"].get("arguments") or "") if calls else None
    except ValueError:
        args = None
    return problem, args


def _markup(text: str | None) -> str | None:
    return next((m for m in MARKUP if m in (text or "")), None)


@dataclass
class Check:
    name: str
    passed: bool
    detail: str
    seconds: float


@dataclass
class Known:
    """A known upstream limitation as probed: `reproduced` False means upstream may have fixed it."""

    name: str
    reproduced: bool
    detail: str
    upstream: str


@dataclass
class ToolGateResult:
    passed: bool
    checks: list[Check] = field(default_factory=list)
    seconds: float = 0.0
    refused: str | None = None  # the front door refused the API key: that, not the checks, is the message
    known: list[Known] = field(default_factory=list)

    @property
    def message(self) -> str:
        if self.refused:
            return self.refused
        bad = [c for c in self.checks if not c.passed]
        if bad:
            return "; ".join(f"{c.name}: {c.detail}" for c in bad)
        msg = f"{len(self.checks)} checks passed ({', '.join(c.name for c in self.checks)})"
        seen = [k.name for k in self.known if k.reproduced]
        fixed = [k.name for k in self.known if not k.reproduced]
        if seen:
            msg += f"; known upstream limitation reproduced, not a failure: {', '.join(sorted(set(seen)))}"
        if fixed:
            msg += (f"; known upstream limitation NOT reproduced (fixed upstream? move it to the checks): "
                    f"{', '.join(sorted(set(fixed)))}")
        return msg

    def to_dict(self) -> dict:
        return {"passed": self.passed, "seconds": self.seconds, "message": self.message,
                "checks": [asdict(c) for c in self.checks], "known_upstream": [asdict(k) for k in self.known]}


def run_tool_gate(url: str, *, model: str = "default", reasoning: bool = True, timeout: float = 120.0,
                  max_tokens: int = 512, headers: dict[str, str] | None = None, known: bool = True,
                  concurrency: int = CONCURRENCY) -> ToolGateResult:
    """`headers`: sent with every request (the front door's API key, apikey.py). `known`: probe the known upstream
    limitations too (reported in the result's `known`, never failing it). `concurrency`: checks in flight at once."""
    if concurrency < 1:
        raise ValueError(f"concurrency {concurrency}: want 1 or more")
    t0 = time.monotonic()
    checks: list[Check] = []
    refused: list[str] = []
    base = {"model": model, "temperature": 0, "max_tokens": max_tokens}

    def attempt(fn) -> str | None:
        try:
            return fn()
        except ApiKeyRefused as e:
            refused.append(str(e))
            return str(e)
        except (GateHTTPError, OSError, ValueError, KeyError, IndexError, TypeError) as e:
            return f"{type(e).__name__}: {e}"

    def timed(fn) -> tuple[str | None, float]:
        t = time.monotonic()
        problem = attempt(fn)
        return problem, round(time.monotonic() - t, 3)

    def run_all(named: list[tuple[str, object]]) -> None:
        """Run independent checks side by side; record them in the order listed."""
        if not named:
            return
        with ThreadPoolExecutor(max_workers=min(concurrency, len(named))) as pool:
            results = list(pool.map(lambda nf: timed(nf[1]), named))
        for (name, _), (problem, secs) in zip(named, results, strict=True):
            checks.append(Check(name, problem is None, problem or "ok", secs))

    first: dict = {}

    def case_check(case: Case, stream: bool):
        def go():
            msg = chat(url, case.body(base), timeout, stream, headers)
            problem = tool_cases.check(msg, case)
            if problem is None and case.name == "tool_call" and not stream:
                first.update(msg)
            return problem
        return go

    def turn2():
        if not first:
            return "skipped: turn 1 (tool_call) gave no good tool call"
        call = first["tool_calls"][0]
        messages = [{"role": "user", "content": ASK}, {"role": "assistant", "content": first.get("content") or "",
                                                       "tool_calls": [{"id": call["id"], "type": "function",
                                                                       "function": call["function"]}]},
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

    pairs = [(case.name + suffix, case_check(case, stream))
             for case in CASES for suffix, stream in (("", False), ("_stream", True))]
    run_all(pairs[:2])  # the first case alone: a refused key ends the gate after it
    if not refused:
        run_all(pairs[2:])
    if not refused:  # turn 1's call (the first case, non-streamed) is in `first` by now
        run_all([("tool_result_turn", turn2)]
                + ([("reasoning", think(False)), ("reasoning_stream", think(True))] if reasoning else []))
    found: list[Known] = []
    if known and not refused and all(c.passed for c in checks):
        probes = [(lim, stream) for lim in KNOWN_UPSTREAM for stream in (False, True)]
        with ThreadPoolExecutor(max_workers=concurrency) as pool:
            seen = list(pool.map(lambda ls: attempt(case_check(ls[0].case, ls[1])), probes))
        for (lim, stream), problem in zip(probes, seen, strict=True):
            problem = problem and problem.replace(" (is --tool-call-parser on?)", "")  # it is: the checks passed
            how = "streamed" if stream else "non-streamed"
            found.append(Known(lim.name, problem is not None,
                               f"{how}: {lim.effect}; seen: {problem}" if problem else
                               f"{how}: the call came back intact", lim.upstream))
    return ToolGateResult(all(c.passed for c in checks), checks, round(time.monotonic() - t0, 3),
                          refused[0] if refused else None, found)
