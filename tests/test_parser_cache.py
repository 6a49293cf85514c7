"""The cached SGLang parser (pdstack/controller/load/parser_cache.py) is the live one: every action's attributes,
what it makes of the production plan's argv and of flags of every custom type, the errors it gives; built from the
cache without torch; and the cache is rebuilt when its key changes, rewritten when damaged, skipped when unwritable.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from pdstack.controller import pipeline
from pdstack.controller.load import cache_trust, flags, inventory, parser_cache
from pdstack.controller.load.facts import load_facts
from pdstack.controller.load.parser_refs import Uncacheable

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "topologies" / "reference-2node-8gpu.json"
ATTRS = ("option_strings", "dest", "nargs", "const", "default", "choices", "required", "help", "metavar")


@pytest.fixture(scope="module")
def live() -> argparse.ArgumentParser:
    return flags.live_sglang_parser()  # SGLang's own add_cli_args (imports torch: ~5 s, once for the module)


def _uncached_sglang_parser(cache: Path, monkeypatch: pytest.MonkeyPatch) -> argparse.ArgumentParser:
    monkeypatch.setenv(parser_cache.CACHE_DIR_ENV, str(cache))
    return flags.sglang_parser.__wrapped__()  # flags.sglang_parser without its functools.cache


def _counting(mp: pytest.MonkeyPatch) -> list[int]:
    """Counts the live builds flags.sglang_parser makes."""
    count: list[int] = []
    real = flags.live_sglang_parser

    def counted():
        count.append(1)
        return real()
    mp.setattr(flags, "live_sglang_parser", counted)
    return count


@pytest.fixture
def builds(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    return _counting(monkeypatch)


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory, live) -> Path:
    """A cache dir that flags.sglang_parser wrote its spec to."""
    d = tmp_path_factory.mktemp("cache")
    with pytest.MonkeyPatch.context() as mp:
        builds = _counting(mp)
        _uncached_sglang_parser(d, mp)
        assert len(builds) == 1 and len(list(d.glob("sglang-parser-*.json"))) == 1
    return d


@pytest.fixture(scope="module")
def cached(cache: Path) -> argparse.ArgumentParser:
    """flags.sglang_parser from the cache."""
    with pytest.MonkeyPatch.context() as mp:
        builds = _counting(mp)
        p = _uncached_sglang_parser(cache, mp)
        assert builds == [], "it must come from the cache"
    return p


def _name(v) -> str | None:
    return None if v is None else v.__name__


def _parse(parser: argparse.ArgumentParser, argv: list[str]):
    try:
        ns = vars(parser.parse_args(argv))
    except flags.Rejected as e:
        return "rejected", str(e)
    return ns, {k: type(v).__name__ for k, v in ns.items()}


def test_every_action_is_the_live_parsers(live, cached):
    assert len(cached._actions) == len(live._actions) == 531
    for a, b in zip(live._actions, cached._actions, strict=True):
        assert type(b).__name__ == type(a).__name__, a.option_strings
        for attr in ATTRS:
            assert getattr(b, attr) == getattr(a, attr), (a.option_strings, attr)
            assert type(getattr(b, attr)) is type(getattr(a, attr)), (a.option_strings, attr)
        assert _name(b.type) == _name(a.type), a.option_strings
        assert getattr(b.type, "__module__", None) == getattr(a.type, "__module__", None)
        assert b.type is a.type or a.type.__module__.startswith("sglang."), a.option_strings  # str, int, json.loads
        assert flags.takes_json(b) == flags.takes_json(a) and flags.takes_many(b) == flags.takes_many(a)
    assert cached.prog == live.prog == "sglang.launch_server"
    assert (cached.allow_abbrev, cached.add_help) == (False, False) and isinstance(cached, flags._StrictParser)
    assert sorted(cached._option_string_actions) == sorted(live._option_string_actions)
    assert flags.sglang_options() == {o for a in cached._actions for o in a.option_strings}
    assert parser_cache.signature(cached) == parser_cache.signature(live)
    assert _help(cached) == _help(live)
    suppressed = [a for a in live._actions if a.help is argparse.SUPPRESS]
    assert suppressed and all(b.help is argparse.SUPPRESS for b in cached._actions if b.dest in
                              {a.dest for a in suppressed})


def _help(p: argparse.ArgumentParser) -> str:
    """--help's text, a set of choices in sorted order (a set's own order is its hashes', random per process)."""
    text = p.format_help()
    for a in p._actions:
        if isinstance(a.choices, set):
            text = text.replace("{" + ",".join(a.choices) + "}", "{" + ",".join(sorted(a.choices)) + "}")
    return text


def test_the_production_plans_argv_reads_the_same(live, cached):
    dep = inventory.load(ROOT / "inventory" / "production")
    plan = pipeline.make_plan(dep, load_facts(REF, list(dep.hosts)))
    assert len(plan.servers) == 2
    for s in plan.servers:
        got = _parse(cached, s.flags)
        assert got[0] != "rejected" and got == _parse(live, s.flags), s.name
        assert got[0]["context_length"] == 131072  # human_readable_int, compiled from its source


CUSTOM = [
    ["--context-length", "128k", "--max-total-tokens", "2Mi", "--max-prefill-tokens", "25.6k"],  # human_readable_int
    ["--max-total-tokens", "1.5Ki"],  # its own error
    ["--context-length", "lots"],
    ["--quantization-param-path", "None"], ["--quantization-param-path", "/q"],  # nullable_str
    ["--sidecar-args", '["a", 1]'], ["--sidecar-args", "[not json"],  # json_list_type (lazy: needs orjson)
    ["--preferred-sampling-params", '{"temperature": 0.5}'], ["--preferred-sampling-params", "{"],  # json.loads
    ["--cuda-graph-backend-decode", "breakable", "--cuda-graph-backend-prefill", "disabled"],
    ["--cuda-graph-backend-decode", "tc_piecewise"], ["--cuda-graph-backend-decode", "nope"],
    ["--cuda-graph-config", '{"decode": {"max_bs": 64}}'], ["--cuda-graph-config", "[1]"],
    ["--cuda-graph-config", '{"decode": {"nope": 1}}'],
    ["--disable-cuda-graph", "--enable-dp-attention"], ["--monokernel-backend", "amd"], ["--monokernel-backend", "x"],
    ["--enable-tf32-matmul"], ["--no-enable-tf32-matmul"],
    ["--tool-call-parser", "deepseekv4", "--reasoning-parser", "deepseek-v4"], ["--tool-call-parser", "nope"],
    ["--tp", "4"], ["--tp-size", "x"], ["--no-such-flag"], ["--mem-fraction-static", "0.8", "--port", "1"],
]


@pytest.mark.parametrize("argv", CUSTOM, ids=lambda a: " ".join(a)[:60])
def test_flags_of_custom_types_and_actions_read_the_same(live, cached, argv):
    full = ["--model-path", "/x", *argv]
    assert _parse(cached, full) == _parse(live, full)


def test_lora_paths_and_the_required_model_path_read_the_same(live, cached):
    lora = next(a.option_strings[0] for a in live._actions if type(a).__name__ == "LoRAPathAction")
    argv = ["--model-path", "/x", lora, "/a", "n=/b", '{"lora_name": "c", "lora_path": "/c"}']
    assert _parse(cached, argv) == _parse(live, argv) and _parse(cached, argv)[0] != "rejected"
    assert _parse(cached, []) == _parse(live, []) == ("rejected", "the following arguments are required: "
                                                      "--model-path/--model")


def test_a_warm_cache_builds_the_parser_without_torch(cache: Path):
    """A new process gets the parser from the cache: nothing of torch, nor SGLang's server_args, is imported,
    also when the production argv's --context-length is parsed (its type compiled from SGLang's source)."""
    code = ("import sys; from pdstack.controller.load import flags; p = flags.sglang_parser(); "
            "ns = p.parse_args(['--model-path', '/x', '--context-length', '128k', '--cuda-graph-backend-decode', "
            "'full', '--disable-cuda-graph', '--quantization-param-path', 'None']); "
            "print(ns.context_length, ns.cuda_graph_backend_decode, ns.disable_cuda_graph, ns.quantization_param_path,"
            " 'torch' in sys.modules, 'sglang.srt.server_args' in sys.modules, len(p._actions))")
    env = {**os.environ, parser_cache.CACHE_DIR_ENV: str(cache), "PYTHONPATH": str(ROOT)}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert r.returncode == 0, r.stderr
    assert r.stdout.split() == ["128000", "full", "True", "None", "False", "False", "531"]


def test_a_changed_key_rebuilds(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, live, builds):
    _uncached_sglang_parser(tmp_path, monkeypatch)
    _uncached_sglang_parser(tmp_path, monkeypatch)
    assert len(builds) == 1
    real = parser_cache.dist_fingerprint
    monkeypatch.setattr(parser_cache, "dist_fingerprint", lambda d: {**real(d), "record_sha256": "0" * 64})
    p = _uncached_sglang_parser(tmp_path, monkeypatch)  # another SGLang install: another file
    assert len(builds) == 2 and len(list(tmp_path.glob("sglang-parser-*.json"))) == 2
    assert parser_cache.signature(p) == parser_cache.signature(live)
    _uncached_sglang_parser(tmp_path, monkeypatch)
    assert len(builds) == 2
    monkeypatch.setenv("SGLANG_KV_CANARY_ENABLE_TOKEN_ORACLE", "1")  # SGLang adds a --sampling-backend choice
    p = _uncached_sglang_parser(tmp_path, monkeypatch)
    assert len(builds) == 3 and "token_oracle" in flags.action_for(p, "--sampling-backend").choices


@pytest.mark.parametrize("damage", ["truncated", "not json", "other key", "broken action", "unknown ref"])
def test_a_damaged_cache_file_is_ignored_and_rewritten(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, live,
                                                       builds, damage):
    _uncached_sglang_parser(tmp_path, monkeypatch)
    (path,) = tmp_path.glob("sglang-parser-*.json")
    good = path.read_text()
    spec = json.loads(good)
    if damage == "truncated":
        path.write_text(good[: len(good) // 2])
    elif damage == "not json":
        path.write_bytes(b"\x00\xff")
    elif damage == "other key":
        path.write_text(json.dumps({**spec, "key": {**spec["key"], "version": "0.0.1"}}))
    elif damage == "broken action":
        spec["actions"][3]["class"] = {"t": "ref", "i": 10_000}
        path.write_text(json.dumps(spec))
    else:
        spec["refs"][0] = {**spec["refs"][0], "how": "guess"}
        path.write_text(json.dumps(spec))
    p = _uncached_sglang_parser(tmp_path, monkeypatch)
    assert len(builds) == 2 and parser_cache.signature(p) == parser_cache.signature(live)
    assert json.loads(path.read_text()) == json.loads(good)  # written again
    _uncached_sglang_parser(tmp_path, monkeypatch)
    assert len(builds) == 2


def test_an_unwritable_cache_dir_still_gives_the_parser(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, live,
                                                        builds):
    (tmp_path / "file").write_text("")  # a directory under a file cannot be made, also by root
    for _ in range(2):
        p = _uncached_sglang_parser(tmp_path / "file" / "cache", monkeypatch)
        assert parser_cache.signature(p) == parser_cache.signature(live)
    assert len(builds) == 2 and sorted(tmp_path.iterdir()) == [tmp_path / "file"]


def test_outside_a_checkout_there_is_no_default_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    monkeypatch.delenv(parser_cache.CACHE_DIR_ENV, raising=False)
    assert parser_cache.cache_dir() == ROOT / "build" / "cache"
    monkeypatch.setattr(parser_cache, "ROOT", tmp_path)  # e.g. pdstack installed in site-packages
    assert parser_cache.cache_dir() is None
    monkeypatch.setenv(parser_cache.CACHE_DIR_ENV, str(tmp_path / "c"))
    assert parser_cache.cache_dir() == tmp_path / "c"


# --- the stand-ins, on a parser of our own: an action class and a type from a module that is not stdlib-only ---

CALLS: list[str] = []


def shout(value: str) -> str:  # a type that reads this module's globals: no source copy, a lazy stand-in
    CALLS.append("shout")
    return value.upper()


class Remember(argparse.Action):
    def __init__(self, option_strings, dest, label=None, **kwargs):
        self.label = label
        super().__init__(option_strings, dest, **kwargs)

    def __call__(self, parser, namespace, values, option_string=None):
        CALLS.append("remember")
        setattr(namespace, self.dest, [self.label, values])


@pytest.fixture
def own_module_trusted(monkeypatch: pytest.MonkeyPatch) -> None:
    """This module stands in for an upstream package: the cache may name its objects (cache_trust)."""
    monkeypatch.setattr(cache_trust, "UPSTREAM_PACKAGES", (*cache_trust.UPSTREAM_PACKAGES, __name__.split(".")[0]))


def _own_parser() -> argparse.ArgumentParser:
    p = flags._StrictParser(prog="own", allow_abbrev=False, add_help=False)
    p.add_argument("--word", type=shout, default=None, help="h")
    p.add_argument("--keep", action=Remember, label="L", nargs="+", choices=["a", "b"], help="k")
    p.add_argument("--sure", action=argparse.BooleanOptionalAction, default=True, help="on or off")
    return p


def test_stand_ins_import_nothing_until_a_flag_of_theirs_is_parsed(own_module_trusted, tmp_path: Path):
    live = _own_parser()
    spec = json.loads(json.dumps(parser_cache.describe(live)))
    hows = {(r["qualname"], r["how"]) for r in spec["refs"]}
    assert {("shout", "lazy"), ("Remember", "lazy"), ("BooleanOptionalAction", "import")} <= hows
    CALLS.clear()
    p = parser_cache.rebuild(spec, lambda: flags._StrictParser(prog="own", allow_abbrev=False, add_help=False))
    assert parser_cache.signature(p) == parser_cache.signature(live)
    word, keep = flags.action_for(p, "--word"), flags.action_for(p, "--keep")
    assert (word.type.__name__, word.type.__qualname__, word.type.__module__) == ("shout", "shout", __name__)
    assert word.type is not shout and type(keep) is not Remember and type(keep).__name__ == "Remember"
    assert (keep.dest, keep.label, keep.nargs, keep.choices, keep.help) == ("keep", "L", "+", ["a", "b"], "k")
    assert vars(p.parse_args([])) == vars(live.parse_args([])) and CALLS == []
    assert vars(p.parse_args(["--word", "x", "--keep", "a", "b", "--no-sure"])) == {
        "word": "X", "keep": ["L", ["a", "b"]], "sure": False}
    assert CALLS == ["shout", "remember"] and type(keep) is Remember  # the real class from its first call on
    with pytest.raises(flags.Rejected, match="invalid choice: 'c'"):
        p.parse_args(["--keep", "c"])


def test_a_value_json_cannot_carry_is_not_cached(own_module_trusted, tmp_path: Path):
    p = _own_parser()
    p.add_argument("--path", type=Path, default=Path("/x"))
    with pytest.raises(Uncacheable):
        parser_cache.describe(p)
    k = {"format": parser_cache.FORMAT}
    assert not parser_cache.save(tmp_path / "x.json", k, p, lambda: flags._StrictParser(prog="own"))
    assert not (tmp_path / "x.json").exists()
    q = _own_parser()
    q.set_defaults(extra=1)  # a parser setting the spec does not hold: the rebuilt parser would differ
    assert not parser_cache.save(tmp_path / "x.json", k, q, lambda: flags._StrictParser(prog="own"))
    assert parser_cache.save(tmp_path / "x.json", k, _own_parser(),
                             lambda: flags._StrictParser(prog="own", allow_abbrev=False, add_help=False))
    assert parser_cache.load(tmp_path / "x.json", k, lambda: flags._StrictParser(prog="own")) is not None
    assert parser_cache.load(tmp_path / "x.json", {"format": 0}, lambda: flags._StrictParser(prog="own")) is None


def test_only_the_newest_spec_files_of_a_parser_are_kept(own_module_trusted, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch):
    monkeypatch.setattr(parser_cache, "KEEP", 2)
    fresh = lambda: flags._StrictParser(prog="own", allow_abbrev=False, add_help=False)  # noqa: E731
    (tmp_path / "other-parser-x.json").write_text("{}")
    for i in range(4):
        assert parser_cache.save(tmp_path / f"own-parser-{i}.json", {"i": i}, _own_parser(), fresh)
        os.utime(tmp_path / f"own-parser-{i}.json", (1000 + i, 1000 + i))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["other-parser-x.json", "own-parser-2.json",
                                                          "own-parser-3.json"]


def test_a_doctored_cache_runs_no_code_and_the_live_parser_is_used(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    """The cache is data: a spec file of the right key (PDSTACK_CACHE_DIR points anywhere) that names os.system as a
    flag's type, carries a function source that is not the installed upstream's, or an import that is not the
    standard library's, is not read: the live parser is built and nothing of the file runs."""
    monkeypatch.setenv("PDSTACK_CACHE_DIR", str(tmp_path))
    flags.sglang_parser.cache_clear()
    real = flags.sglang_parser()  # writes the spec for this key into tmp_path
    [spec_file] = list(tmp_path.glob("sglang-parser-*.json"))
    good = json.loads(spec_file.read_text())
    marker = tmp_path / "ran"
    source_refs = [i for i, r in enumerate(good["refs"]) if r["how"] == "source"]
    assert source_refs, "the pinned parser has upstream functions compiled from source"
    i = source_refs[0]
    doctored = {
        "os.system": {"module": "os", "qualname": "system", "kind": "callable", "how": "import"},
        "edited source": {**good["refs"][i], "source": good["refs"][i]["source"].replace(
            "\n", f"\n    open({str(marker)!r}, 'w').write('x')\n", 1)},
        "foreign file": {**good["refs"][i], "filename": str(tmp_path / "evil.py")},
        "non-stdlib import": {**good["refs"][i], "imports": ["import pdstack.cli"]},
    }
    (tmp_path / "evil.py").write_text(good["refs"][i]["source"])
    for what, ref in doctored.items():
        with pytest.raises(cache_trust.UntrustedRef):
            cache_trust.check_ref(ref)
        spec = json.loads(json.dumps(good))
        spec["refs"][i] = ref
        spec_file.write_text(json.dumps(spec))
        assert parser_cache.load(spec_file, good["key"], lambda: flags._StrictParser(prog="x")) is None, what
    assert not marker.exists()
    for r in good["refs"]:
        cache_trust.check_ref(r)  # what the pinned parsers write passes
    spec_file.write_text(json.dumps(good))
    flags.sglang_parser.cache_clear()
    assert parser_cache.signature(flags.sglang_parser()) == parser_cache.signature(real)
