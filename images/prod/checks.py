"""In-image checks, run as the prod image's last build step (no GPU here): a failure fails the build.

    python3 checks.py --series DIR --plan-argv FILE --model-config DIR --report PATH

1. Every Python module the patch series touches imports with the image's real dependencies, each in a fresh
   interpreter. A module that cannot import without a GPU (CUDA driver / NVML / device queries at import time) is
   recorded with the reason and its traceback and does not fail the build; any other import error does.
2. `python -m sglang.launch_server --help` exits 0.
3. The production plan's argv of each server (prefill, decode; with the server's environment) is parsed by the
   image's own SGLang parser
   (`ServerArgs.add_cli_args` with allow_abbrev=False: unknown or abbreviated flags fail, then
   `prepare_server_args`, what launch_server runs), with --model-path pointed at a
   directory holding the model's config.json and `--device cuda` added (what SGLang detects on the GPU host; without
   it resolution stops at once here: no accelerator); then ServerArgs' resolution (`resolve_once`: model overrides for
   DeepSeek-V4, page size, backends, ...) runs as far as it can without weights or a GPU; where it stops is recorded.
4. sglang-router is installed: `python -m sglang_router.launch_router --help` exits 0.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path

# Words in a traceback that mean "this needs a GPU / the CUDA driver", not "this is broken".
GPU_ONLY = re.compile(r"libcuda\.so|CUDA driver|no CUDA GPUs|cudaGetDeviceCount|NVML|nvidia-smi|Found no NVIDIA driver"
                      r"|torch\.cuda\.is_available\(\) is False|CUDA_ERROR_NO_DEVICE|no NVIDIA GPU", re.IGNORECASE)
_TARGET = re.compile(r"^\+\+\+ (?:b/)?(\S+\.py)$", re.MULTILINE)


def patched_modules(series: Path) -> list[str]:
    names = [ln.split("#", 1)[0].strip() for ln in (series / "series").read_text().splitlines()]
    files = sorted({m for n in names if n for m in _TARGET.findall((series / n).read_text())})
    return [f.removesuffix(".py").replace("/", ".") for f in files]


def run(cmd: list[str], timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, env=env)


def check_imports(series: Path) -> tuple[list[dict], list[str]]:
    rows, failures = [], []
    for mod in patched_modules(series):
        t0 = time.monotonic()
        r = run([sys.executable, "-c", f"import {mod}"])
        row = {"module": mod, "ok": r.returncode == 0, "seconds": round(time.monotonic() - t0, 1)}
        if r.returncode != 0:
            row["traceback"] = r.stderr[-4000:]
            row["needs_gpu"] = bool(GPU_ONLY.search(r.stderr))
            if not row["needs_gpu"]:
                failures.append(f"import {mod} failed: {r.stderr.strip().splitlines()[-1]}")
        rows.append(row)
        print(f"checks: import {mod}: {'ok' if row['ok'] else 'needs a GPU' if row.get('needs_gpu') else 'FAILED'}",
              flush=True)
    return rows, failures


_SERVER_ARGS = r"""
import argparse, json, sys, traceback
from sglang.srt.server_args import ServerArgs, prepare_server_args
argv = json.loads(sys.argv[1])
KEYS = ("page_size", "attention_backend", "prefill_attention_backend", "decode_attention_backend", "tp_size",
        "disaggregation_mode", "disaggregation_transfer_backend", "context_length", "hicache_ratio",
        "moe_runner_backend", "kv_cache_dtype", "swa_full_tokens_ratio")
p = argparse.ArgumentParser(allow_abbrev=False)
ServerArgs.add_cli_args(p)
p.parse_args(argv)   # strict: unknown flags and abbreviations exit 2 here
out = {"parsed": True}
try:
    sa = prepare_server_args(argv)   # what `sglang serve` / launch_server do first
    sa.resolve_once()                # then this: the resolution pipeline (model overrides, backends, pools, ...)
    d = sa.resolved_dict()
    out |= {"resolved": True} | {k: d.get(k) for k in KEYS}
except BaseException as e:
    tb = traceback.extract_tb(e.__traceback__)
    out |= {"resolved": False, "stopped_at": f"{tb[-1].filename}:{tb[-1].lineno} ({tb[-1].name})" if tb else "?",
            "error": f"{type(e).__name__}: {e}"[:1000], "traceback": traceback.format_exc()[-4000:]}
print("PDSTACK-RESULT " + json.dumps(out, default=str))
"""


def check_plan_argv(plan_argv: Path, model_dir: Path) -> tuple[list[dict], list[str]]:
    rows, failures = [], []
    for name, server in json.loads(plan_argv.read_text()).items():
        flags = server["flags"]
        argv = list(flags)
        if "--model-path" in argv:
            argv[argv.index("--model-path") + 1] = str(model_dir)
        if "--device" not in argv:  # what SGLang detects on the GPU host; this build machine has no accelerator
            argv += ["--device", "cuda"]
        r = run([sys.executable, "-c", _SERVER_ARGS, json.dumps(argv)], env={**os.environ, **server.get("env", {})})
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("PDSTACK-RESULT ")), None)
        row = {"server": name, "argv": flags}
        if line is None:
            row |= {"parsed": False, "stderr": r.stderr[-3000:]}
            failures.append(f"{name}: the image's SGLang parser refused the plan's argv: "
                            f"{(r.stderr.strip().splitlines() or ['?'])[-1]}")
        else:
            row |= json.loads(line.removeprefix("PDSTACK-RESULT "))
        rows.append(row)
        state = "resolved" if row.get("resolved") else f"parsed; resolution stopped at {row.get('stopped_at')}" \
            if row.get("parsed") else "REFUSED"
        print(f"checks: {name} argv: {state}" + (f" ({row.get('error')})" if row.get("error") else ""), flush=True)
    return rows, failures


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--series", type=Path, required=True)
    p.add_argument("--plan-argv", type=Path, required=True)
    p.add_argument("--model-config", type=Path, required=True, help="a directory holding the model's config.json")
    p.add_argument("--report", type=Path, required=True)
    args = p.parse_args(argv)
    report: dict = {}
    failures: list[str] = []
    report["imports"], bad = check_imports(args.series)
    failures += bad
    for what, cmd in (("launch_server_help", [sys.executable, "-m", "sglang.launch_server", "--help"]),
                      ("router_help", [sys.executable, "-m", "sglang_router.launch_router", "--help"])):
        r = run(cmd)
        report[what] = {"rc": r.returncode, "lines": len(r.stdout.splitlines())}
        print(f"checks: {' '.join(cmd[1:])}: rc {r.returncode}, {len(r.stdout.splitlines())} lines", flush=True)
        if r.returncode != 0:
            failures.append(f"{' '.join(cmd[1:])} exited {r.returncode}: {r.stderr[-1500:]}")
    report["plan_argv"], bad = check_plan_argv(args.plan_argv, args.model_config)
    failures += bad
    report["failures"] = failures
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    for f in failures:
        print(f"checks: FAILED: {f}", file=sys.stderr)
    return 1 if failures else 0


if __name__ == "__main__":
    raise SystemExit(main())
