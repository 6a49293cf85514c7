"""pdstack/hostside/model_fetch.py against a real nginx: fetch, verify, resume, the failures' exit codes, the token.

The fetcher runs as a host runs it, the host-side artifact's `model-fetch` under `/usr/bin/python3 -I` (isolated:
nothing but the stdlib to import), in a subprocess.
One nginx for the module (Debian's, `apt-get install nginx`; the project's installer provides it) on a free port
serves a small model (a config, two tokenizer files, a nested file, two shards of 2 and 3 MiB) at these locations:

  /          the mirror
  /slow/     the mirror at 200 KB/s per connection (limit_rate): a fetch can be killed half-way through a shard
  /norange/  the mirror ignoring Range (max_ranges 0): a resume gets 200 and starts over
  /auth/     the mirror behind `Authorization: Bearer s3cret-token` (401 without it)
  /hop/      the token checked, then 302 to http://localhost:PORT/plain/... (another host to the client)
  /plain/    the mirror, 400 when any Authorization header arrives (so /hop/ passes only if the token was dropped)

nginx logs `$request_uri $status "$http_range"` a line, so a test can see the 206 of a resume.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import signal
import socket
import stat
import subprocess
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest
import site_helpers

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = site_helpers.hostside_artifact()  # the host-side artifact; its `model-fetch` is the fetcher
PYTHON = "/usr/bin/python3"  # the host's interpreter; -I keeps the venv and PYTHON* out
NGINX = "/usr/sbin/nginx"
TOKEN = "s3cret-token"
STAGING, RECORD = ".pdstack-staging", ".pdstack-verified.json"
SHARD1, SHARD2 = "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"
SUMMARY_KEYS = {"ok", "changed", "check", "fetched", "repaired", "verified", "hashed_bytes", "bytes_fetched",
                "bytes_resumed", "bytes_restarted", "missing_bytes", "seconds", "extra"}


def _model() -> dict[str, bytes]:
    rnd = random.Random(20261203)  # the same bytes every run
    return {
        "config.json": json.dumps({"architectures": ["TinyForCausalLM"], "hidden_size": 64}, indent=1).encode(),
        "tokenizer.json": json.dumps({"model": {"vocab": {f"tok{i}": i for i in range(4000)}}}).encode(),
        "tokenizer_config.json": b'{"model_max_length": 4096}\n',
        "extra/vocab/merges.txt": b"#version: 0.2\nt o\nto k\n",
        SHARD1: rnd.randbytes(2 << 20),
        SHARD2: rnd.randbytes(3 << 20),
    }


FILES = _model()
TOTAL = sum(len(b) for b in FILES.values())


@dataclass
class Mirror:
    www: Path
    url: str  # http://127.0.0.1:PORT
    port: int
    access_log: Path
    lock: dict

    def log_lines(self) -> list[str]:
        return self.access_log.read_text().splitlines()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _conf(base: Path, www: Path, port: int) -> str:
    temp = "".join(f"  {k}_temp_path {base}/tmp/{k};\n" for k in ("client_body", "proxy", "fastcgi", "uwsgi", "scgi"))
    auth = f'if ($http_authorization != "Bearer {TOKEN}") {{ return 401; }}'
    return (f"master_process off;\npid {base}/nginx.pid;\nerror_log {base}/error.log warn;\n"
            "events { worker_connections 64; }\n"
            "http {\n"
            "  log_format pdstack '$request_uri $status \"$http_range\"';\n"
            f"  access_log {base}/access.log pdstack;\n  default_type application/octet-stream;\n{temp}"
            f"  server {{\n    listen 127.0.0.1:{port};\n    root {www};\n"
            f"    location /slow/ {{ alias {www}/; limit_rate 200k; }}\n"
            f"    location /norange/ {{ alias {www}/; max_ranges 0; }}\n"
            f"    location /auth/ {{ alias {www}/; {auth} }}\n"
            f"    location /hop/ {{ {auth} rewrite ^/hop/(.*)$ http://localhost:{port}/plain/$1 redirect; }}\n"
            f'    location /plain/ {{ alias {www}/; if ($http_authorization != "") {{ return 400; }} }}\n'
            "  }\n}\n")


@pytest.fixture(scope="module")
def mirror(tmp_path_factory):
    if not os.access(NGINX, os.X_OK):
        pytest.fail(f"{NGINX} is missing: apt-get install nginx (the project's installer provides it)")
    base = tmp_path_factory.mktemp("nginx")
    www = base / "www"
    for path, data in FILES.items():
        (www / path).parent.mkdir(parents=True, exist_ok=True)
        (www / path).write_bytes(data)
    (www / ".hidden").write_text("not part of the model\n")  # `lock` leaves hidden files out
    (base / "tmp").mkdir()
    port = _free_port()
    (base / "nginx.conf").write_text(_conf(base, www, port))
    with open(base / "stderr", "wb") as err:
        proc = subprocess.Popen([NGINX, "-p", str(base), "-e", str(base / "error.log"), "-c", str(base / "nginx.conf"),
                                 "-g", "daemon off;"], stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 10
        while True:
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            if proc.poll() is not None or time.monotonic() > deadline:
                log = (base / "error.log").read_text() if (base / "error.log").exists() else ""
                pytest.fail(f"nginx did not listen on {port}: {(base / 'stderr').read_text()} {log}")
            time.sleep(0.05)
        files = [{"path": p, "size": len(b), "sha256": hashlib.sha256(b).hexdigest()} for p, b in sorted(FILES.items())]
        yield Mirror(www, f"http://127.0.0.1:{port}", port, base / "access.log", {"model": "tiny", "files": files})
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


@dataclass
class Result:
    rc: int
    summary: dict
    stdout: str
    stderr: str


class Fetch:
    """Runs `model_fetch.py fetch` into tmp_path/model, the lock written next to it."""

    def __init__(self, tmp_path: Path, mirror: Mirror):
        self.tmp, self.mirror, self.dest, self.n = tmp_path, mirror, tmp_path / "model", 0

    def cmd(self, *args: str, lock: dict | None = None, base: str | None = None, source: str = "http") -> list[str]:
        self.n += 1
        lock_file = self.tmp / f"lock-{self.n}.json"
        lock_file.write_text(json.dumps(lock or self.mirror.lock))
        origin = base if base is not None else self.mirror.url if source == "http" else str(self.mirror.www)
        return [PYTHON, "-I", str(SCRIPT), "model-fetch", "fetch", "--lock", str(lock_file), "--dest",
                str(self.dest),
                "--source", source, "--from", origin, *args]

    def __call__(self, *args: str, env: dict | None = None, **kw) -> Result:
        r = subprocess.run(self.cmd(*args, **kw), capture_output=True, text=True, timeout=60,
                           env={**os.environ, **(env or {})})
        lines = r.stdout.splitlines()
        assert len(lines) == 1, f"stdout is not one JSON line:\n{r.stdout}\nstderr:\n{r.stderr}"
        summary = json.loads(lines[0])
        assert SUMMARY_KEYS <= set(summary), summary
        assert summary["ok"] == (r.returncode == 0) and ("error" in summary) == (r.returncode != 0), summary
        return Result(r.returncode, summary, r.stdout, r.stderr)

    def sha(self, path: str) -> str:
        return hashlib.sha256((self.dest / path).read_bytes()).hexdigest()

    def record(self) -> dict:
        return json.loads((self.dest / RECORD).read_text())


@pytest.fixture
def fetch(tmp_path, mirror) -> Fetch:
    return Fetch(tmp_path, mirror)


def _digest(path: str) -> str:
    return hashlib.sha256(FILES[path]).hexdigest()


def _tree(root: Path) -> dict[str, tuple[int, int, int]]:
    """Every path under root (hidden too) with its mode, size and mtime: what "changes nothing" compares."""
    if not root.exists():
        return {}
    return {str(p.relative_to(root)): (p.lstat().st_mode, p.lstat().st_size, p.lstat().st_mtime_ns)
            for p in sorted(root.rglob("*"))}


def test_fresh_fetch_places_every_file_read_only_and_a_second_run_changes_nothing(fetch, mirror):
    first = fetch()
    s = first.summary
    assert first.rc == 0, first.stderr
    assert s["changed"] is True and s["check"] is False
    assert s["fetched"] == sorted(FILES) and s["repaired"] == [] and s["verified"] == 0
    assert s["bytes_fetched"] == s["missing_bytes"] == TOTAL
    assert s["hashed_bytes"] == 0  # hashed on the way in, never read back
    for path in FILES:
        assert fetch.sha(path) == _digest(path), path
        assert stat.S_IMODE((fetch.dest / path).stat().st_mode) == 0o444, path
    assert not (fetch.dest / STAGING).exists()
    record = fetch.record()
    assert set(record["files"]) == set(FILES)
    assert record["lock_sha256"] == hashlib.sha256((fetch.tmp / "lock-1.json").read_bytes()).hexdigest()

    (fetch.dest / "notes.txt").write_text("an operator's file, not in the lock\n")
    record_mtime = (fetch.dest / RECORD).stat().st_mtime_ns
    before = _tree(fetch.dest)
    second = fetch()
    s = second.summary
    assert second.rc == 0, second.stderr
    assert s["changed"] is False and s["fetched"] == [] and s["repaired"] == []
    assert s["hashed_bytes"] == 0 and s["bytes_fetched"] == 0 and s["verified"] == len(FILES)
    assert s["extra"] == ["notes.txt"]  # listed, left alone
    assert (fetch.dest / RECORD).stat().st_mtime_ns == record_mtime
    assert _tree(fetch.dest) == before


def test_full_verify_repairs_a_flipped_byte_that_quick_verify_cannot_see(fetch):
    assert fetch().rc == 0
    shard = fetch.dest / SHARD1
    st = shard.stat()
    shard.chmod(0o644)
    with open(shard, "r+b") as f:
        f.seek(1 << 20)
        byte = f.read(1)
        f.seek(1 << 20)
        f.write(bytes([byte[0] ^ 0xFF]))
    os.utime(shard, ns=(st.st_atime_ns, st.st_mtime_ns))  # same size, same mtime: the record still matches
    assert shard.stat().st_size == st.st_size and shard.stat().st_mtime_ns == st.st_mtime_ns

    # quick trusts size + mtime_ns against the record and reads nothing: this is why --verify full exists
    quick = fetch()
    assert quick.rc == 0, quick.stderr
    assert quick.summary["repaired"] == [] and quick.summary["hashed_bytes"] == 0
    assert fetch.sha(SHARD1) != _digest(SHARD1)

    full = fetch("--verify", "full")
    s = full.summary
    assert full.rc == 0, full.stderr
    assert s["repaired"] == [SHARD1] and s["fetched"] == [] and s["changed"] is True
    assert s["hashed_bytes"] == TOTAL and s["bytes_fetched"] == len(FILES[SHARD1])
    assert fetch.sha(SHARD1) == _digest(SHARD1)
    assert stat.S_IMODE(shard.stat().st_mode) == 0o444


def test_quick_verify_fetches_a_truncated_file_and_a_missing_one_again(fetch):
    assert fetch().rc == 0
    tok = fetch.dest / "tokenizer.json"
    tok.chmod(0o644)
    os.truncate(tok, len(FILES["tokenizer.json"]) // 2)
    (fetch.dest / "extra/vocab/merges.txt").unlink()
    r = fetch()
    s = r.summary
    assert r.rc == 0, r.stderr
    assert s["repaired"] == ["tokenizer.json"] and s["fetched"] == ["extra/vocab/merges.txt"]
    assert s["bytes_fetched"] == len(FILES["tokenizer.json"]) + len(FILES["extra/vocab/merges.txt"])
    assert s["hashed_bytes"] == 0  # the wrong size says enough; the other files match their record
    for path in ("tokenizer.json", "extra/vocab/merges.txt"):
        assert fetch.sha(path) == _digest(path)


def test_a_killed_fetch_resumes_from_its_part_file_with_a_range_request(fetch, mirror):
    status = fetch.tmp / "status.json"
    part = fetch.dest / STAGING / f"{SHARD2}.part"
    size = len(FILES[SHARD2])
    with open(fetch.tmp / "killed.stderr", "w") as err:
        proc = subprocess.Popen(fetch.cmd("--progress-every", "0.2", "--status", str(status),
                                          base=f"{mirror.url}/slow"), stdout=subprocess.DEVNULL, stderr=err)
    try:
        deadline = time.monotonic() + 20
        while not (part.exists() and part.stat().st_size > 0 and status.exists()):
            assert proc.poll() is None and time.monotonic() < deadline, "no bytes in the .part in 20 s"
            time.sleep(0.05)
        running = json.loads(status.read_text())
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
    kept = part.stat().st_size
    assert 0 < kept < size, kept
    assert running["state"] == "running" and running["phase"] == "fetch" and running["bytes_total"] == TOTAL
    assert {"bytes_done", "rate_bps", "eta_s", "files_done", "files_total"} <= set(running)
    assert "model fetch: " in (fetch.tmp / "killed.stderr").read_text()

    r = fetch()
    s = r.summary
    assert r.rc == 0, r.stderr
    assert s["bytes_resumed"] >= kept and s["bytes_restarted"] == 0
    assert s["bytes_fetched"] <= TOTAL - kept and s["bytes_fetched"] + s["bytes_resumed"] <= TOTAL
    assert fetch.sha(SHARD2) == _digest(SHARD2)
    assert f'/{SHARD2} 206 "bytes={kept}-"' in mirror.log_lines()
    assert not (fetch.dest / STAGING).exists()


@pytest.mark.parametrize("case", ["http", "http-no-range", "http-stale-part", "path", "rsync"])
def test_a_part_file_is_resumed_or_started_over(fetch, mirror, case):
    source = case.split("-")[0]
    half = len(FILES[SHARD2]) // 2
    part = fetch.dest / STAGING / f"{SHARD2}.part"
    part.parent.mkdir(parents=True)
    part.write_bytes(bytes(half) if case == "http-stale-part" else FILES[SHARD2][:half])
    base = f"{mirror.url}/norange" if case == "http-no-range" else None
    r = fetch(source=source, base=base)
    s = r.summary
    assert r.rc == 0, r.stderr
    assert fetch.sha(SHARD2) == _digest(SHARD2)
    if case in ("http-no-range", "http-stale-part"):  # the source sent it all (200) / the kept bytes were wrong
        assert s["bytes_restarted"] == half and s["bytes_resumed"] == 0 and s["bytes_fetched"] >= TOTAL
    else:
        assert s["bytes_resumed"] == half and s["bytes_restarted"] == 0 and s["bytes_fetched"] == TOTAL - half
    if case == "http":
        assert f'/{SHARD2} 206 "bytes={half}-"' in mirror.log_lines()
    if case == "http-no-range":
        assert f'/norange/{SHARD2} 200 "bytes={half}-"' in mirror.log_lines()
    assert not (fetch.dest / STAGING).exists()


@pytest.mark.parametrize("wrong", ["sha256", "size"])
def test_a_lock_the_source_does_not_match_exits_2_and_places_only_the_good_files(fetch, wrong):
    lock = json.loads(json.dumps(fetch.mirror.lock))
    entry = next(f for f in lock["files"] if f["path"] == "tokenizer.json")
    if wrong == "sha256":
        entry["sha256"] = "0" * 64
    else:
        entry["size"] += 1
    r = fetch(lock=lock)
    s = r.summary
    assert r.rc == 2, r.stderr
    assert s["error"].startswith("tokenizer.json: the source ") and "fix the lock (pdstack model lock)" in s["error"]
    if wrong == "sha256":
        assert f"the lock says 000000000000… ({len(FILES['tokenizer.json'])} bytes)" in s["error"]
    else:
        assert f"serves {len(FILES['tokenizer.json'])} bytes" in s["error"]
    assert "tokenizer.json" in r.stderr
    # every file gets its try: the good ones are placed (and recorded), the wrong one is not, nor left as a .part
    assert not (fetch.dest / "tokenizer.json").exists()
    assert not (fetch.dest / STAGING / "tokenizer.json.part").exists()
    good = sorted(set(FILES) - {"tokenizer.json"})
    assert s["fetched"] == good
    assert sorted(fetch.record()["files"]) == good and fetch.record()["lock_sha256"] is None
    for path in good:
        assert fetch.sha(path) == _digest(path)


def test_a_file_missing_on_the_mirror_exits_3_naming_the_file_and_the_url(fetch, mirror):
    lock = {**mirror.lock, "files": [*mirror.lock["files"],
                                     {"path": "model-00003-of-00002.safetensors", "size": 10, "sha256": "a" * 64}]}
    r = fetch(lock=lock)
    s = r.summary
    assert r.rc == 3, r.stderr
    assert s["error"].startswith("model-00003-of-00002.safetensors: GET ")
    assert f"{mirror.url}/model-00003-of-00002.safetensors answered 404" in s["error"]
    assert "check --from / pdstack_model.source" in s["error"]
    assert s["fetched"] == sorted(FILES)


def test_not_enough_space_exits_4_before_a_byte_moves(fetch, mirror):
    lock = json.loads(json.dumps(mirror.lock))
    next(f for f in lock["files"] if f["path"] == SHARD2)["size"] = 10 ** 15
    requests = len(mirror.log_lines())
    r = fetch(lock=lock)
    s = r.summary
    assert r.rc == 4, r.stderr
    assert "1000000.00 GB" in s["error"] and s["error"].count(" GB") == 2 and str(fetch.dest) in s["error"]
    assert s["missing_bytes"] == TOTAL - len(FILES[SHARD2]) + 10 ** 15 and s["bytes_fetched"] == 0
    assert not (fetch.dest / STAGING).exists() and list(fetch.dest.iterdir()) == []
    assert len(mirror.log_lines()) == requests  # not one request


def test_check_reports_what_a_run_would_fetch_and_changes_nothing(fetch):
    r = fetch("--check")
    s = r.summary
    assert r.rc == 0, r.stderr
    assert s["check"] is True and s["changed"] is True
    assert s["fetched"] == sorted(FILES) and s["missing_bytes"] == TOTAL and s["bytes_fetched"] == 0
    assert not fetch.dest.exists()

    assert fetch().rc == 0
    (fetch.dest / SHARD1).unlink()
    part = fetch.dest / STAGING / f"{SHARD1}.part"
    part.parent.mkdir()
    part.write_bytes(FILES[SHARD1][:1000])
    before = _tree(fetch.dest)
    r = fetch("--check")
    s = r.summary
    assert r.rc == 0, r.stderr
    assert s["fetched"] == [SHARD1] and s["repaired"] == [] and s["verified"] == len(FILES) - 1
    assert s["missing_bytes"] == len(FILES[SHARD1]) - 1000 and s["changed"] is True
    assert _tree(fetch.dest) == before


def test_only_fetches_the_matching_files(fetch):
    r = fetch("--only", "tokenizer*")
    s = r.summary
    assert r.rc == 0, r.stderr
    assert s["fetched"] == ["tokenizer.json", "tokenizer_config.json"] and s["extra"] == []
    assert sorted(p.name for p in fetch.dest.iterdir()) == sorted([RECORD, "tokenizer.json", "tokenizer_config.json"])
    record = fetch.record()
    assert sorted(record["files"]) == ["tokenizer.json", "tokenizer_config.json"]
    assert record["lock_sha256"] is None  # the record does not vouch for the files it did not see


def test_a_bearer_token_is_sent_and_never_shown(fetch, mirror):
    status = fetch.tmp / "status.json"
    base = f"{mirror.url}/auth"
    ok = fetch("--auth-env", "HUB_TOKEN", "--status", str(status), base=base, env={"HUB_TOKEN": TOKEN})
    assert ok.rc == 0, ok.stderr
    assert ok.summary["fetched"] == sorted(FILES)
    assert json.loads(status.read_text())["state"] == "done"
    assert TOKEN not in ok.stdout + ok.stderr + status.read_text()

    no_token = Fetch(fetch.tmp / "second", mirror)
    (fetch.tmp / "second").mkdir()
    denied = no_token("--auth-env", "HUB_TOKEN", "--status", str(status), base=base, env={"HUB_TOKEN": ""})
    assert denied.rc == 3, denied.stderr
    assert f"GET {base}/config.json answered 401 Unauthorized" in denied.summary["error"]
    assert "--auth-env" in denied.summary["error"]
    assert json.loads(status.read_text())["state"] == "failed"
    assert TOKEN not in denied.stdout + denied.stderr + status.read_text()


def test_the_token_is_dropped_on_a_redirect_to_another_host(fetch, mirror):
    # /plain/ refuses any Authorization header (the guard works):
    req = urllib.request.Request(f"{mirror.url}/plain/config.json", headers={"Authorization": f"Bearer {TOKEN}"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=5)
    assert refused.value.code == 400
    r = fetch("--auth-env", "HUB_TOKEN", "--only", "config.json", base=f"{mirror.url}/hop",
              env={"HUB_TOKEN": TOKEN})
    assert r.rc == 0, r.stderr  # /hop/ saw the token (else 401), /plain/ on localhost did not (else 400)
    assert fetch.sha("config.json") == _digest("config.json")
    log = mirror.log_lines()
    assert '/hop/config.json 302 "-"' in log and '/plain/config.json 200 "-"' in log
    assert TOKEN not in r.stdout + r.stderr


@pytest.mark.parametrize("bad", ["../etc/passwd", "/etc/passwd", "a//b", "a/./b", f"{STAGING}/x", "a/"])
def test_a_lock_entry_outside_the_model_directory_exits_2_naming_it(fetch, mirror, bad):
    lock = {**mirror.lock, "files": [*mirror.lock["files"], {"path": bad, "size": 1, "sha256": "a" * 64}]}
    r = fetch(lock=lock)
    assert r.rc == 2, r.stderr
    assert repr(bad) in r.summary["error"] and f"files[{len(FILES)}]" in r.summary["error"]
    assert not fetch.dest.exists() or list(fetch.dest.iterdir()) == []
