"""Preflight: every check that can reject an inventory before any host is touched.

Two stages, both pure functions over the typed Deployment:
  static_problems(dep)            needs nothing but the inventory (typos, TP vs GPUs, ports, flags, admission)
  topology_problems(dep, facts)   needs each host's facts (GPU count, NUMA nodes, memory)
Each problem names the variable and says how to fix it. The preflight role and `pdstack plan` call both.

The `pdstack preflight` subcommand (register/run at the end):
`pdstack preflight -i INVENTORY [--facts FILE|DIR]`: validate without printing the plan.

Without facts only the static checks run (typos, TP vs GPUs, ports, flags, admission); with facts the topology
checks run too (GPU count, NUMA nodes, HiCache budget per node). Exit 0 when clean, 2 with every problem listed.
"""

from __future__ import annotations

import argparse
import difflib
import json
import math
from collections import defaultdict
from typing import Any

from pdstack.controller import flags, inventory, rules
from pdstack.controller.inventory import Deployment
from pdstack.errors import InventoryError

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
_REMOTE_PORT_WORDS = ("remote", "seed", "service_discovery")


def _where(host: str, i: int, s: dict[str, Any]) -> str:
    return f"host_vars/{host} pdstack_servers[{i}] ({s.get('name')})"


def _dests(parser, table) -> dict[str, tuple[str, str]]:
    """{dest: (flag, variable)} of a flag table."""
    out = {}
    for flag, var in (table.items() if isinstance(table, dict) else ((f, "") for f in table)):
        a = flags.action_for(parser, f"--{flag}")
        if a is None:  # pragma: no cover - the pinned parser changed; test_preflight catches it
            raise RuntimeError(f"--{flag} is not a flag of the pinned parser")
        out[a.dest] = (flag, var)
    return out


def _rendered_dests(parser, argv: list[str]) -> dict[str, tuple[str, str]]:
    """{dest: (flag, variable)} of what the planner itself renders (the argv without extra_args), so a flag the
    planner starts rendering is owned at once, whether or not OWNED_FLAGS names its variable yet."""
    return {d: (opt[2:], "the pdstack inventory variable the planner renders it from")
            for d, opt in flags.dests_set(parser, argv).items()}


def _planner_server_flags(dep: Deployment, s: dict) -> list[str]:
    from pdstack.controller import planner

    hc = planner.HiCachePlan(enabled=bool(s["hicache"]["enabled"]), ratio=1.0)
    try:
        return planner.server_flags(dep, {**s, "extra_args": {}}, hc)
    except (KeyError, TypeError, ValueError):  # a server the schema already refused
        return []


def _planner_router_flags(dep: Deployment) -> list[str]:
    import dataclasses

    from pdstack.controller import planner

    try:
        bare = dataclasses.replace(dep, router={**dep.router, "extra_args": {}})
        return planner.router_flags(bare, [])[0]
    except (KeyError, TypeError, ValueError):
        return []


def owned_env() -> dict[str, str]:
    """Environment variables the planner sets, and where each comes from."""
    from pdstack.controller import planner

    env = {"NVIDIA_VISIBLE_DEVICES": "the server's gpus", "CUDA_VISIBLE_DEVICES": "the server's gpus",
           "PATH": "the image (its PATH finds python3 and the launcher)",
           planner.BF16_INDEX_K_ENV: "pdstack_model.index_k_dtype (the same on prefill and decode)",
           planner.SM120_INDEXER_ENV: "pdstack_model.gpu_arch"}
    env.update({name: f"pdstack_pd.{key}" for key, name in planner.PD_ENV.items()})
    return env


def _extra_arg_problems(parser, where: str, key: str, value: Any, owned: dict, refused: dict,
                        what: str, model_path: str | None = None) -> list[str]:
    """Problems of one extra_args entry: the flag exists, is not the planner's, and its value has a form the flag
    takes and the unit can carry. `refused`: {dest: (flag, reason)}."""
    path = f"{where}.extra_args.{key}"
    a = flags.action_for(parser, f"--{key}")
    if a is None:
        options = sorted(o[2:] for o in parser._option_string_actions if o.startswith("--"))
        hint = difflib.get_close_matches(key, options, n=1)
        return [f"{path}: {what} rejects it: --{key} is not one of its flags (spell it exactly, no abbreviations)"
                + (f"; did you mean '{hint[0]}'?" if hint else f"; see `{parser.prog} --help`")]
    if a.dest in owned:
        flag, var = owned[a.dest]
        same = "" if flag == key else f" (it sets the same setting as --{flag}: {a.dest})"
        if var.startswith("nothing"):
            return [f"{path}: the planner renders --{flag} itself{same}, {var[len('nothing '):].strip('()')}; "
                    f"remove extra_args.{key}"]
        return [f"{path}: the planner renders --{flag} itself{same}; set {var} instead and remove extra_args.{key}"]
    if a.dest in refused:
        return [f"{path}: {refused[a.dest]}; remove extra_args.{key}"]
    if value is None:
        return [f"{path}: no value (YAML null); write true for a switch, the value for a flag, or remove the key"]
    if value is False:
        return []
    if a.nargs == 0 and value is not True:
        return [f"{path}: --{key} is a switch and takes no value, got {value!r}; write true (or false to leave it "
                "off)"]
    if value is True and a.nargs not in (0, "?"):
        return [f"{path}: --{key} takes a value, got true; write the value (e.g. {key}: {a.default!r})"
                if a.default not in (None, False) else f"{path}: --{key} takes a value, got true; write the value"]
    if isinstance(value, dict) and not flags.takes_json(a):
        return [f"{path}: a mapping, but --{key} takes {'a list of values' if flags.takes_many(a) else 'one value'}"
                "; write the value itself (mappings are written as JSON only for flags that take JSON)"]
    if isinstance(value, list) and not (flags.takes_json(a) or flags.takes_many(a)):
        return [f"{path}: a list, but --{key} takes one value; write one value"]
    if isinstance(value, list) and flags.takes_many(a) and not flags.takes_json(a):
        bad = [v for v in value if isinstance(v, bool | dict | list) or v is None]
        if bad:
            return [f"{path}: list items {bad!r} are not plain values; --{key} takes strings or numbers"]
        if not value and a.nargs == "+":
            return [f"{path}: an empty list, but --{key} needs at least one value"]
    if isinstance(value, str) and flags.takes_json(a) and value.lstrip()[:1] in "{[":
        try:
            json.loads(value)
        except ValueError as e:
            return [f"{path}: --{key} takes JSON, and {value!r} is not valid JSON ({e}); write it as a YAML mapping "
                    "and pdstack renders the JSON"]
    out = []
    if any(w in a.dest for w in SECRET_WORDS):
        out.append(f"{path}: --{key} is a secret, and extra_args land in the unit, /etc/pdstack/plan.json "
                   "(world-readable) and the journal; pdstack has no secret store for it: remove it")
    path_valued = any(w in a.dest for w in ("path", "file", "template", "config", "dir"))
    if path_valued and isinstance(value, str) and value.startswith("/"):
        mount = model_path if what.startswith("SGLang") else None
        if mount is None:
            out.append(f"{path}: {value} is a host path, but the router's container mounts no host directory; "
                       f"remove --{key}")
        elif value != mount and not value.startswith(mount.rstrip("/") + "/"):
            out.append(f"{path}: {value} is outside pdstack_model.path {mount}, the only host directory the "
                       f"server's container mounts (read-only); put the file under {mount} and point --{key} there")
    for word in flags.render_value(value, a):
        if msg := rules.unit_value_problem(word):
            out.append(f"{path}: {msg}; change the value"
                       + (" (JSON is written compactly, but strings inside it must not hold spaces)"
                          if isinstance(value, dict | list) else ""))
    return out


def _listener_ports(parser, extra: dict) -> list[tuple[int, str, str]]:
    """(port, key, dest) of every extra flag that makes the server listen on a port."""
    out = []
    for key, value in extra.items():
        a = flags.action_for(parser, f"--{key}")
        if (a is not None and a.dest.endswith("_port") and not any(w in a.dest for w in _REMOTE_PORT_WORDS)
                and isinstance(value, int) and not isinstance(value, bool)):
            out.append((value, key, a.dest))
    return out


def static_problems(dep: Deployment, deploy: bool = True) -> list[str]:
    """Every check that needs only the inventory. `deploy`: the inventory is about to be deployed (preflight,
    `pdstack plan --require-image`): placeholder addresses are errors; a dry plan only warns about them."""
    p: list[str] = []
    servers = [(h.name, i, s) for h in dep.hosts.values() for i, s in enumerate(h.servers)]
    _deployment_problems(dep, servers, p)
    for host, i, s in servers:
        _server_problems(dep, host, i, s, p)
    _pd_agreement_problems(dep, servers, p)
    _router_problems(dep, p)
    _rollout_problems(dep, p)
    _port_problems(dep, p)
    _address_problems(dep, p, deploy)
    _smoke_problems(dep, p)
    return p


def _image_pull_problems(img: dict[str, Any], p: list[str]) -> None:
    """pdstack_image.registry/digest: what can be checked without the manifest (the planner checks it)."""
    reg, dig = img["registry"], img["digest"]
    repo = "pdstack/sim" if img["engine"] == "sim" else "pdstack/sglang"  # what `invoke build --push` pushes
    if dig is not None:
        if reg is None:
            p.append(f"pdstack_image.digest: set only with pdstack_image.registry (the image phase pulls "
                     f"REGISTRY/{repo}@DIGEST); set registry, or remove digest")
        if msg := rules.digest_problem(dig):
            p.append(f"pdstack_image.digest: {msg}; use the digest `invoke build --push` recorded "
                     "(pushed.digest_ref in the manifest), or remove digest to take it from the manifest")
    if reg is None:
        return
    if msg := rules.registry_problem(reg):
        p.append(f"pdstack_image.registry: {msg}")
        return
    if img["tarball"] is not None:
        p.append("pdstack_image.tarball: set together with pdstack_image.registry; the image phase either pulls "
                 "from the registry or copies a tarball: remove one of them")
    ref = img["ref"]
    if ref is None or rules.image_ref_problem(ref):
        return
    if dig is not None:
        p.append("pdstack_image.digest: set together with ref; the digest is part of ref "
                 f"({reg}/{repo}@sha256:...): remove digest")
    parts = rules.split_digest_ref(ref)
    if parts is None:
        p.append(f"pdstack_image.ref: {ref!r} is not a digest reference; with pdstack_image.registry the hosts pull "
                 f"by digest: set ref to {reg}/{repo}@sha256:<digest> (pushed.digest_ref in the manifest "
                 "`invoke build --push` wrote, with the registry as the hosts reach it), or set manifest instead "
                 "of ref")
    elif parts[0] != reg:
        p.append(f"pdstack_image.ref: {ref!r} names registry {parts[0]}, but pdstack_image.registry is {reg}; "
                 f"make them agree ({reg}/{parts[1]}@{parts[2]})")


def _deployment_problems(dep: Deployment, servers, p: list[str]) -> None:
    if dep.environment == "production" and dep.image["engine"] == "sim":
        p.append("pdstack_image.engine: 'sim' is the TEST ENGINE and never runs in production; set engine: sglang")
    img = dep.image
    if (img["ref"] is None) == (img["manifest"] is None):
        p.append("pdstack_image: set exactly one of ref (an image reference) or manifest (build/manifest-<flavor>.json "
                 "from `invoke build`)")
    if img["ref"] is not None and (msg := rules.image_ref_problem(img["ref"])):
        p.append(f"pdstack_image.ref: {msg}")
    _image_pull_problems(img, p)
    if msg := rules.unit_value_problem(dep.model["served_name"]):
        p.append(f"pdstack_model.served_name: {msg}; use a name like deepseek-v4-flash")
    if dep.model["family"] == "deepseek_v4" and dep.model["context_length"] > DSV4_MAX_CONTEXT:
        p.append(f"pdstack_model.context_length: {dep.model['context_length']} is beyond DeepSeek V4's "
                 f"{DSV4_MAX_CONTEXT}-token context; SGLang refuses to start with a context longer than the model's "
                 f"(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN aside): set context_length <= {DSV4_MAX_CONTEXT}")
    roles = {s["role"] for _, _, s in servers}
    for role in ("prefill", "decode"):
        if role not in roles:
            p.append(f"pdstack_servers: no {role} server in any host_vars; a PD deployment needs at least one "
                     f"(add a server with role: {role})")
    seen: dict[str, str] = {}
    for host, i, s in servers:
        key = s["name"].lower()  # unit and container names are case-sensitive, but file systems may not be
        if key in seen:
            p.append(f"{_where(host, i, s)}.name: '{s['name']}' is also used on {seen[key]}; server names must be "
                     "unique (they name units, containers and files)")
        seen.setdefault(key, host)
    for name in dep.hosts:
        if not rules.HOST_NAME_RE.fullmatch(name):
            p.append(f"host {name!r} (hosts.yml): not a usable inventory host name; it names files and metric labels: "
                     "letters, digits, '.', '_' and '-', starting with a letter or digit")
    for name, h in dep.hosts.items():
        if h.numa_reserve_gb < 0:
            p.append(f"host_vars/{name} pdstack_numa_reserve_gb: {h.numa_reserve_gb:g} is negative; it is memory "
                     "kept back per NUMA node (>= 0, e.g. 32)")


def _server_problems(dep: Deployment, host: str, i: int, s: dict, p: list[str]) -> None:
    where = _where(host, i, s)
    family = dep.model["family"]
    tp = s["tp_size"]
    if tp != len(s["gpus"]):
        p.append(f"{where}.tp_size: {tp} does not match its {len(s['gpus'])} GPUs {s['gpus']}; "
                 f"set tp_size: {len(s['gpus'])} or change gpus")
    if tp > 0 and tp & (tp - 1):
        lower = 1 << (tp.bit_length() - 1)
        heads = " (DeepSeek V4: 64 heads)" if family == "deepseek_v4" else ""
        p.append(f"{where}.tp_size: {tp} is not a power of two; tensor parallelism splits the attention heads "
                 f"evenly{heads}, so use 1, 2, 4 or 8, e.g. tp_size: {lower} with {lower} GPUs")
    if s["numa_node"] is not None and s["numa_node"] < 0:
        p.append(f"{where}.numa_node: {s['numa_node']} is not a NUMA node (ids are >= 0)")
    # numa_node (unless numa_override) is compared with the GPUs' node from the facts: topology_problems
    if s["ports"]["metrics"] not in (None, s["ports"]["http"]):
        p.append(f"{where}.ports.metrics: {s['ports']['metrics']} differs from ports.http "
                 f"{s['ports']['http']}; SGLang 0.5.23 serves /metrics on its HTTP port: remove ports.metrics")
    hc = s["hicache"]
    if hc["enabled"]:
        for k in ("host_budget_gb", "device_kv_pool_gb"):
            if hc[k] is None:
                p.append(f"{where}.hicache.{k}: required when hicache.enabled is true (the planner computes "
                         "--hicache-ratio = host_budget_gb / device_kv_pool_gb)")
        if hc["host_budget_gb"] and hc["device_kv_pool_gb"]:
            budget, pool = float(hc["host_budget_gb"]), float(hc["device_kv_pool_gb"])
            ratio = math.floor(budget / pool * 1000) / 1000
            arith = (f"--hicache-ratio = host_budget_gb / device_kv_pool_gb = {budget:g} / {pool:g} = "
                     f"{budget / pool:.4f} -> {ratio:.3f} (rounded down)")
            if ratio <= 0:
                p.append(f"{where}.hicache: {arith}: a host pool of 0 GiB; raise host_budget_gb (at least "
                         f"{pool:g} for a host pool as large as the device pool) or set hicache.enabled: false")
            elif ratio < 1:
                dep.warnings.append(
                    f"{where}.hicache: {arith} < 1: the host pool ({ratio * pool:.1f} GiB) is smaller than the device "
                    f"pool ({pool:g} GiB), so HiCache holds less than the GPUs already do (SGLang 0.5.23 warns "
                    f"'L2 cache effectiveness is reduced'); raise host_budget_gb to >= {pool:g} GiB if the NUMA node "
                    "has room, or disable HiCache")
    tr = s["transfer"]
    if tr["ib_device"] is not None:
        names = tr["ib_device"].split(",")
        bad = [n for n in names if not rules.IB_NAME_RE.fullmatch(n)]
        if bad:
            p.append(f"{where}.transfer.ib_device: {tr['ib_device']!r} is not an InfiniBand device name or a "
                     "comma-separated list of them (as /sys/class/infiniband names them, e.g. mlx5_0 or "
                     "mlx5_0,mlx5_1); `ibv_devices` on the host lists them")
        if tr["backend"] in ("mooncake_tcp", "fake"):
            dep.warnings.append(f"{where}.transfer.ib_device: backend {tr['backend']} does not use InfiniBand; "
                                "ib_device is ignored")
    parser = flags.sglang_parser()
    owned = {**_rendered_dests(parser, _planner_server_flags(dep, s)), **_dests(parser, OWNED_FLAGS)}
    refused = {d: f"--{flag} changes which or how many GPUs the server uses (pdstack runs one server on exactly "
                  "the GPUs in gpus, tp_size of them, on one host)" for d, (flag, _) in
               _dests(parser, GPU_SET_FLAGS).items()}
    extra = s["extra_args"]
    problems_before = len(p)
    by_dest: dict[str, list[str]] = defaultdict(list)
    for key in extra:
        a = flags.action_for(parser, f"--{key}")
        if a is not None and extra[key] is not None:
            by_dest[a.dest].append(key)
    for dest, keys in by_dest.items():
        if len(keys) > 1:
            p.append(f"{where}.extra_args: {', '.join(keys)} all set {dest} (they are one SGLang setting, the last "
                     f"one would win); keep one of them")
    for key, value in extra.items():
        if key in VALUE_LIMITS and isinstance(value, int | float) and not isinstance(value, bool):
            ok, rule = VALUE_LIMITS[key]
            if not ok(value):
                p.append(f"{where}.extra_args.{key}: {value} is out of range: {rule} (SGLang 0.5.23 refuses it at "
                         "startup, after loading for minutes)")
        if key == "hicache-size" and family == "deepseek_v4":
            p.append(f"{where}.extra_args.hicache-size: DeepSeek V4 rejects --hicache-size (ValueError when the "
                     "memory pool is built, minutes into startup); remove it and set hicache.host_budget_gb, "
                     "from which the planner derives --hicache-ratio")
            continue
        p.extend(_extra_arg_problems(parser, where, key, value, owned, refused, "SGLang 0.5.23",
                                     dep.model["path"]))
    if "max-queued-requests" in extra and dep.router["admission"]["max_concurrent_requests"] < 0:
        p.append(f"{where}.extra_args.max-queued-requests: SGLang 0.5.23 ignores it on PD servers (enforced only "
                 "with --disaggregation-mode null), so this server has no admission control; set "
                 "pdstack_router.admission.max_concurrent_requests (and queue_size) and remove it here")
    elif "max-queued-requests" in extra:
        dep.warnings.append(f"{where}.extra_args.max-queued-requests does nothing on a PD server in SGLang "
                            "0.5.23; admission control is pdstack_router.admission")
    if len(p) == problems_before:
        err = flags.check_sglang(["--model-path", "/x", *flags.render_extra(extra, parser)])
        if err:
            p.append(f"{where}.extra_args: SGLang 0.5.23 rejects it: {err}; spell the flag exactly as "
                     "`python -m sglang.launch_server --help` does (no abbreviations) and give it a value it takes")
    # environment
    env_owned = owned_env()
    for k, v in s["env"].items():
        path = f"{where}.env.{k}"
        if not rules.ENV_NAME_RE.fullmatch(k):
            p.append(f"{path}: {k!r} is not an environment variable name (letters, digits and '_', not starting "
                     "with a digit)")
        elif k in env_owned and env_owned[k].startswith("the image"):
            p.append(f"{path}: {k} comes from {env_owned[k]}; remove env.{k}")
        elif k in env_owned:
            p.append(f"{path}: the planner sets {k} itself from {env_owned[k]}; set that instead and remove env.{k}")
        elif isinstance(v, bool):
            p.append(f"{path}: {v!r} is a YAML boolean, which would be written as {str(v)!r}; quote the value you "
                     f"mean, e.g. {k}: \"1\" or \"true\"")
        elif v is None or isinstance(v, dict | list):
            p.append(f"{path}: {type(v).__name__ if v is not None else 'null'} {v!r}; an environment variable is "
                     "one string (quote it in YAML)")
        elif msg := rules.env_value_problem(str(v)):
            p.append(f"{path}: {msg}; change the value")


def _pd_agreement_problems(dep: Deployment, servers, p: list[str]) -> None:
    """Prefill and decode exchange KV pages: everything the page layout and the transfer depend on must match."""
    pd = [(host, i, s) for host, i, s in servers if s["role"] in ("prefill", "decode")]
    if len(pd) < 2:
        return
    parser = flags.sglang_parser()
    kv = _dests(parser, KV_TRANSFER_FLAGS)

    def differ(label: str, fix: str, value_of) -> None:
        seen: dict[str, list[str]] = defaultdict(list)
        for host, _i, s in pd:
            seen[value_of(s)].append(f"{s['name']} ({s['role']}, {host})")
        if len(seen) > 1:
            parts = "; ".join(f"{', '.join(who)}: {v}" for v, who in seen.items())
            p.append(f"pdstack_servers: {label} differs between servers that exchange KV pages ({parts}); {fix}")

    differ("transfer.backend", "set the same transfer.backend on every prefill and decode server",
           lambda s: s["transfer"]["backend"])
    for dest, (flag, _) in kv.items():
        def value(s, dest=dest):
            for key, v in s["extra_args"].items():
                a = flags.action_for(parser, f"--{key}")
                if a is not None and a.dest == dest and v is not None and v is not False:
                    return " ".join(flags.render_value(v, a)) if v is not True else "on"
            return "default"
        differ(f"--{flag} (extra_args)", f"set extra_args.{flag} to the same value on every prefill and decode "
               "server (or on none)", value)
    owned = owned_env()  # refused per server already
    names = sorted({k for _h, _i, s in pd for k in s["env"] if str(k).startswith(KV_ENV_PREFIXES) and k not in owned
                    and not any(w in str(k) for w in KV_ENV_PER_HOST)})
    for k in names:
        differ(f"env.{k}", f"set env.{k} to the same value on every prefill and decode server (or on none)",
               lambda s, k=k: repr(s["env"].get(k, "unset")) if k in s["env"] else "unset")


def _router_problems(dep: Deployment, p: list[str]) -> None:
    r = dep.router
    parser = flags.router_parser()
    owned = {**_rendered_dests(parser, _planner_router_flags(dep)), **_dests(parser, OWNED_ROUTER_FLAGS)}
    refused = {d: f"--{flag} adds workers from outside the inventory or changes the router's mode (the workers are "
                  "exactly the pdstack_servers, in PD mode)" for d, (flag, _) in
               _dests(parser, WORKER_SET_ROUTER_FLAGS).items()}
    before = len(p)
    for key, value in r["extra_args"].items():
        p.extend(_extra_arg_problems(parser, "pdstack_router", key, value, owned, refused, "sglang-router 0.3.2"))
    if len(p) == before and r["extra_args"]:
        err = flags.check_router(["--pd-disaggregation", "--prefill", "http://x:1", "--decode", "http://y:1",
                                  *flags.render_extra(r["extra_args"], parser)])
        if err:
            p.append(f"pdstack_router.extra_args: sglang-router 0.3.2 rejects it: {err}; spell each flag as "
                     "`python -m sglang_router.launch_router --help` does and give it a value it takes")
    hc = r["health_check"]
    if not hc["endpoint"].startswith("/") or rules.unit_value_problem(hc["endpoint"]):
        p.append(f"pdstack_router.health_check.endpoint: {hc['endpoint']!r} must be a URL path on the workers "
                 "starting with '/', e.g. /health (no spaces or quotes)")
    if hc["timeout_secs"] > hc["interval_secs"]:
        dep.warnings.append(f"pdstack_router.health_check: timeout_secs {hc['timeout_secs']} is longer than "
                            f"interval_secs {hc['interval_secs']}; polls overlap")
    adm = r["admission"]
    if adm["max_concurrent_requests"] == 0 or adm["max_concurrent_requests"] < -1:
        p.append("pdstack_router.admission.max_concurrent_requests: must be -1 (off) or > 0, got "
                 f"{adm['max_concurrent_requests']}")
    if adm["queue_size"] < 0:
        p.append(f"pdstack_router.admission.queue_size: must be >= 0 (0: no queue, refuse at once), got "
                 f"{adm['queue_size']}")
    ret = r["retries"]
    for k in ("max_retries", "initial_backoff_ms", "max_backoff_ms"):
        if ret[k] < 0:
            p.append(f"pdstack_router.retries.{k}: must be >= 0, got {ret[k]}")
    if 0 <= ret["max_backoff_ms"] < ret["initial_backoff_ms"]:
        p.append(f"pdstack_router.retries.max_backoff_ms: {ret['max_backoff_ms']} is below initial_backoff_ms "
                 f"{ret['initial_backoff_ms']}; the cap must be >= the first backoff")


def _rollout_problems(dep: Deployment, p: list[str]) -> None:
    drain, limit = dep.rollout.get("drain_timeout_secs"), dep.router["request_timeout_secs"]
    if isinstance(drain, int) and not isinstance(drain, bool) and isinstance(limit, int) and drain > limit:
        p.append(f"pdstack_rollout.drain_timeout_secs: {drain} s is longer than pdstack_router.request_timeout_secs "
                 f"{limit} s; no request lives longer than that (the router cuts it), so the rest of the wait could "
                 f"only be spent on a wedged request: set drain_timeout_secs <= {limit}, or leave it unset (= {limit})")


# ------------------------------------------------------------------------------------------------ ports
# Every TCP port the deployment listens on, per host. One entry per listener: a new one (a front door, an
# exporter) is one more function here. Listeners of services pdstack installs come first, so a clash names the
# inventory variable that moved onto their port.


def _fixed(key: str, what: str, hosts):
    """A service pdstack installs, on the port the plan will use: the inventory's `key` for that host when it sets
    one (group_vars or host_vars), else its role's default (roles/<role>/defaults/main.yml, the one source)."""
    def claims(dep: Deployment) -> list[rules.Listener]:
        return [rules.Listener(h, *dep.service_port(h, key), what) for h in hosts(dep)]
    return claims


def _sshd(dep: Deployment) -> list[rules.Listener]:
    return [rules.Listener(h, 22, "sshd", "sshd (Ansible reaches the host there)", privileged_ok=True)
            for h in dep.hosts]


def _all_hosts(dep: Deployment) -> list[str]:
    return list(dep.hosts)


def _monitoring_hosts(dep: Deployment) -> list[str]:
    return list(dep.monitoring_hosts)


def _gpu_hosts(dep: Deployment) -> list[str]:
    return [h.name for h in dep.hosts.values() if h.servers and dep.image["engine"] == "sglang"]


def _server_listeners(dep: Deployment) -> list[rules.Listener]:
    out = []
    parser = flags.sglang_parser()
    for h in dep.hosts.values():
        for i, s in enumerate(h.servers):
            where = _where(h.name, i, s)
            out.append(rules.Listener(h.name, s["ports"]["http"], f"{where}.ports.http", f"{s['name']}'s HTTP API"))
            if s["role"] == "prefill":
                out.append(rules.Listener(h.name, s["ports"]["bootstrap"], f"{where}.ports.bootstrap",
                                          f"{s['name']}'s PD bootstrap server"))
            for port, key, dest in _listener_ports(parser, s["extra_args"]):
                out.append(rules.Listener(h.name, port, f"{where}.extra_args.{key}", f"{s['name']}'s {dest}"))
    return out


def _router_listeners(dep: Deployment) -> list[rules.Listener]:
    r, h = dep.router, dep.router_host
    return [rules.Listener(h, r["port"], "pdstack_router.port", "the front door (HAProxy, the public port)"),
            rules.Listener(h, r["internal_port"], "pdstack_router.internal_port",
                           "sglang-router's HTTP port (on 127.0.0.1, behind the front door)"),
            rules.Listener(h, r["prometheus_port"], "pdstack_router.prometheus_port", "sglang-router's metrics"),
            rules.Listener(h, r["frontdoor"]["metrics_port"], "pdstack_router.frontdoor.metrics_port",
                           "the front door's Prometheus exporter")]


LISTENERS = [
    _sshd,
    _fixed("node_exporter_port", "node_exporter", _all_hosts),
    _fixed("prometheus_listen", "Prometheus", _monitoring_hosts),
    _fixed("grafana_port", "Grafana", _monitoring_hosts),
    _fixed("dcgm_exporter_port", "dcgm-exporter", _gpu_hosts),
    _server_listeners,
    _router_listeners,
]


def listeners(dep: Deployment) -> list[rules.Listener]:
    return [claim for entry in LISTENERS for claim in entry(dep)]


def scraped_port(dep: Deployment, key: str) -> Any:
    """The one port Prometheus scrapes an exporter on (node_exporter_port on every host, dcgm_exporter_port on the
    GPU hosts): the inventory's value, else the role's default. Preflight refuses values that differ by host."""
    hosts = _gpu_hosts(dep) if key == "dcgm_exporter_port" else _all_hosts(dep)
    return dep.service_port(hosts[0], key)[0] if hosts else rules.role_port(inventory.ROLE_PORT_VARS[key], key)


def _scraped_port_problems(dep: Deployment, p: list[str]) -> None:
    for key, hosts in (("node_exporter_port", _all_hosts(dep)), ("dcgm_exporter_port", _gpu_hosts(dep))):
        ports = {h: dep.service_port(h, key)[0] for h in hosts}
        if len({repr(v) for v in ports.values()}) > 1:
            p.append(f"{key}: differs between hosts ({', '.join(f'{h} {v}' for h, v in ports.items())}), but "
                     "Prometheus scrapes one port on every host; set it once in group_vars/all")


def _port_problems(dep: Deployment, p: list[str]) -> None:
    _scraped_port_problems(dep, p)
    used: dict[tuple[str, int], rules.Listener] = {}
    for c in listeners(dep):
        if not isinstance(c.port, int) or isinstance(c.port, bool) or not 1 <= c.port <= 65535:
            p.append(f"{c.variable}: {c.port!r} is not a TCP port (1-65535)")
            continue
        if c.port < rules.PRIVILEGED_BELOW and not c.privileged_ok:
            p.append(f"{c.variable}: port {c.port} is privileged (< {rules.PRIVILEGED_BELOW}; system services live "
                     "there and binding it needs root); pick a port >= 1024")
            continue
        other = used.get((c.host, c.port))
        if other is not None:
            p.append(f"{c.variable}: port {c.port} on host {c.host} is already taken by {other.variable} "
                     f"({other.what}); pick another port")
        else:
            used[(c.host, c.port)] = c


def _address_problems(dep: Deployment, p: list[str], deploy: bool) -> None:
    multi = len(dep.hosts) > 1
    seen: dict[str, str] = {}
    for name, h in dep.hosts.items():
        var = f"host_vars/{name} pdstack_address" if h.address_source == "pdstack_address" else \
            f"ansible_host of host {name} (hosts.yml; or set pdstack_address)"
        a, err = rules.parse_address(h.address)
        if err:
            p.append(f"{var}: {err}")
            continue
        if a.ip is not None and a.ip.is_unspecified:
            p.append(f"{var}: {h.address} is the unspecified address (a listen address, not one to reach a host "
                     "at); give the host's real address")
        elif multi and rules.is_local(a):
            p.append(f"{var}: {h.address} is a loopback address, but the deployment spans {len(dep.hosts)} hosts "
                     "and the others reach this one at it (router -> servers, Prometheus -> exporters, prefill <-> "
                     "decode); give the address the other hosts reach it at")
        elif dep.environment == "production" and rules.is_local(a):
            p.append(f"{var}: {h.address} is a loopback address; in production the controller runs the smoke gate "
                     "against the router at it (and operators reach Grafana and the router there): give the "
                     "address the controller and the other hosts reach the host at")
        elif a.ip is not None and (a.ip.is_multicast or a.ip.is_reserved and a.ip.version == 4):
            p.append(f"{var}: {h.address} is a multicast or reserved address; give the host's real address")
        net = rules.doc_net(a)
        if net and dep.environment == "production":
            msg = (f"{var}: {h.address} is in the documentation range {net} (addresses for examples, like the "
                   "production example's placeholder, never a real host); put the host's real address there")
            if deploy:
                p.append(msg)
            else:
                dep.warnings.append(msg + " before deploying (preflight refuses it)")
        if h.ansible_host and h.ansible_host != h.address and dep.environment == "production":
            conn, _ = rules.parse_address(h.ansible_host)
            if conn is not None and (net := rules.doc_net(conn)):
                msg = (f"ansible_host of host {name} (hosts.yml): {h.ansible_host} is in the documentation range "
                       f"{net}, so Ansible cannot reach the host; put its real address there")
                (p.append if deploy else dep.warnings.append)(msg)
        key = h.address.lower().rstrip(".")
        if key in seen:
            p.append(f"{var}: {h.address} is also the address of host {seen[key]}; two inventory hosts cannot be "
                     "one machine (their ports and units would collide): list it once")
        seen.setdefault(key, name)


def _smoke_problems(dep: Deployment, p: list[str]) -> None:
    sm, ctx = dep.smoke, dep.model["context_length"]
    if not sm or not sm.get("enabled"):
        return
    lengths = sm["grid"]["lengths"]
    too_long = [n for n in lengths if n >= ctx]
    if too_long:
        p.append(f"pdstack_smoke.grid.lengths: {too_long} reach pdstack_model.context_length {ctx}; a recall prompt "
                 "must fit the context with its answer: drop them or raise context_length")
    if sm["min_horizon"] > max(lengths):
        p.append(f"pdstack_smoke.min_horizon: {sm['min_horizon']} is beyond the longest recall length "
                 f"{max(lengths)}, so the gate can never pass; lower it or add a longer length to grid.lengths")
    if not sm.get("tokenizer"):
        p.append("pdstack_smoke.tokenizer: unset, and the smoke gate builds its prompts with the model's tokenizer; "
                 "set it to the model's tokenizer directory on the controller (or pdstack_smoke.enabled: false)")


def gpu_numa_node(facts: dict, gpus: list[int]) -> set[int]:
    by_index = {g["index"]: g for g in facts.get("gpus", [])}
    return {by_index[g]["numa_node"] for g in gpus if g in by_index}


def topology_problems(dep: Deployment, facts: dict[str, dict]) -> list[str]:
    p: list[str] = []
    for h in dep.hosts.values():
        if not h.servers:
            continue
        f = facts.get(h.name)
        if f is None:
            p.append(f"host {h.name}: no facts; run the facts phase (ansible-playbook site.yml --tags facts) or pass "
                     "`pdstack plan --facts FILE|DIR` with a recorded topology")
            continue
        if isinstance(f, dict) and "error" in f:
            p.append(f"host {h.name}: the facts script failed on the host: {f['error']}")
            continue
        if msg := facts_problem(f):
            p.append(f"host {h.name}: malformed facts ({msg}); record them again with `pdstack facts` on the host "
                     "(or re-run the preflight phase)")
            continue
        gpu_count = len(f.get("gpus", []))
        nodes = {n["id"]: n for n in f.get("numa_nodes", [])}
        if f.get("gpu_source") == "simulated" and dep.image["engine"] != "sim":
            p.append(f"host {h.name}: its GPUs are simulated (/etc/pdstack/simulated-gpus.json, for the sim test "
                     "engine only); the sglang engine needs real GPUs: remove that file or set engine: sim")
        owner: dict[int, str] = {}
        for i, s in enumerate(h.servers):
            where = _where(h.name, i, s)
            beyond = [g for g in s["gpus"] if g >= gpu_count]
            if beyond:
                p.append(f"{where}.gpus: GPU(s) {beyond} do not exist; host {h.name} has {gpu_count} GPU(s) "
                         f"(indices 0-{gpu_count - 1})" if gpu_count else
                         f"{where}.gpus: host {h.name} has no GPU (nvidia-smi found none)")
            for g in s["gpus"]:
                if g in owner:
                    p.append(f"{where}.gpus: GPU {g} is also used by {owner[g]} on host {h.name}; "
                             "give each server its own GPUs")
                owner.setdefault(g, s["name"])
            gnodes = gpu_numa_node(f, s["gpus"])
            pinned = s["numa_node"]
            if pinned is not None and pinned not in nodes:
                p.append(f"{where}.numa_node: host {h.name} has no NUMA node {pinned} (it has "
                         f"{sorted(nodes)}); remove numa_node to take it from the GPUs")
            elif len(gnodes) > 1 and not (s["numa_override"] and pinned is not None):
                p.append(f"{where}.gpus: GPUs {s['gpus']} hang off NUMA nodes {sorted(gnodes)}; pick GPUs of one "
                         "node, or set numa_node with numa_override: true")
            elif pinned is not None and gnodes and pinned not in gnodes and not s["numa_override"]:
                p.append(f"{where}.numa_node: {pinned} is not the node its GPUs hang off ({sorted(gnodes)[0]}); "
                         "remove numa_node (the planner takes it from the facts) or set numa_override: true")
            if s["numa_override"] and pinned is not None and pinned in nodes and gnodes - {pinned}:
                by_index = {g["index"]: g for g in f.get("gpus", [])}
                remote = [g for g in s["gpus"] if g in by_index and by_index[g]["numa_node"] != pinned]
                dep.warnings.append(
                    f"{where}.numa_override: the server is pinned to NUMA node {pinned}, but GPU(s) {remote} hang off "
                    f"node(s) {sorted({by_index[g]['numa_node'] for g in remote})}: every host<->GPU copy for them "
                    "(weights loading, HiCache, KV transfer staging) crosses the inter-socket link")
            _ib_problems(h.name, where, s, f, p)
        _model_problems(dep, h, f, p)
        _gpu_arch_problems(dep, h, f, p)
        # HiCache budgets per NUMA node (membind caps each server's host memory to its node). A server whose GPUs
        # straddle nodes without an override has no node yet (refused above): it is left out, so the budget
        # message does not blame a node it was never going to use.
        per_node: dict[int, list[tuple[str, float]]] = defaultdict(list)
        for s in h.servers:
            if len(gpu_numa_node(f, s["gpus"])) > 1 and not (s["numa_override"] and s["numa_node"] is not None):
                continue
            node = resolve_node(s, f)
            if s["hicache"]["enabled"] and s["hicache"]["host_budget_gb"] and node in nodes:
                per_node[node].append((s["name"], float(s["hicache"]["host_budget_gb"])))
        for node, wants in per_node.items():
            avail = nodes[node]["mem_total_mb"] / 1024 - h.numa_reserve_gb
            total = sum(w for _, w in wants)
            if total > avail:
                names = ", ".join(f"{n} {w:g} GiB" for n, w in wants)
                p.append(f"host_vars/{h.name} hicache.host_budget_gb: {names} = {total:g} GiB on NUMA node {node}, "
                         f"which has {nodes[node]['mem_total_mb'] / 1024:.1f} GiB minus pdstack_numa_reserve_gb "
                         f"{h.numa_reserve_gb:g} = {avail:.1f} GiB; lower host_budget_gb")
    return p


def facts_problem(f: Any) -> str | None:
    """None when `f` has the shape the facts script writes (schema 1), else what is wrong with it."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)
    if not isinstance(f, dict):
        return f"expected a JSON object, got {type(f).__name__}"
    nodes, gpus = f.get("numa_nodes"), f.get("gpus", [])
    if not isinstance(nodes, list) or not nodes or not all(
            isinstance(n, dict) and is_int(n.get("id")) and isinstance(n.get("cpus"), str)
            and is_int(n.get("mem_total_mb")) for n in nodes):
        return "numa_nodes must be a non-empty list of {id, cpus, mem_total_mb}"
    if not isinstance(gpus, list) or not all(
            isinstance(g, dict) and is_int(g.get("index")) and is_int(g.get("numa_node")) for g in gpus):
        return "gpus must be a list of {index, numa_node, ...}"
    ib = f.get("infiniband", [])
    if not isinstance(ib, list) or not all(isinstance(n, str) for n in ib):
        return "infiniband must be a list of device names"
    if "model" in f and not isinstance(f["model"], dict):
        return "model must be an object"
    return None


def _ib_problems(host: str, where: str, s: dict, f: dict, p: list[str]) -> None:
    dev = s["transfer"]["ib_device"]
    have = f.get("infiniband")
    if dev is None or not isinstance(have, list):  # facts of an older script: nothing to compare with
        return
    missing = [n for n in dev.split(",") if n not in have]
    if missing:
        p.append(f"{where}.transfer.ib_device: {', '.join(missing)} not on host {host} (/sys/class/infiniband has "
                 f"{', '.join(have) if have else 'no devices'}); name one of those, or unset ib_device to let the "
                 "backend pick")


def _gpu_arch_problems(dep: Deployment, h, f: dict, p: list[str]) -> None:
    if dep.image["engine"] != "sglang" or f.get("gpu_source") != "nvidia-smi":
        return
    used = {g for s in h.servers for g in s["gpus"]}
    archs = {}
    for g in f.get("gpus", []):
        name = str(g.get("name", ""))
        arch = next((a for pattern, a in GPU_ARCHS if pattern in name), None)
        if g["index"] in used and arch is not None:
            archs.setdefault(arch, name)
    wrong = {a: n for a, n in archs.items() if a != dep.model["gpu_arch"]}
    if wrong:
        arch, name = next(iter(wrong.items()))
        p.append(f"pdstack_model.gpu_arch: {dep.model['gpu_arch']}, but host {h.name}'s GPUs are {name} ({arch}); "
                 f"set gpu_arch: {arch} (it picks the kernels and DeepSeek V4's indexer path)")


def _model_problems(dep: Deployment, h, f: dict, p: list[str]) -> None:
    """The model's own limits, from its config.json as the facts script read it on the host."""
    if dep.image["engine"] == "sim":
        return  # the sim test engine ships its own stand-in model
    m = dep.model
    facts_model = f.get("model")
    if not isinstance(facts_model, dict) or facts_model.get("path") != m["path"]:
        dep.warnings.append(f"host {h.name}: the facts do not describe {m['path']}/config.json, so "
                            "pdstack_model.context_length and tp_size were not checked against the model")
        return
    if facts_model.get("error"):
        dep.warnings.append(f"host {h.name}: could not read {m['path']}/config.json ({facts_model['error']}), so "
                            "pdstack_model.context_length and tp_size were not checked against the model (the serving "
                            "phase checks the model is there)")
        return
    limit = facts_model.get("context_length")
    if isinstance(limit, int) and m["context_length"] > limit:
        allowed = [s["name"] for s in h.servers
                   if str(s["env"].get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")) == "1"]
        if len(allowed) == len(h.servers):
            dep.warnings.append(f"pdstack_model.context_length: {m['context_length']} is beyond the model's "
                                f"{limit} (config.json); allowed by SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, but "
                                "outputs past it may be wrong")
        else:
            p.append(f"pdstack_model.context_length: {m['context_length']} is beyond the model's {limit} "
                     f"({facts_model.get('context_key', 'config.json')} in {m['path']}/config.json on {h.name}); "
                     f"SGLang refuses to start with it: set context_length <= {limit}")
    heads = facts_model.get("num_attention_heads")
    if isinstance(heads, int) and heads > 0:
        for i, s in enumerate(h.servers):
            if s["tp_size"] > 0 and heads % s["tp_size"]:
                p.append(f"{_where(h.name, i, s)}.tp_size: {s['tp_size']} does not divide the model's "
                         f"{heads} attention heads (config.json num_attention_heads); pick a tp_size that does, "
                         f"e.g. {max(d for d in (1, 2, 4, 8) if heads % d == 0)}")


def resolve_node(server: dict, facts: dict) -> int | None:
    """The server's NUMA node: the pinned one when overridden, else the node its GPUs hang off."""
    if server["numa_node"] is not None:
        return server["numa_node"]
    gnodes = gpu_numa_node(facts, server["gpus"])
    return min(gnodes) if gnodes else None


# ------------------------------------------------------------------------------------ `pdstack preflight`


def register(parser: argparse.ArgumentParser) -> None:
    inventory.add_inventory_args(parser)
    parser.add_argument("--facts", help="host facts (see `pdstack plan --help`); without them only static checks run")
    parser.add_argument("--static", action="store_true", help="only the static checks, even if facts exist")


def run(args: argparse.Namespace) -> int:
    from pdstack.controller import planner  # planner imports this module

    dep = inventory.load(args.inventory, resolved=args.vars)
    path = None if args.static else inventory.facts_path(args)
    if path is None:
        problems = static_problems(dep, deploy=True)
        if problems:
            raise InventoryError(problems)
        print(f"preflight: {args.inventory}: static checks passed (no host facts given: topology not checked)")
    else:
        planner.make_plan(dep, planner.load_facts(path, list(dep.hosts)), deploy=True)
        print(f"preflight: {args.inventory}: all checks passed against the facts in {path}")
    for w in dep.warnings:
        print(f"warning: {w}")
    return 0
