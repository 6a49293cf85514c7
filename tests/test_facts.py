"""The facts script on a recorded sysfs tree and a fake nvidia-smi."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

import site_helpers

from pdstack.hostside import facts

ROOT = Path(__file__).resolve().parents[1]


def make_sysfs(root: Path) -> Path:
    """A two-node host: node0 CPUs 0-3,8-11, node1 CPUs 4-7,12-15; GPU 0 on node0, GPU 1 on node1."""
    for nid, cpus, kb in ((0, "0-3,8-11", 64 * 1024 * 1024), (1, "4-7,12-15", 32 * 1024 * 1024)):
        d = root / f"devices/system/node/node{nid}"
        d.mkdir(parents=True)
        (d / "cpulist").write_text(cpus + "\n")
        (d / "meminfo").write_text(f"Node {nid} MemTotal:       {kb} kB\nNode {nid} MemFree: 1 kB\n")
    for bus, node in (("0000:17:00.0", 0), ("0000:ca:00.0", 1)):
        d = root / f"bus/pci/devices/{bus}"
        d.mkdir(parents=True)
        (d / "numa_node").write_text(f"{node}\n")
    return root


def fake_nvidia_smi(bindir: Path) -> None:
    bindir.mkdir()
    f = bindir / "nvidia-smi"
    f.write_text("#!/bin/sh\necho '0, NVIDIA RTX PRO 6000 Blackwell, 00000000:17:00.0, 97887'\n"
                 "echo '1, NVIDIA RTX PRO 6000 Blackwell, 00000000:CA:00.0, 97887'\n")
    f.chmod(f.stat().st_mode | stat.S_IEXEC)


def test_cpulist_roundtrip():
    assert facts.parse_cpulist("0-3,8,10-11") == [0, 1, 2, 3, 8, 10, 11]
    assert facts.format_cpulist([11, 0, 1, 2, 3, 8, 10]) == "0-3,8,10-11"
    assert facts.format_cpulist([]) == ""


def test_collect_reads_nodes_and_gpu_numa_nodes(tmp_path, monkeypatch):
    sysfs = make_sysfs(tmp_path / "sys")
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}{os.pathsep}{os.environ['PATH']}")
    f = facts.collect(str(sysfs), simulated=str(tmp_path / "none.json"))
    assert [n["cpus"] for n in f["numa_nodes"]] == ["0-3,8-11", "4-7,12-15"]
    assert [n["mem_total_mb"] for n in f["numa_nodes"]] == [65536, 32768]
    assert [(g["index"], g["numa_node"], g["pci_bus_id"]) for g in f["gpus"]] == [
        (0, 0, "0000:17:00.0"), (1, 1, "0000:ca:00.0")]
    assert f["gpu_source"] == "nvidia-smi"


def test_simulated_gpus_only_without_real_ones(tmp_path, monkeypatch):
    sysfs = make_sysfs(tmp_path / "sys")
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # no nvidia-smi
    sim = tmp_path / "simulated-gpus.json"
    assert facts.collect(str(sysfs), simulated=str(sim))["gpus"] == []
    sim.write_text(json.dumps({"count": 3}))
    f = facts.collect(str(sysfs), simulated=str(sim))
    assert f["gpu_source"] == "simulated" and len(f["gpus"]) == 3
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    assert facts.collect(str(sysfs), simulated=str(sim))["gpu_source"] == "nvidia-smi"


def test_script_runs_standalone_with_system_python_and_prints_json():
    # /etc/ansible/facts.d/pdstack.fact runs the host-side artifact's `facts` with the host's python3, outside any venv
    wrapper = (ROOT / "roles/facts/templates/etc/ansible/facts.d/pdstack.fact.j2").read_text()
    assert "exec {{ facts_python }} -I {{ facts_hostside.path }} facts\n" in wrapper
    out = subprocess.run(["/usr/bin/python3", "-I", str(site_helpers.hostside_artifact()), "facts",
                          "--simulate-gpus", "2"], capture_output=True, text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == facts.SCHEMA and data["numa_nodes"] and len(data["gpus"]) == 2


def test_recorded_reference_topology_matches_the_schema():
    ref = json.loads((ROOT / "tests/topologies/reference-2node-8gpu.json").read_text())
    assert set(ref) == {"schema", "hostname", "mem_total_mb", "numa_nodes", "gpus", "gpu_source"}
    assert [g["numa_node"] for g in ref["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert sys.version_info >= (3, 11)


# ---------------------------------------------------------------- PCIe host settings, on recorded tool output

DATA = ROOT / "tests" / "facts_data"


def make_pci_tree(root: Path, iommu_type: str = "identity") -> Path:
    """GPU 0000:01:00.0 under root port 0000:00:01.1; GPU 0000:04:00.0 behind a switch (root port 0000:00:03.1,
    upstream 0000:02:00.0, downstream 0000:03:00.0), as sysfs links them; each GPU in an IOMMU group of that type."""
    for chain in (["0000:00:01.1", "0000:01:00.0"], ["0000:00:03.1", "0000:02:00.0", "0000:03:00.0", "0000:04:00.0"]):
        d = root / "devices" / "pci0000:00" / Path(*chain)
        d.mkdir(parents=True)
        (d / "numa_node").write_text("0\n")
        (root / "bus/pci/devices").mkdir(parents=True, exist_ok=True)
        (root / "bus/pci/devices" / chain[-1]).symlink_to(d)
        group = root / "kernel/iommu_groups" / str(len(chain))
        (group / "devices").mkdir(parents=True)
        (group / "type").write_text(iommu_type + "\n")
        (d / "iommu_group").symlink_to(group)
    (root / "module/pcie_aspm/parameters").mkdir(parents=True)
    (root / "module/pcie_aspm/parameters/policy").write_text((DATA / "aspm-policy-performance.txt").read_text())
    (root / "module/nvidia_uvm/parameters").mkdir(parents=True)
    (root / "module/nvidia_uvm/parameters/uvm_disable_hmm").write_text("Y\n")
    return root


def fake_tools(bindir: Path) -> None:
    """nvidia-smi and lspci printing the recorded outputs for the arguments pdstack passes."""
    bindir.mkdir()
    smi = bindir / "nvidia-smi"
    smi.write_text("#!/bin/sh\ncase \"$*\" in\n"
                   "  -q) cat " + str(DATA / "nvidia-smi-q-two-gpus.txt") + ";;\n"
                   "  'topo -p2p r') cat " + str(DATA / "nvidia-smi-topo-p2p-r-8gpu.txt") + ";;\n"
                   "  'topo -m') cat " + str(DATA / "nvidia-smi-topo-m-8gpu.txt") + ";;\n"
                   "  *) echo '0, NVIDIA RTX PRO 6000 Blackwell, 00000000:01:00.0, 97887'\n"
                   "     echo '1, NVIDIA RTX PRO 6000 Blackwell, 00000000:04:00.0, 97887';;\nesac\n")
    lspci = bindir / "lspci"
    lspci.write_text(f"#!/bin/sh\n[ \"$*\" = '-D -vvv' ] && cat {DATA / 'lspci-vvv-two-gpus.txt'}\n")
    for f in (smi, lspci):
        f.chmod(f.stat().st_mode | stat.S_IEXEC)


def test_kernel_args_and_iommu_mode_from_recorded_command_lines():
    tuned = facts.kernel_args((DATA / "proc-cmdline-tuned.txt").read_text())
    assert tuned["pcie_aspm"] == "off" and tuned["pcie_port_pm"] == "off" and tuned["iommu"] == "pt"
    assert tuned["ro"] == "" and facts.kernel_args("iommu=on iommu=pt")["iommu"] == "pt"  # the last one wins
    stock = facts.kernel_args((DATA / "proc-cmdline-stock.txt").read_text())
    # the groups' domain types decide when the kernel has them; the command line only without them
    assert facts.iommu_mode(stock, ["DMA-FQ", "identity"], True) == "translated"
    assert facts.iommu_mode(stock, ["identity", "identity"], True) == "passthrough"
    assert facts.iommu_mode(tuned, [], True) == "passthrough"
    assert facts.iommu_mode(stock, [], False) == "off" and facts.iommu_mode({"amd_iommu": "off"}, [], None) == "off"
    assert facts.iommu_mode(stock, [], True) == "unknown"


def test_acs_from_recorded_lspci():
    acs = facts.lspci_acs((DATA / "lspci-vvv-two-gpus.txt").read_text())
    assert set(acs) == {"0000:00:01.1", "0000:00:03.1", "0000:03:00.0"}  # the switch's upstream port has no ACS
    assert [facts.acs_state(acs.get(b)) for b in ("0000:00:01.1", "0000:00:03.1", "0000:02:00.0", "0000:03:00.0")] \
        == ["on", "off", "none", "on"]
    denied = facts.lspci_acs("0000:00:01.1 PCI bridge: AMD\n\tCapabilities: <access denied>\n")
    assert facts.acs_state(denied["0000:00:01.1"]) == "unknown"  # lspci without root shows no capability


def test_bar1_persistence_and_driver_from_recorded_nvidia_smi_q():
    q = facts.smi_q((DATA / "nvidia-smi-q-two-gpus.txt").read_text())
    assert q["driver_version"] == "580.95.05"
    assert q["gpus"] == {"0000:01:00.0": {"bar1_mib": 131072, "persistence": "Enabled"},
                         "0000:04:00.0": {"bar1_mib": 256, "persistence": "Disabled"}}


def test_p2p_and_link_matrices_from_recorded_topo():
    p2p = facts.gpu_matrix((DATA / "nvidia-smi-topo-p2p-r-8gpu.txt").read_text())
    assert sorted(p2p) == [f"GPU{i}" for i in range(8)] and p2p["GPU0"]["GPU0"] == "X" and p2p["GPU3"]["GPU7"] == "OK"
    links = facts.gpu_matrix((DATA / "nvidia-smi-topo-m-8gpu.txt").read_text())
    assert links["GPU0"]["GPU3"] == "NODE" and links["GPU0"]["GPU4"] == "SYS" and links["GPU7"]["GPU6"] == "NODE"
    assert set(links["GPU5"]) == {f"GPU{i}" for i in range(8)}  # CPU/NUMA affinity columns are not GPUs
    assert facts.gpu_matrix("") == "unknown"
    assert facts.gpu_matrix("\tGPU0\nGPU0\t X \t0-7\t0\n") == {"GPU0": {"GPU0": "X"}}  # one GPU


def test_host_settings_on_a_recorded_box(tmp_path, monkeypatch):
    sysfs = make_pci_tree(tmp_path / "sys")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/cmdline").write_text((DATA / "proc-cmdline-tuned.txt").read_text())
    fake_tools(tmp_path / "bin")
    monkeypatch.setenv("PATH", f"{tmp_path / 'bin'}:/usr/bin:/bin")
    gpus = [{"index": 0, "pci_bus_id": "0000:01:00.0"}, {"index": 1, "pci_bus_id": "0000:04:00.0"}]
    h = facts.host_settings(gpus, str(sysfs), str(tmp_path / "proc"))
    assert h["iommu"] == "passthrough" and h["aspm_policy"] == "performance" and h["driver_version"] == "580.95.05"
    assert h["kernel_args"]["pcie_port_pm"] == "off" and h["p2p"]["GPU1"]["GPU0"] == "OK"
    assert h["uvm_disable_hmm"] == "Y"
    assert [(g["index"], g["bar1_mib"], g["persistence"]) for g in h["gpus"]] == [(0, 131072, "Enabled"),
                                                                                  (1, 256, "Disabled")]
    assert [(b["bdf"], b["acs"]) for b in h["gpus"][1]["bridges"]] == [
        ("0000:00:03.1", "off"), ("0000:02:00.0", "none"), ("0000:03:00.0", "on")]
    assert [(b["bdf"], b["acs"]) for b in h["gpus"][0]["bridges"]] == [("0000:00:01.1", "on")]
    translated = make_pci_tree(tmp_path / "sys2", iommu_type="DMA-FQ")
    assert facts.host_settings(gpus, str(translated), str(tmp_path / "proc"))["iommu"] == "translated"


def test_a_cpu_host_without_the_tools_is_unknown_not_a_crash(tmp_path, monkeypatch):
    sysfs = make_sysfs(tmp_path / "sys")
    monkeypatch.setenv("PATH", "/nonexistent")
    f = facts.collect(str(sysfs), simulated=str(tmp_path / "none.json"), simulate_gpus=2, proc=str(tmp_path))
    h = f["host"]
    assert (h["cmdline"], h["iommu"], h["aspm_policy"], h["uvm_disable_hmm"], h["driver_version"], h["p2p"],
            h["links"], h["gpus"]) == ("unknown",) * 7 + ([],)
    # real GPUs but no lspci and an nvidia-smi that only lists them: ACS unknown, BAR1 None, nothing raised
    fake_nvidia_smi(tmp_path / "bin")
    monkeypatch.setenv("PATH", str(tmp_path / "bin"))
    h = facts.host_settings([{"index": 0, "pci_bus_id": "0000:17:00.0"}], str(make_pci_tree(tmp_path / "s3")))
    assert h["gpus"] == [{"index": 0, "bar1_mib": None, "persistence": "unknown", "bridges": []}]
