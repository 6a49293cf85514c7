"""Recall: prompts of exact token counts with the needle at its depth (no server), and the grading of wrong answers,
timeouts, HTTP errors and refusals against sim workers behind the real router."""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path

import pytest

from pdstack.controller.gates import recall, recall_report
from pdstack.controller.gates.needles import KEYS, Needle, PromptBuilder, TokenCounter, needle_depths
from pdstack.testing.sim import model
from pdstack.testing.sim.vocab import TOKENIZER_DIR as SIM_TOKENIZER


@pytest.fixture(scope="module")
def builder():
    return PromptBuilder(TokenCounter(SIM_TOKENIZER), 9000)


@pytest.mark.parametrize("length", [500, 1000, 4096, 8000])
@pytest.mark.parametrize("depth", [0, 33, 100])
def test_prompt_has_exact_token_count_and_needle_at_depth(builder, length, depth):
    n = Needle("amber harbor", "123456", depth)
    prompt = builder.build(length, [n], n)
    assert builder.counter.count(prompt) == length == model.count_tokens(prompt)  # the sim counts the same
    ans = model.answer(prompt, 0)
    assert ans.kind == "needle_hit" and "123456" in ans.text
    # distance from the needle to the end of the prompt ~ (100 - depth) % of the document
    assert abs(ans.needle_distance - length * (100 - depth) / 100) <= 0.02 * length + 20


def test_multi_needle_prompt_has_every_needle(builder):
    ns = [Needle(k, str(100000 + i), d) for i, (k, d) in
          enumerate(zip(KEYS, needle_depths(50, 3), strict=False))]
    assert needle_depths(50, 3) == [50, 83.333, 16.667]
    for n in ns:
        prompt = builder.build(2000, ns, n)
        assert builder.counter.count(prompt) == 2000
        assert model.answer(prompt, 0).text == n.sentence


def test_grid_parsing():
    assert recall.int_list("1K,2k, 4096") == [1000, 2000, 4096]
    assert recall.depth_list("100,0,50") == [0, 50, 100]
    with pytest.raises(argparse.ArgumentTypeError):
        recall.depth_list("120")


def test_horizon_is_contiguous_from_the_shortest_length():
    def cell(n, d, ok):
        c = recall_report.Cell("single", n, d, n)
        c.outcomes.append(recall_report.Outcome("k", d, "pass" if ok else "wrong"))
        return c
    cells = [cell(1000, 0, True), cell(2000, 0, False), cell(4000, 0, True)]
    rep = recall_report.RecallReport("u", "t", [1000, 2000, 4000], [0], ["single"], 1, cells, min_horizon=2000)
    assert rep.horizon() == 1000 and not rep.passed
    assert "X" in rep.table()


def test_pdstack_recall_heatmap_draws_the_report(tmp_path, monkeypatch, capsys):
    """`pdstack recall --heatmap FILE` draws the report with gates/heatmap.py (recall.run_recall replaced by a
    report of two cells, so no server is needed): a PNG at FILE, named on stdout."""
    cells = []
    for n, ok in ((1000, True), (2000, False)):
        c = recall_report.Cell("single", n, 0, n)
        c.outcomes.append(recall_report.Outcome("k", 0, "pass" if ok else "wrong"))
        cells.append(c)
    rep = recall_report.RecallReport("http://r", "t", [1000, 2000], [0], ["single"], 1, cells, min_horizon=0)
    monkeypatch.setattr(recall, "run_recall", lambda *a, **kw: rep)
    p = argparse.ArgumentParser()
    recall.register(p)
    png = tmp_path / "out" / "recall.png"
    args = p.parse_args(["--url", "http://r", "--tokenizer", str(SIM_TOKENIZER), "--heatmap", str(png)])
    assert recall.run(args) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and f"heatmap: {png}" in capsys.readouterr().out


@pytest.mark.slow
def test_answers_are_graded_by_kind(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent / "sim"))
    from sim_helpers import post, start_pd

    stack, s = start_pd(tmp_path, decode_extra=["--recall-horizon", "1500"],
                        router_extra=["--request-timeout-secs", "10", "--max-concurrent-requests", "1",
                                      "--queue-size", "0"])
    kw = {"lengths": [1000, 2000], "depths": [0], "tokenizer": SIM_TOKENIZER, "variants": ["single"],
          "concurrency": 1, "retries": 0}
    with stack:
        rep = recall.run_recall(s.router.url, timeout=10, **kw)
        assert [c.status for c in rep.cells] == ["pass", "wrong"] and rep.horizon() == 1000
        s.prefill.fault(slow_prefill_s=3)
        rep = recall.run_recall(s.router.url, timeout=1, **kw)
        assert {c.status for c in rep.cells} == {"timeout"}
        time.sleep(3)  # let the slow prefills drain
        hog = threading.Thread(target=post, args=(s.router.url + "/generate", {"text": "hold the slot"}, 20))
        hog.start()
        time.sleep(0.5)
        rep = recall.run_recall(s.router.url, timeout=10, **kw)
        hog.join(20)
        assert {c.status for c in rep.cells} == {"refused"}, [c.outcomes for c in rep.cells]
        s.reset_faults()
        s.decode.fault(fail_transfer=True)
        rep = recall.run_recall(s.router.url, timeout=10, **kw)
        assert {c.status for c in rep.cells} == {"http"}
        assert rep.cells[0].outcomes[0].http_status == 500
        s.reset_faults()
        # the recall faults through the engine: look-alike keys confused (multikey fails, single passes), and a
        # wrong digit at one residue of the prompt length (jitter 3 hits it: 0..3 tokens off, cycling)
        s.decode.fault(confuse_keys=True)
        rep = recall.run_recall(s.router.url, timeout=10, **{**kw, "lengths": [1000], "depths": [0, 50],
                                                               "variants": ["single", "multikey"]})
        # (3 keys: the asked one is never the last look-alike before the question at these depths)
        assert [(c.variant, c.status) for c in rep.cells] == [("single", "pass"), ("single", "pass"),
                                                             ("multikey", "wrong"), ("multikey", "wrong")]
        s.reset_faults()
        s.decode.fault(residue_fault=3)
        rep = recall.run_recall(s.router.url, timeout=10, **{**kw, "lengths": [1000], "depths": [0, 50, 100],
                                                               "jitter": 0})
        assert [c.prompt_tokens for c in rep.cells] == [1000, 1000, 1000] and rep.horizon() == 1000
        rep = recall.run_recall(s.router.url, timeout=10, **{**kw, "lengths": [1000], "depths": [0, 50, 100, 0],
                                                               "jitter": 3})
        assert [c.status for c in rep.cells if c.prompt_tokens % 4 == 3] == ["wrong"] and rep.horizon() == 0
