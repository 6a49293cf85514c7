"""The stale_kv fault's model: late KV writes of requests aborted on decode, and which prompts they hit.

A request aborted on decode (client gone) gives its pages back unscrubbed while its prefill still sends the KV; the
late write lands within about that prompt's prefill time. Every request that gets its KV meanwhile and has a whole
page has every whole page of its prompt but the last (which holds the question) overwritten by the newest aborted
request's; a prompt of one partial page has no whole page to hit.
"""

from __future__ import annotations

import logging
import time
from collections import deque

from pdstack.testing.sim import model

log = logging.getLogger("pdstack.testing.sim")

MIN_LATE_S = 1.0  # a late write lands at least this long after the abort


class LateWrites:
    def __init__(self, page_tokens: int, maxlen: int = 64):
        self.page_tokens = page_tokens
        self.pending: deque[tuple[str, float]] = deque(maxlen=maxlen)  # (prompt, lands by), oldest first

    def aborted(self, prompt: str, prefill_s: float) -> None:
        """A request with `prompt` was aborted on decode; its prefill would take `prefill_s` seconds."""
        self.pending.append((prompt, time.monotonic() + max(MIN_LATE_S, prefill_s)))

    def overlay(self, prompt: str) -> str | None:
        """The prompt text the KV of `prompt` holds if a late write is on the way now; None: untouched."""
        now = time.monotonic()
        while self.pending and self.pending[0][1] < now:
            self.pending.popleft()
        if not self.pending:
            return None
        other = model.pieces(self.pending[-1][0])
        own = model.pieces(prompt)
        k = min(len(other), len(own) - 1) // self.page_tokens * self.page_tokens
        if k <= 0:
            return None
        log.warning("stale KV (sim fault stale_kv): %d of %d prompt tokens overwritten", k, len(own))
        return "".join(other[:k] + own[k:])
