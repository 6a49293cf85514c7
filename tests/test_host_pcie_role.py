"""The host role's PCIe tasks (roles/host/tasks/pcie.yml) run for real by ansible-playbook on the controller, into
a scratch directory (tests/playbooks/host_pcie.yml): the GRUB drop-in and modprobe.d file written from the plan's
host_settings, a second run and a check-mode run changing nothing, the reboot report per policy (warn serves on
loudly, stop fails before serving), nothing wanted on a host without a GPU, the ACS unit skipped with its reason.
Not here: update-grub, setpci and the persistence daemon on a real GPU host (no such host at hand)."""

from __future__ import annotations

import copy
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import jinja2
import pytest

from pdstack.controller.load import host_settings

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
STOCK = json.loads((ROOT / "tests/topologies/reference-2node-8gpu-stock-pcie.json").read_text())


def play(tmp_path: Path, pcie: dict, *extra: str) -> tuple[subprocess.CompletedProcess, dict]:
    xv = {"host_pcie": pcie, "host_gpu": False, "host_grub_dropin": str(tmp_path / "grub.d/pdstack.cfg"),
          "host_modprobe_file": str(tmp_path / "modprobe.d/pdstack.conf"),
          "host_update_grub": f"touch {tmp_path / 'update-grub-ran'}", "ansible_python_interpreter": sys.executable}
    (tmp_path / "modprobe.d").mkdir(exist_ok=True)
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"}
    p = subprocess.run([str(BIN / "ansible-playbook"), "tests/playbooks/host_pcie.yml", "-i", "localhost,",
                        "-e", json.dumps(xv), *extra], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    recap = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", p.stdout)
    assert recap, p.stdout + p.stderr
    p.stdout = " ".join(p.stdout.split())  # the callback wraps long messages: compare words
    return p, dict(zip(("ok", "changed", "failed"), map(int, recap.groups()), strict=True))


@pytest.mark.slow
def test_drop_ins_written_once_then_nothing_changes_and_the_reboot_is_reported(tmp_path):
    pcie = host_settings.wanted({"reboot_policy": "warn"}, STOCK) | {"acs_bridges": []}
    p, r = play(tmp_path, pcie)
    assert r["failed"] == 0 and r["changed"] >= 2, p.stdout
    grub = (tmp_path / "grub.d/pdstack.cfg").read_text()
    assert 'GRUB_CMDLINE_LINUX="${GRUB_CMDLINE_LINUX:+$GRUB_CMDLINE_LINUX }pcie_aspm=off pcie_port_pm=off iommu=pt"' \
        in grub and "Ansible managed" in grub
    assert "options nvidia_uvm uvm_disable_hmm=1" in (tmp_path / "modprobe.d/pdstack.conf").read_text()
    assert (tmp_path / "update-grub-ran").exists()  # the handler ran for the new drop-in
    assert "REBOOT NEEDED, serving on without them (pdstack_host.reboot_policy warn)" in p.stdout
    assert "waiting for a reboot: kernel argument pcie_aspm=off" in p.stdout
    assert "no PCI bridge with an ACS capability above a GPU" in p.stdout
    (tmp_path / "update-grub-ran").unlink()
    p, r = play(tmp_path, pcie)
    assert r["changed"] == 0 and r["failed"] == 0, p.stdout
    assert not (tmp_path / "update-grub-ran").exists()
    p, r = play(tmp_path, pcie, "--check")
    assert r["changed"] == 0 and r["failed"] == 0, p.stdout
    # reboot_policy stop: the host fails before serving, naming the settings and the reboot
    p, r = play(tmp_path, {**pcie, "reboot_policy": "stop"})
    assert r["failed"] == 1 and "needs a reboot before it serves: kernel argument pcie_aspm=off" in p.stdout
    assert "pdstack never reboots by itself" in p.stdout
    # after the reboot (the facts show the arguments running): nothing waits, nothing fails
    tuned = copy.deepcopy(STOCK)
    tuned["host"]["kernel_args"].update({"pcie_aspm": "off", "pcie_port_pm": "off", "iommu": "pt"})
    tuned["host"]["uvm_disable_hmm"] = "Y"
    after = host_settings.wanted({}, tuned) | {"acs_bridges": []}
    p, r = play(tmp_path, after)
    assert r["failed"] == 0 and r["changed"] == 0 and "waiting for a reboot: none" in p.stdout, p.stdout


@pytest.mark.slow
def test_a_host_without_a_gpu_wants_nothing(tmp_path):
    cpu = host_settings.wanted({}, {"gpu_source": "simulated", "gpus": [{"index": 0}]})
    (tmp_path / "grub.d").mkdir()
    (tmp_path / "grub.d/pdstack.cfg").write_text("left over\n")
    p, r = play(tmp_path, cpu)
    assert r["failed"] == 0 and not (tmp_path / "grub.d/pdstack.cfg").exists()
    assert "no pdstack-acs unit: no NVIDIA GPU (gpu_model none)" in p.stdout
    p, r = play(tmp_path, cpu)
    assert r["changed"] == 0, p.stdout


def test_the_acs_unit_names_exactly_the_bridges_of_the_plan():
    pcie = host_settings.wanted({}, STOCK)
    env = jinja2.Environment(loader=jinja2.FileSystemLoader(ROOT / "roles/host/templates"), keep_trailing_newline=True)
    env.filters["comment"] = lambda s: f"#\n# {s}\n#"  # Ansible's comment filter, its default form
    text = env.get_template("etc/systemd/system/pdstack-acs.service.j2").render(
        host_pcie=pcie, host_setpci="/usr/bin/setpci", ansible_managed="Ansible managed")
    execs = [line for line in text.splitlines() if line.startswith("ExecStart=")]
    assert execs == [f"ExecStart=/usr/bin/setpci -s {b} ECAP_ACS+0x6.w=0000" for b in pcie["acs_bridges"]]
    assert len(execs) == 8 and "Type=oneshot" in text and "WantedBy=multi-user.target" in text
