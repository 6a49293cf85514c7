"""bf16 DSA indexer-key kernels for DeepSeek-V4 on SGLang 0.5.23 (index-K store, paged MQA logits)."""

from ._checks import KernelArgError
from .logits import paged_mqa_logits_bf16
from .store import index_k_store_bf16, load_library

__all__ = [
    "KernelArgError",
    "index_k_store_bf16",
    "load_library",
    "paged_mqa_logits_bf16",
]
