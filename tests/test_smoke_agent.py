"""`pdstack smoke`'s agent gates end to end: sim workers (SGLang's own parsers) behind the real sglang-router.
The phase fails naming the gate and why: parsers off, malformed or garbled tool arguments, stale KV under churn."""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "sim"))
from sim_helpers import start_pd  # noqa: E402

from pdstack import cli  # noqa: E402
from pdstack.testing.sim.vocab import TOKENIZER_DIR  # noqa: E402

pytestmark = pytest.mark.slow

PARSERS = ["--tool-call-parser", "deepseekv4", "--reasoning-parser", "deepseek-v4"]
TIMING = ["--prefill-tokens-per-s", "20000", "--recall-horizon", "0"]
ADMISSION = ["--max-concurrent-requests", "4", "--queue-size", "8", "--queue-timeout-secs", "5"]


def smoke(url: str, out: Path, *extra: str) -> int:
    return cli.main(["smoke", "--url", url, "--out", str(out), "--tokenizer", str(TOKENIZER_DIR),
                     "--lengths", "1K,2K", "--depths", "0,100",
                     "--variant", "single", "--bench-concurrency", "1", "--bench-requests", "1",
                     "--bench-tokens", "16", "--timeout", "20", "--probe-first-token-timeout", "5",
                     "--probe-stall-timeout", "3", "--churn-lengths", "1K,4K", "--admission-limit", "4", *extra])


def _wait_idle(*sims, within: float = 60.0) -> None:
    from pdstack.testing.sim.launch import http_get

    deadline = time.monotonic() + within
    while True:
        states = [json.loads(http_get(p.url + "/_sim/state")[1]) for p in sims]
        if all(st["waiting"] == st["running"] == 0 for st in states):
            return
        assert time.monotonic() < deadline, f"the servers did not go idle within {within:g} s: {states}"
        time.sleep(0.2)


def test_agent_gates_pass_then_each_fault_fails_its_gate(tmp_path, capsys):
    stack, s = start_pd(tmp_path, sim_extra=[*PARSERS, *TIMING], router_extra=ADMISSION)
    with stack:
        t0 = time.monotonic()
        rc = smoke(s.router.url, tmp_path / "ok")
        took = time.monotonic() - t0
        out = capsys.readouterr().out
        assert rc == 0, out
        summary = json.loads((tmp_path / "ok" / "summary.json").read_text())
        assert set(summary["gates"]) >= {"tools", "churn"} and summary["passed"]
        for f in ("tools.json", "churn.json"):
            assert (tmp_path / "ok" / f).stat().st_size > 0
        assert "tools   PASS" in out and "churn   PASS" in out
        print(f"smoke phase with agent gates: {took:.1f} s", file=sys.stderr)

        def fails_only(gate: str, fault: str, skip: str, *says: str) -> None:
            """With decode's `fault` on (and the other agent gate skipped), smoke fails `gate` alone, saying `says`.
            It starts once both servers are idle: the run before leaves work behind (the churn gate's aborted
            victims), and a probe queued behind it under the whole suite's load can miss its 5 s first-token
            deadline, failing `probe` beside the gate under test."""
            _wait_idle(s.prefill, s.decode)
            s.decode.fault(**{fault: True})
            try:
                rc = smoke(s.router.url, tmp_path / fault, skip)
            finally:
                s.decode.fault(**{fault: None})
            out = capsys.readouterr().out
            assert rc == 1
            summary = json.loads((tmp_path / fault / "summary.json").read_text())
            assert summary["failed"] == [gate], summary
            for text in says:
                assert text in out, (text, out)

        fails_only("tools", "malformed_tool_args", "--no-churn", "FAIL (tools)", "do not match the get_weather schema")
        fails_only("tools", "garble_tool_arg", "--no-churn", "FAIL (tools)",
                   "get_weather.city: got 'zürich', want 'Zürich'")
        tools = json.loads((tmp_path / "ok" / "tools.json").read_text())
        assert [k["name"] for k in tools["known_upstream"]] == ["dsml_closing_tag_in_argument"] * 2
        assert all(k["reproduced"] for k in tools["known_upstream"]) and "known upstream limitation" in tools["message"]
        fails_only("churn", "stale_kv", "--no-tools", "answers changed under churn", "vs under churn")


def test_parsers_off_fail_the_tools_gate(tmp_path, capsys):
    stack, s = start_pd(tmp_path, sim_extra=TIMING)
    with stack:
        rc = smoke(s.router.url, tmp_path / "off", "--no-churn")
    out = capsys.readouterr().out
    assert rc == 1
    assert "FAIL (tools)" in out and "is --tool-call-parser on?" in out
