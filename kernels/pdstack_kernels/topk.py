"""Top-512 selection over indexer logits + transform to physical KV slots (upstream's topk_transform).

Mirrors SGLang 0.5.23's ``topk_transform_paged`` (jit ``topk_v1.cuh``): row b ranks its first seq_lens[b]
logits; rows with seq_len <= topk take positions 0..seq_len-1 in order and -1 after; longer rows take the
topk largest in no particular order. A position i becomes ``page_table[b, i >> page_bits] << page_bits |
(i & (page_size - 1))``. Ties at the k-th value are broken arbitrarily (as upstream). NaN logits are not
supported (as upstream).

Two exact Triton radix selects, neither sorts nor allocates [B, N] temporaries:

- split (default): each row is cut into ``block``-element segments, one program per segment, so even B=1
  fills the GPU. ``32 / radix_bits`` histogram launches: each program re-derives the prefix of the k-th
  largest key from the previous passes' per-row histograms (a few hundred int32 in a small zeroed
  workspace), histograms its segment's keys that still match the prefix, and merges into the row's
  histogram with atomics; once the bucket that holds the k-th key is taken whole, later passes return at
  once. A last launch writes: keys above the prefix get output slots from a per-row atomic counter, keys
  equal to it from a second counter, kept while their rank < the remaining k (ties: arbitrary, exact count).
- single (``programs_per_row=1``): the previous one-program-per-row kernel (all passes in one launch).

And one CUDA kernel (``backend="cuda"``, kernels/csrc/topk512.cu, ctypes): one launch, one 1024-thread CTA per
row, 11-bit then 8-bit radix passes over keys staged in shared memory (or over the threshold bucket's
candidates compacted there for rows too long to stage).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
import triton
import triton.language as tl

from ._checks import KernelArgError, check_tensor

TOPK = 512


@triton.jit
def _ordered_key(x):
    """float32 -> uint32 whose unsigned order is the float order (-inf smallest)."""
    bits = x.to(tl.uint32, bitcast=True)
    flip = tl.where((bits >> 31) != 0, 0xFFFFFFFF, 0x80000000).to(tl.uint32)
    return bits ^ flip


@triton.jit
def _topk_transform_kernel(
    logits_ptr,
    seq_lens_ptr,
    pt_ptr,
    out_ptr,
    raw_ptr,
    stride_lb,
    stride_ptb,
    width,
    K: tl.constexpr,
    PAGE_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    HAS_RAW: tl.constexpr,
    ONEHOT: tl.constexpr,
):
    b = tl.program_id(0).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), width)
    row = logits_ptr + b * stride_lb
    pt_row = pt_ptr + b * stride_ptb
    out_row = out_ptr + b * K
    raw_row = raw_ptr + b * K
    offs = tl.arange(0, BLOCK)
    PAGE_MASK: tl.constexpr = (1 << PAGE_BITS) - 1

    if n <= K:
        # short row: positions 0..n-1 in order, -1 after
        for start in range(0, K, BLOCK):
            i = start + offs
            keep = i < n
            page = tl.load(pt_row + (i >> PAGE_BITS), mask=keep, other=0)
            slot = tl.where(keep, (page << PAGE_BITS) | (i & PAGE_MASK), -1)
            tl.store(out_row + i, slot, mask=i < K)
            if HAS_RAW:
                tl.store(raw_row + i, tl.where(keep, i, -1), mask=i < K)
    else:
        NBINS: tl.constexpr = 1 << RADIX_BITS
        NPASS: tl.constexpr = (32 + RADIX_BITS - 1) // RADIX_BITS
        bins = tl.arange(0, NBINS)
        prefix = tl.zeros([], tl.uint32)  # resolved high bits of the k-th largest key
        shift = tl.full([], 32, tl.int32)  # low bits not yet resolved
        k_rem = tl.full([], K, tl.int32)  # how many to take among keys whose high bits == prefix
        active = tl.full([], 1, tl.int32)
        for ps in tl.static_range(NPASS):
            if active != 0:
                new_shift = tl.maximum(shift - RADIX_BITS, 0)
                width_bits = shift - new_shift
                digit_mask = ((1 << width_bits) - 1).to(tl.uint32)
                hist = tl.zeros([NBINS], tl.int32)
                for start in range(0, n, BLOCK):
                    i = start + offs
                    m = i < n
                    key = _ordered_key(tl.load(row + i, mask=m, other=0.0))
                    if ps > 0:
                        m = m & ((key >> shift.to(tl.uint32)) == prefix)
                    digit = ((key >> new_shift.to(tl.uint32)) & digit_mask).to(tl.int32)
                    if ONEHOT:  # few bins: compare-and-count beats tl.histogram's lowering
                        hit_bins = (digit[:, None] == bins[None, :]) & m[:, None]
                        hist += tl.sum(hit_bins.to(tl.int32), 0)
                    else:
                        hist += tl.histogram(digit, NBINS, mask=m)
                # count of eligible keys with digit > d, for every d
                above = tl.sum(hist, 0) - tl.cumsum(hist, 0)
                hit = (above < k_rem) & (above + hist >= k_rem)
                d_star = tl.sum(tl.where(hit, bins, 0), 0)
                above_star = tl.sum(tl.where(hit, above, 0), 0)
                hist_star = tl.sum(tl.where(hit, hist, 0), 0)
                k_rem = k_rem - above_star
                prefix = (prefix << width_bits.to(tl.uint32)) | d_star.to(tl.uint32)
                shift = new_shift
                active = ((hist_star != k_rem) & (shift != 0)).to(tl.int32)
        # write pass: keys above the prefix all go; keys equal to it fill the last k_rem slots
        n_gt = K - k_rem
        base_gt = tl.zeros([], tl.int32)
        base_eq = tl.zeros([], tl.int32)
        for start in range(0, n, BLOCK):
            i = start + offs
            m = i < n
            key = _ordered_key(tl.load(row + i, mask=m, other=0.0))
            hi = key >> shift.to(tl.uint32)
            gt = m & (hi > prefix)
            eq = m & (hi == prefix)
            gt_i = gt.to(tl.int32)
            eq_i = eq.to(tl.int32)
            slot_gt = base_gt + tl.cumsum(gt_i, 0) - 1
            rank_eq = base_eq + tl.cumsum(eq_i, 0) - 1
            take_eq = eq & (rank_eq < k_rem)
            dst = tl.where(gt, slot_gt, n_gt + rank_eq)
            sel = gt | take_eq
            page = tl.load(pt_row + (i >> PAGE_BITS), mask=sel, other=0)
            slot = (page << PAGE_BITS) | (i & PAGE_MASK)
            tl.store(out_row + dst, slot, mask=sel)
            if HAS_RAW:
                tl.store(raw_row + dst, i, mask=sel)
            base_gt += tl.sum(gt_i, 0)
            base_eq += tl.sum(eq_i, 0)


@triton.jit
def _radix_state(ws_row, NPASS: tl.constexpr, K: tl.constexpr, RADIX_BITS: tl.constexpr):
    """Replay the first ``NPASS`` histogram passes of a row: (prefix, shift, k_rem, active).

    prefix = resolved high ``32 - shift`` bits of the k-th largest key; k_rem = how many keys whose high bits
    equal prefix are still to be taken; active = 0 once that bucket is taken whole (or all bits resolved)."""
    NBINS: tl.constexpr = 1 << RADIX_BITS
    bins = tl.arange(0, NBINS)
    prefix = tl.zeros([], tl.uint32)
    shift = tl.full([], 32, tl.int32)
    k_rem = tl.full([], K, tl.int32)
    active = tl.full([], 1, tl.int32)
    for ps in tl.static_range(NPASS):  # unrolled: every pass's histogram load is issued up front
        hist = tl.load(ws_row + ps * NBINS + bins)
        new_shift = tl.maximum(shift - RADIX_BITS, 0)
        width_bits = shift - new_shift
        above = tl.sum(hist, 0) - tl.cumsum(hist, 0)
        hit = (above < k_rem) & (above + hist >= k_rem)
        d_star = tl.sum(tl.where(hit, bins, 0), 0)
        above_star = tl.sum(tl.where(hit, above, 0), 0)
        hist_star = tl.sum(tl.where(hit, hist, 0), 0)
        upd = active != 0
        k_new = k_rem - above_star
        prefix = tl.where(upd, (prefix << width_bits.to(tl.uint32)) | d_star.to(tl.uint32), prefix)
        active = tl.where(upd, ((hist_star != k_new) & (new_shift != 0)).to(tl.int32), active)
        k_rem = tl.where(upd, k_new, k_rem)
        shift = tl.where(upd, new_shift, shift)
    return prefix, shift, k_rem, active


@triton.jit
def _topk_hist_kernel(
    logits_ptr,
    seq_lens_ptr,
    ws_ptr,
    stride_lb,
    stride_ws,
    width,
    PASS: tl.constexpr,
    K: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
):
    """Pass ``PASS`` of the split radix select: this segment's histogram of the next digit, merged by atomics."""
    NBINS: tl.constexpr = 1 << RADIX_BITS
    s = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), width)
    start = s * BLOCK
    i = start + tl.arange(0, BLOCK)
    # issued before seq_len arrives (masked by the width only; positions >= seq_len are masked below)
    x = tl.load(logits_ptr + b * stride_lb + i, mask=i < width, other=0.0)
    if (n > K) & (start < n):
        ws_row = ws_ptr + b * stride_ws
        prefix, shift, k_rem, active = _radix_state(ws_row, PASS, K, RADIX_BITS)
        if active != 0:
            m = i < n
            key = _ordered_key(x)
            if PASS > 0:  # pass 0 has no prefix yet
                m = m & ((key >> shift.to(tl.uint32)) == prefix)
            new_shift = tl.maximum(shift - RADIX_BITS, 0)
            digit_mask = ((1 << (shift - new_shift)) - 1).to(tl.uint32)
            digit = ((key >> new_shift.to(tl.uint32)) & digit_mask).to(tl.int32)
            hist = tl.histogram(digit, NBINS, mask=m)
            tl.atomic_add(ws_row + PASS * NBINS + tl.arange(0, NBINS), hist, mask=hist > 0, sem="relaxed")


@triton.jit
def _topk_write_kernel(
    logits_ptr,
    seq_lens_ptr,
    pt_ptr,
    out_ptr,
    raw_ptr,
    ws_ptr,
    stride_lb,
    stride_ptb,
    stride_ws,
    width,
    NPASS: tl.constexpr,
    K: tl.constexpr,
    RADIX_BITS: tl.constexpr,
    PAGE_BITS: tl.constexpr,
    BLOCK: tl.constexpr,
    HAS_RAW: tl.constexpr,
):
    """Last launch of the split select: selected positions of this segment -> slots (counters in the workspace)."""
    NBINS: tl.constexpr = 1 << RADIX_BITS
    PAGE_MASK: tl.constexpr = (1 << PAGE_BITS) - 1
    s = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    n = tl.minimum(tl.maximum(tl.load(seq_lens_ptr + b), 0), width)
    pt_row = pt_ptr + b * stride_ptb
    out_row = out_ptr + b * K
    raw_row = raw_ptr + b * K
    offs = tl.arange(0, BLOCK)
    if n <= K:
        if s == 0:  # short row: positions 0..n-1 in order, -1 after
            for start in range(0, K, BLOCK):
                i = start + offs
                keep = i < n
                page = tl.load(pt_row + (i >> PAGE_BITS), mask=keep, other=0)
                slot = tl.where(keep, (page << PAGE_BITS) | (i & PAGE_MASK), -1)
                tl.store(out_row + i, slot, mask=i < K)
                if HAS_RAW:
                    tl.store(raw_row + i, tl.where(keep, i, -1), mask=i < K)
    else:
        start = s * BLOCK
        i = start + offs
        x = tl.load(logits_ptr + b * stride_lb + i, mask=i < width, other=0.0)
        if start < n:
            ws_row = ws_ptr + b * stride_ws
            prefix, shift, k_rem, active = _radix_state(ws_row, NPASS, K, RADIX_BITS)
            m = i < n
            key = _ordered_key(x)
            hi = key >> shift.to(tl.uint32)  # shift < 32 after pass 0
            gt = m & (hi > prefix)
            eq = m & (hi == prefix)
            gt_i = gt.to(tl.int32)
            eq_i = eq.to(tl.int32)
            cnt = ws_row + NPASS * NBINS
            base_gt = tl.atomic_add(cnt, tl.sum(gt_i, 0), sem="relaxed")
            base_eq = tl.atomic_add(cnt + 1, tl.sum(eq_i, 0), sem="relaxed")
            rank_eq = base_eq + tl.cumsum(eq_i, 0) - 1
            take_eq = eq & (rank_eq < k_rem)
            dst = tl.where(gt, base_gt + tl.cumsum(gt_i, 0) - 1, (K - k_rem) + rank_eq)
            sel = gt | take_eq
            page = tl.load(pt_row + (i >> PAGE_BITS), mask=sel, other=0)
            slot = (page << PAGE_BITS) | (i & PAGE_MASK)
            tl.store(out_row + dst, slot, mask=sel)
            if HAS_RAW:
                tl.store(raw_row + dst, i, mask=sel)


def _split_block(bsz: int, width: int, device: torch.device) -> int:
    """Segment length: the largest of 8192..1024 that still gives >= 2 programs per SM."""
    sms = torch.cuda.get_device_properties(device).multi_processor_count if device.type == "cuda" else 4
    block = 8192
    while block > 1024 and bsz * triton.cdiv(width, block) < 2 * sms:
        block //= 2
    return block


def topk_transform_512(
    logits: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    out_page_indices: torch.Tensor | None = None,
    page_size: int = 64,
    out_raw_indices: torch.Tensor | None = None,
    *,
    topk: int = TOPK,
    backend: str = "auto",
    block: int | None = None,
    radix_bits: int | None = None,
    num_warps: int | None = None,
    onehot: bool = False,
    programs_per_row: int | None = None,
    max_staged: int | None = None,
    max_cand: int | None = None,
) -> torch.Tensor:
    """Top-``topk`` positions of each row of ``logits`` as physical KV slots, [B, topk] int32 (returned).

    logits [B, W] float32 (unit stride in W), seq_lens [B] int32 (values above W are clamped to W),
    page_table [B, P] int32. ``out_page_indices`` / ``out_raw_indices`` ([B, topk] int32, contiguous) are
    written in place when given (upstream's calling convention). backend: "triton" (GPU; CPU under
    TRITON_INTERPRET=1), "cuda" (one-launch CUDA radix select, csrc/topk512.cu; ``max_staged`` / ``max_cand``
    cap the keys staged / candidates kept in shared memory, for tests), "torch" (torch.topk fallback), or
    "auto" (on CUDA: "cuda" when W fits its shared-memory staging or B >= 16, else "triton"; "triton" too
    where the CUDA library cannot be loaded; "torch" on CPU).
    Triton paths (kernels/BENCHMARKS.md): for W > 4096, or when ``block`` or ``programs_per_row`` > 1 is given,
    the split select (``block``-element segments, one program each; ``block`` from the grid size unless given,
    or ``cdiv(W, programs_per_row)`` rounded up to a power of two; ``radix_bits`` 8). For W <= 4096, or
    ``programs_per_row=1``, the one-program-per-row kernel (one launch; defaults: 4-bit radix, 4096-element
    chunks, 16 warps; ``onehot`` counts by compare-and-sum there instead of tl.histogram).
    """
    check_tensor("logits", logits, dtype=torch.float32, ndim=2, last_dim_contiguous=True)
    bsz, width = logits.shape
    dev = logits.device
    if seq_lens.dim() == 2 and seq_lens.shape[1] == 1:
        seq_lens = seq_lens[:, 0]
    check_tensor("seq_lens", seq_lens, dtype=torch.int32, shape=(bsz,), device=dev)
    seq_lens = seq_lens.contiguous()
    check_tensor("page_table", page_table, dtype=torch.int32, ndim=2, device=dev, last_dim_contiguous=True)
    if page_table.shape[0] != bsz:
        raise KernelArgError(f"page_table must have {bsz} rows (logits' batch), got {tuple(page_table.shape)}")
    if page_size <= 0 or page_size & (page_size - 1):
        raise KernelArgError(f"page_size must be a power of two, got {page_size}")
    if not 0 < topk <= 2048:
        raise KernelArgError(f"topk must be in (0, 2048], got {topk}")
    if out_page_indices is None:
        out_page_indices = torch.empty((bsz, topk), dtype=torch.int32, device=dev)
    check_tensor("out_page_indices", out_page_indices, dtype=torch.int32, shape=(bsz, topk), device=dev,
                 contiguous=True)
    if out_raw_indices is not None:
        check_tensor("out_raw_indices", out_raw_indices, dtype=torch.int32, shape=(bsz, topk), device=dev,
                     contiguous=True)
    if backend == "auto":
        backend = _auto_backend(dev, bsz, width)
    if bsz == 0:
        return out_page_indices
    if backend == "cuda":
        _topk_cuda(logits, seq_lens, page_table, out_page_indices, out_raw_indices, page_size, topk, max_staged,
                   max_cand)
    elif backend == "torch":
        _topk_transform_torch(logits, seq_lens, page_table, out_page_indices, page_size, out_raw_indices, topk)
    elif backend == "triton":
        if radix_bits is not None and radix_bits not in (4, 8, 11):
            raise KernelArgError(f"radix_bits must be 4, 8 or 11, got {radix_bits}")
        if programs_per_row is not None and programs_per_row < 1:
            raise KernelArgError(f"programs_per_row must be >= 1, got {programs_per_row}")
        if block is not None and (block < 16 or block & (block - 1)):
            raise KernelArgError(f"block must be a power of two >= 16, got {block}")
        raw_arg = out_raw_indices if out_raw_indices is not None else out_page_indices
        page_bits = page_size.bit_length() - 1
        # rows of <= 4096 (and no split asked for): one launch beats the split's 1 + 32/radix_bits launches
        single = programs_per_row == 1 or onehot or (programs_per_row is None and block is None and width <= 4096)
        if single:
            _topk_transform_kernel[(bsz,)](
                logits, seq_lens, page_table, out_page_indices, raw_arg,
                logits.stride(0), page_table.stride(0), width,
                K=topk, PAGE_BITS=page_bits, BLOCK=block or 4096, RADIX_BITS=radix_bits or 4,
                HAS_RAW=out_raw_indices is not None, ONEHOT=onehot,
                num_warps=num_warps or 16,
            )  # fmt: skip
        else:
            _topk_split(logits, seq_lens, page_table, out_page_indices, raw_arg, out_raw_indices is not None,
                        page_bits, topk, block, radix_bits or 8, num_warps, programs_per_row)
    else:
        raise KernelArgError(f"backend must be 'auto', 'triton', 'cuda' or 'torch', got {backend!r}")
    return out_page_indices


# "auto" on a CUDA device (kernels/BENCHMARKS.md, run 6 on an H200): the one-launch CUDA kernel where it measured
# faster than the split Triton select: rows that fit in its shared-memory staging (<= ~54K floats on an H200;
# 4K-16K: 1.4-1.8x faster), or long rows with a batch of >= 16 (32 x 64K: 37 vs 64 us). Long rows with few
# of them (1-8 x 64K) stay on the split select, which spreads a row over many SMs (23 vs 27 us, 29 vs 36 us).
# Triton also where the CUDA library cannot be built or loaded (no nvcc, say).
CUDA_AUTO_MIN_BATCH_UNSTAGED = 16
_STATIC_SMEM_MARGIN = 16 << 10  # the kernel's static shared memory (8.2 KiB) and slack
_cuda_lib_ok: bool | None = None


def _auto_backend(dev: torch.device, bsz: int, width: int) -> str:
    global _cuda_lib_ok
    if dev.type != "cuda":
        return "torch"
    optin = getattr(torch.cuda.get_device_properties(dev), "shared_memory_per_block_optin", 49152)
    staged = 4 * width <= optin - _STATIC_SMEM_MARGIN
    if not (staged or bsz >= CUDA_AUTO_MIN_BATCH_UNSTAGED):
        return "triton"
    if _cuda_lib_ok is None:
        from .build import BuildError
        from .store import load_library

        try:
            load_library()
            _cuda_lib_ok = True
        except (BuildError, OSError, RuntimeError):
            _cuda_lib_ok = False
    return "cuda" if _cuda_lib_ok else "triton"


def _topk_cuda(logits, seq_lens, page_table, out, raw, page_size, topk, max_staged, max_cand):
    from .store import load_library  # the CUDA library is shared with the store kernel

    dev = logits.device
    if dev.type != "cuda":
        raise KernelArgError(f"backend='cuda' needs logits on a CUDA device, got {dev}")
    bsz, width = logits.shape
    if bsz >= 2**31 or width >= 2**31:
        raise KernelArgError(f"logits too large for the CUDA kernel: {tuple(logits.shape)}")
    lib = load_library()
    with torch.cuda.device(dev):
        stream = torch.cuda.current_stream(dev).cuda_stream
        err = lib.pdstack_topk_transform(
            logits.data_ptr(), seq_lens.data_ptr(), page_table.data_ptr(), out.data_ptr(),
            raw.data_ptr() if raw is not None else None, logits.stride(0), page_table.stride(0), bsz, width,
            topk, page_size.bit_length() - 1, -1 if max_staged is None else int(max_staged),
            -1 if max_cand is None else int(max_cand), stream,
        )  # fmt: skip
    if err != 0:
        raise RuntimeError(f"pdstack_topk_transform failed: cudaError {err}")


def _topk_split(logits, seq_lens, page_table, out, raw, has_raw, page_bits, topk, block, radix_bits, num_warps,
                programs_per_row):
    bsz, width = logits.shape
    if block is None:
        if programs_per_row is not None:
            block = max(16, triton.next_power_of_2(triton.cdiv(max(width, 1), programs_per_row)))
        else:
            block = _split_block(bsz, width, logits.device)
    if num_warps is None:
        num_warps = 4 if block <= 2048 else 8
    nbins = 1 << radix_bits
    npass = triton.cdiv(32, radix_bits)
    # per row: one histogram per pass, then the two output counters of the write launch
    ws = torch.zeros((bsz, npass * nbins + 2), dtype=torch.int32, device=logits.device)
    grid = (max(1, triton.cdiv(width, block)), bsz)
    for ps in range(npass):
        _topk_hist_kernel[grid](
            logits, seq_lens, ws, logits.stride(0), ws.stride(0), width,
            PASS=ps, K=topk, RADIX_BITS=radix_bits, BLOCK=block, num_warps=num_warps,
        )  # fmt: skip
    _topk_write_kernel[grid](
        logits, seq_lens, page_table, out, raw, ws,
        logits.stride(0), page_table.stride(0), ws.stride(0), width,
        NPASS=npass, K=topk, RADIX_BITS=radix_bits, PAGE_BITS=page_bits, BLOCK=block, HAS_RAW=has_raw,
        num_warps=num_warps,
    )  # fmt: skip


def _topk_transform_torch(logits, seq_lens, page_table, out_page_indices, page_size, out_raw_indices, topk):
    """torch.topk fallback, vectorised and sync-free (same shape as upstream's ``_topk_transform_vectorized``)."""
    bsz, width = logits.shape
    dev = logits.device
    page_bits = page_size.bit_length() - 1
    n = seq_lens.to(torch.int64).clamp(0, width)
    positions = torch.arange(width, device=dev)
    masked = logits.masked_fill(positions[None, :] >= n[:, None], float("-inf"))
    k = min(topk, width)
    raw = torch.topk(masked, k, dim=1, largest=True, sorted=False).indices
    if k < topk:
        raw = F.pad(raw, (0, topk - k), value=0)
    slots_iota = torch.arange(topk, device=dev)
    # long rows: every selected position is < n (n > topk finite candidates); short rows: sequential
    short = (n <= topk)[:, None]
    raw = torch.where(short, slots_iota[None, :].expand(bsz, -1), raw)
    valid = torch.where(short, slots_iota[None, :] < n[:, None], torch.ones_like(raw, dtype=torch.bool))
    phys = torch.gather(page_table.to(torch.int64), 1, (raw >> page_bits).clamp(0, page_table.shape[1] - 1))
    slots = (phys << page_bits) | (raw & (page_size - 1))
    out_page_indices.copy_(torch.where(valid, slots, -1).to(torch.int32))
    if out_raw_indices is not None:
        out_raw_indices.copy_(torch.where(valid, raw, -1).to(torch.int32))
