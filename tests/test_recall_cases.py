"""The recall gate's cases against the sim TEST ENGINE's model, no server: look-alike keys (multikey), the length
jitter, the unique prefix, the grid's cells and cost (load/recall_grid.py), and the controller's own cost at the
production context. `ask` is replaced by the sim's deterministic answer to the very prompt the gate built, graded the
same way (the code in the answer); the server path is tests/test_recall.py's."""

from __future__ import annotations

import time

import pytest

from pdstack.controller.gates import recall, recall_report
from pdstack.controller.gates.needles import KEYS, cell_needles
from pdstack.controller.load import inventory, recall_grid
from pdstack.testing.sim import model
from pdstack.testing.sim.faults import Faults
from pdstack.testing.sim.vocab import TOKENIZER_DIR as SIM_TOKENIZER

GRID = {"lengths": [1000, 2000, 4000], "depths": [10, 50, 90], "tokenizer": SIM_TOKENIZER, "needles": 3,
        "concurrency": 2, "retries": 0, "min_horizon": 4000}


def sim_ask(monkeypatch, seen: list[str] | None = None, **faults):
    """recall.ask answered by the sim's model (horizon unlimited: bf16 keys) with these faults."""
    def ask(url, prompt, needle, timeout, max_new_tokens, retries, backoff_s=1.0, headers=None):
        if seen is not None:
            seen.append(prompt)
        text = model.answer(prompt, 0, **faults).text
        return recall_report.Outcome(needle.key, needle.depth, "pass" if needle.code in text else "wrong", answer=text)
    monkeypatch.setattr(recall, "ask", ask)


def test_look_alike_keys_fail_a_sim_that_confuses_them_while_single_needles_pass(monkeypatch):
    sim_ask(monkeypatch, confuse_keys=True)
    rep = recall.run_recall("http://sim", variants=["single", "multikey"], **GRID)
    assert rep.horizon("single") == 4000  # one needle: nothing to confuse it with
    assert rep.horizon("multikey") == 0 and not rep.passed
    wrong = [o for c in rep.cells if c.variant == "multikey" for o in c.outcomes if o.status == "wrong"]
    assert wrong and all(o.key[:-3] in o.answer for o in wrong)  # it answered a look-alike's code
    sim_ask(monkeypatch)  # the same engine without the fault tells the keys apart
    assert recall.run_recall("http://sim", variants=["single", "multikey"], **GRID).passed


def test_multikey_prompt_has_look_alike_keys_and_asks_one():
    import random

    ns, asked = cell_needles("multikey", 50, 4, random.Random(0), 2)
    base = KEYS[2]
    assert len(ns) == 4 and asked == ns[:1] and asked[0].depth == 50
    assert all(n.key.startswith(base + " ") and n.key[len(base) + 1:].isdigit() for n in ns)
    assert len({n.key for n in ns}) == 4 and len({n.code for n in ns}) == 4


def test_length_jitter_catches_a_fault_of_one_residue(monkeypatch):
    """A fault only prompt length = 3 mod 4 shows (vLLM issue 55927's shape): every grid length here is 0 mod 4, so
    without jitter every prompt misses it; with the default jitter (0..3 tokens off, cycling) cells hit it."""
    seen: list[str] = []
    sim_ask(monkeypatch, seen, residue_fault=3)
    assert recall.run_recall("http://sim", variants=["single"], jitter=0, **GRID).passed
    assert {model.count_tokens(p) % 4 for p in seen} == {0}
    seen.clear()
    rep = recall.run_recall("http://sim", variants=["single"], jitter=3, **GRID)
    assert not rep.passed and rep.horizon() == 0
    assert {model.count_tokens(p) % 4 for p in seen} == {0, 1, 2, 3}
    assert sorted({c.prompt_tokens for c in rep.cells if c.length == 1000}) == [998, 999, 1000]


def test_every_prompt_has_a_fresh_unique_prefix(monkeypatch):
    seen: list[str] = []
    sim_ask(monkeypatch, seen)
    recall.run_recall("http://sim", variants=["single", "multi"], **GRID)
    first = [p.split("\n", 1)[0] for p in seen]
    assert len(set(first)) == len(seen) and all(f.startswith("Record ") for f in first)
    again: list[str] = []
    sim_ask(monkeypatch, again)
    recall.run_recall("http://sim", variants=["single", "multi"], **GRID)  # another run: another nonce
    assert not {p.split("\n", 1)[0] for p in again} & set(first)


def test_grid_cells_cycle_the_jitter_and_fit_the_context():
    grid = {"lengths": [2048, 131072], "depths": [10, 50, 90], "variant": ["single", "multikey"], "needles": 4,
            "jitter": 3}
    cells = recall_grid.cells(grid, context_length=131072)
    assert [c.tokens for c in cells[:6]] == [2048, 2047, 2046, 131005, 131008, 131007]
    assert max(c.tokens for c in cells) == 131072 - recall_grid.ANSWER_ROOM
    e = recall_grid.estimate(grid, prefill_tps=10000, decode_tps=64, concurrency=4, context_length=131072)
    assert e["requests"] == 12 and e["estimate_s"] == round(e["prompt_tokens"] / 10000 + 12 * 32 / 64 / 4)


def test_production_grid_reaches_the_context_and_fits_the_smoke_budget():
    dep = inventory.load("inventory/production")
    rc = recall_grid.smoke_estimates(dep.smoke, dep.model["context_length"], 32)
    assert max(rc["grid"]["lengths"]) == dep.model["context_length"] == 131072
    assert rc["min_horizon"] >= 65536
    assert {1984, 2112} <= set(rc["grid"]["lengths"])  # both sides of the indexer's 2,048 boundary
    assert rc["grid"]["kinds"] == ["single", "multikey"] and rc["grid"]["depths"] == [10, 50, 90]
    assert rc["grid"]["estimate_s"] <= rc["budget_s"] < rc["full"]["estimate_s"]


def test_faults_take_the_recall_knobs_at_run_time():
    f = Faults()
    f.update({"confuse_keys": True, "residue_fault": 3})
    assert f.confuse_keys and f.residue_fault == 3
    with pytest.raises(ValueError, match="residue_fault"):
        f.update({"residue_fault": 4})


def test_the_controller_cost_at_the_production_context_is_small(monkeypatch):
    """Tokenizing, building and grading a 131,072-token cell of each kind, answered by the sim: seconds, not
    minutes (the haystack was once built by re-tokenizing it per repeat: 204 s at this length)."""
    sim_ask(monkeypatch)
    t = time.monotonic()
    rep = recall.run_recall("http://sim", lengths=[131072], depths=[50], tokenizer=SIM_TOKENIZER,
                            variants=["single", "multikey"], needles=4, context_length=131072, retries=0)
    assert rep.passed and {c.prompt_tokens for c in rep.cells} == {131008, 131007}
    assert rep.build_s < 10 and time.monotonic() - t < 20, (rep.build_s, time.monotonic() - t)


def test_the_heatmap_has_a_panel_per_case_kind(monkeypatch, tmp_path):
    import matplotlib.axes

    from pdstack.controller.gates import heatmap

    titles: list[str] = []
    real = matplotlib.axes.Axes.set_title
    monkeypatch.setattr(matplotlib.axes.Axes, "set_title", lambda ax, t, *a, **kw: titles.append(t) or real(ax, t))
    sim_ask(monkeypatch, confuse_keys=True)
    rep = recall.run_recall("http://sim", variants=["single", "multikey"], **GRID)
    png = heatmap.draw(rep, tmp_path / "recall.png")
    assert png.read_bytes()[:4] == b"\x89PNG"
    assert titles == ["single needle: horizon 4K tokens", "look-alike keys, one asked: horizon 0 tokens"]


def test_the_production_plan_prints_the_recall_gate_as_the_docs_show_it():
    """`pdstack plan -i inventory/production`'s recall lines (plan/text.py), quoted in docs/smoke-and-watchdog.md."""
    from pathlib import Path

    from pdstack.controller import pipeline
    from pdstack.controller.load.facts import load_facts
    from pdstack.controller.plan.text import render_text

    dep = inventory.load("inventory/production")
    plan = pipeline.make_plan(dep, load_facts("tests/topologies/reference-2node-8gpu.json", list(dep.hosts)))
    lines = [ln for ln in render_text(plan).splitlines() if ln.startswith(("recall gate:", "  smoke ", "  --full "))]
    assert len(lines) == 3 and "lengths 1024," in lines[1] and ",131072;" in lines[1] and "budget 180 s" in lines[1]
    doc = (Path(__file__).resolve().parents[1] / "docs" / "smoke-and-watchdog.md").read_text()
    assert all(ln in doc for ln in lines), lines
