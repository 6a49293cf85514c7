"""Prometheus metrics of the TEST ENGINE, under SGLang 0.5.23's real names, types and labels (prefix `sglang:`).

Scheduler-side metrics carry SGLang's scheduler labels (model_name, engine_type, tp_rank, pp_rank, moe_ep_rank);
request-side ones its tokenizer labels (model_name, engine_type [, is_streaming]). Bucket edges follow SGLang's
defaults closely enough for dashboards and alert rules to be exercised. Each process has its own registry.
"""

from __future__ import annotations

import time
from collections import deque

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from pdstack.testing.sim.config import SimConfig

SCHED_LABELS = ("model_name", "engine_type", "tp_rank", "pp_rank", "moe_ep_rank")
TOK_LABELS = ("model_name", "engine_type")

TTFT_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400)
ITL_BUCKETS = (0.002, 0.004, 0.006, 0.008, 0.01, 0.015, 0.02, 0.025, 0.03, 0.035, 0.04, 0.06, 0.08, 0.1, 0.2,
               0.4, 0.6, 0.8, 1.0, 2.0, 4.0, 6.0, 8.0)
E2E_BUCKETS = (0.1, 0.2, 0.4, 0.6, 0.8, 1, 2, 4, 6, 8, 10, 20, 40, 60, 80, 100, 200, 400, 600, 1200, 1800, 2400)
KV_TRANSFER_MS_BUCKETS = (1, 2, 5, 10, 25, 50, 100, 250, 500, 1000, 2500, 5000)

CONTENT_TYPE = CONTENT_TYPE_LATEST


class SimMetrics:
    def __init__(self, cfg: SimConfig):
        self.cfg = cfg
        self.registry = CollectorRegistry()
        r = self.registry
        sched = {"model_name": cfg.model_name, "engine_type": cfg.role.engine_type,
                 "tp_rank": "0", "pp_rank": "0", "moe_ep_rank": "0"}
        tok = {"model_name": cfg.model_name, "engine_type": cfg.role.engine_type}
        self._tok = tok

        def g(name: str, doc: str):
            return Gauge(name, doc, SCHED_LABELS, registry=r, multiprocess_mode="mostrecent").labels(**sched)

        def c(name: str, doc: str, labels=SCHED_LABELS, values=sched):
            return Counter(name, doc, labels, registry=r).labels(**values)

        # Scheduler gauges
        self.num_running_reqs = g("sglang:num_running_reqs", "The number of running requests.")
        self.num_queue_reqs = g("sglang:num_queue_reqs", "The number of requests in the waiting queue.")
        self.num_used_tokens = g("sglang:num_used_tokens", "The number of used tokens.")
        self.token_usage = g("sglang:token_usage", "The token usage.")
        self.gen_throughput = g("sglang:gen_throughput", "The generation throughput (token/s).")
        self.cache_hit_rate = g("sglang:cache_hit_rate", "The prefix cache hit rate.")
        self.max_total_num_tokens = g("sglang:max_total_num_tokens", "Maximum total number of tokens in the KV pool.")
        self.context_len = g("sglang:context_len", "The context length.")
        self.num_prefill_bootstrap_queue_reqs = g(
            "sglang:num_prefill_bootstrap_queue_reqs", "The number of requests in the prefill bootstrap queue.")
        self.num_prefill_inflight_queue_reqs = g(
            "sglang:num_prefill_inflight_queue_reqs", "The number of requests in the prefill inflight queue.")
        self.num_decode_prealloc_queue_reqs = g(
            "sglang:num_decode_prealloc_queue_reqs", "The number of requests in the decode prealloc queue.")
        self.num_decode_transfer_queue_reqs = g(
            "sglang:num_decode_transfer_queue_reqs", "The number of requests in the decode transfer queue.")
        self.hicache_host_used_tokens = None
        self.hicache_host_total_tokens = None
        if cfg.enable_hierarchical_cache:
            self.hicache_host_used_tokens = g("sglang:hicache_host_used_tokens", "Used tokens in the host KV pool.")
            self.hicache_host_total_tokens = g("sglang:hicache_host_total_tokens", "Total tokens of the host KV pool.")
        self.max_total_num_tokens.set(cfg.max_total_tokens)
        self.context_len.set(cfg.context_length)

        # Scheduler counters
        self.num_bootstrap_failed_reqs = c("sglang:num_bootstrap_failed_reqs_total",
                                           "The number of bootstrap failed requests.")
        self.num_transfer_failed_reqs = c("sglang:num_transfer_failed_reqs_total",
                                          "The number of transfer failed requests.")
        self.cached_tokens = c("sglang:cached_tokens_total", "The number of prefix cached tokens.")
        self.kv_transfer_latency_ms = Histogram(
            "sglang:kv_transfer_latency_ms", "The KV transfer latency in milliseconds.", SCHED_LABELS,
            buckets=KV_TRANSFER_MS_BUCKETS, registry=r).labels(**sched)

        # Tokenizer-side (request) metrics
        stream_labels = (*TOK_LABELS, "is_streaming")
        self._prompt_tokens = Counter("sglang:prompt_tokens_total", "Number of prefill tokens processed.",
                                      stream_labels, registry=r)
        self._generation_tokens = Counter("sglang:generation_tokens_total", "Number of generation tokens processed.",
                                          stream_labels, registry=r)
        self._num_requests = Counter("sglang:num_requests_total", "The number of requests processed.",
                                     stream_labels, registry=r)
        self.num_aborted_requests = Counter("sglang:num_aborted_requests_total", "Number of requests aborted.",
                                            TOK_LABELS, registry=r).labels(**tok)
        self._ttft = Histogram("sglang:time_to_first_token_seconds", "Histogram of time to first token in seconds.",
                               stream_labels, buckets=TTFT_BUCKETS, registry=r)
        self.inter_token_latency = Histogram("sglang:inter_token_latency_seconds",
                                             "Histogram of inter-token latency in seconds.", TOK_LABELS,
                                             buckets=ITL_BUCKETS, registry=r).labels(**tok)
        self._e2e = Histogram("sglang:e2e_request_latency_seconds",
                              "Histogram of End-to-end request latency in seconds", stream_labels,
                              buckets=E2E_BUCKETS, registry=r)
        for s in ("true", "false"):  # pre-create both series so counters exist (at 0) before the first request
            for m in (self._prompt_tokens, self._generation_tokens, self._num_requests):
                m.labels(**tok, is_streaming=s)

        self._recent_tokens: deque[tuple[float, int]] = deque()  # (time, n) for gen_throughput
        self.used_tokens = 0

    # -- request-side helpers
    def _s(self, stream: bool) -> dict:
        return {**self._tok, "is_streaming": "true" if stream else "false"}

    def request_finished(self, stream: bool, prompt_tokens: int, completion_tokens: int, e2e_s: float) -> None:
        self._num_requests.labels(**self._s(stream)).inc()
        self._prompt_tokens.labels(**self._s(stream)).inc(prompt_tokens)
        self._e2e.labels(**self._s(stream)).observe(e2e_s)

    def first_token(self, stream: bool, ttft_s: float) -> None:
        self._ttft.labels(**self._s(stream)).observe(ttft_s)

    def tokens_generated(self, stream: bool, n: int = 1) -> None:
        self._generation_tokens.labels(**self._s(stream)).inc(n)
        self._recent_tokens.append((time.monotonic(), n))

    def add_used_tokens(self, n: int) -> None:
        self.used_tokens += n
        self.num_used_tokens.set(self.used_tokens)
        self.token_usage.set(self.used_tokens / max(1, self.cfg.max_total_tokens))

    def refresh(self, window_s: float = 5.0) -> None:
        """Recompute the windowed gauges (called before each scrape and by the engine)."""
        now = time.monotonic()
        while self._recent_tokens and self._recent_tokens[0][0] < now - window_s:
            self._recent_tokens.popleft()
        self.gen_throughput.set(sum(n for _, n in self._recent_tokens) / window_s)

    def render(self) -> bytes:
        self.refresh()
        return generate_latest(self.registry)
