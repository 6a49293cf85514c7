from __future__ import annotations

import pytest
import torch
from pdk_testutil import HAS_CUDA, make_paged_case, requires_cuda
from pdstack_kernels import KernelArgError, paged_mqa_logits_bf16
from pdstack_kernels import reference as R

# bf16 inputs, fp32 accumulation: only summation order differs from the fp32 reference
RTOL, ATOL = 1e-4, 1e-3

CPU_CASES = [
    [1],  # one token
    [0, 5],  # an empty row
    [64],  # exactly one page
    [130, 0, 64, 7],  # ragged, odd tail
]
GPU_CASES = CPU_CASES + [
    [4096, 1, 4095, 65],
    [16384] * 4 + [333],
    [12345, 0, 777, 64 * 37],
]


def _check(seq_lens, heads, device, **kw):
    q, kv, w, sl, pt, msl = make_paged_case(seq_lens, heads, device)
    out = paged_mqa_logits_bf16(q, kv, w, sl, pt, msl, **kw)
    ref = R.paged_mqa_logits_ref(q, kv, w, sl, pt, msl)
    assert out.shape == (len(seq_lens), msl) and out.dtype == torch.float32
    assert not out.isnan().any(), "a NaN-poisoned page or row was read"
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref)), "-inf mask differs from the reference"
    fin = torch.isfinite(ref)
    torch.testing.assert_close(out[fin], ref[fin], rtol=RTOL, atol=ATOL)
    return out, ref


@pytest.mark.parametrize("seq_lens", CPU_CASES, ids=str)
def test_logits_small(seq_lens, device):
    _check(seq_lens, 64, device)


def test_logits_multi_page_programs_and_16_heads(device):
    # several pages per program, a row that ends inside a program's range, a max_seq_len past every row
    q, kv, w, sl, pt, _ = make_paged_case([200, 3], 16, device)
    pt = torch.nn.functional.pad(pt, (0, 2), value=-1)
    out = paged_mqa_logits_bf16(q, kv, w, sl, pt, 64 * 5 + 9, pages_per_prog=4)
    ref = R.paged_mqa_logits_ref(q, kv, w, sl, pt, 64 * 5 + 9)
    assert torch.equal(torch.isneginf(out), torch.isneginf(ref))
    fin = torch.isfinite(ref)
    torch.testing.assert_close(out[fin], ref[fin], rtol=RTOL, atol=ATOL)
    assert torch.isneginf(out[:, 200:]).all()


def test_logits_fp8_layout_is_close_but_not_equal(device):
    """The fp8 reference on quantised pages tracks bf16 logits loosely (what the recall fix is about)."""
    q, kv, w, sl, pt, msl = make_paged_case([300, 64], 64, device)
    ref16 = R.paged_mqa_logits_ref(q, kv, w, sl, pt, msl)
    kv8 = R.quantize_fp8_pages(kv.nan_to_num(0.0))
    assert kv8.dtype == torch.uint8 and kv8.shape == (kv.shape[0], 64, 1, 132)
    ref8 = R.paged_mqa_logits_ref(q, kv8, w, sl, pt, msl, layout="fp8")
    fin = torch.isfinite(ref16)
    rel = (ref8[fin] - ref16[fin]).norm() / ref16[fin].norm()
    assert 1e-4 < rel < 0.1, rel


def test_logits_errors_name_the_tensor(device):
    q, kv, w, sl, pt, msl = make_paged_case([10], 64, device)
    with pytest.raises(KernelArgError, match="kvcache"):
        paged_mqa_logits_bf16(q, kv.float(), w, sl, pt, msl)
    with pytest.raises(KernelArgError, match="weight"):
        paged_mqa_logits_bf16(q, kv, w[:, :32], sl, pt, msl)
    with pytest.raises(KernelArgError, match="seq_lens"):
        paged_mqa_logits_bf16(q, kv, w, sl.long(), pt, msl)
    with pytest.raises(KernelArgError, match="page_table"):
        paged_mqa_logits_bf16(q, kv, w, sl, pt, 64 * 9)
    with pytest.raises(KernelArgError, match="q"):
        paged_mqa_logits_bf16(q.float(), kv, w, sl, pt, msl)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("seq_lens", GPU_CASES, ids=lambda s: f"{len(s)}rows-max{max(s)}")
def test_logits_gpu(seq_lens):
    out, ref = _check(seq_lens, 64, torch.device("cuda"))
    # and against the upstream-shaped torch path (bf16 bmm), loosely
    q, kv, w, sl, pt, msl = make_paged_case(seq_lens, 64, torch.device("cuda"))
    fast = paged_mqa_logits_bf16(q, kv, w, sl, pt, msl)
    base = R.paged_mqa_logits_torch_gather(q, kv.nan_to_num(0.0), w, sl, pt.clamp_min(0), msl)
    fin = torch.isfinite(base)
    assert torch.equal(fin, torch.isfinite(fast))
    assert ((fast[fin] - base[fin]).norm() / base[fin].norm().clamp_min(1e-6)) < 2e-2


@pytest.mark.skipif(HAS_CUDA, reason="CPU-only check of the interpreter path")
def test_logits_runs_in_interpreter():
    import os

    assert os.environ.get("TRITON_INTERPRET") == "1"
