"""`pdstack recall`: needle-in-a-haystack recall through the router, over context lengths x needle depths.

The check the field team ran by hand when fp8 DSA index keys collapsed recall past ~2K tokens (docs/facts.md, The
deployment), made a deploy gate. For every (length, depth) cell it builds a prompt of exactly `length` tokens (the
model's own tokenizer) with the needle sentence `The secret code for <KEY> is <CODE>.` at `depth` % of the document
(0 % = the start, farthest from the question; 100 % = just before it), asks `What is the secret code for <KEY>?`
and grades the answer:

    pass      the answer carries the code
    wrong     it answered, without the code (the recall failure this check exists for)
    timeout   no answer within --timeout
    http      an HTTP error (5xx, 400, ...) or a broken connection
    refused   the router's admission control said 429 (queue full) or 408 (queue timeout), after --retries retries

Variants: `single` (one needle per prompt) and `multi` (--needles N needles spread over the document, each asked
for in its own request; the cell passes when all are recalled).

The **recall horizon** is the longest grid length L such that every cell at every length <= L passes (contiguous from
the shortest length; 0 when the shortest fails). `--min-horizon` turns it into a gate: exit 1 when it is lower.
Exit codes: 0 pass, 1 horizon below --min-horizon, 2 usage, 3 no cell could be graded (router unreachable).
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import json
import random
import socket
import sys
import time
import urllib.error
import urllib.request
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdstack.controller.gates import apikey, results
from pdstack.controller.gates.smoke_settings import DEFAULTS, NO_TOKENIZER, list_type
from pdstack.hostside.probe import BUSY_REASONS, REFUSAL_HEADER, ROUTER_DOWN_REASON, refusal_reason

RETRIES = 3  # retries of a 429/408 refusal
MAX_NEW_TOKENS = 32  # answer length cap
STATUSES = ("pass", "wrong", "timeout", "http", "refused")
MARK = {"pass": ".", "wrong": "X", "timeout": "T", "http": "E", "refused": "R"}
KEYS = ("amber harbor", "cobalt ridge", "linen orchard", "quartz meadow", "willow bridge", "copper lantern",
        "violet canyon", "marble garden")

# Plain, neutral prose for the haystack (no question marks, nothing that looks like a needle).
HAYSTACK = (
    "The river ran past the old mill and the morning light fell across the valley. Farmers walked along the "
    "stone path with baskets of bread, and the children followed them to the market in the square. In the "
    "evening the wind turned cold and the lamps were lit one after another along the quiet street. A simple "
    "meal was shared at the long table, and stories were told about distant islands and ancient forests. "
    "Later the clouds drifted over the mountain and the first snow of winter settled on the silver roofs. "
    "Careful hands repaired the garden wall, and patient workers carried water from the well to the fields. "
    "The library kept its windows open in summer so that the sound of the ocean reached the reading room. "
    "Travelers spoke of bright harbors, hidden valleys and the steady rhythm of the seasons in the north. "
)


class TokenCounter:
    """Counts tokens with the model's tokenizer (HF `tokenizers`, from DIR/tokenizer.json)."""

    def __init__(self, tokenizer_dir: str | Path):
        from tokenizers import Tokenizer

        path = Path(tokenizer_dir)
        f = path / "tokenizer.json" if path.is_dir() else path
        if not f.exists():
            raise FileNotFoundError(f"no tokenizer.json at {path}; pass --tokenizer DIR (the model directory)")
        self.path = str(f)
        self.tok = Tokenizer.from_file(str(f))

    def count(self, text: str) -> int:
        return len(self.tok.encode(text, add_special_tokens=False).ids)

    def offsets(self, text: str) -> list[tuple[int, int]]:
        return list(self.tok.encode(text, add_special_tokens=False).offsets)


@dataclass
class Needle:
    key: str
    code: str
    depth: float  # % of the document before the needle

    @property
    def sentence(self) -> str:
        return f"The secret code for {self.key} is {self.code}."

    @property
    def question(self) -> str:
        return f"What is the secret code for {self.key}?"


class PromptBuilder:
    """Prompts of an exact token count: haystack, needles at their depths, then one question."""

    def __init__(self, counter: TokenCounter, max_length: int):
        self.counter = counter
        text = HAYSTACK
        # enough haystack for the longest prompt, tokenized once; slices by token offsets
        while counter.count(text) < max_length + 64:
            text += HAYSTACK
        self.text = text
        self.offs = counter.offsets(text)

    def _slice(self, a: int, b: int) -> str:
        """The haystack's tokens [a, b) as text."""
        if b <= a:
            return ""
        return self.text[self.offs[a][0]:self.offs[b - 1][1]]

    def build(self, length: int, needles: list[Needle], ask: Needle) -> str:
        ordered = sorted(needles, key=lambda n: n.depth)
        fixed = " ".join(n.sentence for n in ordered) + " " + ask.question
        n_fill = max(0, length - self.counter.count(fixed) - 2)
        for _ in range(8):  # converge on the exact count (BPE merges at the seams can shift it by a token or two)
            prompt = self._compose(n_fill, ordered, ask)
            got = self.counter.count(prompt)
            if got == length or n_fill == 0 and got > length:
                return prompt
            n_fill = max(0, n_fill + (length - got))
        return prompt

    def _compose(self, n_fill: int, needles: list[Needle], ask: Needle) -> str:
        parts, pos = [], 0
        for n in needles:
            cut = round(n_fill * n.depth / 100)
            parts.append(self._slice(pos, cut))
            parts.append(n.sentence)
            pos = max(pos, cut)
        parts.append(self._slice(pos, n_fill))
        body = " ".join(p for p in parts if p)
        return f"{body}\n{ask.question}"


@dataclass
class Outcome:
    key: str
    depth: float
    status: str
    answer: str = ""
    latency_s: float = 0.0
    http_status: int | None = None
    detail: str = ""


@dataclass
class Cell:
    variant: str
    length: int
    depth: float
    prompt_tokens: int
    outcomes: list[Outcome] = field(default_factory=list)

    @property
    def status(self) -> str:
        """pass when every needle passed; else the worst outcome (refused < http < timeout < wrong)."""
        got = {o.status for o in self.outcomes}
        for s in ("wrong", "timeout", "http", "refused"):
            if s in got:
                return s
        return "pass" if got else "http"

    @property
    def score(self) -> float:
        return sum(o.status == "pass" for o in self.outcomes) / max(1, len(self.outcomes))


def ask(url: str, prompt: str, needle: Needle, timeout: float, max_new_tokens: int, retries: int,
        backoff_s: float = 1.0, headers: dict[str, str] | None = None) -> Outcome:
    """One non-streamed /generate; graded. Retries only admission refusals (429/408, 503 + Retry-After from the front
    door), with backoff. `headers`: sent with it (the front door's API key, apikey.py)."""
    body = json.dumps({"text": prompt, "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}})
    start = time.monotonic()
    for attempt in range(retries + 1):
        req = urllib.request.Request(url.rstrip("/") + "/generate", data=body.encode(), method="POST",
                                     headers={"Content-Type": "application/json", **(headers or {})})
        try:
            with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (the deployment's router)
                raw = r.read().decode("utf-8", "replace")
        except urllib.error.HTTPError as e:
            detail = e.read(300).decode("utf-8", "replace")
            reason = refusal_reason(e.code, e.headers.get(REFUSAL_HEADER), detail)
            # busy (queue full/timeout, a planned restart) is retried; the router down is not: it is the answer
            refused = reason in BUSY_REASONS or (reason is None and e.code == 503
                                                 and e.headers.get("Retry-After") is not None)
            if refused and attempt < retries:
                time.sleep(backoff_s * (2 ** attempt))
                continue
            if reason == ROUTER_DOWN_REASON:
                detail = f"router down (the front door: {REFUSAL_HEADER}: router-down): {detail}"
            detail = apikey.refused(e.code, headers) or detail
            status = "refused" if refused else "http"
            return Outcome(needle.key, needle.depth, status, latency_s=time.monotonic() - start, http_status=e.code,
                           detail=detail or f"HTTP {e.code}")
        except TimeoutError:
            return Outcome(needle.key, needle.depth, "timeout", latency_s=time.monotonic() - start,
                           detail=f"no answer within {timeout:g}s")
        except urllib.error.URLError as e:
            if isinstance(e.reason, TimeoutError | socket.timeout):
                return Outcome(needle.key, needle.depth, "timeout", latency_s=time.monotonic() - start,
                               detail=f"no answer within {timeout:g}s")
            return Outcome(needle.key, needle.depth, "http", latency_s=time.monotonic() - start, detail=str(e.reason))
        except (OSError, http.client.HTTPException) as e:
            return Outcome(needle.key, needle.depth, "http", latency_s=time.monotonic() - start, detail=repr(e))
        latency = time.monotonic() - start
        try:
            text = json.loads(raw).get("text", "")
        except (ValueError, AttributeError):
            return Outcome(needle.key, needle.depth, "http", latency_s=latency, http_status=200,
                           detail=f"not JSON: {raw[:200]!r}")
        status = "pass" if needle.code in text else "wrong"
        return Outcome(needle.key, needle.depth, status, answer=text.strip()[:200], latency_s=latency,
                       http_status=200)
    raise AssertionError("unreachable")


@dataclass
class RecallReport:
    url: str
    tokenizer: str
    lengths: list[int]
    depths: list[float]
    variants: list[str]
    needles: int
    cells: list[Cell]
    min_horizon: int
    elapsed_s: float = 0.0

    def horizon(self, variant: str | None = None) -> int:
        """Longest length L such that every cell at every length <= L passes (all variants unless one is named)."""
        best = 0
        for length in sorted(self.lengths):
            cells = [c for c in self.cells if c.length == length and (variant is None or c.variant == variant)]
            if not cells or any(c.status != "pass" for c in cells):
                break
            best = length
        return best

    def counts(self) -> dict[str, int]:
        out = dict.fromkeys(STATUSES, 0)
        for c in self.cells:
            for o in c.outcomes:
                out[o.status] += 1
        return out

    @property
    def auth_refused(self) -> str | None:
        """The front door's API-key refusal (apikey.refused), when it answered any request with 401/403."""
        return next((o.detail for c in self.cells for o in c.outcomes
                     if o.http_status in apikey.REFUSED_STATUSES), None)

    @property
    def passed(self) -> bool:
        return self.horizon() >= self.min_horizon

    def to_dict(self) -> dict[str, Any]:
        return {
            "url": self.url, "tokenizer": self.tokenizer, "lengths": self.lengths, "depths": self.depths,
            "variants": self.variants, "needles": self.needles, "min_horizon": self.min_horizon,
            "horizon": self.horizon(), "horizon_by_variant": {v: self.horizon(v) for v in self.variants},
            "passed": self.passed, "counts": self.counts(), "elapsed_s": round(self.elapsed_s, 3),
            "cells": [{**{k: v for k, v in asdict(c).items() if k != "outcomes"}, "status": c.status,
                       "score": c.score, "outcomes": [asdict(o) for o in c.outcomes]} for c in self.cells],
        }

    def table(self) -> str:
        """Depth rows x length columns per variant; '.' pass, X wrong, T timeout, E HTTP error, R refused."""
        out = []
        for v in self.variants:
            out.append(f"{v}-needle recall (rows: depth %, columns: context tokens; . pass  X wrong  T timeout  "
                       "E HTTP error  R refused)")
            out.append("depth " + "".join(f"{_k(n):>7}" for n in self.lengths))
            for d in self.depths:
                row = []
                for n in self.lengths:
                    c = next((c for c in self.cells if c.variant == v and c.length == n and c.depth == d), None)
                    row.append(MARK[c.status] if c else "-")
                out.append(f"{d:>4g}% " + "".join(f"{m:>7}" for m in row))
            out.append(f"horizon ({v}): {self.horizon(v)} tokens")
            out.append("")
        counts = self.counts()
        out.append("answers: " + ", ".join(f"{counts[s]} {s}" for s in STATUSES))
        verdict = "PASS" if self.passed else "FAIL"
        out.append(f"recall horizon {self.horizon()} tokens (min {self.min_horizon}): {verdict}")
        if self.auth_refused:
            out.append(self.auth_refused)
        return "\n".join(out)


def _k(n: int) -> str:
    return f"{n / 1000:g}K" if n >= 1000 and n % 100 == 0 else str(n)


def needle_depths(depth: float, n: int) -> list[float]:
    """The depths of n needles: the cell's depth first, the others spread evenly over the document."""
    return [depth] + [round((depth + 100 * k / n) % 100, 3) for k in range(1, n)]


def run_recall(url: str, *, lengths: list[int], depths: list[float], tokenizer: str | Path, variants: list[str],
               needles: int = DEFAULTS["needles"], concurrency: int = DEFAULTS["concurrency"],
               timeout: float = DEFAULTS["timeout"], max_new_tokens: int = MAX_NEW_TOKENS, retries: int = RETRIES,
               min_horizon: int = DEFAULTS["min_horizon"], seed: int = 0, progress=None,
               headers: dict[str, str] | None = None) -> RecallReport:
    counter = TokenCounter(tokenizer)
    builder = PromptBuilder(counter, max(lengths))
    rng = random.Random(seed)
    jobs: list[tuple[Cell, str, Needle]] = []
    cells: list[Cell] = []
    for v in variants:
        for length in lengths:
            for d in depths:
                ds = [d] if v == "single" else needle_depths(d, needles)
                ns = [Needle(KEYS[i % len(KEYS)] + (f" {i // len(KEYS)}" if i >= len(KEYS) else ""),
                             str(rng.randrange(100000, 1000000)), nd) for i, nd in enumerate(ds)]
                cell = Cell(v, length, d, 0)
                for n in ns:
                    prompt = builder.build(length, ns, n)
                    cell.prompt_tokens = counter.count(prompt)
                    jobs.append((cell, prompt, n))
                cells.append(cell)
    start = time.monotonic()
    total = len(jobs)
    with cf.ThreadPoolExecutor(max_workers=max(1, concurrency)) as pool:
        futs = {pool.submit(ask, url, p, n, timeout, max_new_tokens, retries, headers=headers): (c, n)
                for c, p, n in jobs}
        for done, fut in enumerate(cf.as_completed(futs), 1):
            cell, _ = futs[fut]
            cell.outcomes.append(fut.result())
            if progress:
                progress(done, total, time.monotonic() - start)
    for c in cells:  # keep needles in depth order for the JSON, whatever order they finished in
        c.outcomes.sort(key=lambda o: o.depth)
    return RecallReport(url=url, tokenizer=counter.path, lengths=lengths, depths=depths, variants=variants,
                        needles=needles, cells=cells, min_horizon=min_horizon, elapsed_s=time.monotonic() - start)


def print_progress(stream=None):
    """A progress line with an ETA: redrawn in place on a terminal, every ~10 % otherwise (logs, Ansible)."""
    stream = stream or sys.stderr
    tty = hasattr(stream, "isatty") and stream.isatty()
    last = [-1]

    def show(done: int, total: int, elapsed: float) -> None:
        eta = elapsed / done * (total - done) if done else 0.0
        pct = int(100 * done / total)
        line = f"recall: {done}/{total} requests ({pct}%), {elapsed:.0f}s elapsed, ETA {eta:.0f}s"
        if tty:
            stream.write("\r" + line + ("\n" if done == total else ""))
            stream.flush()
        elif pct // 10 != last[0] or done == total:
            last[0] = pct // 10
            print(line, file=stream, flush=True)
    return show


def _tokens(text: str) -> int:
    """1K -> 1000, 4096 -> 4096."""
    text = text.strip().upper()
    return int(float(text.removesuffix("K")) * (1000 if text.endswith("K") else 1))


_int_list = list_type(_tokens, lambda v: v > 0, "give positive token counts, e.g. 1K,2K,4K or 1000,2000")
_depth_list = list_type(float, lambda d: 0 <= d <= 100, "depths are percentages 0-100, e.g. 0,25,50,75,100")


def register(p: argparse.ArgumentParser) -> None:
    d = DEFAULTS  # the inventory schema's pdstack_smoke defaults, as `pdstack smoke` without -i uses them
    p.add_argument("--url", required=True, help="router URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--lengths", type=_int_list, default=d["lengths"],
                   help=f"context lengths in tokens, e.g. 1K,2K,4K (default {','.join(map(_k, d['lengths']))})")
    p.add_argument("--depths", type=_depth_list, default=d["depths"],
                   help=f"needle depths in %% of the document (default {','.join(f'{x:g}' for x in d['depths'])})")
    p.add_argument("--tokenizer", default=d["tokenizer"],
                   help="directory with the model's tokenizer.json (required: the model's own; for the sim test "
                        "engine pdstack/testing/sim/tokenizer)")
    p.add_argument("--variant", choices=("single", "multi", "both"), default=d["variant"],
                   help=f"single needle, multi-needle (--needles per prompt), or both (default {d['variant']})")
    p.add_argument("--needles", type=int, default=d["needles"],
                   help=f"needles per prompt in the multi variant (default {d['needles']})")
    p.add_argument("--concurrency", type=int, default=d["concurrency"],
                   help="requests in flight; keep it within the router's max_concurrent_requests "
                        f"(default {d['concurrency']})")
    p.add_argument("--timeout", type=float, default=d["timeout"],
                   help=f"seconds per request (default {d['timeout']:g})")
    p.add_argument("--retries", type=int, default=RETRIES,
                   help=f"retries of a 429/408 refusal, with backoff (default {RETRIES})")
    p.add_argument("--max-new-tokens", type=int, default=MAX_NEW_TOKENS,
                   help=f"answer length cap (default {MAX_NEW_TOKENS})")
    p.add_argument("--min-horizon", type=int, default=d["min_horizon"], metavar="TOKENS",
                   help=f"exit 1 when the recall horizon is below this (default {d['min_horizon']}: report only)")
    p.add_argument("--seed", type=int, default=0, help="seed of the needle codes (default 0)")
    p.add_argument("--json", metavar="FILE", help="write the full report as JSON")
    p.add_argument("--heatmap", metavar="FILE.png", help="write the depth x length heatmap")
    p.epilog = "exit codes: 0 pass, 1 horizon below --min-horizon, 2 usage, 3 nothing could be graded"


def run(args: argparse.Namespace) -> int:
    variants = ["single", "multi"] if args.variant == "both" else [args.variant]
    if not args.tokenizer:
        print(f"pdstack recall: {NO_TOKENIZER}", file=sys.stderr)
        return 2
    try:
        report = run_recall(args.url, lengths=args.lengths, depths=args.depths, tokenizer=args.tokenizer,
                            variants=variants, needles=args.needles, concurrency=args.concurrency,
                            timeout=args.timeout, max_new_tokens=args.max_new_tokens, retries=args.retries,
                            min_horizon=args.min_horizon, seed=args.seed, progress=print_progress(),
                            headers=apikey.from_env())
    except (FileNotFoundError, ImportError) as e:
        print(f"pdstack recall: {e}", file=sys.stderr)
        return 2
    print(report.table())
    if args.json:
        print(f"JSON: {results.write_json(args.json, report.to_dict())}")
    if args.heatmap:
        from pdstack.controller.gates import heatmap  # it imports this module (its marks and the report)

        print(f"heatmap: {heatmap.draw(report, args.heatmap)}")
    counts = report.counts()
    if counts["pass"] + counts["wrong"] == 0:
        print("pdstack recall: no request was answered ("
              + (report.auth_refused or "router unreachable or refusing") + "); see the JSON", file=sys.stderr)
        return 3
    return 0 if report.passed else 1
