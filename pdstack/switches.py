"""Environment switches that pdstack's SGLang patch series (kernels/patches) reads inside the serving image.

Defined once here, beside errors.py, because code of two groups uses them: the planner (controller/) sets them in
the servers' environment and the sim test engine (testing/sim) honours the same name. The patch series carries the
name as text; tests/test_patches.py checks it is exactly this one.
"""

# bf16 DSA index keys (256 B/token) instead of upstream's fp8 + scale (132 B/token): the recall fix.
BF16_INDEX_K_ENV = "PDSTACK_DSV4_BF16_INDEX_K"
