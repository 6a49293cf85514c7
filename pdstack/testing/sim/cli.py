"""`pdstack sim`: start one TEST ENGINE process (an SGLang stand-in for tests and the local demo; never production).

It accepts sglang.launch_server's flag names where they overlap, so a unit can render the same argv for SGLang
and for the sim; flags it does not model are accepted and ignored (reported in /server_info), unknown flags are
rejected (exit 2). The role comes from --role or from --disaggregation-mode (null -> mono).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
import os
import signal
import sys

from pdstack.errors import PdstackError
from pdstack.switches import BF16_INDEX_K_ENV, TILELANG_INDEXER_ENV  # what decides the index-key reader
from pdstack.testing.sim import TEST_ENGINE_LABEL
from pdstack.testing.sim.speed import model as speed_model

# SGLang 0.5.23 choices, copied from sglang.srt.server_args (tests/sim checks them against the installed sglang).
TRANSFER_BACKENDS = ["mooncake", "nixl", "ascend", "fake", "mori", "mooncake_tcp"]
HICACHE_WRITE_POLICIES = ["write_back", "write_through", "write_through_selective"]
HICACHE_IO_BACKENDS = ["direct", "kernel", "kernel_ascend"]
HICACHE_MEM_LAYOUTS = ["layer_first", "page_first", "page_first_direct", "page_first_kv_split", "page_head"]
KV_CACHE_DTYPES = ["auto", "fp8_e5m2", "fp8_e4m3", "mxfp8", "bf16", "bfloat16", "nvfp4", "fp4_mx_block16"]
DTYPES = ["auto", "half", "float16", "bfloat16", "float", "float32"]

# SGLang flags accepted and ignored: (option strings, argparse kwargs). They land in /server_info's fields. A few of
# them (--moe-runner-backend, --cuda-graph-max-bs-decode, --disable-cuda-graph, --kv-cache-dtype,
# --chunked-prefill-size, --mem-fraction-static, --tp-size, --speculative-algorithm) move the speed model's factors
# (speed.py), nothing else.
IGNORED_SGLANG_FLAGS: list[tuple[tuple[str, ...], dict]] = [
    (("--tokenizer-path",), {}),
    (("--tp-size", "--tensor-parallel-size"), {"type": int, "default": 1}),
    (("--dp-size", "--data-parallel-size"), {"type": int, "default": 1}),
    (("--pp-size", "--pipeline-parallel-size"), {"type": int, "default": 1}),
    (("--ep-size", "--expert-parallel-size", "--ep"), {"type": int, "default": 1}),
    (("--disaggregation-transfer-backend",), {"choices": TRANSFER_BACKENDS, "default": "mooncake"}),
    (("--disaggregation-ib-device",), {}),
    (("--hicache-size",), {"type": int, "default": 0}),
    (("--disaggregation-decode-enable-radix-cache",), {"action": "store_true"}),
    (("--hicache-write-policy",), {"choices": HICACHE_WRITE_POLICIES, "default": "write_through"}),
    (("--hicache-io-backend",), {"choices": HICACHE_IO_BACKENDS, "default": "kernel"}),
    (("--hicache-mem-layout",), {"choices": HICACHE_MEM_LAYOUTS, "default": "page_first"}),
    (("--mem-fraction-static",), {"type": float}),
    (("--trust-remote-code",), {"action": "store_true"}),
    (("--chunked-prefill-size",), {"type": int}),
    (("--max-prefill-tokens",), {"type": int, "default": 16384}),
    (("--watchdog-timeout",), {"type": float, "default": 300}),
    (("--kv-cache-dtype",), {"choices": KV_CACHE_DTYPES, "default": "auto"}),
    (("--dtype",), {"choices": DTYPES, "default": "auto"}),
    (("--quantization",), {}),
    (("--attention-backend",), {}),
    (("--moe-runner-backend",), {}),
    (("--cuda-graph-max-bs-decode",), {"type": int}),
    (("--cuda-graph-max-bs-prefill",), {"type": int}),
    (("--disable-cuda-graph",), {"action": "store_true"}),
    (("--disable-radix-cache",), {"action": "store_true"}),
    (("--page-size",), {"type": int}),
    (("--base-gpu-id",), {"type": int, "default": 0}),
    (("--numa-node",), {"type": int, "nargs": "+"}),
    (("--nnodes",), {"type": int, "default": 1}),
    (("--node-rank",), {"type": int, "default": 0}),
    (("--dist-init-addr", "--nccl-init-addr"), {}),
    (("--random-seed",), {"type": int}),
    (("--stream-interval",), {"type": int, "default": 1}),
    (("--schedule-policy",), {}),
    (("--skip-server-warmup",), {"action": "store_true"}),
    (("--enable-cache-report",), {"action": "store_true"}),
    (("--log-requests",), {"action": "store_true"}),
    (("--log-level",), {"default": "info"}),
    (("--api-key",), {}),
    (("--tool-call-parser",), {}),
    (("--reasoning-parser",), {}),
    (("--crash-dump-folder",), {}),
    (("--speculative-algorithm",), {}),
    (("--speculative-num-steps",), {"type": int}),
    (("--speculative-eagle-topk",), {"type": int}),
    (("--speculative-num-draft-tokens",), {"type": int}),
]


FP8_COLLAPSE_HORIZON = 2048  # index_topk 512 x compress ratio 4: where fp8 index keys lost recall in the field


# The fp8 keys + SGLang's torch reader (index_k_dtype fp8-torch): whether it recalls is unknown on a real card, so a
# test selects it with this variable (tokens; 0 = unlimited); unset: the collapse, so nothing unproven passes.
FP8_TORCH_HORIZON_ENV = "PDSTACK_SIM_FP8_TORCH_RECALL_HORIZON"


def default_recall_horizon(env: dict[str, str] | None = None) -> int:
    """Like the real engine, by the switches that pick the index-key reader (pdstack/switches.py INDEX_K_CHOICES):
    bf16 keys (pdstack's switch 1): unlimited; fp8 keys with SGLANG_OPT_USE_TILELANG_INDEXER=0 (the torch reader):
    FP8_TORCH_HORIZON_ENV, default the collapse; fp8 keys with TileLang (set to 1, or unset: SGLang's model hook turns
    it on for DeepSeek V4 on sm_120): the field's collapse past 2048 tokens."""
    env = os.environ if env is None else env
    if env.get(BF16_INDEX_K_ENV) == "1":
        return 0
    if env.get(TILELANG_INDEXER_ENV) == "0":
        value = env.get(FP8_TORCH_HORIZON_ENV, "")
        if value and not value.isdigit():
            raise PdstackError(f"{FP8_TORCH_HORIZON_ENV}={value!r}: give a token count (0 = unlimited)")
        return int(value) if value else FP8_COLLAPSE_HORIZON
    return FP8_COLLAPSE_HORIZON


def register(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        f"{TEST_ENGINE_LABEL}. Serves part of SGLang 0.5.23's HTTP API (generate, OpenAI completions/chat, "
        "health, server/model info, Prometheus /metrics) with a deterministic needle-retrieval model, so the real "
        "sglang-router can route through a sim prefill + decode pair. For tests and the local demo only."
    )
    parser.formatter_class = argparse.ArgumentDefaultsHelpFormatter

    sim = parser.add_argument_group("TEST ENGINE (simulator-only flags)")
    sim.add_argument("--role", choices=["prefill", "decode", "mono"],
                     help="which server to simulate; default: from --disaggregation-mode (null -> mono)")
    sim.add_argument("--bootstrap-port", type=int, dest="bootstrap_port_alias",
                     help="alias of --disaggregation-bootstrap-port")
    sim.add_argument("--recall-horizon", type=int, default=None,
                     help="tokens: a needle farther than this from the prompt's end is answered wrongly "
                          "(the fp8 index-key collapse); 0 = unlimited (bf16 keys). Default: by the environment "
                          f"the planner renders for index_k_dtype: 0 when {BF16_INDEX_K_ENV}=1 (bf16), "
                          f"${FP8_TORCH_HORIZON_ENV} (default 2048) when {TILELANG_INDEXER_ENV}=0 (fp8-torch), "
                          "else 2048 (fp8-tilelang, upstream's sm_120 default)")
    sim.add_argument("--prefill-tokens-per-s", type=float, default=8000.0, help="prefill speed (uncached tokens/s)")
    sim.add_argument("--decode-tokens-per-s", type=float, default=64.0,
                     help="decode speed of one request alone (tokens/s)")
    sim.add_argument("--decode-batch-penalty", type=float, default=0.02,
                     help="each extra decoding request slows every decode step by this fraction")
    sim.add_argument("--kv-transfer-gb-per-s", type=float, default=20.0, help="simulated KV transfer bandwidth")
    sim.add_argument("--bootstrap-timeout-s", type=float, default=300.0,
                     help="prefill waits this long for decode's handshake, decode this long for prefill's KV; "
                          "then the request is aborted (SGLang: SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT, 300)")
    sim.add_argument("--startup-delay-s", type=float, default=0.0,
                     help="/health, /health_generate and /ready answer 503 for this long after start")
    faults = parser.add_argument_group("TEST ENGINE fault injection (also at run time: GET/POST /_sim/fault)")
    faults.add_argument("--fault-wedge-decode", action="store_true",
                        help="decode never emits a token while /health stays 200")
    faults.add_argument("--fault-slow-prefill-s", type=float, default=0.0, help="extra seconds per prefill")
    faults.add_argument("--fault-fail-transfer", action="store_true", help="every KV transfer fails")
    faults.add_argument("--fault-fail-bootstrap", action="store_true", help="every bootstrap handshake fails")
    faults.add_argument("--fault-reject-status", type=int,
                        help="every generation request is answered with this HTTP status (e.g. 503)")
    faults.add_argument("--fault-crash-after-s", type=float,
                        help="the process exits with --fault-crash-exit-code this many seconds after start")
    faults.add_argument("--fault-crash-exit-code", type=int, default=1, help="exit code of a simulated crash")

    sg = parser.add_argument_group("SGLang launch_server flags the sim models")
    sg.add_argument("--model-path", "--model", help="reported as requested_model_path and default served name; "
                                                     "never loaded (the sim ships its own tokenizer)")
    sg.add_argument("--served-model-name")
    sg.add_argument("--host", default="127.0.0.1")
    sg.add_argument("--port", type=int, default=30000)
    sg.add_argument("--disaggregation-mode", choices=["null", "prefill", "decode"], default="null")
    sg.add_argument("--disaggregation-bootstrap-port", type=int, default=8998)
    sg.add_argument("--enable-metrics", action="store_true", help="serve /metrics (as SGLang: off by default)")
    sg.add_argument("--context-length", type=int, help="default 131072")
    sg.add_argument("--max-queued-requests", type=int,
                    help="mono mode only (ignored with --disaggregation-mode, as SGLang does): reject with 503")
    sg.add_argument("--max-running-requests", type=int, help="default 64")
    sg.add_argument("--max-total-tokens", type=int, help="KV pool size in tokens, default 1000000")
    sg.add_argument("--enable-hierarchical-cache", "--enable-hicache", action="store_true")
    sg.add_argument("--hicache-ratio", type=float, help="host pool = ratio x device pool (default 2.0)")

    ig = parser.add_argument_group("SGLang launch_server flags accepted and ignored")
    for opts, kwargs in IGNORED_SGLANG_FLAGS:
        ig.add_argument(*opts, **kwargs)


def resolve_role(args: argparse.Namespace) -> str:
    mode_role = {"null": "mono", "prefill": "prefill", "decode": "decode"}[args.disaggregation_mode]
    if args.role is None:
        return mode_role
    if args.disaggregation_mode != "null" and args.role != mode_role:
        raise PdstackError(f"--role {args.role} contradicts --disaggregation-mode {args.disaggregation_mode}; "
                           "give one of them, or make them agree")
    return args.role


def build_config(args: argparse.Namespace, argv: list[str] | None = None):
    """Turn parsed flags into a SimConfig, a Faults and the crash timer."""
    from pdstack.testing.sim.config import Role, SimConfig
    from pdstack.testing.sim.faults import Faults

    role = Role(resolve_role(args))
    bport = args.disaggregation_bootstrap_port
    if args.bootstrap_port_alias is not None:
        if "--disaggregation-bootstrap-port" in (argv or []) and args.bootstrap_port_alias != bport:
            raise PdstackError("--bootstrap-port and --disaggregation-bootstrap-port disagree; give one")
        bport = args.bootstrap_port_alias
    for name in ("prefill_tokens_per_s", "decode_tokens_per_s", "kv_transfer_gb_per_s"):
        if getattr(args, name) <= 0:
            raise PdstackError(f"--{name.replace('_', '-')} must be > 0")
    server_args = {k: v for k, v in vars(args).items() if not k.startswith("_") and k != "command"}
    try:
        speed = speed_model(server_args, dict(os.environ))
    except ValueError as e:
        raise PdstackError(str(e)) from e
    horizon = default_recall_horizon() if args.recall_horizon is None else args.recall_horizon
    if speed.recall_horizon is not None and (horizon <= 0 or speed.recall_horizon < horizon):
        horizon = speed.recall_horizon
    cfg = SimConfig(
        role=role, host=args.host, port=args.port, bootstrap_port=bport, model_path=args.model_path,
        served_model_name=args.served_model_name,
        context_length=args.context_length or 131072,
        max_queued_requests=args.max_queued_requests,
        max_running_requests=args.max_running_requests or 64,
        max_total_tokens=args.max_total_tokens or 1_000_000 * speed.kv_scale,
        enable_metrics=args.enable_metrics,
        enable_hierarchical_cache=args.enable_hierarchical_cache, hicache_ratio=args.hicache_ratio,
        recall_horizon=horizon, speed=speed,
        prefill_tokens_per_s=args.prefill_tokens_per_s,
        decode_tokens_per_s=args.decode_tokens_per_s, decode_batch_penalty=args.decode_batch_penalty,
        kv_transfer_gb_per_s=args.kv_transfer_gb_per_s, bootstrap_timeout_s=args.bootstrap_timeout_s,
        startup_delay_s=args.startup_delay_s, launch_argv=list(argv or sys.argv), server_args=server_args,
    )
    faults = Faults(wedge_decode=args.fault_wedge_decode, slow_prefill_s=args.fault_slow_prefill_s,
                    fail_transfer=args.fault_fail_transfer, fail_bootstrap=args.fault_fail_bootstrap,
                    reject_status=args.fault_reject_status, crash_exit_code=args.fault_crash_exit_code)
    return cfg, faults, args.fault_crash_after_s


def run(args: argparse.Namespace) -> int:
    from pdstack.testing.sim.server import serve

    cfg, faults, crash_after_s = build_config(args, sys.argv)
    level = str(args.log_level).upper()
    logging.basicConfig(level=getattr(logging, level, logging.INFO),
                        format=f"%(asctime)s [pdstack-sim TEST ENGINE {cfg.role.value}:{cfg.port}] "
                               "%(levelname)s %(message)s")
    if cfg.role.value != "mono" and cfg.max_queued_requests is not None:
        logging.getLogger("pdstack.testing.sim").warning(
            "--max-queued-requests is ignored with --disaggregation-mode %s (as in SGLang)", cfg.role.value)

    if cfg.speed.startup_error:  # the speed model's failed start (speed.py), as a real server's: logged, exit 1
        logging.getLogger("pdstack.testing.sim").error("%s", cfg.speed.startup_error)
        return 1

    async def main() -> None:
        stop = asyncio.Event()
        loop = asyncio.get_running_loop()
        for sig in (signal.SIGTERM, signal.SIGINT):
            loop.add_signal_handler(sig, stop.set)
        await serve(cfg, faults, crash_after_s, stop)

    try:
        asyncio.run(main())
    except OSError as e:  # e.g. the port is taken
        raise PdstackError(f"sim could not start on {cfg.host}:{cfg.port}: {e}") from e
    return 0
