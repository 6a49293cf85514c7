"""pdstack_smoke in the inventories: schema defaults, typos rejected, what `pdstack smoke -i` takes from it (and from
the resolved variables with --vars, so `-e` reaches the gate), and one set of defaults for smoke, recall and bench:
the inventory schema's."""

from __future__ import annotations

import json

import pytest

from pdstack import cli
from pdstack.controller.gates import smoke, smoke_settings
from pdstack.controller.load import inventory
from pdstack.errors import InventoryError


@pytest.mark.parametrize("inv", ["inventory/production", "inventory/local", "inventory/test/one-host",
                                 "inventory/test/three-host"])
def test_every_inventory_sets_a_smoke_gate(inv):
    dep = inventory.load(inv)
    s = smoke_settings.from_deployment(dep)
    assert s["min_horizon"] > 0 and s["baseline"] and 0 < s["tolerance"] < 1
    assert s["min_horizon"] in s["lengths"]  # the gate is a grid point, so "within one grid step" holds
    # a tokenizer is named: the model's in production; where the inventory deploys the sim, the model phase's
    # copy of the lock's tokenizer files (which are the sim's own: tests/test_model_lock.py)
    assert s["tokenizer"] == ("/srv/models/DeepSeek-V4-Flash-NVFP4" if inv == "inventory/production"
                              else str(smoke_settings.ROOT / "build" / "state" / inv.rsplit("/", 1)[1] / "tokenizer")
                              ), s["tokenizer"]
    assert max(s["bench_concurrency"]) <= max(dep.router["admission"]["max_concurrent_requests"], 8)


def test_smoke_schema_defaults_and_typos():
    hv, groups = inventory.load_hostvars("inventory/local")
    for h in hv.values():
        h.pop("pdstack_smoke", None)
    dep = inventory.build_deployment(hv, groups)
    assert dep.smoke["min_horizon"] == 0 and dep.smoke["bench"]["tolerance"] == 0.2
    for h in hv.values():
        h["pdstack_smoke"] = {"min_horizon": 4000, "bench": {"baseline": 64}}
    with pytest.raises(InventoryError, match="did you mean 'baseline_tps'"):
        inventory.build_deployment(hv, groups)


def parse(*argv: str):
    return cli.build_parser(list(argv)).parse_args(list(argv))


def smoke_cfg(*argv: str) -> dict:
    """The settings `pdstack smoke ARGV` runs with."""
    args = parse("smoke", "--url", "u", "--out", "o", *argv)
    return smoke.settings(args, smoke.deployment(args))


def test_smoke_recall_and_bench_defaults_are_the_schemas():
    """An inventory without pdstack_smoke (and admission off) is what every CLI does without one."""
    hv, groups = inventory.load_hostvars("inventory/local")
    for h in hv.values():
        h.pop("pdstack_smoke", None)
        h["pdstack_router"] = {**h["pdstack_router"], "admission": {"max_concurrent_requests": -1}}
    dep = inventory.build_deployment(hv, groups)
    schema = smoke_settings.settings(dep.smoke, dep.router["admission"])
    assert smoke_settings.DEFAULTS == schema
    assert smoke_cfg() == schema
    r = vars(parse("recall", "--url", "u"))
    assert {k: r[k] for k in ("lengths", "depths", "tokenizer", "variant", "needles", "concurrency", "timeout",
                              "min_horizon")} == {k: schema[k] for k in ("lengths", "depths", "tokenizer", "variant",
                                                                        "needles", "concurrency", "timeout",
                                                                        "min_horizon")}
    b = vars(parse("bench", "--url", "u"))
    assert (b["concurrency"], b["requests"], b["max_new_tokens"], b["timeout"], b["baseline"], b["tolerance"]) == (
        schema["bench_concurrency"], schema["bench_requests"], schema["bench_tokens"], schema["timeout"],
        schema["baseline"], schema["tolerance"])


def test_smoke_reads_the_resolved_variables_so_extra_vars_reach_the_gate(tmp_path):
    """What the preflight role writes (roles/preflight/tasks/resolved.yml) with `-e pdstack_smoke=...` applied."""
    inv = "inventory/test/one-host"
    hv, groups = inventory.load_hostvars(inv)
    from_files = smoke_cfg("-i", inv)
    assert from_files["min_horizon"] == 4000 and from_files["lengths"] == [1000, 2000, 4000]
    extra = {"min_horizon": 2000, "grid": {"lengths": [1000, 2000], "depths": [0]}, "bench": {"requests": 1}}
    for h in hv.values():
        h["pdstack_smoke"] = extra  # an extra var replaces the whole variable
    resolved = tmp_path / "inventory.json"
    resolved.write_text(json.dumps({"hostvars": hv, "groups": groups}))
    s = smoke_cfg("-i", inv, "--vars", str(resolved))
    assert (s["min_horizon"], s["lengths"], s["depths"], s["bench_requests"]) == (2000, [1000, 2000], [0], 1)
    # what -e left out comes from the schema, not from the inventory's files
    assert s["baseline"] is None and s["variant"] == smoke_settings.DEFAULTS["variant"]
    # flags still win
    s = smoke_cfg("-i", inv, "--vars", str(resolved), "--min-horizon", "1000")
    assert s["min_horizon"] == 1000


def test_vars_without_an_inventory_is_a_usage_error(tmp_path, capsys):
    assert cli.main(["smoke", "--url", "u", "--out", str(tmp_path), "--vars", str(tmp_path / "x.json")]) == 2
    assert "--vars FILE needs -i/--inventory" in capsys.readouterr().err


def test_smoke_loads_the_inventory_once(tmp_path, monkeypatch):
    """`pdstack smoke -i` reads the inventory (an Ansible inventory parse, seconds) once for the smoke settings and
    the agent gates' (parsers, served name, admission limit), and both come from that one load."""
    loads, runs = [], []
    real = inventory.load
    monkeypatch.setattr(inventory, "load", lambda *a: loads.append(a) or real(*a))
    monkeypatch.setattr(smoke, "run_smoke", lambda *a, **kw: runs.append(kw) or (True, {}, "stub"))
    assert cli.main(["smoke", "--url", "http://127.0.0.1:9", "--out", str(tmp_path), "-i",
                     "inventory/test/one-host"]) == 0
    assert loads == [("inventory/test/one-host", None)]
    dep = real("inventory/test/one-host")
    (kw,) = runs
    assert kw["cfg"]["min_horizon"] == dep.smoke["min_horizon"] and kw["agent"]["model"] == dep.model["served_name"]
    assert kw["cfg"]["context_length"] == dep.model["context_length"]  # a grid length at the context fits it
    assert kw["agent"]["admission_limit"] == dep.router["admission"]["max_concurrent_requests"]


@pytest.mark.parametrize("command", ["smoke", "recall"])
def test_no_tokenizer_is_a_usage_error_naming_the_setting(command, tmp_path, capsys):
    """The tools build prompts to exact token counts with the model's tokenizer: there is no silent default."""
    argv = [command, "--url", "http://127.0.0.1:9"] + (["--out", str(tmp_path / "out")] if command == "smoke" else [])
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert "no tokenizer: give --tokenizer DIR (pdstack_smoke.tokenizer with -i)" in err, err
    assert not (tmp_path / "out").exists()
