"""Fused RMSNorm + RoPE + Hadamard + bf16 store of indexer keys (CUDA, kernels/csrc, loaded with ctypes).

Signature mirrors SGLang 0.5.23's ``compress_norm_rope_store`` (sglang/kernels/ops/attention/dsv4/compress.py)
for the indexer (head_dim 128), minus the fp4/fp8/HIP options, so a patch can call it in the same place.
"""

from __future__ import annotations

import ctypes
import os
import threading
from pathlib import Path

import torch

from . import build as _build
from ._checks import KernelArgError, check_tensor

PAGE_SIZE = 64
HEAD_DIM = 128
ROPE_DIM = 64
ABI_VERSION = 3
LIB_ENV = "PDSTACK_KERNELS_LIB"

_lock = threading.Lock()
_lib: ctypes.CDLL | None = None


def _device_arch(device: torch.device) -> str:
    major, minor = torch.cuda.get_device_capability(device)
    return f"sm_{major}{minor}a" if major >= 9 else f"sm_{major}{minor}"


def load_library(path: str | os.PathLike[str] | None = None, *, build_if_missing: bool = True) -> ctypes.CDLL:
    """Load libpdstack_kernels.so: ``path`` > $PDSTACK_KERNELS_LIB > kernels/build/; build it if missing.

    A missing library is built for the current CUDA device's arch (e.g. sm_90a on an H200).
    """
    global _lib
    with _lock:
        if _lib is not None and path is None:
            return _lib
        lib_path = Path(path or os.environ.get(LIB_ENV) or _build.DEFAULT_OUT_DIR / _build.LIB_NAME)
        if not lib_path.exists():
            if not build_if_missing:
                raise FileNotFoundError(f"{lib_path} not found: run `python -m pdstack_kernels.build`")
            archs = [_device_arch(torch.device("cuda"))] if torch.cuda.is_available() else None
            lib_path = _build.build(archs, lib_path.parent)
        lib = ctypes.CDLL(str(lib_path))
        if lib.pdstack_kernels_abi_version() != ABI_VERSION:
            raise RuntimeError(f"{lib_path} has ABI {lib.pdstack_kernels_abi_version()}, expected {ABI_VERSION}")
        fn = lib.pdstack_index_k_store_bf16
        fn.restype = ctypes.c_int
        fn.argtypes = [
            ctypes.c_void_p,  # input
            ctypes.c_void_p,  # plans
            ctypes.c_void_p,  # weight
            ctypes.c_void_p,  # freqs_cis
            ctypes.c_void_p,  # out_loc
            ctypes.c_void_p,  # kvcache
            ctypes.c_float,  # eps
            ctypes.c_uint32,  # compress_ratio
            ctypes.c_uint32,  # num_tokens
            ctypes.c_int,  # is_decode
            ctypes.c_void_p,  # stream
        ]
        if path is None:
            _lib = lib
        return lib


def _plan_parts(plan, compress_ratio, is_decode):
    """Accept upstream's CompressorDecodePlan / CompressorPrefillPlan or a raw [N, 16] uint8 plan tensor."""
    if isinstance(plan, torch.Tensor):
        if compress_ratio is None or is_decode is None:
            raise KernelArgError("a raw plan tensor needs compress_ratio= and is_decode=")
        return plan, int(compress_ratio), bool(is_decode)
    tensor = plan[1]
    ratio = int(plan.compress_ratio if compress_ratio is None else compress_ratio)
    decode = bool(plan.is_decode if is_decode is None else is_decode)
    return tensor, ratio, decode


def index_k_store_bf16(
    kv: torch.Tensor,
    plan,
    *,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_cis: torch.Tensor,
    out_loc: torch.Tensor,
    kvcache: torch.Tensor,
    page_size: int = PAGE_SIZE,
    compress_ratio: int | None = None,
    is_decode: bool | None = None,
) -> None:
    """Normalise, rotate and store compressed indexer keys as bf16 into the paged cache (in place).

    kv [N, 128] bf16: compressed keys (upstream's ``compress_forward`` output).
    plan: upstream's CompressorDecodePlan / CompressorPrefillPlan (``plan[1]`` is [N, 16] uint8), or that
        uint8 tensor with ``compress_ratio`` and ``is_decode`` given. Decode rows store only when
        seq_len % compress_ratio == 0; extend rows skip invalid plans. Position = seq_len - compress_ratio.
    norm_weight [128] (cast to bf16 like upstream), freq_cis complex [P, 32] or float32 [P, 64].
    out_loc int64: slots; decode reads out_loc[i], extend out_loc[plan.ragged_id].
    kvcache: bf16 [num_pages, 64, 1, 128] (or any contiguous bf16 view with 64*128 elements per page).
    """
    plan_t, ratio, decode = _plan_parts(plan, compress_ratio, is_decode)
    check_tensor("kv", kv, dtype=torch.bfloat16, ndim=2, contiguous=True)
    n, dim = kv.shape
    dev = kv.device
    if dim != HEAD_DIM:
        raise KernelArgError(f"kv must be [N, {HEAD_DIM}], got {tuple(kv.shape)}")
    if dev.type != "cuda":
        raise KernelArgError(f"kv must be on a CUDA device, got {dev}")
    if page_size != PAGE_SIZE:
        raise KernelArgError(f"page_size must be {PAGE_SIZE}, got {page_size}")
    if ratio <= 0:
        raise KernelArgError(f"compress_ratio must be positive, got {ratio}")
    check_tensor("plan", plan_t, dtype=torch.uint8, shape=(n, 16), device=dev, contiguous=True)
    if norm_weight.dtype != torch.bfloat16:
        norm_weight = norm_weight.to(torch.bfloat16)
    check_tensor("norm_weight", norm_weight, shape=(HEAD_DIM,), device=dev, contiguous=True)
    if freq_cis.is_complex():
        freq_cis = torch.view_as_real(freq_cis).flatten(-2)
    check_tensor("freq_cis", freq_cis, dtype=torch.float32, shape=(None, ROPE_DIM), device=dev, contiguous=True)
    check_tensor("out_loc", out_loc, dtype=torch.int64, ndim=1, device=dev, contiguous=True)
    if decode and out_loc.shape[0] != n:
        raise KernelArgError(f"out_loc must have {n} entries in decode mode, got {out_loc.shape[0]}")
    if not decode and out_loc.shape[0] < n:
        raise KernelArgError(f"out_loc must have >= {n} entries in extend mode, got {out_loc.shape[0]}")
    check_tensor("kvcache", kvcache, dtype=torch.bfloat16, device=dev, contiguous=True)
    if kvcache.dim() < 2 or kvcache[0].numel() != PAGE_SIZE * HEAD_DIM:
        raise KernelArgError(
            f"kvcache must be [num_pages, {PAGE_SIZE}, 1, {HEAD_DIM}] bf16, got {tuple(kvcache.shape)}"
        )
    if n == 0:
        return
    lib = load_library()
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        err = lib.pdstack_index_k_store_bf16(
            kv.data_ptr(), plan_t.data_ptr(), norm_weight.data_ptr(), freq_cis.data_ptr(), out_loc.data_ptr(),
            kvcache.data_ptr(), float(norm_eps), ratio, n, int(decode), stream,
        )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"pdstack_index_k_store_bf16 failed: cudaError {err}")
