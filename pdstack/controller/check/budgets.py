"""Host memory budgets per NUMA node: every flag that asks for host memory counts against its node.

The plan binds each server to one NUMA node (docker --cpuset-mems), so what its flags ask of host memory must fit
that node's memory minus pdstack_numa_reserve_gb, together with every other server bound there. What SGLang 0.5.23
allocates in host memory (sglang/srt/arg_groups/fields/*.py, the ServerArgs fields):

  HiCache      --hicache-ratio x the device KV pool, per server (mem_cache/memory_pool_host.py); the planner derives
               the ratio from hicache.host_budget_gb / hicache.device_kv_pool_gb, so a wrong pool size moves it
  --hicache-size         GB per TP rank, overriding that ratio: refused, so host_budget_gb is the one HiCache
                         number (DeepSeek V4 rejects it anyway: servers.py)
  --cpu-offload-gb       GiB per TP rank (utils/offloader.py: cpu_offload_max_bytes = gb * 1024**3 per process)

Flags whose host memory depends on the model or on a config file pdstack does not read are refused: their size
cannot be counted (UNCOUNTED_HOST_MEMORY). NUMA binding flags are refused: the plan binds NUMA itself.
"""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from pdstack.controller.load import flags
from pdstack.controller.load.tables import server_where

# flag -> what it asks: GiB per TP rank per unit of its value
COUNTED_HOST_MEMORY = {"cpu-offload-gb": "CPU offload of weights"}
UNCOUNTED_HOST_MEMORY = {
    "enable-weights-cpu-backup": "a host copy of the model's weights",
    "enable-draft-weights-cpu-backup": "a host copy of the draft model's weights",
    "enable-paged-experts": "the non-resident MoE experts in pinned host memory",
    "kt-weight-path": "ktransformers' CPU experts",
    "enable-lmcache": "LMCache's host tier, sized by its config file",
    "enable-flexkv": "FlexKV's host tier, sized by its config file",
    "offload-group-size": "the model layers it offloads to host memory",
    "disaggregation-decode-enable-offload-kvcache": "decode KV offloaded to host memory",
    "ple-offload-embedding": "the PLE n-gram embedding table in pinned host memory",
}
NUMA_FLAGS = ("numa-node",)
# SGLang's own NUMA and CPU binding switches (sglang/srt/environ.py, "NUMA and CPU affinity"; utils/numa_utils.py
# wraps each subprocess in numactl for its GPU's node): the plan's binding is the one that holds.
NUMA_ENV = ("SGLANG_NUMA_BIND_V2", "SGLANG_AUTO_NUMA_BIND", "SGLANG_SET_CPU_AFFINITY")
# A device KV pool below this share of the GPU memory SGLang reserves for weights and KV is taken as a misreading
# of the log line when the ratio it gives would overrun the node even at that size.
MIN_POOL_SHARE = 0.1
# No real memory size or count comes near 2**53 (the largest integer a float carries exactly); beyond it, and
# for inf/nan, a value is refused rather than converted (float(10**310) raises OverflowError).
_MAX_EXACT = 2 ** 53


def finite_number(v: Any) -> float | None:
    """`v` as a float when it is a real, finite number a budget can use; None for bools, strings, inf, nan and
    integers too large for a float to carry."""
    if isinstance(v, bool):
        return None
    if isinstance(v, int):
        return float(v) if abs(v) <= _MAX_EXACT else None
    if isinstance(v, float) and math.isfinite(v):
        return v
    return None


def sink_value(value: Any, typ: Any) -> Any:
    """What the flag's parser makes of `value`: for a flag of numeric type, the number argparse gets from the word
    pdstack renders (so "1.5" and "30001" are checked as the 1.5 and 30001 SGLang sees); else `value` itself, also
    when the word does not parse (the parser check names that)."""
    if isinstance(value, str) and typ in (int, float):
        try:
            return typ(value.strip())
        except (ValueError, OverflowError):
            return value
    return value


def _flag_type(key: str) -> Any:
    a = flags.action_for(flags.sglang_parser(), f"--{key}")
    return a.type if a is not None else None


def _is_off(v: Any) -> bool:
    """An extra_args value that turns its flag off (or leaves it at SGLang's no-op default)."""
    return v is None or v is False or (finite_number(v) is not None and finite_number(v) <= 0)


def host_memory_flag_problems(where: str, extra: dict[str, Any], family: str, p: list[str]) -> None:
    """Static: NUMA binding flags, uncountable host memory, and counted flags whose value is not a number."""
    for key, value in extra.items():
        path = f"{where}.extra_args.{key}"
        if key == "hicache-size" and family != "deepseek_v4" and not _is_off(value):
            p.append(f"{path}: --hicache-size overrides the --hicache-ratio the planner derives from the server's "
                     "hicache.host_budget_gb / device_kv_pool_gb, so the budget pdstack checks against the NUMA node "
                     "would not be what SGLang allocates; remove extra_args.hicache-size and set "
                     "hicache.host_budget_gb (with hicache.enabled: true)")
        elif key in NUMA_FLAGS:
            p.append(f"{path}: the plan binds the server to a NUMA node itself (docker --cpuset-cpus/--cpuset-mems, "
                     f"the node its GPUs hang off); remove extra_args.{key}, and to pin another node set the "
                     "server's numa_node with numa_override: true")
        elif key in UNCOUNTED_HOST_MEMORY and not _is_off(value):
            p.append(f"{path}: --{key} puts {UNCOUNTED_HOST_MEMORY[key]} in host memory, of a size pdstack cannot "
                     "count against the NUMA node's budget (memory minus pdstack_numa_reserve_gb, shared with "
                     f"HiCache); remove extra_args.{key} (host memory for KV: hicache.host_budget_gb; for "
                     "weights: extra_args.cpu-offload-gb, which is counted)")
        elif key in COUNTED_HOST_MEMORY and value is not None and value is not False:
            n = finite_number(sink_value(value, _flag_type(key)))
            if n is None or n < 0:
                p.append(f"{path}: {value!r} is not a number of GiB (>= 0, finite); write a plain number, e.g. "
                         f"{key}: 16, or remove it")


def server_host_memory(s: dict[str, Any]) -> list[tuple[float, str, str]]:
    """(GiB, variable, how) of each host memory ask of server `s`; only values a budget can count."""
    out = []
    hc = s["hicache"]
    budget = finite_number(hc["host_budget_gb"])
    if hc["enabled"] and budget:
        out.append((budget, "hicache.host_budget_gb", ""))
    for key, what in COUNTED_HOST_MEMORY.items():
        n = finite_number(sink_value(s["extra_args"].get(key), _flag_type(key)))
        if n and n > 0:
            out.append((n * s["tp_size"], f"extra_args.{key}",
                        f" ({what}: {key} {n:g} x {s['tp_size']} TP rank(s))"))
    return out


def budget_problems(dep, h, f: dict, nodes: dict[int, dict], node_of, p: list[str]) -> None:
    """Every host memory ask of the servers bound to each NUMA node of host `h`, against the node's memory.
    `node_of(server)`: the server's node, or None when it has none yet (refused elsewhere)."""
    per_node: dict[int, list[tuple[str, float, str, str]]] = defaultdict(list)
    for i, s in enumerate(h.servers):
        node = node_of(s)
        if node not in nodes:
            continue
        avail = nodes[node]["mem_total_mb"] / 1024 - h.numa_reserve_gb
        _pool_problems(h, i, s, f, node, avail, p)
        for gib, var, how in server_host_memory(s):
            per_node[node].append((s["name"], gib, var, how))
    for node, wants in per_node.items():
        node_gib = nodes[node]["mem_total_mb"] / 1024
        avail = node_gib - h.numa_reserve_gb
        total = sum(w for _, w, _, _ in wants)
        if total > avail:
            names = ", ".join(f"{n} {w:g} GiB{how}" for n, w, _, how in wants)
            variables = list(dict.fromkeys(var for _, _, var, _ in wants))
            fixes = " or ".join(f"lower {v.rpartition('.')[2] if v.startswith('hicache') else v}" for v in variables)
            p.append(f"host_vars/{h.name} {', '.join(variables)}: {names} = {total:g} GiB on NUMA node {node}, "
                     f"which has {node_gib:.1f} GiB minus pdstack_numa_reserve_gb {h.numa_reserve_gb:g} = "
                     f"{avail:.1f} GiB; {fixes}")


def _pool_problems(h, i: int, s: dict, f: dict, node: int, avail: float, p: list[str]) -> None:
    """hicache.device_kv_pool_gb against the GPUs it lives on: SGLang allocates the host pool as --hicache-ratio x
    the device pool it really has, so a misread pool size asks the node for the ratio's multiple of it."""
    hc = s["hicache"]
    budget, pool = finite_number(hc["host_budget_gb"]), finite_number(hc["device_kv_pool_gb"])
    if not (hc["enabled"] and budget and pool and budget > 0 and pool > 0):
        return
    by_index = {g["index"]: g for g in f.get("gpus", [])}
    mem = [by_index[g].get("memory_mb") for g in s["gpus"] if g in by_index]
    if not mem or len(mem) != len(s["gpus"]) or not all(finite_number(m) for m in mem):
        return  # GPUs beyond the host's are refused by topology.py; memory unknown: nothing to compare
    gpu_gib = sum(mem) / 1024
    mff = finite_number(sink_value(s["extra_args"].get("mem-fraction-static"), float))
    share, said = (mff, f"mem-fraction-static {mff:g}") if mff and 0 < mff < 1 else (1.0, "all of it")
    static = gpu_gib * share
    where = server_where(h.name, i, s)
    ratio = math.floor(budget / pool * 1000) / 1000
    if pool > static:
        p.append(f"{where}.hicache.device_kv_pool_gb: {pool:g} GiB is more than its {len(mem)} GPU(s) hold for "
                 f"weights and KV ({gpu_gib:.1f} GiB, {said}: {static:.1f} GiB), so it is not the pool SGLang "
                 "allocates; read it from the server's 'KV Cache is allocated' log line (all its GPUs together)")
        return
    floor = static * MIN_POOL_SHARE
    if pool < floor and ratio * floor > avail:
        p.append(f"{where}.hicache.device_kv_pool_gb: {pool:g} GiB is implausibly small for {len(mem)} GPU(s) with "
                 f"{gpu_gib:.1f} GiB ({said}: {static:.1f} GiB for weights and KV), and the --hicache-ratio it gives "
                 f"(host_budget_gb {budget:g} / {pool:g} = {ratio:.3f}) would ask the node for {ratio:.3f} x the "
                 f"device pool SGLang really allocates: {ratio * floor:.0f} GiB for a pool of even {floor:.1f} GiB "
                 f"(a tenth of that memory), up to {ratio * static:.0f} GiB, of NUMA node {node}'s {avail:.1f} GiB "
                 f"(after pdstack_numa_reserve_gb {h.numa_reserve_gb:g}); read device_kv_pool_gb from the server's "
                 "'KV Cache is allocated' log line (all its GPUs together) and set it")
