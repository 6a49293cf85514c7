"""Bad inventories: each must fail in preflight with a message naming the variable and the fix.

Every case copies inventory/production, breaks one thing, and runs the same code `pdstack plan` and the preflight
role run. None of them contacts a host (there is none: the facts come from a recorded topology).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdstack.controller import inventory, planner
from pdstack.errors import InventoryError

ROOT = Path(__file__).resolve().parents[1]
PROD = ROOT / "inventory" / "production"
TOPO = ROOT / "tests" / "topologies"
SERVERS = Path("host_vars/gpu01/servers.yml")


def _edit(inv: Path, rel: str | Path, fn) -> None:
    p = inv / rel
    data = yaml.safe_load(p.read_text()) if p.exists() else {}
    fn(data)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    d = tmp_path / "production"
    shutil.copytree(PROD, d)
    return d


def plan(inv: Path, topo: str = "reference-2node-8gpu.json"):
    dep = inventory.load(inv)
    return planner.make_plan(dep, planner.load_facts(TOPO / topo, list(dep.hosts)))


def servers(fn):
    return lambda d: fn(d["pdstack_servers"])


# (id, file to edit, edit, expected fragments of the message, topology)
CASES = [
    ("hicache-size-dsv4", SERVERS, servers(lambda s: s[0]["extra_args"].update({"hicache-size": 150})),
     ["extra_args.hicache-size", "DeepSeek V4 rejects --hicache-size", "host_budget_gb"]),
    ("overlapping-gpus", SERVERS, servers(lambda s: s[1].update(gpus=[3, 4, 5, 6])),
     ["pdstack_servers[1] (decode-0).gpus", "GPU 3 is also used by prefill-0"]),
    ("gpu-beyond-count", SERVERS, servers(lambda s: s[1].update(gpus=[6, 7, 8, 9])),
     ["decode-0).gpus", "GPU(s) [8, 9] do not exist", "has 8 GPU(s)"]),
    ("tp-mismatch", SERVERS, servers(lambda s: s[0].update(tp_size=2)),
     ["prefill-0).tp_size", "2 does not match its 4 GPUs", "set tp_size: 4"]),
    ("numa-node-missing", SERVERS, servers(lambda s: s[0].update(numa_node=3, numa_override=True)),
     ["prefill-0).numa_node", "has no NUMA node 3"]),
    ("numa-mismatch", SERVERS, servers(lambda s: s[0].update(numa_node=1)),
     ["prefill-0).numa_node", "1 is not the node its GPUs hang off (0)", "numa_override: true"]),
    ("port-collision", SERVERS, servers(lambda s: s[1]["ports"].update(http=30000)),
     ["decode-0).ports.http", "port 30000 on host gpu01 is already taken", "prefill-0).ports.http"]),
    ("router-port-collision", "group_vars/all/router.yml", lambda d: d["pdstack_router"].update(port=8998),
     ["pdstack_router.port", "port 8998", "ports.bootstrap"]),
    ("hicache-over-node-memory", SERVERS, servers(lambda s: s[0]["hicache"].update(host_budget_gb=240)),
     ["hicache.host_budget_gb", "240 GiB on NUMA node 0", "lower host_budget_gb"]),
    ("max-queued-without-admission", "group_vars/all/router.yml",
     lambda d: d["pdstack_router"].update(admission={"max_concurrent_requests": -1}),
     None),  # filled below: needs two edits
    ("typo-server-key", SERVERS, servers(lambda s: s[0].update(tp_szie=4)),
     ["pdstack_servers[0].tp_szie", "unknown key", "did you mean 'tp_size'"]),
    ("typo-router-key", "group_vars/all/router.yml",
     lambda d: d["pdstack_router"]["admission"].update(queue_sise=10),
     ["pdstack_router.admission.queue_sise", "did you mean 'queue_size'"]),
    ("typo-hicache-key", SERVERS, servers(lambda s: s[0]["hicache"].update(host_budget=10)),
     ["hicache.host_budget", "did you mean 'host_budget_gb'"]),
    ("typo-top-level-var", "group_vars/all/router.yml",
     lambda d: d.update(pdstack_routr=d.pop("pdstack_router")),
     ["pdstack_routr", "unknown pdstack variable", "did you mean 'pdstack_router'"]),
    ("abbreviated-sglang-flag", SERVERS, servers(lambda s: s[1]["extra_args"].update({"cuda-graph-max-bs": 8})),
     ["decode-0).extra_args", "SGLang 0.5.23 rejects it", "cuda-graph-max-bs"]),
    ("unknown-sglang-flag", SERVERS, servers(lambda s: s[0]["extra_args"].update({"mem-fraction": 0.8})),
     ["prefill-0).extra_args", "SGLang 0.5.23 rejects it", "--mem-fraction"]),
    ("owned-flag-in-extra", SERVERS, servers(lambda s: s[0]["extra_args"].update({"tp-size": 4})),
     ["extra_args.tp-size", "the planner renders --tp-size itself", "tp_size"]),
    ("wrong-type", SERVERS, servers(lambda s: s[0].update(tp_size="four")),
     ["pdstack_servers[0].tp_size", "expected integer", "'four'"]),
    ("bad-choice", SERVERS, servers(lambda s: s[0]["transfer"].update(backend="rdma")),
     ["transfer.backend", "'rdma' is not one of", "'mooncake'"]),
    ("sim-in-production", "group_vars/all/image.yml", lambda d: d["pdstack_image"].update(engine="sim"),
     ["pdstack_image.engine", "TEST ENGINE", "engine: sglang"]),
    ("no-decode", SERVERS, servers(lambda s: s.pop(1)),
     ["no decode server", "role: decode"]),
    ("duplicate-names", SERVERS, servers(lambda s: s[1].update(name="prefill-0")),
     ["name: 'prefill-0' is also used", "unique"]),
    ("missing-model-path", "group_vars/all/model.yml", lambda d: d["pdstack_model"].pop("path"),
     ["pdstack_model.path: required"]),
    ("relative-model-path", "group_vars/all/model.yml", lambda d: d["pdstack_model"].update(path="models/x"),
     ["pdstack_model.path", "must be an absolute path"]),
    ("hicache-without-pool-size", SERVERS, servers(lambda s: s[0]["hicache"].pop("device_kv_pool_gb")),
     ["hicache.device_kv_pool_gb: required when hicache.enabled"]),
    ("metrics-port-differs", SERVERS, servers(lambda s: s[0]["ports"].update(metrics=9100)),
     ["ports.metrics", "serves /metrics on its HTTP port"]),
    ("gpus-span-nodes", SERVERS, servers(lambda s: (s[0].update(gpus=[2, 3, 4, 5]), s[1].update(gpus=[0, 1, 6, 7]))),
     ["prefill-0).gpus", "hang off NUMA nodes [0, 1]"]),
]


def _max_queued(d):
    d["pdstack_servers"][0]["extra_args"]["max-queued-requests"] = 32


@pytest.mark.parametrize("case", CASES, ids=[c[0] for c in CASES])
def test_bad_inventory_is_rejected_with_its_message(inv: Path, case):
    name, rel, edit, expected = case
    if name == "max-queued-without-admission":
        _edit(inv, SERVERS, _max_queued)
        expected = ["extra_args.max-queued-requests", "ignores it on PD servers",
                    "pdstack_router.admission.max_concurrent_requests"]
    before = {p: p.read_bytes() for p in inv.rglob("*") if p.is_file()}
    _edit(inv, rel, edit)
    with pytest.raises(InventoryError) as err:
        plan(inv)
    msg = str(err.value)
    for fragment in expected:
        assert fragment in msg, f"{name}: {fragment!r} not in:\n{msg}"
    # the good inventory is still good: the failure is the edit's, not a side effect
    for p, data in before.items():
        p.write_bytes(data)
    assert plan(inv).servers


def test_max_queued_with_router_admission_is_a_warning_not_an_error(inv: Path):
    _edit(inv, SERVERS, _max_queued)
    p = plan(inv)
    assert any("does nothing on a PD server" in w for w in p.warnings)
    assert "--max-queued-requests" in p.servers[0].flags


def test_all_problems_are_listed_at_once(inv: Path):
    _edit(inv, SERVERS, servers(lambda s: (s[0].update(tp_size=2), s[1]["ports"].update(http=30000))))
    with pytest.raises(InventoryError) as err:
        plan(inv)
    assert len(err.value.problems) == 2


def test_hicache_budgets_of_servers_sharing_a_node_add_up(inv: Path):
    # each 150 GiB fits alone; pinned to the same node they need 300 GiB of its 187.6
    _edit(inv, SERVERS, servers(lambda s: s[0].update(numa_node=1, numa_override=True)))
    with pytest.raises(InventoryError, match=r"prefill-0 150 GiB, decode-0 150 GiB = 300 GiB on NUMA node 1"):
        plan(inv)


def test_interleaved_topology_rejects_reference_gpu_split(inv: Path):
    with pytest.raises(InventoryError, match=r"hang off NUMA nodes \[0, 1\]"):
        plan(inv, "interleaved-2node-8gpu.json")


def test_numa_override_allows_pinning(inv: Path):
    _edit(inv, SERVERS, servers(lambda s: s[0].update(numa_node=1, numa_override=True, hicache={"enabled": False})))
    p = plan(inv)
    assert p.servers[0].numa_node == 1 and p.servers[0].numa_source == "override"
    assert p.servers[0].cpuset_cpus == "32-63,96-127"


def test_simulated_gpus_refused_for_sglang_engine(inv: Path, tmp_path: Path):
    topo = json.loads((TOPO / "reference-2node-8gpu.json").read_text())
    topo["gpu_source"] = "simulated"
    f = tmp_path / "sim.json"
    f.write_text(json.dumps(topo))
    dep = inventory.load(inv)
    with pytest.raises(InventoryError, match="GPUs are simulated"):
        planner.make_plan(dep, planner.load_facts(f, list(dep.hosts)))


def test_missing_facts_say_how_to_get_them(inv: Path):
    dep = inventory.load(inv)
    with pytest.raises(InventoryError, match=r"no facts; run the facts phase .* `pdstack plan --facts"):
        planner.make_plan(dep, {})


def test_cli_reports_problems_and_exit_code(inv: Path):
    _edit(inv, SERVERS, servers(lambda s: s[0].update(tp_size=2)))
    r = subprocess.run([sys.executable, "-m", "pdstack", "plan", "-i", str(inv), "--facts",
                        str(TOPO / "reference-2node-8gpu.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "tp_size: 2 does not match its 4 GPUs" in r.stderr
    assert r.stdout == ""


def test_missing_inventory_is_a_clear_error(tmp_path: Path):
    with pytest.raises(InventoryError, match="does not exist; pass -i inventory/production"):
        inventory.load(tmp_path / "nope")
