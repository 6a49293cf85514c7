"""pdstack/hostside and pdstack/image run outside the venv: each imports under `python3 -I -S`, stdlib only.

hostside/ runs on a host with the host's python3 (facts.d script, watchdog timer); image/ runs inside the production
image at build time with the image's python3 before anything of ours is installed there. A module that picks up a
venv package (yaml, aiohttp, ...) or a controller module would work in tests and break on the host: this catches it.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import zipfile
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")

# Which pdstack files each rule allows (the package root and errors.py are stdlib-only and shared).
ALLOWED = {
    "hostside": {"pdstack/__init__.py", "pdstack/hostside/__init__.py", "pdstack/hostside/__main__.py",
                 "pdstack/hostside/haproxy.py", "pdstack/hostside/atomic.py", "pdstack/hostside/facts.py",
                 "pdstack/hostside/probe.py", "pdstack/hostside/watchdog.py", "pdstack/hostside/watchdog_state.py",
                 "pdstack/hostside/restart_unit.py",
                 "pdstack/hostside/drain.py", "pdstack/hostside/status_collect.py", "pdstack/hostside/model_fetch.py",
                 "pdstack/hostside/model_store.py", "pdstack/hostside/model_source.py"},
    "image": {"pdstack/__init__.py", "pdstack/errors.py", "pdstack/image/__init__.py", "pdstack/image/patches.py",
              "pdstack/image/p2p.py"},
}

CHECK = r"""
import importlib, json, sys, sysconfig
root = sys.argv[1]
sys.path.insert(0, root)
stdlib = {sysconfig.get_paths()[k] for k in ("stdlib", "platstdlib")}
for mod in sys.argv[2:]:
    importlib.import_module(mod)
ours, foreign = [], []
for name, m in sorted(sys.modules.items()):
    f = getattr(m, "__file__", None)
    if not f:
        continue
    if f.startswith(root + "/"):
        ours.append(f[len(root) + 1:])
    elif not any(f.startswith(p) for p in stdlib):
        foreign.append(f"{name} ({f})")
print(json.dumps({"ours": ours, "foreign": foreign}))
"""


def _modules(folder: str) -> list[str]:
    return [f"pdstack.{folder}.{p.stem}" for p in sorted((ROOT / "pdstack" / folder).glob("*.py"))
            if p.name != "__init__.py"]


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python3 in /usr/bin (the host interpreter under test)")
@pytest.mark.parametrize("folder", sorted(ALLOWED))
def test_imports_with_isolated_system_python_and_stdlib_only(folder):
    mods = _modules(folder)
    assert mods, f"pdstack/{folder} has no modules"
    r = subprocess.run([SYSTEM_PYTHON, "-I", "-S", "-c", CHECK, str(ROOT), *mods], capture_output=True, text=True,
                       timeout=60, cwd="/")
    assert r.returncode == 0, f"{folder} does not import under python3 -I -S:\n{r.stderr}"
    seen = json.loads(r.stdout)
    assert not seen["foreign"], f"pdstack/{folder} pulled in non-stdlib modules: {seen['foreign']}"
    stray = sorted(set(seen["ours"]) - ALLOWED[folder])
    assert not stray, f"pdstack/{folder} imports pdstack code that is not shipped with it: {stray}"


def test_the_artifact_is_the_whole_package_and_the_same_bytes_for_the_same_sources(tmp_path):
    """pdstack-hostside.pyz (render/hostside.py): every hostside module, byte-identical across builds, so a re-run
    of site.yml copies nothing (changed=0) and a host's copy changes only when the code does."""
    from pdstack.controller.render import hostside
    a, b = tmp_path / "a" / hostside.FILENAME, tmp_path / "b" / hostside.FILENAME
    sha = hostside.build(a)
    assert hostside.build(b) == sha == hashlib.sha256(a.read_bytes()).hexdigest()
    assert a.read_bytes() == b.read_bytes()
    mtime = a.stat().st_mtime_ns
    assert hostside.build(a) == sha and a.stat().st_mtime_ns == mtime  # same bytes: the file is left as it is
    with zipfile.ZipFile(a) as z:
        names = z.namelist()
        assert names == sorted(names)
        assert {i.date_time for i in z.infolist()} == {(1980, 1, 1, 0, 0, 0)}
        assert {i.external_attr >> 16 for i in z.infolist()} == {0o100644}
    hostside_files = {f"pdstack/hostside/{p.name}" for p in (ROOT / "pdstack" / "hostside").glob("*.py")}
    assert set(names) == {"__main__.py", "pdstack/__init__.py"} | hostside_files
    assert hostside_files == ALLOWED["hostside"] - {"pdstack/__init__.py"}, "a new hostside module: list it above"


@pytest.mark.skipif(SYSTEM_PYTHON is None, reason="no system python3 in /usr/bin (the host interpreter under test)")
def test_each_command_of_the_artifact_runs_under_an_isolated_system_python(tmp_path):
    """What the roles and units run: `python3 -I pdstack-hostside.pyz COMMAND`, with nothing of pdstack on sys.path
    (cwd /, -I). Each command's --help, and the facts script's JSON."""
    from pdstack.controller.render import hostside
    from pdstack.hostside.__main__ import COMMANDS
    pyz = tmp_path / hostside.FILENAME
    hostside.build(pyz)

    def run(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([SYSTEM_PYTHON, "-I", str(pyz), *args], capture_output=True, text=True, timeout=60,
                              cwd="/")
    top = run("--help")
    assert top.returncode == 0, top.stderr
    assert set(COMMANDS) == {"facts", "probe", "drain", "watchdog", "restart-unit", "model-fetch", "status-collect"}
    for name in COMMANDS:
        assert name in top.stdout
        r = run(name, "--help")
        assert r.returncode == 0 and r.stdout.startswith("usage:"), (name, r.stdout[-500:], r.stderr[-2000:])
    assert run("nonesuch").returncode == 2
    facts = json.loads(run("facts", "--simulate-gpus", "2").stdout)
    assert facts["numa_nodes"] and len(facts["gpus"]) == 2 and "error" not in facts, facts
    # the forced command refuses anything but `restart <a unit of this host's plan>`, without a plan file too
    refused = subprocess.run([SYSTEM_PYTHON, "-I", str(pyz), "restart-unit"], capture_output=True, text=True,
                             timeout=60, cwd="/", env={"SSH_ORIGINAL_COMMAND": "sh -c id"})
    assert refused.returncode == 2 and "pdstack restart-unit:" in refused.stderr, refused.stderr


def test_status_runs_the_artifacts_collector():
    # `pdstack status` ships the collector each run (`ansible -m script`, a temporary copy): no role installs it
    from pdstack.controller.render import hostside
    from pdstack.controller.status import status
    assert status.collector("inventory/local") == ROOT / "build" / "state" / "local" / hostside.FILENAME
    cmd = json.loads(status.ansible_command("inventory/local")[-1])["cmd"]
    assert cmd.startswith(f"{status.collector('inventory/local')} status-collect "), cmd


def test_drain_wait_needs_nothing_in_flight_on_two_polls_in_a_row(monkeypatch):
    """A request the router sent just before `drain.py out` shows up in the server's gauges a moment after an
    idle reading: one zero then a restart would cut it off (a 502 seen under the whole suite's load). wait_drained
    takes QUIET_POLLS zeros in a row; a busy reading between zeros starts the count again."""
    from pdstack.hostside import drain

    readings = iter([0.0, 1.0, 0.0, None, 0.0, 0.0, 5.0])
    monkeypatch.setattr(drain, "in_flight", lambda url, gauges: next(readings))
    monkeypatch.setattr(drain, "POLL_S", 0.0)
    assert drain.QUIET_POLLS == 2
    out = drain.wait_drained("http://unused/metrics", "server", timeout=60)
    assert out == {"changed": False, "drained": True, "polls": 6, "in_flight": 0.0}, out
    # never two in a row before the timeout: not drained, the last reading reported
    readings = iter([0.0, 3.0] * 1000)
    monkeypatch.setattr(drain, "POLL_S", 0.001)
    out = drain.wait_drained("http://unused/metrics", "server", timeout=0.05)
    assert out["drained"] is False and out["polls"] == 0, out
