"""Ahead-of-time build of kernels/csrc into one shared library (nvcc, no torch extension).

    python -m pdstack_kernels.build [--arch sm_120a --arch sm_90a] [--out DIR]

The library is loaded with ctypes by :mod:`pdstack_kernels.store` (the index-K store).
"""

from __future__ import annotations

import argparse
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

KERNELS_ROOT = Path(__file__).resolve().parent.parent
SOURCES = ("index_k_store_bf16.cu",)
LIB_NAME = "libpdstack_kernels.so"


def _find_csrc() -> Path:
    """kernels/csrc in a checkout; <prefix>/share/pdstack_kernels/csrc when pip-installed."""
    for cand in (KERNELS_ROOT / "csrc", Path(sys.prefix) / "share" / "pdstack_kernels" / "csrc"):
        if (cand / SOURCES[0]).exists():
            return cand
    return KERNELS_ROOT / "csrc"


CSRC = _find_csrc()
# In a checkout: kernels/build (git-ignored); installed: a per-user cache folder.
DEFAULT_OUT_DIR = (
    KERNELS_ROOT / "build"
    if (KERNELS_ROOT / "csrc").is_dir()
    else Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "pdstack_kernels"
)
DEFAULT_ARCHS = ("sm_120a",)
ARCH_ENV = "PDSTACK_CUDA_ARCHS"
NVCC_ENV = "PDSTACK_NVCC"
REQUIRED_NVCC_MAJOR = 13


class BuildError(RuntimeError):
    """nvcc is missing, has the wrong version, or failed."""


def find_nvcc() -> str:
    nvcc = os.environ.get(NVCC_ENV) or shutil.which("nvcc")
    if not nvcc:
        for cand in ("/usr/local/cuda/bin/nvcc", "/usr/local/bin/nvcc"):
            if Path(cand).exists():
                nvcc = cand
                break
    if not nvcc:
        raise BuildError(f"nvcc not found: put CUDA {REQUIRED_NVCC_MAJOR}.x on PATH or set {NVCC_ENV}")
    return nvcc


def nvcc_version(nvcc: str) -> tuple[int, int]:
    out = subprocess.run([nvcc, "--version"], capture_output=True, text=True, check=True).stdout
    m = re.search(r"release (\d+)\.(\d+)", out)
    if not m:
        raise BuildError(f"cannot read the nvcc version from: {out!r}")
    return int(m.group(1)), int(m.group(2))


def normalize_arch(arch: str) -> str:
    """'sm_90a', '90a', 'compute_120a' -> 'sm_90a' / 'sm_120a'."""
    a = arch.strip().lower().removeprefix("sm_").removeprefix("compute_")
    if not re.fullmatch(r"\d{2,3}[af]?", a):
        raise ValueError(f"bad CUDA arch {arch!r}: expected e.g. sm_120a or sm_90a")
    return f"sm_{a}"


def resolve_archs(archs: Sequence[str] | None = None) -> list[str]:
    """Explicit list > $PDSTACK_CUDA_ARCHS (comma/space separated) > sm_120a."""
    if not archs:
        env = os.environ.get(ARCH_ENV, "").replace(",", " ").split()
        archs = env or list(DEFAULT_ARCHS)
    return [normalize_arch(a) for a in archs]


def gencode_flags(archs: Sequence[str]) -> list[str]:
    flags = []
    for arch in archs:
        num = arch.removeprefix("sm_")
        flags.append(f"-gencode=arch=compute_{num},code=sm_{num}")
    return flags


def nvcc_flags(archs: Sequence[str] | None = None, nvcc: str | None = None) -> list[str]:
    """The one place that decides how kernels/csrc is compiled (asserts nvcc 13.x)."""
    nvcc = nvcc or find_nvcc()
    major, minor = nvcc_version(nvcc)
    if major != REQUIRED_NVCC_MAJOR:
        raise BuildError(f"{nvcc} is CUDA {major}.{minor}; pdstack kernels need nvcc {REQUIRED_NVCC_MAJOR}.x")
    return [
        "-O3",
        "-std=c++17",
        *gencode_flags(resolve_archs(archs)),
        "--threads=0",
        "-lineinfo",
        "-Xptxas=-v,-warn-spills,-warn-lmem-usage",
        "-shared",
        "-Xcompiler=-fPIC",
        "-cudart=static",
    ]


def build(
    archs: Sequence[str] | None = None,
    out_dir: str | os.PathLike[str] = DEFAULT_OUT_DIR,
    sources: Sequence[str] = SOURCES,
) -> Path:
    """Compile kernels/csrc (``sources``, default all) into ``out_dir/libpdstack_kernels.so``; return its path.

    ptxas' resource report (registers, spills) goes to ``out_dir/ptxas.log``;
    a spill or local-memory warning fails the build.
    """
    nvcc = find_nvcc()
    flags = nvcc_flags(archs, nvcc)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    lib = out / LIB_NAME
    tmp = out / (LIB_NAME + ".tmp")
    cmd = [nvcc, *flags, *(str(CSRC / s) for s in sources), "-o", str(tmp)]
    proc = subprocess.run(cmd, capture_output=True, text=True)
    log = proc.stdout + proc.stderr
    (out / "ptxas.log").write_text(" ".join(cmd) + "\n" + log)
    if proc.returncode != 0:
        raise BuildError(f"nvcc failed ({proc.returncode}):\n{' '.join(cmd)}\n{log}")
    spills = [ln for ln in log.splitlines() if re.search(r"[1-9]\d* bytes spill|Local memory used", ln)]
    if spills:
        raise BuildError("ptxas reports spills or local memory:\n" + "\n".join(spills))
    tmp.replace(lib)
    return lib


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m pdstack_kernels.build", description=__doc__.splitlines()[0])
    p.add_argument("--arch", action="append", help=f"CUDA arch, repeatable (default ${ARCH_ENV} or sm_120a)")
    p.add_argument("--out", default=str(DEFAULT_OUT_DIR), help="output folder (default kernels/build)")
    p.add_argument("--verbose", "-v", action="store_true", help="print ptxas' resource report")
    args = p.parse_args(argv)
    try:
        lib = build(args.arch, args.out)
    except BuildError as e:
        print(f"build failed: {e}", file=sys.stderr)
        return 1
    if args.verbose:
        print((Path(args.out) / "ptxas.log").read_text())
    print(lib)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
