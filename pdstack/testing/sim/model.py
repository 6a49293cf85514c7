"""The TEST ENGINE's deterministic "model": tokenization, prompt rendering, needle retrieval, filler text.

Needle convention (documented in README.md):
  * a needle is a sentence  `The secret code for <KEY> is <CODE>.`  anywhere in the prompt
    (<KEY>: any text without '.', '?' or a newline; <CODE>: one run of non-space characters without '.');
  * the question is  `What is the secret code for <KEY>?`  (the last such question in the prompt counts);
  * the answer is  `The secret code for <KEY> is <CODE>.`  when the needle's *distance* is within the recall horizon,
    where distance = prompt tokens from the start of the needle sentence to the end of the prompt
    (i.e. how far back from the question the model must look);
  * beyond the horizon the answer has the same shape but a deterministic wrong code (the fp8 index-key collapse:
    distant tokens never make it into the top-k); a horizon of 0 means unlimited;
  * a question whose key has no needle before it gets `I do not know the secret code for <KEY>.`
Quiz convention (the tune accuracy gate's shipped set, pdstack/controller/gates/quiz.json): the last
`Compute <EXPRESSION>.` in a prompt (integers, + - * and parentheses) is answered `The answer is <VALUE>.`; the
speed model's wrong_answers share (speed.py) of questions, chosen by a hash of the expression, get VALUE + 1.
Any other prompt gets deterministic filler words seeded by the prompt text.
"""

from __future__ import annotations

import hashlib
import json
import re
import string
from dataclasses import dataclass

from pdstack.testing.sim import toolcalls
from pdstack.testing.sim.vocab import PIECE_RE, TOKEN_RE, token_id

NEEDLE_RE = re.compile(r"The secret code for (?P<key>[^.?\n]+?) is (?P<code>[^\s.]+)\.")
CALL_RE = re.compile(r"\bcall\s+([A-Za-z_][\w.\-]*)", re.IGNORECASE)  # a turn asking for a tool call
QUESTION_RE = re.compile(r"What is the secret code for (?P<key>[^.?\n]+?)\?")
QUIZ_RE = re.compile(r"Compute (?P<expr>[0-9+\-*() ]+)\.")

FILLER_WORDS = (
    "lorem ipsum dolor sit amet consectetur adipiscing elit sed eiusmod tempor incididunt labore dolore magna "
    "aliqua river mountain forest garden window morning evening ocean island valley meadow stone silver quiet "
    "gentle bright ancient distant hidden simple steady careful patient curious"
).split()


def count_tokens(text: str) -> int:
    return len(TOKEN_RE.findall(text))


def tokenize(text: str) -> list[int]:
    return [token_id(t) for t in TOKEN_RE.findall(text)]


def pieces(text: str) -> list[str]:
    """Split text into streamable token pieces, each with its leading whitespace; ''.join(pieces) == text.strip()."""
    return PIECE_RE.findall(text.rstrip())


# DeepSeek-V4's output markup, as its chat template and SGLang 0.5.23's parsers spell it
# (function_call/deepseekv4_detector.py, parser/reasoning_parser.py DSV4_*):
DSML = toolcalls.DSML
THINK_START, THINK_END = "<think>", "</think>"
TOOLS_PREFIX = "tools: "  # first prompt line when the request has tools: their JSON (sorted keys)
REASONING_MARK = "Reasoning:"  # how the sim's reasoning text starts (tests and the leak fault look for it)


def _content_text(content) -> str:
    if isinstance(content, list):  # OpenAI content parts: keep the text parts
        return "".join(p.get("text", "") for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def render_chat(messages: list[dict], add_generation_prompt: bool = True, tools: list | None = None,
                thinking: bool = False) -> str:
    """Same rendering as the chat_template in tokenizer/tokenizer_config.json: `role: content` lines; with tools a
    first `tools: <json>` line, an assistant turn's tool calls in DSML markup, and with thinking (DeepSeek-V4's
    chat_template_kwargs `thinking`) the generation prompt opens a `<think>` block, as DeepSeek-V4's template does."""
    out = []
    if tools:
        out.append(TOOLS_PREFIX + json.dumps(tools, sort_keys=True, separators=(",", ":")) + "\n")
    for m in messages:
        content = _content_text(m.get("content"))
        calls = m.get("tool_calls") or []
        if calls:
            content += tool_call_markup([(c.get("function", {}).get("name", ""),
                                          _loads(c.get("function", {}).get("arguments"))) for c in calls], {})
        out.append(f"{m.get('role', 'user')}: {content}\n")
    if add_generation_prompt:
        out.append("assistant:" + (THINK_START if thinking else ""))
    return "".join(out)


def _loads(args) -> dict:
    if isinstance(args, dict):
        return args
    try:
        v = json.loads(args or "{}")
    except (TypeError, ValueError):
        return {}
    return v if isinstance(v, dict) else {}


def tool_call_markup(calls: list[tuple[str, dict]], schemas: dict[str, dict], malformed: bool = False) -> str:
    """DeepSeek-V4's tool-call block (toolcalls.markup)."""
    return toolcalls.markup(calls, schemas, malformed)


def _chat_turns(prompt: str) -> tuple[list | None, str, str]:
    """(tools or None, last message's role, its content) of a prompt render_chat made."""
    tools, turns = _turns(prompt)
    role, content = turns[-1] if turns else ("", "")
    return tools, role, content


def _turns(prompt: str) -> tuple[list | None, list[tuple[str, str]]]:
    """(tools or None, [(role, content)] of every message) of a prompt render_chat made."""
    tools = None
    body = prompt
    if prompt.startswith(TOOLS_PREFIX):
        first, _, body = prompt.partition("\n")
        try:
            tools = json.loads(first[len(TOOLS_PREFIX):])
        except ValueError:
            tools = None
    end = body.rfind("\nassistant:")
    head = body[:end] if end >= 0 else body
    marks = list(re.finditer(r"(?:^|\n)(?P<role>user|tool|system|assistant): ", head))
    turns = [(m.group("role"), head[m.end():(marks[i + 1].start() if i + 1 < len(marks) else len(head))])
             for i, m in enumerate(marks)]
    return tools, turns


@dataclass(frozen=True)
class Answer:
    """What the model will say for one prompt."""

    text: str  # the full answer (or filler) text, before max_new_tokens truncation
    kind: str  # "needle_hit" | "needle_miss" (beyond horizon) | "no_needle" | "filler"
    natural_end: bool  # True: the model stops by itself (EOS) after `text`; False: it would go on (filler)
    needle_distance: int | None = None  # tokens from the needle's start to the end of the prompt


def _digest(*parts: str) -> bytes:
    h = hashlib.sha256()
    for p in parts:
        h.update(p.encode("utf-8", "surrogatepass"))
        h.update(b"\0")
    return h.digest()


def wrong_code(key: str, code: str) -> str:
    """A deterministic code of the same shape (digits stay digits, letters stay letters) that differs from `code`."""
    stream = _digest("collapse", key, code) * (len(code) // 32 + 1)
    out = []
    for ch, b in zip(code, stream, strict=False):
        if ch.isdigit():
            out.append(string.digits[b % 10])
        elif ch.isalpha():
            alphabet = string.ascii_uppercase if ch.isupper() else string.ascii_lowercase
            out.append(alphabet[b % 26])
        else:
            out.append(ch)
    wrong = "".join(out)
    if wrong == code:  # force a difference in the first character
        c = code[0]
        if c.isdigit():
            repl = str((int(c) + 1) % 10)
        elif c.isalpha():
            repl = "b" if c.lower() == "a" else "a"
            repl = repl.upper() if c.isupper() else repl
        else:
            repl = "0"
        wrong = repl + wrong[1:]
    return wrong


def answer(prompt: str, recall_horizon: int, malformed_tool_args: bool = False, leak_reasoning: bool = False,
           constraint: toolcalls.Constraint | None = None, garble_tool_arg: bool = False, confuse_keys: bool = False,
           residue_fault: int | None = None, wrong_answers: float = 0.0) -> Answer:
    """The deterministic answer for a prompt. recall_horizon <= 0 means unlimited.

    Chat prompts (render_chat): with tools and a user turn last, DeepSeek-V4 tool calls as that turn asks
    (toolcalls.py conventions); with a tool result last, a plain sentence quoting it, or (tool_choice "required":
    `constraint`) calls again as the last user turn asks. A user turn that asks to `call NAME` with no tools offered
    (tool_choice "none": SGLang leaves the tools out of the prompt) gets a plain sentence saying so.
    A prompt that ends in `<think>` gets reasoning first, closed by `</think>` (the leak_reasoning fault closes the
    block before the reasoning instead, so a parser puts it in the content).
    Recall faults: `confuse_keys` matches needle keys without their digits (the nearest look-alike answers);
    `residue_fault` R gives a needle answer a wrong digit when the prompt's token count is R mod 4."""
    thinking = prompt.endswith("assistant:" + THINK_START)
    ans = _answer(prompt, recall_horizon, malformed_tool_args, constraint, garble_tool_arg, confuse_keys)
    if ans.kind == "filler" and (quiz := list(QUIZ_RE.finditer(prompt))):
        ans = quiz_answer(quiz[-1].group("expr"), wrong_answers)
    if residue_fault is not None and ans.kind == "needle_hit" and count_tokens(prompt) % 4 == residue_fault:
        m = NEEDLE_RE.fullmatch(ans.text)
        code = m.group("code") if m else ""
        i = next((i for i, ch in enumerate(code) if ch.isdigit()), None)
        if m and i is not None:  # one wrong digit, deterministically
            bad = code[:i] + str((int(code[i]) + 1) % 10) + code[i + 1:]
            ans = Answer(ans.text.replace(code, bad), "needle_miss", True, ans.needle_distance)
    if not thinking:
        return ans
    tools, role, content = _chat_turns(prompt)
    reasoning = (f"{REASONING_MARK} the {role or 'user'} turn says {' '.join(content.split()[:6])!r}; "
                 f"{'a tool call answers it' if ans.kind == 'tool_call' else 'I can answer it'}.")
    text = (THINK_END + reasoning + "\n\n" + ans.text) if leak_reasoning else (reasoning + THINK_END + ans.text)
    return Answer(text, ans.kind, ans.natural_end, ans.needle_distance)


def _answer(prompt: str, recall_horizon: int, malformed_tool_args: bool,
            constraint: toolcalls.Constraint | None = None, garble_tool_arg: bool = False,
            confuse_keys: bool = False) -> Answer:
    tools, turns = _turns(prompt)
    role, content = turns[-1] if turns else ("", "")
    fns = [t.get("function", t) for t in tools or [] if isinstance(t, dict)]
    fns = [f for f in fns if isinstance(f, dict) and f.get("name")]
    if fns and (role == "user" or (role == "tool" and constraint is not None)):
        user = next((c for r, c in reversed(turns) if r == "user"), "")
        calls = toolcalls.answer_calls(fns, user, prompt, constraint, garble_arg=garble_tool_arg)
        if calls:
            schemas = {f["name"]: f.get("parameters") or {} for f in fns}
            return Answer(toolcalls.markup(calls, schemas, malformed=malformed_tool_args), "tool_call", True)
    if tools is not None and role == "tool":
        return Answer(f"The tool returned: {' '.join(content.split())[:200]}", "tool_result", True)
    questions = list(QUESTION_RE.finditer(prompt))
    if questions:
        q = questions[-1]
        key = q.group("key").strip()
        same = (lambda k: re.sub(r"\d", "", k).strip() == re.sub(r"\d", "", key).strip()) if confuse_keys \
            else (lambda k: k == key)
        needles = [m for m in NEEDLE_RE.finditer(prompt, 0, q.start()) if same(m.group("key").strip())]
        if not needles:
            return Answer(f"I do not know the secret code for {key}.", "no_needle", True)
        needle = needles[-1]
        code = needle.group("code")
        distance = count_tokens(prompt) - count_tokens(prompt[: needle.start()])
        if recall_horizon <= 0 or distance <= recall_horizon:
            return Answer(f"The secret code for {key} is {code}.", "needle_hit", True, distance)
        return Answer(f"The secret code for {key} is {wrong_code(key, code)}.", "needle_miss", True, distance)
    if not fns and role == "user" and (asked := CALL_RE.search(content)):
        return Answer(f"I have no tool named {asked.group(1)} to call, so I answer in text.", "no_tools", True)
    return Answer("", "filler", False)  # filler words are produced lazily by `output_pieces`


def _evaluate(expr: str) -> int | None:
    """An expression of integers, + - * and parentheses, evaluated without eval(); None if it is not one."""
    toks = re.findall(r"\d+|[-+*()]", expr)
    pos = 0

    def atom() -> int:
        nonlocal pos
        t = toks[pos]
        pos += 1
        if t == "(":
            v = add()
            pos += 1  # ")"
            return v
        if t == "-":
            return -atom()
        return int(t)

    def mul() -> int:
        nonlocal pos
        v = atom()
        while pos < len(toks) and toks[pos] == "*":
            pos += 1
            v *= atom()
        return v

    def add() -> int:
        nonlocal pos
        v = mul()
        while pos < len(toks) and toks[pos] in "+-":
            op = toks[pos]
            pos += 1
            v = v + mul() if op == "+" else v - mul()
        return v

    try:
        value = add()
    except (IndexError, ValueError):
        return None
    return value if pos == len(toks) else None


def quiz_answer(expr: str, wrong_answers: float = 0.0) -> Answer:
    """`The answer is N.` for a quiz expression; the wrong_answers share of expressions (by hash) get N + 1."""
    value = _evaluate(expr)
    if value is None:
        return Answer("I cannot compute that.", "quiz", True)
    draw = int.from_bytes(_digest("quiz", expr.strip())[:8], "big") / 2 ** 64
    return Answer(f"The answer is {value + 1 if draw < wrong_answers else value}.", "quiz", True)


def filler_piece(seed: int, i: int) -> str:
    word = FILLER_WORDS[(seed + i * 7919) % len(FILLER_WORDS)]
    return (" " + word) if i % 13 != 12 else "."


def prompt_seed(prompt: str) -> int:
    return int.from_bytes(_digest("filler", prompt)[:8], "big")


def output_pieces(prompt: str, ans: Answer, max_new_tokens: int, ignore_eos: bool = False) -> tuple[list[str], str]:
    """The token pieces the model emits and why it stops: ("stop" | "length").

    A natural answer stops with EOS if it fits in max_new_tokens; filler always runs to max_new_tokens.
    With ignore_eos (as benchmarks send), a natural answer is followed by filler up to max_new_tokens.
    """
    max_new_tokens = max(0, int(max_new_tokens))
    ps = pieces(ans.text) if ans.natural_end else []
    if ans.natural_end and not ignore_eos and len(ps) <= max_new_tokens:
        return ps, "stop"
    seed = prompt_seed(prompt)
    ps = ps + [filler_piece(seed, i) for i in range(max(0, max_new_tokens - len(ps)))]
    return ps[:max_new_tokens], "length"


def piece_id(piece: str) -> int:
    return token_id(piece.strip())


__all__ = [
    "Answer",
    "answer",
    "count_tokens",
    "output_pieces",
    "piece_id",
    "pieces",
    "render_chat",
    "tokenize",
    "wrong_code",
]
