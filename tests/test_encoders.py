"""One encoder per sink (pdstack/controller/render/encoders.py), each tried with hostile values: for every value the
encoder either refuses it (EncodeError) or the sink's reader gives the value back unchanged. The readers are the
real ones where this machine has them (argparse, shlex, haproxy, nft, json), and for a sample the real program
reads the encoded text too (haproxy serving each word back as a response body, nft -c, systemd-analyze verify)."""

from __future__ import annotations

import argparse
import ipaddress
import json
import math
import os
import random
import shlex
import shutil
import socket
import subprocess
import time
import urllib.request
from pathlib import Path

import pytest

from pdstack.controller.render import encoders as enc
from pdstack.controller.render.encoders import EncodeError
from pdstack.controller.render.readers import (
    Directive,
    haproxy_split,
    parse_docker_volume,
    parse_env_file,
    parse_haproxy,
    parse_prom_labels,
    systemd_split,
)

SEED = 20261202
N = 400
# the characters every sink has trouble with: separators, quotes, comment and expansion marks, escapes, control
# characters, a lone surrogate (not encodable), multi-byte Unicode and Unicode line separators
HOSTILE = [" ", "\t", "\n", "\r", "\x00", "\x1b", "\x7f", "'", '"', "%", "%%", "#", "$", "${HOME}", "$HOME", "\\",
           "\\n", ";", "-", "--", "--host", "=", ":", ",", "{", "}", "é", "中", "\u2028", "\U0001f600", "\ud800",
           "%n", "`", "\\x41"]
PLAIN = "abcXYZ019_./@+"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
NFT = shutil.which("nft") or "/usr/sbin/nft"


def hostile(rng: random.Random) -> str:
    """A random hostile string: mostly short mixes of plain and hostile pieces, sometimes very long, sometimes with
    leading dashes."""
    pieces = [rng.choice(HOSTILE) if rng.random() < 0.4 else rng.choice(PLAIN) * rng.randint(1, 3)
              for _ in range(rng.randint(0, 8))]
    s = "".join(pieces)
    if rng.random() < 0.1:
        s = "-" * rng.randint(1, 2) + s
    if rng.random() < 0.03:
        s = s * 2000 + "x" * 5000
    return s


def samples(n: int = N, seed: int = SEED) -> list[str]:
    rng = random.Random(seed)
    return [hostile(rng) for _ in range(n)]


def _either(encode, decode, value):
    """Refused, or read back unchanged. Returns the encoding (None when refused)."""
    try:
        e = encode(value)
    except EncodeError as err:
        assert str(err), value
        return None
    assert decode(e) == value, (value, e)
    return e


def _one(words: list[str]) -> str | list[str]:
    return words[0] if len(words) == 1 else words


def test_the_generator_hits_every_class():
    """The samples hold each class of hostile value, so each test below sees both refusals and round trips."""
    s = samples()
    for piece in ("\n", "\x00", "'", '"', "%", "#", "$", "\\", " ", "é"):
        assert any(piece in v for v in s), piece
    assert any(v.startswith("--") for v in s) and any(len(v) > 5000 for v in s) and "" in s


def test_argv_items_refused_or_read_back_by_argparse():
    """A list item of a multi-value flag goes through argparse unchanged, or is refused (a leading '-' ends the list
    and reads as a flag; NUL ends the word at execve)."""
    p = argparse.ArgumentParser(allow_abbrev=False, exit_on_error=False)
    p.add_argument("--items", nargs="+")
    p.add_argument("--one")
    refused = passed = 0
    for v in samples():
        try:
            w = enc.argv_item(v)
        except EncodeError:
            refused += 1
            assert v.startswith("-") or "\x00" in v or "\ud800" in v, v
            continue
        passed += 1
        assert p.parse_args(["--items", "a", w, "z"]).items == ["a", v, "z"]
        assert p.parse_args(["--one", enc.argv_value(v)]).one == v
    assert refused and passed
    with pytest.raises(EncodeError, match="starts with '-'"):
        enc.argv_item("--decode")
    assert enc.argv_value("-1") == "-1"  # a negative number is a value, not a flag


def test_systemd_exec_refused_or_split_back():
    """ExecStart= words: refused (control characters) or split back by systemd's rules to the same argv; for words
    without $ and % (systemd's own expansions) POSIX shlex reads the line the same way."""
    rng = random.Random(SEED + 1)
    vals = samples(seed=SEED + 1)
    passed = 0
    for _ in range(N):
        argv = ["/usr/bin/docker", *rng.sample(vals, rng.randint(1, 6))]
        line = _either(enc.systemd_exec, systemd_split, argv)
        if line is None:
            assert any(any(ord(c) < 32 or c == "\x7f" or 0xD800 <= ord(c) < 0xE000 for c in w) for w in argv)
            continue
        passed += 1
        if not any("$" in w or "%" in w for w in argv):
            assert shlex.split(line) == argv, line
    assert passed > N // 4
    assert systemd_split(enc.systemd_exec(["/bin/x", "a%b", "$HOME", ";", "it's"])) == ["/bin/x", "a%b", "$HOME",
                                                                                            ";", "it's"]
    with pytest.raises(ValueError):
        systemd_split("/bin/x $HOME")  # the host's environment would decide the word


@pytest.mark.skipif(not shutil.which("systemd-analyze"), reason="needs systemd-analyze")
def test_systemd_analyze_accepts_the_encoded_exec_lines(tmp_path: Path):
    """A sample of encoded ExecStart= lines in a unit: systemd's own parser (systemd-analyze verify) reports no
    problem with the line itself."""
    rng = random.Random(SEED + 2)
    ok = []
    for v in samples(200, SEED + 2):
        try:
            ok.append(enc.systemd_exec(["/bin/true", v]))
        except EncodeError:
            pass
    lines = rng.sample(ok, 20)
    unit = tmp_path / "pdstack-enc.service"
    unit.write_text("[Unit]\nDescription=encoder test\n[Service]\nType=oneshot\n"
                    + "".join(f"ExecStart={line}\n" for line in lines))
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    out = r.stdout + r.stderr
    bad = [x for x in out.splitlines() if f"{unit.name}:" in x or "bad unit file setting" in x]
    assert not bad, bad
    # the check can fail: a line systemd cannot read is reported with its file and line
    unit.write_text(unit.read_text() + 'ExecStart=/bin/true "unbalanced\n')
    r = subprocess.run(["systemd-analyze", "verify", str(unit)], capture_output=True, text=True, timeout=60)
    assert f"{unit.name}:{len(lines) + 5}:" in r.stdout + r.stderr


def test_env_file_lines_refused_or_parsed_back():
    """docker --env-file lines: KEY=VALUE refused (bad key, line breaks, control characters) or parsed back."""
    rng = random.Random(SEED + 3)
    passed = 0
    for v in samples(seed=SEED + 3):
        key = rng.choice(["PDSTACK_X", "A1", "_k", v[:8], "1BAD", "A B", "A=B"])
        text = _either(lambda d: enc.env_file(d), parse_env_file, {key: v})
        if text is None:
            quoted = len(v) >= 2 and v[0] == v[-1] and v[0] in "'\""
            assert not enc.ENV_KEY.fullmatch(key) or any(ord(c) < 32 and c != "\t" or c == "\x7f" for c in v) \
                or "\ud800" in v + key or quoted or len(v) > enc.ENV_LINE_MAX - len(key), (key, v)
        else:
            passed += 1
    assert passed > N // 4
    assert parse_env_file(enc.env_file({"A": "x=1 #not a comment", "B": ""})) == {"A": "x=1 #not a comment",
                                                                                     "B": ""}
    for v in ('"quoted"', "'quoted'", "x" * enc.ENV_LINE_MAX):  # docker 28 strips the quotes; a line over 64 KiB
        with pytest.raises(EncodeError):
            enc.env_line("A", v)


def test_docker_volume_and_env_refused_or_read_back():
    for v in samples(seed=SEED + 4):
        path = "/models/" + v
        try:
            words = enc.docker_volume(path, path)
        except EncodeError:
            assert ":" in v or "," in v or any(ord(c) < 32 or c == "\x7f" for c in v) or "\ud800" in v, v
        else:
            assert words[0] == "--volume" and parse_docker_volume(words[1]) == (path, path, "ro")
        try:
            e = enc.docker_env("PDSTACK_V", v)
        except EncodeError:
            assert "\x00" in v or "\ud800" in v, v
        else:
            assert e[0] == "--env" and e[1].split("=", 1) == ["PDSTACK_V", v]
    with pytest.raises(EncodeError):
        enc.docker_volume("models", "/models")  # relative


def test_json_refused_or_loaded_back():
    rng = random.Random(SEED + 5)
    vals = samples(seed=SEED + 5)
    specials = [math.nan, math.inf, -math.inf, 10**400, 1.5, -0.0, True, None]
    passed = 0
    for _ in range(N):
        v = {rng.choice(vals): [rng.choice(vals), rng.choice(specials), {"k": rng.choice(vals)}]}
        try:
            text = enc.json_text(v)
        except EncodeError:
            assert any(isinstance(x, float) and not math.isfinite(x) for x in v[next(iter(v))]), v
            continue
        except UnicodeEncodeError:  # pragma: no cover - ensure_ascii escapes surrogates; never raised
            raise
        passed += 1
        assert text.isascii() and json.loads(text) == v
    assert passed > N // 4


def test_haproxy_words_refused_or_split_back():
    passed = 0
    for v in samples(seed=SEED + 6):
        w = _either(enc.haproxy_word, lambda e: _one(haproxy_split(e)), v)
        if w is None:
            assert v == "" or any(ord(c) < 32 or c == "\x7f" for c in v) or "\ud800" in v, v
            continue
        passed += 1
        assert w == v or w[0] in "'\""  # bare only when nothing in it is special
    assert passed > N // 4


def test_haproxy_directives_read_back_equal():
    """Random directives with hostile arguments: the text parses back to exactly the same directive list, so no
    argument can add, drop or split a directive."""
    rng = random.Random(SEED + 7)
    vals = [v for v in samples(seed=SEED + 7) if v and not any(ord(c) < 32 or c == "\x7f" for c in v)
            and "\ud800" not in v]
    for _ in range(50):
        ds = [Directive(("frontend", "f"), "http-request", tuple(rng.sample(vals, rng.randint(1, 5))))
              for _ in range(rng.randint(1, 6))]
        ds += [Directive(("backend", "b"), "server", ("r", "127.0.0.1:1", *rng.sample(vals, 2)))]
        assert parse_haproxy(enc.haproxy_text(ds, ["a header"])) == ds


def test_an_injected_bind_is_refused_by_the_encoder():
    """The issue's example: a bind holding a newline (or a space) that would add `http-request allow` and serve
    requests without the API key."""
    for bind in ("0.0.0.0:8000\n    http-request allow", "10.0.0.1\nhttp-request allow", "10.0.0.1 http-request allow",
                 "10.0.0.1#", "gpu01", ""):
        with pytest.raises(EncodeError):
            enc.haproxy_address(bind, 8000)
    with pytest.raises(EncodeError, match="newline"):
        enc.haproxy_word("127.0.0.1:8000\n    http-request allow")
    assert enc.haproxy_address("::1", 8000) == "::1:8000"
    # quoted, a space cannot split a word: the directive keeps its arguments
    d = [Directive(("frontend", "f"), "bind", ("127.0.0.1:8000 http-request allow",))]
    assert parse_haproxy(enc.haproxy_text(d)) == d


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs haproxy")
def test_real_haproxy_reads_each_word_back(tmp_path: Path):
    """A sample of encoded words as `http-request return ... string WORD` bodies: haproxy -c accepts the file and
    the running HAProxy answers each path with exactly the word's bytes."""
    words = []
    for v in samples(300, SEED + 8):
        try:
            words.append((enc.haproxy_word(v), v))
        except EncodeError:
            pass
    rng = random.Random(SEED + 8)
    picked = rng.sample([w for w in words if len(w[1]) < 4000], 40)
    port = _free_port()
    ds = [Directive(("global",), "nbthread", ("1",)), Directive(("defaults",), "mode", ("http",)),
          *[Directive(("defaults",), "timeout", (k, "5s")) for k in ("connect", "client", "server")],
          Directive(("frontend", "f"), "bind", (enc.haproxy_address("127.0.0.1", port),))]
    for i, (_w, v) in enumerate(picked):
        ds.append(Directive(("frontend", "f"), "http-request", ("return", "status", "200", "content-type",
                                                              "text/plain", "string", v, "if", "{", "path", f"/{i}",
                                                              "}")))
    cfg = tmp_path / "h.cfg"
    cfg.write_text(enc.haproxy_text(ds))
    assert parse_haproxy(cfg.read_text()) == ds
    r = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    proc = subprocess.Popen([HAPROXY, "-db", "-f", str(cfg)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                socket.create_connection(("127.0.0.1", port), timeout=0.2).close()
                break
            except OSError:
                time.sleep(0.05)
        for i, (_w, v) in enumerate(picked):
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/{i}", timeout=5) as resp:
                assert resp.read() == v.encode(), (i, v)
    finally:
        proc.terminate()
        proc.wait(10)


def test_nft_values_refused_or_read_back():
    rng = random.Random(SEED + 9)
    for v in samples(seed=SEED + 9):
        for cand in (v, f"10.{rng.randint(0, 255)}.0.{rng.randint(0, 255)}", "2001:db8::" + v[:2]):
            try:
                a = enc.nft_address(cand)
            except EncodeError:
                with pytest.raises(ValueError):
                    ipaddress.ip_network(cand.strip(), strict=False)
            else:
                assert ipaddress.ip_network(a) == ipaddress.ip_network(cand.strip(), strict=False)
        try:
            c = enc.nft_comment(v)
        except EncodeError:
            assert any(ord(c) < 32 or c == "\x7f" for c in v) or "\ud800" in v
        else:
            assert c == v and "\n" not in c
    for p in (0, 65536, -1, True, "22", 1.5):
        with pytest.raises(EncodeError):
            enc.nft_port(p)
    with pytest.raises(EncodeError):
        enc.nft_ident("pdstack; flush ruleset")


@pytest.mark.skipif(not Path(NFT).exists() or os.geteuid() != 0, reason="needs nftables and root for nft -c")
def test_nft_accepts_a_sample_of_encoded_comments_and_strings(tmp_path: Path):
    """Encoded comments and strings in a script: nft -c reads it as the one table it meant (a comment cannot end
    and start a rule)."""
    ok = []
    for v in samples(200, SEED + 10):
        try:
            ok.append((enc.nft_comment(v), enc.nft_string(v[:100])))
        except EncodeError:
            pass
    rng = random.Random(SEED + 10)
    v4 = sorted({enc.nft_address(f"{rng.randint(1, 223)}.{rng.randint(0, 255)}.{rng.randint(0, 255)}."
                                 f"{rng.randint(0, 255)}/{rng.choice([8, 16, 24, 32])}") for _ in range(30)})
    lines = ["table inet pdstack_enc_test", "delete table inet pdstack_enc_test", "table inet pdstack_enc_test {",
             "    set s4 {", "        type ipv4_addr", "        flags interval", "        auto-merge",
             f"        elements = {{ {', '.join(v4)} }}", "    }"]
    for i, (c, s) in enumerate(ok[:40]):
        lines += [f"    # {c}", f"    chain c{i} {{", f"        comment {s}", "    }"]
    lines += ["}", ""]
    f = tmp_path / "t.nft"
    f.write_text("\n".join(lines))
    r = subprocess.run([NFT, "-c", "-f", str(f)], capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stderr[-2000:]


def test_prometheus_labels_refused_or_read_back():
    passed = 0
    for v in samples(seed=SEED + 11):
        try:
            text = enc.prom_labels({"server": v, "n": 1})
        except EncodeError:
            assert any((ord(c) < 32 and c != "\n") or c == "\x7f" for c in v) or "\ud800" in v, v
            continue
        passed += 1
        assert parse_prom_labels(text) == {"server": v, "n": "1"} and "\n" not in text
    assert passed > N // 4
    with pytest.raises(EncodeError):
        enc.prom_labels({"bad name": "x"})


@pytest.mark.skipif(not shutil.which("promtool"), reason="needs promtool")
def test_promtool_reads_a_sample_of_encoded_labels():
    ok = []
    for v in samples(200, SEED + 12):
        try:
            ok.append(enc.prom_labels({"server": v}))
        except EncodeError:
            pass
    text = "# HELP pdstack_enc_info A test.\n# TYPE pdstack_enc_info gauge\n" + "".join(
        f"pdstack_enc_info{labels} {i}\n" for i, labels in enumerate(dict.fromkeys(ok)))
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr
    bad = 'pdstack_enc_info{server="a"b"} 1\n'  # the check can fail: an unescaped quote
    r = subprocess.run(["promtool", "check", "metrics"], input=text + bad, capture_output=True, text=True, timeout=30)
    assert r.returncode != 0


def test_extra_args_lists_refused_or_read_back_by_the_routers_own_parser():
    """Hostile list items for a multi-value flag of sglang-router 0.3.2 (--request-id-headers, nargs '*'): the
    render refuses them, or the router's own parser reads exactly that list back and changes nothing else."""
    from pdstack.controller.load import flags

    parser = flags.router_parser()
    base = ["--pd-disaggregation", "--prefill", "http://x:1", "--decode", "http://y:1"]
    default = vars(parser.parse_args(base))
    rng = random.Random(SEED + 13)
    vals = samples(seed=SEED + 13)
    refused = passed = 0
    for _ in range(200):
        items = rng.sample(vals, rng.randint(1, 4))
        try:
            words = flags.render_extra({"request-id-headers": items}, parser)
        except flags.Unrenderable as e:
            refused += 1
            assert "extra_args.request-id-headers" in str(e)
            assert any(str(v).startswith("-") or "\x00" in v for v in items), items
            continue
        passed += 1
        got = vars(parser.parse_args([*base, *words]))
        assert got["request_id_headers"] == items
        assert {k: v for k, v in got.items() if k != "request_id_headers"} == \
            {k: v for k, v in default.items() if k != "request_id_headers"}
    assert refused and passed
