from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
import torch
from pdk_testutil import cuobjdump, requires_cuda
from pdstack_kernels import KernelArgError, topk_transform_512
from pdstack_kernels import build as B
from pdstack_kernels import reference as R

HAS_NVCC = shutil.which("nvcc") is not None or Path("/usr/local/bin/nvcc").exists()


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
# CUDA kernel (csrc/topk512.cu): keys staged in shared memory (default for these widths); not staged, so the
# threshold bucket is compacted into candidates; not staged with a 64-pair candidate buffer, so the bucket
# usually overflows it and the passes re-read global memory
CUDA_PATHS = {
    "cuda": {},
    "cuda-global": dict(max_staged=0),
    "cuda-overflow": dict(max_staged=0, max_cand=64),
}


def _paths(*names, cuda=True):
    """pytest params: the named Triton paths, then every CUDA path (skipped without a GPU)."""
    params = [pytest.param(n, id=n) for n in names]
    if cuda:
        params += [pytest.param(n, id=n, marks=requires_cuda) for n in CUDA_PATHS]
    return params


def _run(logits, sl, pt, path, **kw):
    if path in CUDA_PATHS:
        _check(logits, sl, pt, "cuda", **CUDA_PATHS[path], **kw)
    else:
        _check(logits, sl, pt, "triton", **PATHS[path], **kw)


@pytest.mark.parametrize("backend,path", [("triton", p) for p in PATHS] + [("torch", None)] + [
    pytest.param("cuda", p, marks=requires_cuda) for p in CUDA_PATHS
])  # fmt: skip
@pytest.mark.parametrize("seq_lens,width", CPU_CASES, ids=str)
def test_topk_small(seq_lens, width, backend, path, device):
    logits, sl, pt = _case(seq_lens, width, device)
    _check(logits, sl, pt, backend, **(CUDA_PATHS if backend == "cuda" else PATHS).get(path, {}))


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


@pytest.mark.parametrize("path", _paths("split", "split-b128", "single"))
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
    _run(logits, sl, pt, path)


@pytest.mark.parametrize("path", _paths("split", "split-b128", "single"))
def test_topk_just_above_k(path, device):
    """seq_len = 513, 514, 520 in a wide row (the NaN tail past seq_len must not be read) and 512 exactly."""
    logits, sl, pt = _case([513, 514, 520, 512, 3000], 3000, device)
    _run(logits, sl, pt, path)


def test_topk_wide_rows_default_to_split(device):
    """W > 4096 with no options: the split select with the wrapper's block (ragged rows, a tie-heavy row)."""
    logits, sl, pt = _case([5000, 4100, 513, 0], 5000, device)
    logits[1, :4100] = torch.randint(-2, 3, (4100,), device=device).float()
    _check(logits, sl, pt, "triton")


@pytest.mark.parametrize("path", _paths("split-b128", "single"))
def test_topk_negative_and_inf_values(path, device):
    logits, sl, pt = _case([1200], 1200, device)
    logits[0, :1200] = -logits[0, :1200].abs() - 1
    logits[0, 100:700] = float("-inf")  # 600 -inf; 600 finite > 512
    _run(logits, sl, pt, path)
    logits[0, 100:1100] = float("-inf")  # 1000 -inf: the k-th value is -inf
    _run(logits, sl, pt, path)


@pytest.mark.parametrize("path", _paths("split-b128", "single"))
def test_topk_small_k(path, device):
    logits, sl, pt = _case([300, 20], 300, device)
    _run(logits, sl, pt, path, topk=32)


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
    with pytest.raises(KernelArgError, match="backend"):
        topk_transform_512(logits, sl, pt, backend="cutlass")


def test_topk_cuda_needs_a_cuda_tensor():
    logits, sl, pt = _case([600], 600, torch.device("cpu"))
    with pytest.raises(KernelArgError, match="CUDA device"):
        topk_transform_512(logits, sl, pt, backend="cuda")


@pytest.mark.skipif(not HAS_NVCC, reason="nvcc not installed")
def test_build_topk512_sm120a_cubin_arch(tmp_path):
    """csrc/topk512.cu alone compiles for sm_120a without spills; its ELF is sm_120a; the launcher is exported."""
    lib = B.build(["sm_120a"], tmp_path, sources=("topk512.cu",))
    log = (tmp_path / "ptxas.log").read_text()
    assert "topk_transform_kernel" in log and "0 bytes spill stores" in log and "sm_120a" in log
    syms = subprocess.run(["nm", "-D", str(lib)], capture_output=True, text=True).stdout
    assert "pdstack_topk_transform" in syms
    tool = cuobjdump()
    if tool is None:
        pytest.skip("no cuobjdump (CUDA or triton's bundled one)")
    out = subprocess.run([tool, "--list-elf", str(lib)], capture_output=True, text=True, check=True).stdout
    assert "sm_120a" in out and "sm_90" not in out, out


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


@pytest.mark.gpu
@requires_cuda
@pytest.mark.parametrize("seq_lens,width", [
    ([4096] * 8, 4096),
    ([16384, 1, 513, 16000], 16384),
    ([65536, 40000, 600], 65536),  # 64K is past the shared-memory staging limit on every GPU
    ([100_000, 70_001], 100_000),
    ([5000] * 32, 5000),
], ids=lambda v: str(v)[:40])  # fmt: skip
@pytest.mark.parametrize("path", list(CUDA_PATHS))
@pytest.mark.parametrize("offset", [0, 3], ids=["aligned", "misaligned"])
def test_topk_gpu_cuda(seq_lens, width, path, offset):
    """The CUDA kernel on GPU-sized rows: random, tie-heavy, and rows that start off a 16-byte boundary."""
    dev = torch.device("cuda")
    for ties in (False, True):
        logits, sl, pt = _case(seq_lens, width, dev, ties=ties)
        if offset:
            buf = torch.full((len(seq_lens), width + offset), float("nan"), device=dev)
            buf[:, offset:] = logits
            logits = buf[:, offset:]
        _run(logits, sl, pt, path)


@pytest.mark.gpu
@requires_cuda
def test_topk_gpu_cuda_graph_and_no_raw():
    """Captured in a CUDA graph (as SGLang's decode runs it) and without out_raw_indices."""
    logits, sl, pt = _case([20000, 513, 100], 20000, torch.device("cuda"))
    out = torch.empty(3, 512, dtype=torch.int32, device="cuda")
    topk_transform_512(logits, sl, pt, out, backend="cuda")
    want = topk_transform_512(logits, sl, pt, backend="torch")
    g = torch.cuda.CUDAGraph()
    out.fill_(-7)
    with torch.cuda.graph(g):
        topk_transform_512(logits, sl, pt, out, backend="cuda")
    g.replay()
    torch.cuda.synchronize()
    for b in range(3):
        assert sorted(out[b].tolist()) == sorted(want[b].tolist())


@pytest.mark.gpu
@requires_cuda
def test_topk_gpu_auto_default():
    """backend="auto" (the default) on a GPU: whatever it picks is exact on staged, long and tie-heavy rows."""
    for ties in (False, True):
        logits, sl, pt = _case([65536, 16384, 513, 7], 65536, torch.device("cuda"), ties=ties)
        _check(logits, sl, pt, "auto")
        logits, sl, pt = _case([16384, 513, 7], 16384, torch.device("cuda"), ties=ties)
        _check(logits, sl, pt, "auto")
        logits, sl, pt = _case([65536] * 16 + [9000], 65536, torch.device("cuda"), ties=ties)
        _check(logits, sl, pt, "auto")


def test_topk_auto_backend_choice(monkeypatch):
    """The auto rule: CUDA kernel for rows it stages or batches >= 16, the split Triton select otherwise."""
    from pdstack_kernels import topk as T

    class Props:
        shared_memory_per_block_optin = 232448  # H200

    monkeypatch.setattr(T.torch.cuda, "get_device_properties", lambda dev: Props())
    monkeypatch.setattr(T, "_cuda_lib_ok", True)
    cuda = torch.device("cuda", 0)
    assert T._auto_backend(torch.device("cpu"), 8, 16384) == "torch"
    assert T._auto_backend(cuda, 8, 16384) == "cuda"
    assert T._auto_backend(cuda, 1, 4096) == "cuda"
    assert T._auto_backend(cuda, 8, 65536) == "triton"
    assert T._auto_backend(cuda, 32, 65536) == "cuda"
    monkeypatch.setattr(T, "_cuda_lib_ok", False)  # library not loadable: Triton
    assert T._auto_backend(cuda, 8, 16384) == "triton"
