"""The sim's recall horizon follows the switches that pick the real engine's index-key reader (pdstack/switches.py):
bf16 keys recall without limit, fp8 keys with TileLang collapse past 2048, fp8 keys with the torch reader as a test
selects (unknown on a real card)."""

import pytest

from pdstack.errors import PdstackError
from pdstack.switches import BF16_INDEX_K_ENV, TILELANG_INDEXER_ENV, index_k_env
from pdstack.testing.sim import cli


def test_default_horizon_follows_the_bf16_index_key_switch(monkeypatch):
    monkeypatch.delenv(BF16_INDEX_K_ENV, raising=False)
    monkeypatch.delenv(TILELANG_INDEXER_ENV, raising=False)
    assert cli.default_recall_horizon() == 2048  # upstream fp8 keys: the field's collapse
    monkeypatch.setenv(BF16_INDEX_K_ENV, "1")
    assert cli.default_recall_horizon() == 0  # unlimited
    monkeypatch.setenv(BF16_INDEX_K_ENV, "0")
    assert cli.default_recall_horizon() == 2048


@pytest.mark.parametrize("arch", ["sm_120", "sm_100"])
def test_each_index_k_choice_renders_the_reader_the_sim_models(arch):
    assert cli.default_recall_horizon(index_k_env("bf16", arch)) == 0
    assert cli.default_recall_horizon(index_k_env("fp8-tilelang", arch)) == 2048
    torch = index_k_env("fp8-torch", arch)
    assert cli.default_recall_horizon(torch) == 2048  # unknown: the collapse unless a test selects otherwise
    assert cli.default_recall_horizon({**torch, cli.FP8_TORCH_HORIZON_ENV: "0"}) == 0
    assert cli.default_recall_horizon({**torch, cli.FP8_TORCH_HORIZON_ENV: "9000"}) == 9000
    with pytest.raises(PdstackError, match=cli.FP8_TORCH_HORIZON_ENV):
        cli.default_recall_horizon({**torch, cli.FP8_TORCH_HORIZON_ENV: "lots"})
