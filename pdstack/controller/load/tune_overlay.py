"""pdstack_tune: a tuning candidate's overlay of server settings, merged into the servers before any check runs.

`invoke tune` (pdstack/controller/tune) passes one candidate of tune.yml as the extra var `pdstack_tune`:

    pdstack_tune:
      name: upstream-recipe
      servers:
        decode: {extra_args: {moe-runner-backend: marlin}, env: {SGLANG_X: "1"}}   # prefill | decode | all | a name

      topology:                       # optional: a host's whole server list replaced (a topology candidate)
        gpu01: [{name: prefill-0, role: prefill, gpus: [0, 1, 2, 3], tp_size: 4, ...}, ...]

A topology first replaces the named hosts' pdstack_servers (how many prefill and decode servers, their GPUs, TP
sizes and ports); then each selected server gets the overlay's extra_args and env on top of its own (the overlay's
value of a flag replaces the server's). The candidate goes through the very checks, planner, encoders and
read-back an inventory does (GPUs, NUMA binding, ports, budgets, the router's worker list, the front door's
admission): a candidate is an inventory. The merged keys are recorded as locations, so a problem with one of them
names the overlay key it came from.
"""

from __future__ import annotations

import copy
from typing import Any

from pdstack.controller.load import rules
from pdstack.controller.load.field_checks import extra_args
from pdstack.controller.load.schema import Field, Schema

SELECTORS = ("prefill", "decode", "all")


TUNE_SERVERS = Schema("pdstack_tune.servers.<which>", {
    "extra_args": Field((dict,), "SGLang flags to set on these servers (as a server's extra_args; they replace the "
                        "server's own value of the same flag)", default=dict, check=extra_args("sglang")),
    "env": Field((dict,), "environment variables to set on these servers (as a server's env)", default=dict),
})

TUNE = Schema("pdstack_tune", {
    "name": Field((str,), "the candidate's name (tune.yml), reported in the plan's warnings", default=None,
                  check=rules.name_problem),
    "servers": Field((dict,), "which servers change: prefill, decode, all, or a server's name -> {extra_args, env}",
                     default=dict),
    "index_k_dtype": Field((str,), "the candidate's pdstack_model.index_k_dtype (the index-key layout and reader, "
                           "with every switch that decides it: pdstack/switches.py); unset: the inventory's",
                           default=None, choices=("bf16", "fp8-torch", "fp8-tilelang")),
    "topology": Field((dict,), "host -> the server list that replaces its pdstack_servers (same schema); unset: "
                      "the inventory's servers", default=None),
})


def _selects(selector: str, server: dict[str, Any]) -> bool:
    return selector == "all" or selector == server.get("role") or selector == server.get("name")


def apply(tune: dict[str, Any] | None, hostvars: dict[str, dict[str, Any]],
          problems: list[str]) -> tuple[dict[str, dict[str, Any]], dict[str, str]]:
    """(hostvars with the overlay merged into every selected server, {server variable path: overlay path}).
    `tune` is the validated pdstack_tune (None: no overlay). A selector that names no server is a problem."""
    if not tune or not (tune.get("servers") or tune.get("topology")):
        return hostvars, {}  # (index_k_dtype, a model setting, is merged by inventory.load into pdstack_model)
    out = copy.deepcopy(hostvars)
    where: dict[str, str] = {}
    for host, servers in (tune.get("topology") or {}).items():
        path = f"pdstack_tune.topology.{host}"
        if host not in out:
            problems.append(f"{path}: no such host in the inventory; use one of {', '.join(sorted(out))}")
        elif not isinstance(servers, list) or not servers:
            problems.append(f"{path}: expected a non-empty list of servers (as host_vars pdstack_servers), got "
                            f"{type(servers).__name__}")
        else:
            out[host]["pdstack_servers"] = copy.deepcopy(servers)
            where[f"host_vars/{host}.pdstack_servers"] = path
            for i in range(len(servers)):
                where[f"host_vars/{host}.pdstack_servers[{i}]"] = f"{path}[{i}]"
    names = sorted({str(s.get("name")) for hv in out.values() for s in hv.get("pdstack_servers") or []
                    if isinstance(s, dict)})
    for selector, change in (tune.get("servers") or {}).items():
        path = f"pdstack_tune.servers.{selector}"
        if not isinstance(change, dict):
            problems.append(f"{path}: expected a mapping {{extra_args: ..., env: ...}}, got {type(change).__name__}")
            continue
        hit = False
        for host, hv in out.items():
            for i, s in enumerate(hv.get("pdstack_servers") or []):
                if not isinstance(s, dict) or not _selects(selector, s):
                    continue
                hit = True
                for key in ("extra_args", "env"):
                    add = change.get(key) or {}
                    if not add:
                        continue
                    own = s.get(key) if isinstance(s.get(key), dict) else {}
                    s[key] = {**own, **add}
                    for k in add:
                        where[f"host_vars/{host}.pdstack_servers[{i}].{key}.{k}"] = f"{path}.{key}.{k}"
        if not hit:
            problems.append(f"{path}: selects no server; use one of {', '.join(SELECTORS)} or a server's name "
                            f"({', '.join(names) or 'the inventory has none'})")
    return out, where
