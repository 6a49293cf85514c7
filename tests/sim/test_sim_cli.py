"""`pdstack sim` flags: SGLang names, role derivation, rejection of unknown flags (no processes)."""

from __future__ import annotations

import argparse

import pytest

from pdstack.cli import build_parser
from pdstack.errors import PdstackError
from pdstack.testing.sim import cli as sim_cli


def parse(*argv: str) -> argparse.Namespace:
    full = ["sim", *argv]
    return build_parser(full).parse_args(full)


@pytest.mark.parametrize(("mode", "role"), [("null", "mono"), ("prefill", "prefill"), ("decode", "decode")])
def test_role_derives_from_disaggregation_mode(mode, role):
    cfg, _, _ = sim_cli.build_config(parse("--disaggregation-mode", mode), [])
    assert cfg.role.value == role


def test_contradicting_role_is_an_error():
    with pytest.raises(PdstackError, match="contradicts"):
        sim_cli.build_config(parse("--disaggregation-mode", "prefill", "--role", "decode"), [])


def test_unknown_and_abbreviated_flags_are_rejected(capsys):
    for bad in (["--no-such-flag"], ["--tp", "4"], ["--disaggregation-transfer-backend", "tcp"]):
        with pytest.raises(SystemExit) as e:
            parse(*bad)
        assert e.value.code == 2


def test_reference_decode_argv_parses_and_lands_in_server_args():
    argv = ["--model-path", "nvidia/DeepSeek-V4-Flash-NVFP4", "--served-model-name", "dsv4", "--tp-size", "4",
            "--host", "127.0.0.1", "--port", "30001", "--disaggregation-mode", "decode",
            "--disaggregation-transfer-backend", "mooncake", "--disaggregation-ib-device", "mlx5_0",
            "--enable-metrics", "--context-length", "65536", "--max-queued-requests", "8",
            "--enable-hierarchical-cache", "--hicache-ratio", "1.5", "--hicache-write-policy", "write_through",
            "--mem-fraction-static", "0.85", "--trust-remote-code", "--kv-cache-dtype", "fp8_e4m3",
            "--cuda-graph-max-bs-decode", "64", "--watchdog-timeout", "600"]
    cfg, faults, crash = sim_cli.build_config(parse(*argv), argv)
    assert cfg.role.value == "decode" and cfg.model_name == "dsv4" and cfg.context_length == 65536
    assert cfg.enable_metrics and cfg.enable_hierarchical_cache and cfg.hicache_ratio == 1.5
    assert cfg.server_args["tp_size"] == 4 and cfg.server_args["disaggregation_ib_device"] == "mlx5_0"
    assert not faults.wedge_decode and crash is None


def test_bootstrap_port_alias():
    cfg, _, _ = sim_cli.build_config(parse("--disaggregation-mode", "prefill", "--bootstrap-port", "9123"), [])
    assert cfg.bootstrap_port == 9123


def test_help_says_test_engine(capsys):
    with pytest.raises(SystemExit):
        parse("--help")
    assert "TEST ENGINE" in capsys.readouterr().out


def test_sglang_flags_match_installed_sglang():
    """Every SGLang-named flag the sim accepts exists in sglang 0.5.23's parser with the same choices."""
    server_args = pytest.importorskip("sglang.srt.server_args")
    sg = argparse.ArgumentParser()
    server_args.ServerArgs.add_cli_args(sg)
    sg_opts = {o: a for a in sg._actions for o in a.option_strings}
    ours = argparse.ArgumentParser()
    sim_cli.register(ours)
    checked = 0
    for group in ours._action_groups:
        if not group.title or not group.title.startswith("SGLang"):
            continue
        for action in group._group_actions:
            for opt in action.option_strings:
                assert opt in sg_opts, f"{opt} is not an sglang 0.5.23 flag"
                theirs = sg_opts[opt]
                assert set(theirs.option_strings) >= set(action.option_strings)
                if action.choices is not None:
                    assert list(action.choices) == list(theirs.choices), opt
                assert (action.nargs == 0) == (theirs.nargs == 0), opt
                checked += 1
    assert checked > 40
