"""Where the exporters run and the one port Prometheus scrapes each on: node_exporter on every host, dcgm-exporter
on the GPU hosts. The checks (check/network.py: every listener, one scraped port on every host) and the planner
(the plan's scrape targets) both read them from here."""

from __future__ import annotations

from typing import Any

from pdstack.controller.load import rules
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.load.variables import ROLE_PORT_VARS


def all_hosts(dep: Deployment) -> list[str]:
    return list(dep.hosts)


def gpu_hosts(dep: Deployment) -> list[str]:
    return [h.name for h in dep.hosts.values() if h.servers and dep.image["engine"] == "sglang"]


def exporter_hosts(dep: Deployment, key: str) -> list[str]:
    """The hosts whose exporter listens on role variable `key` (node_exporter_port, dcgm_exporter_port)."""
    return gpu_hosts(dep) if key == "dcgm_exporter_port" else all_hosts(dep)


def scraped_port(dep: Deployment, key: str) -> Any:
    """The one port Prometheus scrapes an exporter on (node_exporter_port on every host, dcgm_exporter_port on the
    GPU hosts): the inventory's value, else the role's default. Preflight refuses values that differ by host."""
    hosts = exporter_hosts(dep, key)
    return dep.service_port(hosts[0], key)[0] if hosts else rules.role_port(ROLE_PORT_VARS[key], key)
