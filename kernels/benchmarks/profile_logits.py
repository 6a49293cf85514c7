"""Run one logits kernel a few times, for Nsight Compute (kernels/BENCHMARKS.md, "profile").

    ncu --clock-control none -k regex:KERNEL -s 2 -c 1 --section SpeedOfLight ... \\
        python kernels/benchmarks/profile_logits.py --which ours|deepgemm --batch 16 --n 16384 [--upstream DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_vs_upstream import Upstream, make_case  # noqa: E402
from pdstack_kernels import paged_mqa_logits_bf16  # noqa: E402
from pdstack_kernels import reference as R  # noqa: E402


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--which", choices=["ours", "deepgemm"], default="ours")
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--n", type=int, default=16384)
    p.add_argument("--upstream", type=Path)
    p.add_argument("--reps", type=int, default=4)
    p.add_argument("--early", action="store_true", help="early_page_table=True")
    a = p.parse_args(argv)
    gen = torch.Generator(device="cuda")
    gen.manual_seed(0)
    q, kv, w, sl, pt = make_case(a.batch, a.n, gen)
    if a.which == "ours":
        for _ in range(a.reps):
            paged_mqa_logits_bf16(q, kv, w, sl, pt, a.n, early_page_table=a.early)
    else:
        up = Upstream(a.upstream)
        kv8, q8, sl2 = R.quantize_fp8_pages(kv), q.to(torch.float8_e4m3fn), sl.view(-1, 1).contiguous()
        meta = up.dg_metadata(sl2)
        out = torch.empty(a.batch, -(-a.n // 256) * 256, device="cuda")
        for _ in range(a.reps):
            up.dg_logits(q8, kv8, w, sl2, pt, meta, out)
    torch.cuda.synchronize()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
