"""One candidate's measurement: SGLang's own load generator through the front door, one run per point of the sweep.

The generator is the Rust client of 0.5.23's bench_serving (`sglang.benchmark.rust_client`, which
`python -m sglang.benchmark.serving --rust-client` hands a run to; bundled in the sglang wheel as
sglang/srt/rust_extensions/_bench*.so): the same metrics, table and JSONL result keys as the Python client. The
Python client cannot run from the controller's environment: its module imports, at load time, HF `datasets` (for
its mmmu dataset) and, through sglang.srt.configs, torchvision, whose only build that imports beside our CPU torch is
a CUDA one of several GB (docs/tune.md says how this was checked). The Rust client runs in this process (one import
of sglang, which the planner's parser has paid already), its output redirected to the point's log.

Each point is `--backend sglang` (/generate, streamed) with `--dataset-name random-ids` (token-id prompts of exactly
--random-input-len tokens; `random` would download ShareGPT), `--random-range-ratio 1` (every request the same
lengths), ignore_eos (its default), `--max-concurrency C` at an unbounded request rate, and `--output-details`, so
its JSONL line carries every request's TTFT, inter-token latencies and error. The API key goes in as a `--header`
of this in-process argv: never on a command line (`ps`) or in a log.

From each line: aggregate output tok/s, input tok/s (prefill), TTFT/TPOT/ITL p50/p90/p99 (its own figures), and per
request decode tok/s = (output tokens - 1) / the sum of its inter-token latencies (gates/bench.py's decode_tps, the
smoke gate's C=1 definition), plus the count of errors.
"""

from __future__ import annotations

import contextlib
import json
import os
import statistics
import sys
import time
from pathlib import Path
from typing import Any

from pdstack.controller.gates import bench

# the latency percentiles a point carries (the bench client's median_/p90_/p99_ ttft, tpot and itl, in ms)
LATENCIES = [(m, q) for m in ("ttft", "tpot", "itl") for q in ("p50", "p90", "p99")]


def argv(url: str, point: dict[str, int], tokenizer: str, model: str, out_file: Path, warmup: int,
         seed: int = 42) -> list[str]:
    """The generator's command line of one point, without the API key (run_point adds it)."""
    return ["sglang.benchmark.rust_client", "--backend", "sglang", "--base-url", url,
            "--dataset-name", "random-ids", "--random-input-len", str(point["input"]),
            "--random-output-len", str(point["output"]), "--random-range-ratio", "1",
            "--num-prompts", str(point["prompts"]), "--max-concurrency", str(point["concurrency"]),
            "--request-rate", "inf", "--tokenizer", tokenizer, "--model", model, "--output-file", str(out_file),
            "--output-details", "--disable-tqdm", "--warmup-requests", str(warmup), "--seed", str(seed),
            "--ready-check-timeout-sec", "60"]


@contextlib.contextmanager
def _output_to(log: Path):
    """The process's fd 1 and 2 into `log` (the Rust client writes to them directly), restored after."""
    sys.stdout.flush()
    sys.stderr.flush()
    saved = os.dup(1), os.dup(2)
    with open(log, "ab") as f:
        os.dup2(f.fileno(), 1)
        os.dup2(f.fileno(), 2)
        try:
            yield
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])


def generate(args: list[str]) -> int:
    """One run of SGLang's Rust bench client (the import is paid once per process)."""
    from sglang.benchmark import rust_client

    return rust_client.main(args)


def summarise(line: dict[str, Any], point: dict[str, int]) -> dict[str, Any]:
    """A point's figures from bench_serving's JSONL result (with --output-details)."""
    errors = [e for e in line.get("errors") or [] if e]
    itls = line.get("itls") or []
    per_request = [v for n, gaps in zip(line.get("output_lens") or [], itls, strict=False)
                   if n and (v := bench.decode_tps(n - 1, sum(gaps or []))) is not None]
    return {
        **point,
        "completed": line.get("completed", 0),
        "errors": len(errors) + max(0, point["prompts"] - int(line.get("completed") or 0) - len(errors)),
        "error_samples": sorted(set(map(str, errors)))[:3],
        "decode_tps_per_request_p50": statistics.median(per_request) if per_request else None,
        "decode_tps_per_request": [round(x, 3) for x in per_request],
        "aggregate_tps": line.get("output_throughput"),
        "prefill_tps": line.get("input_throughput"),
        "duration_s": line.get("duration"),
        **{f"{m}_ms_{q}": line.get(f"{'median' if q == 'p50' else q}_{m}_ms") for m, q in LATENCIES},
    }


def failed_point(point: dict[str, int], why: str) -> dict[str, Any]:
    return {**point, "completed": 0, "errors": point["prompts"], "error_samples": [why[-500:]],
            "decode_tps_per_request_p50": None, "decode_tps_per_request": [], "aggregate_tps": None,
            "prefill_tps": None, "duration_s": None,
            **{f"{m}_ms_{q}": None for m, q in LATENCIES}}


def seed_of(point: dict[str, int]) -> int:
    """A seed of its own per point (and for the warm-up), so no point's prompts are another's: a prompt the prefix
    cache holds from an earlier point would read as a fast prefill."""
    return 1 + point["input"] * 7919 + point["output"] * 104729 + point["concurrency"] * 1299709 + point["prompts"]


def run_point(url: str, point: dict[str, int], *, tokenizer: str, model: str, out_dir: Path, api_key: str | None,
              warmup: int = 1, salt: int = 0) -> dict[str, Any]:
    """The generator for one point; its report in out_dir/<point>.log, its JSONL in out_dir/<point>.jsonl. (The
    Rust client has no timeout flag: a request the router never answers ends at the router's request timeout.)"""
    out_dir.mkdir(parents=True, exist_ok=True)
    tag = f"in{point['input']}-out{point['output']}-c{point['concurrency']}"
    jsonl, log = out_dir / f"{tag}.jsonl", out_dir / f"{tag}.log"
    jsonl.unlink(missing_ok=True)  # the generator appends
    args = argv(url, point, tokenizer, model, jsonl, warmup, seed_of(point) + salt)
    log.write_text(" ".join(args) + "\n")
    args += ["--header", f"Authorization: Bearer {api_key}"] if api_key else []
    t0 = time.monotonic()
    try:
        with _output_to(log):
            rc = generate(args)
    except Exception as e:  # noqa: BLE001 - the extension raises what it likes; the point fails, the run goes on
        rc, why = 1, f"{type(e).__name__}: {e}"
    else:
        why = ""
    lines = [ln for ln in jsonl.read_text().splitlines() if ln.strip()] if jsonl.exists() else []
    if rc != 0 or not lines:
        tail = log.read_text(errors="replace")[-800:]
        return failed_point(point, f"bench client exit {rc} after {time.monotonic() - t0:.0f} s {why}: {tail}")
    return summarise(json.loads(lines[-1]), point)


def warm_up(url: str, shape: dict[str, int], prompts: int, wait_s: float, **kw) -> dict[str, Any] | None:
    """C=1 requests of the first shape, not counted, then a wait (graphs captured, caches warm)."""
    if prompts <= 0:
        return None
    point = {"input": shape["input"], "output": shape["output"], "concurrency": 1, "prompts": prompts}
    res = run_point(url, point, out_dir=kw["out_dir"] / "warmup", salt=1,
                    **{k: v for k, v in kw.items() if k != "out_dir"})
    time.sleep(wait_s)
    return res
