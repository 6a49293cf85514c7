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
from collections import defaultdict
from typing import Any

from pdstack.controller import flags, inventory
from pdstack.controller.inventory import Deployment
from pdstack.errors import InventoryError

# SGLang flags the planner renders itself; setting them in extra_args would fight the plan.
OWNED_FLAGS = {
    "model-path": "pdstack_model.path",
    "served-model-name": "pdstack_model.served_name",
    "context-length": "pdstack_model.context_length",
    "trust-remote-code": "pdstack_model.trust_remote_code",
    "tp-size": "the server's tp_size",
    "tensor-parallel-size": "the server's tp_size",
    "host": "nothing (servers listen on 0.0.0.0; the router reaches pdstack_address)",
    "port": "the server's ports.http",
    "disaggregation-mode": "the server's role",
    "disaggregation-bootstrap-port": "the server's ports.bootstrap",
    "disaggregation-transfer-backend": "the server's transfer.backend",
    "disaggregation-ib-device": "the server's transfer.ib_device",
    "enable-hierarchical-cache": "the server's hicache.enabled",
    "enable-hicache": "the server's hicache.enabled",
    "hicache-ratio": "the server's hicache.host_budget_gb and hicache.device_kv_pool_gb (the planner computes it)",
    "hicache-write-policy": "the server's hicache.write_policy",
    "hicache-io-backend": "the server's hicache.io_backend",
    "hicache-mem-layout": "the server's hicache.mem_layout",
    "enable-metrics": "nothing (always on: Prometheus scrapes every server)",
}
OWNED_ROUTER_FLAGS = {
    "pd-disaggregation": "nothing (always PD)", "prefill": "pdstack_servers", "decode": "pdstack_servers",
    "host": "nothing (127.0.0.1, behind the front door)", "port": "pdstack_router.internal_port",
    "prometheus-port": "pdstack_router.prometheus_port", "prometheus-host": "nothing",
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
    "request-timeout-secs": "pdstack_router.request_timeout_secs",
}


def _where(host: str, i: int, s: dict[str, Any]) -> str:
    return f"host_vars/{host} pdstack_servers[{i}] ({s.get('name')})"


def static_problems(dep: Deployment) -> list[str]:
    p: list[str] = []
    servers = [(h.name, i, s) for h in dep.hosts.values() for i, s in enumerate(h.servers)]
    family = dep.model["family"]

    if dep.environment == "production" and dep.image["engine"] == "sim":
        p.append("pdstack_image.engine: 'sim' is the TEST ENGINE and never runs in production; set engine: sglang")
    img = dep.image
    if (img["ref"] is None) == (img["manifest"] is None):
        p.append("pdstack_image: set exactly one of ref (an image reference) or manifest (build/manifest-<flavor>.json "
                 "from `invoke build`)")
    roles = {s["role"] for _, _, s in servers}
    for role in ("prefill", "decode"):
        if role not in roles:
            p.append(f"pdstack_servers: no {role} server in any host_vars; a PD deployment needs at least one "
                     f"(add a server with role: {role})")

    seen: dict[str, str] = {}
    for host, i, s in servers:
        where = _where(host, i, s)
        if s["name"] in seen:
            p.append(f"{where}.name: '{s['name']}' is also used on {seen[s['name']]}; server names must be unique")
        seen.setdefault(s["name"], host)
        if s["tp_size"] != len(s["gpus"]):
            p.append(f"{where}.tp_size: {s['tp_size']} does not match its {len(s['gpus'])} GPUs {s['gpus']}; "
                     f"set tp_size: {len(s['gpus'])} or change gpus")
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
        extra = s["extra_args"]
        for key in extra:
            if key == "hicache-size" and family == "deepseek_v4":
                p.append(f"{where}.extra_args.hicache-size: DeepSeek V4 rejects --hicache-size (ValueError when the "
                         "memory pool is built, minutes into startup); remove it and set hicache.host_budget_gb, "
                         "from which the planner derives --hicache-ratio")
            elif key in OWNED_FLAGS:
                p.append(f"{where}.extra_args.{key}: the planner renders --{key} itself; set {OWNED_FLAGS[key]} "
                         "instead")
        if "max-queued-requests" in extra and dep.router["admission"]["max_concurrent_requests"] < 0:
            p.append(f"{where}.extra_args.max-queued-requests: SGLang 0.5.23 ignores it on PD servers (enforced only "
                     "with --disaggregation-mode null), so this server has no admission control; set "
                     "pdstack_router.admission.max_concurrent_requests (and queue_size) and remove it here")
        elif "max-queued-requests" in extra:
            dep.warnings.append(f"{where}.extra_args.max-queued-requests does nothing on a PD server in SGLang "
                                "0.5.23; admission control is pdstack_router.admission")
        if not any(k in OWNED_FLAGS or k == "hicache-size" and family == "deepseek_v4" for k in extra):
            err = flags.check_sglang(["--model-path", "/x", *flags.render_extra(extra)])
            if err:
                p.append(f"{where}.extra_args: SGLang 0.5.23 rejects it: {err}; spell the flag exactly as "
                         "`python -m sglang.launch_server --help` does (no abbreviations)")

    # ports on one host: every server's http + bootstrap (prefill), the router's ports on the router host
    for h in dep.hosts.values():
        used: dict[int, str] = {}
        claims: list[tuple[int, str]] = []
        for i, s in enumerate(h.servers):
            where = _where(h.name, i, s)
            claims.append((s["ports"]["http"], f"{where}.ports.http"))
            if s["role"] == "prefill":
                claims.append((s["ports"]["bootstrap"], f"{where}.ports.bootstrap"))
        if h.name == dep.router_host:
            claims.append((dep.router["port"], "pdstack_router.port"))
            claims.append((dep.router["internal_port"], "pdstack_router.internal_port"))
            claims.append((dep.router["prometheus_port"], "pdstack_router.prometheus_port"))
            claims.append((dep.router["frontdoor"]["metrics_port"], "pdstack_router.frontdoor.metrics_port"))
        for port, who in claims:
            if port in used:
                p.append(f"{who}: port {port} on host {h.name} is already taken by {used[port]}; pick another port")
            else:
                used[port] = who

    for key in dep.router["extra_args"]:
        if key in OWNED_ROUTER_FLAGS:
            p.append(f"pdstack_router.extra_args.{key}: the planner renders --{key} itself; set "
                     f"{OWNED_ROUTER_FLAGS[key]} instead")
    adm = dep.router["admission"]
    if adm["max_concurrent_requests"] == 0 or adm["max_concurrent_requests"] < -1:
        p.append("pdstack_router.admission.max_concurrent_requests: must be -1 (off) or > 0, got "
                 f"{adm['max_concurrent_requests']}")
    if adm["max_concurrent_requests"] > 0 and adm["queue_size"] < 0:
        p.append(f"pdstack_router.admission.queue_size: must be >= 0, got {adm['queue_size']}")
    return p


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
        if "error" in f:
            p.append(f"host {h.name}: the facts script failed on the host: {f['error']}")
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
        # HiCache budgets per NUMA node (membind caps each server's host memory to its node)
        per_node: dict[int, list[tuple[str, float]]] = defaultdict(list)
        for s in h.servers:
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
        problems = static_problems(dep)
        if problems:
            raise InventoryError(problems)
        print(f"preflight: {args.inventory}: static checks passed (no host facts given: topology not checked)")
    else:
        planner.make_plan(dep, planner.load_facts(path, list(dep.hosts)))
        print(f"preflight: {args.inventory}: all checks passed against the facts in {path}")
    for w in dep.warnings:
        print(f"warning: {w}")
    return 0
