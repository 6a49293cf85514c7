"""bf16 DSA indexer-key kernels for DeepSeek-V4 on SGLang 0.5.23 (store, paged logits, top-512 transform)."""

from ._checks import KernelArgError
from .logits import paged_mqa_logits_bf16
from .store import index_k_store_bf16, load_library
from .topk import topk_transform_512

__all__ = [
    "KernelArgError",
    "index_k_store_bf16",
    "load_library",
    "paged_mqa_logits_bf16",
    "topk_transform_512",
]
