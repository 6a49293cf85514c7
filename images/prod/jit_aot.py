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
to pay that once per host. The list below and docs/images.md ("SGLang's JIT kernels") must agree.

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
# The index-K store (compress.py's _jit_compress_norm_rope_module, the kernel our patch 0002 changes), once per
# index_k_dtype our plans can select (inventory `pdstack_model.index_k_dtype`): bf16 (bf16_store=True, our recall fix)
# and fp8 (bf16_store=False, upstream). Its other template arguments are fixed for DeepSeek-V4 on CUDA: the compressor
# runs in the model's bf16, the indexer's head_dim is 128 with a 64-dim RoPE, and the c4 index pool's page is
# SGLang's DSv4 page size 256 (arg_groups/model_overrides/deepseek_v4.py) // compress ratio 4 = 64 slots, V4 layout.
INDEX_K_STORES = (("bf16", True), ("fp8", False))
INDEX_K_SHAPE = {"head_dim": 128, "rope_dim": 64, "page_size": 64}
# Compiled on first start (template arguments come from the model config / server flags).
FIRST_START = (
    "norm_rope: fused_norm_rope, main_q_norm_rope, main_k_norm_rope_flashmla, main_q_indexer_rope_hadamard_quant",
    "compress: compress (ratio 4/128), compress_128_online_v2; low_ratio_compress: c1, c2; the latent (head_dim 512) "
    "compress_norm_rope store",
    "attn: fused_store (flashmla / indexer)",
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
        for name, load in _jobs():
            t0 = time.monotonic()
            try:
                load()
            except Exception as e:  # keep going, so the report names every module that fails
                failed.append(f"{name}: {type(e).__name__}: {e}")
                print(f"jit-aot: FAILED {name}: {type(e).__name__}: {e}", file=sys.stderr)
                continue
            report["compiled"].append({"module": name, "seconds": round(time.monotonic() - t0, 1)})
            print(f"jit-aot: {name} ({time.monotonic() - t0:.0f} s)", flush=True)
    cache = Path(report["cache_dir"] or "~/.cache/sglang/jit").expanduser()
    built = sorted(str(p.relative_to(cache)) for p in cache.rglob("*.so")) if cache.is_dir() else []
    report["cache_objects"] = built
    report["failed"] = failed
    args.report.write_text(json.dumps(report, indent=2) + "\n")
    if failed and args.mode == "require":
        print(f"jit-aot: --mode require: {len(failed)} module(s) failed to compile: " + "; ".join(failed),
              file=sys.stderr)
        return 1
    return 0


def _jobs():
    """(name, loader) for every module compiled here: the argument-free ones, then each index-K store."""
    for mod, fn in AOT_MODULES:
        yield f"{mod}.{fn}", lambda mod=mod, fn=fn: getattr(importlib.import_module(mod), fn)()
    for dtype_name, bf16_store in INDEX_K_STORES:
        def load(bf16_store=bf16_store):
            import torch
            from sglang.kernels.ops.attention.dsv4.compress import KVLayout, _jit_compress_norm_rope_module

            shape = INDEX_K_SHAPE
            _jit_compress_norm_rope_module(torch.bfloat16, shape["head_dim"], shape["rope_dim"], shape["page_size"],
                                           bf16_store, KVLayout.V4)
        yield f"index-K store {dtype_name} (compress._jit_compress_norm_rope_module, bf16_store={bf16_store})", load


if __name__ == "__main__":
    raise SystemExit(main())
