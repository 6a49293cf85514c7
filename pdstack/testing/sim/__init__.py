"""pdstack sim: a TEST ENGINE that stands in for SGLang 0.5.23 in tests and the local demo. Never for production.

It speaks enough of SGLang's HTTP API (generate, OpenAI completions/chat, health, server/model info, Prometheus
metrics with SGLang's metric names) for the real sglang-router 0.3.2 to route through a simulated prefill + decode
pair, with a real bootstrap handshake between them over TCP. Its "model" is deterministic: it answers needle
questions from the prompt within a recall horizon and emits filler otherwise (see model.py and README.md).

Modules: config (settings), model (tokens, needle, filler), metrics (Prometheus), faults (injected faults),
bootstrap (prefill-side handshake/KV server and decode-side client), engine (queues, timing, PD flow),
server (aiohttp HTTP API), cli (`pdstack sim`).
"""

TEST_ENGINE_LABEL = "pdstack-sim TEST ENGINE (not SGLang; never for production)"
SIM_VERSION = "0.1.0"
# The SGLang release whose HTTP API and metric names this simulator imitates.
SGLANG_COMPAT_VERSION = "0.5.23"
