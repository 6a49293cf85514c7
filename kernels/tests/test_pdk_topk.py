from __future__ import annotations

import pytest
import torch
from pdk_testutil import requires_cuda
from pdstack_kernels import KernelArgError, topk_transform_512
from pdstack_kernels import reference as R


def _case(seq_lens, width, device, *, ties=False, pages=None):
    bsz = len(seq_lens)
    logits = torch.randn(bsz, width, device=device)
    if ties:  # few distinct values: the k-th value is shared by many positions
        logits = torch.randint(-3, 4, (bsz, width), device=device).float()
    for b, n in enumerate(seq_lens):
        logits[b, min(n, width) :] = float("nan")  # past seq_len must never be read
    npages = pages or -(-width // 64)
    pt = torch.randint(0, 10_000, (bsz, npages), dtype=torch.int32, device=device)
    return logits, torch.tensor(seq_lens, dtype=torch.int32, device=device), pt


def _check(logits, sl, pt, backend, topk=512, **kw):
    bsz = logits.shape[0]
    raw = torch.full((bsz, topk), -7, dtype=torch.int32, device=logits.device)
    out = torch.full((bsz, topk), -7, dtype=torch.int32, device=logits.device)
    ret = topk_transform_512(logits, sl, pt, out, 64, raw, topk=topk, backend=backend, **kw)
    assert ret is out
    ref_slots, ref_raw = R.topk_transform_ref(logits.nan_to_num(float("-inf")), sl, pt, topk=topk)
    for b in range(bsz):
        n = min(int(sl[b]), logits.shape[1])
        got = raw[b].tolist()
        assert -7 not in got, "a slot was left unwritten"
        if n <= topk:
            assert got == ref_raw[b].tolist(), "short rows are sequential then -1"
            assert out[b].tolist() == ref_slots[b].tolist()
            continue
        sel = raw[b].long()
        assert len(set(got)) == topk and min(got) >= 0 and max(got) < n
        # exact selection up to ties: the selected values are the topk largest values
        vals = torch.sort(logits[b, sel], descending=True).values
        want = torch.topk(logits[b, :n], topk).values
        assert torch.equal(vals, want)
        slots = pt[b].long()[sel // 64] * 64 + sel % 64
        assert torch.equal(out[b].long(), slots), "page transform"


CPU_CASES = [
    ([0], 64),
    ([1], 64),
    ([512], 600),
    ([513], 600),
    ([700, 0, 5, 512, 1000], 1000),
    ([2500], 2000),  # seq_len > width is clamped to width
]


# Triton paths: the split select (default; small blocks so rows span many programs on CPU) and the
# one-program-per-row kernel
PATHS = {
    "auto": {},  # W <= 4096 here: the one-program kernel
    "split": dict(programs_per_row=3),
    "split-b128": dict(block=128),
    "split-ppr7": dict(programs_per_row=7),
    "single": dict(programs_per_row=1),
}


@pytest.mark.parametrize("backend,path", [("triton", p) for p in PATHS] + [("torch", None)])
@pytest.mark.parametrize("seq_lens,width", CPU_CASES, ids=str)
def test_topk_small(seq_lens, width, backend, path, device):
    logits, sl, pt = _case(seq_lens, width, device)
    _check(logits, sl, pt, backend, **PATHS.get(path, {}))


@pytest.mark.parametrize("radix_bits,kw", [
    (4, dict(programs_per_row=1, onehot=True)),
    (4, dict(programs_per_row=1)),
    (8, dict(programs_per_row=1)),
    (11, dict(programs_per_row=1)),
    (4, dict(block=256)),
    (8, dict(block=256)),
    (11, dict(block=512)),
], ids=str)  # fmt: skip
def test_topk_ties_and_radix_widths(radix_bits, kw, device):
    logits, sl, pt = _case([1500, 900], 1500, device, ties=True)
    _check(logits, sl, pt, "triton", radix_bits=radix_bits, **kw)
    logits, sl, pt = _case([1500], 1500, device)
    _check(logits, sl, pt, "triton", radix_bits=radix_bits, **kw)


@pytest.mark.parametrize("path", ["split", "split-b128", "single"])
def test_topk_ties_at_threshold(path, device):
    """The 512th value is shared by 300 positions spread over every segment: exactly 512 taken, no overrun."""
    logits, sl, pt = _case([2000, 2000, 1000], 2000, device)
    for b, n in enumerate([2000, 2000, 1000]):
        row = torch.randn(n, device=device).abs() - 10.0  # below the tie value
        perm = torch.randperm(n, device=device)
        row[perm[:400]] = 5.0 + torch.rand(400, device=device)  # 400 strictly above
        row[perm[400:700]] = 2.5  # 300 tied; 112 of them are taken
        logits[b, :n] = row
    logits[2, :1000] = 1.0  # row 2: all tied
    _check(logits, sl, pt, "triton", **PATHS[path])


@pytest.mark.parametrize("path", ["split", "split-b128", "single"])
def test_topk_just_above_k(path, device):
    """seq_len = 513, 514, 520 in a wide row (the NaN tail past seq_len must not be read) and 512 exactly."""
    logits, sl, pt = _case([513, 514, 520, 512, 3000], 3000, device)
    _check(logits, sl, pt, "triton", **PATHS[path])


def test_topk_wide_rows_default_to_split(device):
    """W > 4096 with no options: the split select with the wrapper's block (ragged rows, a tie-heavy row)."""
    logits, sl, pt = _case([5000, 4100, 513, 0], 5000, device)
    logits[1, :4100] = torch.randint(-2, 3, (4100,), device=device).float()
    _check(logits, sl, pt, "triton")


@pytest.mark.parametrize("path", ["split-b128", "single"])
def test_topk_negative_and_inf_values(path, device):
    logits, sl, pt = _case([1200], 1200, device)
    logits[0, :1200] = -logits[0, :1200].abs() - 1
    logits[0, 100:700] = float("-inf")  # 600 -inf; 600 finite > 512
    _check(logits, sl, pt, "triton", **PATHS[path])
    logits[0, 100:1100] = float("-inf")  # 1000 -inf: the k-th value is -inf
    _check(logits, sl, pt, "triton", **PATHS[path])


@pytest.mark.parametrize("path", ["split-b128", "single"])
def test_topk_small_k(path, device):
    logits, sl, pt = _case([300, 20], 300, device)
    _check(logits, sl, pt, "triton", topk=32, **PATHS[path])


def test_topk_errors_name_the_tensor(device):
    logits, sl, pt = _case([10], 64, device)
    with pytest.raises(KernelArgError, match="logits"):
        topk_transform_512(logits.double(), sl, pt)
    with pytest.raises(KernelArgError, match="seq_lens"):
        topk_transform_512(logits, sl[:0], pt)
    with pytest.raises(KernelArgError, match="page_table"):
        topk_transform_512(logits, sl, pt.long())
    with pytest.raises(KernelArgError, match="out_page_indices"):
        topk_transform_512(logits, sl, pt, torch.empty(1, 100, dtype=torch.int32, device=device))
    with pytest.raises(KernelArgError, match="block"):
        topk_transform_512(logits, sl, pt, backend="triton", block=100)
    with pytest.raises(KernelArgError, match="programs_per_row"):
        topk_transform_512(logits, sl, pt, backend="triton", programs_per_row=0)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("seq_lens,width", [
    ([4096] * 8, 4096),
    ([16384, 1, 513, 16000], 16384),
    ([65536, 40000], 65536),
    ([5000] * 32, 5000),
], ids=lambda v: str(v)[:40])  # fmt: skip
@pytest.mark.parametrize("kw", [{}, dict(block=1024), dict(radix_bits=4), dict(programs_per_row=1)], ids=str)
def test_topk_gpu(seq_lens, width, kw):
    logits, sl, pt = _case(seq_lens, width, torch.device("cuda"))
    _check(logits, sl, pt, "triton", **kw)
    logits, sl, pt = _case(seq_lens, width, torch.device("cuda"), ties=True)
    _check(logits, sl, pt, "triton", **kw)
