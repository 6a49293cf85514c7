"""Our indexer kernels against upstream's own, side by side on one GPU (kernels/BENCHMARKS.md).

    python kernels/benchmarks/bench_vs_upstream.py --upstream DIR [--out DIR] [--batch 1 4 16 64]
        [--n 4096 16384 65536 131072] [--ops logits topk pipeline store]

DIR holds the upstream modules built by ``upstream/build_upstream.py`` (SGLang 0.5.23's JIT top-k v1/v2 and
fused norm+RoPE store, DeepGEMM 0.2.3.post2's fp8 paged MQA logits); those that are missing are reported as
such, not skipped silently. Raw results go to ``--out`` (default ``build/bench``; pass $OUT on the device):
``vs_upstream.json`` and ``vs_upstream.md`` (the tables). Nothing is written into the source tree.

Every case: H=64, D=128, pages of 64 shuffled in the pool, every row N positions (seq_len = N). Each op's
output is checked against the float32 references (pdstack_kernels.reference) in the same run before it is
timed. Times are medians of CUDA-graph replays (captured once), L2 flushed before each replay by writing a
512 MiB buffer ("write" flush, as bench_indexer.py); logits are also timed after a read-only flush (reading
512 MiB), which leaves no dirty lines in L2 for the kernel to write back. % copy = bytes the op must read /
time, over the device-to-device copy bandwidth (read + written) measured in this run.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import statistics
import sys
import traceback
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from pdstack_kernels import index_k_store_bf16, paged_mqa_logits_bf16  # noqa: E402
from pdstack_kernels import reference as R  # noqa: E402

H, D, PAGE, TOPK = 64, 128, 64, 512
LOGITS_VARIANTS: dict[str, dict] = {}  # name -> paged_mqa_logits_bf16 kwargs (set with --logits-variants)
def _ppp_uncapped(bsz: int, max_pages: int) -> dict:
    """The pages_per_prog heuristic before it was capped at 4 (grow to 16 while >= 2 programs per SM)."""
    sms, ppp = torch.cuda.get_device_properties(0).multi_processor_count, 1
    while ppp < 16 and bsz * -(-max_pages // (ppp * 2)) >= 2 * sms:
        ppp *= 2
    return dict(pages_per_prog=ppp)


VARIANT_CHOICES = {
    "ppp_uncapped": _ppp_uncapped,
    "ppp2": dict(pages_per_prog=2),
    "ppp4": dict(pages_per_prog=4),
    "ppp8": dict(pages_per_prog=8),
    "s2": dict(num_stages=2),
    "s4": dict(num_stages=4),
    "w8": dict(num_warps=8),
    "ppp1": dict(pages_per_prog=1),
}
REPO = Path(__file__).resolve().parents[2]


# ----------------------------------------------------------------------------- timing


class Timer:
    def __init__(self, flush_bytes: int = 512 << 20):
        self.flush_w = torch.empty(flush_bytes, dtype=torch.uint8, device="cuda")
        self.flush_r = torch.ones(flush_bytes // 4, dtype=torch.float32, device="cuda")

    def _flush(self, mode: str) -> None:
        if mode == "write":
            self.flush_w.zero_()
        else:
            self.flush_r.sum()

    def events(self, fn, reps: int = 30, warmup: int = 3, flush: str = "write") -> float:
        for _ in range(warmup):
            fn()
        times = []
        for _ in range(reps):
            self._flush(flush)
            s, e = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            s.record()
            fn()
            e.record()
            e.synchronize()
            times.append(s.elapsed_time(e) * 1e3)
        return statistics.median(times)

    def graph(self, fn, reps: int = 30, flush: str = "write") -> float:
        """Median us of one replay of a CUDA graph of fn() (captured once, on a side stream as torch does)."""
        fn()
        torch.cuda.synchronize()
        g = torch.cuda.CUDAGraph()
        with torch.cuda.graph(g):
            fn()
        torch.cuda.synchronize()
        return self.events(g.replay, reps=reps, flush=flush)


def copy_bandwidth(timer: Timer, nbytes: int = 2 << 30) -> float:
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda").random_()
    dst = torch.empty_like(src)
    us = timer.events(lambda: dst.copy_(src), reps=10)
    return 2 * nbytes / us / 1e3  # GB/s, read + written


# ----------------------------------------------------------------------------- upstream modules


class Upstream:
    """The upstream kernels, each None where its module is missing (reason in ``missing``)."""

    def __init__(self, libdir: Path | None):
        self.missing: dict[str, str] = {}
        self.topk_v1 = self.topk_v2 = self.norm_fp8 = self.norm_bf16 = self.dg = None
        if libdir is None:
            self.missing["all"] = "no --upstream DIR given"
            return
        try:
            import tvm_ffi
        except Exception as exc:  # pragma: no cover - device only
            tvm_ffi = None
            self.missing["tvm_ffi"] = f"import tvm_ffi failed: {exc!r}"
        for attr, name in (("topk_v1", "sgl_topk_v1.so"), ("topk_v2", "sgl_topk_v2.so"),
                           ("norm_fp8", "sgl_norm_rope_fp8.so"), ("norm_bf16", "sgl_norm_rope_bf16.so")):  # fmt: skip
            path = libdir / name
            if tvm_ffi is None or not path.exists():
                self.missing[attr] = f"{path} missing" if tvm_ffi is not None else "no tvm_ffi"
                continue
            try:
                setattr(self, attr, tvm_ffi.load_module(str(path)))
            except Exception as exc:
                self.missing[attr] = f"load {path}: {exc!r}"[:400]
        path = libdir / "dg_paged_mqa_logits.so"
        if path.exists():
            try:
                lib = ctypes.CDLL(str(path))
                lib.pdk_dg_paged_mqa_logits_metadata.argtypes = [ctypes.c_void_p] * 2 + [ctypes.c_int, ctypes.c_void_p]
                lib.pdk_dg_fp8_paged_mqa_logits.argtypes = (
                    [ctypes.c_void_p] * 7 + [ctypes.c_int, ctypes.c_int, ctypes.c_long, ctypes.c_int, ctypes.c_int,
                                             ctypes.c_void_p])  # fmt: skip
                self.dg = lib
            except Exception as exc:
                self.missing["deep_gemm"] = f"load {path}: {exc!r}"[:400]
        else:
            self.missing["deep_gemm"] = f"{path} missing"

    # DeepGEMM: deep_gemm.get_paged_mqa_logits_metadata(context_lens [B, 1], 64, num_sms)
    def dg_metadata(self, ctx_2d: torch.Tensor) -> torch.Tensor:
        meta = torch.empty(self.dg.pdk_dg_num_sms() + 1, 2, dtype=torch.int32, device="cuda")
        err = self.dg.pdk_dg_paged_mqa_logits_metadata(ctx_2d.data_ptr(), meta.data_ptr(), ctx_2d.shape[0],
                                                        torch.cuda.current_stream().cuda_stream)  # fmt: skip
        if err:
            raise RuntimeError(f"DeepGEMM metadata launch failed: {err}")
        return meta

    # deep_gemm.fp8_paged_mqa_logits(q_fp8, kv_fp8_fused, weights, context_lens, block_table, meta, max_len)
    def dg_logits(self, q_fp8, kv_u8, w, ctx_2d, pt, meta, out) -> torch.Tensor:
        err = self.dg.pdk_dg_fp8_paged_mqa_logits(
            q_fp8.data_ptr(), kv_u8.data_ptr(), w.data_ptr(), ctx_2d.data_ptr(), out.data_ptr(), pt.data_ptr(),
            meta.data_ptr(), q_fp8.shape[0], kv_u8.shape[0], kv_u8.stride(0), out.stride(0), pt.stride(0),
            torch.cuda.current_stream().cuda_stream)  # fmt: skip
        if err:
            raise RuntimeError(f"DeepGEMM paged MQA logits launch failed: {err}")
        return out


# ----------------------------------------------------------------------------- cases


def make_case(bsz: int, n: int, gen: torch.Generator):
    pages_per_row = n // PAGE
    num_pages = bsz * pages_per_row + 8
    kv = torch.randn(num_pages, PAGE, 1, D, device="cuda", generator=gen).to(torch.bfloat16)
    pt = torch.randperm(num_pages, device="cuda", generator=gen)[: bsz * pages_per_row].to(torch.int32)
    pt = pt.view(bsz, pages_per_row).contiguous()
    q = torch.randn(bsz, 1, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.rand(bsz, H, device="cuda", generator=gen) / H**0.5
    sl = torch.full((bsz,), n, dtype=torch.int32, device="cuda")
    return q, kv, w, sl, pt


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    got, ref = got.double(), ref.double()
    if not torch.isfinite(got).all():
        return float("inf")
    return float((got - ref).norm() / ref.norm().clamp_min(1e-30))


def per_row_ref(q, kv, w, sl, pt, n, layout):
    return torch.cat([R.paged_mqa_logits_ref(q[b : b + 1], kv, w[b : b + 1], sl[b : b + 1], pt[b : b + 1], n,
                                             layout=layout) for b in range(q.shape[0])])  # fmt: skip


def topk_exact(logits, sl, pt, page_idx, raw_idx) -> bool:
    """The selected set is the 512 largest (sorted values equal torch.topk's) and page slots match raw."""
    ref_vals = torch.topk(logits, TOPK, dim=1).values
    got_vals = torch.sort(torch.gather(logits, 1, raw_idx.long().clamp_min(0)), dim=1, descending=True).values
    slots = pt.gather(1, (raw_idx.long() >> 6).clamp_min(0)).long() * PAGE + (raw_idx.long() & 63)
    return bool(torch.equal(got_vals, ref_vals) and torch.equal(slots.to(torch.int32), page_idx)
                and int(raw_idx.min()) >= 0)  # fmt: skip


# ----------------------------------------------------------------------------- ops


def bench_logits_topk(timer, up: Upstream, copy_gbs, bsz, n, ops, gen) -> dict:
    q, kv, w, sl, pt = make_case(bsz, n, gen)
    res: dict = {"B": bsz, "N": n}
    bf16_bytes, fp8_bytes = bsz * n * D * 2, bsz * n * (D + 4)
    kv_fp8 = R.quantize_fp8_pages(kv)  # upstream's page layout (132 B/token)
    q_fp8 = q.to(torch.float8_e4m3fn)
    sl2 = sl.view(-1, 1).contiguous()

    # --- logits: ours (bf16 keys) vs DeepGEMM (fp8 keys)
    ours = paged_mqa_logits_bf16(q, kv, w, sl, pt, n)
    ref = per_row_ref(q, kv, w, sl, pt, n, "bf16")
    res["ours_logits_err"] = rel_err(ours, ref)
    for flush in ("write", "read"):
        us = timer.graph(lambda: paged_mqa_logits_bf16(q, kv, w, sl, pt, n), flush=flush)
        res[f"ours_logits_us_{flush}"] = us
        res[f"ours_logits_pct_{flush}"] = 100 * bf16_bytes / us / 1e3 / copy_gbs
    # what a plain streaming read of the same bytes costs in the same setup (torch's sum over the key bytes):
    # the ceiling a read-bound kernel of this size can reach, launch and cold-start included
    flat = kv.view(-1)[: bsz * n * D]
    for flush in ("write", "read"):
        us = timer.graph(lambda: flat.sum(dtype=torch.float32), flush=flush)
        res[f"read_ceiling_us_{flush}"] = us
        res[f"read_ceiling_pct_{flush}"] = 100 * bf16_bytes / us / 1e3 / copy_gbs
    res["ours_over_ceiling_read"] = res["ours_logits_us_read"] / res["read_ceiling_us_read"]
    for name, spec in LOGITS_VARIANTS.items():  # tuning variants, each checked against the reference first
        kw = spec(bsz, -(-n // PAGE)) if callable(spec) else spec
        try:
            got = paged_mqa_logits_bf16(q, kv, w, sl, pt, n, **kw)
            res[f"var_{name}_err"] = rel_err(got, ref)
            for flush in ("write", "read"):
                res[f"var_{name}_us_{flush}"] = timer.graph(
                    lambda kw=kw: paged_mqa_logits_bf16(q, kv, w, sl, pt, n, **kw), flush=flush
                )
        except Exception as exc:
            res[f"var_{name}_error"] = repr(exc)[:300]
    del ref
    if up.dg is not None:
        meta = up.dg_metadata(sl2)
        stride = -(-n // 256) * 256
        dg_out = torch.full((bsz, stride), float("nan"), device="cuda")
        up.dg_logits(q_fp8, kv_fp8, w, sl2, pt, meta, dg_out)
        torch.cuda.synchronize()
        ref8 = per_row_ref(q_fp8.to(torch.bfloat16), kv_fp8, w, sl, pt, n, "fp8")
        res["dg_logits_err"] = rel_err(dg_out[:, :n], ref8)
        del ref8
        for flush in ("write", "read"):
            us = timer.graph(lambda: up.dg_logits(q_fp8, kv_fp8, w, sl2, pt, meta, dg_out), flush=flush)
            res[f"dg_logits_us_{flush}"] = us
            res[f"dg_logits_pct_{flush}"] = 100 * fp8_bytes / us / 1e3 / copy_gbs
        res["logits_ratio"] = res["ours_logits_us_write"] / res["dg_logits_us_write"]
    if "torch" in ops:  # upstream's sm_120 torch path, shaped on bf16 keys (as bench_indexer.py)
        res["torch_gather_us"] = timer.graph(lambda: R.paged_mqa_logits_torch_gather(q, kv, w, sl, pt, n), reps=5)

    # --- SGLang's top-512 over our logits (the serving path keeps it; ours was removed, BENCHMARKS.md)
    logits = ours
    out = torch.empty(bsz, TOPK, dtype=torch.int32, device="cuda")
    raw = torch.empty_like(out)
    if up.topk_v1 is not None:
        out.fill_(-7), raw.fill_(-7)
        up.topk_v1.topk_transform(logits, sl, pt, out, 64, raw)
        res["v1_exact"] = topk_exact(logits, sl, pt, out, raw)
        res["v1_us"] = timer.graph(lambda: up.topk_v1.topk_transform(logits, sl, pt, out, 64, raw))
    if up.topk_v2 is not None:
        plan = torch.empty(bsz + 1, 2, dtype=torch.int32, device="cuda")
        up.topk_v2.topk_plan(sl, plan, -1)  # SGLang plans once per batch (metadata), not per layer
        out.fill_(-7), raw.fill_(-7)
        up.topk_v2.topk_transform_paged(logits, sl, pt, out, 64, plan, raw)
        res["v2_exact"] = topk_exact(logits, sl, pt, out, raw)
        res["v2_us"] = timer.graph(lambda: up.topk_v2.topk_transform_paged(logits, sl, pt, out, 64, plan, raw))
    res["torch_topk_us"] = timer.graph(lambda: torch.topk(logits, TOPK, dim=1, sorted=False), reps=10)

    # --- the indexer step: logits + top-512 in one graph
    if "pipeline" in ops:  # the serving path: our logits + SGLang's top-k; upstream's: DeepGEMM + the same
        steps = {}
        if up.topk_v1 is not None:
            steps["ours_v1"] = lambda: up.topk_v1.topk_transform(
                paged_mqa_logits_bf16(q, kv, w, sl, pt, n), sl, pt, out, 64, None)
        if up.topk_v2 is not None:
            steps["ours_v2"] = lambda: up.topk_v2.topk_transform_paged(
                paged_mqa_logits_bf16(q, kv, w, sl, pt, n), sl, pt, out, 64, plan, None)
        if up.dg is not None and up.topk_v1 is not None:
            steps["dg_v1"] = lambda: up.topk_v1.topk_transform(
                up.dg_logits(q_fp8, kv_fp8, w, sl2, pt, meta, dg_out)[:, :n], sl, pt, out, 64, None)
        if up.dg is not None and up.topk_v2 is not None:
            steps["dg_v2"] = lambda: up.topk_v2.topk_transform_paged(
                up.dg_logits(q_fp8, kv_fp8, w, sl2, pt, meta, dg_out)[:, :n], sl, pt, out, 64, plan, None)
        for name, fn in steps.items():
            res[f"{name}_step_us"] = timer.graph(fn)
        for peer in ("v1", "v2"):
            if f"ours_{peer}_step_us" in res and "dg_logits_us_write" in res:
                res[f"step_{peer}_over_dg_logits"] = res[f"ours_{peer}_step_us"] / res["dg_logits_us_write"]
                res[f"step_{peer}_over_dg_step"] = res[f"ours_{peer}_step_us"] / res[f"dg_{peer}_step_us"]
    return res


MIXED_CASES = [  # (what, B, max_seq_len, seq_lens): rows shorter than the logits width, as under CUDA graphs
    ("1K rows, capture-wide max", 16, 32768, [1024] * 16),
    ("1K rows, capture-wide max", 64, 32768, [1024] * 64),
    ("4K rows, capture-wide max", 4, 32768, [4096] * 4),
    ("8K rows, capture-wide max", 16, 131072, [8192] * 16),
    ("uniform 64..32K", 16, 32768, "uniform"),
    ("uniform 64..32K", 64, 32768, "uniform"),
]


def bench_mixed(timer, up: Upstream, copy_gbs, what, bsz, max_len, lens, gen) -> dict:
    """Rows of different lengths in one call, max_seq_len = the capture's width (SGLang passes the page table's
    width x 64 under CUDA graphs); stale page-table entries (page 0) past each row's end."""
    if lens == "uniform":
        lens = torch.randint(64, max_len + 1, (bsz,), device="cuda", generator=gen).tolist()
    pages = [-(-n // PAGE) for n in lens]
    num_pages = sum(pages) + 8
    kv = torch.randn(num_pages, PAGE, 1, D, device="cuda", generator=gen).to(torch.bfloat16)
    perm = torch.randperm(num_pages, device="cuda", generator=gen).to(torch.int32)
    pt = torch.zeros(bsz, -(-max_len // PAGE), dtype=torch.int32, device="cuda")
    used = 0
    for b, n in enumerate(pages):
        pt[b, :n] = perm[used : used + n]
        used += n
    q = torch.randn(bsz, 1, H, D, device="cuda", generator=gen).to(torch.bfloat16)
    w = torch.rand(bsz, H, device="cuda", generator=gen) / H**0.5
    sl = torch.tensor(lens, dtype=torch.int32, device="cuda")
    live_bytes = sum(lens) * D * 2
    res: dict = {"what": what, "B": bsz, "max_len": max_len, "mean_len": round(sum(lens) / bsz)}
    ref = per_row_ref(q, kv, w, sl, pt, max_len, "bf16")
    fin = torch.isfinite(ref)
    out = paged_mqa_logits_bf16(q, kv, w, sl, pt, max_len)
    mask_ok = torch.equal(torch.isneginf(out), torch.isneginf(ref))
    res["ours_err"] = rel_err(out[fin], ref[fin]) if mask_ok else float("inf")
    res["ours_us"] = timer.graph(lambda: paged_mqa_logits_bf16(q, kv, w, sl, pt, max_len), flush="read")
    res["ours_pct"] = 100 * live_bytes / res["ours_us"] / 1e3 / copy_gbs
    for name, spec in LOGITS_VARIANTS.items():
        kw = spec(bsz, -(-max_len // PAGE)) if callable(spec) else spec
        got = paged_mqa_logits_bf16(q, kv, w, sl, pt, max_len, **kw)
        ok = torch.equal(torch.isneginf(got), torch.isneginf(ref)) and not got.isnan().any()
        res[f"var_{name}_err"] = rel_err(got[fin], ref[fin]) if ok else float("inf")
        res[f"var_{name}_us"] = timer.graph(lambda kw=kw: paged_mqa_logits_bf16(q, kv, w, sl, pt, max_len, **kw),
                                            flush="read")  # fmt: skip
    if up.dg is not None:
        kv8, q8, sl2 = R.quantize_fp8_pages(kv), q.to(torch.float8_e4m3fn), sl.view(-1, 1).contiguous()
        meta = up.dg_metadata(sl2)
        dg_out = torch.full((bsz, -(-max_len // 256) * 256), float("nan"), device="cuda")
        up.dg_logits(q8, kv8, w, sl2, pt, meta, dg_out)
        ref8 = per_row_ref(q8.to(torch.bfloat16), kv8, w, sl, pt, max_len, "fp8")
        res["dg_err"] = rel_err(dg_out[:, :max_len][fin], ref8[fin])
        res["dg_us"] = timer.graph(lambda: up.dg_logits(q8, kv8, w, sl2, pt, meta, dg_out), flush="read")
        res["ratio"] = res["ours_us"] / res["dg_us"]
    return res


def bench_store(timer, up: Upstream, copy_gbs, tokens: int, decode: bool, gen) -> dict:
    ratio, eps, max_pos = 4, 1e-6, 1 << 16
    num_pages = max(tokens // PAGE * 2, 16)
    kv = torch.randn(tokens, D, device="cuda", generator=gen).to(torch.bfloat16)
    norm_w = (1 + 0.1 * torch.randn(D, device="cuda", generator=gen)).to(torch.bfloat16)
    ang = torch.rand(max_pos, D // 4, device="cuda", generator=gen) * 6.283
    freq = torch.polar(torch.ones_like(ang), ang)  # complex [P, 32]
    freq_real = torch.view_as_real(freq).flatten(-2).contiguous()
    seq = (torch.randint(1, max_pos // ratio, (tokens,), device="cuda", generator=gen) * ratio).to(torch.int32)
    out_loc = torch.randperm(num_pages * PAGE, device="cuda", generator=gen)[:tokens].to(torch.int64)
    if decode:
        plan = R.make_decode_plan(seq)
    else:
        plan = R.make_extend_plan(seq, torch.arange(tokens, device="cuda"))
    res: dict = {"tokens": tokens, "mode": "decode" if decode else "extend"}
    ref = R.index_k_store_ref(kv, plan, norm_weight=norm_w, norm_eps=eps, freq_cis=freq, out_loc=out_loc,
                              kvcache=torch.zeros(num_pages, PAGE, 1, D, device="cuda", dtype=torch.bfloat16),
                              is_decode=decode, compress_ratio=ratio)  # fmt: skip
    ref_rows = ref.view(-1, D)[out_loc].float()
    # exact float32 transform for the fp8 check
    pos = seq.long() - ratio
    k32 = R.index_k_transform_ref(kv, pos, norm_w, eps, freq)
    io_bytes = tokens * (D * 2 + 16 + 8)  # input row + plan + out_loc

    cache = torch.full((num_pages, PAGE, 1, D), float("nan"), device="cuda", dtype=torch.bfloat16)
    index_k_store_bf16(kv, plan, norm_weight=norm_w, norm_eps=eps, freq_cis=freq, out_loc=out_loc, kvcache=cache,
                       compress_ratio=ratio, is_decode=decode)  # fmt: skip
    res["ours_err"] = rel_err(cache.view(-1, D)[out_loc], ref_rows)
    res["ours_err_vs_f32"] = rel_err(cache.view(-1, D)[out_loc], k32)
    res["ours_us"] = timer.graph(lambda: index_k_store_bf16(
        kv, plan, norm_weight=norm_w, norm_eps=eps, freq_cis=freq, out_loc=out_loc, kvcache=cache,
        compress_ratio=ratio, is_decode=decode))  # fmt: skip
    res["ours_GBps"] = (io_bytes + tokens * D * 2) / res["ours_us"] / 1e3
    try:
        _store_upstream(timer, up, res, kv, plan, norm_w, eps, freq_real, out_loc, cache, decode, ratio, ref_rows, k32,
                        num_pages)  # fmt: skip
    except Exception as exc:
        res["upstream_error"] = repr(exc)[:400]
    return res


def _store_upstream(timer, up, res, kv, plan, norm_w, eps, freq_real, out_loc, cache, decode, ratio, ref_rows, k32,
                    num_pages):  # fmt: skip
    if up.norm_bf16 is not None:
        cache.fill_(float("nan"))
        cu8 = cache.view(torch.uint8).view(num_pages, PAGE * D * 2)
        up.norm_bf16.forward(kv, plan, norm_w, eps, freq_real, out_loc, cu8, decode, ratio)
        res["sgl_bf16_err"] = rel_err(cache.view(-1, D)[out_loc], ref_rows)
        res["sgl_bf16_us"] = timer.graph(
            lambda: up.norm_bf16.forward(kv, plan, norm_w, eps, freq_real, out_loc, cu8, decode, ratio)
        )
        res["ratio_vs_sgl_bf16"] = res["ours_us"] / res["sgl_bf16_us"]
    if up.norm_fp8 is not None:
        c8 = torch.full((num_pages, PAGE * (D + 4)), 0xFF, device="cuda", dtype=torch.uint8)
        up.norm_fp8.forward(kv, plan, norm_w, eps, freq_real, out_loc, c8, decode, ratio)
        deq = R.dequantize_fp8_pages(c8).view(-1, D)[out_loc]
        res["sgl_fp8_err_vs_f32"] = rel_err(deq, k32)
        res["sgl_fp8_us"] = timer.graph(
            lambda: up.norm_fp8.forward(kv, plan, norm_w, eps, freq_real, out_loc, c8, decode, ratio)
        )
        res["ratio_vs_sgl_fp8"] = res["ours_us"] / res["sgl_fp8_us"]


# ----------------------------------------------------------------------------- tables

US, PCT, RATIO, ERR = "{:.1f}", "{:.0f}%", "{:.2f}", "{:.1e}"
LOGITS_COLS = [
    ("ours us", "ours_logits_us_write", US), ("ours % copy", "ours_logits_pct_write", PCT),
    ("ours us (read flush)", "ours_logits_us_read", US), ("% copy", "ours_logits_pct_read", PCT),
    ("DeepGEMM us", "dg_logits_us_write", US), ("DG % copy", "dg_logits_pct_write", PCT),
    ("DG us (read flush)", "dg_logits_us_read", US), ("DG % copy ", "dg_logits_pct_read", PCT),
    ("sum() of the key bytes us (read flush)", "read_ceiling_us_read", US),
    ("its % copy", "read_ceiling_pct_read", PCT),
    ("ours / sum() (read flush)", "ours_over_ceiling_read", RATIO),
    ("ours / DG", "logits_ratio", RATIO), ("ours err", "ours_logits_err", ERR), ("DG err", "dg_logits_err", ERR),
    ("torch sm_120-shaped us", "torch_gather_us", US),
]  # fmt: skip
TOPK_COLS = [
    ("SGLang v1 us", "v1_us", US), ("SGLang v2 us", "v2_us", US), ("torch.topk", "torch_topk_us", US),
]  # fmt: skip
STEP_COLS = [
    ("ours + v1 us", "ours_v1_step_us", US), ("DeepGEMM + v1 us", "dg_v1_step_us", US),
    ("ours + v2 us", "ours_v2_step_us", US), ("DeepGEMM + v2 us", "dg_v2_step_us", US),
    ("DeepGEMM logits alone", "dg_logits_us_write", US),
    ("ours + v1 / DG logits", "step_v1_over_dg_logits", RATIO),
    ("ours + v2 / DG logits", "step_v2_over_dg_logits", RATIO),
    ("ours + v1 / DG + v1", "step_v1_over_dg_step", RATIO), ("ours + v2 / DG + v2", "step_v2_over_dg_step", RATIO),
]  # fmt: skip
STORE_COLS = [
    ("ours bf16 us", "ours_us", US), ("SGLang bf16 (patch 0002) us", "sgl_bf16_us", US),
    ("SGLang fp8 us", "sgl_fp8_us", US), ("ours / SGLang bf16", "ratio_vs_sgl_bf16", RATIO),
    ("ours / SGLang fp8", "ratio_vs_sgl_fp8", RATIO), ("ours err", "ours_err", ERR),
    ("SGLang bf16 err", "sgl_bf16_err", ERR), ("SGLang fp8 err vs f32", "sgl_fp8_err_vs_f32", ERR),
]  # fmt: skip


def _table(title: str, rows: list[dict], keys: list[tuple[str, str]], cols: list[tuple[str, str, str]],
           exact: tuple[str, ...] = ()) -> list[str]:  # fmt: skip
    """Markdown table: the row keys (header, key) first, then the columns (header, key, format)."""
    head = [h for h, _ in keys] + [h for h, _, _ in cols] + ([f"exact ({'/'.join(exact)})"] if exact else [])
    out = ["", f"### {title}", "", "| " + " | ".join(head) + " |", "|" + "---:|" * (len(head) - bool(exact))]
    out[-1] += "---|" if exact else ""
    for r in rows:
        cells = [str(r[k]) for _, k in keys]
        cells += ["n/a" if r.get(k) is None else fmt.format(r[k]) for _, k, fmt in cols]
        if exact:
            cells.append("/".join("y" if r.get(f"{k}_exact") else ("n" if f"{k}_exact" in r else "-") for k in exact))
        out.append("| " + " | ".join(cells) + " |")
    return out


def tables(doc: dict) -> str:
    rows, bn = doc["logits_topk"], [("B", "B"), ("N", "N")]
    out = [f"device: {doc['device']}; copy {doc['copy_GBps']:.0f} GB/s (read+write); torch {doc['torch']}; "
           f"one-element kernel (graph, flushed) {doc.get('floor_us')}; missing upstream: "
           f"{doc['upstream_missing'] or 'none'}"]  # fmt: skip
    out += _table("Paged MQA logits: ours (bf16 keys, 256 B/token) vs DeepGEMM fp8_paged_mqa_logits (132 B/token)",
                  rows, bn, LOGITS_COLS)  # fmt: skip
    out += _table("SGLang's top-512 over our fp32 logits (v1: its sm_120 choice; v2: its Hopper default)", rows, bn,
                  TOPK_COLS, ("v1", "v2"))  # fmt: skip
    out += _table("Indexer step (logits + top-512, one graph)", rows, bn, STEP_COLS)
    names = sorted({k[4:].rsplit("_us_", 1)[0] for r in rows for k in r if k.startswith("var_") and "_us_" in k})
    if names:
        var_rows = [{**r, **{f"cell_{v}": f"{r.get(f'var_{v}_us_write', float('nan')):.1f} / "
                                          f"{r.get(f'var_{v}_us_read', float('nan')):.1f}" for v in names},
                     "cell_default": f"{r['ours_logits_us_write']:.1f} / {r['ours_logits_us_read']:.1f}"}
                    for r in rows]  # fmt: skip
        out += _table("Logits variants (us, write / read flush)", var_rows,
                      bn + [("default", "cell_default")] + [(v, f"cell_{v}") for v in names], [])  # fmt: skip
    mixed = doc.get("mixed", [])
    vnames = sorted({k[4:-3] for r in mixed for k in r if k.startswith("var_") and k.endswith("_us")})
    out += _table("Rows shorter than max_seq_len (read flush; % copy of the live bytes)", mixed,
                  [("rows", "what"), ("B", "B"), ("max_seq_len", "max_len"), ("mean seq_len", "mean_len")],
                  [("ours us", "ours_us", US), ("ours % copy", "ours_pct", PCT), ("DeepGEMM us", "dg_us", US),
                   ("ours / DG", "ratio", RATIO), ("ours err", "ours_err", ERR), ("DG err", "dg_err", ERR)]
                  + [(f"{v} us", f"var_{v}_us", US) for v in vnames])  # fmt: skip
    out += _table("Index-K store (RMSNorm + RoPE + Hadamard + store), per call", doc["store"],
                  [("mode", "mode"), ("tokens", "tokens")], STORE_COLS)  # fmt: skip
    return "\n".join(out) + "\n"


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--upstream", type=Path, help="directory of the modules built by upstream/build_upstream.py")
    p.add_argument("--out", type=Path, default=REPO / "build" / "bench")
    p.add_argument("--batch", type=int, nargs="+", default=[1, 4, 16, 64])
    p.add_argument("--n", type=int, nargs="+", default=[4096, 16384, 65536, 131072])
    p.add_argument("--store-tokens", type=int, nargs="+", default=[1, 4, 16, 64, 512, 2048, 8192])
    p.add_argument("--ops", nargs="+", default=["logits", "pipeline", "mixed", "store", "torch"])
    p.add_argument("--logits-variants", nargs="*", default=[], choices=sorted(VARIANT_CHOICES))
    a = p.parse_args(argv)
    LOGITS_VARIANTS.update({k: VARIANT_CHOICES[k] for k in a.logits_variants})
    a.out.mkdir(parents=True, exist_ok=True)
    timer = Timer()
    copy_gbs = copy_bandwidth(timer)
    up = Upstream(a.upstream)
    dummy = torch.empty(1, device="cuda")
    floor = {f: timer.graph(lambda: dummy.fill_(1.0), flush=f) for f in ("write", "read")}
    props = torch.cuda.get_device_properties(0)
    doc = {"device": f"{props.name}, {props.multi_processor_count} SMs", "torch": torch.__version__,
           "copy_GBps": copy_gbs, "floor_us": floor, "upstream_missing": up.missing, "logits_topk": [],
           "mixed": [], "store": [], "errors": []}  # fmt: skip
    print(f"# {doc['device']}; copy {copy_gbs:.0f} GB/s; one-element fill kernel {floor}; upstream missing: "
          f"{up.missing}", flush=True)  # fmt: skip
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)

    def record(table: str, case: str, bench, *args) -> None:
        """bench(timer, up, copy_gbs, *args, gen): its row into doc[table] and printed; a failure into doc["errors"]
        (named `case`), and the run goes on."""
        try:
            r = bench(timer, up, copy_gbs, *args, gen)
            doc[table].append(r)
            print(json.dumps(r), flush=True)
        except Exception:
            doc["errors"].append(f"{case}: {traceback.format_exc()[-1500:]}")
            print(doc["errors"][-1], flush=True)

    if "logits" in a.ops:
        for bsz in a.batch:
            for n in a.n:
                record("logits_topk", f"B={bsz} N={n}", bench_logits_topk, bsz, n, a.ops)
                torch.cuda.empty_cache()
    if "mixed" in a.ops:
        for what, bsz, max_len, lens in MIXED_CASES:
            record("mixed", f"mixed {what} B={bsz}", bench_mixed, what, bsz, max_len, lens)
            torch.cuda.empty_cache()
    if "store" in a.ops:
        for decode in (True, False):
            for t in a.store_tokens:
                record("store", f"store T={t} decode={decode}", bench_store, t, decode)
    (a.out / "vs_upstream.json").write_text(json.dumps(doc, indent=1))
    md = tables(doc)
    (a.out / "vs_upstream.md").write_text(md)
    print(md, flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
