"""The smoke gate end to end: `pdstack smoke` against sim prefill + decode behind the real sglang-router (127.0.0.1)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

sys.path.insert(0, str(Path(__file__).resolve().parent / "sim"))
from sim_helpers import start_pd  # noqa: E402

from pdstack import cli  # noqa: E402
from pdstack.testing.sim.vocab import TOKENIZER_DIR  # noqa: E402

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent

GRID = ["--lengths", "1K,2K,4K,8K", "--depths", "0,50,100"]
DECODE_200 = ["--decode-tokens-per-s", "200"]  # so C=1 decode speed is measurable against a baseline


def smoke(url: str, out: Path, min_horizon: int, baseline: float = 200) -> int:
    return cli.main(["smoke", "--url", url, "--out", str(out), "--tokenizer", str(TOKENIZER_DIR), *GRID,
                     "--min-horizon", str(min_horizon),
                     "--baseline", str(baseline), "--tolerance", "0.5", "--bench-concurrency", "1,2",
                     "--bench-requests", "2", "--bench-tokens", "40", "--timeout", "30",
                     "--probe-first-token-timeout", "5", "--probe-stall-timeout", "3", "--no-tools", "--no-churn"])


def test_collapsed_recall_fails_the_gate_within_one_grid_step(tmp_path, capsys):
    stack, s = start_pd(tmp_path, decode_extra=["--recall-horizon", "3000", *DECODE_200])
    with stack:
        rc = smoke(s.router.url, tmp_path / "out", min_horizon=8000)
    out = capsys.readouterr().out
    assert rc == 1, out
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["failed"] == ["recall"]
    # true horizon 3000 tokens: the grid step below it (2K) is reported
    assert summary["gates"]["recall"]["horizon"] == 2000
    assert summary["gates"]["probe"]["passed"] and summary["gates"]["bench"]["passed"]
    recall = json.loads((tmp_path / "out" / "recall.json").read_text())
    assert recall["counts"]["wrong"] > 0 and recall["counts"]["timeout"] == recall["counts"]["http"] == 0
    assert "FAIL (recall)" in out and f"heatmap: {tmp_path / 'out' / 'recall.png'}" in out
    assert (tmp_path / "out" / "recall.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_no_collapse_passes_and_keeps_every_file(tmp_path, capsys):
    stack, s = start_pd(tmp_path, decode_extra=["--recall-horizon", "0", *DECODE_200])
    with stack:
        rc = smoke(s.router.url, tmp_path / "out", min_horizon=8000)
        out = capsys.readouterr().out
        assert rc == 0, out
        summary = json.loads((tmp_path / "out" / "summary.json").read_text())
        assert summary["passed"] and summary["gates"]["recall"]["horizon"] == 8000
        for f in ("probe.json", "recall.json", "recall.png", "bench.json", "summary.json", "summary.txt"):
            assert (tmp_path / "out" / f).stat().st_size > 0, f
        assert out.splitlines()[-2].strip().startswith("heatmap: ")
        # throughput regression: the same stack against a baseline 10x its speed fails the bench gate only
        rc = smoke(s.router.url, tmp_path / "slow", min_horizon=8000, baseline=2000)
    assert rc == 1
    summary = json.loads((tmp_path / "slow" / "summary.json").read_text())
    assert summary["failed"] == ["bench"], summary


def smoke_phase(tmp_path: Path, router_url: str, *extra: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """The smoke role as a deploy runs it (tests/playbooks/smoke_phase.yml) for inventory/test/one-host."""
    xv = {"smoke_plan": {"router": {"host": "localhost", "url": router_url}}, "smoke_router_url": router_url,
          "preflight_state_dir": str(tmp_path / "state"), "smoke_results_dir": str(tmp_path / "smoke")}
    env = {**os.environ, "PATH": f"{BIN}{os.pathsep}{os.environ['PATH']}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
           "ANSIBLE_NOCOLOR": "1", **(env or {})}
    return subprocess.run([str(BIN / "ansible-playbook"), "tests/playbooks/smoke_phase.yml", "-i",
                           "inventory/test/one-host", "-e", json.dumps(xv), *extra], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)


def test_extra_vars_reach_the_gate(tmp_path):
    """`ansible-playbook -e pdstack_smoke=...` changes what the smoke role runs and what it gates on, not only the
    preflight: the role reads the variables Ansible resolved, not the inventory's files again."""
    # the parsers the plan renders for inventory/test's deepseek_v4 model, so the agent gates see a healthy stack
    parsers = ["--tool-call-parser", "deepseekv4", "--reasoning-parser", "deepseek-v4"]
    stack, s = start_pd(tmp_path, sim_extra=parsers, decode_extra=["--recall-horizon", "3000"])
    # inventory/test's own pdstack_smoke, with the tokenizer named: without it the gate reads the model phase's copy,
    # build/state/one-host/tokenizer, which only tests/test_site.py's deploy writes (a run where that deploy had not
    # happened yet, or failed, failed here for it)
    own = yaml.safe_load((ROOT / "inventory/test/common/group_vars/all/smoke.yml").read_text())["pdstack_smoke"]
    assert "tokenizer" not in own and own["min_horizon"] == 4000, own
    own = {"pdstack_smoke": {**own, "tokenizer": str(TOKENIZER_DIR)}}
    with stack:
        # inventory/test: grid 1K..4K, min_horizon 4000 -> horizon 2000 fails the gate
        r = smoke_phase(tmp_path, s.router.url, "-e", json.dumps(own))
        assert r.returncode != 0, r.stdout[-4000:]
        assert "recall  FAIL  horizon 2000 tokens (min 4000; grid 1K..4K x 3 depths)" in r.stdout, r.stdout[-4000:]
        # the same deploy with a smaller grid and gate given with -e: it runs that grid, and passes
        # (an extra var replaces the whole pdstack_smoke, so it names the tokenizer too)
        xs = {"pdstack_smoke": {"min_horizon": 2000, "tokenizer": str(TOKENIZER_DIR),
                                "grid": {"lengths": [1000, 2000], "depths": [0, 100], "variant": "single"},
                                "bench": {"concurrency": [1], "requests": 1, "max_new_tokens": 16}}}
        r = smoke_phase(tmp_path, s.router.url, "-e", json.dumps(xs))
        assert r.returncode == 0, r.stdout[-4000:]
        assert "recall  PASS  horizon 2000 tokens (min 2000; grid 1K..2K x 2 depths)" in r.stdout, r.stdout[-4000:]
    latest = tmp_path / "smoke" / "one-host" / "latest"
    rec = json.loads((latest / "recall.json").read_text())
    assert (rec["lengths"], rec["depths"], rec["variants"]) == ([1000, 2000], [0, 100], ["single"])
    assert json.loads((latest / "bench.json").read_text())["levels"][0]["requests"] == 1


def test_the_smoke_role_hands_the_front_door_key_over_unlogged(tmp_path):
    """With frontdoor_api_key set, the smoke role's wait and every gate pass through the real HAProxy that requires
    the key; the key is in no output even at -vvv, and its file is gone after the run."""
    from pdstack.testing.sim.launch import FrontDoorProcess

    key = "sm0ke-r0le-s3cret"
    parsers = ["--tool-call-parser", "deepseekv4", "--reasoning-parser", "deepseek-v4"]
    stack, s = start_pd(tmp_path, sim_extra=parsers, decode_extra=["--recall-horizon", "0"])
    with stack:
        fd = stack.enter_context(FrontDoorProcess(s.router, tmp_path, api_key=key)).start()
        tmp = tmp_path / "tmp"
        tmp.mkdir()
        xs = {"frontdoor_api_key": key,
              "pdstack_smoke": {"min_horizon": 2000, "tokenizer": str(TOKENIZER_DIR),
                                "grid": {"lengths": [1000, 2000], "depths": [0, 100], "variant": "single"},
                                "bench": {"concurrency": [1], "requests": 1, "max_new_tokens": 16}}}
        r = smoke_phase(tmp_path, fd.url, "-vvv", "-e", json.dumps(xs), env={"TMPDIR": str(tmp)})
        out = r.stdout + r.stderr
        assert r.returncode == 0, r.stdout[-4000:]
        for gate in ("probe", "recall", "bench", "tools", "churn"):
            assert f"{gate:<7} PASS" in r.stdout, (gate, r.stdout[-4000:])
        assert key not in out
        assert "PDSTACK_API_KEY_FILE" in out  # its path went by the environment, the key did not
        assert not list(tmp.glob("pdstack-smoke-*")), list(tmp.iterdir())
