"""The stale_kv fault's page rule, without a stack: which request gets an aborted request's freed pages."""

from __future__ import annotations

from pdstack.testing.sim import model
from pdstack.testing.sim.config import SimConfig
from pdstack.testing.sim.engine import PAGE_TOKENS, Engine
from pdstack.testing.sim.faults import Faults
from pdstack.testing.sim.metrics import SimMetrics


def _engine() -> Engine:
    return Engine(SimConfig(), SimMetrics(SimConfig()), Faults(stale_kv=True))


def _prompt(word: str, pages: float) -> str:
    return " ".join([word] * int(pages * PAGE_TOKENS)) + " What is the code?"


def test_a_one_page_prompt_leaves_the_stale_pages_to_the_next_long_prompt():
    # the churn gate's admission holders ("Tell a long story ...") fit one partial page: they must not use up the
    # aborted victim's pages before the fixed prompt comes (CI failure of test_smoke_agent under load)
    e = _engine()
    e._freed_pending.append(_prompt("victim", 8))
    assert e._stale_overlay("Tell a long story 1a2b.") is None
    assert len(e._freed_pending) == 1
    own = _prompt("needle", 3)
    got = e._stale_overlay(own)
    assert got is not None and not e._freed_pending
    n = len(model.pieces(own))
    k = (n - 1) // PAGE_TOKENS * PAGE_TOKENS
    assert model.pieces(got)[:k] == model.pieces(_prompt("victim", 8))[:k]
    assert model.pieces(got)[k:] == model.pieces(own)[k:]  # the last page, with the question, is its own


def test_the_fault_off_or_no_aborted_request_changes_nothing():
    e = _engine()
    assert e._stale_overlay(_prompt("needle", 3)) is None
    e.faults.stale_kv = False
    e._freed_pending.append(_prompt("victim", 8))
    assert e._stale_overlay(_prompt("needle", 3)) is None and len(e._freed_pending) == 1
