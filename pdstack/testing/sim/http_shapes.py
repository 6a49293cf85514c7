"""Shapes and defaults the sim's HTTP handlers share (SGLang 0.5.23's, as server.py's docstring cites)."""

from __future__ import annotations

DEFAULT_MAX_NEW_TOKENS = 128  # /generate without max_new_tokens (SamplingParams); chat: Engine.default_max_new_tokens
DEFAULT_COMPLETION_MAX_TOKENS = 16  # /v1/completions without max_tokens, as OpenAI's and SGLang's default
SHUTDOWN_GRACE_S = 0.5
SSE_HEADERS = {"Content-Type": "text/event-stream", "Cache-Control": "no-cache"}


class BadRequest(Exception):
    pass


def error_body(status: int, message: str, err_type: str | None = None) -> dict:
    return {"object": "error", "message": message, "type": err_type or str(status), "param": None, "code": status}
