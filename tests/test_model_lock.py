"""The model lock and the model phase's preflight (pdstack_model.source), without a host.

Each bad case copies inventory/production, gives it a source and a lock, breaks one thing, and runs what
`pdstack plan` and the preflight role run: it must fail naming the variable (or the lock's entry) and the fix,
before any host is touched. The sim's model directory and the committed locks must agree (they are fetched by every
deploy of the sim inventories).
"""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdstack.controller import pipeline
from pdstack.controller.gates import smoke_settings
from pdstack.controller.load import inventory, modellock
from pdstack.controller.load.facts import load_facts
from pdstack.controller.plan import model as model_plan
from pdstack.controller.plan import text as plan_text
from pdstack.errors import InventoryError
from pdstack.testing.sim import modeldir

ROOT = Path(__file__).resolve().parents[1]
PROD = ROOT / "inventory" / "production"
TOPO = ROOT / "tests" / "topologies" / "reference-2node-8gpu.json"
REPO = "nvidia/DeepSeek-V4-Flash-NVFP4"
COMMIT = "0123456789abcdef0123456789abcdef01234567"
SHA = "a" * 64


def _lock(model: str = REPO, revision: str | None = COMMIT, files=None) -> dict:
    out = {"model": model, "files": files if files is not None else [
        {"path": "config.json", "size": 100, "sha256": SHA},
        {"path": "model-00001-of-00002.safetensors", "size": 40_000_000_000, "sha256": "b" * 64},
        {"path": "model-00002-of-00002.safetensors", "size": 40_000_000_000, "sha256": "c" * 64},
        {"path": "tokenizer.json", "size": 9, "sha256": "d" * 64}]}
    if revision:
        out["revision"] = revision
    return out


def _inventory(tmp_path: Path, source: dict | None, lock: dict | str | None = None) -> Path:
    inv = tmp_path / "production"
    import shutil
    shutil.copytree(PROD, inv)
    if lock is not None:
        (tmp_path / "locks").mkdir()
        (tmp_path / "locks" / "model.json").write_text(lock if isinstance(lock, str) else json.dumps(lock))
    p = inv / "group_vars/all/model.yml"
    data = yaml.safe_load(p.read_text())
    if source is not None:
        data["pdstack_model"]["source"] = source
    p.write_text(yaml.safe_dump(data, sort_keys=False))
    return inv


HF = {"type": "hf", "repo": REPO, "revision": COMMIT, "lock": "../locks/model.json"}


def _problems(inv: Path, facts_edit=None) -> list[str]:
    try:
        dep = inventory.load(inv)
        facts = load_facts(TOPO, list(dep.hosts))
        if facts_edit:
            facts_edit(facts)
        pipeline.make_plan(dep, facts)
    except InventoryError as e:
        return e.problems
    return []


def C(name, source, lock, expected, facts=None):
    return pytest.param(source, lock, expected, facts, id=name)


def _with_disk(free: int, files=None, partial=None):
    def edit(facts):
        for f in facts.values():
            f["model"] = {"path": "/models/nvidia/DeepSeek-V4-Flash-NVFP4", "disk": {"path": "/models",
                          "free_bytes": free}, "files": files or {}, "partial": partial or {}}
    return edit


BAD = [
    C("hf-revision-is-a-branch", {**HF, "revision": "main"}, _lock(), ["pdstack_model.source.revision", "'main'",
                                                                      "not a pinned commit", "40-hex"]),
    C("hf-without-revision", {k: v for k, v in HF.items() if k != "revision"}, _lock(),
      ["pdstack_model.source.revision: required for type hf", "pin the commit"]),
    C("hf-without-repo", {k: v for k, v in HF.items() if k != "repo"}, _lock(),
      ["pdstack_model.source.repo: required for type hf"]),
    C("hf-lock-of-another-repo", HF, _lock(model="someone/else"),
      ["is the lock of someone/else, but the source is nvidia/DeepSeek-V4-Flash-NVFP4", "pdstack model lock --hf"]),
    C("hf-lock-of-another-commit", HF, _lock(revision="f" * 40),
      [f"was made at revision {'f' * 40}, but source.revision is {COMMIT}"]),
    C("http-without-url", {"type": "http", "lock": "../locks/model.json"}, _lock(),
      ["pdstack_model.source.url: required for type http"]),
    C("url-on-an-rsync-source", {"type": "rsync", "rsync": "nas:/models/x", "url": "http://m/x",
                                 "lock": "../locks/model.json"}, _lock(model="DeepSeek-V4-Flash-NVFP4"),
      ["pdstack_model.source.url: only used by type http, and the source is type rsync"]),
    C("url-with-credentials", {"type": "http", "url": "http://user:pw@mirror/x", "lock": "../locks/model.json"},
      _lock(), ["pdstack_model.source.url", "carries credentials"]),
    C("url-not-http", {"type": "http", "url": "ftp://mirror/x", "lock": "../locks/model.json"}, _lock(),
      ["pdstack_model.source.url", "not an http(s) URL"]),
    C("rsync-source-like-a-flag", {"type": "rsync", "rsync": "--rsh=evil", "lock": "../locks/model.json"}, _lock(),
      ["pdstack_model.source.rsync", "not an rsync source"]),
    C("token-var-exported-by-preflight", {**HF, "token_var": "pdstack_hf_token"}, _lock(),
      ["pdstack_model.source.token_var", "clear text"]),
    C("lock-of-another-model", {"type": "http", "url": "http://mirror:8080/m", "lock": "../locks/model.json"},
      _lock(model="pdstack-sim"), ["is the lock of model 'pdstack-sim'", "DeepSeek-V4-Flash-NVFP4",
                                   "pdstack model lock --model DeepSeek-V4-Flash-NVFP4"]),
    C("lock-missing", HF, None, ["pdstack_model.source.lock: cannot read", "pdstack model lock DIR -o"]),
    C("lock-not-json", HF, "{not json", ["is not JSON", "regenerate it"]),
    C("lock-path-climbs-out", HF, _lock(files=[{"path": "config.json", "size": 1, "sha256": SHA},
                                               {"path": "../../etc/passwd", "size": 1, "sha256": SHA}]),
      ["files[1].path: '../../etc/passwd' is not a plain relative path"]),
    C("lock-absolute-path", HF, _lock(files=[{"path": "/etc/shadow", "size": 1, "sha256": SHA}]),
      ["files[0].path: '/etc/shadow' is not a plain relative path"]),
    C("lock-names-the-staging-dir", HF, _lock(files=[{"path": "config.json", "size": 1, "sha256": SHA},
                                                     {"path": ".pdstack-staging/x", "size": 1, "sha256": SHA}]),
      ["files[1].path", "reserved for the fetcher"]),
    C("lock-duplicate", HF, _lock(files=[{"path": "config.json", "size": 1, "sha256": SHA}] * 2),
      ["files[1].path: config.json is listed twice"]),
    C("lock-bad-sha", HF, _lock(files=[{"path": "config.json", "size": 1, "sha256": "ABC"}]),
      ["files[0].sha256: 'ABC' is not 64 lowercase hex digits"]),
    C("lock-negative-size", HF, _lock(files=[{"path": "config.json", "size": -1, "sha256": SHA}]),
      ["files[0].size: -1 is not a size in bytes"]),
    C("lock-size-is-text", HF, _lock(files=[{"path": "config.json", "size": "1", "sha256": SHA}]),
      ["files[0].size: '1' is not a size in bytes"]),
    C("lock-without-config", HF, _lock(files=[{"path": "tokenizer.json", "size": 1, "sha256": SHA}]),
      ["lists no config.json"]),
    C("lock-not-a-lock", HF, json.dumps([1, 2]), ["not a model lock"]),
    C("lock-inside-the-inventory", {**HF, "lock": "group_vars/all/model.yml"}, _lock(),
      ["is inside the inventory directory", "Ansible reads", "inventory/locks/"]),
    C("disk-too-small", HF, _lock(), ["host gpu01: /models has 50.00 GB free, but the model needs 80.00 GB more",
                                      "free_margin_gb 2 GB", "Nothing was fetched"], _with_disk(50 * 10**9)),
    C("disk-too-small-for-the-margin", {**HF, "free_margin_gb": 30}, _lock(),
      ["needs 80.00 GB more", "free_margin_gb 30 GB"], _with_disk(100 * 10**9)),
]


@pytest.mark.parametrize("source,lock,expected,facts", BAD)
def test_a_bad_source_or_lock_fails_before_any_host_naming_the_fix(tmp_path, source, lock, expected, facts):
    problems = _problems(_inventory(tmp_path, source, lock), facts)
    text = "\n".join(problems)
    assert problems, "no problem reported"
    for frag in expected:
        assert frag in text, f"{frag!r} not in:\n{text}"


def test_room_counts_what_is_already_there_and_what_a_broken_transfer_left(tmp_path):
    lock = _lock()
    shard1, shard2 = lock["files"][1]["path"], lock["files"][2]["path"]
    # one shard in place, half of the other in staging: 20 GB (+ the small files) still to come
    assert modellock.missing_bytes(lock, {shard1: 40 * 10**9}, {shard2: 20 * 10**9}) == 20 * 10**9 + 109
    # a shard of the wrong size in place counts in full
    assert modellock.missing_bytes(lock, {shard1: 1}, {}) == 80 * 10**9 + 109
    inv = _inventory(tmp_path, HF, lock)
    assert _problems(inv, _with_disk(25 * 10**9, files={shard1: 40 * 10**9}, partial={shard2: 20 * 10**9})) == []
    assert _problems(inv, _with_disk(21 * 10**9, files={shard1: 40 * 10**9}, partial={shard2: 20 * 10**9}))


def test_the_plan_carries_the_lock_and_how_to_fetch_it(tmp_path):
    lock = _lock()
    inv = _inventory(tmp_path, {**HF, "endpoint": "https://hf-mirror.example/"}, lock)
    (inv / "group_vars/all/hub.yml").write_text("---\nhf_token: hf_s3cretvalue\n")  # Vault's, in production
    dep = inventory.load(inv)
    plan = pipeline.make_plan(dep, load_facts(TOPO, list(dep.hosts))).to_dict()
    assert plan["model"]["lock"]["digest"] == modellock.digest(lock)
    assert plan["model"]["lock"]["files"] == lock["files"] and plan["model"]["lock"]["bytes"] == 80 * 10**9 + 109
    # hf is http from the hub's resolve URLs; the token is named, never carried
    assert plan["model"]["fetch"] == {"method": "http", "token_var": "hf_token",
                                      "from": f"https://hf-mirror.example/{REPO}/resolve/{COMMIT}"}
    assert "hf_s3cretvalue" not in json.dumps(plan)
    text = plan_text.render_text(pipeline.make_plan(dep, load_facts(TOPO, list(dep.hosts))))
    assert f"hf source {REPO}@{COMMIT}" in text and "4 files, 80.00 GB" in text


def test_without_a_source_production_warns_and_the_plan_says_unmanaged():
    dep = inventory.load(PROD)
    plan = pipeline.make_plan(dep, load_facts(TOPO, list(dep.hosts)))
    assert plan.model["lock"] is None and plan.model["fetch"] is None
    assert any("pdstack_model.source is unset" in w for w in plan.warnings), plan.warnings


@pytest.mark.parametrize("kind,frm", [("http", "http://mirror:8080/models/x"), ("rsync", "nas:/srv/models/x"),
                                      ("path", None)])
def test_fetch_plan_per_source_type(tmp_path, kind, frm):
    src = {"type": kind, "lock": "../locks/model.json", **({"url": frm + "/"} if kind == "http" else {}),
           **({"rsync": frm} if kind == "rsync" else {})}
    dep = inventory.load(_inventory(tmp_path, src, _lock(model="DeepSeek-V4-Flash-NVFP4", revision=None)))
    want = frm if kind != "path" else "/models/nvidia/DeepSeek-V4-Flash-NVFP4"
    assert model_plan.fetch_plan(dep) == {"method": kind, "from": want, "token_var": None}


def test_the_committed_locks_are_the_sims_model_directory(tmp_path):
    d = modeldir.write(tmp_path / modeldir.NAME)
    made = modellock.from_dir(d)
    f = "inventory/locks/pdstack-sim.json"  # inventory/local's and inventory/test's
    assert json.loads((ROOT / f).read_text()) == made, f"{f} is stale: regenerate it with pdstack model lock"
    # the tokenizer the smoke gate gets from the lock is the sim's own
    sim_tok = ROOT / "pdstack/testing/sim/tokenizer/tokenizer.json"
    assert (d / "tokenizer.json").read_bytes() == sim_tok.read_bytes()
    # the largest shard is large enough to be cut half-way on the rate-limited mirror (tests/test_site_model.py)
    assert max(modeldir.SHARDS.values()) >= 8 << 20


def test_the_sim_inventories_smoke_gate_uses_the_model_phases_tokenizer():
    for inv in ("inventory/local", "inventory/test/one-host"):
        dep = inventory.load(ROOT / inv)
        assert dep.smoke["tokenizer"] is None
        tok = smoke_settings.from_deployment(dep)["tokenizer"]
        assert tok == str(ROOT / "build" / "state" / Path(inv).name / "tokenizer"), tok


def _cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pdstack", "model", *args], cwd=ROOT, capture_output=True,
                          text=True, timeout=60)


def test_pdstack_model_lock_prints_and_writes_the_lock_of_a_directory(tmp_path):
    d = modeldir.write(tmp_path / "m" / modeldir.NAME)
    (d / ".pdstack-verified.json").write_text("{}")  # the fetcher's own files are never locked
    (d / ".pdstack-staging").mkdir()
    (d / ".pdstack-staging" / "x.part").write_text("x")
    r = _cli("lock", str(d))
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout) == json.loads((ROOT / "inventory/locks/pdstack-sim.json").read_text())
    out = tmp_path / "lock.json"
    r = _cli("lock", str(d), "--model", "other-name", "-o", str(out))
    assert r.returncode == 0 and "wrote" in r.stderr and f"{len(modeldir.files())} files" in r.stderr
    assert json.loads(out.read_text())["model"] == "other-name"


@pytest.mark.parametrize("args,expected", [
    ((), "give a model directory, or --hf REPO --revision REV"),
    (("--hf", REPO), "--hf needs --revision"),
    (("/nonexistent-dir",), "/nonexistent-dir is not a directory"),
    (("somedir", "--hf", REPO, "--revision", COMMIT), "not both"),
])
def test_pdstack_model_lock_usage_errors(args, expected):
    r = _cli("lock", *args)
    assert r.returncode == 2 and expected in r.stderr, (r.returncode, r.stderr)


def test_pdstack_model_lock_hf_reports_an_unreachable_hub(tmp_path):
    """No hub is reachable here: the --hf path must fail with the hub client's own error, exit 3, nothing written."""
    out = tmp_path / "lock.json"
    r = subprocess.run([sys.executable, "-m", "pdstack", "model", "lock", "--hf", REPO, "--revision", COMMIT,
                        "--endpoint", "http://127.0.0.1:9", "-o", str(out)], cwd=ROOT, capture_output=True,
                       text=True, timeout=120, env={"HF_HUB_OFFLINE": "0", "PATH": "/usr/bin:/bin",
                                                    "HF_HUB_ETAG_TIMEOUT": "2", "HF_HUB_DOWNLOAD_TIMEOUT": "2"})
    assert r.returncode == 3, (r.returncode, r.stderr[-2000:])
    assert f"{REPO}@{COMMIT}" in r.stderr and not out.exists()


def test_lock_problems_name_every_bad_entry():
    lock = copy.deepcopy(_lock())
    lock["files"][1]["path"] = "a/../b"
    lock["files"][2]["sha256"] = "z" * 64
    found = modellock.problems(lock, "L")
    assert any("files[1].path" in p for p in found) and any("files[2].sha256" in p for p in found), found
    assert modellock.problems(_lock(), "L") == []
    assert modellock.digest(_lock()) == modellock.digest({**_lock(), "files": list(reversed(_lock()["files"]))})
