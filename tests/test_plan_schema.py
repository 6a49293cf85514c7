"""The plan is a documented contract (pdstack/controller/plan/plan.schema.json): what the planner writes matches it, the
schema is not vacuous, and every plan field a role or playbook reads is one the schema describes."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from pdstack.controller import pipeline
from pdstack.controller.load import inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.plan import planner
from pdstack.hostside.facts import collect

ROOT = Path(__file__).resolve().parents[1]
TOPO = ROOT / "tests" / "topologies"
SCHEMA = json.loads(planner.SCHEMA_FILE.read_text())

CASES = [("inventory/production", TOPO / "reference-2node-8gpu.json"),
         ("inventory/local", None), ("inventory/test/one-host", None), ("inventory/test/three-host", None),
         ("inventory/test/two-decode", None)]


def _plan(inv: str, topo: Path | None) -> planner.Plan:
    dep = inventory.load(ROOT / inv)
    sim_gpus = 3 if inv.endswith("two-decode") else 2  # its host_vars simulate a third GPU for decode-1
    facts = (load_facts(topo, list(dep.hosts)) if topo
             else dict.fromkeys(dep.hosts, collect(simulate_gpus=sim_gpus)))
    return pipeline.make_plan(dep, facts)


@pytest.mark.parametrize(("inv", "topo"), CASES, ids=[f"{i}:{t.stem if t else 'sim'}" for i, t in CASES])
def test_the_planners_output_matches_the_schema(inv, topo):
    plan = _plan(inv, topo)
    assert planner.schema_problems(plan.to_dict()) == []
    assert planner.schema_problems(json.loads(plan.to_json())) == []  # what plan.json holds
    for host in {s.host for s in plan.servers}:
        assert planner.schema_problems(plan.for_host(host).to_dict()) == []
    plan.validate()


def test_the_schema_rejects_what_the_roles_could_not_read():
    good = _plan("inventory/production", TOPO / "reference-2node-8gpu.json").to_dict()
    bad = json.loads(json.dumps(good))
    bad["surprise"] = 1
    del bad["router"]["admission"]["queue_size"]
    bad["servers"][0]["ports"]["http"] = "30000"
    bad["servers"][1]["role"] = "mono"
    problems = planner.schema_problems(bad)
    assert any(p.startswith("(top)") and "surprise" in p for p in problems), problems
    assert any(p.startswith("router/admission") and "queue_size" in p for p in problems), problems
    assert any(p.startswith("servers/0/ports/http") for p in problems), problems
    assert any(p.startswith("servers/1/role") for p in problems), problems
    with pytest.raises(AssertionError, match="plan.schema.json"):
        planner.Plan(**{**_plan("inventory/production", TOPO / "reference-2node-8gpu.json").__dict__,
                        "environment": "staging"}).validate()


def _schema_has(path: list[str]) -> bool:
    node = SCHEMA
    for seg in path:
        while True:
            if "$ref" in node:
                node = SCHEMA["$defs"][node["$ref"].rsplit("/", 1)[1]]
            elif node.get("type") == "array":
                node = node["items"]
            else:
                break
        props = node.get("properties", {})
        if seg in props:
            node = props[seg]
        elif isinstance(node.get("additionalProperties"), dict):
            node = node["additionalProperties"]
        else:
            return False
    return True


# <role>_plan (each role's input, defaulting to the preflight role's output) and preflight_plan itself
PLAN_READ = re.compile(r"\b(?:[a-z]+_plan|preflight_plan)((?:\.[a-z][a-z0-9_]*)+)")


def test_every_plan_field_the_roles_read_is_in_the_schema():
    files = [f for f in (ROOT / "roles").rglob("*") if f.suffix in (".yml", ".j2")]
    files += sorted((ROOT / "playbooks").glob("*.yml"))
    read = {(f.relative_to(ROOT), m.group(1)) for f in files for m in PLAN_READ.finditer(f.read_text())}
    assert len(read) > 20  # the pattern finds what the roles read
    missing = sorted(f"{f}: plan{path}" for f, path in read if not _schema_has(path.lstrip(".").split(".")))
    assert not missing, f"fields read but not in {planner.SCHEMA_FILE.name}: {missing}"
