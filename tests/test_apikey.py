"""The front door's API key in the smoke tools (controller/gates/apikey.py): read from the environment (a 0600 file
or the variable), sent by every gate, and a 401 named as the key's fault.

Against the real HAProxy with the config pdstack renders with a key required (pdstack.testing.sim.launch
FrontDoorProcess), in front of a stub backend on 127.0.0.1 that records each request's Authorization header and
answers 500 to it: a gate that got through the key check then fails with that 500, not with a key refusal.
"""

from __future__ import annotations

import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from pdstack import cli
from pdstack.controller.gates import apikey, bench, churn, gates_tools, recall
from pdstack.hostside import probe
from pdstack.testing.sim.launch import FrontDoorProcess
from pdstack.testing.sim.vocab import TOKENIZER_DIR

KEY = "t0p-s3cret-key"
REFUSED = "the front door refused the API key (HTTP 401)"
NONE_SENT = "no key was sent and the deployment requires one"
WRONG = "is not one it accepts"


class _Backend(BaseHTTPRequestHandler):
    seen: list[tuple[str, str | None]] = []

    def do_GET(self):  # noqa: N802 (http.server's name): HAProxy's health check
        self._answer(200 if self.path == "/liveness" else 404, record=False)

    def do_POST(self):  # noqa: N802
        self.rfile.read(int(self.headers.get("Content-Length") or 0))
        self._answer(500)

    def _answer(self, status: int, record: bool = True) -> None:
        if record:
            type(self).seen.append((self.path, self.headers.get("Authorization")))
        body = b'{"error": "stub backend"}'
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def door(tmp_path_factory):
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Backend)
    t = threading.Thread(target=server.serve_forever, daemon=True)
    t.start()

    class Backend:  # what FrontDoorProcess reads of a router
        port = server.server_address[1]

    fd = FrontDoorProcess(Backend(), tmp_path_factory.mktemp("apikey"), api_key=KEY)
    try:
        fd.start()
        yield fd
    finally:
        fd.stop()
        server.shutdown()
        server.server_close()


@pytest.fixture
def seen():
    _Backend.seen.clear()
    return _Backend.seen


def _gates(url: str, headers: dict) -> dict[str, str]:
    """Each smoke tool once against `url` with `headers`: {tool: its failure message}."""
    pr = probe.probe(url, first_token_timeout=5, stall_timeout=2, total_timeout=5, headers=headers)
    rr = recall.run_recall(url, lengths=[200], depths=[50], tokenizer=TOKENIZER_DIR, variants=["single"],
                           concurrency=1, timeout=5, retries=0, headers=headers)
    br = bench.run_bench(url, concurrency=[1], requests=1, max_new_tokens=4, timeout=5, headers=headers)
    tr = gates_tools.run_tool_gate(url, reasoning=False, timeout=5, headers=headers)
    cr = churn.run_churn_gate(url, tokenizer=TOKENIZER_DIR, lengths=[200], timeout=5, headers=headers)
    assert not (pr.ok or br.passed or tr.passed or cr.passed) and rr.counts()["http"] == 1
    (o,) = rr.cells[0].outcomes
    assert rr.auth_refused is None or rr.auth_refused in rr.table()  # the table says it too
    return {"probe": pr.message, "recall": f"HTTP {o.http_status}: {o.detail}", "bench": "; ".join(br.c1.errors),
            "tools": tr.message, "churn": cr.message}


def test_without_the_key_every_gate_says_the_key_was_refused(door, seen):
    msgs = _gates(door.url, {})
    for tool, msg in msgs.items():
        assert REFUSED in msg and NONE_SENT in msg and "not a model failure" in msg, (tool, msg)
    assert "is --tool-call-parser on?" not in msgs["tools"]
    assert seen == []  # HAProxy refused them all itself
    assert probe.probe(door.url, total_timeout=5, headers={}).code == probe.AUTH  # no restart stage for the watchdog


def test_a_wrong_key_is_named_as_such(door, seen):
    msgs = _gates(door.url, apikey.headers("not-the-key"))
    for tool, msg in msgs.items():
        assert REFUSED in msg and WRONG in msg, (tool, msg)
    assert seen == []


def test_the_right_key_reaches_the_backend_from_every_gate(door, seen):
    msgs = _gates(door.url, apikey.headers(KEY))
    for tool, msg in msgs.items():
        assert "refused the API key" not in msg and "500" in msg, (tool, msg)
    paths = {p for p, _ in seen}
    assert paths == {"/generate", "/v1/chat/completions"}, seen
    assert {a for _, a in seen} == {f"Bearer {KEY}"}, seen


def _smoke(url: str, out: Path) -> tuple[int, str]:
    rc = cli.main(["smoke", "--url", url, "--out", str(out), "--tokenizer", str(TOKENIZER_DIR), "--lengths", "200",
                   "--depths", "50",
                   "--variant", "single", "--bench-concurrency", "1", "--bench-requests", "1", "--bench-tokens", "4",
                   "--timeout", "5", "--probe-first-token-timeout", "3", "--probe-stall-timeout", "2",
                   "--churn-lengths", "200", "--no-reasoning"])
    return rc, (out / "summary.txt").read_text()


def test_pdstack_smoke_sends_the_key_from_a_0600_file(door, seen, tmp_path, monkeypatch):
    monkeypatch.delenv(apikey.ENV, raising=False)
    monkeypatch.delenv(apikey.ENV_FILE, raising=False)
    rc, text = _smoke(door.url, tmp_path / "nokey")
    assert rc == 1
    lines = {ln.split()[0]: ln for ln in text.splitlines()[1:6]}
    assert set(lines) == {"probe", "recall", "bench", "tools", "churn"}, text
    for gate, line in lines.items():
        assert REFUSED in line and NONE_SENT in line, (gate, line)
    assert seen == []

    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    key_file.chmod(0o600)
    monkeypatch.setenv(apikey.ENV_FILE, str(key_file))
    rc, text = _smoke(door.url, tmp_path / "key-ok")
    assert rc == 1 and "refused the API key" not in text, text  # the stub's 500s, past the key check
    assert seen and {a for _, a in seen} == {f"Bearer {KEY}"}, seen
    for f in (tmp_path / "key-ok").glob("*.json"):
        assert KEY not in f.read_text(), f


def test_the_key_comes_from_a_private_file_or_the_variable(tmp_path, capsys):
    assert apikey.load({}) is None and apikey.headers(None) == {}
    assert apikey.load({apikey.ENV: " k1 "}) == "k1"
    f = tmp_path / "key"
    f.write_text("Bearer k2\n")  # the front door's own file format is taken too
    f.chmod(0o600)
    assert apikey.load({apikey.ENV_FILE: str(f), apikey.ENV: "k1"}) == "k2"  # the file wins
    assert apikey.from_env({apikey.ENV_FILE: str(f)}) == {"Authorization": "Bearer k2"}
    f.chmod(0o640)
    with pytest.raises(apikey.ApiKeyError, match=rf"mode 0640, readable by others; `chmod 600 {f}`"):
        apikey.load({apikey.ENV_FILE: str(f)})
    with pytest.raises(apikey.ApiKeyError, match="PDSTACK_API_KEY_FILE=.*cannot read the API key file"):
        apikey.load({apikey.ENV_FILE: str(tmp_path / "missing")})
    f.write_text("\n")
    f.chmod(0o600)
    with pytest.raises(apikey.ApiKeyError, match="on one line .*empty"):
        apikey.load({apikey.ENV_FILE: str(f)})
    assert apikey.refused(500, {}) is None and apikey.refused(429, {}) is None


def test_a_world_readable_key_file_is_a_usage_error_before_any_request(tmp_path, monkeypatch, capsys):
    f = tmp_path / "key"
    f.write_text(KEY)
    f.chmod(0o644)
    monkeypatch.setenv(apikey.ENV_FILE, str(f))
    rc = cli.main(["smoke", "--url", "http://127.0.0.1:9", "--out", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "chmod 600" in err and KEY not in err, err
    assert not (tmp_path / "out").exists()


def _preflight_static(tmp_path: Path, *args: str):
    """The preflight role's static tasks (what site.yml runs first, on the controller) against inventory/local."""
    import os
    import subprocess

    root = Path(__file__).resolve().parents[1]
    book = tmp_path / "static.yml"
    book.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.include_role: {name: preflight, tasks_from: static}\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(root / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(root / "roles"),
           "ANSIBLE_NOCOLOR": "1"}
    return subprocess.run([str(root / ".venv" / "bin" / "ansible-playbook"), str(book), "-i",
                           str(root / "inventory" / "local"), *args], cwd=root, env=env, capture_output=True,
                          text=True, timeout=300)


def test_preflight_refuses_a_key_the_key_file_cannot_carry_from_vault_too_and_never_shows_it(tmp_path):
    """`openssl rand -base64 66` wraps at 64 characters: such a key would become two lines of the key file, two
    keys. Preflight refuses it (and a short one) before any host changes, as Ansible resolves it (here from a
    Vault-encrypted -e file), naming the variable, the router host and the fix, and never printing the key."""
    import subprocess

    good = "Kz8-q_Lw.7~+/abcdEFGH=="
    wrapped = "A" * 64 + "\n" + "B" * 24
    assert _preflight_static(tmp_path, "-e", f'{{"frontdoor_api_key": "{good}"}}').returncode == 0
    pw = tmp_path / "vault-pass"
    pw.write_text("a vault password\n")
    root = Path(__file__).resolve().parents[1]
    for key in (wrapped, "short-key", "a key with spaces in it"):
        enc = subprocess.run([str(root / ".venv" / "bin" / "ansible-vault"), "encrypt_string", "--vault-password-file",
                              str(pw), "--name", "frontdoor_api_key", key], capture_output=True, text=True, check=True)
        (tmp_path / "vars.yml").write_text(enc.stdout)
        r = _preflight_static(tmp_path, "--vault-password-file", str(pw), "-e", f"@{tmp_path / 'vars.yml'}")
        out = r.stdout + r.stderr
        assert r.returncode != 0, out[-3000:]
        assert "frontdoor_api_key (router host pdstack-local-1" in out and "openssl rand -hex 32" in out, out[-3000:]
        assert key.split("\n")[0] not in out and "B" * 24 not in out
