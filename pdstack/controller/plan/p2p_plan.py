"""The P2P gate's part of the plan (plan.p2p, per host): which GPU pairs the serving role measures before this host's
servers start, and the floor each must reach, from the recorded topology (the facts' NUMA node of each GPU).

- within each server's TP group: every pair of its GPUs (the all-reduce and the tensor-parallel traffic), and the
  group's NCCL all-reduce bus bandwidth;
- prefill to decode on the same host: prefill's GPU i to decode's GPU i (the KV transfer sends TP rank i's cache to
  the matching rank; with unequal TP sizes the shorter list bounds it). A decode on another host is reached over the
  network, not PCIe P2P: not measured here.

Floors: others measured about 54-56 GB/s copy bandwidth between GPUs of one NUMA node and 39-51 GB/s across nodes on
8x RTX PRO 6000 Blackwell PCIe hosts (local-inference-lab/rtx6kpro, hardware/pcie-bandwidth.md;
docs/facts.md#pcie-host-settings). A pair must reach MARGIN of the low end of its placement; a GPU whose NUMA node the
facts do not know gets the across-nodes floor (the lower: the gate should not fail on what it cannot tell). An
all-reduce group's floor is the lowest of its pairs' floors (NCCL's bus bandwidth is bounded by the slowest link).
pdstack/image/p2p.py (in the serving image) measures and compares; roles/serving/tasks/p2p.yml runs it.
"""

from __future__ import annotations

import itertools
from typing import Any

SAME_NODE_GBS, CROSS_NODE_GBS = 54.0, 39.0  # the low ends of the published ranges (see the docstring)
MARGIN = 0.8
SOURCE = ("0.8 x the low end of others' measurements on 8x RTX PRO 6000 Blackwell PCIe hosts: 54 GB/s within a "
          "NUMA node, 39 GB/s across (local-inference-lab/rtx6kpro hardware/pcie-bandwidth.md)")


def floor_gbs(node_a: int | None, node_b: int | None, margin: float = MARGIN) -> float:
    same = node_a is not None and node_a == node_b
    return round(margin * (SAME_NODE_GBS if same else CROSS_NODE_GBS), 2)


def placement(node_a: int | None, node_b: int | None) -> str:
    if node_a is None or node_b is None:
        return "NUMA node unknown"
    return "one NUMA node" if node_a == node_b else "across NUMA nodes"


def gpu_nodes(facts: dict) -> dict[int, int | None]:
    """Each GPU's NUMA node from the facts (None: not known; sysfs gives -1 on a machine without NUMA)."""
    out: dict[int, int | None] = {}
    for g in facts.get("gpus") or []:
        n = g.get("numa_node")
        out[int(g["index"])] = n if isinstance(n, int) and not isinstance(n, bool) and n >= 0 else None
    return out


def host_gate(servers: list[dict[str, Any]], facts: dict, engine: str) -> dict[str, Any]:
    """One host's gate: {run, reason, devices, pairs, groups, margin, source}. servers: this host's servers as the
    plan has them (name, role, gpus). A pair: {a, b, node_a, node_b, placement, floor_gbs, why}; a group: {server,
    gpus, floor_gbs}. run false (with the reason the serving role prints) where there is nothing to measure."""
    nodes = gpu_nodes(facts)
    pairs: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    groups: list[dict[str, Any]] = []

    def add(a: int, b: int, why: str) -> None:
        if a == b or (min(a, b), max(a, b)) in seen:
            return
        seen.add((min(a, b), max(a, b)))
        na, nb = nodes.get(a), nodes.get(b)
        pairs.append({"a": a, "b": b, "node_a": na, "node_b": nb, "placement": placement(na, nb),
                      "floor_gbs": floor_gbs(na, nb), "why": why})

    for s in servers:
        gpus = list(s["gpus"])
        for a, b in itertools.combinations(gpus, 2):
            add(a, b, f"TP group of {s['name']}")
        if len(gpus) > 1:
            groups.append({"server": s["name"], "gpus": gpus,
                           "floor_gbs": min(floor_gbs(nodes.get(a), nodes.get(b))
                                            for a, b in itertools.combinations(gpus, 2))})
    for p, d in itertools.product([s for s in servers if s["role"] == "prefill"],
                                  [s for s in servers if s["role"] == "decode"]):
        for a, b in zip(p["gpus"], d["gpus"], strict=False):
            add(a, b, f"KV transfer {p['name']} -> {d['name']}")
    devices = sorted({g for s in servers for g in s["gpus"]})
    if engine != "sglang":
        reason = f"the {engine} test engine uses no GPU, nothing to measure: the gate runs with the sglang engine"
    elif not servers:
        reason = "no server on this host"
    elif not pairs:
        reason = "no GPU pair in use on this host (one GPU per server and no prefill-decode pair here)"
    else:
        reason = ""
    return {"run": not reason, "reason": reason, "devices": devices, "pairs": pairs, "groups": groups,
            "margin": MARGIN, "source": SOURCE}


def gate_plan(hosts: list[str], servers: list[dict[str, Any]], facts: dict[str, dict], engine: str,
              ) -> dict[str, dict[str, Any]]:
    """plan.p2p: every host's gate (servers: the plan's, each with its host)."""
    return {h: host_gate([s for s in servers if s["host"] == h], facts.get(h) or {}, engine) for h in sorted(hosts)}
