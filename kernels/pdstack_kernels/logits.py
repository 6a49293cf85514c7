"""Paged MQA logits over bf16 DSA index keys, in Triton, reading the pages in place.

For each batch row b and position p < seq_lens[b]:
    logits[b, p] = sum_h weight[b, h] * relu(q[b, 0, h] . k[slot(b, p)])
and -inf for seq_lens[b] <= p < max_seq_len (upstream's ``fp8_paged_mqa_logits_torch_sm120`` convention).
No gathered copy of the keys and no [B, positions, heads] temporary: the only allocation is the output.
"""

from __future__ import annotations

import os

import torch
import triton
import triton.language as tl

from ._checks import KernelArgError, check_tensor

PAGE_SIZE = 64
HEAD_DIM = 128


@triton.jit
def _paged_mqa_logits_kernel(
    q_ptr,
    kv_ptr,
    w_ptr,
    seq_lens_ptr,
    pt_ptr,
    out_ptr,
    stride_qb,
    stride_qh,
    stride_wb,
    stride_ptb,
    stride_ob,
    max_seq_len,
    H: tl.constexpr,
    D: tl.constexpr,
    PAGE: tl.constexpr,
    PAGES_PER_PROG: tl.constexpr,
    NUM_STAGES: tl.constexpr,
    UPCAST_DOT: tl.constexpr,
):
    pid = tl.program_id(0)
    b = tl.program_id(1).to(tl.int64)
    seq_len = tl.load(seq_lens_ptr + b)
    seq_len = tl.minimum(tl.maximum(seq_len, 0), max_seq_len)
    offs_h = tl.arange(0, H)
    offs_d = tl.arange(0, D)
    offs_n = tl.arange(0, PAGE)
    p0 = pid * PAGES_PER_PROG
    live_pages = tl.cdiv(seq_len, PAGE) - p0
    n_live = tl.minimum(tl.maximum(live_pages, 0), PAGES_PER_PROG)
    out_row = out_ptr + b * stride_ob

    if n_live > 0:
        # q^T [D, H] and the head weights stay in registers for all pages of this program.
        q = tl.load(q_ptr + b * stride_qb + offs_h[None, :] * stride_qh + offs_d[:, None])
        w = tl.load(w_ptr + b * stride_wb + offs_h).to(tl.float32)
        for j in tl.range(0, n_live, num_stages=NUM_STAGES):
            p = p0 + j
            page_id = tl.load(pt_ptr + b * stride_ptb + p).to(tl.int64)
            pos = p * PAGE + offs_n
            valid = pos < seq_len
            k = tl.load(
                kv_ptr + page_id * (PAGE * D) + offs_n[:, None] * D + offs_d[None, :],
                mask=valid[:, None],
                other=0.0,
            )
            if UPCAST_DOT:  # Triton's CPU interpreter mis-multiplies bf16 dots; fp32 there is exact
                s = tl.dot(k.to(tl.float32), q.to(tl.float32))
            else:
                s = tl.dot(k, q)  # [PAGE, H] bf16 x bf16 -> fp32 on the tensor cores
            s = tl.maximum(s, 0.0)
            logit = tl.sum(s * w[None, :], axis=1)
            logit = tl.where(valid, logit, float("-inf"))
            tl.store(out_row + pos, logit, mask=pos < max_seq_len)
    # Pages of this program past the row's end: -inf, no key reads.
    for j in range(n_live, PAGES_PER_PROG):
        pos = (p0 + j) * PAGE + offs_n
        tl.store(out_row + pos, tl.full([PAGE], float("-inf"), tl.float32), mask=pos < max_seq_len)


def _interpreting() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


MAX_PAGES_PER_PROG = 8


def _pages_per_prog(batch: int, max_pages: int, device: torch.device) -> int:
    if device.type == "cuda":
        sms = torch.cuda.get_device_properties(device).multi_processor_count
    else:
        sms = 4
    ppp = 1
    # Grow while the grid still has >= 2 programs per SM, up to 8 pages. Under CUDA graphs max_seq_len is the
    # capture's width, and a row much shorter than it leaves all its live pages to its first program, one page
    # after the other: 16 pages per program made such batches up to 2x slower on an H200, 8 costs rows as long as
    # max_seq_len ~1 % against 16 (kernels/BENCHMARKS.md, "Rows shorter than max_seq_len").
    while ppp < MAX_PAGES_PER_PROG and batch * triton.cdiv(max_pages, ppp * 2) >= 2 * sms:
        ppp *= 2
    return ppp


def paged_mqa_logits_bf16(
    q: torch.Tensor,
    kvcache: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int,
    *,
    out: torch.Tensor | None = None,
    pages_per_prog: int | None = None,
    num_warps: int = 4,
    num_stages: int = 3,
) -> torch.Tensor:
    """Logits [B, max_seq_len] float32 from bf16 keys.

    q [B, 1, H, 128] bf16 (H a power of two >= 16; DSv4: 64), kvcache [num_pages, 64, 1, 128] bf16 (contiguous),
    weight [B, H] float32, seq_lens [B] int32 (or [B, 1]), page_table [B, >= ceil(max_seq_len / 64)] int32.
    Page-table entries past a row's last page are never read (they may be -1).
    """
    check_tensor("q", q, dtype=torch.bfloat16, ndim=4, last_dim_contiguous=True)
    bsz, next_n, heads, dim = q.shape
    dev = q.device
    if next_n != 1 or dim != HEAD_DIM:
        raise KernelArgError(f"q must be [B, 1, H, {HEAD_DIM}], got {tuple(q.shape)}")
    if heads < 16 or heads & (heads - 1):
        raise KernelArgError(f"q's head count must be a power of two >= 16, got {heads}")
    check_tensor("kvcache", kvcache, dtype=torch.bfloat16, shape=(None, PAGE_SIZE, 1, HEAD_DIM), device=dev,
                 contiguous=True)
    check_tensor("weight", weight, dtype=torch.float32, shape=(bsz, heads), device=dev, last_dim_contiguous=True)
    if seq_lens.dim() == 2 and seq_lens.shape[1] == 1:
        seq_lens = seq_lens[:, 0]
    check_tensor("seq_lens", seq_lens, dtype=torch.int32, shape=(bsz,), device=dev)
    seq_lens = seq_lens.contiguous()
    check_tensor("page_table", page_table, dtype=torch.int32, ndim=2, device=dev, last_dim_contiguous=True)
    max_seq_len = int(max_seq_len)
    if max_seq_len < 0:
        raise KernelArgError(f"max_seq_len must be >= 0, got {max_seq_len}")
    max_pages = triton.cdiv(max_seq_len, PAGE_SIZE)
    if page_table.shape[0] != bsz or page_table.shape[1] < max_pages:
        raise KernelArgError(
            f"page_table must be [{bsz}, >= {max_pages}] for max_seq_len={max_seq_len}, got {tuple(page_table.shape)}"
        )
    if out is None:
        out = torch.empty((bsz, max_seq_len), dtype=torch.float32, device=dev)
    else:
        check_tensor("out", out, dtype=torch.float32, shape=(bsz, max_seq_len), device=dev, last_dim_contiguous=True)
    if bsz == 0 or max_seq_len == 0:
        return out
    ppp = pages_per_prog or _pages_per_prog(bsz, max_pages, dev)
    grid = (triton.cdiv(max_pages, ppp), bsz)
    _paged_mqa_logits_kernel[grid](
        q, kvcache, weight, seq_lens, page_table, out,
        q.stride(0), q.stride(2), weight.stride(0), page_table.stride(0), out.stride(0),
        max_seq_len,
        H=heads, D=HEAD_DIM, PAGE=PAGE_SIZE, PAGES_PER_PROG=ppp, NUM_STAGES=num_stages,
        UPCAST_DOT=_interpreting(), num_warps=num_warps,
    )  # fmt: skip
    return out
