"""Settings of one TEST ENGINE process (what `pdstack sim` flags resolve into)."""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import StrEnum

from pdstack.testing.sim.speed import Speed
from pdstack.testing.sim.vocab import TOKENIZER_DIR


class Role(StrEnum):
    PREFILL = "prefill"
    DECODE = "decode"
    MONO = "mono"

    @property
    def engine_type(self) -> str:
        """The `engine_type` label SGLang puts on its metrics (DisaggregationMode.to_engine_type)."""
        return {"prefill": "prefill", "decode": "decode", "mono": "unified"}[self.value]

    @property
    def disaggregation_mode(self) -> str:
        return {"prefill": "prefill", "decode": "decode", "mono": "null"}[self.value]


@dataclass
class SimConfig:
    role: Role = Role.MONO
    host: str = "127.0.0.1"
    port: int = 30000
    bootstrap_port: int = 8998  # prefill only: where decode sims hand over (SGLang's --disaggregation-bootstrap-port)
    model_path: str | None = None  # what the launcher asked for; reported, never loaded
    served_model_name: str | None = None
    tokenizer_dir: str = str(TOKENIZER_DIR)  # reported as model_path/tokenizer_path so the router loads it locally
    context_length: int = 131072
    max_queued_requests: int | None = None  # enforced only in mono mode, as SGLang does
    max_running_requests: int = 64
    max_total_tokens: int = 1_000_000
    enable_metrics: bool = False
    enable_hierarchical_cache: bool = False
    hicache_ratio: float | None = None
    # The fake "model"
    recall_horizon: int = 2048  # tokens; 0 = unlimited
    # Timing model
    prefill_tokens_per_s: float = 8000.0
    decode_tokens_per_s: float = 64.0
    decode_batch_penalty: float = 0.02  # each extra running request slows every decode step by this fraction
    kv_transfer_gb_per_s: float = 20.0
    # what the SGLang flags a tuning candidate changes do to the speeds above (speed.py); the default: nothing
    speed: Speed = field(default_factory=Speed)
    kv_bytes_per_token: int = 70_000  # rough DeepSeek-V4 KV+indexer bytes per token, for the transfer time
    # PD handshake
    # prefill waits this long for decode's handshake, decode for prefill's KV (SGLang's SGLANG_DISAGGREGATION_
    # BOOTSTRAP_TIMEOUT / _WAITING_TIMEOUT, both 300 s)
    bootstrap_timeout_s: float = 300.0
    startup_delay_s: float = 0.0  # /health answers 503 this long after start, as SGLang does while loading
    # The launcher's full argv, reported in /server_info like SGLang's launch_command
    launch_argv: list[str] = field(default_factory=list)
    # Every SGLang flag value we accepted (modelled or ignored), reported in /server_info
    server_args: dict = field(default_factory=dict)

    @property
    def model_name(self) -> str:
        return self.served_model_name or self.model_path or "pdstack-sim"
