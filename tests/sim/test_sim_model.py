"""The TEST ENGINE's deterministic model, tokenizer files and fault-state validation (no processes)."""

from __future__ import annotations

import json

import jinja2
import pytest

from pdstack.testing.sim import model, vocab
from pdstack.testing.sim.faults import FaultError, Faults

NEEDLE = "The secret code for Alice is 4821."
QUESTION = "What is the secret code for Alice?"


def haystack(n_words: int) -> str:
    return " ".join(model.FILLER_WORDS[i % len(model.FILLER_WORDS)] for i in range(n_words))


def prompt_with_distance(distance: int) -> str:
    """A prompt whose needle starts exactly `distance` tokens before the prompt's end."""
    head = haystack(50) + " "
    tail_fixed = model.count_tokens(NEEDLE + " " + QUESTION)
    pad = distance - tail_fixed
    assert pad >= 0
    p = head + NEEDLE + " " + (haystack(pad) + " " if pad else "") + QUESTION
    ans = model.answer(p, 0)
    assert ans.needle_distance == distance
    return p


@pytest.mark.parametrize("horizon", [20, 57, 300])
def test_needle_answered_exactly_up_to_the_horizon(horizon):
    at = model.answer(prompt_with_distance(horizon), horizon)
    beyond = model.answer(prompt_with_distance(horizon + 1), horizon)
    assert at.kind == "needle_hit" and at.text == "The secret code for Alice is 4821."
    assert beyond.kind == "needle_miss"
    assert beyond.text != at.text
    assert beyond.text.startswith("The secret code for Alice is ") and beyond.text.endswith(".")
    wrong = beyond.text.removeprefix("The secret code for Alice is ").removesuffix(".")
    assert len(wrong) == 4 and wrong.isdigit()  # same shape, different code


def test_horizon_zero_is_unlimited_and_answers_are_deterministic():
    p = prompt_with_distance(5000)
    assert model.answer(p, 0).kind == "needle_hit"
    assert model.answer(p, 4999) == model.answer(p, 4999)


@pytest.mark.parametrize("code", ["0", "a", "Z9z", "AAAA", "x-1", "0000000000000000000000000000000000000000"])
def test_wrong_code_differs_and_keeps_shape(code):
    w = model.wrong_code("k", code)
    assert w != code and len(w) == len(code)
    assert [c.isdigit() for c in w] == [c.isdigit() for c in code]


def test_latest_matching_needle_and_last_question_win():
    p = ("The secret code for Bob is 111. The secret code for Alice is 222. The secret code for Bob is 333. "
         "What is the secret code for Alice? What is the secret code for Bob?")
    assert model.answer(p, 0).text == "The secret code for Bob is 333."
    assert model.answer("What is the secret code for Carol?", 0).kind == "no_needle"


def test_filler_is_deterministic_and_respects_max_tokens():
    ans = model.answer("hello there", 100)
    a, why = model.output_pieces("hello there", ans, 25)
    b, _ = model.output_pieces("hello there", ans, 25)
    c, _ = model.output_pieces("another prompt", model.answer("another prompt", 100), 25)
    assert a == b and len(a) == 25 and why == "length" and a != c
    short, why = model.output_pieces("p", model.answer(NEEDLE + " " + QUESTION, 0), 3)
    assert why == "length" and "".join(short) == "The secret code"
    full, why = model.output_pieces("p", model.answer(NEEDLE + " " + QUESTION, 0), 100)
    assert why == "stop" and "".join(full) == NEEDLE
    padded, why = model.output_pieces("p", model.answer(NEEDLE + " " + QUESTION, 0), 30, ignore_eos=True)
    assert why == "length" and len(padded) == 30 and "".join(padded).startswith(NEEDLE)


def test_chat_rendering_matches_the_shipped_chat_template():
    msgs = [{"role": "system", "content": "be brief"}, {"role": "user", "content": QUESTION}]
    cfg = json.loads((vocab.TOKENIZER_DIR / "tokenizer_config.json").read_text())
    rendered = jinja2.Template(cfg["chat_template"]).render(messages=msgs, add_generation_prompt=True)
    assert model.render_chat(msgs) == rendered


def test_shipped_tokenizer_files_are_what_vocab_generates():
    for name, text in vocab.rendered_files().items():
        assert (vocab.TOKENIZER_DIR / name).read_text(encoding="utf-8") == text, f"regenerate {name}"
    tj = json.loads((vocab.TOKENIZER_DIR / "tokenizer.json").read_text())
    v = tj["model"]["vocab"]
    assert len(set(v.values())) == len(v) and sorted(v.values()) == list(range(len(v)))
    assert all(w in v for w in ("secret", "code", "what", "?", "."))


def test_faults_validate_before_changing_anything():
    f = Faults()
    f.update({"wedge_decode": True, "slow_prefill_s": 2})
    assert f.wedge_decode and f.slow_prefill_s == 2.0 and not f._unwedged.is_set()
    with pytest.raises(FaultError):
        f.update({"fail_transfer": True, "bogus": 1})
    with pytest.raises(FaultError):
        f.update({"reject_status": 42})
    assert not f.fail_transfer
    f.update({"wedge_decode": None})
    assert not f.wedge_decode and f._unwedged.is_set()
