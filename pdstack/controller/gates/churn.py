"""The answers-under-churn gate of `pdstack smoke`: greedy answers must not change when the system is busy.

A fixed set of prompts (needles at several lengths, and a tool call) is asked alone, one at a time, with
temperature 0. Then the same prompts are asked again while
  * victim requests (long prompts, streamed) are aborted mid-prefill and mid-transfer by client disconnects, at
    fractions of a victim's time to first token measured alone (so before any token came back), and
  * the front door is held at its admission limit (pdstack_router.admission.max_concurrent_requests long requests
    in flight plus a burst over it; a fixed prompt refused with 408/429/503 is asked again, that is admission).
Any answer that differs fails the gate and both answers are shown. This is the class of PD bug where a request's
KV pages are written by another (aborted) request (SGLang PR 24878, issue 13054): one idle needle cannot see it.
"""

from __future__ import annotations

import http.client
import json
import random
import socket
import threading
import time
import urllib.parse
from dataclasses import asdict, dataclass, field
from pathlib import Path

from pdstack.controller.gates import apikey, recall_report
from pdstack.controller.gates.needles import KEYS, Needle, PromptBuilder, TokenCounter
from pdstack.controller.gates.tool_cases import ASK, TOOL

DEFAULT_LENGTHS = [1000, 4000, 16000]
DISCONNECT_FRACTIONS = (0.2, 0.5, 0.8, 0.95)  # of the victim's alone TTFT: mid-prefill ... mid-transfer
REFUSED = (408, 429, 503)
# an admission holder's answer: long enough to stay in flight while a fixed prompt is asked, short enough that a
# fixed prompt queued behind the holders at the limit waits a few seconds, not a holder's whole answer
HOLDER_TOKENS = 128
# plain words every tokenizer (the sim's included) knows, so a random run of them is a prompt prefix never seen before
NONCE_WORDS = ("river", "mountain", "garden", "window", "morning", "evening", "ocean", "valley", "stone", "silver",
               "quiet", "bright", "ancient", "distant", "hidden", "simple", "steady", "patient", "winter", "summer")


def _conn(url: str, timeout: float) -> http.client.HTTPConnection:
    u = urllib.parse.urlsplit(url)
    return http.client.HTTPConnection(u.hostname, u.port or 80, timeout=timeout)


def _send(c: http.client.HTTPConnection, body: dict, headers: dict[str, str] | None) -> None:
    c.request("POST", "/v1/chat/completions", json.dumps(body), {"Content-Type": "application/json", **(headers or {})})


def _chat_body(model: str, prompt: str, max_tokens: int, **extra) -> dict:
    return {"model": model, "messages": [{"role": "user", "content": prompt}], "temperature": 0,
            "max_tokens": max_tokens, **extra}


def answer_of(url: str, body: dict, timeout: float, deadline: float,
              headers: dict[str, str] | None = None) -> tuple[str, int]:
    """A greedy answer as one comparable string (content, plus name and arguments of tool calls), and how many
    times admission refused it first. `headers`: sent with it (the front door's API key)."""
    refused = 0
    while True:
        c = _conn(url, timeout)
        try:
            _send(c, body, headers)
            r = c.getresponse()
            raw = r.read().decode("utf-8", "replace")
        finally:
            c.close()
        if r.status in REFUSED and time.monotonic() < deadline:
            refused += 1
            time.sleep(min(2.0, 0.1 * refused))
            continue
        if r.status != 200:
            return f"<HTTP {r.status}: {apikey.refused(r.status, headers) or raw[:200]}>", refused
        msg = json.loads(raw)["choices"][0]["message"]
        calls = [f"{t['function']['name']}({t['function']['arguments']})" for t in msg.get("tool_calls") or []]
        return (msg.get("content") or "") + ("".join(" -> " + c for c in calls)), refused


def _has_token(line: bytes) -> bool:
    """An SSE line that carries output (not the role-only first chunk, not [DONE])."""
    if not line.startswith(b"data: {"):
        return False
    try:
        ev = json.loads(line[6:])
    except ValueError:
        return False
    return any((c.get("delta") or {}).get(k) for c in ev.get("choices") or []
               for k in ("content", "reasoning_content", "tool_calls"))


def ttft(url: str, body: dict, timeout: float, headers: dict[str, str] | None = None) -> float:
    t0 = time.monotonic()
    c = _conn(url, timeout)
    try:
        _send(c, {**body, "stream": True}, headers)
        r = c.getresponse()
        while True:
            line = r.fp.readline()
            if not line:
                break
            if _has_token(line):
                return time.monotonic() - t0
        return time.monotonic() - t0
    finally:
        c.close()


def disconnect_after(url: str, body: dict, seconds: float, timeout: float,
                     headers: dict[str, str] | None = None) -> bool:
    """Send a streamed request and drop the connection after `seconds`; True when no token had come back."""
    c = _conn(url, timeout)
    got_token = False
    try:
        _send(c, {**body, "stream": True}, headers)
        c.sock.settimeout(max(0.01, seconds))
        t_end = time.monotonic() + seconds
        try:
            r = c.getresponse()
            while time.monotonic() < t_end:
                line = r.fp.readline()
                if not line:
                    break
                if _has_token(line):
                    got_token = True
                    break
        except (OSError, http.client.HTTPException):
            pass
    finally:
        try:
            c.sock and c.sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        c.close()
    return not got_token


@dataclass
class Churn:
    victims_sent: int = 0
    victims_aborted_before_first_token: int = 0
    holders_sent: int = 0
    holders_refused: int = 0
    fixed_refused: int = 0
    victim_ttft_s: float = 0.0


@dataclass
class ChurnResult:
    passed: bool
    seconds: float
    alone: dict[str, str]
    under_churn: dict[str, list[str]]
    diffs: list[dict] = field(default_factory=list)
    churn: Churn = field(default_factory=Churn)
    problem: str | None = None

    @property
    def message(self) -> str:
        if self.problem:
            return self.problem
        c = self.churn
        load = (f"{c.victims_sent} victims disconnected ({c.victims_aborted_before_first_token} before their first "
                f"token; alone TTFT {c.victim_ttft_s:.2f} s), {c.holders_sent} admission holders "
                f"({c.holders_refused} refused), fixed prompts refused {c.fixed_refused}x")
        if not self.diffs:
            return f"{len(self.alone)} answers unchanged under churn; {load}"
        shown = "; ".join(f"{d['prompt']}: alone {d['alone']!r} vs under churn {d['churn']!r}" for d in self.diffs[:3])
        return f"{len(self.diffs)} answers changed under churn: {shown}; {load}"

    def to_dict(self) -> dict:
        return {"passed": self.passed, "seconds": self.seconds, "message": self.message, "alone": self.alone,
                "under_churn": self.under_churn, "diffs": self.diffs, "churn": asdict(self.churn)}


def fixed_prompts(tokenizer: str | Path, lengths: list[int], model: str, max_tokens: int) -> dict[str, dict]:
    builder = PromptBuilder(TokenCounter(tokenizer), max(lengths))
    out = {}
    for i, n in enumerate(lengths):
        needle = Needle(KEYS[i % len(KEYS)], f"{4821 + 1117 * i}", 50.0)
        out[f"needle@{recall_report.kilo(n)}"] = _chat_body(model, builder.build(n, [needle], needle), max_tokens)
    out["tool_call"] = _chat_body(model, ASK, max(max_tokens, 256), tools=[TOOL])
    return out


def run_churn_gate(url: str, *, tokenizer: str | Path, lengths: list[int] | None = None, model: str = "default",
                   admission_limit: int = -1, timeout: float = 120.0, rounds: int = 2, victims: int = 2,
                   max_tokens: int = 48, seed: int | None = None,
                   headers: dict[str, str] | None = None) -> ChurnResult:
    """`headers`: sent with every request (the front door's API key, apikey.py). `seed`: of the victims' nonces;
    None (the gate's default) draws a fresh one, so no run's victims are in the prefix cache from an earlier run (a
    fixed seed made every deploy after the first send cached victims: TTFT 0.03 s instead of 0.5 s, never aborted
    mid-prefill, and thousands of them a minute)."""
    t0 = time.monotonic()
    lengths = lengths or DEFAULT_LENGTHS
    prompts = fixed_prompts(tokenizer, lengths, model, max_tokens)
    deadline = t0 + timeout * (len(prompts) * (rounds + 1) + 2)
    alone = {name: answer_of(url, body, timeout, deadline, headers)[0] for name, body in prompts.items()}
    bad = {k: v for k, v in alone.items() if v.startswith("<HTTP")}
    if bad:
        status = next((st for st in apikey.REFUSED_STATUSES for v in bad.values() if v.startswith(f"<HTTP {st}:")),
                      None)
        return ChurnResult(False, round(time.monotonic() - t0, 3), alone, {},
                           problem=apikey.refused(status, headers) or f"asked alone, prompts failed: {bad}")

    rng = random.Random(seed if seed is not None else random.SystemRandom().getrandbits(64))
    builder = PromptBuilder(TokenCounter(tokenizer), max(lengths))
    vkey = Needle("victim", "0000", 50.0)

    def victim_body() -> dict:  # a fresh first sentence each time, so the prefix cache cannot shortcut its prefill
        nonce = " ".join(rng.choice(NONCE_WORDS) for _ in range(16)).capitalize() + ". "
        return _chat_body(model, nonce + builder.build(max(lengths), [vkey], vkey), 64)

    churn = Churn(victim_ttft_s=ttft(url, victim_body(), timeout, headers))
    stop = threading.Event()
    lock = threading.Lock()

    def victim_loop(k: int) -> None:
        i = k
        while not stop.is_set():
            frac = DISCONNECT_FRACTIONS[i % len(DISCONNECT_FRACTIONS)]
            i += 1
            before = disconnect_after(url, victim_body(), frac * churn.victim_ttft_s, timeout, headers)
            with lock:
                churn.victims_sent += 1
                churn.victims_aborted_before_first_token += int(before)

    def holder_loop() -> None:  # keeps one long request in flight at the front door
        while not stop.is_set():
            body = _chat_body(model, f"Tell a long story {rng.getrandbits(32):x}.", HOLDER_TOKENS)
            c = _conn(url, timeout)
            try:
                _send(c, body, headers)
                r = c.getresponse()
                r.read()
                with lock:
                    churn.holders_sent += 1
                    churn.holders_refused += int(r.status in REFUSED)
                if r.status in REFUSED:
                    time.sleep(0.05)
            except (OSError, http.client.HTTPException):
                time.sleep(0.05)
            finally:
                c.close()

    holders = admission_limit + max(1, admission_limit // 4) if admission_limit > 0 else 0  # at the limit, and over
    threads = [threading.Thread(target=victim_loop, args=(k,), daemon=True) for k in range(victims)]
    threads += [threading.Thread(target=holder_loop, daemon=True) for _ in range(holders)]
    for t in threads:
        t.start()
    under: dict[str, list[str]] = {name: [] for name in prompts}
    try:
        time.sleep(min(2.0, max(0.2, churn.victim_ttft_s)))  # let the churn start before the first fixed prompt
        for _ in range(rounds):
            for name, body in prompts.items():
                ans, refused = answer_of(url, body, timeout, deadline, headers)
                churn.fixed_refused += refused
                under[name].append(ans)
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=timeout)
    diffs = [{"prompt": name, "alone": alone[name], "churn": a} for name, answers in under.items()
             for a in answers if a != alone[name]]
    return ChurnResult(not diffs, round(time.monotonic() - t0, 3), alone, under, diffs, churn)
