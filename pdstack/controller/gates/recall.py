"""`pdstack recall`: needle-in-a-haystack recall through the router, over case kinds x context lengths x depths.

The check the field team ran by hand when fp8 DSA index keys collapsed recall past ~2K tokens (docs/facts.md, The
deployment), made a deploy gate. For every (kind, length, depth) cell it builds a prompt of exactly `length` tokens
less its jitter (the model's own tokenizer) with the needle sentence `The secret code for <KEY> is <CODE>.` at
`depth` % of the document (0 % = the start, farthest from the question; 100 % = just before it), asks
`What is the secret code for <KEY>?` and grades the answer:

    pass      the answer carries the code
    wrong     it answered, without the code (the recall failure this check exists for)
    timeout   no answer within --timeout
    http      an HTTP error (5xx, 400, ...) or a broken connection
    refused   the router's admission control said 429 (queue full) or 408 (queue timeout), after --retries retries

Case kinds (--variant; pdstack_smoke.grid.variant): `single` (one needle per prompt), `multikey` (--needles N
needles whose keys differ only in a number, `amber harbor 41` / `amber harbor 14` / ..., spread over the document;
the one at the cell's depth is asked for: the case that caught a DeepSeek indexer bug single needles missed,
sgl-project/sglang issue 13439) and `multi` (N needles with distinct keys, each asked for in its own request; the
cell passes when all are recalled).

Every prompt opens with a fresh unique record line (a per-run nonce and the prompt's number), so no prefix cache can
answer it from an earlier prompt or run; each cell's length is jittered down by 0..--jitter tokens
(load/recall_grid.py: the offsets cycle, so each length asks several residues); reasoning is off, as the prompt is
raw text to /generate (no chat template opens a thinking block). The cells, and what they cost on the real host,
are load/recall_grid.py's.

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
import secrets
import socket
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from pdstack.controller.gates import apikey, heatmap, results
from pdstack.controller.gates.needles import (
    Needle,
    PromptBuilder,
    TokenCounter,
    cell_needles,
)
from pdstack.controller.gates.recall_report import Cell, Outcome, RecallReport, kilo
from pdstack.controller.gates.smoke_settings import DEFAULTS, NO_TOKENIZER, list_type
from pdstack.controller.load import recall_grid
from pdstack.controller.load.smoke_schema import KINDS
from pdstack.hostside.probe import BUSY_REASONS, REFUSAL_HEADER, ROUTER_DOWN_REASON, refusal_reason

RETRIES = 3  # retries of a 429/408 refusal
MAX_NEW_TOKENS = 32  # answer length cap
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


def run_recall(url: str, *, lengths: list[int], depths: list[float], tokenizer: str | Path, variants: list[str],
               needles: int = DEFAULTS["needles"], concurrency: int = DEFAULTS["concurrency"],
               timeout: float = DEFAULTS["timeout"], max_new_tokens: int = MAX_NEW_TOKENS, retries: int = RETRIES,
               min_horizon: int = DEFAULTS["min_horizon"], seed: int = 0, progress=None,
               headers: dict[str, str] | None = None, jitter: int = DEFAULTS["jitter"],
               context_length: int | None = None, nonce: str | None = None) -> RecallReport:
    """`nonce`: the run's part of every prompt's unique record line (default: fresh random hex)."""
    t0 = time.monotonic()
    counter = TokenCounter(tokenizer)
    grid = {"lengths": lengths, "depths": depths, "variant": variants, "needles": needles, "jitter": jitter}
    specs = recall_grid.cells(grid, context_length, seed)
    builder = PromptBuilder(counter, max(c.tokens for c in specs))
    rng = random.Random(seed)
    nonce = nonce or secrets.token_hex(6)
    jobs: list[tuple[Cell, str, Needle]] = []
    cells: list[Cell] = []
    for i, spec in enumerate(specs):
        ns, asked = cell_needles(spec.kind, spec.depth, needles, rng, i)
        cell = Cell(spec.kind, spec.length, spec.depth, 0)
        for n in asked:
            prompt, cell.prompt_tokens = builder.build_counted(spec.tokens, ns, n, f"Record {nonce}-{len(jobs)}.\n")
            jobs.append((cell, prompt, n))
        cells.append(cell)
    build_s = time.monotonic() - t0
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
    order = [k for k in KINDS if k in variants]
    return RecallReport(url=url, tokenizer=counter.path, lengths=sorted(lengths), depths=depths, variants=order,
                        needles=needles, cells=cells, min_horizon=min_horizon, elapsed_s=time.monotonic() - start,
                        build_s=build_s)


def run_with(url: str, cfg: dict[str, Any], *, headers: dict[str, str] | None = None, progress=None) -> RecallReport:
    """run_recall with the smoke tools' settings (smoke_settings: the inventory's, then the flags given)."""
    return run_recall(url, lengths=cfg["lengths"], depths=cfg["depths"], tokenizer=cfg["tokenizer"],
                      variants=recall_grid.kinds(cfg["variant"]), needles=cfg["needles"],
                      concurrency=cfg["concurrency"], timeout=cfg["timeout"], min_horizon=cfg["min_horizon"],
                      headers=headers, progress=progress, jitter=cfg["jitter"], context_length=cfg["context_length"])


def estimate_line(cfg: dict[str, Any]) -> str:
    """What the grid of these settings costs on the real host (load/recall_grid.py's model), said before it runs."""
    e = recall_grid.estimate(cfg, prefill_tps=cfg["prefill_tps"], decode_tps=cfg.get("baseline"),
                             concurrency=cfg["concurrency"], context_length=cfg["context_length"])
    return (f"recall: {e['cells']} cells, {e['requests']} requests, {e['prompt_tokens']:,} prompt tokens; on the "
            f"real host ~{e['estimate_s']} s at {cfg['prefill_tps']:g} prefill tok/s (pdstack_smoke.prefill_tps)")


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


int_list = list_type(_tokens, lambda v: v > 0, "give positive token counts, e.g. 1K,2K,4K or 1000,2000")
depth_list = list_type(float, lambda d: 0 <= d <= 100, "depths are percentages 0-100, e.g. 0,25,50,75,100")


def register(p: argparse.ArgumentParser) -> None:
    # Alike in shape with bench.register (and smoke.register), not in logic: each tool declares its own flags with
    # the schema's defaults (DEFAULTS). Only --url and --timeout are shared, kept here so --help lists them in
    # this tool's own order.
    d = DEFAULTS  # the inventory schema's pdstack_smoke defaults, as `pdstack smoke` without -i uses them
    p.add_argument("--url", required=True, help="router URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--lengths", type=int_list, default=d["lengths"],
                   help=f"context lengths in tokens, e.g. 1K,2K,4K (default {','.join(map(kilo, d['lengths']))})")
    p.add_argument("--depths", type=depth_list, default=d["depths"],
                   help=f"needle depths in %% of the document (default {','.join(f'{x:g}' for x in d['depths'])})")
    p.add_argument("--tokenizer", default=d["tokenizer"],
                   help="directory with the model's tokenizer.json (required: the model's own; for the sim test "
                        "engine pdstack/testing/sim/tokenizer)")
    p.add_argument("--variant", type=variant_list, default=d["variant"],
                   help="case kinds, e.g. single,multikey: single, multikey (look-alike keys, one asked), multi "
                        f"(--needles needles, each asked), or both = single,multi (default {kinds(d['variant'])})")
    p.add_argument("--needles", type=int, default=d["needles"],
                   help=f"needles per prompt in the multi and multikey kinds (default {d['needles']})")
    p.add_argument("--jitter", type=int, default=d["jitter"],
                   help=f"each cell's prompt is its length less 0..JITTER tokens, cycling (default {d['jitter']})")
    p.add_argument("--context-length", type=int, default=d["context_length"],
                   help="the model's context length: a longer grid length is built to fit it with the answer")
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


def kinds(variant) -> str:
    return ",".join(recall_grid.kinds(variant))


variant_list = list_type(lambda v: v, lambda v: v in (*KINDS, "both"),
                         f"give case kinds: {', '.join(KINDS)} (or both = single,multi)")


def run(args: argparse.Namespace) -> int:
    variants = recall_grid.kinds(args.variant)
    if not args.tokenizer:
        print(f"pdstack recall: {NO_TOKENIZER}", file=sys.stderr)
        return 2
    try:
        report = run_recall(args.url, lengths=args.lengths, depths=args.depths, tokenizer=args.tokenizer,
                            variants=variants, needles=args.needles, concurrency=args.concurrency,
                            timeout=args.timeout, max_new_tokens=args.max_new_tokens, retries=args.retries,
                            min_horizon=args.min_horizon, seed=args.seed, progress=print_progress(),
                            headers=apikey.from_env(), jitter=args.jitter, context_length=args.context_length)
    except (FileNotFoundError, ImportError) as e:
        print(f"pdstack recall: {e}", file=sys.stderr)
        return 2
    print(report.table())
    if args.json:
        print(f"JSON: {results.write_json(args.json, report.to_dict())}")
    if args.heatmap:
        print(f"heatmap: {heatmap.draw(report, args.heatmap)}")
    counts = report.counts()
    if counts["pass"] + counts["wrong"] == 0:
        print("pdstack recall: no request was answered ("
              + (report.auth_refused or "router unreachable or refusing") + "); see the JSON", file=sys.stderr)
        return 3
    return 0 if report.passed else 1
