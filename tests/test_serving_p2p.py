"""The serving role's P2P gate (roles/serving/tasks/p2p.yml) run for real by ansible-playbook on the controller
(tests/playbooks/serving_p2p.yml), with a stand-in docker that answers `ps` and `run` from files: skipped with its
reason where there is nothing to measure (the sim engine) and where servers already run; on a GPU host's plan the
container gets exactly the plan's GPUs and the gate file, a pass prints the numbers, a pair under its floor fails the
host naming the two GPUs and the numbers. Not here: the measurement on GPUs (tests/test_p2p.py's GPU tests)."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from pdstack.controller import pipeline
from pdstack.controller.load import inventory
from pdstack.controller.load.facts import load_facts
from pdstack.image import p2p

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent
FAKE_DOCKER = """#!/bin/sh
# a stand-in docker: `ps` prints ps.txt, `run` records its argv and prints run.json, exiting with run.rc
d=$(dirname "$0")
case "$1" in
  ps) cat "$d/ps.txt" ;;
  run) printf '%s\\n' "$@" > "$d/run.argv"; cat "$d/run.json"; exit "$(cat "$d/run.rc")" ;;
  *) echo "unexpected docker $*" >&2; exit 9 ;;
esac
"""


def gate_of(inv: str, topo: str) -> dict:
    dep = inventory.load(ROOT / inv)
    plan = pipeline.make_plan(dep, load_facts(ROOT / "tests/topologies" / topo, list(dep.hosts)))
    (host,) = [h for h, g in plan.p2p.items() if g["devices"]]
    return plan.p2p[host]


def play(tmp_path: Path, gate: dict, ps: str = "", run: dict | None = None, rc: int = 0,
         ) -> tuple[subprocess.CompletedProcess, dict]:
    docker = tmp_path / "docker"
    docker.write_text(FAKE_DOCKER)
    docker.chmod(0o755)
    (tmp_path / "ps.txt").write_text(ps)
    (tmp_path / "run.json").write_text("" if run is None else json.dumps(run))
    (tmp_path / "run.rc").write_text(str(rc))
    xv = {"serving_p2p": gate, "serving_image": "pdstack/prod:test", "serving_docker": str(docker),
          "serving_p2p_file": str(tmp_path / "p2p.json"), "ansible_python_interpreter": sys.executable}
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", "ANSIBLE_STDOUT_CALLBACK": "default"}
    p = subprocess.run([str(BIN / "ansible-playbook"), "tests/playbooks/serving_p2p.yml", "-i", "localhost,",
                        "-e", json.dumps(xv)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    recap = re.search(r"localhost\s*:\s*ok=(\d+)\s+changed=(\d+)\s+unreachable=\d+\s+failed=(\d+)", p.stdout)
    assert recap, p.stdout + p.stderr
    p.stdout = " ".join(p.stdout.split())  # the callback wraps long messages: compare words
    return p, dict(zip(("ok", "changed", "failed"), map(int, recap.groups()), strict=True))


def result(gate: dict, slow: dict[tuple[int, int], float]) -> dict:
    """What p2p.py --json prints for the gate: every pair at 55 / 45 GB/s, all-reduce 50, except the slow ones."""
    pairs = [dict(p, gbs_ab=slow.get((p["a"], p["b"]), 55.0 if p["node_a"] == p["node_b"] else 45.0),
                  gbs_ba=55.0 if p["node_a"] == p["node_b"] else 45.0) for p in gate["pairs"]]
    groups = [dict(g, busbw_gbs=50.0) for g in gate["groups"]]
    out = {"pairs": pairs, "groups": groups, "failures": p2p.judge(pairs, groups)}
    out["passed"] = not out["failures"]
    return {**out, "report": p2p.report(out).splitlines()}


@pytest.mark.slow
def test_the_gate_runs_the_plans_gpus_passes_or_fails_naming_the_pair_and_skips_with_its_reason(tmp_path):
    gate = gate_of("inventory/production", "reference-2node-8gpu.json")
    # a pass: the container gets exactly the plan's GPUs and the gate file, and the numbers are printed
    p, r = play(tmp_path, gate, run=result(gate, {}))
    assert r["failed"] == 0, p.stdout
    argv = (tmp_path / "run.argv").read_text().splitlines()
    assert argv[argv.index("--gpus") + 1] == '"device=0,1,2,3,4,5,6,7"'
    assert f"{tmp_path / 'p2p.json'}:/etc/pdstack/p2p.json:ro" in argv
    assert argv[argv.index("pdstack/prod:test"):][:9] == ["pdstack/prod:test", "timeout", "--signal=KILL", "600",
                                                         "python3", "-m", "pdstack.image.p2p", "--gate",
                                                         "/etc/pdstack/p2p.json"]
    assert json.loads((tmp_path / "p2p.json").read_text()) == gate
    assert "localhost: P2P gate passed" in p.stdout and "GPU 0 <-> GPU 4 (KV transfer prefill-0 -> decode-0, " \
        "across NUMA nodes): 45.0 / 45.0 GB/s, floor 31.2" in p.stdout
    # a KV-transfer pair under its floor fails the host before serving, naming both GPUs and the numbers
    p, r = play(tmp_path, gate, run=result(gate, {(2, 6): 20.5}), rc=1)
    assert r["failed"] == 1, p.stdout
    assert "the P2P gate failed, the servers do not start: GPU 2 -> GPU 6 (KV transfer prefill-0 -> decode-0): " \
        "20.50 GB/s, under its floor 31.20 GB/s (across NUMA nodes)" in p.stdout
    # p2p.py gave no result (misuse, a crash): the exit status is in the message
    (tmp_path / "run.argv").unlink()
    p, r = play(tmp_path, gate, run=None, rc=2)
    assert r["failed"] == 1 and "the P2P gate failed, the servers do not start: no result (exit 2)" in p.stdout
    p, r = play(tmp_path, gate, run=None, rc=137)  # killed by timeout: a hung copy or all-reduce
    assert r["failed"] == 1 and "it did not finish within 600 s (killed: a hung P2P copy or all-reduce" in p.stdout
    # servers already hold the GPUs: skipped with the reason, nothing run
    (tmp_path / "run.argv").unlink()
    p, r = play(tmp_path, gate, ps="pdstack-prefill-0\npdstack-decode-0\n")
    assert r["failed"] == 0 and not (tmp_path / "run.argv").exists(), p.stdout
    assert "P2P gate skipped: pdstack server container(s) pdstack-prefill-0, pdstack-decode-0 already hold the GPUs" \
        in p.stdout
    # the sim engine (the test hosts): nothing to measure, skipped with the plan's reason, docker never asked
    sim = gate_of("inventory/local", "single-node-4gpu.json")
    p, r = play(tmp_path, sim, ps="should not be read")
    assert r["failed"] == 0 and r["changed"] == 0, p.stdout
    assert ("localhost: P2P gate skipped: the sim test engine uses no GPU, nothing to measure: the gate runs with the "
            "sglang engine") in p.stdout
