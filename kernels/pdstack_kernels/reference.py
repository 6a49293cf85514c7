"""Float32 torch references for the DSA indexer ops, for bf16 keys and upstream's fp8+scale keys.

Layouts (page size 64, head dim 128):

* ``"bf16"``: kvcache ``[num_pages, 64, 1, 128]`` bf16, 256 B/token. Slot ``s`` = page ``s // 64``, row ``s % 64``.
* ``"fp8"`` (SGLang 0.5.23's DeepSeekV4IndexerPool): kvcache ``[num_pages, 64, 1, 132]`` uint8, 132 B/token,
  but each page's bytes are ``64*128`` e4m3 values (token-major) followed by ``64`` fp32 scales, so the
  ``[64, 1, 132]`` shape is only a view of ``64*132`` bytes (as upstream's ``fp8_paged_mqa_logits_torch_sm120``
  reads it).

Everything here favours clarity over speed; the functions run on CPU and GPU.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

PAGE_SIZE = 64
HEAD_DIM = 128
ROPE_DIM = 64
FP8_BYTES_PER_TOKEN = HEAD_DIM + 4  # 132
FP8_E4M3_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn

__all__ = [
    "dequantize_fp8_pages",
    "hadamard_matrix",
    "index_k_store_ref",
    "index_k_transform_ref",
    "make_decode_plan",
    "make_extend_plan",
    "paged_mqa_logits_ref",
    "paged_mqa_logits_torch_gather",
    "quantize_fp8_pages",
    "quantize_fp8_rows",
]


# ----------------------------------------------------------------------------- store


def hadamard_matrix(n: int, dtype=torch.float32, device=None) -> torch.Tensor:
    """Sylvester Hadamard matrix H[i, j] = (-1)^popcount(i & j), unnormalised."""
    assert n > 0 and n & (n - 1) == 0, "n must be a power of two"
    h = torch.ones(1, 1, dtype=dtype, device=device)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def _freqs_as_real(freq_cis: torch.Tensor) -> torch.Tensor:
    """complex [P, 32] or float [P, 64] (cos, sin interleaved) -> float32 [P, 64]."""
    if freq_cis.is_complex():
        freq_cis = torch.view_as_real(freq_cis).flatten(-2)
    return freq_cis.float()


def index_k_transform_ref(
    kv: torch.Tensor, positions: torch.Tensor, norm_weight: torch.Tensor, norm_eps: float, freq_cis: torch.Tensor
) -> torch.Tensor:
    """RMSNorm -> RoPE on the last 64 dims (interleaved pairs) -> Hadamard/sqrt(128), in float32. [N, 128]."""
    x = kv.float()
    x = x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + norm_eps) * norm_weight.float()
    freqs = _freqs_as_real(freq_cis).to(x.device)[positions.long()]  # [N, 64]
    rope = x[:, HEAD_DIM - ROPE_DIM :].reshape(-1, ROPE_DIM // 2, 2)
    f = freqs.reshape(-1, ROPE_DIM // 2, 2)
    real = rope[..., 0] * f[..., 0] - rope[..., 1] * f[..., 1]
    imag = rope[..., 0] * f[..., 1] + rope[..., 1] * f[..., 0]
    x = torch.cat([x[:, : HEAD_DIM - ROPE_DIM], torch.stack([real, imag], -1).flatten(1)], 1)
    h = hadamard_matrix(HEAD_DIM, device=x.device)
    return (x @ h) / math.sqrt(HEAD_DIM)  # H is symmetric


def make_decode_plan(seq_lens: torch.Tensor) -> torch.Tensor:
    """[N, 16] uint8 DecodePlan rows {seq_len, write_loc=0, read_page_0=0, read_page_1=0}."""
    p = torch.zeros(seq_lens.shape[0], 4, dtype=torch.int32, device=seq_lens.device)
    p[:, 0] = seq_lens.to(torch.int64).to(torch.int32)
    return p.view(torch.uint8).reshape(-1, 16)


def make_extend_plan(seq_lens: torch.Tensor, ragged_ids: torch.Tensor, invalid: torch.Tensor | None = None):
    """[N, 16] uint8 CompressPlan rows {seq_len, ragged_id(u16), buffer_len=0, pages=0}; invalid rows: seq_len=~0."""
    n = seq_lens.shape[0]
    p = torch.zeros(n, 4, dtype=torch.int32, device=seq_lens.device)
    sl = seq_lens.to(torch.int64)
    if invalid is not None:
        sl = torch.where(invalid, torch.full_like(sl, 0xFFFFFFFF), sl)
    p[:, 0] = torch.where(sl >= 2**31, sl - 2**32, sl).to(torch.int32)
    p[:, 1] = ragged_ids.to(torch.int32) & 0xFFFF
    return p.view(torch.uint8).reshape(-1, 16)


def _parse_plan(plan: torch.Tensor, is_decode: bool, compress_ratio: int):
    """-> (keep mask, position, out_loc index) per plan row, as int64 tensors."""
    words = plan.contiguous().view(torch.int32).reshape(-1, 4).to(torch.int64)
    seq_len = words[:, 0] & 0xFFFFFFFF
    if is_decode:
        keep = seq_len % compress_ratio == 0
        loc_index = torch.arange(plan.shape[0], device=plan.device)
    else:
        keep = seq_len != 0xFFFFFFFF
        loc_index = words[:, 1] & 0xFFFF
    return keep, seq_len - compress_ratio, loc_index


def index_k_store_ref(
    kv: torch.Tensor,
    plan: torch.Tensor,
    *,
    norm_weight: torch.Tensor,
    norm_eps: float,
    freq_cis: torch.Tensor,
    out_loc: torch.Tensor,
    kvcache: torch.Tensor,
    is_decode: bool,
    compress_ratio: int,
    layout: str = "bf16",
) -> torch.Tensor:
    """Reference of the fused indexer store; writes into ``kvcache`` (in place) and returns it.

    ``layout="bf16"``: kvcache [num_pages, 64, 1, 128] bf16. ``layout="fp8"``: upstream's uint8 page layout
    (kvcache [num_pages, 64*132] or [num_pages, 64, 1, 132] uint8), quantised like upstream's kernel.
    """
    keep, pos, loc_index = _parse_plan(plan, is_decode, compress_ratio)
    rows = keep.nonzero().flatten()
    if rows.numel() == 0:
        return kvcache
    k = index_k_transform_ref(kv[rows], pos[rows], norm_weight, norm_eps, freq_cis)
    slots = out_loc.long()[loc_index[rows]]
    if layout == "bf16":
        flat = kvcache.view(-1, HEAD_DIM)
        flat[slots] = k.to(flat.dtype)
    elif layout == "fp8":
        values, scales = quantize_fp8_rows(k)
        pages = kvcache.view(kvcache.shape[0], -1)
        page, off = slots // PAGE_SIZE, slots % PAGE_SIZE
        vbytes = values.view(torch.uint8)
        for j in range(HEAD_DIM):  # scatter byte columns (vectorised over tokens)
            pages[page, off * HEAD_DIM + j] = vbytes[:, j]
        sbytes = scales.contiguous().view(torch.uint8).reshape(-1, 4)
        for j in range(4):
            pages[page, PAGE_SIZE * HEAD_DIM + off * 4 + j] = sbytes[:, j]
    else:
        raise ValueError(f"layout must be 'bf16' or 'fp8', got {layout!r}")
    return kvcache


# ----------------------------------------------------------------------------- fp8 pages


def quantize_fp8_rows(k: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per-token fp8 e4m3 quantisation as upstream's indexer store: scale = max(1e-4, amax) / 448 (fp32)."""
    kf = k.float()
    scale = kf.abs().amax(-1).clamp_min(1e-4) / FP8_E4M3_MAX
    values = (kf / scale[:, None]).clamp(-FP8_E4M3_MAX, FP8_E4M3_MAX).to(FP8_DTYPE)
    return values, scale


def quantize_fp8_pages(kvcache_bf16: torch.Tensor) -> torch.Tensor:
    """bf16 pages [num_pages, 64, 1, 128] -> upstream fp8+scale pages as uint8 [num_pages, 64, 1, 132].

    Byte layout of one page: 64*128 e4m3 values (token-major) then 64 fp32 scales.
    """
    num_pages, page, _, d = kvcache_bf16.shape
    assert (page, d) == (PAGE_SIZE, HEAD_DIM), f"kvcache_bf16 must be [P, 64, 1, 128], got {tuple(kvcache_bf16.shape)}"
    values, scale = quantize_fp8_rows(kvcache_bf16.reshape(-1, d))
    vbytes = values.view(torch.uint8).reshape(num_pages, page * d)
    sbytes = scale.reshape(num_pages, page).contiguous().view(torch.uint8)
    return torch.cat([vbytes, sbytes], 1).reshape(num_pages, page, 1, FP8_BYTES_PER_TOKEN)


def dequantize_fp8_pages(kvcache_fp8: torch.Tensor) -> torch.Tensor:
    """upstream fp8+scale pages (uint8, 64*132 bytes each) -> float32 [num_pages, 64, 1, 128]."""
    pages = kvcache_fp8.reshape(kvcache_fp8.shape[0], -1)
    assert pages.shape[1] == PAGE_SIZE * FP8_BYTES_PER_TOKEN, f"kvcache_fp8 page is {pages.shape[1]} bytes"
    values = pages[:, : PAGE_SIZE * HEAD_DIM].contiguous().view(FP8_DTYPE).float()
    scales = pages[:, PAGE_SIZE * HEAD_DIM :].contiguous().view(torch.float32)
    k = values.reshape(-1, PAGE_SIZE, HEAD_DIM) * scales[:, :, None]
    return k.reshape(-1, PAGE_SIZE, 1, HEAD_DIM)


# ----------------------------------------------------------------------------- logits


def paged_mqa_logits_ref(
    q: torch.Tensor,
    kvcache: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int,
    layout: str = "bf16",
) -> torch.Tensor:
    """Float32 logits [B, max_seq_len]: sum_h weight[b, h] * relu(q[b, h] . k[pos]); -inf at pos >= seq_len.

    Same semantics as upstream's ``fp8_paged_mqa_logits_torch_sm120`` (weight after relu; the fp8 scale is
    per token and positive, so applying it to k or after the sum is the same). Only the pages a row uses are
    read: unused pages and page-table entries may hold anything (NaN, -1).
    """
    b, next_n, h, d = q.shape
    assert next_n == 1 and d == HEAD_DIM, f"q must be [B, 1, H, 128], got {tuple(q.shape)}"
    if layout == "bf16":
        keys_of = lambda pages: kvcache[pages].float().reshape(-1, HEAD_DIM)  # noqa: E731
    elif layout == "fp8":
        keys_of = lambda pages: dequantize_fp8_pages(kvcache[pages]).reshape(-1, HEAD_DIM)  # noqa: E731
    else:
        raise ValueError(f"layout must be 'bf16' or 'fp8', got {layout!r}")
    out = torch.full((b, max_seq_len), float("-inf"), dtype=torch.float32, device=q.device)
    for i in range(b):
        n = min(int(seq_lens[i]), max_seq_len)
        if n <= 0:
            continue
        pages = page_table[i, : (n + PAGE_SIZE - 1) // PAGE_SIZE].long()
        k = keys_of(pages)[:n]  # [n, 128]
        s = torch.relu(k @ q[i, 0].float().T)  # [n, H]
        out[i, :n] = s @ weight[i].float()
    return out


def paged_mqa_logits_torch_gather(
    q: torch.Tensor,
    kvcache: torch.Tensor,
    weight: torch.Tensor,
    seq_lens: torch.Tensor,
    page_table: torch.Tensor,
    max_seq_len: int,
) -> torch.Tensor:
    """The baseline: upstream's sm_120 torch path (gather every page, bmm, relu, weight, sum) on bf16 keys.

    Same shapes and bf16 arithmetic as ``fp8_paged_mqa_logits_torch_sm120`` minus the fp8 cast and scale.
    """
    batch_size, _, num_heads, head_dim = q.shape
    block_size = kvcache.shape[1]
    max_pages = (max_seq_len + block_size - 1) // block_size
    max_padded_seq = max_pages * block_size
    kv = kvcache.view(-1, block_size * head_dim)[page_table[:, :max_pages]]
    kv = kv.view(batch_size, max_padded_seq, head_dim)
    score = torch.bmm(kv, q[:, 0].to(kv.dtype).transpose(1, 2))
    score = F.relu(score)
    score = score * weight.unsqueeze(1)
    score = score.sum(dim=2)
    out_width = min(max_padded_seq, max_seq_len)
    logits = score.new_full((batch_size, max_seq_len), float("-inf"), dtype=torch.float32)
    logits[:, :out_width] = score[:, :out_width]
    positions = torch.arange(max_seq_len, device=q.device)
    logits.masked_fill_(positions.unsqueeze(0) >= seq_lens.unsqueeze(1), float("-inf"))
    return logits
