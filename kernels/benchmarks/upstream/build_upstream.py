"""Build the upstream peers of our kernels, for the side-by-side benchmark (bench_vs_upstream.py).

    python kernels/benchmarks/upstream/build_upstream.py --out DIR [--arch 90a] [--sglang DIR] [--tvm-ffi DIR]
        [--deep-gemm-include DIR]

SGLang 0.5.23's JIT kernels are compiled the way its ``load_jit`` compiles them (same sources, same generated
tvm-ffi wrapper, same flags: ``-DSGL_CUDA_ARCH=<arch> -std=c++20 -O3 --expt-relaxed-constexpr
-gencode=arch=compute_<arch>,code=sm_<arch>``), ahead of time instead of at first call:

- ``sgl_topk_v1.so``: ``TopKKernel<true>::transform`` (topk_v1.cuh; SGLang's top-512 on sm_120, where it turns
  ``SGLANG_OPT_USE_TOPK_V2`` off).
- ``sgl_topk_v2.so``: ``TopKKernel<true>::{transform_paged,plan}`` (topk_v2.cuh; the default on Hopper).
  Built with the header's default cluster-occupancy macros (H200: 30 persistent 8-CTA clusters, no 16-CTA
  clusters); SGLang probes the device for them instead.
- ``sgl_norm_rope_fp8.so``: ``FusedNormRopeKernel<bf16_t, 128, 64, 64, 0, false, V4, true>::forward``
  (fused_norm_rope_v2.cuh, the fp8 + scale index-K store), and ``sgl_norm_rope_bf16.so``: the same with
  ``kBf16Store=true`` after applying our patch 0002 to a copy of the header.

DeepGEMM's ``fp8_paged_mqa_logits`` (sgl-deep-gemm 0.2.3.post2): ``dg_paged_mqa_logits.so`` compiles
``dg_paged_mqa_logits_shim.cu`` (beside this file) against the wheel's own kernel headers
(``deep_gemm/include``, with the CUTLASS/CuTe copy the wheel ships). See that file for why a shim.

Nothing is written into the source tree: ``--out`` is required (the bench passes build/ or $OUT).
"""

from __future__ import annotations

import argparse
import importlib.util
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
KERNELS = HERE.parent.parent
PATCH_0002 = KERNELS / "patches" / "sglang-0.5.23" / "0002-dsv4-bf16-index-k-store-kernel.patch"


def _pkg_dir(name: str) -> Path | None:
    spec = importlib.util.find_spec(name)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(list(spec.submodule_search_locations)[0])


def _wrapper(header: Path, exports: list[tuple[str, str]]) -> str:
    # sglang/kernels/jit/utils/compile/spec.py::_wrapper_source, verbatim in effect
    lines = [
        "#include <tvm/ffi/container/tensor.h>",
        "#include <tvm/ffi/dtype.h>",
        "#include <tvm/ffi/error.h>",
        "#include <tvm/ffi/extra/c_env_api.h>",
        "#include <tvm/ffi/function.h>",
        f'#include "{header}"',
        "namespace sglang {",
        *[f"TVM_FFI_DLL_EXPORT_TYPED_FUNC({name}, ({fn}));" for name, fn in exports],
        "}  // namespace sglang",
    ]
    return "\n".join(lines) + "\n"


def _nvcc(
    src: Path,
    out: Path,
    arch: str,
    includes: list[Path],
    libdirs: list[Path],
    libs: list[str],
    extra: list[str],
    verbose: bool,
) -> None:
    cmd = [
        "nvcc", f"-DSGL_CUDA_ARCH={int(arch[:2]) * 10}", "-std=c++20", "-O3", "--expt-relaxed-constexpr",
        f"-gencode=arch=compute_{arch},code=sm_{arch}", "-Xcompiler", "-fPIC", "-shared", "-cudart=static",
        *extra, *[f"-I{i}" for i in includes], str(src), "-o", str(out),
        *[f"-L{d}" for d in libdirs], *[f"-l{lib}" for lib in libs], "-Xlinker", "-rpath=$ORIGIN",
    ]  # fmt: skip
    if verbose:
        print(" ".join(cmd), flush=True)
    subprocess.run(cmd, check=True)


def build(
    out: Path,
    arch: str = "90a",
    sglang: Path | None = None,
    tvm_ffi: Path | None = None,
    deep_gemm_include: Path | None = None,
    only: list[str] | None = None,
    verbose: bool = False,
) -> dict:
    """Build the selected upstream modules into ``out``; returns {name: path or error string}."""
    out.mkdir(parents=True, exist_ok=True)
    sglang = sglang or _pkg_dir("sglang")
    tvm_ffi = tvm_ffi or _pkg_dir("tvm_ffi")
    results: dict[str, str] = {}
    want = set(only or ["topk_v1", "topk_v2", "norm_rope_fp8", "norm_rope_bf16", "deep_gemm"])
    work = Path(tempfile.mkdtemp(prefix="pdk-upstream-"))
    try:
        sgl_jobs = []
        if sglang is not None and tvm_ffi is not None:
            jit = sglang / "kernels" / "jit"
            csrc = jit / "csrc" / "deepseek_v4"
            patched = work / "sglang" / "kernels" / "jit" / "csrc" / "deepseek_v4" / "fused_norm_rope_v2.cuh"
            patched.parent.mkdir(parents=True)
            shutil.copy(csrc / "fused_norm_rope_v2.cuh", patched)
            if "norm_rope_bf16" in want:
                subprocess.run(["patch", "-s", "-p1", "-d", str(work), "-i", str(PATCH_0002)], check=True)
            norm = "FusedNormRopeKernel<bf16_t, 128, 64, 64, 0, {}, V4, true>::forward"
            sgl_jobs = [
                ("topk_v1", csrc / "topk_v1.cuh", [("topk_transform", "TopKKernel<true>::transform")]),
                ("topk_v2", csrc / "topk_v2.cuh", [("topk_transform_paged", "TopKKernel<true>::transform_paged"),
                                                  ("topk_plan", "TopKKernel<true>::plan")]),
                ("norm_rope_fp8", csrc / "fused_norm_rope_v2.cuh", [("forward", norm.format("false"))]),
                ("norm_rope_bf16", patched, [("forward", norm.format("true"))]),
            ]  # fmt: skip
            includes = [jit / "include", tvm_ffi / "include", tvm_ffi / "include" / "dlpack"]
            for name, header, exports in sgl_jobs:
                if name not in want:
                    continue
                src = work / f"{name}.cu"
                src.write_text(_wrapper(header, exports))
                so = out / f"sgl_{name}.so"
                try:
                    _nvcc(src, so, arch, includes, [tvm_ffi / "lib"], ["tvm_ffi"], [], verbose)
                    results[name] = str(so)
                except subprocess.CalledProcessError as exc:
                    results[name] = f"build failed: {exc}"
        else:
            for name in want - {"deep_gemm"}:
                results[name] = f"not built: sglang={sglang} tvm_ffi={tvm_ffi} (need both)"
        if "deep_gemm" in want:
            dg = deep_gemm_include
            if dg is None and (pkg := _pkg_dir("deep_gemm")) is not None:
                dg = pkg / "include"
            if dg is None or not (dg / "deep_gemm" / "impls" / "sm90_fp8_paged_mqa_logits.cuh").exists():
                results["deep_gemm"] = f"not built: no deep_gemm/include with the sm90 paged MQA kernel ({dg})"
            else:
                so = out / "dg_paged_mqa_logits.so"
                try:
                    _nvcc(HERE / "dg_paged_mqa_logits_shim.cu", so, arch, [dg], [], [],
                          ["--expt-extended-lambda", "--ptxas-options=--register-usage-level=10",
                           "--diag-suppress=39,161,174,177,186,940"], verbose)  # fmt: skip
                    results["deep_gemm"] = str(so)
                except subprocess.CalledProcessError as exc:
                    results["deep_gemm"] = f"build failed: {exc}"
    finally:
        shutil.rmtree(work, ignore_errors=True)
    return results


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--arch", default="90a", help="90a (H200) or 120a (RTX PRO 6000)")
    p.add_argument("--sglang", type=Path, help="the sglang package directory (default: the installed one)")
    p.add_argument("--tvm-ffi", type=Path, help="the tvm_ffi package directory (default: the installed one)")
    p.add_argument("--deep-gemm-include", type=Path, help="sgl-deep-gemm's deep_gemm/include")
    p.add_argument("--only", nargs="+")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args(argv)
    res = build(a.out, a.arch, a.sglang, a.tvm_ffi, a.deep_gemm_include, a.only, a.verbose)
    for k, v in res.items():
        print(f"{k}: {v}")
    return 0 if all(not v.startswith(("build failed", "not built")) for v in res.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
