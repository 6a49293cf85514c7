"""`pdstack bench`: decode speed at C=1, TTFT and inter-token latency percentiles, and a short concurrency sweep,
through the router, compared with a baseline (the inventory's `pdstack_smoke.bench`; the reference deployment decodes
about 64 tokens/s at C=1, docs/facts.md, The deployment).

Each request is a streamed /generate of --max-new-tokens tokens with ignore_eos (so every request decodes the same
number of tokens). Per request: TTFT = time to the first token; decode tokens/s = (tokens - 1) / (last - first token);
inter-token latencies = gaps between token arrivals (a chunk of k tokens counts as k gaps of gap/k).

Exit codes: 0 within tolerance, 1 C=1 decode tokens/s below baseline x (1 - tolerance), 3 requests failed.
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import http.client
import json
import statistics
import sys
import time
import urllib.parse
from dataclasses import asdict, dataclass, field

from pdstack.controller.gates import apikey, results
from pdstack.controller.gates.smoke_settings import DEFAULTS, list_type

PROMPT = "Write a long story about a river, a mountain and the people of the valley."


@dataclass
class RequestStats:
    ok: bool
    tokens: int = 0
    ttft_s: float | None = None
    decode_tps: float | None = None
    itl_s: list[float] = field(default_factory=list)
    e2e_s: float = 0.0
    error: str = ""


def decode_tps(tokens_after_first: int, decode_seconds: float) -> float | None:
    """A request's decode speed: the tokens after its first over the time from the first token to the last. The
    one definition of the smoke gate's C=1 figure and of `invoke tune`'s sweep (tune/sweep.py)."""
    return tokens_after_first / decode_seconds if tokens_after_first > 0 and decode_seconds > 0 else None


def stream_once(url: str, max_new_tokens: int, timeout: float, prompt: str = PROMPT,
                headers: dict[str, str] | None = None) -> RequestStats:
    parsed = urllib.parse.urlsplit(url.rstrip("/"))
    conn = http.client.HTTPConnection(parsed.hostname or "127.0.0.1", parsed.port or 80, timeout=timeout)
    body = {"text": prompt, "stream": True,
            "sampling_params": {"max_new_tokens": max_new_tokens, "ignore_eos": True, "temperature": 0}}
    start = time.monotonic()
    arrivals: list[tuple[float, int]] = []  # (time, tokens so far)
    try:
        conn.request("POST", (parsed.path or "") + "/generate", body=json.dumps(body),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        if resp.status != 200:
            detail = apikey.refused(resp.status, headers) or resp.read(200).decode("utf-8", "replace")
            return RequestStats(False, error=f"HTTP {resp.status}: {detail}", e2e_s=time.monotonic() - start)
        done = False
        for raw in resp:
            line = raw.decode("utf-8", "replace").strip()
            if not line.startswith("data:"):
                continue
            data = line[5:].strip()
            if data == "[DONE]":
                done = True
                break
            obj = json.loads(data)
            if "error" in obj:
                return RequestStats(False, error=f"stream error: {obj['error']}", e2e_s=time.monotonic() - start)
            fin = (obj.get("meta_info") or {}).get("finish_reason")
            if isinstance(fin, dict) and fin.get("type") == "abort":
                return RequestStats(False, error=f"aborted: {fin.get('message')}", e2e_s=time.monotonic() - start)
            n = len(obj.get("output_ids") or [])
            if n > (arrivals[-1][1] if arrivals else 0):
                arrivals.append((time.monotonic(), n))
        if not done:
            return RequestStats(False, tokens=arrivals[-1][1] if arrivals else 0, error="stream cut off",
                                e2e_s=time.monotonic() - start)
    except (OSError, http.client.HTTPException, ValueError) as e:
        return RequestStats(False, error=repr(e), e2e_s=time.monotonic() - start)
    finally:
        conn.close()
    end = time.monotonic()
    if not arrivals:
        return RequestStats(False, error="no token", e2e_s=end - start)
    itl = []
    for (t0, n0), (t1, n1) in zip(arrivals, arrivals[1:], strict=False):
        itl += [(t1 - t0) / (n1 - n0)] * (n1 - n0)
    tokens = arrivals[-1][1]
    span = arrivals[-1][0] - arrivals[0][0]
    tps = decode_tps(tokens - arrivals[0][1], span)
    return RequestStats(True, tokens=tokens, ttft_s=arrivals[0][0] - start, decode_tps=tps, itl_s=itl,
                        e2e_s=end - start)


def percentiles(values: list[float]) -> dict[str, float | None]:
    if not values:
        return {"p50": None, "p90": None, "p99": None, "mean": None}
    s = sorted(values)

    def q(p: float) -> float:
        return s[min(len(s) - 1, max(0, round(p * (len(s) - 1))))]
    return {"p50": q(0.5), "p90": q(0.9), "p99": q(0.99), "mean": statistics.fmean(s)}


@dataclass
class Level:
    concurrency: int
    requests: int
    failed: int
    decode_tps_per_request: float | None  # median over requests
    aggregate_tps: float | None  # all tokens / wall time of the level
    ttft_s: dict
    itl_s: dict
    errors: list[str]


def run_level(url: str, concurrency: int, requests: int, max_new_tokens: int, timeout: float,
              headers: dict[str, str] | None = None) -> Level:
    start = time.monotonic()
    with cf.ThreadPoolExecutor(max_workers=concurrency) as pool:
        stats = list(pool.map(lambda _: stream_once(url, max_new_tokens, timeout, headers=headers), range(requests)))
    wall = time.monotonic() - start
    good = [s for s in stats if s.ok]
    tps = [s.decode_tps for s in good if s.decode_tps]
    return Level(concurrency=concurrency, requests=requests, failed=len(stats) - len(good),
                 decode_tps_per_request=statistics.median(tps) if tps else None,
                 aggregate_tps=sum(s.tokens for s in good) / wall if good and wall > 0 else None,
                 ttft_s=percentiles([s.ttft_s for s in good if s.ttft_s is not None]),
                 itl_s=percentiles([x for s in good for x in s.itl_s]),
                 errors=sorted({s.error for s in stats if not s.ok})[:5])


@dataclass
class BenchReport:
    url: str
    max_new_tokens: int
    baseline_tps: float | None
    tolerance: float
    levels: list[Level]

    @property
    def c1(self) -> Level:
        return next(lv for lv in self.levels if lv.concurrency == 1)

    @property
    def floor_tps(self) -> float | None:
        return None if not self.baseline_tps else self.baseline_tps * (1 - self.tolerance)

    @property
    def failed(self) -> bool:
        return any(lv.failed for lv in self.levels) or self.c1.decode_tps_per_request is None

    @property
    def regressed(self) -> bool:
        c1 = self.c1.decode_tps_per_request
        return self.floor_tps is not None and (c1 is None or c1 < self.floor_tps)

    @property
    def passed(self) -> bool:
        return not self.failed and not self.regressed

    def to_dict(self) -> dict:
        return {"url": self.url, "max_new_tokens": self.max_new_tokens, "baseline_tps": self.baseline_tps,
                "tolerance": self.tolerance, "floor_tps": self.floor_tps,
                "c1_decode_tps": self.c1.decode_tps_per_request, "regressed": self.regressed,
                "failed": self.failed, "passed": self.passed, "levels": [asdict(lv) for lv in self.levels]}

    def table(self) -> str:
        def ms(v):
            return "-" if v is None else f"{v * 1000:.1f}"

        def f1(v):
            return "-" if v is None else f"{v:.1f}"
        out = [f"{'C':>3} {'reqs':>5} {'fail':>5} {'tok/s/req':>10} {'tok/s all':>10} {'TTFT p50':>9} {'p90':>7} "
               f"{'p99':>7} {'ITL p50':>8} {'p90':>7} {'p99':>7}  (ms)"]
        for lv in self.levels:
            out.append(f"{lv.concurrency:>3} {lv.requests:>5} {lv.failed:>5} {f1(lv.decode_tps_per_request):>10} "
                       f"{f1(lv.aggregate_tps):>10} {ms(lv.ttft_s['p50']):>9} {ms(lv.ttft_s['p90']):>7} "
                       f"{ms(lv.ttft_s['p99']):>7} {ms(lv.itl_s['p50']):>8} {ms(lv.itl_s['p90']):>7} "
                       f"{ms(lv.itl_s['p99']):>7}")
            out += [f"    error: {e}" for e in lv.errors]
        c1 = self.c1.decode_tps_per_request
        if self.baseline_tps:
            verdict = "FAIL (regressed)" if self.regressed else "PASS"
            out.append(f"C=1 decode {f1(c1)} tok/s vs baseline {self.baseline_tps:g} tok/s (tolerance "
                       f"{self.tolerance:.0%}, floor {self.floor_tps:.1f}): {verdict}")
        else:
            out.append(f"C=1 decode {f1(c1)} tok/s (no baseline)")
        if self.failed:
            out.append("FAIL: requests failed (see errors)")
        return "\n".join(out)


def run_bench(url: str, *, concurrency: list[int], requests: int = DEFAULTS["bench_requests"],
              max_new_tokens: int = DEFAULTS["bench_tokens"], timeout: float = DEFAULTS["timeout"],
              baseline_tps: float | None = DEFAULTS["baseline"], tolerance: float = DEFAULTS["tolerance"],
              progress=None, headers: dict[str, str] | None = None) -> BenchReport:
    """`headers`: sent with every request (the front door's API key, apikey.py)."""
    levels = []
    conc = sorted(set([1, *concurrency]))
    for c in conc:
        if progress:
            progress(f"bench: C={c}, {max(requests, c)} request(s) of {max_new_tokens} tokens")
        levels.append(run_level(url, c, max(requests, c), max_new_tokens, timeout, headers))
    return BenchReport(url=url, max_new_tokens=max_new_tokens, baseline_tps=baseline_tps, tolerance=tolerance,
                       levels=levels)


ints = list_type(int, lambda v: v >= 1, "concurrency levels are integers >= 1, e.g. 1,2,4")


def register(p: argparse.ArgumentParser) -> None:
    # Alike in shape with recall.register (and smoke.register), not in logic: each tool declares its own flags with
    # the schema's defaults (DEFAULTS). Only --url and --timeout are shared, kept here so --help lists them in
    # this tool's own order.
    d = DEFAULTS  # the inventory schema's pdstack_smoke defaults, as `pdstack smoke` without -i uses them
    p.add_argument("--url", required=True, help="router URL, e.g. http://127.0.0.1:8000")
    p.add_argument("--concurrency", type=ints, default=d["bench_concurrency"],
                   help="levels of the sweep, within the router's admission limit "
                        f"(default {','.join(map(str, d['bench_concurrency']))}; 1 always runs)")
    p.add_argument("--requests", type=int, default=d["bench_requests"],
                   help=f"requests per level (at least C) (default {d['bench_requests']})")
    p.add_argument("--max-new-tokens", type=int, default=d["bench_tokens"],
                   help=f"tokens each request decodes (default {d['bench_tokens']})")
    p.add_argument("--timeout", type=float, default=d["timeout"],
                   help=f"seconds per request (default {d['timeout']:g})")
    p.add_argument("--baseline", type=float, default=d["baseline"], metavar="TOK_S",
                   help="expected C=1 decode tokens/s (the reference: ~64; default: none, report only)")
    p.add_argument("--tolerance", type=float, default=d["tolerance"],
                   help=f"allowed shortfall below the baseline, a fraction (default {d['tolerance']:g})")
    p.add_argument("--json", metavar="FILE", help="write the report as JSON")
    p.epilog = "exit codes: 0 pass, 1 C=1 decode below baseline x (1 - tolerance), 3 requests failed"


def run(args: argparse.Namespace) -> int:
    report = run_bench(args.url, concurrency=args.concurrency, requests=args.requests,
                       max_new_tokens=args.max_new_tokens, timeout=args.timeout, baseline_tps=args.baseline,
                       tolerance=args.tolerance, progress=lambda m: print(m, file=sys.stderr, flush=True),
                       headers=apikey.from_env())
    print(report.table())
    if args.json:
        print(f"JSON: {results.write_json(args.json, report.to_dict())}")
    if report.failed:
        return 3
    return 1 if report.regressed else 0
