"""`pdstack tune` without a deployment: the tune file's checks, the candidate overlay (pdstack_tune) through the load
stage and preflight, the sim's speed model, the bench client's result read, and how the winner is chosen.
The loop itself, end to end on a test host, is in tests/test_site_rollouts.py (test_tune_*)."""

from __future__ import annotations

import copy
import json
import textwrap

import pytest

from pdstack.cli import build_parser
from pdstack.controller import pipeline
from pdstack.controller.load import inventory, tune_overlay
from pdstack.controller.load.facts import load_facts
from pdstack.controller.tune import report, settings, sweep
from pdstack.errors import InventoryError
from pdstack.switches import BF16_INDEX_K_ENV
from pdstack.testing.sim import cli as sim_cli
from pdstack.testing.sim import speed

# ------------------------------------------------------------------------------------------------ the tune file


def write(tmp_path, text: str):
    p = tmp_path / "t.tune.yml"
    p.write_text(textwrap.dedent(text))
    return p


GOOD = """\
    ---
    candidates:
      - name: a
        servers: {decode: {extra_args: {moe-runner-backend: marlin}}}
    """


def test_the_local_tune_file_loads_with_three_candidates_and_defaults_fill_in(tmp_path):
    cfg = settings.load(settings.default_path("inventory/local"))
    assert [c["name"] for c in cfg["candidates"]] == ["fp8-kv", "greedy-memory", "upstream-recipe"]
    d = settings.load(write(tmp_path, GOOD))
    assert d["objective"] == "c1_decode_tps" and d["sweep"]["concurrency"] == [1, 4, 16, 64]
    assert [(s["input"], s["output"]) for s in d["sweep"]["shapes"]] == [(1024, 256), (8192, 256), (32768, 256)]
    assert d["sweep"]["warmup_wait_s"] == 30 and d["start_timeout_s"] == 1800
    pts = settings.points(d["sweep"])
    assert len(pts) == 12 and pts[0] == {"input": 1024, "output": 256, "concurrency": 1, "prompts": 4}
    assert pts[3]["prompts"] == 128  # 2 x C=64
    assert settings.default_path("inventory/test/two-decode").as_posix() == "inventory/test/two-decode.tune.yml"


@pytest.mark.parametrize(("text", "message"), [
    ("candidates: []\n", "candidates: empty"),
    ("candidates:\n  - {name: a, servers: {}}\n  - {name: a, servers: {}}\n", "names used twice: a"),
    ("candidates:\n  - {name: baseline, servers: {}}\n", "'baseline' is the name of the plan"),
    ("objective: fastest\ncandidates:\n  - {name: a, servers: {}}\n", "'fastest' is not one of"),
    ("objective: aggregate_tps\ncandidates:\n  - {name: a, servers: {}}\n", "needs tpot_p99_ms_max"),
    ("sweep: {concurrency: [4, 16]}\ncandidates:\n  - {name: a, servers: {}}\n", "must include 1"),
    ("sweep: {concurency: [1]}\ncandidates:\n  - {name: a, servers: {}}\n", "did you mean 'concurrency'"),
    ("sweep: {shapes: [{input: 0, output: 8}]}\ncandidates:\n  - {name: a, servers: {}}\n", "must be > 0"),
    ("candidates:\n  - {name: 'a b', servers: {}}\n", "not a valid name"),
    ("candidates:\n  - {name: a}\n", "candidates[0].servers: required"),
    ("candidates:\n  - {name: a, servers: {}}\ncandidates: []\n", "is set twice"),
    ("start_timeout_s: yes\ncandidates:\n  - {name: a, servers: {}}\n", "start_timeout_s"),
])
def test_a_bad_tune_file_is_refused_naming_the_key(tmp_path, text, message):
    with pytest.raises(InventoryError) as e:
        settings.load(write(tmp_path, "---\n" + text))
    assert message in str(e.value), e.value
    assert str(tmp_path / "t.tune.yml") in str(e.value)


@pytest.mark.parametrize(("inv", "facts"), [("inventory/local", "single-node-4gpu"),
                                           ("inventory/test/two-decode", "single-node-4gpu"),
                                           ("inventory/production", "reference-2node-8gpu")])
def test_every_shipped_tune_files_candidates_plan(inv, facts):
    """What `pdstack tune` checks before any host changes, for the tune files the repo ships: each candidate, as the
    extra var pdstack_tune, passes every check and plans; its flags land in the selected servers' argv."""
    cfg = settings.load(settings.default_path(inv))
    hv, groups, loc = inventory.load_located(inv)
    f = load_facts(f"tests/topologies/{facts}.json", list(hv))
    for cand in cfg["candidates"]:
        overlay = {"name": cand["name"], "servers": cand["servers"],
                   **({"index_k_dtype": cand["index_k_dtype"]} if cand.get("index_k_dtype") else {}),
                   **({"topology": cand["topology"]} if cand.get("topology") else {})}
        tuned = {h: {**v, "pdstack_tune": overlay} for h, v in hv.items()}
        plan = pipeline.make_plan(inventory.build_deployment(tuned, groups, inv, loc), f)
        for servers in (cand.get("topology") or {}).values():  # the topology's servers, GPUs and TP sizes
            assert [(s.name, s.gpus, s.tp_size) for s in plan.servers] == [
                (s["name"], s["gpus"], s["tp_size"]) for s in servers], cand["name"]
        if cand.get("index_k_dtype"):  # the candidate's index keys, with every switch that picks their reader
            assert plan.model["index_k_dtype"] == cand["index_k_dtype"], cand["name"]
            assert all(s.env["SGLANG_OPT_USE_TILELANG_INDEXER"] == "0" for s in plan.servers
                       if cand["index_k_dtype"] == "fp8-torch")
        for sel, change in cand["servers"].items():
            for s in plan.servers:
                if sel in ("all", s.role, s.name):
                    for k in change.get("extra_args") or {}:
                        assert f"--{k}" in s.argv, (cand["name"], s.name, k)


def test_a_missing_tune_file_says_where_one_goes(tmp_path):
    with pytest.raises(InventoryError, match="no such tune file; write one beside the inventory"):
        settings.load(tmp_path / "nope.tune.yml")


def test_the_command_line_objective_wins_and_is_checked(tmp_path):
    p = write(tmp_path, GOOD)
    assert settings.load(p, "aggregate_tps", 50.0)["objective"] == "aggregate_tps"
    with pytest.raises(InventoryError, match="needs tpot_p99_ms_max"):
        settings.load(p, "aggregate_tps")


# ---------------------------------------------------------------------------------------- the overlay (load)


def test_the_production_tune_file_carries_the_fp8_torch_candidate():
    cands = settings.load(settings.default_path("inventory/production"))["candidates"]
    assert [c["name"] for c in cands if c.get("index_k_dtype") == "fp8-torch"] == ["fp8-torch-index-keys"]


def _deployment(tune):
    hv, groups, loc = inventory.load_located("inventory/local")
    for h in hv.values():
        h["pdstack_tune"] = tune
    return inventory.build_deployment(hv, groups, "inventory/local", loc)


def test_the_overlay_lands_on_the_selected_servers_and_replaces_their_value():
    dep = _deployment({"name": "x", "servers": {"decode": {"extra_args": {"moe-runner-backend": "marlin"}},
                                                 "prefill-0": {"env": {"SGLANG_X": "1"}}}})
    by = {s["name"]: s for _, s in dep.servers()}
    assert by["decode-0"]["extra_args"] == {"moe-runner-backend": "marlin"} and by["decode-0"]["env"] == {}
    assert by["prefill-0"]["extra_args"] == {} and by["prefill-0"]["env"] == {"SGLANG_X": "1"}
    assert any("tuning candidate x applied" in w for w in dep.warnings)
    base = inventory.load("inventory/local")
    assert not any("tuning candidate" in w for w in base.warnings)
    hv, groups, loc = inventory.load_located("inventory/local")
    hv["pdstack-local-1"]["pdstack_servers"][1]["extra_args"] = {"moe-runner-backend": "triton", "page-size": 64}
    for h in hv.values():
        h["pdstack_tune"] = {"name": "y", "servers": {"all": {"extra_args": {"moe-runner-backend": "marlin"}}}}
    dep = inventory.build_deployment(hv, groups, "inventory/local", loc)
    decode = [s for _, s in dep.servers() if s["name"] == "decode-0"][0]
    assert decode["extra_args"] == {"moe-runner-backend": "marlin", "page-size": 64}


@pytest.mark.parametrize(("tune", "message"), [
    ({"servers": {"decod": {}}}, "pdstack_tune.servers.decod: selects no server; use one of prefill, decode, all "
                                 "or a server's name (decode-0, prefill-0)"),
    ({"servers": {"all": {"extra_arg": {}}}}, "pdstack_tune.servers.all.extra_arg: unknown key"),
    ({"servers": {"all": {"extra_args": {"mem-fraction-static": "0.7"}}}}, "quoted number"),
    ({"servers": {"all": "fast"}}, "expected a mapping"),
    ({"name": "a/b", "servers": {}}, "pdstack_tune.name"),
    ({"servers": {}, "colour": 1}, "pdstack_tune.colour: unknown key"),
])
def test_a_bad_overlay_is_refused_at_load_naming_the_overlay_key(tune, message):
    with pytest.raises(InventoryError) as e:
        _deployment(tune)
    assert message in str(e.value), e.value


def test_an_inventory_file_that_sets_pdstack_tune_is_refused(tmp_path):
    import shutil
    inv = tmp_path / "local"
    shutil.copytree("inventory/local", inv)
    (inv / "group_vars" / "all" / "tune.yml").write_text("---\npdstack_tune: {name: x, servers: {}}\n")
    with pytest.raises(InventoryError, match=r"pdstack_tune \(group_vars/all/tune.yml:2\): a tuning candidate's "
                                             "overlay, which `invoke tune` passes as an extra var"):
        inventory.load(inv)


def test_an_overlay_flag_preflight_refuses_names_the_overlay_key_it_came_from():
    dep = _deployment({"name": "x", "servers": {"all": {"extra_args": {"moe-runner-backen": "marlin", "port": 5},
                                                         "env": {BF16_INDEX_K_ENV: "0"}}}})
    facts = load_facts("tests/topologies/single-node-4gpu.json", list(dep.hosts))
    with pytest.raises(InventoryError) as e:
        pipeline.make_plan(dep, facts)
    text = str(e.value)
    assert "did you mean 'moe-runner-backend'? (pdstack_tune.servers.all.extra_args.moe-runner-backen)" in text
    assert "the planner renders --port itself" in text and "(pdstack_tune.servers.all.extra_args.port)" in text
    assert f"(pdstack_tune.servers.all.env.{BF16_INDEX_K_ENV})" in text


def test_a_candidate_plans_its_flags_into_the_argv_and_leaves_the_rest_as_it_was():
    facts = load_facts("tests/topologies/single-node-4gpu.json", ["pdstack-local-1"])
    base = pipeline.make_plan(inventory.load("inventory/local"), facts)
    cand = pipeline.make_plan(_deployment({"name": "x", "servers": {"decode": {"extra_args": {
        "moe-runner-backend": "marlin", "cuda-graph-max-bs-decode": 32}}}}), facts)
    b = {s.name: s for s in base.servers}
    c = {s.name: s for s in cand.servers}
    assert c["prefill-0"].argv == b["prefill-0"].argv and c["prefill-0"].env == b["prefill-0"].env
    assert c["decode-0"].argv == b["decode-0"].argv + ["--moe-runner-backend", "marlin",
                                                       "--cuda-graph-max-bs-decode", "32"]


# --------------------------------------------------------------------------------------- the sim's speed model


def sim_args(*argv: str):
    full = ["sim", *argv]
    return build_parser(full).parse_args(full)


def test_no_tuning_flag_leaves_every_rate_as_the_flags_give_it():
    s = speed.model(vars(sim_args()))
    assert s == speed.Speed() and s.decode_tps(64.0, 1) == 64.0 and s.decode_tps(64.0, 50) == 64.0


def test_the_speed_model_orders_the_candidates_as_documented():
    recipe = speed.model(vars(sim_args("--moe-runner-backend", "marlin", "--cuda-graph-max-bs-decode", "32")))
    assert recipe.decode_tps(64.0, 1) == pytest.approx(64 * 1.45 * 1.3)
    assert recipe.decode_tps(64.0, 33) == pytest.approx(64 * 1.45)  # past the captured graphs: eager speed
    fp8 = speed.model(vars(sim_args("--moe-runner-backend", "marlin", "--cuda-graph-max-bs-decode", "32",
                                    "--kv-cache-dtype", "fp8_e4m3")))
    assert fp8.decode_tps(64.0, 1) > recipe.decode_tps(64.0, 1) and fp8.recall_horizon == 2048
    eager = speed.model(vars(sim_args("--disable-cuda-graph", "--cuda-graph-max-bs-decode", "32")))
    assert eager.decode_tps(64.0, 1) == pytest.approx(64 * 0.6)
    assert speed.model(vars(sim_args("--chunked-prefill-size", "8192"))).prefill_factor == 1.2
    assert speed.model(vars(sim_args("--mem-fraction-static", "0.92"))).startup_error is None
    assert "CUDA out of memory" in speed.model(vars(sim_args("--mem-fraction-static", "0.95"))).startup_error


def test_fp8_kv_collapses_recall_even_with_bf16_index_keys(monkeypatch):
    monkeypatch.setenv(BF16_INDEX_K_ENV, "1")
    cfg, _, _ = sim_cli.build_config(sim_args(), [])
    assert cfg.recall_horizon == 0
    cfg, _, _ = sim_cli.build_config(sim_args("--kv-cache-dtype", "fp8_e5m2"), [])
    assert cfg.recall_horizon == 2048 and cfg.speed.decode_factor == pytest.approx(1.15)
    cfg, _, _ = sim_cli.build_config(sim_args("--kv-cache-dtype", "fp8_e5m2", "--recall-horizon", "1000"), [])
    assert cfg.recall_horizon == 1000  # the nearer collapse wins


def test_a_server_that_does_not_fit_exits_1_at_start(capsys):
    import subprocess
    import sys
    r = subprocess.run([sys.executable, "-m", "pdstack", "sim", "--port", "1", "--mem-fraction-static", "0.99"],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and "CUDA out of memory" in r.stderr, r


# ------------------------------------------------------------------------------------- results and the winner


LINE = {"completed": 4, "errors": ["", "", "", ""], "output_lens": [9, 9, 9, 9],
        "itls": [[0.01] * 8, [0.02] * 8, [0.01] * 8, [0.04] * 8], "output_throughput": 123.0,
        "input_throughput": 4567.0, "duration": 1.5, "median_ttft_ms": 10.0, "p90_ttft_ms": 20.0,
        "p99_ttft_ms": 30.0, "median_tpot_ms": 12.0, "p90_tpot_ms": 13.0, "p99_tpot_ms": 14.0,
        "median_itl_ms": 11.0, "p90_itl_ms": 12.0, "p99_itl_ms": 15.0}
POINT = {"input": 1000, "output": 9, "concurrency": 1, "prompts": 4}


def test_a_points_figures_come_from_the_bench_clients_line():
    s = sweep.summarise(LINE, POINT)
    assert s["decode_tps_per_request"] == [100.0, 50.0, 100.0, 25.0]
    assert s["decode_tps_per_request_p50"] == 75.0 and s["aggregate_tps"] == 123.0 and s["prefill_tps"] == 4567.0
    assert (s["ttft_ms_p50"], s["tpot_ms_p99"], s["itl_ms_p90"]) == (10.0, 14.0, 12.0) and s["errors"] == 0
    bad = sweep.summarise({**LINE, "completed": 2, "errors": ["", "HTTP 429", "", "HTTP 429"]}, POINT)
    assert bad["errors"] == 2 and bad["error_samples"] == ["HTTP 429"]
    lost = sweep.summarise({**LINE, "completed": 1, "errors": []}, POINT)
    assert lost["errors"] == 3  # requests that neither completed nor reported an error are failures too


def test_the_bench_command_line_carries_no_key_and_the_point():
    a = sweep.argv("http://h:8000", {**POINT, "concurrency": 4, "prompts": 8}, "/tok", "m", "/o.jsonl", 2)
    assert a[a.index("--max-concurrency") + 1] == "4" and a[a.index("--num-prompts") + 1] == "8"
    assert a[a.index("--dataset-name") + 1] == "random-ids" and "--output-details" in a
    assert not any("Bearer" in w or "Authorization" in w for w in a)


def cand(name, c1, *, recall=True, errors=0, status="measured", agg=None, tpot99=10.0):
    pts = [{**POINT, "concurrency": 1, "decode_tps_per_request_p50": c1, "aggregate_tps": agg or c1,
            "tpot_ms_p99": tpot99, "errors": errors},
           {**POINT, "concurrency": 4, "decode_tps_per_request_p50": c1, "aggregate_tps": (agg or c1) * 3,
            "tpot_ms_p99": tpot99 * 2, "errors": 0}]
    return {"name": name, "status": status, "recall": {"passed": recall, "horizon": 8000 if recall else 2048,
                                                       "min_horizon": 8000}, "points": pts if status == "measured"
            else []}


def test_the_fastest_that_recalls_wins_and_the_faster_one_that_does_not_never_does():
    cs = [cand("baseline", 64.0), cand("fp8-kv", 139.0, recall=False), cand("greedy", 0.0, status="failed to start"),
          cand("recipe", 120.6), cand("flaky", 200.0, errors=1)]
    assert report.pick_winner(cs, "c1_decode_tps", None) == "recipe"
    why = {c["name"]: c["disqualified_because"] for c in cs}
    assert why["fp8-kv"].startswith("lost recall") and why["greedy"] == "failed to start"
    assert why["flaky"] == "1 request(s) failed under load" and why["recipe"] == ""


def test_a_tie_keeps_the_baseline_and_nothing_qualifying_is_no_winner():
    assert report.pick_winner([cand("baseline", 64.0), cand("same", 64.0)], "c1_decode_tps", None) == "baseline"
    assert report.pick_winner([cand("baseline", 64.0, recall=False)], "c1_decode_tps", None) is None


def test_aggregate_counts_only_points_within_the_tpot_bound():
    cs = [cand("baseline", 64.0, agg=100.0, tpot99=10.0), cand("big-batch", 60.0, agg=150.0, tpot99=30.0)]
    # within 25 ms only the C=1 points count for big-batch (its C=4 point has TPOT p99 60 ms): 150 < 300
    assert report.pick_winner(copy.deepcopy(cs), "aggregate_tps", 25.0) == "baseline"
    assert report.pick_winner(copy.deepcopy(cs), "aggregate_tps", 100.0) == "big-batch"


def test_the_report_and_the_winners_host_vars(tmp_path):
    cs = [cand("baseline", 64.0), cand("recipe", 120.6)]
    for c in cs:
        for p in c["points"]:
            p.update({k: 1.0 for k in sweep.failed_point(POINT, "")
                      if k.endswith(("_p50", "_p90", "_p99")) and k not in p}, prefill_tps=1000.0)
    cs[1].update(description="marlin", overlay={"name": "recipe", "servers": {"decode": {"extra_args": {
        "moe-runner-backend": "marlin"}}}})
    res = {"inventory": "inventory/local", "run": "r1", "objective": "c1_decode_tps", "tpot_p99_ms_max": None,
           "candidates": cs, "restored": "yes"}
    res["winner"] = report.pick_winner(cs, "c1_decode_tps", None)
    hv, groups, loc = inventory.load_located("inventory/local")
    servers = tune_overlay.apply(cs[1]["overlay"], hv, [])[0]["pdstack-local-1"]["pdstack_servers"]
    change = report.winner_change(res, {"pdstack-local-1": servers}, tmp_path)
    written = (change / "host_vars" / "pdstack-local-1" / "servers.yml").read_text()
    import yaml
    assert yaml.safe_load(written)["pdstack_servers"] == json.loads(json.dumps(servers))
    # the file is an inventory's: copied over the inventory's, it plans, and decode runs the winner's flag
    hv["pdstack-local-1"]["pdstack_servers"] = yaml.safe_load(written)["pdstack_servers"]
    facts = load_facts("tests/topologies/single-node-4gpu.json", ["pdstack-local-1"])
    plan = pipeline.make_plan(inventory.build_deployment(hv, groups, "inventory/local"), facts)
    assert [s.name for s in plan.servers if "marlin" in s.argv] == ["decode-0"]
    assert "decode-0: extra_args.moe-runner-backend: 'marlin'" in (change / "CHANGE.md").read_text()
    pngs = report.plots(res, tmp_path)
    assert all(p.stat().st_size > 1000 for p in pngs)
    md = report.markdown(res, pngs, change)
    assert "Winner: **recipe**" in md and "| recipe | WINNER |" in md and "288-299" in md


# ------------------------------------------------------------------------ what the run checks before any change


@pytest.fixture
def tuner(tmp_path, monkeypatch):
    """A Tuner of inventory/local whose controller state (facts, the last run's plan, the tokenizer) is in tmp_path:
    as `invoke deploy` leaves it."""
    from pdstack.controller.tune import loop

    state = tmp_path / "build" / "state" / "local"
    (state / "facts").mkdir(parents=True)
    (state / "facts" / "pdstack-local-1.json").write_text(open("tests/topologies/single-node-4gpu.json").read())
    (state / "tokenizer").mkdir()
    (state / "tokenizer" / "tokenizer.json").write_text("{}")
    monkeypatch.setattr(loop.Tuner, "require_image", False)  # no sim image needs to be built for these
    monkeypatch.setattr(loop.Tuner, "tokenizer", lambda self: str(state / "tokenizer"))
    cfg = settings.load(settings.default_path("inventory/local"))
    t = loop.Tuner("inventory/local", cfg, tmp_path / "out", root=tmp_path)
    (state / "plan.json").write_text(t.base_plan.to_json())
    return t


def test_a_deployment_as_the_inventory_plans_it_passes_the_runs_checks(tuner):
    tuner.check()


def test_a_deployment_that_is_not_the_inventorys_plan_is_refused(tuner):
    last = json.loads((tuner.state / "plan.json").read_text())
    last["servers"][1]["argv"].append("--moe-runner-backend")
    (tuner.state / "plan.json").write_text(json.dumps(last))
    with pytest.raises(InventoryError, match=r"planned server\(s\) decode-0 unlike the inventory does now"):
        tuner.check()
    last = json.loads(tuner.base_plan.to_json()) | {"image": "pdstack/sim:0000000000000000"}
    (tuner.state / "plan.json").write_text(json.dumps(last))
    with pytest.raises(InventoryError, match="deployed image pdstack/sim:0000000000000000, the inventory now plans"):
        tuner.check()
    (tuner.state / "plan.json").unlink()
    with pytest.raises(InventoryError, match="missing; tune measures a running deployment: deploy it first"):
        tuner.check()


def test_a_sweep_the_deployment_cannot_take_and_a_bad_candidate_are_refused_together(tuner):
    tuner.cfg["sweep"]["concurrency"] = [1, 64]
    tuner.cfg["sweep"]["shapes"] = [{"input": 32768, "output": 256}]
    tuner.cfg["candidates"].append({"name": "typo", "description": "", "servers": {
        "decode": {"extra_args": {"cuda-graph-max-bs-decod": 32}}}})
    with pytest.raises(InventoryError) as e:
        tuner.check()
    text = str(e.value)
    assert "sweep.concurrency: 64 is more than the front door admits (8 in flight + 16 queued" in text
    assert "sweep.shapes: 32768/256 needs 33024 tokens, over the model's context_length 32768" in text
    typo = "cuda-graph-max-bs-decod"
    assert f"candidate typo: host_vars/pdstack-local-1 pdstack_servers[1] (decode-0).extra_args.{typo}" in text
    assert f"(pdstack_tune.servers.decode.extra_args.{typo})" in text
