"""Builders for paged indexer caches with NaN-poisoned unused pages."""

from __future__ import annotations

import pytest
import torch

HAS_CUDA = torch.cuda.is_available()
requires_cuda = pytest.mark.skipif(not HAS_CUDA, reason="needs a CUDA device (torch.cuda.is_available() is False)")

PAGE = 64
D = 128


def make_paged_case(seq_lens: list[int], heads: int, device, *, extra_pages: int = 3, max_seq_len: int | None = None):
    """Random q/weight, a shuffled page table and a bf16 cache whose unused pages (and unused tail rows
    of partly-filled pages, and unused page-table entries) are NaN / -1, so reading them shows."""
    bsz = len(seq_lens)
    max_seq_len = max_seq_len if max_seq_len is not None else max(max(seq_lens), 1)
    max_pages = max(1, -(-max_seq_len // PAGE))
    need = [-(-n // PAGE) for n in seq_lens]
    num_pages = sum(need) + extra_pages
    kv = torch.full((num_pages, PAGE, 1, D), float("nan"), dtype=torch.bfloat16, device=device)
    perm = torch.randperm(num_pages, device=device)
    pt = torch.full((bsz, max_pages), -1, dtype=torch.int32, device=device)
    used = 0
    for b, n in enumerate(seq_lens):
        pages = perm[used : used + need[b]]
        used += need[b]
        pt[b, : need[b]] = pages.to(torch.int32)
        for j, p in enumerate(pages.tolist()):
            rows = min(PAGE, n - j * PAGE)
            kv[p, :rows] = torch.randn(rows, 1, D, device=device).to(torch.bfloat16)
    q = torch.randn(bsz, 1, heads, D, device=device).to(torch.bfloat16)
    w = torch.rand(bsz, heads, device=device) / heads**0.5
    sl = torch.tensor(seq_lens, dtype=torch.int32, device=device)
    return q, kv, w, sl, pt, max_seq_len


def cuobjdump() -> str | None:
    """CUDA's cuobjdump, or the copy bundled with Triton (CUDA's toolkit is not installed here)."""
    import shutil
    from pathlib import Path

    exe = shutil.which("cuobjdump")
    if exe:
        return exe
    import triton

    cand = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    return str(cand) if cand.exists() else None
