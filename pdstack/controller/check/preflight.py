"""Preflight: every check that can reject an inventory before any host is touched.

Two stages, both pure functions over the typed Deployment:
  static_problems(dep)            needs nothing but the inventory (typos, TP vs GPUs, ports, flags, admission,
                                  the production profile)
  topology_problems(dep, facts)   needs each host's facts (GPU count, NUMA nodes, memory budgets, RDMA devices)
Each problem names the variable and says how to fix it. The preflight role and `pdstack plan` call both.

The `pdstack preflight` subcommand (pdstack.controller.pipeline):
`pdstack preflight -i INVENTORY [--facts FILE|DIR]`: validate without printing the plan.

Without facts only the static checks run (typos, TP vs GPUs, ports, flags, admission); with facts the topology
checks run too (GPU count, NUMA nodes, HiCache budget per node). Exit 0 when clean, 2 with every problem listed.
"""

from __future__ import annotations

from pdstack.controller.check import model as model_check
from pdstack.controller.check.network import address_problems, port_problems
from pdstack.controller.check.production import production_facts_problems, production_problems
from pdstack.controller.check.router import rollout_problems, router_problems, smoke_problems
from pdstack.controller.check.servers import deployment_problems, pd_agreement_problems, server_problems
from pdstack.controller.check.topology import topology_problems as host_topology_problems
from pdstack.controller.load.inventory import Deployment


def static_problems(dep: Deployment, deploy: bool = True) -> list[str]:
    """Every check that needs only the inventory. `deploy`: the inventory is about to be deployed (preflight,
    `pdstack plan --require-image`): placeholder addresses are errors; a dry plan only warns about them."""
    p: list[str] = []
    servers = [(h.name, i, s) for h in dep.hosts.values() for i, s in enumerate(h.servers)]
    deployment_problems(dep, servers, p)
    for host, i, s in servers:
        server_problems(dep, host, i, s, p)
    pd_agreement_problems(dep, servers, p)
    router_problems(dep, p)
    rollout_problems(dep, p)
    port_problems(dep, p)
    address_problems(dep, p, deploy)
    smoke_problems(dep, p)
    model_check.static_problems(dep, p)
    p.extend(production_problems(dep, deploy))
    return p


def topology_problems(dep: Deployment, facts: dict[str, dict]) -> list[str]:
    """Every check against the hosts' facts: each host's own (topology.py, budgets.py), then production's
    cross-host rules (production.py)."""
    p = host_topology_problems(dep, facts) + production_facts_problems(dep, facts)
    model_check.facts_problems(dep, facts, p)
    return p
