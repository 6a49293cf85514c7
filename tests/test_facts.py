"""The facts script on a recorded sysfs tree and a fake nvidia-smi."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
from pathlib import Path

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
    # it is installed as /etc/ansible/facts.d/pdstack.fact and run by the host's python3, outside any venv
    script = ROOT / "roles" / "facts" / "files" / "pdstack.fact"
    assert script.resolve() == (ROOT / "pdstack" / "hostside" / "facts.py").resolve()
    out = subprocess.run(["/usr/bin/python3", "-I", str(script), "--simulate-gpus", "2"], capture_output=True,
                         text=True, timeout=60, cwd="/")
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert data["schema"] == facts.SCHEMA and data["numa_nodes"] and len(data["gpus"]) == 2


def test_recorded_reference_topology_matches_the_schema():
    ref = json.loads((ROOT / "tests/topologies/reference-2node-8gpu.json").read_text())
    assert set(ref) == {"schema", "hostname", "mem_total_mb", "numa_nodes", "gpus", "gpu_source"}
    assert [g["numa_node"] for g in ref["gpus"]] == [0, 0, 0, 0, 1, 1, 1, 1]
    assert sys.version_info >= (3, 11)
