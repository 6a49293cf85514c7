"""Compile SGLang 0.5.23's DeepSeek-V4 JIT kernels ahead of time, at image build time (runs inside the image).

SGLang JIT-compiles its CUDA kernels (sglang/kernels/jit/csrc/*.cuh, through tvm_ffi + ninja + nvcc) the first time
a kernel is called, into a content-addressed cache at $SGLANG_JIT_CACHE_DIR (sglang/kernels/jit/utils/compile/cache.py;
a build is reused when the sources, flags, target arch and toolchain still match). SGLang offers two hooks that make
an ahead-of-time build possible on a machine without a GPU:

  * ``sglang.kernels.jit.utils.arch.override_jit_cuda_arch(12, 0)``: compile for sm_120 although no GPU is present
    (the target resolves to sm_120f with nvcc >= 12.9, exactly what a RTX PRO 6000 resolves to at run time);
  * the persistent cache itself: the image sets SGLANG_JIT_CACHE_DIR to a directory inside the image, so the
    serving process finds these builds instead of compiling them.

We call the module loaders whose template arguments do not depend on the model's shapes or dtypes (so the cache
key is exactly the one the server computes). Every shape-templated DSv4 kernel (norm+RoPE, compressors, stores,
indexer q/k, top-k, MoE) still compiles on first start, into the same cache directory: mount a host volume there
to pay that once per host. The list below and the README's "Building images" section must agree.

    python3 jit_aot.py --arch sm_120a --mode auto|require|off --report PATH
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from pathlib import Path

# (module, loader function): DeepSeek-V4 JIT modules with argument-free loaders (sglang/kernels/ops/attention/dsv4).
AOT_MODULES = (
    ("sglang.kernels.ops.attention.dsv4.attn", "_jit_metadata_module"),
    ("sglang.kernels.ops.attention.dsv4.candidate_table", "_jit_candidate_block_table_module"),
    ("sglang.kernels.ops.attention.dsv4.compress", "_jit_compress_plan_module"),
    ("sglang.kernels.ops.attention.dsv4.flashmla_sched_meta", "_jit_flashmla_sched_meta_module"),
    ("sglang.kernels.ops.attention.dsv4.norm_rope", "_jit_fused_rope_module"),
)
# Compiled on first start (template arguments come from the model config / server flags).
FIRST_START = (
    "norm_rope: fused_norm_rope, main_q_norm_rope, main_k_norm_rope_flashmla, main_q_indexer_rope_hadamard_quant",
    "compress: compress_norm_rope, compress (ratio 4/128), compress_128_online_v2; low_ratio_compress: c1, c2",
    "attn: fused_store (flashmla / indexer; the bf16 index-K store of our patch series lives here)",
    "fp4_indexer_rope: index_k_rope_pack, index_q_rope_pack; candidate_blocks: block_amax",
    "topk (topk_v1/v2 transform_512), wo_a, online_c128_mtp, moe/dsv4, silu_and_mul_clamp",
)


def _why_not() -> str | None:
    """None if this image can run SGLang's JIT compiler, else the reason it cannot."""
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not getattr(torch.version, "cuda", None):
        return f"torch {torch.__version__} is a CPU build (SGLang's JIT needs CUDA torch headers)"
    for mod in ("tvm_ffi", "ninja"):
        try:
            importlib.import_module(mod)
        except ImportError:
            return f"python module {mod} is missing (SGLang's JIT builds through it)"
    return None


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--arch", default="sm_120a", help="CUDA archs (space list); SGLang's JIT is built for the first")
    p.add_argument("--mode", choices=("auto", "require", "off"), default="auto")
    p.add_argument("--report", type=Path, required=True)
    args = p.parse_args(argv)
    arch = args.arch.split()[0].removeprefix("sm_").rstrip("af")
    major, minor = int(arch[:-1]), int(arch[-1])
    report: dict = {"mode": args.mode, "arch": f"{major}.{minor}", "cache_dir": os.environ.get("SGLANG_JIT_CACHE_DIR"),
                    "compiled": [], "first_start": list(FIRST_START), "skipped": None}
    why = "--mode off" if args.mode == "off" else _why_not()
    if why:
        report["skipped"] = why
        args.report.write_text(json.dumps(report, indent=2) + "\n")
        print(f"jit-aot: skipped: {why}; every SGLang JIT kernel compiles on first start")
        if args.mode == "require":
            print("jit-aot: --mode require: failing (use a CUDA SGLang base, or JIT_AOT=auto)", file=sys.stderr)
            return 1
        return 0
    from sglang.kernels.jit.utils.arch import override_jit_cuda_arch

    failed = []
    with override_jit_cuda_arch(major, minor):
        for mod, fn in AOT_MODULES:
            t0 = time.monotonic()
            try:
                getattr(importlib.import_module(mod), fn)()
            except Exception as e:  # loading may fail without a driver after the build was published; keep going
                failed.append(f"{mod}.{fn}: {type(e).__name__}: {e}")
                print(f"jit-aot: {fn}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            report["compiled"].append({"module": f"{mod}.{fn}", "seconds": round(time.monotonic() - t0, 1)})
            print(f"jit-aot: {fn} ({time.monotonic() - t0:.0f} s)")
    cache = Path(report["cache_dir"] or "~/.cache/sglang/jit").expanduser()
    built = sorted(str(p.relative_to(cache)) for p in cache.rglob("*.so")) if cache.is_dir() else []
    report["cache_objects"] = built
    report["failed"] = failed
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    if failed and not built:
        print("jit-aot: nothing compiled", file=sys.stderr)
        return 1 if args.mode == "require" else 0
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
