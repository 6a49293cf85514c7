"""Monitoring without servers: rules (promtool check + promtool test), every alert tested firing and quiet,
dashboards committed = generated, dashboard hygiene, scrape config and textfile metrics from real plans."""

from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from prometheus_client.parser import text_string_to_metric_families

from pdstack.controller import pipeline
from pdstack.controller.load import inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.plan.planner import DATASOURCE_UID, FOLDER
from pdstack.controller.render.monitoring import dashboards, scrape
from pdstack.hostside.facts import parse_cpulist

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "monitoring" / "rules" / "pdstack.rules.yml"
RULE_TESTS = ROOT / "monitoring" / "tests" / "pdstack.rules.test.yml"
PROMTOOL = shutil.which("promtool")
needs_promtool = pytest.mark.skipif(not PROMTOOL, reason="promtool comes with Debian's prometheus (./dev.sh setup)")


def _alerts() -> list[str]:
    return [r["alert"] for g in yaml.safe_load(RULES.read_text())["groups"] for r in g["rules"] if "alert" in r]


@needs_promtool
def test_rules_pass_promtool_check():
    r = subprocess.run([PROMTOOL, "check", "rules", str(RULES)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


@needs_promtool
def test_rule_unit_tests_pass():
    r = subprocess.run([PROMTOOL, "test", "rules", RULE_TESTS.name], cwd=RULE_TESTS.parent, capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr


def test_every_alert_is_tested_firing_and_quiet():
    cases: dict[str, list] = {}
    for t in yaml.safe_load(RULE_TESTS.read_text())["tests"]:
        for c in t.get("alert_rule_test", []):
            cases.setdefault(c["alertname"], []).append(c.get("exp_alerts") or [])
    for a in _alerts():
        assert any(cases.get(a, [])), f"{a}: no test where it fires"
        assert any(not x for x in cases.get(a, [])), f"{a}: no test where it stays quiet"
    assert set(cases) <= set(_alerts()), f"tests for unknown alerts: {set(cases) - set(_alerts())}"


def test_alerts_named_in_the_issue_exist():
    assert set(_alerts()) >= {
        "PdstackDecodeWedged", "PdstackKVTransferFailures", "PdstackBootstrapFailures", "PdstackFrontDoorQueueNearFull",
        "PdstackFrontDoorRefusingRequests", "PdstackFrontDoorRouterDown", "PdstackTTFTOverBudget",
        "PdstackITLOverBudget", "PdstackWorkerUnhealthy",
        "PdstackWorkerCircuitOpen", "PdstackHiCacheHostNearCapacity", "PdstackNumaNodeMemoryHigh",
        "PdstackGPUTemperatureHigh", "PdstackGPUXidError", "PdstackTargetDown"}


@pytest.mark.parametrize("d", dashboards.DASHBOARDS, ids=lambda d: d.uid)
def test_committed_dashboard_json_is_the_generators_output(d):
    path = dashboards.DASHBOARD_DIR / f"{d.uid}.json"
    assert path.exists(), f"{path} missing: run python -m pdstack.controller.render.monitoring dashboards"
    assert path.read_text() == dashboards.render(d), (
        f"{path} differs from the generator (pdstack/controller/render/monitoring/dashboards.py): run "
        "python -m pdstack.controller.render.monitoring dashboards and commit the JSON")


def test_no_stray_dashboard_json():
    assert {p.stem for p in dashboards.DASHBOARD_DIR.glob("*.json")} == {d.uid for d in dashboards.DASHBOARDS}


@pytest.mark.parametrize("d", dashboards.DASHBOARDS, ids=lambda d: d.uid)
def test_dashboard_hygiene(d):
    j = json.loads((dashboards.DASHBOARD_DIR / f"{d.uid}.json").read_text())
    panels = [p for p in j["panels"] if p["type"] != "row"]
    assert panels
    ids = [p["id"] for p in j["panels"]]
    assert len(ids) == len(set(ids)), "duplicate panel ids"
    for p in panels:
        assert p["datasource"]["uid"] == DATASOURCE_UID, p["title"]
        assert p["targets"], p["title"]
        for t in p["targets"]:
            assert t["expr"].strip() and t["datasource"]["uid"] == DATASOURCE_UID, p["title"]
    used = {v for p in panels for t in p["targets"] for v in ("$host",) if v in t["expr"]}
    assert used <= {"$" + v["name"] for v in j.get("templating", {}).get("list", [])}


def test_role_provisions_dashboards_into_the_sglang_folder_never_general():
    prov = (ROOT / "roles/grafana/templates/etc/grafana/provisioning/dashboards/pdstack.yaml.j2").read_text()
    assert "folder: {{ grafana_folder | to_json }}" in prov
    defaults = yaml.safe_load((ROOT / "roles/grafana/defaults/main.yml").read_text())
    assert defaults["grafana_folder"] == "{{ grafana_plan.monitoring.grafana.folder }}"
    ds = (ROOT / "roles/grafana/templates/etc/grafana/provisioning/datasources/pdstack.yaml.j2").read_text()
    assert "uid: {{ grafana_plan.monitoring.grafana.datasource_uid | to_json }}" in ds
    # the one definition reaches the role through the plan
    plan = _plan("inventory/production", "reference-2node-8gpu.json")
    assert plan["monitoring"]["grafana"] == {"datasource_uid": DATASOURCE_UID, "folder": FOLDER}
    assert FOLDER == "sglang"


def _plan(inv: str, topo: str) -> dict:
    dep = inventory.load(ROOT / inv)
    facts = load_facts(ROOT / "tests/topologies" / topo, [h.name for h in dep.hosts.values()])
    return pipeline.make_plan(dep, facts).to_dict()


@needs_promtool
def test_prometheus_config_from_the_production_plan(tmp_path):
    plan = _plan("inventory/production", "reference-2node-8gpu.json")
    cfg = scrape.prometheus_config(plan)
    jobs = {j["job_name"]: j for j in cfg["scrape_configs"]}
    assert set(jobs) == {"prometheus", "sglang", "sglang-router", "haproxy", "node", "dcgm"}
    servers = {sc["labels"]["server"]: sc for sc in jobs["sglang"]["static_configs"]}
    assert set(servers) == {s["name"] for s in plan["servers"]}
    for s in plan["servers"]:
        assert servers[s["name"]]["targets"] == [f"{s['address']}:{s['ports']['http']}"]
        assert servers[s["name"]]["labels"]["role"] == s["role"]
    r = plan["router"]
    assert jobs["sglang-router"]["static_configs"][0]["targets"] == [f"{r['address']}:{r['prometheus_port']}"]
    assert jobs["haproxy"]["static_configs"][0]["targets"] == [f"{r['address']}:{r['frontdoor']['metrics_port']}"]
    assert len(jobs["dcgm"]["static_configs"]) == len({s["host"] for s in plan["servers"]})
    f = tmp_path / "prometheus.yml"
    f.write_text(yaml.safe_dump(cfg))
    r = subprocess.run([PROMTOOL, "check", "config", str(f)], capture_output=True, text=True, timeout=60)
    assert r.returncode == 0, r.stdout + r.stderr


def test_no_gpu_exporter_with_the_sim_engine():
    plan = _plan("inventory/local", "single-node-4gpu.json")
    assert plan["engine"] == "sim"
    assert "dcgm" not in {j["job_name"] for j in scrape.prometheus_config(plan)["scrape_configs"]}


def test_textfile_metrics():
    plan = _plan("inventory/production", "reference-2node-8gpu.json")
    facts = json.loads((ROOT / "tests/topologies/reference-2node-8gpu.json").read_text())
    host = plan["router"]["host"]
    text = scrape.textfile_metrics(plan, host, facts)
    fams = {f.name: f for f in text_string_to_metric_families(text)}
    cpus = fams["pdstack_numa_node_cpu"].samples
    assert {s.labels["numa_node"] for s in cpus} == {str(n["id"]) for n in facts["numa_nodes"]}
    assert len(cpus) == sum(len(parse_cpulist(n["cpus"])) for n in facts["numa_nodes"])
    budgets = {s.labels["server"]: s.value for s in fams["pdstack_hicache_host_budget_bytes"].samples}
    for s in plan["servers"]:
        if s["host"] == host:
            assert budgets[s["name"]] == (s["hicache"]["host_budget_gb"] * 2**30 if s["hicache"]["enabled"] else 0)
    # admission limits are HAProxy's own gauges now (haproxy_server_limit_sessions / queue_limit), not textfile ones
    assert not any(name.startswith("pdstack_router_") for name in fams)

