"""The sim's recall horizon follows the same switch as the real engine's fix (bf16 index keys)."""

from pdstack.testing.sim import cli


def test_default_horizon_follows_the_bf16_index_key_switch(monkeypatch):
    monkeypatch.delenv(cli.BF16_INDEX_K_ENV, raising=False)
    assert cli.default_recall_horizon() == 2048  # upstream fp8 keys: the field's collapse
    monkeypatch.setenv(cli.BF16_INDEX_K_ENV, "1")
    assert cli.default_recall_horizon() == 0  # unlimited
    monkeypatch.setenv(cli.BF16_INDEX_K_ENV, "0")
    assert cli.default_recall_horizon() == 2048
