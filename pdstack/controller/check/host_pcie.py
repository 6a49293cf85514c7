"""Preflight against a GPU host's PCIe facts (the facts script's `host` entry): refuse, with the fix, what cannot
work, and say per pdstack_host.reboot_policy what a reboot must bring first. Sources: docs/facts.md#pcie-host-settings.

- a driver older than the branch wanted (at least 580: CUDA 13 on sm_120): refused;
- a GPU whose BAR1 cannot map a peer's memory (the card's small-BAR mode, or Resizable BAR / Above 4G decoding off
  in firmware): refused, nothing on the host can change it;
- the IOMMU translating DMA (NCCL P2P deadlocks): with iommu=pt among the wanted kernel arguments and not yet on the
  running command line it is a pending reboot (the plan says so; the host role writes the drop-in, then stops before
  serving or warns, as pdstack_host.reboot_policy says; under warn the serving phase's P2P gate then fails or is
  killed before the servers start); without it, refused; with it already running and the GPUs still translated
  (no reboot changes that), refused;
- ACS on above a GPU while pdstack_host.acs_off is false: refused (all-reduce deadlocks).
"""

from __future__ import annotations

from pdstack.controller.load import host_settings
from pdstack.controller.load.inventory import Deployment


def pcie_problems(dep: Deployment, host: str, facts: dict, p: list[str]) -> None:
    w = host_settings.wanted(dep.host_settings, facts)
    if w["gpu_model"] == "none":
        return
    h = facts.get("host") if isinstance(facts.get("host"), dict) else {}
    var = "pdstack_host (group_vars/all/host.yml)"
    have = host_settings.driver_major(h.get("driver_version"))
    if have is not None and w["driver_branch"] and have < w["driver_branch"]:
        p.append(f"host {host}: NVIDIA driver {h['driver_version']} is older than branch {w['driver_branch']} "
                 f"({host_settings.MIN_DRIVER_SOURCE}); install the {w['driver_branch']} branch (e.g. apt install "
                 f"nvidia-driver-{w['driver_branch']}-open), reboot, run again; or set {var} driver_branch")
    elif have is not None and w["driver_branch"] and have != w["driver_branch"]:
        dep.warnings.append(f"host {host}: runs NVIDIA driver {h['driver_version']}, not the pinned branch "
                            f"{w['driver_branch']} ({var} driver_branch)")
    small = [(g["index"], g["bar1_mib"]) for g in h.get("gpus") or []
             if isinstance(g.get("bar1_mib"), int) and g["bar1_mib"] < w["min_bar1_mib"]]
    if small:
        p.append(f"host {host}: GPU(s) {', '.join(f'{i} (BAR1 {m} MiB)' for i, m in small)} cannot map a peer's "
                 f"memory (a {w['gpu_model']} needs BAR1 >= {w['min_bar1_mib']} MiB): switch the card to its "
                 "large-BAR display mode (NVIDIA's displaymodeselector) and turn on Resizable BAR and Above 4G "
                 "decoding in the firmware, then reboot")
    pt = any(a in ("iommu=pt", "iommu=off", "intel_iommu=off", "amd_iommu=off") for a in w["kernel_args"])
    if h.get("iommu") == "translated" and not pt:
        p.append(f"host {host}: the IOMMU translates the GPUs' DMA, which blocks (deadlocks) NCCL P2P, and "
                 f"{var} kernel_args has no iommu=pt: add iommu=pt (the {w['gpu_model']} default), or switch the "
                 "IOMMU off in the firmware")
    running = [x.removeprefix("kernel argument ") for x in w["in_force"]
               if x.startswith("kernel argument") and "iommu" in x]
    if h.get("iommu") == "translated" and pt and running:
        # the IOMMU argument is already on the running command line, yet the GPUs' IOMMU groups translate: no reboot
        # changes that (not read, or not yet running: the plan says unknown or waiting for a reboot instead)
        p.append(f"host {host}: the IOMMU translates the GPUs' DMA (their /sys/bus/pci/devices/<gpu>/iommu_group/type "
                 "is DMA or DMA-FQ), which blocks (deadlocks) NCCL P2P, although the running kernel command line has "
                 f"{', '.join(running)}: a reboot will not change it; switch the IOMMU off in the firmware, or find "
                 "what else on the command line or in the kernel keeps those groups translated, then run again")
    if dep.host_settings.get("acs_off") is False:
        on = sorted({b["bdf"] for g in h.get("gpus") or [] for b in g.get("bridges") or [] if b.get("acs") == "on"})
        if on:
            p.append(f"host {host}: ACS is on at PCI bridge(s) {', '.join(on)} above the GPUs (peer traffic goes "
                     f"through the root complex; all-reduce deadlocks) and {var} acs_off is false: set acs_off: "
                     "true (the pdstack-acs unit switches it off at boot) or pci=noacs in kernel_args")
