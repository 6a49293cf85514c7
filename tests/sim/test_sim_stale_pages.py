"""The stale_kv fault's page rule, without a stack: which requests an aborted request's late KV write hits."""

from __future__ import annotations

import time

from pdstack.testing.sim import model
from pdstack.testing.sim.config import SimConfig
from pdstack.testing.sim.engine import PAGE_TOKENS, Engine
from pdstack.testing.sim.faults import Faults
from pdstack.testing.sim.metrics import SimMetrics


def _engine() -> Engine:
    return Engine(SimConfig(), SimMetrics(SimConfig()), Faults(stale_kv=True))


def _prompt(word: str, pages: float) -> str:
    return " ".join([word] * int(pages * PAGE_TOKENS)) + " What is the code?"


def _hit(got: str, own: str, other: str) -> bool:
    """`got` is `own` with every whole page but the last replaced by `other`'s."""
    n = len(model.pieces(own))
    k = (n - 1) // PAGE_TOKENS * PAGE_TOKENS
    return model.pieces(got)[:k] == model.pieces(other)[:k] and model.pieces(got)[k:] == model.pieces(own)[k:]


def test_every_long_prompt_in_the_write_window_is_hit_and_a_one_page_prompt_is_not():
    # the churn gate's admission holders ("Tell a long story ...") fit one partial page; victims take pages too: the
    # fixed prompt must be hit however many requests came before it (CI: test_smoke_agent missed it under load)
    e = _engine()
    victim = _prompt("victim", 8)
    e._late_writes.aborted(victim, 60)
    assert e._stale_overlay("Tell a long story 1a2b.") is None
    for word in ("other", "needle"):
        own = _prompt(word, 3)
        got = e._stale_overlay(own)
        assert got is not None and _hit(got, own, victim)


def test_after_the_write_landed_or_with_the_fault_off_nothing_changes():
    e = _engine()
    assert e._stale_overlay(_prompt("needle", 3)) is None  # no aborted request
    e._late_writes.pending.append((_prompt("victim", 8), time.monotonic() - 0.1))  # its late write already landed
    assert e._stale_overlay(_prompt("needle", 3)) is None and not e._late_writes.pending
    e._late_writes.aborted(_prompt("victim", 8), 60)
    e.faults.stale_kv = False
    assert e._stale_overlay(_prompt("needle", 3)) is None
