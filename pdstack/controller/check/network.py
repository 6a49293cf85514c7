"""Ports and addresses: every listener of the deployment, per host, and the address each host is reached at."""

from __future__ import annotations

import ipaddress

from pdstack.controller.check.extra_args import listener_ports
from pdstack.controller.load import exporters, flags, rules
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.load.tables import server_where

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


def _monitoring_hosts(dep: Deployment) -> list[str]:
    return list(dep.monitoring_hosts)


def _server_listeners(dep: Deployment) -> list[rules.Listener]:
    out = []
    parser = flags.sglang_parser()
    for h in dep.hosts.values():
        for i, s in enumerate(h.servers):
            where = server_where(h.name, i, s)
            out.append(rules.Listener(h.name, s["ports"]["http"], f"{where}.ports.http", f"{s['name']}'s HTTP API"))
            if s["role"] == "prefill":
                out.append(rules.Listener(h.name, s["ports"]["bootstrap"], f"{where}.ports.bootstrap",
                                          f"{s['name']}'s PD bootstrap server"))
            for port, key, dest in listener_ports(parser, s["extra_args"]):
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
    _fixed("node_exporter_port", "node_exporter", exporters.all_hosts),
    _fixed("prometheus_listen", "Prometheus", _monitoring_hosts),
    _fixed("grafana_port", "Grafana", _monitoring_hosts),
    _fixed("dcgm_exporter_port", "dcgm-exporter", exporters.gpu_hosts),
    _server_listeners,
    _router_listeners,
]


def listeners(dep: Deployment) -> list[rules.Listener]:
    return [claim for entry in LISTENERS for claim in entry(dep)]


def _scraped_port_problems(dep: Deployment, p: list[str]) -> None:
    for key in ("node_exporter_port", "dcgm_exporter_port"):
        ports = {h: dep.service_port(h, key)[0] for h in exporters.exporter_hosts(dep, key)}
        if len({repr(v) for v in ports.values()}) > 1:
            p.append(f"{key}: differs between hosts ({', '.join(f'{h} {v}' for h, v in ports.items())}), but "
                     "Prometheus scrapes one port on every host; set it once in group_vars/all")


def port_problems(dep: Deployment, p: list[str]) -> None:
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


def address_problems(dep: Deployment, p: list[str], deploy: bool) -> None:
    """Each host's address is one the other hosts reach it at (production's stricter rules: check/production.py)."""
    multi = len(dep.hosts) > 1
    seen: dict[str, str] = {}
    for name, h in dep.hosts.items():
        var = f"host_vars/{name} pdstack_address" if h.address_source == "pdstack_address" else \
            f"ansible_host of host {name} (hosts.yml; or set pdstack_address)"
        a, err = rules.parse_address(h.address)
        if err:
            p.append(f"{var}: {err}")
            continue
        if rules.is_unspecified(a):
            p.append(f"{var}: {h.address} is the unspecified address (a listen address, not one to reach a host "
                     "at); give the host's real address")
        elif multi and rules.is_loopback(a):
            p.append(f"{var}: {h.address} is a loopback address, but the deployment spans {len(dep.hosts)} hosts "
                     "and the others reach this one at it (router -> servers, Prometheus -> exporters, prefill <-> "
                     "decode); give the address the other hosts reach it at")
        elif a.ip is not None and (a.ip.is_multicast or a.ip.is_reserved and a.ip.version == 4):
            p.append(f"{var}: {h.address} is a multicast or reserved address; give the host's real address")
        key = str(a.ip.ipv4_mapped or a.ip) if isinstance(a.ip, ipaddress.IPv6Address) else \
            str(a.ip) if a.ip is not None else h.address.lower().rstrip(".")
        if key in seen:
            p.append(f"{var}: {h.address} is also the address of host {seen[key]}; two inventory hosts cannot be "
                     "one machine (their ports and units would collide): list it once")
        seen.setdefault(key, name)
