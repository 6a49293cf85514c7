"""The model phase (`--tags model`) on a systemd test host, fetching from the real nginx mirror on the controller.

inventory/test/model-host is the one-host layout on pdstack-model-1 (prefix pdstack-model), so this file runs on the
suite's second worker beside tests/test_site.py. The mirror (pdstack/testing/mirror.py) serves the sim's model
directory at /pdstack-sim/ and, rate-limited to 1 MiB/s per connection, at /slow/pdstack-sim/. In order: a fresh
fetch that verifies; a second run that changes nothing and re-reads nothing; a byte flipped in a shard (size and
mtime kept) that only the full verify finds, and repairs; a transfer killed half-way that the next run resumes
(bytes counted, nginx logs the 206); a filesystem too small, refused in preflight before any byte moves; a lock whose
sha256 the mirror's file does not match, refused naming the file; check mode reporting what a run would fetch.
Slow: CI runs it.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
import subprocess
import time

import pytest
import site_helpers
import yaml
from site_helpers import ROOT, changed_tasks, recap, saved_sim_image, sh

pytestmark = pytest.mark.slow

INV = ROOT / "inventory" / "test" / "model-host"
HOST = "pdstack-model-1"
PREFIX = "pdstack-model"
LOCK = json.loads((ROOT / "inventory" / "locks" / "pdstack-sim.json").read_text())
MODEL = yaml.safe_load((ROOT / "inventory/test/common/group_vars/all/model.yml").read_text())["pdstack_model"]
PATH = MODEL["path"]
BIG = max(LOCK["files"], key=lambda f: f["size"])  # the 8 MiB shard
SHARD = "model-00002-of-00003.safetensors"


def playbook(*args: str, timeout: int = 900) -> subprocess.CompletedProcess:
    return site_helpers.playbook(INV, "--tags", "model", *args, timeout=timeout)


def model_vars(**source) -> str:
    m = copy.deepcopy(MODEL)
    m["source"].update(source)
    return json.dumps({"pdstack_model": m})


def summary(out: str) -> dict:
    """The model role's 'in place' line: what the fetcher did, in numbers."""
    m = re.search(r"verified \((quick|full)\) in ([\d.]+) s; (nothing fetched|fetched [^;]*); "
                  r"(nothing repaired|repaired [^;]*); bytes_fetched=(\d+) bytes_resumed=(\d+) hashed_bytes=(\d+)",
                  " ".join(out.split()))  # the YAML callback folds long messages over lines
    assert m, out[-4000:]

    def names(t: str) -> list[str]:
        return [] if t.startswith("nothing") else t.split(" ", 1)[1].split(", ")
    return {"verify": m[1], "seconds": float(m[2]), "fetched": names(m[3]), "repaired": names(m[4]),
            "bytes_fetched": int(m[5]), "bytes_resumed": int(m[6]), "hashed_bytes": int(m[7])}


def host_sha(path: str) -> str | None:
    r = sh(HOST, "sha256sum", f"{PATH}/{path}")
    return r.stdout.split()[0] if r.returncode == 0 else None


def listing() -> str:
    return sh(HOST, "sh", "-c", f"cd {PATH} 2>/dev/null && find . -printf '%p %s %m %T@\\n' | sort").stdout


@pytest.fixture(scope="module")
def host():
    saved_sim_image()  # preflight resolves the plan's image (build/manifest-sim.json)
    yield from site_helpers.booted_hosts(PREFIX, 1)


@pytest.fixture(scope="module")
def fetched(host):
    t0 = time.monotonic()
    r = playbook()
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-6000:]
    s = summary(r.stdout)
    print(f"fresh fetch: {LOCK['files'].__len__()} files, {sum(f['size'] for f in LOCK['files'])} bytes in "
          f"{s['seconds']} s (fetcher), {took:.1f} s (ansible-playbook --tags model)")
    return {"run": r, "summary": s}


def test_a_fresh_fetch_puts_exactly_the_lock_in_place_read_only(fetched):
    s = fetched["summary"]
    assert sorted(s["fetched"]) == sorted(f["path"] for f in LOCK["files"]) and s["repaired"] == []
    assert s["bytes_fetched"] == sum(f["size"] for f in LOCK["files"])
    for f in LOCK["files"]:
        assert host_sha(f["path"]) == f["sha256"], f["path"]
    modes = sh(HOST, "stat", "-c", "%a %n", *[f"{PATH}/{f['path']}" for f in LOCK["files"]]).stdout.split("\n")
    assert all(line.startswith("444 ") for line in modes if line), modes
    assert sh(HOST, "test", "-e", f"{PATH}/.pdstack-staging").returncode != 0, "staging left behind"
    assert sh(HOST, "test", "-s", f"{PATH}/.pdstack-verified.json").returncode == 0
    assert recap(fetched["run"].stdout)[HOST]["changed"] > 0


def test_a_second_run_changes_nothing_and_rereads_nothing(fetched):
    before = listing()
    t0 = time.monotonic()
    r = playbook()
    took = time.monotonic() - t0
    assert r.returncode == 0, r.stdout[-4000:]
    assert all(x["changed"] == 0 for x in recap(r.stdout).values()), changed_tasks(r.stdout)
    s = summary(r.stdout)
    assert s["fetched"] == [] and s["repaired"] == [] and s["hashed_bytes"] == 0 and s["bytes_fetched"] == 0, s
    assert listing() == before  # not a file touched, the record included
    print(f"second run: fetcher {s['seconds']} s, ansible-playbook --tags model {took:.1f} s, changed=0")


def _flip_a_byte_keeping_size_and_mtime(path: str) -> None:
    code = (f"import os; p={f'{PATH}/{path}'!r}; st=os.stat(p); os.chmod(p, 0o644); f=open(p, 'r+b'); "
            "f.seek(12345); b=f.read(1); f.seek(12345); f.write(bytes([b[0] ^ 0xFF])); f.close(); "
            "os.chmod(p, 0o444); os.utime(p, ns=(st.st_atime_ns, st.st_mtime_ns))")
    assert sh(HOST, "python3", "-c", code).returncode == 0


def test_a_flipped_byte_is_found_by_the_full_verify_and_repaired(fetched):
    good = next(f["sha256"] for f in LOCK["files"] if f["path"] == SHARD)
    _flip_a_byte_keeping_size_and_mtime(SHARD)
    assert host_sha(SHARD) != good
    quick = playbook()  # same size, same mtime: the quick verify trusts its record (why `full` exists)
    assert quick.returncode == 0 and summary(quick.stdout)["repaired"] == [], quick.stdout[-3000:]
    full = playbook("-e", "pdstack_model_verify=full")
    assert full.returncode == 0, full.stdout[-4000:]
    s = summary(full.stdout)
    assert s["verify"] == "full" and s["repaired"] == [SHARD], s
    assert s["hashed_bytes"] >= sum(f["size"] for f in LOCK["files"]) - 1, s  # every file read again
    assert host_sha(SHARD) == good


def _part_size() -> int:
    r = sh(HOST, "stat", "-c", "%s", f"{PATH}/.pdstack-staging/{BIG['path']}.part")
    return int(r.stdout) if r.returncode == 0 else 0


def test_a_transfer_killed_half_way_is_resumed_not_restarted(fetched):
    from pdstack.testing import mirror
    assert sh(HOST, "rm", "-f", f"{PATH}/{BIG['path']}").returncode == 0
    env = {**__import__("os").environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_NOCOLOR": "1",
           "PATH": f"{site_helpers.BIN}:{__import__('os').environ['PATH']}"}
    slow = subprocess.Popen([str(site_helpers.BIN / "ansible-playbook"), "site.yml", "-i", str(INV), "--tags", "model",
                             "-e", model_vars(url=mirror.url(slow=True))], cwd=ROOT, env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 120
        while _part_size() < 2 << 20:  # at 1 MiB/s: a quarter of the 8 MiB shard
            assert time.monotonic() < deadline and slow.poll() is None, "the slow fetch did not start"
            time.sleep(0.3)
        # the transfer breaks: the fetcher on the host is killed mid-file
        assert sh(HOST, "pkill", "-KILL", "-f", "model-fetch").returncode == 0
        out, _ = slow.communicate(timeout=120)
    finally:
        if slow.poll() is None:
            slow.kill()
    assert slow.returncode != 0, out[-3000:]
    kept = _part_size()
    assert 0 < kept < BIG["size"], kept
    r = playbook()
    assert r.returncode == 0, r.stdout[-4000:]
    s = summary(r.stdout)
    assert s["fetched"] == [BIG["path"]], s
    assert s["bytes_resumed"] >= kept and s["bytes_fetched"] == BIG["size"] - s["bytes_resumed"], (s, kept)
    assert host_sha(BIG["path"]) == BIG["sha256"]
    log = (mirror.MIRROR / "nginx" / "access.log").read_text()
    assert re.search(rf'"GET /pdstack-sim/{re.escape(BIG["path"])} HTTP/1.1" 206 ', log), "no ranged request"
    print(f"resumed: {s['bytes_resumed']} bytes kept from the broken transfer, {s['bytes_fetched']} fetched")


def test_a_filesystem_too_small_is_refused_before_any_byte_moves(fetched):
    assert sh(HOST, "rm", "-f", f"{PATH}/{SHARD}").returncode == 0
    before = listing()
    r = playbook("-e", model_vars(free_margin_gb=10**6))  # a petabyte of margin: no test host has it
    assert r.returncode != 0
    assert f"host {HOST}: " in r.stdout and "but the model needs 3.1 MB more" in r.stdout, r.stdout[-3000:]
    assert "plus pdstack_model.source.free_margin_gb 1000000 GB" in r.stdout and "Nothing was fetched" in r.stdout
    assert listing() == before and all(x["changed"] == 0 for x in recap(r.stdout).values())


def test_check_mode_reports_what_a_run_would_fetch_and_changes_nothing(fetched):
    """(the shard the test above removed is still missing)"""
    before = listing()
    r = playbook("--check")
    assert r.returncode == 0, r.stdout[-4000:]
    size = next(f["size"] for f in LOCK["files"] if f["path"] == SHARD)
    assert f"a run would fetch 1 of {len(LOCK['files'])} files ({round(size / 1e9, 3)} GB)" in r.stdout
    assert SHARD in r.stdout and listing() == before


def test_a_file_that_is_not_the_locks_is_refused_naming_it(fetched, tmp_path):
    lock = copy.deepcopy(LOCK)
    entry = next(f for f in lock["files"] if f["path"] == SHARD)
    entry["sha256"] = hashlib.sha256(b"another checkpoint").hexdigest()
    (tmp_path / "lock.json").write_text(json.dumps(lock))
    r = playbook("-e", model_vars(lock=str(tmp_path / "lock.json")))
    assert r.returncode != 0
    assert SHARD in r.stdout and entry["sha256"][:12] in r.stdout, r.stdout[-4000:]
    assert "the source does not hold the locked model" in r.stdout
    # nothing of the wrong file was placed or left in staging (the shard is still missing: the tests above removed it)
    assert host_sha(SHARD) is None
    assert sh(HOST, "test", "-e", f"{PATH}/.pdstack-staging/{SHARD}.part").returncode != 0
    # with the right lock again, a run fetches exactly that file
    r = playbook()
    assert r.returncode == 0 and summary(r.stdout)["fetched"] == [SHARD], r.stdout[-3000:]
    assert host_sha(SHARD) == next(f["sha256"] for f in LOCK["files"] if f["path"] == SHARD)
