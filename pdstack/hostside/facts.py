#!/usr/bin/env python3
"""Host facts: NUMA nodes (CPUs, memory) and GPUs (index, PCI bus, NUMA node), as JSON.

This file is self-contained (standard library only): the facts role installs it on every host as
/etc/ansible/facts.d/pdstack.fact, so Ansible reports it as ansible_local.pdstack, and the planner reads the
same JSON. `pdstack facts` runs it on the controller. Schema (version 1):

  {"schema": 1, "hostname": str, "mem_total_mb": int,
   "numa_nodes": [{"id": 0, "cpus": "0-31,64-95", "mem_total_mb": int}],
   "gpus": [{"index": 0, "name": str, "pci_bus_id": str, "numa_node": 0, "memory_mb": int}],
   "gpu_source": "nvidia-smi" | "simulated" | "none",
   "infiniband": [str],                       # /sys/class/infiniband (empty: no RDMA device or driver)
   "host": {"cmdline": str, "kernel_args": {name: value}, "iommu": "off" | "passthrough" | "translated" | "unknown",
            "aspm_policy": str, "uvm_disable_hmm": "Y" | "N" | "unknown", "driver_version": str,
            "p2p": {"GPU0": {"GPU1": "OK"}} | "unknown",
            "links": {"GPU0": {"GPU1": "NODE"}} | "unknown",
            "gpus": [{"index": 0, "bar1_mib": int | None, "persistence": "Enabled" | "Disabled" | "unknown",
                      "bridges": [{"bdf": str, "acs": "on" | "off" | "none" | "unknown", "acsctl": str}]}]},
   "model": {"path": str, "context_length": int, "context_key": str, "num_attention_heads": int,
             "num_key_value_heads": int} | {"path": str, "error": str},   # with --model-path only
             # and, for the model phase's room check: "disk": {"path": nearest existing dir, "free_bytes": int},
             # "files": {relative path: size} (hidden entries skipped), "partial": {path: bytes in staging}
             }

The host entry is the running state of the settings the host role wants (docs/facts.md#pcie-host-settings): the
kernel command line (/proc/cmdline), the IOMMU mode (each GPU's /sys/bus/pci/devices/<bus>/iommu_group/type, else
/sys/kernel/iommu_groups and the command line), the ASPM policy (/sys/module/pcie_aspm/parameters/policy), ACS on
every PCI bridge above each GPU (its sysfs path, `lspci -D -vvv`'s ACSCtl line), BAR1 size, persistence mode and
the driver version (`nvidia-smi -q`), the P2P matrix (`nvidia-smi topo -p2p r`) and the link matrix (`topo -m`).
Whatever a tool or file does not tell (no nvidia-smi, no lspci, not root, a CPU test host) is "unknown", never a
crash.

The model entry reads <path>/config.json the way SGLang 0.5.23 derives a context length (the first of its
CONTEXT_LENGTH_KEYS, times the rope scaling factor; text_config for multimodal configs), so preflight can check
pdstack_model.context_length and tp_size against the model before anything is installed.

GPUs come from nvidia-smi, and each GPU's NUMA node from /sys/bus/pci/devices/<bus>/numa_node, as the kernel
reports it: -1 is "no affinity" (VMs, some firmware); the controller maps it to the host's only node, and on a
host of several nodes asks the inventory to pin the server's node (check/topology.py). A host with no NVIDIA GPU
may carry /etc/pdstack/simulated-gpus.json, written only for the sim TEST ENGINE on CPU test hosts; its GPUs are
reported with gpu_source "simulated", which preflight refuses for the sglang engine.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import re
import shutil
import socket
import stat
import subprocess
import sys

SCHEMA = 1
SIMULATED_GPUS = "/etc/pdstack/simulated-gpus.json"


def parse_cpulist(text: str) -> list[int]:
    """'0-3,8,10-11' -> [0, 1, 2, 3, 8, 10, 11]."""
    cpus: list[int] = []
    for part in text.strip().split(","):
        if not part:
            continue
        if "-" in part:
            lo, hi = part.split("-")
            cpus.extend(range(int(lo), int(hi) + 1))
        else:
            cpus.append(int(part))
    return sorted(set(cpus))


def format_cpulist(cpus: list[int]) -> str:
    """[0, 1, 2, 3, 8] -> '0-3,8' (the form docker --cpuset-cpus and numactl take)."""
    out, cpus = [], sorted(set(cpus))
    i = 0
    while i < len(cpus):
        j = i
        while j + 1 < len(cpus) and cpus[j + 1] == cpus[j] + 1:
            j += 1
        out.append(str(cpus[i]) if i == j else f"{cpus[i]}-{cpus[j]}")
        i = j + 1
    return ",".join(out)


def _read(path: str) -> str:
    with open(path) as f:
        return f.read()


def _meminfo_mb(text: str) -> int:
    m = re.search(r"MemTotal:\s+(\d+) kB", text)
    return int(m.group(1)) // 1024 if m else 0


def numa_nodes(sysfs: str = "/sys") -> list[dict]:
    nodes = []
    for d in sorted(glob.glob(f"{sysfs}/devices/system/node/node[0-9]*"), key=lambda p: int(p.rsplit("node", 1)[1])):
        nid = int(d.rsplit("node", 1)[1])
        cpus = _read(f"{d}/cpulist").strip()
        nodes.append({"id": nid, "cpus": format_cpulist(parse_cpulist(cpus)), "mem_total_mb": _meminfo_mb(
            _read(f"{d}/meminfo"))})
    if not nodes:  # no NUMA support in the kernel: one node holding everything
        nodes.append({"id": 0, "cpus": format_cpulist(list(range(os.cpu_count() or 1))),
                      "mem_total_mb": _meminfo_mb(_read("/proc/meminfo"))})
    return nodes


def nvidia_gpus(sysfs: str = "/sys") -> list[dict]:
    smi = shutil.which("nvidia-smi")
    if not smi:
        return []
    out = subprocess.run([smi, "--query-gpu=index,name,pci.bus_id,memory.total", "--format=csv,noheader,nounits"],
                         capture_output=True, text=True, timeout=60, check=True).stdout
    gpus = []
    for line in out.strip().splitlines():
        index, name, bus, mem = (x.strip() for x in line.split(","))
        # nvidia-smi prints 00000000:17:00.0; sysfs names it 0000:17:00.0
        sys_bus = bus.lower()[-12:]
        try:
            node = int(_read(f"{sysfs}/bus/pci/devices/{sys_bus}/numa_node").strip())
        except OSError:
            node = -1
        gpus.append({"index": int(index), "name": name, "pci_bus_id": sys_bus, "numa_node": node,
                     "memory_mb": int(float(mem))})
    return gpus


def infiniband_devices(sysfs: str = "/sys") -> list[str]:
    """RDMA devices as /sys/class/infiniband names them (what --disaggregation-ib-device takes)."""
    try:
        return sorted(os.listdir(f"{sysfs}/class/infiniband"))
    except OSError:
        return []


# SGLang 0.5.23 sglang/srt/utils/hf_transformers/common.py: the first key found wins
CONTEXT_LENGTH_KEYS = ("max_sequence_length", "seq_length", "max_seq_len", "model_max_length",
                       "max_position_embeddings")


STAGING = ".pdstack-staging"  # pdstack/hostside/model_fetch.py's partial transfers, inside the model directory


def _sizes(root: str, skip_hidden: bool) -> dict[str, int]:
    """Relative path -> size of every regular file under root (hidden entries skipped when asked)."""
    out: dict[str, int] = {}
    for d, dirs, names in os.walk(root):
        if skip_hidden:
            dirs[:] = [x for x in dirs if not x.startswith(".")]
        for name in names:
            if skip_hidden and name.startswith("."):
                continue
            full = os.path.join(d, name)
            try:
                st = os.lstat(full)
            except OSError:
                continue
            if stat.S_ISREG(st.st_mode):
                out[os.path.relpath(full, root).replace(os.sep, "/")] = st.st_size
    return out


def model_disk(path: str) -> dict:
    """Room for the model: free bytes of the filesystem that holds (or will hold) `path`, the sizes of the files
    already there, and of partial transfers in its staging directory (preflight subtracts both from the lock)."""
    probe = path
    while not os.path.isdir(probe) and probe not in ("", "/"):
        probe = os.path.dirname(probe)
    probe = probe or "/"
    out: dict = {"disk": {"path": probe, "free_bytes": shutil.disk_usage(probe).free}}
    if os.path.isdir(path):
        out["files"] = _sizes(path, skip_hidden=True)
        staging = os.path.join(path, STAGING)
        out["partial"] = {k[:-len(".part")]: v for k, v in _sizes(staging, False).items() if k.endswith(".part")}
    return out


def model_facts(path: str) -> dict:
    """What preflight checks against the model, from its config.json on this host, and the room for it."""
    out: dict = {"path": path}
    try:
        out.update(model_disk(path))
    except OSError as e:
        out["disk_error"] = f"cannot measure {path}: {e.strerror or e}"
    try:
        cfg = json.loads(_read(os.path.join(path, "config.json")))
    except OSError as e:
        out["error"] = f"cannot read config.json: {e.strerror or e}"
        return out
    except ValueError as e:
        out["error"] = f"config.json is not JSON: {e}"
        return out
    if not isinstance(cfg, dict):
        out["error"] = "config.json is not a JSON object"
        return out
    text = cfg.get("text_config") if isinstance(cfg.get("text_config"), dict) else cfg
    rope = text.get("rope_scaling") or {}
    factor = 1
    if isinstance(rope, dict) and rope:
        factor = rope.get("factor", 1)
        if "original_max_position_embeddings" in rope or rope.get("rope_type") == "llama3":
            factor = 1
    for key in CONTEXT_LENGTH_KEYS:
        val = text.get(key)
        if isinstance(val, (int, float)) and not isinstance(val, bool):
            try:
                out["context_length"], out["context_key"] = int(factor * val), key
            except (TypeError, ValueError):
                pass
            break
    for key in ("num_attention_heads", "num_key_value_heads"):
        if isinstance(text.get(key), int) and not isinstance(text.get(key), bool):
            out[key] = text[key]
    return out


# ---------------------------------------------------------------- PCIe host settings (the host role's wanted state)

BDF = re.compile(r"^[0-9a-f]{4}:[0-9a-f]{2}:[0-9a-f]{2}\.[0-7]$")
UNKNOWN = "unknown"


def _tool(argv: list[str]) -> str | None:
    """A tool's stdout, or None when it is missing, fails or hangs (CPU test hosts have no nvidia-smi)."""
    if not shutil.which(argv[0]):
        return None
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.SubprocessError):
        return None
    return p.stdout if p.returncode == 0 else None


def kernel_args(cmdline: str) -> dict[str, str]:
    """/proc/cmdline -> {name: value} ("" for a bare flag; the last one wins, as the kernel reads them)."""
    out: dict[str, str] = {}
    for tok in cmdline.split():
        name, _, value = tok.partition("=")
        out[name] = value
    return out


def iommu_mode(args: dict[str, str], group_types: list[str], groups_present: bool | None) -> str:
    """"passthrough" (identity domains: DMA untranslated, P2P goes direct), "translated" (DMA/DMA-FQ domains),
    "off" (no IOMMU groups, or switched off on the command line), else "unknown"."""
    if group_types:
        return "passthrough" if all(t == "identity" for t in group_types) else "translated"
    if any(args.get(k) == "off" for k in ("iommu", "intel_iommu", "amd_iommu")) or groups_present is False:
        return "off"
    if args.get("iommu") == "pt" or "pt" in args.get("intel_iommu", "").split(","):
        return "passthrough"
    return UNKNOWN


def aspm_policy(text: str | None) -> str:
    """/sys/module/pcie_aspm/parameters/policy ("default [performance] powersave ...") -> the bracketed one."""
    m = re.search(r"\[(\w+)\]", text or "")
    return m.group(1) if m else UNKNOWN


def lspci_acs(text: str) -> dict[str, str]:
    """`lspci -D -vvv` -> {bdf: its ACSCtl line's flags} for the devices with an ACS capability."""
    out, bdf = {}, ""
    for line in text.splitlines():
        if line and not line[0].isspace():
            bdf = line.split(" ", 1)[0].lower()
        elif "ACSCtl:" in line and bdf:
            out[bdf] = line.split("ACSCtl:", 1)[1].strip()
        elif "<access denied>" in line and bdf:  # lspci not run as root: no capability is shown
            out.setdefault(bdf, "<access denied>")
    return out


def acs_state(acsctl: str | None) -> str:
    """ACS redirects peer traffic to the root complex when request or completion redirect is on: "on"."""
    if acsctl is None:
        return "none"
    if acsctl == "<access denied>":
        return UNKNOWN
    flags = dict((f[:-1], f[-1]) for f in acsctl.split() if f[-1:] in "+-")
    return "on" if flags.get("ReqRedir") == "+" or flags.get("CmpltRedir") == "+" else "off"


def bridges_above(bus: str, sysfs: str) -> list[str]:
    """The PCI functions above a device, root port first, from its resolved sysfs path."""
    path = os.path.realpath(f"{sysfs}/bus/pci/devices/{bus}")
    parts = [p for p in path.split(os.sep) if BDF.match(p)]
    return parts[:-1] if parts and parts[-1] == bus else []


def smi_q(text: str) -> dict:
    """`nvidia-smi -q` -> {"driver_version": str, "gpus": {bus: {"bar1_mib": int, "persistence": str}}}."""
    out: dict = {"driver_version": UNKNOWN, "gpus": {}}
    gpu, section = None, ""
    for line in text.splitlines():
        key, _, value = (x.strip() for x in line.partition(":"))
        if line.startswith("Driver Version"):
            out["driver_version"] = value
        elif line.startswith("GPU ") and BDF.match(line[4:].strip().lower()[-12:]):
            gpu = out["gpus"].setdefault(line[4:].strip().lower()[-12:], {"bar1_mib": None, "persistence": UNKNOWN})
        elif gpu is None:
            continue
        elif key == "Persistence Mode":
            gpu["persistence"] = value
        elif line.startswith("    ") and not line.startswith("        "):
            section = key
        elif section == "BAR1 Memory Usage" and key == "Total" and value.split(" ")[0].isdigit():
            gpu["bar1_mib"] = int(value.split(" ")[0])
    return out


def gpu_matrix(text: str | None) -> dict | str:
    """`nvidia-smi topo -p2p r` or `topo -m` -> {row GPU: {column GPU: cell}}; "unknown" without a table."""
    rows = [line.split() for line in (text or "").splitlines()]
    gpu_rows = [r for r in rows if r and re.fullmatch(r"GPU\d+", r[0])]
    head = gpu_rows[0] if gpu_rows and (len(gpu_rows[0]) < 2 or gpu_rows[0][1] != "X") else None
    if head is None:
        return UNKNOWN
    cols = [c for c in head if re.fullmatch(r"GPU\d+", c)]
    return {r[0]: dict(zip(cols, r[1:1 + len(cols)], strict=True)) for r in gpu_rows[1:] if len(r) > len(cols)}


def host_settings(gpus: list[dict], sysfs: str = "/sys", proc: str = "/proc") -> dict:
    try:
        cmdline = _read(f"{proc}/cmdline").strip()
    except OSError:
        cmdline = UNKNOWN
    args = kernel_args(cmdline) if cmdline != UNKNOWN else {}
    types = []
    for g in gpus:
        try:
            types.append(_read(f"{sysfs}/bus/pci/devices/{g['pci_bus_id']}/iommu_group/type").strip())
        except OSError:
            pass
    groups = os.listdir(f"{sysfs}/kernel/iommu_groups") if os.path.isdir(f"{sysfs}/kernel/iommu_groups") else None
    try:
        policy = aspm_policy(_read(f"{sysfs}/module/pcie_aspm/parameters/policy"))
    except OSError:
        policy = UNKNOWN
    try:  # the loaded nvidia_uvm's parameter: Y or N (absent: the module is not loaded)
        uvm = _read(f"{sysfs}/module/nvidia_uvm/parameters/uvm_disable_hmm").strip() or UNKNOWN
    except OSError:
        uvm = UNKNOWN
    real = [g for g in gpus if BDF.match(str(g.get("pci_bus_id")))]
    lspci = _tool(["lspci", "-D", "-vvv"]) if real else None
    acs = lspci_acs(lspci) if lspci is not None else None
    q = smi_q(_tool(["nvidia-smi", "-q"]) or "") if real else {"driver_version": UNKNOWN, "gpus": {}}
    per_gpu = []
    for g in real:
        gq = q["gpus"].get(g["pci_bus_id"]) or {}
        per_gpu.append({"index": g["index"], "bar1_mib": gq.get("bar1_mib"),
                        "persistence": gq.get("persistence", UNKNOWN),
                        "bridges": [{"bdf": b, "acs": UNKNOWN if acs is None else acs_state(acs.get(b)),
                                     "acsctl": (acs or {}).get(b, "")} for b in bridges_above(g["pci_bus_id"], sysfs)]})
    return {"cmdline": cmdline, "kernel_args": args,
            "iommu": iommu_mode(args, types, None if groups is None else bool(groups)),
            "aspm_policy": policy, "uvm_disable_hmm": uvm, "driver_version": q["driver_version"],
            "p2p": gpu_matrix(_tool(["nvidia-smi", "topo", "-p2p", "r"])) if real else UNKNOWN,
            "links": gpu_matrix(_tool(["nvidia-smi", "topo", "-m"])) if real else UNKNOWN, "gpus": per_gpu}


def collect(sysfs: str = "/sys", simulated: str = SIMULATED_GPUS, simulate_gpus: int = 0,
            model_path: str | None = None, proc: str = "/proc") -> dict:
    """The facts. `simulate_gpus` (or the file `simulated`) adds that many simulated GPUs on NUMA node 0 when the
    host has no NVIDIA GPU: only for the sim test engine on CPU test hosts."""
    nodes = numa_nodes(sysfs)
    gpus = nvidia_gpus(sysfs)
    source = "nvidia-smi" if gpus else "none"
    spec = None
    if not gpus and simulate_gpus:
        spec = {"count": simulate_gpus}
    elif not gpus and os.path.exists(simulated):
        spec = json.loads(_read(simulated))
    if spec:
        gpus = [{"index": i, "name": "simulated (pdstack sim test engine)", "pci_bus_id": f"sim:{i}",
                 "numa_node": int(spec.get("numa_node", 0)), "memory_mb": int(spec.get("memory_mb", 0))}
                for i in range(int(spec["count"]))]
        source = "simulated"
    facts = {"schema": SCHEMA, "hostname": socket.gethostname(), "mem_total_mb": sum(n["mem_total_mb"] for n in nodes),
             "numa_nodes": nodes, "gpus": gpus, "gpu_source": source, "infiniband": infiniband_devices(sysfs),
             "host": host_settings(gpus, sysfs, proc)}
    if model_path:
        facts["model"] = model_facts(model_path)
    return facts


def register(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--sysfs", default="/sys", help="sysfs root (for tests)")
    parser.add_argument("--simulate-gpus", type=int, default=0, metavar="N",
                        help="TEST ENGINE only: report N simulated GPUs when the host has no NVIDIA GPU")
    parser.add_argument("--model-path", help="also read this model directory's config.json (context length, heads)")


def run(args: argparse.Namespace) -> int:
    print(json.dumps(collect(args.sysfs, simulate_gpus=args.simulate_gpus, model_path=args.model_path), indent=2))
    return 0


def main(argv: list[str] | None = None) -> int:
    """The facts.d script: one line of JSON, even on an error (Ansible reports an opaque error otherwise)."""
    ap = argparse.ArgumentParser(prog="pdstack-hostside facts", description="pdstack host facts (JSON)")
    register(ap)
    try:
        a = ap.parse_args(argv)
        print(json.dumps(collect(a.sysfs, simulate_gpus=a.simulate_gpus, model_path=a.model_path)))
    except Exception as e:
        print(json.dumps({"schema": SCHEMA, "error": f"{type(e).__name__}: {e}"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
