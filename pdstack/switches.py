"""Environment switches that pdstack's SGLang patch series (kernels/patches) reads inside the serving image.

Defined once here, beside errors.py, because code of two groups uses them: the planner (controller/) sets them in
the servers' environment and the sim test engine (testing/sim) honours the same name. The patch series carries the
name as text; tests/test_patches.py checks it is exactly this one.
"""

# bf16 DSA index keys (256 B/token) instead of upstream's fp8 + scale (132 B/token): the recall fix.
BF16_INDEX_K_ENV = "PDSTACK_DSV4_BF16_INDEX_K"

# DeepGEMM's paged MQA logits has no sm_120 build: SGLang 0.5.23 takes its torch path (which our patch series
# routes to pdstack_kernels for bf16 keys) only with this set (dsv4/indexer.py, dsv4/metadata.py).
SM120_INDEXER_ENV = "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"
# pdstack_pd's settings -> the SGLang 0.5.23 environment variables that carry them (the planner sets them, the checks
# refuse an env entry that would set them a second way).
PD_ENV = {
    "bootstrap_timeout_s": "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT",
    "waiting_timeout_s": "SGLANG_DISAGGREGATION_WAITING_TIMEOUT",
    "heartbeat_interval_s": "SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL",
    "heartbeat_max_failure": "SGLANG_DISAGGREGATION_HEARTBEAT_MAX_FAILURE",
    "health_check_timeout_s": "SGLANG_HEALTH_CHECK_TIMEOUT",
}
