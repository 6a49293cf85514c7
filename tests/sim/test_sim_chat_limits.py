"""Chat's token limits as SGLang 0.5.23 sets them, on a mono sim with a small context: without max_tokens the answer
may run up to the context (not 128), and what cannot fit gets SGLang's 400s."""

from __future__ import annotations

import json

import pytest
from sim_helpers import FAST, post

from pdstack.testing.sim import model
from pdstack.testing.sim.launch import SimProcess

pytestmark = pytest.mark.slow

CONTEXT = 400


@pytest.fixture(scope="module")
def mono(tmp_path_factory):
    sim = SimProcess("mono", tmp_path_factory.mktemp("limits"), [*FAST, "--context-length", str(CONTEXT)])
    try:
        sim.start()
        yield sim
    finally:
        sim.stop()


def _chat(sim, content: str, **kw) -> tuple[int, dict]:
    status, raw = post(sim.url + "/v1/chat/completions", {"model": "m", "messages": [
        {"role": "user", "content": content}], **kw})
    return status, json.loads(raw)


def test_without_max_tokens_a_filler_answer_runs_to_the_context(mono):
    content = "Tell me a story."
    status, out = _chat(mono, content)
    assert status == 200, out
    n_prompt = model.count_tokens(model.render_chat([{"role": "user", "content": content}]))
    # Scheduler.init_req_max_new_tokens: (min(context, total) - 1) - input - 1
    assert out["usage"]["prompt_tokens"] == n_prompt
    assert out["usage"]["completion_tokens"] == CONTEXT - 1 - n_prompt - 1 > 128
    assert out["choices"][0]["finish_reason"] == "length"


def test_what_cannot_fit_gets_sglangs_400s(mono):
    status, out = _chat(mono, "hi", max_tokens=CONTEXT + 1)
    assert status == 400 and out["message"] == (f"max_completion_tokens is too large: {CONTEXT + 1}.This model "
                                                f"supports at most {CONTEXT} completion tokens."), out
    status, out = _chat(mono, "hi", max_tokens=CONTEXT - 2)
    assert status == 400 and "Requested token count exceeds the model's maximum context length" in out["message"]
    status, out = _chat(mono, " ".join(["word"] * CONTEXT))
    assert status == 400 and out["message"].startswith("The input (") and f"({CONTEXT} tokens)" in out["message"]
