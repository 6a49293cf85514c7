"""The levers `invoke tune` searches, without a deployment or a port: topology candidates through the load stage and
the planner, the accuracy gate's set and verdict, the test engine's model of TP size, speculative decoding and the
wrong-answer fault, the run's estimate and --skip, the report's cookbook shape and Pareto plot. The loop end to end
(a topology candidate and an accuracy-fault candidate on a test host) is in tests/test_site_rollouts.py."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest

from pdstack.controller import pipeline
from pdstack.controller.gates import accuracy
from pdstack.controller.load import inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.tune import estimate, report, settings
from pdstack.errors import InventoryError
from pdstack.testing.sim import model, speed

TWO = "inventory/test/two-decode"


def _two_decode_plan(tune):
    hv, groups, loc = inventory.load_located(TWO)
    for h in hv.values():
        h["pdstack_tune"] = tune
    dep = inventory.build_deployment(hv, groups, TWO, loc)
    facts = load_facts("tests/topologies/single-node-4gpu.json", list(hv))
    return pipeline.make_plan(dep, facts, require_image=False)


def _topology(name: str) -> dict:
    cands = settings.load(settings.default_path(TWO))["candidates"]
    return copy.deepcopy(next(c for c in cands if c["name"] == name)["topology"])


# ------------------------------------------------------------------------------------------------- topology


def test_a_topology_candidate_replaces_the_servers_and_the_routers_workers():
    plan = _two_decode_plan({"name": "t", "servers": {}, "topology": _topology("one-decode-tp2")})
    assert [(s.name, s.gpus, s.tp_size) for s in plan.servers] == [("prefill-0", [0], 1), ("decode-0", [1, 2], 2)]
    assert "--tp-size" in plan.servers[1].argv and plan.servers[1].argv[plan.servers[1].argv.index("--tp-size") + 1] \
        == "2"
    router = json.loads(plan.to_json())["router"]
    argv = " ".join(router["argv"])
    assert "--decode http://pdstack-roll-1:30001" in argv and "30002" not in argv
    # the overlay's extra_args land on the topology's servers
    plan = _two_decode_plan({"name": "t", "servers": {"decode": {"extra_args": {"moe-runner-backend": "marlin"}}},
                             "topology": _topology("one-decode-tp2")})
    assert [s.name for s in plan.servers if "marlin" in s.argv] == ["decode-0"]


def test_a_bad_topology_is_refused_naming_the_overlay_key():
    topo = _topology("one-decode-tp2")
    topo["pdstack-roll-1"][1]["gpus"] = [0, 2]  # GPU 0 is prefill's
    with pytest.raises(InventoryError) as e:
        _two_decode_plan({"name": "t", "servers": {}, "topology": topo})
    assert "pdstack_tune.topology.pdstack-roll-1" in str(e.value), e.value
    with pytest.raises(InventoryError, match=r"pdstack_tune.topology.gpu99: no such host in the inventory; use one "
                                             r"of pdstack-roll-1"):
        _two_decode_plan({"name": "t", "servers": {}, "topology": {"gpu99": topo["pdstack-roll-1"]}})
    with pytest.raises(InventoryError, match=r"pdstack_tune.topology.pdstack-roll-1: expected a non-empty list"):
        _two_decode_plan({"name": "t", "servers": {}, "topology": {"pdstack-roll-1": []}})


def test_the_front_door_must_fit_what_the_candidates_decodes_run():
    plan = {"servers": [{"role": "prefill", "argv": []},
                        {"role": "decode", "argv": ["--max-running-requests", "8"]}]}
    got = estimate.admission_problems(plan, {"max_concurrent_requests": 16})
    assert got and "max_concurrent_requests 16 is more than the candidate's 1 decode server(s)" in got[0]
    assert estimate.admission_problems(plan, {"max_concurrent_requests": 8}) == []
    plan["servers"].append({"role": "decode", "argv": []})  # a decode sized by memory: nothing to hold it to
    assert estimate.admission_problems(plan, {"max_concurrent_requests": 16}) == []


# ------------------------------------------------------------------------------------------------ accuracy


def test_the_engine_answers_the_shipped_set_and_the_fault_makes_a_deterministic_share_wrong():
    items = accuracy.questions()
    assert len(items) == 20 and len({i["expression"] for i in items}) == 20
    right = [accuracy.grade(model.answer(f"user: {accuracy.prompt(i, 'x')}\nassistant:", 0).text, i["answer"])
             for i in items]
    assert all(right)
    wrong = [not accuracy.grade(model.answer(f"user: {accuracy.prompt(i, 'x')}\nassistant:", 0,
                                             wrong_answers=0.5).text, i["answer"]) for i in items]
    again = [not accuracy.grade(model.answer(f"user: {accuracy.prompt(i, 'y')}\nassistant:", 0,
                                             wrong_answers=0.5).text, i["answer"]) for i in items]
    assert wrong == again and 5 <= sum(wrong) <= 15, sum(wrong)  # by question, not by probe


def test_a_drop_beyond_the_tolerance_disqualifies_and_one_within_it_does_not():
    base = {"correct": 20, "total": 20, "score": 1.0}
    assert accuracy.verdict({"correct": 19, "total": 20, "score": 0.95}, base, 0.05) is None
    why = accuracy.verdict({"correct": 18, "total": 20, "score": 0.9}, base, 0.05)
    assert why and why.startswith("lost accuracy: 18/20 correct against the baseline's 20/20")
    assert accuracy.verdict({"correct": 0, "total": 20, "score": 0.0}, None, 0.05) is None  # the baseline itself
    assert accuracy.grade("The answer is 1,095.", 1095) and not accuracy.grade("no number", 3)


def test_the_wrong_answer_fault_must_be_a_fraction():
    assert speed.model({}, {speed.WRONG_ANSWERS_ENV: "0.25"}).wrong_answers == 0.25
    with pytest.raises(ValueError, match="PDSTACK_SIM_WRONG_ANSWERS='half': give a fraction from 0 to 1"):
        speed.model({}, {speed.WRONG_ANSWERS_ENV: "half"})


# --------------------------------------------------------------------------------------- the engine's levers


def test_tp_size_and_speculation_scale_decode_and_tp_the_kv_pool():
    base = speed.model({})
    tp2, tp4 = speed.model({"tp_size": 2}), speed.model({"tp_size": 4})
    assert (base.decode_tps(64, 1), tp2.decode_tps(64, 1), tp4.decode_tps(64, 1)) == pytest.approx(
        (64.0, 64 * 1.6, 64 * 2.2))
    assert (tp2.kv_scale, tp4.kv_scale) == (2, 4)
    assert speed.model({"speculative_algorithm": "EAGLE"}).decode_tps(64, 1) == pytest.approx(64 * 1.8)
    # graphs that do not cover the running batch give nothing
    g = speed.model({"cuda_graph_max_bs_decode": 32})
    assert g.decode_tps(64, 32) == pytest.approx(64 * 1.3) and g.decode_tps(64, 33) == pytest.approx(64.0)


# ------------------------------------------------------------------------------------- the file, the estimate


def test_skip_by_name_and_a_name_that_is_not_there(tmp_path):
    p = tmp_path / "t.tune.yml"
    p.write_text(textwrap.dedent("""\
        ---
        candidates:
          - {name: a, servers: {}}
          - {name: b, servers: {}}
        """))
    cfg = settings.load(p, skip=["a"])
    assert [c["name"] for c in cfg["candidates"]] == ["b"] and cfg["skipped"] == ["a"]
    with pytest.raises(InventoryError, match=r"--skip c: no such candidate; the file has a, b"):
        settings.load(p, skip=["c"])
    with pytest.raises(InventoryError, match="leaves no candidate to try"):
        settings.load(p, skip=["a", "b"])


def test_the_estimate_adds_up_and_names_the_skipped():
    cfg = settings.load(settings.default_path("inventory/production"), skip=["mtp-eagle"])
    smoke = {"prefill_tps": 10000.0, "baseline": 64.0, "concurrency": 32, "context_length": 131072,
             "lengths": [8192], "depths": [0.5], "variant": "single", "needles": 1, "jitter": 0}
    est = estimate.run_estimate(cfg, smoke)
    one = est["per_candidate"]
    assert one["restart_s"] == 600 and one["sweep_s"] > 60
    n = len(cfg["candidates"])
    assert est["total_s"] == pytest.approx(est["baseline_s"] + n * one["total_s"] + est["restore_s"], abs=1)
    text = "\n".join(estimate.lines(est))
    assert "skipped by name (--skip): mtp-eagle" in text and "in all" in text


def test_the_production_tune_file_carries_the_levers_with_their_sources():
    cfg = settings.load(settings.default_path("inventory/production"))
    by = {c["name"]: c for c in cfg["candidates"]}
    assert all(c["source"] for c in cfg["candidates"]), [n for n, c in by.items() if not c["source"]]
    assert by["upstream-recipe"]["servers"]["all"]["extra_args"] == {"moe-runner-backend": "marlin",
                                                                     "mem-fraction-static": 0.70}
    assert by["recipe-graphs-cover-sweep"]["servers"]["decode"]["extra_args"]["cuda-graph-max-bs-decode"] >= max(
        cfg["sweep"]["concurrency"])
    assert by["mtp-eagle"]["servers"]["all"]["extra_args"]["speculative-algorithm"] == "EAGLE"
    assert by["fp8-torch-index-keys"]["index_k_dtype"] == "fp8-torch"
    assert {n for n, c in by.items() if c.get("topology")} == {"decode-two-tp2", "prefill-tp2-second-decode"}
    assert {"input": 8192, "output": 1024} in cfg["sweep"]["shapes"]
    assert {1, 16, 64} <= set(cfg["sweep"]["concurrency"])


# ------------------------------------------------------------------------------------------------- the report


def _point(conc, agg, per_req, tpot99):
    return {"input": 8192, "output": 1024, "concurrency": conc, "errors": 0, "aggregate_tps": agg,
            "decode_tps_per_request": per_req, "decode_tps_per_request_p50": per_req[0], "prefill_tps": 1.0,
            **{f"{m}_ms_{q}": tpot99 for m in ("ttft", "tpot", "itl") for q in ("p50", "p90", "p99")}}


def test_per_gpu_and_goodput_and_the_cookbook_table_and_pareto(tmp_path):
    p = _point(16, 800.0, [40.0, 10.0], 100.0)  # TPOTs 25 ms and 100 ms: one of two within 50 ms
    assert report.derive(p, 8, 50) == {"tps_per_gpu": 100.0, "goodput_tps": 400.0}
    cands = []
    for name, gpus, agg in (("baseline", 8, 800.0), ("fast", 8, 1600.0)):
        pts = [_point(c, agg * c / 16, [60.0], 1000 / 60) for c in (1, 16, 64)]
        for q in pts:
            q.update(report.derive(q, gpus, 50))
        cands.append({"name": name, "status": "measured", "gpus": gpus, "points": pts,
                      "recall": {"passed": True, "horizon": 1, "min_horizon": 1}})
    res = {"inventory": "inventory/x", "run": "r", "objective": "aggregate_tps", "tpot_p99_ms_max": 100,
           "goodput_tpot_ms": 50, "candidates": cands}
    res["winner"] = report.pick_winner(cands, "aggregate_tps", 100)
    assert res["winner"] == "fast"
    md = report.cookbook_md(res)
    assert md.count("| fast | 8 |") == 3 and "| fast | 8 | 64 |" in md and "goodput (TPOT <= 50 ms)" in md
    png = report.pareto(res, tmp_path)
    assert png.stat().st_size > 1000


def test_a_topology_winner_writes_its_server_list(tmp_path):
    from pdstack.controller.load import tune_overlay

    topo = _topology("one-decode-tp2")
    overlay = {"name": "one-decode-tp2", "servers": {}, "topology": topo}
    res = {"run": "r", "objective": "c1_decode_tps", "winner": "one-decode-tp2", "candidates": [
        {"name": "baseline", "score": 64.0}, {"name": "one-decode-tp2", "score": 102.0, "overlay": overlay}]}
    hv, _, _ = inventory.load_located(TWO)
    merged, _ = tune_overlay.apply(overlay, hv, [])
    d = report.winner_change(res, {h: v["pdstack_servers"] for h, v in merged.items()}, tmp_path)
    import yaml
    written = yaml.safe_load((d / "host_vars" / "pdstack-roll-1" / "servers.yml").read_text())["pdstack_servers"]
    assert [(s["name"], s["gpus"], s["tp_size"]) for s in written] == [("prefill-0", [0], 1), ("decode-0", [1, 2], 2)]
    assert "the server list replaced (topology): prefill-0 (prefill, GPUs [0], TP 1), decode-0 (decode, GPUs [1, 2], " \
        "TP 2)" in (d / "CHANGE.md").read_text()
