"""Environment switches that pdstack's SGLang patch series (kernels/patches) and SGLang 0.5.23 read inside the
serving image.

Defined once here, beside errors.py, because code of two groups uses them: the planner (controller/) sets them in
the servers' environment and the sim test engine (testing/sim) honours the same names. The patch series carries
BF16_INDEX_K_ENV as text; tests/test_patches.py checks it is exactly this one.
"""

# bf16 DSA index keys (256 B/token) instead of upstream's fp8 + scale (132 B/token): the recall fix. Patch 0004's
# reader (bf16_paged_mqa_logits, pdstack_kernels) is taken before any of SGLang's when the pool holds bf16 keys.
BF16_INDEX_K_ENV = "PDSTACK_DSV4_BF16_INDEX_K"

# The two switches that pick SGLang 0.5.23's fp8 index-key reader (the paged MQA logits kernel). For DeepSeek V4 on
# sm_120, handle_model_specific_adjustments (srt/arg_groups/model_hook.py) sets BOTH to true when they are unset;
# Indexer.forward_c4_indexer (srt/layers/attention/dsv4/indexer.py) then tries, in order: fp4 (DeepGEMM), aiter fp4,
# TileLang (SGLANG_OPT_USE_TILELANG_INDEXER: tilelang_fp8_paged_mqa_logits), aiter, torch
# (SGLANG_FP8_PAGED_MQA_LOGITS_TORCH: fp8_paged_mqa_logits_torch_sm120 on sm_120), else DeepGEMM. So setting only
# the torch switch, as pdstack once did, still ran TileLang: the torch reader needs the TileLang switch at 0.
# SM120_INDEXER_ENV also keeps DeepGEMM's indexer metadata off (srt/layers/attention/dsv4/metadata.py).
SM120_INDEXER_ENV = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"
TILELANG_INDEXER_ENV = "SGLANG_OPT_USE_TILELANG_INDEXER"

# pdstack_model.index_k_dtype -> every switch that decides the index-key layout and its reader, and the reader.
# (On other archs than sm_120 the planner leaves the SGLang switches of bf16 unset, as upstream does.)
INDEX_K_CHOICES = {
    "bf16": ({BF16_INDEX_K_ENV: "1", SM120_INDEXER_ENV: "1", TILELANG_INDEXER_ENV: "1"},
             "bf16 keys, 256 B/token; reader: pdstack's bf16_paged_mqa_logits (patch 0004, before TileLang)"),
    "fp8-torch": ({BF16_INDEX_K_ENV: "0", SM120_INDEXER_ENV: "1", TILELANG_INDEXER_ENV: "0"},
                  "fp8 keys + fp32 scale, 132 B/token; reader: SGLang's torch fp8_paged_mqa_logits_torch(_sm120)"),
    "fp8-tilelang": ({BF16_INDEX_K_ENV: "0", SM120_INDEXER_ENV: "1", TILELANG_INDEXER_ENV: "1"},
                     "fp8 keys + fp32 scale, 132 B/token; reader: SGLang's TileLang tilelang_fp8_paged_mqa_logits "
                     "(upstream's default on sm_120; recall collapsed past ~2K tokens in the field)"),
}


def index_k_env(dtype: str, gpu_arch: str) -> dict[str, str]:
    """Every switch that decides the index-key layout and its reader (switches.INDEX_K_CHOICES), set explicitly so
    that SGLang's own defaults (model_hook.py sets the sm_120 pair when unset) decide nothing. Off sm_120, bf16 sets
    only pdstack's switch and fp8-tilelang leaves the torch switch (and DeepGEMM's metadata) to upstream."""
    env = dict(INDEX_K_CHOICES[dtype][0])
    if gpu_arch != "sm_120" and dtype == "bf16":
        env = {BF16_INDEX_K_ENV: "1"}
    elif gpu_arch != "sm_120" and dtype == "fp8-tilelang":
        env.pop(SM120_INDEXER_ENV)
    return env


def index_reader(dtype: str) -> str:
    """What reads the index keys with this choice, for the plan and `pdstack status`."""
    return INDEX_K_CHOICES[dtype][1]


# pdstack_pd's settings -> the SGLang 0.5.23 environment variables that carry them (the planner sets them, the checks
# refuse an env entry that would set them a second way).
PD_ENV = {
    "bootstrap_timeout_s": "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
    "waiting_timeout_s": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "heartbeat_interval_s": "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL",
    "heartbeat_max_failure": "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE",
    "health_check_timeout_s": "SGLANG_HEALTH_CHECK_TIMEOUT",
}
