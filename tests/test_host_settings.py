"""The PCIe host settings (pdstack_host): the wanted state per GPU model against a host's recorded facts, the plan's
per-host report (in force, applied now, waiting for a reboot), the reboot policy's warning, preflight's refusals
(old driver, small BAR1, a translating IOMMU nothing fixes, ACS on with acs_off false) and the inventory's checks."""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from pdstack.controller import pipeline
from pdstack.controller.load import host_settings, inventory
from pdstack.controller.plan import planner
from pdstack.controller.plan.text import render_text
from pdstack.errors import InventoryError
from pdstack.hostside import facts as hostfacts

ROOT = Path(__file__).resolve().parents[1]
STOCK = json.loads((ROOT / "tests/topologies/reference-2node-8gpu-stock-pcie.json").read_text())
DATA = ROOT / "tests" / "facts_data"
ROOT_PORTS = sorted(b["bdf"] for g in STOCK["host"]["gpus"] for b in g["bridges"])


def tuned() -> dict:
    """The same box after pdstack's host phase and a reboot: the drop-in's arguments running, the IOMMU in
    passthrough, ACS off at the root ports, persistence mode on."""
    f = copy.deepcopy(STOCK)
    cmd = (DATA / "proc-cmdline-tuned.txt").read_text().strip()
    f["host"].update(cmdline=cmd, kernel_args=hostfacts.kernel_args(cmd), iommu="passthrough", uvm_disable_hmm="Y")
    for g in f["host"]["gpus"]:
        g["persistence"] = "Enabled"
        for b in g["bridges"]:
            b["acs"] = hostfacts.acs_state(b["acsctl"].replace("ReqRedir+", "ReqRedir-").replace("CmpltRedir+",
                                                                                                  "CmpltRedir-"))
    return f


def dep_with(tmp_path: Path, **host: object) -> inventory.Deployment:
    inv = tmp_path / "p"
    shutil.copytree(ROOT / "inventory" / "production", inv)
    if host:
        (inv / "group_vars/all/host.yml").write_text(yaml.safe_dump({"pdstack_host": host}))
    return inventory.load(inv)


def plan_of(dep: inventory.Deployment, f: dict) -> planner.Plan:
    return pipeline.make_plan(dep, dict.fromkeys(dep.hosts, f))


def test_a_stock_box_wants_the_models_defaults_and_waits_for_a_reboot(tmp_path):
    p = plan_of(dep_with(tmp_path), STOCK)
    w = p.host_settings["gpu01"]
    assert w["gpu_model"] == "RTX PRO 6000 Blackwell" and w["reboot_policy"] == "stop"
    assert w["kernel_args"] == ["pcie_aspm=off", "pcie_port_pm=off", "iommu=pt"] and w["driver_branch"] == 580
    assert w["acs_bridges"] == ROOT_PORTS and w["modprobe"] == ["options nvidia_uvm uvm_disable_hmm=1"]
    assert [x.split(" (")[0] for x in w["pending_reboot"]] == [f"kernel argument {a}" for a in w["kernel_args"]] + [
        "options nvidia_uvm uvm_disable_hmm=1"]
    assert any(x.startswith("ACS off on 0000:00:01.1") for x in w["applied_now"]) and "persistence mode on" in \
        w["applied_now"]
    assert not any("REBOOT NEEDED" in x for x in p.warnings)  # stop: the host role stops; no serving to warn about
    text = render_text(p)
    assert "host gpu01: PCIe settings for RTX PRO 6000 Blackwell (reboot policy stop)" in text
    assert "  waiting for a reboot: kernel argument pcie_aspm=off" in text and "  in force: none" in text
    assert planner.schema_problems(p.to_dict()) == []


def test_after_the_reboot_everything_is_in_force_and_the_rendered_state_is_the_same(tmp_path):
    dep = dep_with(tmp_path)
    rebooted = plan_of(dep, tuned())
    before, after = plan_of(dep, STOCK).host_settings["gpu01"], rebooted.host_settings["gpu01"]
    # the deploy summary (the plan's text) says per host what is in force and that nothing waits
    text = render_text(rebooted).splitlines()
    at = text.index("host gpu01: PCIe settings for RTX PRO 6000 Blackwell (reboot policy stop): kernel pcie_aspm=off "
                    f"pcie_port_pm=off iommu=pt; ACS off on {', '.join(ROOT_PORTS)}; driver branch 580")
    assert text[at + 1].startswith("  in force: kernel argument pcie_aspm=off; kernel argument pcie_port_pm=off; "
                                   "kernel argument iommu=pt; ACS off on ") and "persistence mode on" in text[at + 1]
    assert text[at + 2] == "  waiting for a reboot: none"
    assert after["pending_reboot"] == [] and after["applied_now"] == []
    assert "kernel argument iommu=pt" in after["in_force"] and "persistence mode on" in after["in_force"]
    assert "options nvidia_uvm uvm_disable_hmm=1" in after["in_force"] and after["unknown"] == []
    assert f"ACS off on {', '.join(ROOT_PORTS)}" in after["in_force"]
    # what the host role renders does not depend on whether ACS is on now: a second run changes nothing
    assert {k: before[k] for k in ("kernel_args", "acs_bridges", "modprobe")} == \
        {k: after[k] for k in ("kernel_args", "acs_bridges", "modprobe")}


def test_reboot_policy_warn_serves_on_with_a_loud_warning(tmp_path):
    p = plan_of(dep_with(tmp_path, reboot_policy="warn"), STOCK)
    warn = [w for w in p.warnings if "REBOOT NEEDED" in w]
    assert len(warn) == 1 and warn[0].startswith("host gpu01: REBOOT NEEDED, serving without kernel argument "
                                                 "pcie_aspm=off") and "reboot_policy warn" in warn[0]
    assert f"warning: {warn[0]}" in render_text(p)
    assert not [w for w in plan_of(dep_with(tmp_path / "t", reboot_policy="warn"), tuned()).warnings
                if "REBOOT" in w]


def test_inventory_settings_override_the_models_and_a_cpu_host_gets_none(tmp_path):
    w = plan_of(dep_with(tmp_path, kernel_args=["pcie_aspm=off", "iommu=pt"], acs_off=True, uvm_disable_hmm=False,
                         persistence_mode=False, driver_branch=580), tuned()).host_settings["gpu01"]
    assert (w["kernel_args"], w["modprobe"], w["persistence_mode"], w["driver_branch"]) == (
        ["pcie_aspm=off", "iommu=pt"], [], False, 580)
    # a newer driver than the pinned branch serves, with a warning naming both
    p = plan_of(dep_with(tmp_path / "n"), _facts(lambda h: h.update(driver_version="590.44.01")))
    assert any("driver 590.44.01" in x and "branch 580" in x for x in p.warnings), p.warnings
    cpu = host_settings.wanted({}, {"gpu_source": "simulated", "gpus": [{"index": 0, "name": "simulated"}]})
    assert (cpu["gpu_model"], cpu["kernel_args"], cpu["acs_bridges"], cpu["modprobe"], cpu["persistence_mode"]) == (
        "none", [], [], [], False)


def _facts(mutate) -> dict:
    f = copy.deepcopy(tuned())
    mutate(f["host"])
    return f


@pytest.mark.parametrize("host, mutate, words", [
    ({}, lambda h: h.update(driver_version="575.57.08"),
     ["NVIDIA driver 575.57.08 is older than branch 580", "CUDA 13.0", "nvidia-driver-580-open", "driver_branch"]),
    ({}, lambda h: h["gpus"][3].update(bar1_mib=256),
     ["GPU(s) 3 (BAR1 256 MiB) cannot map a peer's memory", "Resizable BAR", "Above 4G"]),
    ({"kernel_args": ["pcie_aspm=off"]}, lambda h: h.update(iommu="translated"),
     ["IOMMU translates the GPUs' DMA", "kernel_args has no iommu=pt", "add iommu=pt"]),
    ({"acs_off": False}, lambda h: h["gpus"][0]["bridges"][0].update(acs="on"),
     ["ACS is on at PCI bridge(s) 0000:00:01.1", "acs_off is false", "acs_off: true"]),
], ids=["old-driver", "small-bar1", "iommu-translated-unfixed", "acs-on-kept"])
def test_preflight_refuses_what_cannot_work_with_the_fix(tmp_path, host, mutate, words):
    with pytest.raises(InventoryError) as e:
        plan_of(dep_with(tmp_path, **host), _facts(mutate))
    msg = str(e.value)
    assert all(w in msg for w in words), msg


def test_a_translating_iommu_the_drop_in_fixes_is_a_pending_reboot_one_it_cannot_is_refused(tmp_path):
    # iommu=pt is already on the running command line and the GPUs still translate: no reboot helps
    with pytest.raises(InventoryError) as e:
        plan_of(dep_with(tmp_path), _facts(lambda h: h.update(iommu="translated")))
    assert all(w in str(e.value) for w in ("host gpu01: the IOMMU translates the GPUs' DMA", "iommu_group/type",
                                           "running kernel command line has iommu=pt: a reboot will not change it",
                                           "switch the IOMMU off in the firmware")), str(e.value)
    p = plan_of(dep_with(tmp_path / "s"), STOCK)  # the stock box: translating, iommu=pt not yet on the command line
    assert any("iommu=pt" in x for x in p.host_settings["gpu01"]["pending_reboot"])


@pytest.mark.parametrize("host, words", [
    ({"reboot_policy": "later"}, ["pdstack_host.reboot_policy", "stop", "warn"]),
    ({"driver_branch": 570}, ["pdstack_host.driver_branch", "older than 580"]),
    ({"kernel_args": ["iommu=pt quiet"]}, ["pdstack_host.kernel_args", "one word"]),
    ({"acs_of": True}, ["pdstack_host", "acs_of"]),
], ids=["policy", "driver", "kernel-arg", "typo"])
def test_the_inventory_settings_are_checked(tmp_path, host, words):
    with pytest.raises(InventoryError) as e:
        dep_with(tmp_path, **host)
    assert all(w in str(e.value) for w in words), str(e.value)


def test_the_local_sim_plan_has_no_pcie_settings():
    dep = inventory.load(ROOT / "inventory" / "local")
    sim = {"schema": 1, "hostname": "x", "mem_total_mb": 8192, "gpu_source": "simulated",
           "numa_nodes": [{"id": 0, "cpus": "0-1", "mem_total_mb": 8192}],
           "gpus": [{"index": i, "name": "simulated", "pci_bus_id": f"sim:{i}", "numa_node": 0, "memory_mb": 0}
                    for i in range(8)]}
    p = pipeline.make_plan(dep, dict.fromkeys(dep.hosts, sim))
    assert {w["gpu_model"] for w in p.host_settings.values()} == {"none"}
