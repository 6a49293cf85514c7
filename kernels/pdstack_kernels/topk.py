"""Top-512 selection over indexer logits + transform to physical KV slots (upstream's topk_transform).

Mirrors SGLang 0.5.23's ``topk_transform_paged`` (jit ``topk_v1.cuh``): row b ranks its first seq_lens[b]
logits; rows with seq_len <= topk take positions 0..seq_len-1 in order and -1 after; longer rows take the
topk largest in no particular order. A position i becomes ``page_table[b, i >> page_bits] << page_bits |
(i & (page_size - 1))``. Ties at the k-th value are broken arbitrarily (as upstream). NaN logits are not
supported (as upstream).

The Triton kernel is an exact radix select: one program per row, ``32 / RADIX_BITS`` histogram passes over
the row's order-preserving uint32 keys (each pass narrows the prefix of the k-th largest key, and stops
early once the bucket that holds it is taken whole), then one pass that writes the selected positions with
prefix sums. No sort, no [B, N] temporaries.
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
    block: int = 4096,
    radix_bits: int = 4,
    num_warps: int = 16,
    onehot: bool = False,
) -> torch.Tensor:
    """Top-``topk`` positions of each row of ``logits`` as physical KV slots, [B, topk] int32 (returned).

    logits [B, W] float32 (unit stride in W), seq_lens [B] int32 (values above W are clamped to W),
    page_table [B, P] int32. ``out_page_indices`` / ``out_raw_indices`` ([B, topk] int32, contiguous) are
    written in place when given (upstream's calling convention). backend: "triton" (GPU; CPU under
    TRITON_INTERPRET=1), "torch" (torch.topk fallback), or "auto" (triton on CUDA, torch otherwise).
    Defaults (4-bit radix, 4096-element chunks, 16 warps) were the fastest of the swept set on an H200
    (kernels/BENCHMARKS.md); ``onehot`` counts by compare-and-sum instead of tl.histogram (slower there).
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
        backend = "triton" if dev.type == "cuda" else "torch"
    if bsz == 0:
        return out_page_indices
    if backend == "torch":
        _topk_transform_torch(logits, seq_lens, page_table, out_page_indices, page_size, out_raw_indices, topk)
    elif backend == "triton":
        if radix_bits not in (4, 8, 11):
            raise KernelArgError(f"radix_bits must be 4, 8 or 11, got {radix_bits}")
        _topk_transform_kernel[(bsz,)](
            logits, seq_lens, page_table, out_page_indices,
            out_raw_indices if out_raw_indices is not None else out_page_indices,
            logits.stride(0), page_table.stride(0), width,
            K=topk, PAGE_BITS=page_size.bit_length() - 1, BLOCK=block, RADIX_BITS=radix_bits,
            HAS_RAW=out_raw_indices is not None, ONEHOT=onehot,
            num_warps=num_warps,
        )  # fmt: skip
    else:
        raise KernelArgError(f"backend must be 'auto', 'triton' or 'torch', got {backend!r}")
    return out_page_indices


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
