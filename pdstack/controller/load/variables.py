"""The pdstack_* variables an inventory may set: each one's type, default and value rule (the schema the loader
types the inventory with). inventory.py builds the Deployment from these."""

from __future__ import annotations

import difflib
from typing import Any

from pdstack.controller.load import rules
from pdstack.controller.load.field_checks import extra_args, non_negative, positive
from pdstack.controller.load.host_settings import HOST_SETTINGS
from pdstack.controller.load.schema import Field, Schema
from pdstack.controller.load.smoke_schema import SMOKE
from pdstack.controller.load.tune_overlay import TUNE

ENVIRONMENTS = ("production", "local", "test")
ENGINES = ("sglang", "sim")
TRANSFER_BACKENDS = ("mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp")  # SGLang 0.5.23 choices
HICACHE_WRITE_POLICIES = ("write_back", "write_through", "write_through_selective")
HICACHE_IO_BACKENDS = ("direct", "kernel")
HICACHE_MEM_LAYOUTS = ("layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head")
ROUTER_POLICIES = ("random", "round_robin", "cache_aware", "power_of_two")
PREFILL_POLICIES = (*ROUTER_POLICIES, "bucket")


def _port(v: Any) -> str | None:
    return None if 1 <= v <= 65535 else f"{v} is not a TCP port (1-65535)"


def _seconds(example: int):
    def check(v: Any) -> str | None:
        return None if v > 0 else f"{v} must be > 0: a whole number of seconds, e.g. {example}"
    return check


def _gpu_list(v: list) -> str | None:
    if not v:
        return "empty GPU list; list the GPU indices this server uses, e.g. [0, 1, 2, 3]"
    if not all(isinstance(g, int) and not isinstance(g, bool) and g >= 0 for g in v):
        return f"{v!r} must be a list of GPU indices (integers >= 0)"
    if len(set(v)) != len(v):
        return f"{v!r} lists a GPU twice"
    return None


# The DeepSeek-V4 family's parsers in SGLang 0.5.23 (function_call/deepseekv4_detector.py, parser/reasoning_parser.py);
# the chat template is not rendered: SGLang takes the model's own (its tokenizer config).
FAMILY_PARSERS = {"deepseek_v4": {"tool_call_parser": "deepseekv4", "reasoning_parser": "deepseek-v4"}}
PARSER_OFF = "off"


def _parser(option: str):
    def check(v: str) -> str | None:
        from pdstack.controller.load import flags

        choices = flags.sglang_choices(option)
        if v == PARSER_OFF or v in choices:
            return None
        hint = difflib.get_close_matches(v, choices, n=1)
        return (f"{v!r} is not a {option} of SGLang 0.5.23" + (f" (did you mean {hint[0]!r}?)" if hint else "")
                + f"; use one of its choices ({', '.join(choices)}), '{PARSER_OFF}', or leave it unset for the "
                "model family's")
    return check


def parser_setting(model: dict[str, Any], key: str) -> str | None:
    """The parser the plan renders for pdstack_model.<key>: the inventory's, else the family's; None when off."""
    v = model.get(key) or FAMILY_PARSERS.get(model.get("family"), {}).get(key)
    return None if v in (None, PARSER_OFF) else v


def _source_url(v: str) -> str | None:
    """An http(s) base URL: a host, no credentials (the hub's token comes from Vault, never from the URL), no query;
    it lands in the model role's argv and the fetcher builds each file's URL from it."""
    from urllib.parse import urlsplit

    try:
        u = urlsplit(v)
    except ValueError as e:
        return f"{v!r} is not a URL ({e})"
    if u.scheme not in ("http", "https") or not u.hostname:
        return f"{v!r} is not an http(s) URL with a host, e.g. http://mirror.example:8080/models/name"
    if u.username or u.password:
        return (f"{v!r} carries credentials; remove them (a hub token goes in Vault: "
                "pdstack_model.source.token_var)")
    if u.query or u.fragment or any(c.isspace() or ord(c) < 32 for c in v):
        return f"{v!r} has a query, fragment, whitespace or control characters; give the plain base URL"
    return None


def _rsync_source(v: str) -> str | None:
    if not v or any(c.isspace() or ord(c) < 32 for c in v) or v.startswith("-"):
        return (f"{v!r} is not an rsync source: HOST:/DIR, rsync://HOST/MODULE/DIR or /DIR, without whitespace or "
                "a leading '-'")
    return None


def _hf_repo(v: str) -> str | None:
    import re

    if not re.fullmatch(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*", v) or ".." in v:
        return f"{v!r} is not a Hugging Face repo id; write OWNER/NAME, e.g. nvidia/DeepSeek-V4-Flash-NVFP4"
    return None


def _revision(v: str) -> str | None:
    import re

    if not re.fullmatch(r"[0-9a-f]{40}", v):
        return (f"{v!r} is not a pinned commit: give the 40-hex commit id the lock was made from (a branch or tag "
                "such as 'main' moves, so the weights would change under the lock); the hub lists it under "
                "'History', or `pdstack model lock --hf REPO --revision main` prints the commit it resolved")
    return None


def _var_name(v: str) -> str | None:
    import re

    if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", v):
        return f"{v!r} is not an Ansible variable name"
    if v.startswith("pdstack_"):
        return (f"{v!r} starts with pdstack_, and preflight writes every pdstack_* variable to the controller's "
                "build/state/<inventory>/inventory.json: a token there would sit in clear text; name it e.g. "
                "hf_token (in Vault)")
    return None


SOURCE = Schema("source", {
    "type": Field((str,), "where the model comes from: hf (a Hugging Face repo at a pinned commit), http (a mirror's "
                  "base URL), rsync (a NAS or a peer host), path (already on the host: verify only)",
                  choices=("hf", "http", "rsync", "path")),
    "lock": Field((str,), "the lock file (`pdstack model lock`): every file's path, size and sha256; relative to the "
                  "inventory directory. The served model is exactly the lock"),
    "url": Field((str,), "http: the mirror's base URL (a file's URL is URL/<path in the lock>)", default=None,
                 check=_source_url),
    "rsync": Field((str,), "rsync: the source directory, HOST:/DIR or rsync://HOST/MODULE/DIR (the host's own "
                   "ssh/rsync credentials)", default=None, check=_rsync_source),
    "repo": Field((str,), "hf: the repo id, e.g. nvidia/DeepSeek-V4-Flash-NVFP4", default=None, check=_hf_repo),
    "revision": Field((str,), "hf: the pinned commit (40 hex); branches and tags are refused", default=None,
                      check=_revision),
    "endpoint": Field((str,), "hf: the hub or a mirror of it (HF_ENDPOINT)", default="https://huggingface.co",
                      check=_source_url),
    "token_var": Field((str,), "hf: the Ansible variable (from Vault) holding the hub token; the variable unset or "
                       "empty: no token", default="hf_token", check=_var_name),
    "jobs": Field((int,), "files fetched at once", default=4, check=positive),
    "free_margin_gb": Field((int, float), "GB that must stay free on the model's filesystem after the fetch "
                            "(preflight refuses a host with less)", default=2, check=non_negative),
})

MODEL = Schema("pdstack_model", {
    "path": Field((str,), "model directory on the host, mounted read-only into the server",
                  check=rules.host_path_problem),
    "served_name": Field((str,), "name clients ask for (--served-model-name)", check=rules.flag_like_problem),
    "context_length": Field((int,), "maximum context length in tokens (--context-length)", check=positive),
    "family": Field((str,), "model family: deepseek_v4 turns on DeepSeek-V4 rules (no --hicache-size, DSA index keys)",
                    default="deepseek_v4", choices=("deepseek_v4", "other")),
    "index_k_dtype": Field((str,), "DSA index keys and their reader: bf16 (pdstack's patch, 256 B/token; the recall "
                           "fix), fp8-torch (132 B/token, SGLang's torch reader: recall unproven) or fp8-tilelang "
                           "(132 B/token, upstream's sm_120 default: collapsed past ~2K)", default="bf16",
                           choices=("bf16", "fp8-torch", "fp8-tilelang")),
    "trust_remote_code": Field((bool,), "pass --trust-remote-code", default=True),
    "gpu_arch": Field((str,), "GPU architecture of the serving hosts: sm_120 (RTX PRO 6000 Blackwell) has no DeepGEMM "
                      "build, so DeepSeek-V4's indexer is routed to the torch/pdstack-kernel path", default="sm_120",
                      choices=("sm_120", "sm_100", "sm_90")),
    "tool_call_parser": Field((str,), "--tool-call-parser (turns the model's tool-call markup into OpenAI tool_calls); "
                              "unset: the family's (deepseek_v4: deepseekv4), 'off': none, else one of SGLang 0.5.23's "
                              "choices", default=None, check=_parser("--tool-call-parser")),
    "reasoning_parser": Field((str,), "--reasoning-parser (puts the model's thinking into reasoning_content); unset: "
                              "the family's (deepseek_v4: deepseek-v4), 'off': none, else one of SGLang 0.5.23's "
                              "choices", default=None, check=_parser("--reasoning-parser")),
    "source": Field((dict,), "where the model phase fetches the model from and the lock it verifies against; "
                    "unset: the model is not managed (the serving phase only checks config.json)", default=None,
                    schema=SOURCE),
})

IMAGE = Schema("pdstack_image", {
    "ref": Field((str,), "container image reference the servers and the router run (pin production by digest); "
                 "or leave it unset and name the build manifest", default=None),
    "manifest": Field((str,), "build/manifest-<flavor>.json written by `invoke build --save`: the image tag, id "
                      "and saved tarball come from it (path relative to the repo root)", default=None),
    "tarball": Field((str,), "saved image tarball on the controller that the image phase pushes (its sha256 in "
                     "<tarball>.sha256); default: the manifest's", default=None),
    "registry": Field((str,), "registry the hosts pull from, HOST[:PORT] as the hosts reach it: the image phase "
                      "`docker pull`s REGISTRY/pdstack/<flavor>@sha256:... (the digest `invoke build --push` recorded "
                      "in the manifest, or `digest`) instead of copying a tarball; with `ref`, ref must be "
                      "REGISTRY/...@sha256:<digest>", default=None),
    "digest": Field((str,), "sha256:<64 hex>, the pushed image's digest (with manifest + registry); default: the "
                    "manifest's pushed.digest_ref", default=None),
    "engine": Field((str,), "sglang (the GPU engine) or sim (the TEST ENGINE simulator; never in production)",
                    default="sglang", choices=ENGINES),
})

PORTS = Schema("ports", {
    "http": Field((int,), "HTTP API port (--port); SGLang also serves /metrics here", check=_port),
    "bootstrap": Field((int,), "PD bootstrap port of a prefill server (--disaggregation-bootstrap-port)",
                       default=8998, check=_port),
    "metrics": Field((int,), "metrics port; SGLang 0.5.23 serves /metrics on the HTTP port, so leave unset or equal "
                     "to http", default=None, check=_port),
})

HICACHE = Schema("hicache", {
    "enabled": Field((bool,), "hierarchical (host memory) KV cache (--enable-hierarchical-cache)", default=False),
    "host_budget_gb": Field((int, float), "host memory for this server's HiCache pool, GB, taken from the server's "
                            "NUMA node (membind caps it there)", default=None, check=positive),
    "device_kv_pool_gb": Field((int, float), "the server's device KV pool over all its GPUs, GB (read it from the "
                               "server's 'KV Cache is allocated' log line); the ratio is budget / this",
                               default=None, check=positive),
    "write_policy": Field((str,), "--hicache-write-policy", default="write_through", choices=HICACHE_WRITE_POLICIES),
    "io_backend": Field((str,), "--hicache-io-backend", default="kernel", choices=HICACHE_IO_BACKENDS),
    "mem_layout": Field((str,), "--hicache-mem-layout", default="page_first", choices=HICACHE_MEM_LAYOUTS),
})

TRANSFER = Schema("transfer", {
    "backend": Field((str,), "--disaggregation-transfer-backend", default="mooncake", choices=TRANSFER_BACKENDS),
    "ib_device": Field((str,), "--disaggregation-ib-device (e.g. mlx5_0); unset: the backend picks", default=None,
                       check=rules.flag_like_problem),
})

SERVER = Schema("server", {
    "name": Field((str,), "unique server name (unit and container name: pdstack-<name>)", check=rules.name_problem),
    "role": Field((str,), "prefill or decode", choices=("prefill", "decode")),
    "gpus": Field((list,), "GPU indices this server uses", check=_gpu_list),
    "tp_size": Field((int,), "tensor parallel size (--tp-size); must equal the number of GPUs", check=positive),
    "numa_node": Field((int,), "NUMA node; taken from the facts (the node the GPUs hang off). Pin it only with "
                       "numa_override: true", default=None, check=non_negative),
    "numa_override": Field((bool,), "allow numa_node to differ from the GPUs' node", default=False),
    "ports": Field((dict,), "ports of this server", schema=PORTS),
    "hicache": Field((dict,), "HiCache policy", default=dict, schema=HICACHE),
    "transfer": Field((dict,), "KV transfer backend", default=dict, schema=TRANSFER),
    "extra_args": Field((dict,), "extra SGLang flags, name without dashes -> value (true for a bare flag)",
                        default=dict, check=extra_args("sglang")),
    "env": Field((dict,), "extra environment variables for the server", default=dict),
})

ADMISSION = Schema("admission", {
    "max_concurrent_requests": Field((int,), "requests the front door (HAProxy) lets through to the router at once "
                                     "(its server maxconn); -1 turns admission control off", default=-1),
    "queue_size": Field((int,), "requests that wait in the front door when every slot is busy, served in order as "
                        "slots free; beyond it: 429 + Retry-After at once", default=100),
    "queue_timeout_secs": Field((int,), "seconds a request may wait in the front door's queue; then 503 + "
                                "Retry-After (HAProxy timeout queue)", default=60, check=positive),
})

FRONTDOOR = Schema("frontdoor", {
    "bind": Field((str,), "address the front door (HAProxy) listens on, port pdstack_router.port", default="0.0.0.0"),
    "metrics_port": Field((int,), "port of HAProxy's Prometheus exporter (/metrics)", default=8404, check=_port),
    "retry_after_secs": Field((int,), "Retry-After seconds on the front door's 429 and 503 answers", default=2,
                              check=positive),
    "request_read_timeout_secs": Field((int,), "seconds a client has to send its whole request (headers and body) "
                                       "before it takes a slot; then 408 (HAProxy timeout http-request)", default=10,
                                       check=positive),
    "max_body_bytes": Field((int,), "largest request body the front door accepts (it is buffered whole before a slot "
                            "is taken); larger: 413", default=4 * 1024 * 1024, check=positive),
    "max_connections_per_source": Field((int,), "connections one client address may hold at once (requests in flight, "
                                        "queued or being read); beyond: 429 source-limit. 0: no limit (clients "
                                        "behind one proxy or NAT share an address)", default=0, check=non_negative),
    "cors_origins": Field((list,), "browser origins (scheme://host[:port], lower case) whose pages may call the API: "
                          "they get CORS answers (Access-Control-Allow-Origin). Empty: no CORS, browsers on other "
                          "origins are refused", default=list),
    "client_timeout_secs": Field((int,), "seconds a client may read nothing of its answer once the front door's "
                                 "buffers towards it are full; then it is let go (HAProxy timeout client)",
                                 default=30, check=positive),
})

CIRCUIT_BREAKER = Schema("circuit_breaker", {
    "timeout_secs": Field((int,), "seconds an open circuit stays open before the router tries the worker again "
                          "(--cb-timeout-duration-secs; 0.3.2 opens it on prefill AND decode when one fails)",
                          default=10, check=positive),
    "failure_threshold": Field((int,), "failures in the window that open a worker's circuit (--cb-failure-threshold)",
                               default=10, check=positive),
})

RETRIES = Schema("retries", {
    "max_retries": Field((int,), "retries per request (--retry-max-retries)", default=5, check=non_negative),
    "initial_backoff_ms": Field((int,), "first retry backoff, ms (--retry-initial-backoff-ms)", default=50,
                                check=non_negative),
    "max_backoff_ms": Field((int,), "retry backoff cap, ms (--retry-max-backoff-ms)", default=30000,
                            check=non_negative),
})

HEALTH = Schema("health_check", {
    "endpoint": Field((str,), "worker endpoint the router polls (--health-check-endpoint)", default="/health"),
    "interval_secs": Field((int,), "seconds between polls", default=10, check=positive),
    "timeout_secs": Field((int,), "poll timeout, seconds", default=5, check=positive),
    "failure_threshold": Field((int,), "failed polls before a worker is unhealthy", default=3, check=positive),
    "success_threshold": Field((int,), "good polls before it is healthy again", default=2, check=positive),
})

ROUTER = Schema("pdstack_router", {
    "port": Field((int,), "the deployment's public port: the front door (HAProxy) listens here", default=8000,
                  check=_port),
    "internal_port": Field((int,), "port sglang-router listens on, on 127.0.0.1 behind the front door", default=8001,
                           check=_port),
    "prometheus_port": Field((int,), "router metrics port (--prometheus-port; smg_ metrics)", default=29000,
                             check=_port),
    "policy": Field((str,), "load-balancing policy (--policy)", default="round_robin", choices=ROUTER_POLICIES),
    "prefill_policy": Field((str,), "policy for prefill workers (--prefill-policy)", default=None,
                            choices=PREFILL_POLICIES),
    "decode_policy": Field((str,), "policy for decode workers (--decode-policy)", default=None,
                           choices=ROUTER_POLICIES),
    "admission": Field((dict,), "admission control, enforced by the front door (sglang-router 0.3.2's own limiter "
                       "is a rate limiter: docs/facts.md, sglang-router 0.3.2)", default=dict, schema=ADMISSION),
    "frontdoor": Field((dict,), "the front door (HAProxy) on the router host", default=dict, schema=FRONTDOOR),
    "circuit_breaker": Field((dict,), "the router's circuit breaker", default=dict, schema=CIRCUIT_BREAKER),
    "shutdown_grace_period_secs": Field((int,), "seconds the router drains in-flight requests when stopped "
                                        "(--shutdown-grace-period-secs); its unit waits this + 10 s before killing "
                                        "it, so requests that finish within it complete", default=120,
                                        check=positive),
    "retries": Field((dict,), "retry settings", default=dict, schema=RETRIES),
    "health_check": Field((dict,), "worker health checks", default=dict, schema=HEALTH),
    "request_timeout_secs": Field((int,), "the time budget of one request, seconds: an answer not begun within it "
                                  "gets the front door's 504 (HAProxy timeout server), a stream may pause this "
                                  "long between chunks; the router's own --request-timeout-secs is this + 30 "
                                  "(so it never retries a timed-out request) and caps a whole stream",
                                  default=1800, check=positive),
    "extra_args": Field((dict,), "extra router flags, name without dashes -> value", default=dict,
                          check=extra_args("router")),
})

PD = Schema("pdstack_pd", {
    "bootstrap_timeout_s": Field((int,), "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT: seconds a prefill waits for its "
                                 "decode peer's bootstrap", default=300, check=positive),
    "waiting_timeout_s": Field((int,), "SGLANG_DISAGGREGATION_WAITING_TIMEOUT: seconds a decode waits for the KV "
                               "transfer", default=300, check=positive),
    "heartbeat_interval_s": Field((int, float), "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL: seconds between PD peer "
                                  "heartbeats", default=5.0, check=positive),
    "heartbeat_max_failure": Field((int,), "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE: missed heartbeats before a "
                                   "peer is dead", default=2, check=positive),
    "health_check_timeout_s": Field((int,), "SGLANG_HEALTH_CHECK_TIMEOUT: seconds /health waits for its 1-token "
                                    "generate", default=20, check=positive),
})

ROLLOUT = Schema("pdstack_rollout", {
    "drain_timeout_secs": Field((int,), "seconds a server that is about to restart (new image, changed unit or env) "
                                "gets for its in-flight requests to finish once no new ones reach it (taken out of "
                                "the router, or the front door's maintenance switch when it is the only server of "
                                "its role); then it is restarted anyway. Unset: pdstack_router.request_timeout_secs "
                                "(no request outlives it)", default=None, check=_seconds(600)),
    "probe_timeout_secs": Field((int,), "seconds a restarted server has, after its /health, to pass a real generation "
                                "(prefill -> KV transfer -> decode) before it is put back; then the play fails and it "
                                "stays out of the router", default=120, check=_seconds(120)),
})

TOP_LEVEL = {
    "pdstack_environment": Field((str,), "production, local or test", choices=ENVIRONMENTS),
    "pdstack_model": Field((dict,), "the served model", schema=MODEL),
    "pdstack_image": Field((dict,), "the image", schema=IMAGE),
    "pdstack_router": Field((dict,), "the router", default=dict, schema=ROUTER),
    "pdstack_pd": Field((dict,), "SGLang PD timeouts (environment of every server)", default=dict, schema=PD),
    "pdstack_smoke": Field((dict,), "the smoke checks after a deploy", default=dict, schema=SMOKE),
    "pdstack_rollout": Field((dict,), "rolling restarts of the servers: drain and probe bounds", default=dict,
                             schema=ROLLOUT),
    "pdstack_host": Field((dict,), "PCIe host settings and the reboot policy", default=dict, schema=HOST_SETTINGS),
    "pdstack_tune": Field((dict,), "a tuning candidate's overlay of server settings (`invoke tune` passes it as an "
                          "extra var; never set it in an inventory)", default=None, schema=TUNE),
    "pdstack_model_verify": Field((str,), "the model phase's check of the files in place: quick (sizes and mtimes "
                                  "against its verification record; nothing re-read) or full (every file hashed "
                                  "again, what differs fetched again)", default="quick", choices=("quick", "full")),
}
HOST_LEVEL = {
    "pdstack_servers": Field((list,), "prefill/decode servers on this host", default=list, item_schema=SERVER),
    "pdstack_address": Field((str,), "address other hosts reach this host at", default=None),
    "pdstack_numa_reserve_gb": Field((int, float), "memory per NUMA node kept for the OS and the server processes "
                                     "themselves (weights staging, pinned buffers), GB; HiCache gets the rest",
                                     default=32, check=non_negative),
}


# Role variables an inventory may set (group_vars or host_vars) that move a port of a service pdstack installs:
# preflight checks the ports the plan will use, so these are read with the pdstack_* variables (the preflight role's
# resolved variables carry them too: roles/preflight/tasks/resolved.yml). Variable -> the role whose default it is.
ROLE_PORT_VARS = {"node_exporter_port": "node_exporter", "dcgm_exporter_port": "dcgm_exporter",
                  "prometheus_listen": "prometheus", "grafana_port": "grafana"}
