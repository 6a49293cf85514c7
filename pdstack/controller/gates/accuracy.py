"""The answer-quality gate of `invoke tune`: the same small question set, through the front door, on the baseline
and on every candidate; a candidate that answers measurably worse than the baseline is disqualified.

A candidate can keep recall (the needle grid) and still answer worse: a quantised indexer, a speculative-decoding
bug. SGLang's cookbook reports accuracy with `sgl-eval` (gsm8k, gpqa, aime25), which downloads its datasets; the
deployment hosts may not reach them, so this gate ships its own set (quiz.json beside this file): 20 multi-step
integer arithmetic questions, fixed, asked at temperature 0 with reasoning off through /v1/chat/completions, graded
by the last integer of the answer. Each probe carries a unique prefix (the run's id and the question's), so no
prefix cache answers it from an earlier candidate. docs/tune.md says what this set can and cannot see.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re
import secrets
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

QUIZ = Path(__file__).with_name("quiz.json")
LAST_INT = re.compile(r"-?\d+")


def questions(path: Path = QUIZ) -> list[dict[str, Any]]:
    """The shipped set: [{id, expression, answer}]."""
    return json.loads(path.read_text())["items"]


def prompt(item: dict[str, Any], run_id: str) -> str:
    return (f"Probe {run_id}-{item['id']}. Compute {item['expression']}. "
            "Answer with the number only, as: The answer is N.")


def grade(text: str, want: int) -> bool:
    """True when the last integer of the answer is the expected one."""
    got = LAST_INT.findall(text.replace(",", ""))
    return bool(got) and int(got[-1]) == want


def ask(url: str, model: str, item: dict[str, Any], run_id: str, headers: dict[str, str], timeout: float,
        retries: int = 4) -> dict[str, Any]:
    """One chat completion, graded: {id, ok, answer | error}. Retries only the front door's refusals (429/503)."""
    body = json.dumps({"model": model, "messages": [{"role": "user", "content": prompt(item, run_id)}],
                       "temperature": 0, "max_tokens": 64, "chat_template_kwargs": {"thinking": False}}).encode()
    for attempt in range(retries + 1):
        req = urllib.request.Request(url.rstrip("/") + "/v1/chat/completions", data=body, method="POST",
                                     headers={"Content-Type": "application/json", **headers})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (the deployment's front door)
                out = json.loads(r.read())
            text = out["choices"][0]["message"].get("content") or ""
            return {"id": item["id"], "ok": grade(text, item["answer"]), "answer": text[:200]}
        except urllib.error.HTTPError as e:
            if e.code in (429, 503) and attempt < retries:
                time.sleep(0.5 * 2 ** attempt)
                continue
            return {"id": item["id"], "ok": False, "error": f"HTTP {e.code}: {e.read(200).decode('utf-8', 'replace')}"}
        except (OSError, ValueError, KeyError, IndexError) as e:
            return {"id": item["id"], "ok": False, "error": f"{type(e).__name__}: {e}"}
    return {"id": item["id"], "ok": False, "error": "refused on every attempt"}


def run(url: str, model: str, *, headers: dict[str, str] | None = None, timeout: float = 120.0,
        concurrency: int = 4, items: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """Every question once: {correct, total, score, errors, answers}."""
    items = questions() if items is None else items
    run_id = secrets.token_hex(4)
    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        answers = list(pool.map(lambda it: ask(url, model, it, run_id, headers or {}, timeout), items))
    correct = sum(a["ok"] for a in answers)
    return {"correct": correct, "total": len(items), "score": round(correct / max(1, len(items)), 4),
            "errors": sum("error" in a for a in answers), "answers": answers}


def verdict(candidate: dict[str, Any], baseline: dict[str, Any] | None, max_drop: float) -> str | None:
    """Why a candidate's accuracy disqualifies it, or None. Measurably below = the score falls more than `max_drop`
    (a fraction of the set) under the baseline's; errors count as wrong answers (a broken candidate is no faster)."""
    if baseline is None:
        return None
    if candidate["score"] < baseline["score"] - max_drop - 1e-9:
        return (f"lost accuracy: {candidate['correct']}/{candidate['total']} correct against the baseline's "
                f"{baseline['correct']}/{baseline['total']} (more than accuracy_max_drop {max_drop:g} below)")
    return None


def estimate_s(n: int, decode_tps: float, concurrency: int = 4) -> float:
    """Seconds the set takes on the real host: up to 64 tokens per answer, `concurrency` at once."""
    return round(n / concurrency * 64 / max(1.0, decode_tps) + 5, 1)
