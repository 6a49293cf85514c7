"""The TEST ENGINE model's tool calls: which calls a user turn asks for, their argument values, and DeepSeek-V4's
DSML markup for them. Conventions (pdstack/testing/sim/README.md, "The model: needle convention", its tools items):

  * `call NAME` (the word "call", any case, then an offered tool's name) asks for one call of NAME; several such
    phrases in one turn ask for several calls in one answer, in that order (DeepSeek-V4 emits parallel calls as
    several invokes in one `tool_calls` block). Without such a phrase: one call of the first offered tool named
    anywhere in the turn; a turn naming no tool gets no call ("auto": answered as without tools), or, when the
    grammar allows only calls ("required"), a call of the first offered tool.
  * `key=VALUE` gives an argument: VALUE is JSON when it starts with `{`, `[` or `"` (objects, arrays, strings with
    spaces or any characters), else the run of characters up to a space, `,` or `;`, without a clause's final
    `.`, `!`, `?` or `:` ("days=5." gives 5). A pair belongs to the call whose phrase comes before it; pairs before the
    first phrase are shared by every call.
  * arguments: the schema's required ones, plus the optional ones the turn gives (a schema without `required`: all);
    a missing value is a deterministic one of the property's type.

What SGLang's grammar forces (serving_chat.py `_process_messages` -> FunctionCallParser.get_structure_constraint,
deepseekv4's structural tag) comes in as a `Constraint`: "required" -> at least one call, a named tool -> exactly one
call of it; `parallel_tool_calls: false` -> one call (the tag's stop_after_first).
"""

from __future__ import annotations

import hashlib
import json
import re
from dataclasses import dataclass

DSML = "｜DSML｜"
FILLER = ("river", "mountain", "forest", "garden", "window", "morning", "evening", "ocean", "island", "valley")
_KEY_RE = re.compile(r"(?<![\w.\-/])(?P<key>[A-Za-z_]\w*)=")
_TOKEN_RE = re.compile(r"[^\s,;]+")
_SENTENCE_END = ".!?:"
_DECODER = json.JSONDecoder()


@dataclass(frozen=True)
class Constraint:
    """The tool-call constraint of one request: mode "required" or "named" (then `name`)."""

    mode: str
    name: str | None = None
    parallel: bool = True


def constraint_of(tool_choice, parallel_tool_calls=True) -> Constraint | None:
    """The Constraint SGLang 0.5.23 installs for a request's tool_choice ("auto"/"none": none)."""
    parallel = parallel_tool_calls is not False
    if tool_choice == "required":
        return Constraint("required", parallel=parallel)
    if isinstance(tool_choice, dict):
        return Constraint("named", (tool_choice.get("function") or {}).get("name"), parallel=False)
    return None


def said_arguments(text: str) -> tuple[list[tuple[int, str, object]], list[tuple[int, int]]]:
    """([(position, key, value)], [(start, end) of each pair]) of the `key=VALUE` pairs in `text`.
    A JSON VALUE comes back parsed; any other VALUE as its text."""
    pairs, spans, pos = [], [], 0
    while m := _KEY_RE.search(text, pos):
        start = m.end()
        value, end = None, start
        if start < len(text) and text[start] in '{["':
            try:
                value, end = _DECODER.raw_decode(text, start)
            except ValueError:
                value = None
        if end == start:
            tok = _TOKEN_RE.match(text, start)
            if tok is None:
                pos = start
                continue
            raw = tok.group(0)
            stripped = raw.rstrip(_SENTENCE_END)
            value, end = (stripped or raw), tok.end()
        pairs.append((m.start(), m.group("key"), value))
        spans.append((m.start(), end))
        pos = end
    return pairs, spans


def plan_calls(content: str, fns: list[dict], forced: bool = False) -> list[tuple[dict, dict]]:
    """[(function, {key: said value})] for the calls a user turn asks for (the conventions above); `forced` (the
    grammar allows only calls): a turn that names no tool still gets a call of the first."""
    pairs, spans = said_arguments(content)
    by_name = {f["name"]: f for f in fns}
    names = sorted(by_name, key=len, reverse=True)
    phrase = re.compile(r"\bcall\s+(" + "|".join(re.escape(n) for n in names) + r")\b", re.IGNORECASE)
    inside = lambda i: any(a <= i < b for a, b in spans)  # noqa: E731 (a phrase inside a JSON value is not one)
    starts = [(m.start(), by_name[m.group(1)]) for m in phrase.finditer(content) if not inside(m.start())]
    if not starts:
        named = [f for f in fns if re.search(r"\b" + re.escape(f["name"]) + r"\b", content)] or fns[:forced]
        return [(named[0], {k: v for _, k, v in pairs})] if named else []
    shared = {k: v for p, k, v in pairs if p < starts[0][0]}
    out = []
    for i, (at, fn) in enumerate(starts):
        end = starts[i + 1][0] if i + 1 < len(starts) else len(content)
        out.append((fn, {**shared, **{k: v for p, k, v in pairs if at <= p < end}}))
    return out


def _digest(*parts: str) -> int:
    return int.from_bytes(hashlib.sha256("\0".join(parts).encode("utf-8", "surrogatepass")).digest()[:4], "big")


def _default(spec: dict, seed: str):
    kind = _kind(spec)
    if spec.get("enum"):
        return spec["enum"][0]
    if kind == "integer":
        value = max(3, spec.get("minimum", 3))
        return int(min(value, spec["maximum"]) if "maximum" in spec else value)
    if kind == "number":
        return 1.5
    if kind == "boolean":
        return True
    if kind == "array":
        return [_default(spec.get("items") or {}, f"{seed}/{i}") for i in range(int(spec.get("minItems", 0)))]
    if kind == "object":
        props = spec.get("properties") or {}
        return {k: _default(props.get(k) or {}, f"{seed}/{k}") for k in spec.get("required") or []}
    return FILLER[_digest("arg", seed) % len(FILLER)]


def _kind(spec: dict) -> str:
    kind = spec.get("type", "string")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "string")
    return kind


def _number(raw: str):
    try:
        return int(raw)
    except ValueError:
        return float(raw)


def argument(spec: dict, said, seed: str):
    """A value of the property's JSON-schema type: what the turn said (typed as the schema says), else a default."""
    if said is None:
        return _default(spec, seed)
    kind = _kind(spec)
    if spec.get("enum"):
        return next((e for e in spec["enum"] if e == said or str(e) == str(said)), spec["enum"][0])
    if not isinstance(said, str):  # JSON given: the model copies it
        return said
    try:
        if kind == "integer":
            return int(said)
        if kind == "number":
            return _number(said)
        if kind == "boolean" and said.lower() in ("true", "false"):
            return said.lower() == "true"
        if kind in ("array", "object"):
            return _default(spec, seed)
    except ValueError:
        return _default(spec, seed)
    return said if kind == "string" else _default(spec, seed)


def arguments(fn: dict, said: dict, seed: str) -> dict:
    params = fn.get("parameters") or {}
    props = params.get("properties") or {}
    required = params.get("required")
    names = [k for k in props if required is None or k in required or k in said]
    names += [k for k in required or [] if k not in names]
    return {k: argument(props.get(k) or {}, said.get(k), f"{seed}/{fn['name']}/{k}") for k in names}


def garble(value):
    """The same type, one visible change (the garble_tool_arg fault): a string's first letter in the other case, a
    number +1, a boolean flipped, the first element / value of an array / object garbled in turn."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, int | float):
        return value + 1
    if isinstance(value, str):
        if not value:
            return "x"
        first = value[0].swapcase() if value[0].swapcase() != value[0] else chr(ord(value[0]) + 1)
        return first + value[1:]
    if isinstance(value, list):
        return [garble(value[0]), *value[1:]] if value else [0]
    if isinstance(value, dict):
        if not value:
            return {"x": 0}
        k = next(iter(value))
        return {**value, k: garble(value[k])}
    return value


def markup(calls: list[tuple[str, dict]], schemas: dict[str, dict], malformed: bool = False) -> str:
    """DeepSeek-V4's tool-call block, the shape deepseekv4's structural tag gives (string="true": the value as is,
    without escaping; "false": JSON, as encoding_dsv32.encode_arguments_to_dsml writes them).
    `malformed` (the sim fault): every JSON-typed value is cut mid-token, and a tool whose arguments are all strings
    loses its first required one, so the arguments no longer match the tool's schema."""
    lines = ["", "", f"<{DSML}tool_calls>"]
    for name, args in calls:
        lines.append(f'<{DSML}invoke name="{name}">')
        items = list(args.items())
        if malformed and items and all(isinstance(v, str) for _, v in items):
            required = (schemas.get(name) or {}).get("required") or [items[0][0]]
            items = [(k, v) for k, v in items if k != required[0]]
        for key, value in items:
            if isinstance(value, str):
                lines.append(f'<{DSML}parameter name="{key}" string="true">{value}</{DSML}parameter>')
            else:
                text = json.dumps(value, ensure_ascii=False)
                if malformed:
                    text = text[: max(1, len(text) - 1)] + ","
                lines.append(f'<{DSML}parameter name="{key}" string="false">{text}</{DSML}parameter>')
        lines.append(f"</{DSML}invoke>")
    lines.append(f"</{DSML}tool_calls>")
    return "\n".join(lines)


def answer_calls(fns: list[dict], content: str, seed: str, constraint: Constraint | None,
                 garble_arg: bool = False) -> list[tuple[str, dict]]:
    """The calls the model makes for a user turn `content` with `fns` offered (and the grammar's constraint)."""
    planned = plan_calls(content, fns, forced=constraint is not None)
    if constraint is not None and constraint.mode == "named":
        fn = next((f for f in fns if f["name"] == constraint.name), None)
        if fn is None:
            return []
        planned = [p for p in planned if p[0] is fn] or [(fn, {k: v for _, k, v in said_arguments(content)[0]})]
    if constraint is not None and not constraint.parallel:
        planned = planned[:1]
    calls = [(fn["name"], arguments(fn, said, seed)) for fn, said in planned]
    if garble_arg:
        calls = [(n, {**a, next(iter(a)): garble(a[next(iter(a))])} if a else a) for n, a in calls]
    return calls
