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

from pdstack.controller.check import model as _model
from pdstack.controller.check.extra_args import _dests, owned_env  # noqa: F401 (re-exported)
from pdstack.controller.check.network import _address_problems, _port_problems, listeners, scraped_port  # noqa: F401
from pdstack.controller.check.production import production_facts_problems, production_problems
from pdstack.controller.check.router import _rollout_problems, _router_problems, _smoke_problems
from pdstack.controller.check.servers import _deployment_problems, _pd_agreement_problems, _server_problems
from pdstack.controller.check.tables import *  # noqa: F401,F403 (the tables, re-exported for callers and tests)
from pdstack.controller.check.tables import OWNED_FLAGS, OWNED_ROUTER_FLAGS  # noqa: F401
from pdstack.controller.check.topology import (  # noqa: F401
    facts_problem,
    gpu_numa_node,
    resolve_node,
)
from pdstack.controller.check.topology import topology_problems as _host_topology_problems
from pdstack.controller.load.inventory import Deployment


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
    _model.static_problems(dep, p)
    p.extend(production_problems(dep, deploy))
    return p


def topology_problems(dep: Deployment, facts: dict[str, dict]) -> list[str]:
    """Every check against the hosts' facts: each host's own (topology.py, budgets.py), then production's
    cross-host rules (production.py)."""
    p = _host_topology_problems(dep, facts) + production_facts_problems(dep, facts)
    _model.facts_problems(dep, facts, p)
    return p
