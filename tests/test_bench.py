"""Bench: percentiles and the baseline verdict (no server), and one sweep against sim workers + the real router."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

from pdstack.controller.gates import bench


def test_percentiles():
    p = bench.percentiles([float(i) for i in range(1, 101)])
    assert p["p50"] in (50.0, 51.0) and p["p90"] in (90.0, 91.0) and p["p99"] in (99.0, 100.0)
    assert bench.percentiles([])["p50"] is None


def _report(c1_tps, baseline, tol=0.2):
    lv = bench.Level(1, 3, 0, c1_tps, c1_tps, bench.percentiles([0.1]), bench.percentiles([0.01]), [])
    return bench.BenchReport("u", 128, baseline, tol, [lv])


def test_baseline_and_tolerance():
    assert _report(60, 64).passed  # within 20 %
    r = _report(50, 64)
    assert r.regressed and not r.passed and "FAIL (regressed)" in r.table()
    assert _report(10, None).passed  # no baseline: report only


@pytest.mark.slow
def test_sweep_against_sim(tmp_path):
    sys.path.insert(0, str(Path(__file__).resolve().parent / "sim"))
    from sim_helpers import start_pd

    stack, s = start_pd(tmp_path, decode_extra=["--decode-tokens-per-s", "100"])
    with stack:
        r = bench.run_bench(s.router.url, concurrency=[1, 2], requests=2, max_new_tokens=30, baseline_tps=100,
                            tolerance=0.4)
    assert not r.failed and r.passed, r.table()
    assert 60 < r.c1.decode_tps_per_request <= 110
    assert r.c1.itl_s["p50"] == pytest.approx(0.01, rel=0.5)
    assert [lv.concurrency for lv in r.levels] == [1, 2]
