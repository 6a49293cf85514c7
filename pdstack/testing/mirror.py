"""The local model mirror: Debian's nginx on the controller serving the sim's model directory over HTTP.

The local demo (`invoke demo`) and the tests start it; the sim inventories' model phase fetches from it
(pdstack_model.source.url: http://pdstack-controller:8089/pdstack-sim, the name every test host maps to the
controller, pdstack/testing/testhost/hosts.py). `ensure()` is idempotent and safe from two xdist workers at once
(a file lock): it writes build/model-mirror/pdstack-sim (pdstack/testing/sim/modeldir.py), then starts nginx unless
one already answers on the port. nginx stays up after the run, like dockerd; `stop()` ends it.

Two locations: /pdstack-sim/ as fast as the machine allows, and /slow/pdstack-sim/ at SLOW_RATE bytes/s per
connection (nginx limit_rate), so a test can kill a transfer half-way through the largest shard.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import signal
import subprocess
import time
import urllib.request
from pathlib import Path

from pdstack.testing.sim import modeldir

ROOT = Path(__file__).resolve().parents[2]
MIRROR = ROOT / "build" / "model-mirror"
PORT = 8089  # inventory/local and inventory/test name it in pdstack_model.source.url
SLOW_RATE = 1 << 20  # bytes/s: the 8 MiB shard takes ~8 s on /slow/
HOST_NAME = "pdstack-controller"  # how test hosts reach this machine (extra_hosts: host-gateway)
NGINX = shutil.which("nginx", path="/usr/sbin:/usr/bin:/sbin:/bin") or "/usr/sbin/nginx"


class MirrorError(RuntimeError):
    pass


def url(host: str = HOST_NAME, slow: bool = False) -> str:
    return f"http://{host}:{PORT}/{'slow/' if slow else ''}{modeldir.NAME}"


def _conf(state: Path) -> str:
    user = "user root root;\n" if os.geteuid() == 0 else ""  # workers read the checkout, wherever it lives
    return (f"{user}worker_processes 1;\npid {state}/nginx.pid;\nerror_log {state}/error.log warn;\n"
            "events { worker_connections 256; }\n"
            "http {\n"
            f"  access_log {state}/access.log;\n"
            "  sendfile on;\n"
            f"  server {{\n    listen 0.0.0.0:{PORT};\n    root {MIRROR / 'www'};\n"
            f"    location /slow/ {{ alias {MIRROR / 'www'}/; limit_rate {SLOW_RATE}; }}\n"
            "  }\n}\n")


def _answers() -> bool:
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{PORT}/{modeldir.NAME}/config.json", timeout=2) as r:
            return r.status == 200
    except OSError:
        return False


def _ours(state: Path) -> bool:
    """Whether the nginx this checkout started (its pid file) still runs."""
    try:
        os.kill(int((state / "nginx.pid").read_text().strip()), 0)
    except (OSError, ValueError):
        return False
    return True


def ensure() -> str:
    """Write the mirror's files and make sure nginx serves them; returns the URL from the controller itself."""
    state = MIRROR / "nginx"
    state.mkdir(parents=True, exist_ok=True)
    with open(MIRROR / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        modeldir.write(MIRROR / "www" / modeldir.NAME)
        if _answers():
            if _ours(state):
                return url("127.0.0.1")
            raise MirrorError(f"port {PORT} already serves a model mirror, but not this checkout's nginx "
                              f"({state}/nginx.pid): another checkout's? Stop it (kill the nginx that "
                              f"`ss -ltnp 'sport = :{PORT}'` names), then run again")
        if not Path(NGINX).exists():
            raise MirrorError("nginx is not installed: apt-get install nginx (./dev.sh setup installs it)")
        conf = state / "nginx.conf"
        conf.write_text(_conf(state))
        r = subprocess.run([NGINX, "-p", str(state), "-c", str(conf)], capture_output=True, text=True, timeout=30)
        if r.returncode != 0:
            raise MirrorError(f"nginx did not start on port {PORT}: {r.stderr.strip()}; free the port (ss -ltnp "
                              f"'sport = :{PORT}')")
        deadline = time.monotonic() + 10
        while not _answers():
            if time.monotonic() > deadline:
                raise MirrorError(f"nginx started but does not serve {url('127.0.0.1')}; see {state}/error.log")
            time.sleep(0.1)
    return url("127.0.0.1")


def stop() -> None:
    pid = MIRROR / "nginx" / "nginx.pid"
    if pid.exists():
        try:
            os.kill(int(pid.read_text().strip()), signal.SIGQUIT)
        except (ProcessLookupError, ValueError):
            pass
