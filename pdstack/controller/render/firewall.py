"""The host firewall: an nftables table rendered from the plan, so only the front door faces clients.

Every pdstack listener except the front door admits only its peers: a server's HTTP port (the router's requests,
Prometheus' scrapes) and a prefill's bootstrap port (decode's handshake), and on the router host the router's
metrics port and HAProxy's metrics port. Peers are the deployment's own hosts (servers, router, monitoring) and
`pdstack_firewall.admin_peers`; loopback always. Anything else gets a TCP reset on those ports (refused at once, not
a hang). The table is pdstack's own (`table inet pdstack`), loaded on its own (never `flush ruleset`: Docker's
tables stay), with policy accept: ports it does not name, ssh among them, are never touched, so it cannot lock
anyone out. The role checks it with `nft -c -f` before loading it.
"""

from __future__ import annotations

import argparse
import ipaddress
import json
import sys
from typing import Any

from pdstack.controller.render.encoders import (
    nft_address,
    nft_comment,
    nft_ident,
    nft_port,
    read_plan,
    write_or_refuse,
)

TABLE = "pdstack"


def protected_ports(plan: dict[str, Any], host: str) -> dict[int, str]:
    """{port: what listens there} of the pdstack listeners on `host` that only peers may reach."""
    ports: dict[int, str] = {}
    for s in plan["servers"]:
        if s["host"] != host:
            continue
        ports[int(s["ports"]["http"])] = f"{s['name']} http"
        if s["role"] == "prefill" and s["ports"].get("bootstrap"):
            ports[int(s["ports"]["bootstrap"])] = f"{s['name']} bootstrap"
    r = plan["router"]
    if r and r["host"] == host:
        ports[int(r["prometheus_port"])] = "router metrics"
        ports[int(r["internal_port"])] = "router (127.0.0.1 only)"
        ports[int(r["frontdoor"]["metrics_port"])] = "front door metrics"
    return dict(sorted(ports.items()))


def peer_hosts(plan: dict[str, Any]) -> list[str]:
    """The deployment's own hosts (inventory names)."""
    hosts = {str(s["host"]) for s in plan["servers"]} | set(map(str, plan.get("monitoring_hosts") or []))
    if plan["router"]:
        hosts.add(str(plan["router"]["host"]))
    return sorted(hosts)


def peer_names(plan: dict[str, Any], addresses: dict[str, str] | None = None) -> list[str]:
    """The addresses (names or IPs, to resolve on the host) of the deployment's hosts: the plan's server and router
    addresses, and for the other hosts (monitoring) `addresses[host]` (their pdstack_address), else the name."""
    from pdstack.controller.render.monitoring.scrape import plan_hosts

    known = plan_hosts(plan, {h: a for h, a in (addresses or {}).items() if h in peer_hosts(plan)})
    return sorted(set(known.values()))


def nft_ruleset(plan: dict[str, Any], host: str, peer_addresses: list[str], admin_peers: list[str]) -> str:
    """The nft script for `host`: `peer_addresses` are the peers' resolved IPs, `admin_peers` extra addresses or
    CIDRs (e.g. an operator's network). Re-loading it replaces the table in one transaction."""
    v4, v6 = [], []
    for a in [*peer_addresses, *admin_peers]:
        net = nft_address(a)  # every value through the nft encoder (render/encoders.py)
        (v4 if ipaddress.ip_network(net).version == 4 else v6).append(net)
    ports = {nft_port(p): nft_comment(what) for p, what in protected_ports(plan, host).items()}
    table = nft_ident(TABLE)
    out = [f"# pdstack host firewall for {nft_comment(host)} (pdstack/controller/render/firewall.py): only peers "
           "reach these ports:",
           *[f"#   {p}  {what}" for p, what in ports.items()],
           "# Everything else (the front door, ssh, ...) is left alone: policy accept.",
           f"table inet {table}",
           f"delete table inet {table}",
           f"table inet {table} {{",
           "    set peers4 {", "        type ipv4_addr", "        flags interval"]
    if v4:
        out.append(f"        elements = {{ {', '.join(sorted(set(v4)))} }}")
    out += ["    }", "    set peers6 {", "        type ipv6_addr", "        flags interval"]
    if v6:
        out.append(f"        elements = {{ {', '.join(sorted(set(v6)))} }}")
    out += ["    }",
            "    chain input {",
            "        type filter hook input priority filter; policy accept;",
            '        iif "lo" accept']
    if ports:
        plist = ", ".join(map(str, ports))
        out += [f"        tcp dport {{ {plist} }} ip saddr @peers4 accept",
                f"        tcp dport {{ {plist} }} ip6 saddr @peers6 accept",
                f"        tcp dport {{ {plist} }} counter reject with tcp reset"]
    out += ["    }", "}", ""]
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdstack.controller.render.firewall", allow_abbrev=False,
                                 description="print the nftables script of one host")
    ap.add_argument("--plan", required=True, help="plan.json, or - for stdin")
    ap.add_argument("--host", required=True, help="inventory host")
    ap.add_argument("--peer", action="append", default=[], help="a peer's IP address (repeat)")
    ap.add_argument("--admin-peer", action="append", default=[], help="an extra address or CIDR (repeat)")
    ap.add_argument("--peer-names", action="store_true",
                    help="print the peers' addresses to resolve on the host (JSON) and exit")
    ap.add_argument("--address", action="append", default=[], metavar="HOST=ADDRESS",
                    help="an inventory host's pdstack_address (repeat)")
    a = ap.parse_args(argv)
    plan = read_plan(a.plan)
    if a.peer_names:
        print(json.dumps(peer_names(plan, dict(x.split("=", 1) for x in a.address))))
        return 0
    return write_or_refuse(lambda: nft_ruleset(plan, a.host, a.peer, a.admin_peer),
                           "firewall: the nft script cannot carry a value")


if __name__ == "__main__":
    sys.exit(main())
