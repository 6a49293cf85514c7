"""pdstack_host: the PCIe host settings a GPU host runs with, wanted (the inventory's, else the GPU model's safe
defaults) against running (the facts script's `host` entry), and what a reboot is needed for.

Each setting and its source is in docs/facts.md#pcie-host-settings. The host role renders the wanted state (a GRUB
drop-in, a modprobe.d file, the ACS unit); preflight refuses what cannot work (check/topology.py); the plan carries
the per-host result (plan.host_settings) that the deploy summary and `pdstack status` repeat.
"""

from __future__ import annotations

from typing import Any

from pdstack.controller.load.schema import Field, Schema

REBOOT_POLICIES = ("stop", "warn")
# NVIDIA's CUDA 13.0 release notes: CUDA 13.0 needs driver >= 580 on Linux; sm_120 (Blackwell RTX PRO) needs >= 570.
MIN_DRIVER_SM120 = 580
MIN_DRIVER_SOURCE = "CUDA 13.0 toolkit release notes, minimum Linux driver 580 (sm_120 with CUDA 13)"


def _kernel_arg(v: list) -> str | None:
    bad = [a for a in v if not isinstance(a, str) or not a or any(c.isspace() or c in "\"'\\$`" for c in a)]
    return None if not bad else f"{bad!r}: each kernel argument is one word without quotes, e.g. 'iommu=pt'"


HOST_SETTINGS = Schema("pdstack_host", {
    "reboot_policy": Field((str,), "when a wanted setting needs a reboot to be in force: stop (the run stops before "
                           "serving, naming the host and the settings; reboot, then run again) or warn (it serves "
                           "on, and the plan, the deploy summary and `pdstack status` say what waits for a reboot)",
                           default="stop", choices=REBOOT_POLICIES),
    "kernel_args": Field((list,), "kernel arguments the GRUB drop-in adds; unset: the GPU model's (RTX PRO 6000 "
                         "Blackwell: pcie_aspm=off pcie_port_pm=off iommu=pt), [] for none", default=None,
                         check=_kernel_arg),
    "acs_off": Field((bool,), "switch PCIe ACS off (setpci at boot) on the bridges above the GPUs that have it on; "
                     "unset: the GPU model's (true for PCIe-only Blackwell)", default=None),
    "uvm_disable_hmm": Field((bool,), "options nvidia_uvm uvm_disable_hmm=1 (modprobe.d)", default=True),
    "persistence_mode": Field((bool,), "nvidia-smi persistence mode on every GPU", default=True),
    "driver_branch": Field((int,), "the NVIDIA driver branch the hosts must run (major version, e.g. 580); unset: "
                           "the GPU model's", default=None,
                           check=lambda v: None if v >= MIN_DRIVER_SM120 else
                           f"{v} is older than {MIN_DRIVER_SM120} ({MIN_DRIVER_SOURCE})"),
})

# Safe defaults per GPU model (matched on nvidia-smi's name): docs/facts.md#pcie-host-settings.
MODELS = {
    "RTX PRO 6000 Blackwell": {"kernel_args": ["pcie_aspm=off", "pcie_port_pm=off", "iommu=pt"], "acs_off": True,
                               "driver_branch": 580, "min_bar1_mib": 65536},
}
OTHER = {"kernel_args": [], "acs_off": False, "driver_branch": MIN_DRIVER_SM120, "min_bar1_mib": 0}


def model_defaults(facts: dict) -> tuple[str, dict[str, Any]]:
    """(model name, its defaults) from the host's first GPU; "none" (nothing to change) without an NVIDIA GPU."""
    gpus = facts.get("gpus") or []
    if facts.get("gpu_source") != "nvidia-smi" or not gpus:
        return "none", {"kernel_args": [], "acs_off": False, "driver_branch": None, "min_bar1_mib": 0}
    name = str(gpus[0].get("name", ""))
    for key, d in MODELS.items():
        if key in name:
            return key, d
    return name or "unknown", OTHER


def _arg_in_force(arg: str, running: dict[str, str]) -> bool:
    name, _, value = arg.partition("=")
    return name in running and running[name] == value


def wanted(settings: dict[str, Any], facts: dict) -> dict[str, Any]:
    """One host's wanted state and how it compares with the running one: {gpu_model, kernel_args, acs_bridges,
    modprobe, persistence_mode, driver_branch, min_bar1_mib, reboot_policy, and the settings by state: in_force,
    applied_now (the host role applies them this run: ACS off, persistence mode), pending_reboot (kernel arguments
    not in the running command line: only a reboot brings them), unknown (not read)}."""
    model, d = model_defaults(facts)
    host = facts.get("host") if isinstance(facts.get("host"), dict) else {}
    gpu = model != "none"
    kargs = settings.get("kernel_args")
    kargs = list(d["kernel_args"] if kargs is None else kargs) if gpu else []
    acs_off = d["acs_off"] if settings.get("acs_off") is None else settings["acs_off"]
    # every bridge above a GPU with an ACS capability, on or off now: the unit keeps it off, and the list stays the
    # same once it is (a second run renders the same unit)
    acs = {b["bdf"]: b.get("acs") for g in host.get("gpus") or [] for b in g.get("bridges") or []
           if b.get("acs") in ("on", "off")}
    bridges = sorted(acs) if acs_off and gpu else []
    out: dict[str, Any] = {
        "gpu_model": model, "kernel_args": kargs, "acs_bridges": bridges,
        "modprobe": ["options nvidia_uvm uvm_disable_hmm=1"] if gpu and settings.get("uvm_disable_hmm", True) else [],
        "persistence_mode": bool(gpu and settings.get("persistence_mode", True)),
        "driver_branch": (settings.get("driver_branch") or d["driver_branch"]) if gpu else None,
        "min_bar1_mib": d["min_bar1_mib"], "reboot_policy": settings.get("reboot_policy") or "stop",
        "in_force": [], "applied_now": [], "pending_reboot": [], "unknown": []}
    cmdline = host.get("cmdline")
    running = host.get("kernel_args") if isinstance(host.get("kernel_args"), dict) else {}
    for a in kargs:
        if not cmdline or cmdline == "unknown":
            out["unknown"].append(f"kernel argument {a} (the running command line was not read)")
        elif _arg_in_force(a, running):
            out["in_force"].append(f"kernel argument {a}")
        else:
            out["pending_reboot"].append(f"kernel argument {a} (not in /proc/cmdline: the GRUB drop-in takes effect "
                                         "at the next boot)")
    on = [b for b in bridges if acs[b] == "on"]
    if bridges:
        out["applied_now" if on else "in_force"].append(
            f"ACS off on {', '.join(on)} (the pdstack-acs unit, now and at every boot)" if on else
            f"ACS off on {', '.join(bridges)}")
    pm = [g.get("persistence") for g in host.get("gpus") or []]
    if out["persistence_mode"] and pm:
        out["in_force" if all(x == "Enabled" for x in pm) else "applied_now"].append("persistence mode on")
    if out["modprobe"]:
        uvm = host.get("uvm_disable_hmm")  # the loaded module's parameter (facts: /sys/module/nvidia_uvm)
        line = "options nvidia_uvm uvm_disable_hmm=1"
        if uvm in ("Y", "1"):
            out["in_force"].append(line)
        elif uvm in ("N", "0"):
            out["pending_reboot"].append(f"{line} (the loaded nvidia_uvm has uvm_disable_hmm=N: it reads the option "
                                         "at its next load)")
        else:
            out["unknown"].append(f"{line} (nvidia_uvm not loaded, or not read: in force at its next load)")
    return out


def driver_major(version: Any) -> int | None:
    try:
        return int(str(version).split(".")[0])
    except ValueError:
        return None


def reboot_warnings(per_host: dict[str, dict[str, Any]]) -> list[str]:
    """The plan's loud lines for reboot_policy warn: per host, what waits for a reboot."""
    return [f"host {h}: REBOOT NEEDED, serving without {', '.join(w['pending_reboot'])} (pdstack_host.reboot_policy "
            "warn); reboot it, then run again" for h, w in sorted(per_host.items())
            if w["pending_reboot"] and w["reboot_policy"] == "warn"]
