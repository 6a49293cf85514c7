"""Admission measurements against the front door (real HAProxy -> real sglang-router -> sim PD pair), on loopback.

The tests (tests/sim/test_frontdoor.py) assert on these figures; `python -m pdstack.testing.admission` prints them
(docs/admission.md). Each scenario returns a plain dict:

- burst: `n` requests at once; decode's sglang:num_running_reqs sampled every 50 ms; per status: count and the
  slowest/fastest answer.
- queue_timeout: long requests so the waiters outlast queue_timeout_secs; when each was refused.
- sustained: `rate` requests/s for `seconds` of ~`request_s` requests; then one request alone (service normal after).
- latency (`--scenario latency`, not in the default run): what the front door adds per request (p50/p99) and the
  requests/s it sustains, against the router direct, in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import http.client
import json
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections import Counter
from contextlib import ExitStack
from pathlib import Path

from pdstack.testing.sim.launch import FrontDoorProcess, RouterProcess, SimProcess, http_get

TRUNCATED = b"\n<<TRUNCATED BODY>>"  # appended to a body that was cut off mid-transfer
# A sim PD pair whose decode runs at `DECODE_TPS` tokens/s: a request of `tokens` new tokens takes tokens/DECODE_TPS s.
DECODE_TPS = 32.0
SIM_ARGS = ["--prefill-tokens-per-s", "1000000", "--decode-tokens-per-s", str(DECODE_TPS),
            "--decode-batch-penalty", "0", "--bootstrap-timeout-s", "5"]
# The router as the planner renders it: its own limiter off (admission is HAProxy's), long request timeout.
ROUTER_ARGS = ["--max-concurrent-requests", "-1", "--request-timeout-secs", "120", "--retry-max-retries", "2",
               "--worker-startup-timeout-secs", "20", "--worker-startup-check-interval", "1"]


def rendered_router_flags(inventory: str | Path = "inventory/local",
                          facts: str | Path = "tests/topologies/single-node-4gpu.json") -> list[str]:
    """The router flags the planner renders for `inventory` (timeouts, retries, health checks, circuit breaker,
    drain), minus the workers and listen addresses a loopback stack sets itself."""
    from pdstack.controller import pipeline
    from pdstack.controller.load import inventory as inv
    from pdstack.controller.load.facts import load_facts

    root = Path(__file__).resolve().parents[2]
    dep = inv.load(root / inventory)
    plan = pipeline.make_plan(dep, load_facts(root / facts, list(dep.hosts)))
    out, flags, i = [], plan.router.flags, 0
    skip = {"--pd-disaggregation": 0, "--prefill": 2, "--decode": 1, "--host": 1, "--port": 1,
            "--prometheus-host": 1, "--prometheus-port": 1}
    while i < len(flags):
        if flags[i] in skip:
            i += 1 + skip[flags[i]]
            continue
        out.append(flags[i])
        i += 1
    return out


class Stack:
    """prefill + decode sims, the router, and a front door (replaceable with other admission settings)."""

    def __init__(self, log_dir: Path, router_extra: list[str] | None = None, sim_args: list[str] | None = None):
        self.log_dir = Path(log_dir)
        self.sim_args = list(sim_args or SIM_ARGS)
        self._stack = ExitStack()
        self.frontdoor: FrontDoorProcess | None = None
        try:
            self.prefill = SimProcess("prefill", self.log_dir, self.sim_args)
            self._stack.callback(self.prefill.stop)
            self.decode = SimProcess("decode", self.log_dir, self.sim_args)
            self._stack.callback(self.decode.stop)
            self.prefill.start()
            self.decode.start()
            self.router_extra = [*ROUTER_ARGS, *(router_extra or [])]
            self.router = RouterProcess([self.prefill], [self.decode], self.log_dir, self.router_extra)
            self._stack.callback(lambda: self.router.stop())
            self.router.start()
        except BaseException:
            self._stack.close()
            raise

    def restart_prefill(self) -> SimProcess:
        """A new prefill process on the same ports (the old one must be gone)."""
        self.prefill = SimProcess("prefill", self.log_dir, self.sim_args, port=self.prefill.port,
                                  bootstrap_port=self.prefill.bootstrap_port)
        self._stack.callback(self.prefill.stop)
        return self.prefill.start()

    def restart_router(self) -> RouterProcess:
        """A new router on the same ports (the old one must be gone)."""
        self.router = RouterProcess([self.prefill], [self.decode], self.log_dir, self.router_extra,
                                    port=self.router.port, metrics_port=self.router.metrics_port)
        return self.router.start()

    def with_frontdoor(self, **settings) -> FrontDoorProcess:
        if self.frontdoor is not None:
            self.frontdoor.stop()
        self.frontdoor = FrontDoorProcess(self.router, self.log_dir, **settings).start()
        return self.frontdoor

    def close(self) -> None:
        if self.frontdoor is not None:
            self.frontdoor.stop()
        self._stack.close()

    def __enter__(self) -> Stack:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def running(decode: SimProcess) -> float:
    status, raw = http_get(decode.url + "/metrics", timeout=2)
    for line in raw.decode().splitlines():
        if line.startswith("sglang:num_running_reqs"):
            return float(line.rsplit(" ", 1)[1])
    return float("nan")


class Sampler:
    """decode's sglang:num_running_reqs every `period` s in a thread; .peak and .samples."""

    def __init__(self, decode: SimProcess, period: float = 0.05):
        self.decode, self.period = decode, period
        self.samples: list[float] = []
        self._stop = threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            with contextlib.suppress(OSError):
                self.samples.append(running(self.decode))
            self._stop.wait(self.period)

    def __enter__(self) -> Sampler:
        self._t.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._t.join(5)

    @property
    def peak(self) -> float:
        return max(self.samples, default=0.0)


def request(url: str, tokens: int, timeout: float = 180.0, stream: bool = False) -> dict:
    """One /generate through `url`: {status, seconds, retry_after, refusal (the front door's X-Pdstack-Refusal),
    body (first 200 chars), tail (last 200)}."""
    body = {"text": "Tell me a story.", "stream": stream, "sampling_params": {"max_new_tokens": tokens}}
    req = urllib.request.Request(url + "/generate", data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    t0 = time.monotonic()
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (loopback)
            status, ra, why = r.status, r.headers.get("Retry-After"), r.headers.get("X-Pdstack-Refusal")
            try:
                raw = r.read()
            except http.client.IncompleteRead as e:  # the body was cut off (a stream past a timeout or a drain)
                raw = e.partial + TRUNCATED
    except urllib.error.HTTPError as e:
        status, raw, ra, why = e.code, e.read(), e.headers.get("Retry-After"), e.headers.get("X-Pdstack-Refusal")
    except (OSError, http.client.HTTPException) as e:
        status, raw, ra, why = 0, str(e).encode(), None, None
    return {"status": status, "seconds": time.monotonic() - t0, "retry_after": ra, "refusal": why,
            "body": raw[:200].decode("utf-8", "replace"), "tail": raw[-200:].decode("utf-8", "replace")}


def _fire(url: str, tokens: int, starts: list[float]) -> list[dict]:
    """One request per start offset (seconds from now), each in its own thread; their results in order."""
    out: list[dict] = [{} for _ in starts]
    t0 = time.monotonic()

    def one(i: int, at: float) -> None:
        delay = t0 + at - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        out[i] = {"start": time.monotonic() - t0, **request(url, tokens)}

    threads = [threading.Thread(target=one, args=(i, at), daemon=True) for i, at in enumerate(starts)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def _by_status(results: list[dict]) -> dict[str, dict]:
    out: dict[str, dict] = {}
    for code, count in sorted(Counter(r["status"] for r in results).items()):
        secs = [r["seconds"] for r in results if r["status"] == code]
        ras = sorted({r["retry_after"] for r in results if r["status"] == code}, key=str)
        out[str(code)] = {"count": count, "min_s": round(min(secs), 3), "max_s": round(max(secs), 3),
                          "retry_after": ras}
    return out


def burst(stack: Stack, n: int = 200, max_concurrent: int = 8, queue: int = 16, queue_timeout: int = 30,
          request_s: float = 2.0) -> dict:
    fd = stack.with_frontdoor(max_concurrent_requests=max_concurrent, queue_size=queue,
                              queue_timeout_secs=queue_timeout)
    with Sampler(stack.decode) as s:
        results = _fire(fd.url, int(request_s * DECODE_TPS), [0.0] * n)
    return {"scenario": "burst", "requests": n, "N": max_concurrent, "Q": queue, "T": queue_timeout,
            "request_s": request_s, "decode_running_peak": s.peak, "samples": len(s.samples),
            "statuses": _by_status(results)}


def queue_timeout(stack: Stack, max_concurrent: int = 8, queue: int = 16, timeout: int = 2,
                  request_s: float = 8.0) -> dict:
    """N + Q + 8 requests of request_s > timeout: N served, Q refused after `timeout`, 8 refused at once."""
    fd = stack.with_frontdoor(max_concurrent_requests=max_concurrent, queue_size=queue, queue_timeout_secs=timeout)
    with Sampler(stack.decode) as s:
        results = _fire(fd.url, int(request_s * DECODE_TPS), [0.0] * (max_concurrent + queue + 8))
    return {"scenario": "queue_timeout", "N": max_concurrent, "Q": queue, "T": timeout, "request_s": request_s,
            "decode_running_peak": s.peak, "statuses": _by_status(results)}


def sustained(stack: Stack, rate: float = 5.0, seconds: float = 20.0, max_concurrent: int = 8, queue: int = 16,
              queue_timeout: int = 30, request_s: float = 2.0) -> dict:
    fd = stack.with_frontdoor(max_concurrent_requests=max_concurrent, queue_size=queue,
                              queue_timeout_secs=queue_timeout)
    starts = [i / rate for i in range(int(rate * seconds))]
    with Sampler(stack.decode) as s:
        results = _fire(fd.url, int(request_s * DECODE_TPS), starts)
    time.sleep(0.5)
    after = request(fd.url, int(request_s * DECODE_TPS))
    return {"scenario": "sustained", "rate": rate, "seconds": seconds, "N": max_concurrent, "Q": queue,
            "T": queue_timeout, "request_s": request_s, "decode_running_peak": s.peak,
            "statuses": _by_status(results), "after": {k: after[k] for k in ("status", "seconds")}}


def _pct(xs: list[float], q: float) -> float:
    xs = sorted(xs)
    return xs[min(len(xs) - 1, int(q * len(xs)))] if xs else float("nan")


def _throughput(url: str, concurrency: int, seconds: float) -> float:
    """Requests/s `concurrency` clients get served (200) from `url` in `seconds`, each request a new connection."""
    counts, stop = [0] * concurrency, time.monotonic() + seconds

    def client(i: int) -> None:
        while time.monotonic() < stop:
            if request(url, 1)["status"] == 200:
                counts[i] += 1  # one slot per thread

    ths = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(concurrency)]
    for t in ths:
        t.start()
    for t in ths:
        t.join()
    return round(sum(counts) / seconds, 1)


def latency(stack: Stack, requests: int = 300, concurrency: int = 16, seconds: float = 10.0) -> dict:
    """What the front door adds: `requests` one-token requests one after another, alternating the router direct and
    the front door (p50/p99 of each, ms); then `concurrency` clients for `seconds` against each (requests/s). Each
    request is a new connection (urllib), as for a simple client; admission is wide open (N = Q = 1024) so
    nothing waits in it."""
    fd = stack.with_frontdoor(max_concurrent_requests=1024, queue_size=1024, queue_timeout_secs=30)
    urls = {"router": stack.router.url, "frontdoor": fd.url}
    lat: dict[str, list[float]] = {k: [] for k in urls}
    for i in range(2 * requests):
        k = ("router", "frontdoor")[i % 2]
        r = request(urls[k], 1)
        if r["status"] == 200:
            lat[k].append(r["seconds"] * 1000)
    out: dict = {"scenario": "latency", "requests": requests, "concurrency": concurrency, "seconds": seconds}
    for k, xs in lat.items():
        out[k] = {"ok": len(xs), "p50_ms": round(_pct(xs, 0.5), 2), "p99_ms": round(_pct(xs, 0.99), 2)}
    for k, url in urls.items():
        out[k]["req_per_s"] = _throughput(url, concurrency, seconds)
    out["added_p50_ms"] = round(out["frontdoor"]["p50_ms"] - out["router"]["p50_ms"], 2)
    out["added_p99_ms"] = round(out["frontdoor"]["p99_ms"] - out["router"]["p99_ms"], 2)
    return out


def _table(r: dict) -> str:
    if r["scenario"] == "latency":
        return "\n".join([f"latency: {r['requests']} one-token requests each way, then {r['concurrency']} clients "
                          f"for {r['seconds']} s"] + [
            f"  {k:9s} p50 {r[k]['p50_ms']:.2f} ms  p99 {r[k]['p99_ms']:.2f} ms  {r[k]['req_per_s']} req/s "
            f"({r[k]['ok']} ok)" for k in ("router", "frontdoor")] + [
            f"  added by the front door: p50 {r['added_p50_ms']:+.2f} ms, p99 {r['added_p99_ms']:+.2f} ms"])
    head = ", ".join(f"{k}={r[k]}" for k in r if k not in ("scenario", "statuses", "after", "samples"))
    lines = [f"{r['scenario']}: {head}"]
    for code, st in r["statuses"].items():
        lines.append(f"  {code}: {st['count']:4d}  answered in {st['min_s']:.3f}-{st['max_s']:.3f} s"
                     f"  Retry-After {','.join(map(str, st['retry_after']))}")
    if "after" in r:
        lines.append(f"  one request afterwards: {r['after']['status']} in {r['after']['seconds']:.2f} s")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdstack.testing.admission", allow_abbrev=False,
                                 description="measure the front door's admission control on loopback (real HAProxy, "
                                 "real sglang-router, sim PD pair) and print the figures")
    ap.add_argument("--json", help="also write the figures to this file")
    ap.add_argument("--scenario", action="append", choices=["burst", "queue_timeout", "sustained", "latency"],
                    help="run only these (default: all)")
    a = ap.parse_args(argv)
    runs = a.scenario or ["burst", "queue_timeout", "sustained"]
    out = []
    with tempfile.TemporaryDirectory(prefix="pdstack-admission-") as d, Stack(Path(d)) as stack:
        for name in runs:
            scenarios = {"burst": burst, "queue_timeout": queue_timeout, "sustained": sustained, "latency": latency}
            r = scenarios[name](stack)
            print(_table(r), flush=True)
            out.append(r)
    if a.json:
        Path(a.json).write_text(json.dumps(out, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
