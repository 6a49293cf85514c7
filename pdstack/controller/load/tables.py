"""What the checks compare against: the flags and variables the planner owns, the flags refused, the limits
SGLang checks only at startup. Data, and `server_where`, the one phrase that names a server in the inventory. Every
check module reads it from here, and so does the read-back of the rendered artifacts (render/artifacts.py): it
sits above both, in load/, so that no renderer imports a check."""

from __future__ import annotations

from typing import Any

# SGLang flags the planner renders itself, and the variable each comes from. Ownership is by MEANING: an extra
# flag is refused when it sets the same argparse destination as one of these (so --model, SGLang's alias of
# --model-path, is caught). tests/test_preflight.py checks every flag the planner can render is listed here.
OWNED_FLAGS = {
    "model-path": "pdstack_model.path",
    "served-model-name": "pdstack_model.served_name",
    "context-length": "pdstack_model.context_length",
    "trust-remote-code": "pdstack_model.trust_remote_code",
    "tool-call-parser": "pdstack_model.tool_call_parser",
    "reasoning-parser": "pdstack_model.reasoning_parser",
    "tp-size": "the server's tp_size",
    "host": "nothing (servers listen on 0.0.0.0; the router reaches pdstack_address)",
    "port": "the server's ports.http",
    "disaggregation-mode": "the server's role",
    "disaggregation-bootstrap-port": "the server's ports.bootstrap",
    "disaggregation-transfer-backend": "the server's transfer.backend",
    "disaggregation-ib-device": "the server's transfer.ib_device",
    "mooncake-ib-device": "the server's transfer.ib_device",
    "enable-hierarchical-cache": "the server's hicache.enabled",
    "disaggregation-decode-enable-radix-cache": "a decode server's hicache.enabled (0.5.23's HiCache needs the radix "
                                                "cache, which decode turns off without this flag)",
    "hicache-ratio": "the server's hicache.host_budget_gb and hicache.device_kv_pool_gb (the planner computes it)",
    "hicache-write-policy": "the server's hicache.write_policy",
    "hicache-io-backend": "the server's hicache.io_backend",
    "hicache-mem-layout": "the server's hicache.mem_layout",
    "enable-metrics": "nothing (always on: Prometheus scrapes every server)",
}
# Flags that change which or how many GPUs a server uses, or make it one rank of a multi-node group: pdstack
# models a server as exactly `gpus` (tp_size of them) on one host, so these are refused.
GPU_SET_FLAGS = ("pp-size", "dp-size", "enable-dp-attention", "base-gpu-id", "gpu-id-step", "nnodes", "node-rank",
                 "dist-init-addr", "device")
# SGLang settings the KV transfer between prefill and decode depends on: every prefill and decode server must agree.
KV_TRANSFER_FLAGS = ("kv-cache-dtype", "page-size", "c128-page-size", "dtype", "quantization", "revision",
                     "json-model-override-args", "speculative-algorithm", "disaggregation-enable-kv-checksum",
                     "load-format")
# Environment variables prefill and decode must agree on: the transfer engines' protocol settings and pdstack's own
# (read by our SGLang patches, e.g. the KV page layout). Device names are per host, so they may differ.
KV_ENV_PREFIXES = ("MOONCAKE_", "MC_", "NIXL_", "UCX_", "PDSTACK_")
KV_ENV_PER_HOST = ("DEVICE", "HCA", "IFNAME")

OWNED_ROUTER_FLAGS = {
    "pd-disaggregation": "nothing (always PD)", "prefill": "pdstack_servers", "decode": "pdstack_servers",
    "host": "nothing (127.0.0.1, behind the front door)", "port": "pdstack_router.internal_port",
    "prometheus-port": "pdstack_router.prometheus_port",
    "prometheus-host": "nothing (Prometheus on the monitoring host must reach the metrics port)",
    "policy": "pdstack_router.policy", "prefill-policy": "pdstack_router.prefill_policy",
    "decode-policy": "pdstack_router.decode_policy",
    "max-concurrent-requests": "pdstack_router.admission.max_concurrent_requests (the front door enforces it)",
    "queue-size": "pdstack_router.admission.queue_size (the front door enforces it)",
    "queue-timeout-secs": "pdstack_router.admission.queue_timeout_secs (the front door enforces it)",
    "rate-limit-tokens-per-second": "pdstack_router.admission (the front door enforces it)",
    "cb-timeout-duration-secs": "pdstack_router.circuit_breaker.timeout_secs",
    "cb-failure-threshold": "pdstack_router.circuit_breaker.failure_threshold",
    "shutdown-grace-period-secs": "pdstack_router.shutdown_grace_period_secs",
    "retry-max-retries": "pdstack_router.retries.max_retries",
    "retry-initial-backoff-ms": "pdstack_router.retries.initial_backoff_ms",
    "retry-max-backoff-ms": "pdstack_router.retries.max_backoff_ms",
    "disable-retries": "pdstack_router.retries.max_retries (1 = no retries)",
    "health-check-endpoint": "pdstack_router.health_check.endpoint",
    "health-check-interval-secs": "pdstack_router.health_check.interval_secs",
    "health-check-timeout-secs": "pdstack_router.health_check.timeout_secs",
    "health-failure-threshold": "pdstack_router.health_check.failure_threshold",
    "health-success-threshold": "pdstack_router.health_check.success_threshold",
    "disable-health-check": "pdstack_router.health_check",
    "request-timeout-secs": "pdstack_router.request_timeout_secs",
}
# Router flags that add workers from outside the inventory or switch the router's mode: the worker set is
# pdstack_servers, nothing else.
WORKER_SET_ROUTER_FLAGS = ("worker-urls", "service-discovery", "selector", "prefill-selector", "decode-selector",
                           "service-discovery-port", "service-discovery-namespace", "enable-igw", "mini-lb")
# SGLang flags whose values SGLang 0.5.23 checks only at startup (ServerArgs), minutes in: their limits, here.
VALUE_LIMITS = {
    "mem-fraction-static": (lambda v: 0 < v < 1, "a fraction of GPU memory, 0 < value < 1 (e.g. 0.85)"),
    "chunked-prefill-size": (lambda v: v == -1 or v > 0, "tokens per prefill chunk > 0, or -1 (no chunking)"),
    "max-running-requests": (lambda v: v > 0, "> 0"),
    "max-total-tokens": (lambda v: v > 0, "> 0"),
    "max-prefill-tokens": (lambda v: v > 0, "> 0"),
    "watchdog-timeout": (lambda v: v > 0, "seconds > 0"),
    "cuda-graph-max-bs-decode": (lambda v: v > 0, "> 0"),
    "cuda-graph-max-bs-prefill": (lambda v: v > 0, "> 0"),
    "page-size": (lambda v: v > 0 and int(v) & (int(v) - 1) == 0, "tokens per page, a power of two (e.g. 64)"),
    "schedule-conservativeness": (lambda v: v > 0, "> 0"),
}
# Known GPU names -> architecture (pdstack_model.gpu_arch picks kernels and the indexer path by it)
GPU_ARCHS = (("RTX PRO 6000", "sm_120"), ("RTX 5090", "sm_120"), ("B200", "sm_100"), ("B300", "sm_100"),
             ("GB200", "sm_100"), ("H100", "sm_90"), ("H200", "sm_90"), ("H800", "sm_90"), ("H20", "sm_90"))
# The longest context DeepSeek V4 is published with (1M tokens); the facts check reads the exact value on the host.
DSV4_MAX_CONTEXT = 1048576
# argparse destinations that carry secrets (they would be written into units and plan.json)
SECRET_WORDS = ("api_key", "password", "secret", "db_url", "redis_url", "jwt_")
# destinations ending in _port that are not a listener of this server (they name a remote peer's port)
REMOTE_PORT_WORDS = ("remote", "seed", "service_discovery")


def server_where(host: str, i: int, s: dict[str, Any]) -> str:
    return f"host_vars/{host} pdstack_servers[{i}] ({s.get('name')})"
