"""The sglang 0.5.23 bf16 index-K patch series (kernels/patches/sglang-0.5.23) and pdstack.image.patches.

The series is applied to a pristine copy of the files it touches (copied from the installed wheel and checked
against the wheel's RECORD hashes), never to the venv's own sglang.

SGLang's modules do not import on this CPU venv (sglang is installed --no-deps: tvm_ffi, transformers, dill, ...
are missing), so the pool, compressor and indexer code is exercised by compiling the *real* function and class
definitions out of the patched files (``_load``) into a namespace where only their module-level imports are
replaced: KVCache by a base that sets the same attributes, sglang's JIT kernels by stand-ins that fail if called.
What runs is the patched code itself: bytes per token, the pool's buffers, the PD registration
(DeepSeekV4TokenToKVPool.get_contiguous_buf_infos), HiCache's indexer regions (hybrid_pool_assembler's
_dsv4_indexer_regions, unpatched), the store and read fallbacks and their dispatch.
Not exercised here: the whole DeepSeekV4TokenToKVPool constructor, HiCache's host-pool allocation, the JIT
compile + launch of the patched .cuh (only an nvcc compile when tvm_ffi headers are present), any GPU run.
"""

from __future__ import annotations
import __future__ as _future

import ast
import base64
import contextlib
import csv
import dataclasses
import hashlib
import math
import py_compile
import shutil
import subprocess
import sys
import sysconfig
import types
import typing
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from pdstack.errors import PdstackError
from pdstack.image.patches import PatchError, apply_series, read_series, series_hash

ROOT = Path(__file__).resolve().parent.parent
SERIES = ROOT / "kernels" / "patches" / "sglang-0.5.23"
SITE = Path(sysconfig.get_paths()["purelib"])
RECORD = SITE / "sglang-0.5.23.dist-info" / "RECORD"
ENV = "PDSTACK_DSV4_BF16_INDEX_K"

POOL = "sglang/srt/mem_cache/deepseek_v4_memory_pool.py"
CUH = "sglang/kernels/jit/csrc/deepseek_v4/fused_norm_rope_v2.cuh"
COMPRESSOR = "sglang/srt/layers/attention/dsv4/compressor_v2.py"
INDEXER = "sglang/srt/layers/attention/dsv4/indexer.py"
ASSEMBLER = "sglang/srt/mem_cache/hybrid_cache/hybrid_pool_assembler.py"
TOUCHED = [POOL, CUH, COMPRESSOR, INDEXER]

if not RECORD.exists():
    pytest.skip("sglang 0.5.23 is not installed in this interpreter", allow_module_level=True)


def _record_hashes() -> dict[str, str]:
    with RECORD.open() as f:
        return {row[0]: row[1] for row in csv.reader(f) if len(row) >= 2 and row[1]}


def _copy_pristine(dest: Path, files: list[str]) -> None:
    hashes = _record_hashes()
    for rel in files:
        data = (SITE / rel).read_bytes()
        digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert digest == hashes[rel], f"{rel} in the venv differs from the sglang 0.5.23 wheel (already patched?)"
        (dest / rel).parent.mkdir(parents=True, exist_ok=True)
        (dest / rel).write_bytes(data)


@pytest.fixture(scope="module")
def trees(tmp_path_factory) -> tuple[Path, Path]:
    """(pristine, patched) copies of the touched files."""
    pristine = tmp_path_factory.mktemp("pristine")
    patched = tmp_path_factory.mktemp("patched")
    _copy_pristine(pristine, TOUCHED)
    _copy_pristine(patched, TOUCHED)
    results = apply_series(SERIES, patched)
    assert [r.status for r in results] == ["applied"] * len(results)
    return pristine, patched


# ----------------------------------------------------------------------------- loading real definitions


class _FailIfCalled:
    def __init__(self, name):
        self.name = name

    def __call__(self, *a, **k):
        raise AssertionError(f"{self.name} (a sglang JIT/CUDA path) was called on CPU")


class _KVCacheBase:
    """Stand-in for sglang.srt.mem_cache.memory_pool.KVCache: the attributes its __init__ sets that the index
    pool reads (memory saver and custom mem pool off, as on a non-NVLink host)."""

    def __init__(self, size, page_size, dtype, layer_num, device, enable_memory_saver, start_layer=None,
                 end_layer=None):  # fmt: skip
        self.size, self.page_size, self.dtype, self.device = size, page_size, dtype, device
        self.layer_num = layer_num
        self.start_layer = start_layer or 0
        self.end_layer = end_layer or layer_num - 1
        self.memory_saver_adapter = types.SimpleNamespace(region=lambda *_: contextlib.nullcontext())
        self.custom_mem_pool = None


def _namespace(**extra) -> dict:
    ns = {"torch": torch, "F": F, "math": math, "os": __import__("os"), "functools": __import__("functools")}
    ns.update({k: getattr(typing, k) for k in ("Any", "List", "Optional", "Tuple", "Union", "Dict", "Sequence")})
    ns.update(
        dataclass=dataclasses.dataclass,
        field=dataclasses.field,
        KVCache=_KVCacheBase,
        nullcontext=contextlib.nullcontext,
        GPU_MEMORY_TYPE_KV_CACHE="kv_cache",
        _is_hip=False,
        ceil_div=lambda a, b: -(-a // b),  # sglang.srt.utils.ceil_div
        logger=__import__("logging").getLogger("test_patches"),
        get_exec=_FailIfCalled("get_exec"),
        compress_norm_rope_store=_FailIfCalled("compress_norm_rope_store"),
        fused_store_cache=_FailIfCalled("fused_store_cache"),
    )
    ns.update(extra)
    return ns


def _load(path: Path, names: list[str], ns: dict | None = None) -> dict:
    """Compile the top-level defs/classes/assignments ``names`` of ``path`` (with its own file name and line
    numbers) into ``ns``. ``Class.method`` loads one method as a plain function."""
    ns = _namespace() if ns is None else ns
    tree = ast.parse(path.read_text(), filename=str(path))
    by_name = {}
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            by_name[node.name] = node
        elif isinstance(node, ast.Assign) and isinstance(node.targets[0], ast.Name):
            by_name[node.targets[0].id] = node
    body = []
    for name in names:
        if "." in name:
            cls, meth = name.split(".")
            node = next(n for n in by_name[cls].body if isinstance(n, ast.FunctionDef) and n.name == meth)
        else:
            node = by_name[name]
        body.append(node)
    module = ast.Module(body=body, type_ignores=[])
    exec(compile(module, str(path), "exec", flags=_future.annotations.compiler_flag, dont_inherit=True), ns)
    return ns


POOL_NAMES = [
    "PDSTACK_BF16_INDEX_K_ENV",
    "dsv4_bf16_index_k_enabled",
    "pdstack_kernel_op",
    "get_dsv4_indexer_bytes_per_token",
    "_num_dsv4_physical_kv_pages",
    "DeepSeekV4IndexerPool",
]


def _pool_module(tree: Path) -> dict:
    names = POOL_NAMES if "pdstack" in (tree / POOL).read_text() else POOL_NAMES[3:]
    return _load(tree / POOL, names)


def _make_pool(mod: dict, *, fp4: bool = False, layers: int = 2, pages: int = 5):
    # page_size 64 slots, size = pages * 64 slots; upstream's _num_dsv4_physical_kv_pages adds one page
    return mod["DeepSeekV4IndexerPool"](
        pages * 64, 64, torch.bfloat16, 128, layers, "cpu", False, use_fp4_indexer=fp4, global_page_size=64
    )


# ----------------------------------------------------------------------------- the series applies


def test_series_lists_four_patches_with_headers():
    patches = read_series(SERIES)
    assert [p.name[:4] for p in patches] == ["0001", "0002", "0003", "0004"]
    for p in patches:
        head = p.read_text().split("\n--- a/", 1)[0]
        assert head.startswith(f"pdstack {p.name[:4]}:") and "What:" in head and "Why:" in head, p.name


def test_series_applies_cleanly_and_is_idempotent(trees, tmp_path):
    pristine, patched = trees
    for rel in TOUCHED:
        assert (pristine / rel).read_bytes() != (patched / rel).read_bytes(), f"{rel} not changed"
    assert {r.status for r in apply_series(SERIES, patched)} == {"already applied"}
    # git apply agrees with GNU patch on the same series (the image build may use either)
    if shutil.which("git"):
        _copy_pristine(tmp_path, TOUCHED)
        for p in read_series(SERIES):
            subprocess.run(["git", "apply", "--check", str(p)], cwd=tmp_path, check=True)
            subprocess.run(["git", "apply", str(p)], cwd=tmp_path, check=True)
        for rel in TOUCHED:
            assert (tmp_path / rel).read_bytes() == (patched / rel).read_bytes(), rel


def test_dry_run_changes_nothing(tmp_path):
    _copy_pristine(tmp_path, TOUCHED)
    before = {rel: (tmp_path / rel).read_bytes() for rel in TOUCHED}
    assert {r.status for r in apply_series(SERIES, tmp_path, dry_run=True)} == {"would apply"}
    assert {rel: (tmp_path / rel).read_bytes() for rel in TOUCHED} == before


def test_patched_modules_compile_and_cuh_is_patched(trees, tmp_path):
    _, patched = trees
    for rel in (POOL, COMPRESSOR, INDEXER):
        py_compile.compile(str(patched / rel), cfile=str(tmp_path / "x.pyc"), doraise=True)
    cuh = (patched / CUH).read_text()
    assert "bool kBf16Store = false>" in cuh
    assert "fused_norm_rope_indexer<DType, kMode, kLogPageSize, kUsePDL, kPreshuffleSize, kBf16Store>" in cuh
    assert '"bf16 store only for flashmla head_dim=512"' not in cuh


def _tvm_ffi_include() -> Path | None:
    try:
        import tvm_ffi  # noqa: F401
    except ImportError:
        return None
    inc = Path(sys.modules["tvm_ffi"].__file__).parent / "include"
    return inc if inc.is_dir() else None


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed")
def test_patched_cuh_compiles_for_sm120_with_and_without_bf16(trees, tmp_path):
    inc = _tvm_ffi_include()
    if inc is None:
        pytest.skip("tvm_ffi headers missing (apache-tvm-ffi==0.1.11, an sglang dependency, is not installed)")
    _, patched = trees
    tu = tmp_path / "tu.cu"
    tu.write_text(
        f'#include "{patched / CUH}"\n'
        "template <bool B> using K = sglang::FusedNormRopeKernel<__nv_bfloat16, 128, 64, 64, 0, B,"
        " sglang::deepseek_v4::KVLayout::V4, false>;\n"
        "void* fp8_store = (void*)&K<false>::forward;\nvoid* bf16_store = (void*)&K<true>::forward;\n"
    )
    jit_inc = SITE / "sglang" / "kernels" / "jit" / "include"
    res = subprocess.run(
        ["nvcc", "-gencode", "arch=compute_120a,code=sm_120a", "-std=c++20", "-O3", "--expt-relaxed-constexpr",
         "-DSGL_CUDA_ARCH=1200", f"-I{jit_inc}", f"-I{inc}", "-c", str(tu), "-o", str(tmp_path / "tu.o")],
        capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert res.returncode == 0, res.stderr[-3000:]


# ----------------------------------------------------------------------------- sizes, buffers, PD, HiCache


def test_bytes_per_token(trees, monkeypatch):
    pristine, patched = trees
    up, mod = _pool_module(pristine), _pool_module(patched)
    monkeypatch.delenv(ENV, raising=False)
    assert mod["get_dsv4_indexer_bytes_per_token"](128, False) == up["get_dsv4_indexer_bytes_per_token"](128, False)
    assert mod["get_dsv4_indexer_bytes_per_token"](128, False) == 132
    for value in ("0", "", "true"):  # only "1" turns it on
        monkeypatch.setenv(ENV, value)
        assert mod["get_dsv4_indexer_bytes_per_token"](128, False) == 132
    monkeypatch.setenv(ENV, "1")
    assert mod["get_dsv4_indexer_bytes_per_token"](128, False) == 256
    assert up["get_dsv4_indexer_bytes_per_token"](128, False) == 132  # upstream ignores the variable
    assert mod["get_dsv4_indexer_bytes_per_token"](128, True) == up["get_dsv4_indexer_bytes_per_token"](128, True)


def _buffers(pool) -> list[tuple]:
    if pool.index_k_with_scale_buffer is None:
        bufs = [*pool.index_k_payload_buffer, *pool.index_k_scale_buffer]
    else:
        bufs = pool.index_k_with_scale_buffer
    return [(tuple(b.shape), b.dtype, b.nbytes) for b in bufs]


def test_pool_off_is_upstream(trees, monkeypatch):
    pristine, patched = trees
    monkeypatch.delenv(ENV, raising=False)
    up, mod = _pool_module(pristine), _pool_module(patched)
    for fp4 in (False, True):
        a, b = _make_pool(up, fp4=fp4), _make_pool(mod, fp4=fp4)
        assert _buffers(b) == _buffers(a)
        assert b.get_bytes_per_token() == a.get_bytes_per_token()
        assert b.contiguous_page_row_buffers()[0].shape == a.contiguous_page_row_buffers()[0].shape
        assert not b.index_k_bf16 and b.index_k_bf16_buffer is None
    assert _buffers(_make_pool(mod))[0] == ((6, 64 * 132), torch.uint8, 6 * 64 * 132)


def test_pool_on_is_bf16_with_256_byte_page_rows(trees, monkeypatch):
    _, patched = trees
    monkeypatch.setenv(ENV, "1")
    mod = _pool_module(patched)
    pool = _make_pool(mod, layers=3, pages=5)
    assert pool.index_k_bf16 and pool.get_bytes_per_token() == 256
    assert len(pool.index_k_bf16_buffer) == 3
    for k, rows in zip(pool.index_k_bf16_buffer, pool.contiguous_page_row_buffers(), strict=True):
        assert k.shape == (6, 64, 1, 128) and k.dtype == torch.bfloat16
        assert rows.shape == (6, 64 * 256) and rows.dtype == torch.uint8 and rows[0].nbytes == 64 * 256
        assert rows.data_ptr() == k.data_ptr() and rows.nbytes == k.nbytes  # one storage, two views
        k[3, 17, 0] = torch.arange(128, dtype=torch.bfloat16)
        assert torch.equal(rows[3].view(torch.bfloat16).view(64, 128)[17], torch.arange(128, dtype=torch.bfloat16))
    # fp4 pools are not bf16 even with the variable set
    fp4 = _make_pool(mod, fp4=True)
    assert not fp4.index_k_bf16 and fp4.get_bytes_per_token() == 68
    # fp8-only writers refuse a bf16 pool instead of scribbling 132-byte rows into it
    with pytest.raises(AssertionError, match="bf16 index-K pool"):
        pool.set_index_fused(0, torch.zeros(1, dtype=torch.int64), torch.zeros(1, 128))


class _FakeTokenPool:
    """Just what DeepSeekV4TokenToKVPool.get_contiguous_buf_infos reads, with the real index pools."""

    def __init__(self, index_pool, page_size=256):
        self.page_size = page_size
        self._unified_kv = self._unified_kv_fp8 = False
        self.compression_ratios = [0, 4, 128, 4]
        self._stage_start, self._stage_end = 0, 4
        kv = types.SimpleNamespace(kv_buffer=[torch.zeros(3, 584 * 64, dtype=torch.uint8)])
        self.kv_pools = {4: kv, 128: types.SimpleNamespace(kv_buffer=[torch.zeros(3, 584 * 2, dtype=torch.uint8)])}
        self.index_pools = {4: index_pool}


def _pd_infos(tree: Path, index_pool):
    ns = _load(tree / POOL, ["DeepSeekV4TokenToKVPool.get_contiguous_buf_infos"])
    return ns["get_contiguous_buf_infos"](_FakeTokenPool(index_pool))


def test_pd_registration_rows(trees, monkeypatch):
    pristine, patched = trees
    monkeypatch.delenv(ENV, raising=False)
    up_pool, off_pool = _make_pool(_pool_module(pristine)), _make_pool(_pool_module(patched))
    up_ptrs, up_lens, up_items = _pd_infos(pristine, up_pool)
    ptrs, lens, items = _pd_infos(patched, off_pool)
    assert (lens, items) == (up_lens, up_items) and len(ptrs) == len(up_ptrs)
    # [c4 KV, c4 indexer layer 0, c4 indexer layer 1, c128 KV]: one page row per item
    assert items == [584 * 64, 64 * 132, 64 * 132, 584 * 2]

    monkeypatch.setenv(ENV, "1")
    on_pool = _make_pool(_pool_module(patched))
    ptrs, lens, items = _pd_infos(patched, on_pool)
    assert items == [584 * 64, 64 * 256, 64 * 256, 584 * 2]  # KV regions unchanged
    assert lens[1:3] == [k.nbytes for k in on_pool.index_k_bf16_buffer]
    assert ptrs[1:3] == [k.data_ptr() for k in on_pool.index_k_bf16_buffer]


def _hicache_regions(pool):
    pool_name = types.SimpleNamespace(DEEPSEEK_V4_C4_INDEXER="c4_indexer", DEEPSEEK_V4_C4_INDEXER_SCALE="c4_scale")
    ns = _load(SITE / ASSEMBLER, ["_IndexerRegion", "_dsv4_indexer_regions"], _namespace(PoolName=pool_name))
    if "NamedTuple" in (SITE / ASSEMBLER).read_text() and "_IndexerRegion" not in ns:
        pytest.fail("could not load _IndexerRegion")
    return ns["_dsv4_indexer_regions"](types.SimpleNamespace(c4_indexer_kv_pool=pool), 256)


def test_hicache_indexer_regions(trees, monkeypatch):
    pristine, patched = trees
    _copy_pristine(pristine, [ASSEMBLER])  # hybrid_pool_assembler.py is read as installed, never patched
    monkeypatch.delenv(ENV, raising=False)
    up = _hicache_regions(_make_pool(_pool_module(pristine)))
    off = _hicache_regions(_make_pool(_pool_module(patched)))
    assert [(r.name, r.item_bytes) for r in off] == [(r.name, r.item_bytes) for r in up] == [("c4_indexer", 8448)]
    monkeypatch.setenv(ENV, "1")
    pool = _make_pool(_pool_module(patched))
    (region,) = _hicache_regions(pool)
    assert region.item_bytes == 64 * 256 and region.item_bytes // pool.page_size == 256
    assert [b.data_ptr() for b in region.device_buffers] == [k.data_ptr() for k in pool.index_k_bf16_buffer]


# ----------------------------------------------------------------------------- store: fallback and dispatch


def _fwht(x: torch.Tensor) -> torch.Tensor:
    """Walsh-Hadamard by butterflies (a different algorithm from the patch's matrix product)."""
    x = x.clone()
    n, h = x.shape[-1], 1
    while h < n:
        x = x.view(*x.shape[:-1], n // (2 * h), 2, h)
        x = torch.stack([x[..., 0, :] + x[..., 1, :], x[..., 0, :] - x[..., 1, :]], -2).view(*x.shape[:-3], n)
        h *= 2
    return x / math.sqrt(n)


def _ref_rows(kv, pos, weight, eps, freqs):
    out = []
    for i in range(kv.shape[0]):
        x = kv[i].double()
        x = x / torch.sqrt((x * x).mean() + eps) * weight.to(kv.dtype).double()
        c = torch.view_as_complex(x[64:].reshape(32, 2).contiguous())
        x = torch.cat([x[:64], torch.view_as_real(c * freqs[int(pos[i])].to(torch.complex128)).flatten()])
        out.append(_fwht(x.float()))
    return torch.stack(out)


class _Plan(tuple):
    """(plan_tensor at [1], compress_ratio, is_decode), shaped like upstream's Compressor*Plan."""

    def __new__(cls, rows, ratio, decode):
        obj = super().__new__(cls, (None, rows, None))
        obj.compress_ratio, obj.is_decode = ratio, decode
        return obj


def _plan_rows(seq_lens, ragged=None, invalid=None) -> torch.Tensor:
    w = torch.zeros(len(seq_lens), 4, dtype=torch.int64)
    w[:, 0] = torch.tensor(seq_lens)
    if invalid is not None:
        w[torch.tensor(invalid), 0] = 0xFFFFFFFF
    if ragged is not None:
        w[:, 1] = torch.tensor(ragged)
    w = torch.where(w >= 2**31, w - 2**32, w)
    return w.to(torch.int32).view(torch.uint8).view(-1, 16)


def _store_inputs(n=6):
    g = torch.Generator().manual_seed(7)
    kv = (torch.randn(n, 128, generator=g) * 3).to(torch.bfloat16)
    weight = torch.rand(128, generator=g) + 0.5
    angles = torch.rand(4096, 32, generator=g) * 6.28
    freqs = torch.polar(torch.ones_like(angles), angles)
    return kv, weight, freqs


def _compressor(tree: Path, **extra) -> dict:
    return _load(
        tree / COMPRESSOR,
        ["_hadamard_matrix", "index_k_norm_rope_store_bf16_torch", "store_index_k_bf16"],
        _namespace(CompressorDecodePlan=object, CompressorPrefillPlan=object, sys_modules=sys.modules, **extra),
    )


@pytest.mark.parametrize("decode", [True, False])
def test_torch_store_fallback_matches_reference(trees, decode):
    _, patched = trees
    ns = _compressor(patched)
    kv, weight, freqs = _store_inputs()
    cache = torch.full((4, 64, 1, 128), float("nan"), dtype=torch.bfloat16)
    rows_u8 = cache.view(torch.uint8).view(4, -1)
    if decode:  # rows 1 and 4 are not at a compression boundary: the kernel skips them
        seq_lens, out_loc, keep = [8, 9, 12, 400, 401, 1000], torch.tensor([70, 71, 5, 200, 201, 130]), [0, 2, 3, 5]
        plan = _Plan(_plan_rows(seq_lens), 4, True)
    else:  # rows 2 and 5 are invalid; out_loc is indexed by ragged id
        seq_lens, keep = [8, 12, 16, 20, 24, 28], [0, 1, 3, 4]
        out_loc = torch.arange(100, 200)
        plan = _Plan(_plan_rows(seq_lens, ragged=[10, 3, 0, 40, 41, 7], invalid=[2, 5]), 4, False)
    before = rows_u8.clone()
    ns["index_k_norm_rope_store_bf16_torch"](
        kv, plan, norm_weight=weight, norm_eps=1e-6, freq_cis=freqs, out_loc=out_loc, kvcache=rows_u8
    )
    flat = cache.view(-1, 128)
    words = plan[1].view(torch.int32).view(-1, 4).long()
    locs = out_loc[:6] if decode else out_loc[words[:, 1] & 0xFFFF]
    pos = torch.tensor(seq_lens) - 4
    ref = _ref_rows(kv, pos, weight, 1e-6, freqs)
    for i in keep:
        got = flat[locs[i]].float()
        assert torch.allclose(got, ref[i], rtol=2**-7, atol=1e-6), i
        assert (got - ref[i].to(torch.bfloat16).float()).abs().max() <= ref[i].abs().max() * 2**-7
    written = {int(locs[i]) for i in keep}
    untouched = [s for s in range(4 * 64) if s not in written]
    assert torch.equal(
        flat.view(torch.int16)[untouched], before.view(torch.bfloat16).view(-1, 128).view(torch.int16)[untouched]
    )


def test_store_dispatch(trees, monkeypatch):
    _, patched = trees
    pool_ns = _pool_module(patched)
    ns = _compressor(patched)
    ns["pdstack_kernel_op"] = pool_ns["pdstack_kernel_op"]
    # `from sglang...deepseek_v4_memory_pool import pdstack_kernel_op` resolves to the patched pool function
    fake_pool_mod = types.ModuleType("sglang.srt.mem_cache.deepseek_v4_memory_pool")
    fake_pool_mod.pdstack_kernel_op = pool_ns["pdstack_kernel_op"]
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.deepseek_v4_memory_pool", fake_pool_mod)
    kv, weight, freqs = _store_inputs(2)
    plan = _Plan(_plan_rows([8, 12]), 4, True)
    rows = torch.zeros(3, 64 * 256, dtype=torch.uint8)
    args = dict(norm_weight=weight, norm_eps=1e-6, freq_cis=freqs, out_loc=torch.tensor([65, 66]), kvcache=rows)

    calls = []
    fake = types.ModuleType("pdstack_kernels")
    fake.index_k_store_bf16 = lambda kv, plan, **kw: calls.append((kv, plan, kw))
    monkeypatch.setitem(sys.modules, "pdstack_kernels", fake)
    ns["store_index_k_bf16"](kv, plan, page_size=64, **args)
    ((c_kv, c_plan, kw),) = calls
    assert c_kv is kv and c_plan is plan and kw["page_size"] == 64
    assert kw["kvcache"].shape == (3, 64, 1, 128) and kw["kvcache"].dtype == torch.bfloat16
    assert kw["kvcache"].data_ptr() == rows.data_ptr()
    assert not rows.any()  # the op was the only writer

    monkeypatch.setitem(sys.modules, "pdstack_kernels", None)  # import fails -> CPU tensors take the torch mirror
    ns["store_index_k_bf16"](kv, plan, page_size=64, **args)
    assert rows.view(torch.bfloat16).view(-1, 128)[65:67].abs().sum() > 0


# ----------------------------------------------------------------------------- read: fallback and dispatch


def _indexer(tree: Path, names: list[str]) -> dict:
    return _load(tree / INDEXER, names, _namespace(FP8_DTYPE=torch.float8_e4m3fn, _arange_cache={}))


def _logits_inputs(batch=3, heads=64, pages=12):
    g = torch.Generator().manual_seed(11)
    # keys that are exact in both layouts: e4m3 values with scale 1
    k = (torch.randn(pages, 64, 1, 128, generator=g) * 4).to(torch.float8_e4m3fn)
    q = (torch.randn(batch, 1, heads, 128, generator=g)).to(torch.float8_e4m3fn)
    weight = torch.rand(batch, heads, generator=g)
    seq_lens = torch.tensor([1, 130, 5 * 64][:batch], dtype=torch.int32)
    page_table = torch.stack([torch.randperm(pages, generator=g)[:6] for _ in range(batch)]).to(torch.int32)
    return k, q, weight, seq_lens, page_table


def test_bf16_read_fallback_equals_upstream_sm120_path_on_exact_keys(trees):
    pristine, patched = trees
    up = _indexer(pristine, ["fp8_paged_mqa_logits_torch_sm120"])["fp8_paged_mqa_logits_torch_sm120"]
    ours = _indexer(patched, ["bf16_paged_mqa_logits_torch"])["bf16_paged_mqa_logits_torch"]
    k, q, weight, seq_lens, page_table = _logits_inputs()
    pages = k.shape[0]
    fp8_pages = torch.cat(
        [k.view(torch.uint8).view(pages, -1), torch.ones(pages, 64, dtype=torch.float32).view(torch.uint8)], 1
    ).view(pages, 64, 1, 132)
    bf16_pages = k.to(torch.bfloat16)
    max_seq_len = 6 * 64 - 10
    a = up(q, fp8_pages, weight, seq_lens, page_table, None, max_seq_len, False)
    b = ours(q, bf16_pages, weight, seq_lens, page_table, max_seq_len)
    assert a.shape == b.shape == (3, max_seq_len) and b.dtype == torch.float32
    assert torch.equal(a, b)
    assert torch.isinf(b[0, 1:]).all() and torch.isfinite(b[2, : 5 * 64]).all() and torch.isinf(b[2, 5 * 64 :]).all()
    # and it is the float32 definition up to bf16 rounding of the products' accumulation
    kf = bf16_pages.float().view(-1, 128)
    for i, n in enumerate(seq_lens.tolist()):
        slots = (page_table[i].long()[:, None] * 64 + torch.arange(64)).flatten()[:n]
        ref = torch.relu(kf[slots] @ q[i, 0].float().T) @ weight[i]
        assert torch.allclose(b[i, :n], ref, rtol=2e-2, atol=1e-2 * ref.abs().max().item())


def test_read_dispatch(trees, monkeypatch):
    _, patched = trees
    ns = _indexer(patched, ["bf16_paged_mqa_logits_torch", "bf16_paged_mqa_logits"])
    fake_pool_mod = types.ModuleType("sglang.srt.mem_cache.deepseek_v4_memory_pool")
    fake_pool_mod.pdstack_kernel_op = _pool_module(patched)["pdstack_kernel_op"]
    monkeypatch.setitem(sys.modules, "sglang.srt.mem_cache.deepseek_v4_memory_pool", fake_pool_mod)
    k, q, weight, seq_lens, page_table = _logits_inputs()
    cache = k.to(torch.bfloat16)
    calls = []
    fake = types.ModuleType("pdstack_kernels")
    fake.paged_mqa_logits_bf16 = lambda *a: calls.append(a) or "op"
    monkeypatch.setitem(sys.modules, "pdstack_kernels", fake)
    # upstream's call: (q, kv, weights, seq_lens as [B, 1], page_table, deep_gemm_metadata, max_seq_len, False)
    assert ns["bf16_paged_mqa_logits"](q, cache, weight, seq_lens.unsqueeze(-1), page_table, None, 300, False) == "op"
    ((cq, ck, cw, cs, cp, cm),) = calls
    assert cq.dtype == torch.bfloat16 and cq.shape == q.shape and ck is cache
    assert cw.dtype == torch.float32 and cs.shape == (3,) and cs.dtype == torch.int32 and cp.dtype == torch.int32
    assert cm == 300
    monkeypatch.setitem(sys.modules, "pdstack_kernels", None)
    out = ns["bf16_paged_mqa_logits"](q, cache, weight, seq_lens.unsqueeze(-1), page_table, None, 300, False)
    assert torch.equal(out, ns["bf16_paged_mqa_logits_torch"](q, cache, weight, seq_lens, page_table, 300))


# ----------------------------------------------------------------------------- applier failures and hash


def _copy_series(dest: Path) -> Path:
    shutil.copytree(SERIES, dest)
    return dest


def test_broken_patch_names_patch_and_hunk_and_changes_nothing(tmp_path):
    series = _copy_series(tmp_path / "series")
    p3 = series / "0003-dsv4-bf16-index-k-compressor-store.patch"
    text = p3.read_text()
    context = "         # Step 2: norm + rope + store\n"
    assert context in text
    p3.write_text(text.replace(context, "         # Step 2: something upstream never had\n"))
    site = tmp_path / "site"
    _copy_pristine(site, TOUCHED)
    before = {rel: (site / rel).read_bytes() for rel in TOUCHED}
    with pytest.raises(PdstackError) as exc:
        apply_series(series, site)
    msg = str(exc.value)
    assert isinstance(exc.value, PatchError)
    assert "0003-dsv4-bf16-index-k-compressor-store.patch" in msg and "hunk #" in msg and COMPRESSOR in msg
    assert str(site) in msg and "pdstack-patches-" not in msg
    assert {rel: (site / rel).read_bytes() for rel in TOUCHED} == before  # 0001 and 0002 were not left applied


def test_missing_target_file_is_reported(tmp_path):
    site = tmp_path / "site"
    _copy_pristine(site, [POOL, CUH, COMPRESSOR])  # no indexer.py
    with pytest.raises(PatchError, match="0004-dsv4-bf16-index-k-indexer-read.patch"):
        apply_series(SERIES, site)


def test_series_file_problems(tmp_path):
    series = _copy_series(tmp_path / "s")
    (series / "series").write_text("# only a comment\n\n")
    with pytest.raises(PatchError, match="lists no patches"):
        apply_series(series, tmp_path)
    (series / "series").write_text("0009-missing.patch\n")
    with pytest.raises(PatchError, match="0009-missing.patch"):
        read_series(series)


def _site_with_record(tmp_path: Path) -> Path:
    """A site-packages holding the pristine touched files and an sglang RECORD listing exactly them (+ one more)."""
    site = tmp_path / "site"
    _copy_pristine(site, TOUCHED)
    hashes = _record_hashes()
    dist = site / "sglang-0.5.23.dist-info"
    dist.mkdir()
    rows = [[rel, hashes[rel], str((site / rel).stat().st_size)] for rel in TOUCHED]
    rows.append(["sglang-0.5.23.dist-info/RECORD", "", ""])
    with (dist / "RECORD").open("w", newline="") as f:
        csv.writer(f, lineterminator="\n").writerows(rows)
    return site


def test_record_checked_before_and_rewritten_after(tmp_path):
    site = _site_with_record(tmp_path)
    results = apply_series(SERIES, site, record=True)
    assert [r.status for r in results] == ["applied"] * 4
    with (site / "sglang-0.5.23.dist-info" / "RECORD").open() as f:
        rows = {row[0]: row for row in csv.reader(f)}
    pristine = _record_hashes()
    for rel in TOUCHED:
        data = (site / rel).read_bytes()
        digest = "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()
        assert rows[rel][1:] == [digest, str(len(data))] and digest != pristine[rel]
    assert rows["sglang-0.5.23.dist-info/RECORD"][1:] == ["", ""]
    # A second run: the files now match the RECORD we wrote, every patch reports already applied.
    assert [r.status for r in apply_series(SERIES, site, record=True)] == ["already applied"] * 4


def test_a_file_that_differs_from_record_is_refused_before_anything_changes(tmp_path):
    site = _site_with_record(tmp_path)
    (site / INDEXER).write_text((site / INDEXER).read_text() + "# local edit\n")
    before = {rel: (site / rel).read_bytes() for rel in TOUCHED}
    with pytest.raises(PatchError, match=r"indexer\.py differs from sglang-0\.5\.23\.dist-info/RECORD"):
        apply_series(SERIES, site, record=True)
    assert {rel: (site / rel).read_bytes() for rel in TOUCHED} == before


def test_series_hash(tmp_path):
    h = series_hash(SERIES)
    assert len(h) == 64 and h == series_hash(SERIES)
    series = _copy_series(tmp_path / "s")
    assert series_hash(series) == h
    p1 = series / "0001-dsv4-bf16-index-k-pool.patch"
    p1.write_bytes(p1.read_bytes() + b"\n")
    assert series_hash(series) != h
    series2 = _copy_series(tmp_path / "s2")
    lines = (series2 / "series").read_text().split()
    (series2 / "series").write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    assert series_hash(series2) != h
