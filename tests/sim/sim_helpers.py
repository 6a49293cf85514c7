"""Helpers and fixtures for the TEST ENGINE suite: sim processes and the real sglang-router, on 127.0.0.1 only.

Every process started here is stopped (SIGTERM, then SIGKILL of its process group) when its fixture ends.
"""

from __future__ import annotations

import http.client
import json
import urllib.error
import urllib.request
from contextlib import ExitStack

import pytest
from prometheus_client.parser import text_string_to_metric_families

from pdstack.testing.sim.launch import RouterProcess, SimProcess, http_get

# Fast timing for tests; the defaults model the reference deployment (decode ~64 tok/s).
FAST = ["--prefill-tokens-per-s", "1000000", "--decode-tokens-per-s", "2000", "--bootstrap-timeout-s", "1"]
# Small router timeouts so fault paths end in seconds (the defaults are 1800 s per attempt and 5 retries).
ROUTER_FAST = ["--request-timeout-secs", "2", "--retry-max-retries", "2", "--retry-initial-backoff-ms", "10",
               "--retry-max-backoff-ms", "50", "--worker-startup-timeout-secs", "20",
               "--worker-startup-check-interval", "1"]


TRUNCATED = "\n<<TRUNCATED BODY>>"


def post(url: str, body: dict, timeout: float = 30.0) -> tuple[int, str]:
    """POST JSON; returns (status, body text). Never raises for HTTP errors; a body cut off mid-transfer
    comes back as what arrived + TRUNCATED."""
    req = urllib.request.Request(url, data=json.dumps(body).encode(), method="POST",
                                 headers={"Content-Type": "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            try:
                return r.status, r.read().decode("utf-8", "replace")
            except http.client.IncompleteRead as e:
                return r.status, e.partial.decode("utf-8", "replace") + TRUNCATED
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")


def parse_sse(raw: str) -> list:
    """The `data:` payloads of an SSE body: parsed JSON objects, or the string "[DONE]"."""
    out = []
    for block in raw.split("\n\n"):
        block = block.strip()
        if not block:
            continue
        assert block.startswith("data: "), f"not an SSE data line: {block[:200]!r}"
        data = block[len("data: "):]
        out.append(data if data == "[DONE]" else json.loads(data))
    return out


def scrape(url: str) -> dict[str, float]:
    """Prometheus samples of a /metrics endpoint, summed over label sets: {sample name: value}."""
    status, raw = http_get(url + "/metrics", timeout=5)
    assert status == 200, raw
    out: dict[str, float] = {}
    for fam in text_string_to_metric_families(raw.decode()):
        for s in fam.samples:
            out[s.name] = out.get(s.name, 0.0) + s.value
    return out


def families(url: str) -> dict[str, str]:
    """{family name: type} of a /metrics endpoint."""
    status, raw = http_get(url + "/metrics", timeout=5)
    assert status == 200
    return {f.name: f.type for f in text_string_to_metric_families(raw.decode())}


class PDStack:
    """A sim prefill + decode behind the router. stop() stops the processes the attributes hold when it runs, so a
    test that replaces one (a restart) hands the new process to the same cleanup."""

    def __init__(self, prefill: SimProcess, decode: SimProcess, router: RouterProcess | None = None):
        self.prefill, self.decode, self.router = prefill, decode, router

    def stop(self) -> None:
        for p in (self.router, self.decode, self.prefill):
            if p is not None:
                p.stop()

    def reset_faults(self) -> None:
        for p in (self.prefill, self.decode):
            if p.alive():
                p.fault(wedge_decode=None, slow_prefill_s=None, fail_transfer=None, fail_bootstrap=None,
                        reject_status=None, health_status=None)


def start_pd(tmp_path, sim_extra=(), prefill_extra=(), decode_extra=(), router_extra=()) -> tuple[ExitStack, PDStack]:
    """Start a PDStack; the ExitStack stops it (use `with stack:` right away). A failed start stops what started."""
    stack = ExitStack()
    s = PDStack(SimProcess("prefill", tmp_path, [*FAST, *sim_extra, *prefill_extra]),
                SimProcess("decode", tmp_path, [*FAST, *sim_extra, *decode_extra]))
    stack.callback(s.stop)
    try:
        s.prefill.start()
        s.decode.start()
        s.router = RouterProcess([s.prefill], [s.decode], tmp_path, [*ROUTER_FAST, *router_extra])
        s.router.start()
    except BaseException:
        stack.close()
        raise
    return stack, s


@pytest.fixture(scope="module")
def pd(tmp_path_factory):
    """A sim prefill + sim decode behind the real router, shared by a module; faults reset after each use."""
    # HiCache on both, and on decode with its radix cache, which SGLang 0.5.23 (and so the sim) requires for it
    stack, s = start_pd(tmp_path_factory.mktemp("pd"), sim_extra=["--enable-hierarchical-cache",
                                                                    "--hicache-ratio", "2", "--recall-horizon", "200"],
                        decode_extra=["--disaggregation-decode-enable-radix-cache"])
    with stack:
        yield s


@pytest.fixture
def fresh_pd(tmp_path):
    """A private PD stack for a test that breaks things (faults, crashes, circuit breaker state)."""
    stack, s = start_pd(tmp_path)
    with stack:
        yield s
