from __future__ import annotations

import math
import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from pdk_testutil import cuobjdump, requires_cuda
from pdstack_kernels import KernelArgError, index_k_store_bf16
from pdstack_kernels import build as B
from pdstack_kernels import reference as R

HAS_NVCC = shutil.which("nvcc") is not None or Path("/usr/local/bin/nvcc").exists()


# ----------------------------------------------------------------------------- build (CPU)


def test_nvcc_flags_default_env_and_explicit(monkeypatch):
    if not HAS_NVCC:
        pytest.skip("nvcc not installed")
    monkeypatch.delenv(B.ARCH_ENV, raising=False)
    flags = B.nvcc_flags()
    assert "-gencode=arch=compute_120a,code=sm_120a" in flags
    assert "-lineinfo" in flags and any(f.startswith("--threads") for f in flags)
    assert any("warn-spills" in f for f in flags)
    monkeypatch.setenv(B.ARCH_ENV, "sm_90a, 120a")
    assert B.resolve_archs() == ["sm_90a", "sm_120a"]
    assert B.resolve_archs(["compute_100a"]) == ["sm_100a"]
    with pytest.raises(ValueError, match="bad CUDA arch"):
        B.resolve_archs(["hopper"])


def test_nvcc_version_is_asserted(monkeypatch, tmp_path):
    fake = tmp_path / "nvcc"
    fake.write_text("#!/bin/sh\necho 'Cuda compilation tools, release 12.4, V12.4.131'\n")
    fake.chmod(0o755)
    with pytest.raises(B.BuildError, match="12.4"):
        B.nvcc_flags(nvcc=str(fake))


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_build_sm120a_cubin_arch(tmp_path):
    lib = B.build(["sm_120a"], tmp_path)
    assert lib.exists() and lib.stat().st_size > 0
    log = (tmp_path / "ptxas.log").read_text()
    assert "0 bytes spill stores" in log and "sm_120a" in log
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA or triton's bundled one)")
    out = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "sm_120a" in out, out
    assert "sm_90" not in out
    syms = subprocess.run(["nm", "-D", str(lib)], capture_output=True, text=True).stdout
    assert "pdstack_index_k_store_bf16" in syms


def test_cli_reports_build_error(monkeypatch, capsys, tmp_path):
    monkeypatch.setenv(B.NVCC_ENV, str(tmp_path / "missing-nvcc"))
    monkeypatch.setattr(B.shutil, "which", lambda _: None)
    monkeypatch.setattr(B, "find_nvcc", lambda: (_ for _ in ()).throw(B.BuildError("nvcc not found")))
    assert B.main(["--out", str(tmp_path)]) == 1
    assert "nvcc not found" in capsys.readouterr().err


# ----------------------------------------------------------------------------- reference (CPU)


def _store_inputs(n, device, max_pos=300, num_pages=6):
    kv = (torch.randn(n, 128, device=device) * 3).to(torch.bfloat16)
    w = (1 + 0.1 * torch.randn(128, device=device)).to(torch.bfloat16)
    theta = torch.rand(max_pos, 32, device=device) * 2 * math.pi
    freq = torch.polar(torch.ones_like(theta), theta)  # complex64 [P, 32]
    cache = torch.full((num_pages, 64, 1, 128), float("nan"), dtype=torch.bfloat16, device=device)
    return kv, w, freq, cache


def test_transform_ref_matches_textbook(device):
    kv, w, freq, _ = _store_inputs(5, device)
    pos = torch.tensor([0, 3, 17, 99, 250], device=device)
    got = R.index_k_transform_ref(kv, pos, w, 1e-6, freq)
    x = kv.float()
    x = x / torch.sqrt((x * x).mean(-1, keepdim=True) + 1e-6) * w.float()
    rope = torch.view_as_complex(x[:, 64:].reshape(-1, 32, 2).contiguous()) * freq[pos]
    x = torch.cat([x[:, :64], torch.view_as_real(rope).flatten(1)], 1)
    h = R.hadamard_matrix(128, device=device)
    assert torch.allclose(h @ h.T, 128 * torch.eye(128, device=device))
    torch.testing.assert_close(got, x @ h.T / math.sqrt(128), rtol=1e-5, atol=1e-5)
    # an orthonormal rotation: the RMS-normalised, rotated row keeps its norm
    torch.testing.assert_close(got.norm(dim=1), x.norm(dim=1), rtol=1e-5, atol=1e-5)


def test_store_ref_decode_and_extend_plans(device):
    kv, w, freq, cache = _store_inputs(4, device)
    seq = torch.tensor([8, 9, 12, 4], device=device)  # ratio 4: row 1 does not complete a compressed token
    plan = R.make_decode_plan(seq)
    out_loc = torch.tensor([5, 6, 64 + 63, 200], device=device)
    R.index_k_store_ref(kv, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc, kvcache=cache,
                        is_decode=True, compress_ratio=4)  # fmt: skip
    flat = cache.view(-1, 128)
    want = R.index_k_transform_ref(kv, seq - 4, w, 1e-6, freq).to(torch.bfloat16)
    for i, slot in [(0, 5), (2, 127), (3, 200)]:
        assert torch.equal(flat[slot], want[i])
    assert flat[6].isnan().all(), "skipped decode row was written"
    written = {5, 127, 200}
    untouched = torch.tensor([s not in written for s in range(flat.shape[0])], device=device)
    assert flat[untouched].isnan().all()

    # extend: out_loc indexed by ragged_id, invalid plans skipped
    cache2 = torch.full_like(cache, float("nan"))
    eplan = R.make_extend_plan(seq, torch.tensor([3, 0, 1, 2], device=device),
                               invalid=torch.tensor([False, False, True, False], device=device))  # fmt: skip
    R.index_k_store_ref(kv, eplan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc, kvcache=cache2,
                        is_decode=False, compress_ratio=4)  # fmt: skip
    f2 = cache2.view(-1, 128)
    # row i -> out_loc[ragged[i]]: 0 -> out_loc[3]=200, 1 -> out_loc[0]=5, 2 invalid, 3 -> out_loc[2]=127
    assert torch.equal(f2[200], want[0]) and torch.equal(f2[5], want[1]) and torch.equal(f2[127], want[3])
    assert f2[6].isnan().all(), "out_loc[1] belongs to the invalid row only"


def test_fp8_pages_round_trip_and_layout(device):
    kv = torch.randn(3, 64, 1, 128, device=device).to(torch.bfloat16)
    q8 = R.quantize_fp8_pages(kv)
    assert q8.shape == (3, 64, 1, 132) and q8.dtype == torch.uint8
    flat = q8.reshape(3, -1)
    scales = flat[:, 64 * 128 :].contiguous().view(torch.float32)  # scales after all 64*128 value bytes
    torch.testing.assert_close(scales, kv.float().abs().amax(-1).reshape(3, 64) / 448.0)
    back = R.dequantize_fp8_pages(q8)
    rel = (back - kv.float()).norm() / kv.float().norm()
    assert 1e-3 < rel < 5e-2  # e4m3: ~3 mantissa bits
    # the fp8 store reference writes the same bytes as quantising the bf16-free fp32 rows
    kv2, w, freq, _ = _store_inputs(2, device)
    cache8 = torch.zeros(2, 64 * 132, dtype=torch.uint8, device=device)
    out_loc = torch.tensor([1, 70], device=device)
    R.index_k_store_ref(kv2, R.make_decode_plan(torch.tensor([4, 8], device=device)), norm_weight=w, norm_eps=1e-6,
                        freq_cis=freq, out_loc=out_loc, kvcache=cache8, is_decode=True, compress_ratio=4,
                        layout="fp8")  # fmt: skip
    deq = R.dequantize_fp8_pages(cache8).reshape(-1, 128)
    want = R.index_k_transform_ref(kv2, torch.tensor([0, 4], device=device), w, 1e-6, freq)
    assert ((deq[[1, 70]] - want).norm() / want.norm()) < 5e-2
    assert deq[0].abs().sum() == 0


def test_store_wrapper_checks_name_the_tensor(device):
    kv, w, freq, cache = _store_inputs(2, device)
    plan = R.make_decode_plan(torch.tensor([4, 8], device=device))
    loc = torch.tensor([0, 1], device=device)
    kw = dict(norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=loc, kvcache=cache, compress_ratio=4,
              is_decode=True)  # fmt: skip
    with pytest.raises(KernelArgError, match="kv must"):
        index_k_store_bf16(kv.float(), plan, **kw)
    with pytest.raises(KernelArgError, match="compress_ratio"):
        index_k_store_bf16(kv, plan, **{**kw, "compress_ratio": None})
    if device.type == "cuda":
        with pytest.raises(KernelArgError, match="out_loc"):
            index_k_store_bf16(kv, plan, **{**kw, "out_loc": loc.int()})
        with pytest.raises(KernelArgError, match="kvcache"):
            index_k_store_bf16(kv, plan, **{**kw, "kvcache": cache.float()})
        with pytest.raises(KernelArgError, match="plan"):
            index_k_store_bf16(kv, plan[:1], **kw)


# ----------------------------------------------------------------------------- CUDA kernel (GPU)


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("n", [1, 7, 8, 9, 1000])
@pytest.mark.parametrize("mode", ["decode", "extend"])
def test_store_cuda_matches_reference(n, mode):
    dev = torch.device("cuda")
    num_pages = (n + 63) // 64 + 2
    kv, w, freq, cache = _store_inputs(n, dev, max_pos=4 * n + 8, num_pages=num_pages)
    slots = torch.randperm(num_pages * 64, device=dev)[:n]
    if mode == "decode":
        seq = torch.randint(1, n + 2, (n,), device=dev) * 4
        seq[::3] += 1  # a third do not complete a compressed token
        plan = R.make_decode_plan(seq)
        out_loc = slots
    else:
        seq = torch.randint(1, n + 2, (n,), device=dev) * 4
        ragged = torch.randperm(n, device=dev)
        plan = R.make_extend_plan(seq, ragged, invalid=torch.rand(n, device=dev) < 0.2)
        out_loc = slots
    ref = cache.clone()
    R.index_k_store_ref(kv, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc, kvcache=ref,
                        is_decode=mode == "decode", compress_ratio=4)  # fmt: skip
    index_k_store_bf16(kv, plan, norm_weight=w, norm_eps=1e-6, freq_cis=freq, out_loc=out_loc, kvcache=cache,
                       compress_ratio=4, is_decode=mode == "decode")  # fmt: skip
    torch.cuda.synchronize()
    a, b = cache.view(-1, 128), ref.view(-1, 128)
    assert torch.equal(a.isnan(), b.isnan()), "written slots differ (a skipped row was stored or vice versa)"
    m = ~b.isnan()
    # fp32 math in a different order, then one bf16 rounding: at most ~1 bf16 ulp apart
    torch.testing.assert_close(a[m].float(), b[m].float(), rtol=8e-3, atol=1e-3)
