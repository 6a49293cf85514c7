"""pdstack/hostside and pdstack/image run outside the venv: each imports under `python3 -I -S`, stdlib only.

hostside/ runs on a host with the host's python3 (facts.d script, watchdog timer); image/ runs inside the production
image at build time with the image's python3 before anything of ours is installed there. A module that picks up a
venv package (yaml, aiohttp, ...) or a controller module would work in tests and break on the host: this catches it.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SYSTEM_PYTHON = shutil.which("python3", path="/usr/bin:/bin")

# Which pdstack files each rule allows (the package root and errors.py are stdlib-only and shared).
ALLOWED = {
    "hostside": {"pdstack/__init__.py", "pdstack/hostside/__init__.py", "pdstack/hostside/facts.py",
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


def test_every_hostside_module_is_installed_by_its_role():
    # roles/watchdog copies probe, watchdog and watchdog_state; roles/facts links facts.py. A new hostside module
    # needs a role to ship it.
    shipped = (ROOT / "roles" / "watchdog" / "tasks" / "install.yml").read_text()
    for mod in ("probe", "watchdog", "watchdog_state"):
        assert f"hostside/{mod}.py" in shipped
    # roles/watchdog_access copies restart_unit (the forced command of the watchdog's key on serving hosts)
    assert "pdstack/hostside/restart_unit.py" in (ROOT / "roles/watchdog_access/tasks/authorize.yml").read_text()
    fact = ROOT / "roles" / "facts" / "files" / "pdstack.fact"
    assert fact.resolve() == (ROOT / "pdstack" / "hostside" / "facts.py").resolve()
    # roles/serving copies drain (the rolling restart's steps) onto the serving hosts and the router host
    for tasks in ("configure.yml", "restart.yml"):
        assert "pdstack/hostside/drain.py" in (ROOT / "roles/serving/tasks" / tasks).read_text(), tasks
    # `pdstack status` ships status_collect.py itself, each run (`ansible -m script`): no role installs it
    from pdstack.controller.status import status
    assert status.COLLECTOR == ROOT / "pdstack" / "hostside" / "status_collect.py"
    assert json.loads(status.ansible_command("inventory/local")[-1])["cmd"].startswith(str(status.COLLECTOR) + " ")
    # roles/model installs the fetcher and its two siblings (the package tree, as the watchdog's)
    model = (ROOT / "roles" / "model" / "tasks" / "main.yml").read_text()
    for mod in ("model_fetch", "model_store", "model_source"):
        assert f"hostside/{mod}.py" in model, mod
    hostside = {"__init__.py", "facts.py", "probe.py", "watchdog.py", "watchdog_state.py", "restart_unit.py",
                "drain.py", "status_collect.py", "model_fetch.py", "model_store.py", "model_source.py"}
    assert {p.name for p in (ROOT / "pdstack" / "hostside").glob("*.py")} == hostside, sys.version


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
