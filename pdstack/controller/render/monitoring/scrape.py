"""Prometheus configuration and node_exporter textfile metrics, generated from the plan (plan.json as a dict)."""

from __future__ import annotations

from typing import Any

from pdstack.controller.load import rules
from pdstack.controller.render.encoders import prom_labels
from pdstack.hostside.facts import parse_cpulist

# Ports of the exporters on every host: their roles' defaults (the one source; the plan carries the ones a
# deployment uses, monitoring.node_exporter_port / dcgm_exporter_port, which the prometheus role passes).
NODE_EXPORTER_PORT = rules.role_port("node_exporter", "node_exporter_port")
DCGM_EXPORTER_PORT = rules.role_port("dcgm_exporter", "dcgm_exporter_port")
RULES_GLOB = "/etc/prometheus/rules/*.yml"


def plan_hosts(plan: dict[str, Any], extra: dict[str, str] | None = None) -> dict[str, str]:
    """{inventory host: address} of every host the plan touches (servers, router, monitoring), plus `extra`
    (the role passes every inventory host with its pdstack_address)."""
    hosts: dict[str, str] = {}
    for s in plan["servers"]:
        hosts.setdefault(str(s["host"]), str(s["address"]))
    hosts.setdefault(str(plan["router"]["host"]), str(plan["router"]["address"]))
    for h in plan.get("monitoring_hosts", []):
        hosts.setdefault(str(h), str(h))
    hosts.update({str(k): str(v) for k, v in (extra or {}).items()})
    return dict(sorted(hosts.items()))


def gpu_hosts(plan: dict[str, Any]) -> list[str]:
    """Hosts with GPU servers. None with the sim test engine (CPU test hosts have no GPU, so no dcgm-exporter)."""
    if plan["engine"] != "sglang":
        return []
    return sorted({str(s["host"]) for s in plan["servers"]})


def prometheus_config(plan: dict[str, Any], *, hosts: dict[str, str] | None = None, scrape_interval: str = "15s",
                      evaluation_interval: str = "15s", node_exporter_port: int = NODE_EXPORTER_PORT,
                      dcgm_port: int = DCGM_EXPORTER_PORT, gpu: bool | None = None, rule_files: list[str] | None = None,
                      prometheus_target: str = "127.0.0.1:9090", extra_jobs: list[dict] | None = None) -> dict:
    """prometheus.yml as a dict. Every target carries `host` (inventory name); SGLang servers also `server`,
    `role` (prefill/decode) and `numa_node`. gpu=None: dcgm job only for the sglang engine."""
    addrs = plan_hosts(plan, hosts)
    servers = [{"targets": [f"{s['address']}:{s['ports']['metrics']}"],
                "labels": {"host": str(s["host"]), "server": str(s["name"]), "role": str(s["role"]),
                           "numa_node": str(s["numa_node"])}} for s in plan["servers"]]
    r = plan["router"]
    jobs: list[dict] = [
        {"job_name": "prometheus", "static_configs": [{"targets": [prometheus_target]}]},
        {"job_name": "sglang", "metrics_path": "/metrics", "static_configs": servers},
        {"job_name": "sglang-router", "metrics_path": "/metrics",
         "static_configs": [{"targets": [f"{r['address']}:{r['prometheus_port']}"],
                             "labels": {"host": str(r["host"])}}]},
        # the front door: HAProxy's built-in Prometheus exporter (admission gauges and refusal counters)
        {"job_name": "haproxy", "metrics_path": "/metrics",
         "static_configs": [{"targets": [f"{r['address']}:{r['frontdoor']['metrics_port']}"],
                             "labels": {"host": str(r["host"])}}]},
        {"job_name": "node", "static_configs": [{"targets": [f"{a}:{node_exporter_port}"], "labels": {"host": h}}
                                                for h, a in addrs.items()]},
    ]
    gh = gpu_hosts(plan) if gpu is None else (sorted({str(s["host"]) for s in plan["servers"]}) if gpu else [])
    if gh:
        jobs.append({"job_name": "dcgm", "static_configs": [{"targets": [f"{addrs[h]}:{dcgm_port}"],
                                                             "labels": {"host": h}} for h in gh]})
    jobs += extra_jobs or []
    return {
        "global": {"scrape_interval": scrape_interval, "evaluation_interval": evaluation_interval,
                   "external_labels": {"pdstack_inventory": str(plan["inventory"])}},
        "rule_files": list(rule_files if rule_files is not None else [RULES_GLOB]),
        "scrape_configs": jobs,
    }


def textfile_metrics(plan: dict[str, Any], host: str, facts: dict[str, Any] | None) -> str:
    """pdstack's own metrics for node_exporter's textfile collector on `host` (pdstack.prom): which CPU belongs to
    which NUMA node (to aggregate node_cpu_seconds_total per NUMA node), each server's NUMA node and HiCache host
    budget. (Admission limits come from HAProxy's own exporter: haproxy_server_limit_sessions/queue_limit.)"""
    lines = []
    if facts:
        lines += ["# HELP pdstack_numa_node_cpu 1 for each CPU of each NUMA node (from the host's facts).",
                  "# TYPE pdstack_numa_node_cpu gauge"]
        for n in facts["numa_nodes"]:
            lines += [f'pdstack_numa_node_cpu{{numa_node="{n["id"]}",cpu="{c}"}} 1' for c in parse_cpulist(n["cpus"])]
    servers = [s for s in plan["servers"] if s["host"] == host]
    if servers:
        lines += ["# HELP pdstack_server_info A pdstack server on this host, its role and NUMA node.",
                  "# TYPE pdstack_server_info gauge"]
        lines += ["pdstack_server_info" + prom_labels({"server": s["name"], "role": s["role"],
                                                      "numa_node": s["numa_node"],
                                                      "gpus": ",".join(map(str, s["gpus"]))}) + " 1" for s in servers]
        lines += ["# HELP pdstack_hicache_host_budget_bytes HiCache host memory budget of a server (0: HiCache off).",
                  "# TYPE pdstack_hicache_host_budget_bytes gauge"]
        for s in servers:
            gb = s["hicache"]["host_budget_gb"] if s["hicache"]["enabled"] else 0
            lines.append("pdstack_hicache_host_budget_bytes" + prom_labels({"server": s["name"],
                                                                            "numa_node": s["numa_node"]})
                         + f" {int(gb * 2**30)}")
    return "\n".join(lines) + "\n"
