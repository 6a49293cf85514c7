"""The TEST ENGINE's speed model: what the SGLang settings a tuning candidate changes do to the simulated server.

Deterministic, so `invoke tune` can be tested end to end (tests/test_tune.py): the tuner must pick the candidate this
model makes fastest, disqualify the one that loses recall and skip the one that fails to start. The figures are the
simulator's, chosen to order candidates the way the field notes and peers describe, not measurements of SGLang:

  decode tokens/s of one step = --decode-tokens-per-s x MoE factor x graph factor x KV factor
                                / (1 + decode_batch_penalty x (running requests - 1))
  * MoE factor (--moe-runner-backend): marlin 1.45 (SGLang's recipe for sm_120 names it), flashinfer_cutlass 1.2,
    anything else or unset 1.0;
  * graph factor: 1.3 while the running batch fits --cuda-graph-max-bs-decode (0.5.23 has no plain
    --cuda-graph-max-bs), as CUDA
    graphs replay only batch shapes they captured (one peer read 72.9 tok/s until they covered its batch); unset:
    1.0 (the reference recipe's speed); --disable-cuda-graph: 0.6;
  * KV factor: an fp8 KV cache (--kv-cache-dtype fp8_e4m3 | fp8_e5m2) 1.15, and recall collapses past
    FP8_KV_HORIZON tokens (the simulator's stand-in for a candidate that trades precision for speed);
  * prefill tokens/s x 1.2 with --chunked-prefill-size >= 8192;
  * --mem-fraction-static above OOM_MEM_FRACTION: the server exits at start (status 1) with a CUDA out-of-memory
    message, as a real one does when weights + KV pool + activations do not fit.
  * TP factor (--tp-size): the per-request decode rate of one server x TP_DECODE_FACTORS (1: 1.0, 2: 1.6, 4: 2.2,
    8: 2.6: tensor parallelism over PCIe scales sub-linearly), and its KV pool (max_total_tokens, unless given) x the
    TP size (each GPU adds its memory). The aggregate of several servers is the engine's own: each decode server
    runs its own batch, so two TP1 decodes behind the router carry twice one's load at one's per-request speed;
  * speculative decoding (--speculative-algorithm set): decode x SPEC_FACTOR (about 1.8 accepted tokens a step);
  * answers: the TEST ENGINE fault variable WRONG_ANSWERS_ENV (a fraction 0..1, env of the server) makes that share of
    the quiz questions (model.py: `Compute <expression>.`) come out wrong, deterministically by question; it is how
    a test gives one candidate recall intact and accuracy lost (a quantised indexer or a speculative-decoding bug).
With none of these flags (every inventory of the repo), every factor is 1.0: the modelled speed is the flags'.
One start check of SGLang 0.5.23's is modelled beside them: a decode server with --enable-hierarchical-cache and
without --disaggregation-decode-enable-radix-cache exits at start, as 0.5.23 refuses it (its decode radix cache is
off without that flag, srt/arg_groups/pd_disaggregation_hook.py, and HiCache needs one, kv_cache_hook.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

MOE_FACTORS = {"marlin": 1.45, "flashinfer_cutlass": 1.2}
GRAPH_FACTOR = 1.3
EAGER_FACTOR = 0.6
FP8_KV_FACTOR = 1.15
FP8_KV_DTYPES = ("fp8_e4m3", "fp8_e5m2")
FP8_KV_HORIZON = 2048
CHUNKED_PREFILL_MIN = 8192
CHUNKED_PREFILL_FACTOR = 1.2
OOM_MEM_FRACTION = 0.92
TP_DECODE_FACTORS = {1: 1.0, 2: 1.6, 4: 2.2, 8: 2.6}
SPEC_FACTOR = 1.8
WRONG_ANSWERS_ENV = "PDSTACK_SIM_WRONG_ANSWERS"


@dataclass(frozen=True)
class Speed:
    decode_factor: float = 1.0  # on every decode step
    graph_max_bs: int | None = None  # steps of at most this many running requests also get graph_factor
    graph_factor: float = 1.0
    prefill_factor: float = 1.0
    recall_horizon: int | None = None  # a collapse this model adds (None: the engine's own horizon)
    startup_error: str | None = None  # the server does not start: this is why
    kv_scale: int = 1  # the KV pool's size x this (the TP size: every GPU adds its memory)
    wrong_answers: float = 0.0  # this share of quiz answers comes out wrong (WRONG_ANSWERS_ENV)

    def decode_tps(self, base: float, running: int) -> float:
        """Tokens/s of one decode step with `running` requests in it, before the batch penalty."""
        fits = self.graph_max_bs is not None and running <= self.graph_max_bs
        return base * self.decode_factor * (self.graph_factor if fits else 1.0)


def wrong_answers(env: dict[str, str]) -> float:
    """WRONG_ANSWERS_ENV as a fraction; a bad value is an error naming the variable."""
    value = env.get(WRONG_ANSWERS_ENV, "") or "0"
    try:
        share = float(value)
    except ValueError:
        share = -1.0
    if not 0.0 <= share <= 1.0:
        raise ValueError(f"{WRONG_ANSWERS_ENV}={value!r}: give a fraction from 0 to 1 (the share of wrong answers)")
    return share


def model(args: dict[str, Any], env: dict[str, str] | None = None) -> Speed:
    """The speed of a server started with these parsed flags (`pdstack sim`'s vars(args)) and environment."""
    tp = int(args.get("tp_size") or 1)
    decode = MOE_FACTORS.get(str(args.get("moe_runner_backend") or ""), 1.0)
    decode *= TP_DECODE_FACTORS.get(tp, TP_DECODE_FACTORS[max(k for k in TP_DECODE_FACTORS if k <= tp)])
    if args.get("speculative_algorithm"):
        decode *= SPEC_FACTOR
    graph_bs = args.get("cuda_graph_max_bs_decode")
    graph = GRAPH_FACTOR if graph_bs else 1.0
    if args.get("disable_cuda_graph"):
        decode, graph_bs, graph = decode * EAGER_FACTOR, None, 1.0
    horizon = None
    if args.get("kv_cache_dtype") in FP8_KV_DTYPES:
        decode *= FP8_KV_FACTOR
        horizon = FP8_KV_HORIZON
    chunk = args.get("chunked_prefill_size")
    prefill = CHUNKED_PREFILL_FACTOR if isinstance(chunk, int) and chunk >= CHUNKED_PREFILL_MIN else 1.0
    error = None
    mem = args.get("mem_fraction_static")
    if isinstance(mem, int | float) and mem > OOM_MEM_FRACTION:
        error = (f"torch.OutOfMemoryError: CUDA out of memory (TEST ENGINE speed model: --mem-fraction-static "
                 f"{mem:g} > {OOM_MEM_FRACTION:g} leaves no room for activations)")
    if (args.get("disaggregation_mode") == "decode" and args.get("enable_hierarchical_cache")
            and not args.get("disaggregation_decode_enable_radix_cache")):
        error = ("ValueError: The arguments enable-hierarchical-cache and disable-radix-cache are mutually exclusive "
                 "(SGLang 0.5.23: a decode server's radix cache is off without "
                 "--disaggregation-decode-enable-radix-cache)")
    return Speed(decode_factor=decode, graph_max_bs=int(graph_bs) if graph_bs else None, graph_factor=graph,
                 prefill_factor=prefill, recall_horizon=horizon, startup_error=error, kv_scale=max(1, tp),
                 wrong_answers=wrong_answers(env or {}))
