"""Invariants of the synthetic recall experiment (kernels/recall_experiment/experiment.py), at --quick sizes."""

from __future__ import annotations

import json

import pytest
import torch
from recall_experiment import experiment as E

QUICK = E.Config(ns=(256, 512, 1024, 4096), margins=(0.01, 0.3), commons=(0.0, 64.0), trials=16, seed=3)


@pytest.fixture(scope="module")
def quick():
    return E.run(QUICK)


def test_n_up_to_topk_always_recalled(quick):
    cells, _ = quick
    small = [c for c in cells if c.n <= E.TOPK]
    assert small and all(c.recalled == {"fp8": c.trials, "bf16": c.trials} for c in small)


def test_bf16_never_worse_than_fp8(quick):
    cells, noise = quick
    for c in cells:
        assert c.recalled["bf16"] >= c.recalled["fp8"], c
    for common, per_layout in noise.items():
        assert per_layout["bf16"] < per_layout["fp8"], common


def test_experiment_is_not_vacuous(quick):
    """fp8 keys do lose the needle somewhere in the grid (anisotropic keys, N > 512), so the invariants above
    could fail."""
    cells, _ = quick
    assert any(c.recalled["fp8"] < c.trials for c in cells if c.n > E.TOPK)


def test_needle_has_the_planned_exact_margin():
    gen = torch.Generator().manual_seed(0)
    q, w, distractors, direction = E.draw_trial(gen, 1024, 4.0)
    exact = E.indexer_scores(distractors, q, w)
    target = exact.max() + 0.1 * exact.std()
    needle = direction * (target / E.indexer_scores(direction[None], q, w)[0])
    assert torch.isclose(E.indexer_scores(needle[None], q, w)[0], target, rtol=1e-12)
    assert distractors.shape == (1023, E.HEAD_DIM) and q.shape == (E.HEADS, E.HEAD_DIM)


def test_fp8_store_is_upstreams_per_token_layout():
    k = torch.randn(300, 128, dtype=torch.float64) * torch.logspace(-3, 3, 300, dtype=torch.float64)[:, None]
    deq = E.quantize_fp8(k)
    scale = k.abs().amax(-1, keepdim=True).float() / 448
    codes = deq / scale
    # on the e4m3 grid of each token's own scale (up to the float32 rounding of code * scale / scale)
    assert torch.allclose(codes.to(torch.float8_e4m3fn).float(), codes, rtol=1e-6, atol=0)
    assert ((deq - k.float()).abs() <= k.abs().amax(-1, keepdim=True).float() / 16 + 1e-30).all()
    try:
        from pdstack_kernels.reference import quantize_fp8_rows
    except ImportError:
        return
    values, scales = quantize_fp8_rows(k.float())
    assert torch.equal(values.float() * scales[:, None], deq)


def test_cli_quick_writes_outputs(tmp_path, capsys):
    assert E.main(["--quick", "--out", str(tmp_path)]) == 0
    doc = json.loads((tmp_path / "results.json").read_text())
    assert doc["cells"] and {"rate_fp8", "rate_bf16"} <= set(doc["cells"][0])
    assert (tmp_path / "recall.png").stat().st_size > 10_000
    assert "| N |" in capsys.readouterr().out


def test_default_output_is_outside_the_source_tree():
    """A run without --out writes under build/, never over the committed results beside experiment.py."""
    here = E.Path(E.__file__).resolve().parent
    assert E.DEFAULT_OUT.parts[-2:] == ("build", "recall_experiment")
    assert here not in E.DEFAULT_OUT.parents and E.DEFAULT_OUT != here
