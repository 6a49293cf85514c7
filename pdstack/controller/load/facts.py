"""Host facts as recorded: a JSON file (one host's facts, or {host: facts}) or a directory of <host>.json files;
and what the checks and the planner both read from them (a server's NUMA node, the model directory's report)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from pdstack.controller.load.inventory import Deployment
from pdstack.errors import FactsError


def load_facts(path: str | Path | None, hosts: list[str]) -> dict[str, dict]:
    """Facts per host from a recorded JSON file (one host's facts, or {"host": facts}) or a directory of
    <host>.json files. None -> no facts."""
    if path is None:
        return {}
    p = Path(path)
    if p.is_dir():
        return {f.stem: _read_facts(f) for f in sorted(p.glob("*.json")) if f.stem in hosts}
    if not p.exists():
        raise FactsError(f"facts file {p} does not exist; record one with `pdstack facts > FILE` on the host")
    data = _read_facts(p)
    if "numa_nodes" in data:  # one host's facts: apply to every host (a recorded single-host topology)
        return dict.fromkeys(hosts, data)
    return {h: data[h] for h in hosts if h in data}


def _read_facts(p: Path) -> dict:
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FactsError(f"facts file {p}: {e}") from e
    if not isinstance(data, dict):
        raise FactsError(f"facts file {p}: expected a JSON object")
    return data


# what the kernel reports for a device without NUMA affinity (/sys/bus/pci/devices/*/numa_node; VMs, some firmware)
NO_NUMA_NODE = -1


def gpu_numa_node(facts: dict, gpus: list[int]) -> set[int]:
    """The NUMA nodes `gpus` hang off. A GPU without affinity (-1) hangs off the host's only node when it has one;
    on a host of several nodes it stays -1, which the checks refuse (the server must then pin its node)."""
    by_index = {g["index"]: g for g in facts.get("gpus", [])}
    ids = [n["id"] for n in facts.get("numa_nodes", [])]
    only = ids[0] if len(ids) == 1 else NO_NUMA_NODE
    return {only if by_index[g]["numa_node"] == NO_NUMA_NODE else by_index[g]["numa_node"]
            for g in gpus if g in by_index}


def resolve_node(server: dict, facts: dict) -> int | None:
    """The server's NUMA node: the pinned one when overridden, else the node its GPUs hang off."""
    if server["numa_node"] is not None:
        return server["numa_node"]
    gnodes = gpu_numa_node(facts, server["gpus"])
    return min(gnodes) if gnodes else None


def host_model_facts(dep: Deployment, facts: dict[str, dict], host: str) -> dict[str, Any] | None:
    """The facts script's report on pdstack_model.path for `host`, when it has one with the free space."""
    m = facts.get(host, {}).get("model")
    ok = isinstance(m, dict) and m.get("path") == dep.model["path"] and isinstance(m.get("disk"), dict)
    return m if ok and isinstance(m["disk"].get("free_bytes"), int) else None
