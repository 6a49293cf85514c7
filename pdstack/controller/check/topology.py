"""Checks against each host's facts: GPU count, NUMA nodes, InfiniBand devices, the model's config, host memory
budgets (budgets.py)."""

from __future__ import annotations

from typing import Any

from pdstack.controller.check import budgets
from pdstack.controller.check.host_pcie import pcie_problems
from pdstack.controller.load.facts import gpu_numa_node, resolve_node
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.load.tables import GPU_ARCHS, server_where


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
        if isinstance(f, dict) and "error" in f:
            p.append(f"host {h.name}: the facts script failed on the host: {f['error']}")
            continue
        if msg := facts_problem(f):
            p.append(f"host {h.name}: malformed facts ({msg}); record them again with `pdstack facts` on the host "
                     "(or re-run the preflight phase)")
            continue
        gpu_count = len(f.get("gpus", []))
        nodes = {n["id"]: n for n in f.get("numa_nodes", [])}
        if f.get("gpu_source") == "simulated" and dep.image["engine"] != "sim":
            p.append(f"host {h.name}: its GPUs are simulated (/etc/pdstack/simulated-gpus.json, for the sim test "
                     "engine only); the sglang engine needs real GPUs: remove that file or set engine: sim")
        owner: dict[int, str] = {}
        for i, s in enumerate(h.servers):
            where = server_where(h.name, i, s)
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
            unknown = sorted(gnodes - set(nodes))
            if unknown and pinned is None:
                p.append(f"{where}.gpus: GPUs {s['gpus']} report NUMA node(s) {unknown}, which host {h.name} does not "
                         f"have (its nodes: {sorted(nodes)}; -1 is the kernel's 'no affinity', common on VMs): set "
                         "numa_node to one of them with numa_override: true")
            elif pinned is not None and pinned not in nodes:
                p.append(f"{where}.numa_node: host {h.name} has no NUMA node {pinned} (it has "
                         f"{sorted(nodes)}); remove numa_node to take it from the GPUs")
            elif len(gnodes) > 1 and not (s["numa_override"] and pinned is not None):
                p.append(f"{where}.gpus: GPUs {s['gpus']} hang off NUMA nodes {sorted(gnodes)}; pick GPUs of one "
                         "node, or set numa_node with numa_override: true")
            elif pinned is not None and gnodes and pinned not in gnodes and not s["numa_override"]:
                p.append(f"{where}.numa_node: {pinned} is not the node its GPUs hang off ({sorted(gnodes)[0]}); "
                         "remove numa_node (the planner takes it from the facts) or set numa_override: true")
            if s["numa_override"] and pinned is not None and pinned in nodes and gnodes - {pinned}:
                by_index = {g["index"]: g for g in f.get("gpus", [])}
                remote = [g for g in s["gpus"] if g in by_index and by_index[g]["numa_node"] != pinned]
                dep.warnings.append(
                    f"{where}.numa_override: the server is pinned to NUMA node {pinned}, but GPU(s) {remote} hang off "
                    f"node(s) {sorted({by_index[g]['numa_node'] for g in remote})}: every host<->GPU copy for them "
                    "(weights loading, HiCache, KV transfer staging) crosses the inter-socket link")
            _ib_problems(h.name, where, s, f, p)
        _model_problems(dep, h, f, p)
        _gpu_arch_problems(dep, h, f, p)
        pcie_problems(dep, h.name, f, p)
        # Host memory budgets per NUMA node (membind caps each server's host memory to its node). A server whose
        # GPUs straddle nodes without an override has no node yet (refused above): it is left out, so the budget
        # message does not blame a node it was never going to use.
        def node_of(s: dict, f: dict = f) -> int | None:
            if len(gpu_numa_node(f, s["gpus"])) > 1 and not (s["numa_override"] and s["numa_node"] is not None):
                return None
            return resolve_node(s, f)
        budgets.budget_problems(dep, h, f, nodes, node_of, p)
    return p


def facts_problem(f: Any) -> str | None:
    """None when `f` has the shape the facts script writes (schema 1), else what is wrong with it."""
    def is_int(v: Any) -> bool:
        return isinstance(v, int) and not isinstance(v, bool)
    if not isinstance(f, dict):
        return f"expected a JSON object, got {type(f).__name__}"
    nodes, gpus = f.get("numa_nodes"), f.get("gpus", [])
    if not isinstance(nodes, list) or not nodes or not all(
            isinstance(n, dict) and is_int(n.get("id")) and isinstance(n.get("cpus"), str)
            and is_int(n.get("mem_total_mb")) for n in nodes):
        return "numa_nodes must be a non-empty list of {id, cpus, mem_total_mb}"
    if not isinstance(gpus, list) or not all(
            isinstance(g, dict) and is_int(g.get("index")) and is_int(g.get("numa_node")) for g in gpus):
        return "gpus must be a list of {index, numa_node, ...}"
    if msg := _cpu_list_problem(nodes):
        return msg
    ib = f.get("infiniband", [])
    if not isinstance(ib, list) or not all(isinstance(n, str) for n in ib):
        return "infiniband must be a list of device names"
    if "model" in f and not isinstance(f["model"], dict):
        return "model must be an object"
    return None


def _ib_problems(host: str, where: str, s: dict, f: dict, p: list[str]) -> None:
    dev = s["transfer"]["ib_device"]
    if dev is None:
        return
    if "infiniband" not in f:
        p.append(f"{where}.transfer.ib_device: {dev} is set, but host {host}'s facts list no InfiniBand devices at "
                 "all (no 'infiniband' entry: facts of an older facts script or written by hand), so the device "
                 f"cannot be checked; record the facts again with `pdstack facts` on {host} (the facts phase), or "
                 "unset ib_device to let the backend pick")
        return
    have = f["infiniband"]
    missing = [n for n in dev.split(",") if n not in have]
    if missing:
        p.append(f"{where}.transfer.ib_device: {', '.join(missing)} not on host {host} (/sys/class/infiniband has "
                 f"{', '.join(have) if have else 'no devices'}); name one of those, or unset ib_device to let the "
                 "backend pick")


def _gpu_arch_problems(dep: Deployment, h, f: dict, p: list[str]) -> None:
    if dep.image["engine"] != "sglang" or f.get("gpu_source") != "nvidia-smi":
        return
    used = {g for s in h.servers for g in s["gpus"]}
    archs = {}
    for g in f.get("gpus", []):
        name = str(g.get("name", ""))
        arch = next((a for pattern, a in GPU_ARCHS if pattern in name), None)
        if g["index"] in used and arch is not None:
            archs.setdefault(arch, name)
    wrong = {a: n for a, n in archs.items() if a != dep.model["gpu_arch"]}
    if wrong:
        arch, name = next(iter(wrong.items()))
        p.append(f"pdstack_model.gpu_arch: {dep.model['gpu_arch']}, but host {h.name}'s GPUs are {name} ({arch}); "
                 f"set gpu_arch: {arch} (it picks the kernels and DeepSeek V4's indexer path)")


def _model_problems(dep: Deployment, h, f: dict, p: list[str]) -> None:
    """The model's own limits, from its config.json as the facts script read it on the host."""
    if dep.image["engine"] == "sim":
        return  # the sim test engine ships its own stand-in model
    m = dep.model
    facts_model = f.get("model")
    if not isinstance(facts_model, dict) or facts_model.get("path") != m["path"]:
        dep.warnings.append(f"host {h.name}: the facts do not describe {m['path']}/config.json, so "
                            "pdstack_model.context_length and tp_size were not checked against the model")
        return
    if facts_model.get("error"):
        dep.warnings.append(f"host {h.name}: could not read {m['path']}/config.json ({facts_model['error']}), so "
                            "pdstack_model.context_length and tp_size were not checked against the model (the serving "
                            "phase checks the model is there)")
        return
    limit = facts_model.get("context_length")
    if isinstance(limit, int) and m["context_length"] > limit:
        allowed = [s["name"] for s in h.servers
                   if str(s["env"].get("SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN")) == "1"]
        if len(allowed) == len(h.servers):
            dep.warnings.append(f"pdstack_model.context_length: {m['context_length']} is beyond the model's "
                                f"{limit} (config.json); allowed by SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1, but "
                                "outputs past it may be wrong")
        else:
            p.append(f"pdstack_model.context_length: {m['context_length']} is beyond the model's {limit} "
                     f"({facts_model.get('context_key', 'config.json')} in {m['path']}/config.json on {h.name}); "
                     f"SGLang refuses to start with it: set context_length <= {limit}")
    heads = facts_model.get("num_attention_heads")
    if isinstance(heads, int) and heads > 0:
        for i, s in enumerate(h.servers):
            if s["tp_size"] > 0 and heads % s["tp_size"]:
                p.append(f"{server_where(h.name, i, s)}.tp_size: {s['tp_size']} does not divide the model's "
                         f"{heads} attention heads (config.json num_attention_heads); pick a tp_size that does, "
                         f"e.g. {max(d for d in (1, 2, 4, 8) if heads % d == 0)}")


def _cpu_list_problem(nodes: list[dict]) -> str | None:
    """NUMA nodes must have distinct ids and disjoint, well-formed CPU lists (each server's cpuset is its node's)."""
    seen: dict[int, int] = {}
    if len({n["id"] for n in nodes}) != len(nodes):
        return "numa_nodes ids must be distinct"
    for n in nodes:
        cpus = _cpulist(n["cpus"])
        if cpus is None:
            return f"NUMA node {n['id']}'s cpus {n['cpus']!r} is not a CPU list like 0-31,64-95"
        if not cpus:
            return f"NUMA node {n['id']} has no CPUs"
        for c in cpus:
            if c in seen:
                return (f"NUMA nodes {seen[c]} and {n['id']} both list CPU {c}: their servers would share CPUs "
                        "(overlapping cpusets)")
            seen[c] = n["id"]
    return None


def _cpulist(text: str, limit: int = 1 << 16) -> list[int] | None:
    """'0-3,8' -> [0, 1, 2, 3, 8]; None when it is not such a list or names CPUs at or beyond `limit`."""
    out: list[int] = []
    for part in text.strip().split(","):
        lo, _, hi = part.partition("-")
        if not lo.isdigit() or (hi and not hi.isdigit()) or int(hi or lo) >= limit or int(hi or lo) < int(lo):
            return None
        out.extend(range(int(lo), int(hi or lo) + 1))
    return out
