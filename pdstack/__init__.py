"""pdstack: stand up DeepSeek-V4 on SGLang prefill/decode (PD) on Blackwell workstation GPUs, and keep it healthy."""

__version__ = "0.1.0"
