"""How Ansible reaches the test hosts: over SSH, as it reaches production hosts.

The connection variables live in one file, inventory/test/common/group_vars/all/connection.yml (the local demo's
inventory links to it; `inventory_for()` reads it): Ansible's `ssh` connection, pipelining and a ControlPersist
master per host, whose ProxyCommand (ssh_connect.py) finds the container's bridge address through the controller's
Docker, since the hosts' names resolve only inside their network. A task costs one multiplexed ssh channel on a
running master instead of a `docker exec` (docker CLI, dockerd, containerd, runc) of its own, which costs the
machine less CPU per task (docs/log.md, "The test hosts over SSH", has the figures).

The key is the checkout's own, made once here (build/testhost/ssh/id_ed25519, never committed), and `up()`
authorizes it for root on every host it boots or finds. Host keys are not checked (StrictHostKeyChecking=no in
connection.yml): the hosts are rebuilt all the time, and the address comes from the local Docker.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import time
from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild.common import ROOT
from pdstack.testing.testhost.common import TesthostError

KEY_DIR = ROOT / "build" / "testhost" / "ssh"
KEY = KEY_DIR / "id_ed25519"
# as connection.yml's ansible_ssh_args name it (ssh computes %C from this machine, the host, port 22 and root)
CONTROL_DIR = Path.home() / ".ansible" / "cp"
CONTROL_PATH = str(CONTROL_DIR / "pdstack-%C")
CONNECTION_VARS = ROOT / "inventory" / "test" / "common" / "group_vars" / "all" / "connection.yml"

# Appends the key (in $KEY, never on a command line) to root's authorized_keys unless that line is there already.
_AUTHORIZE = (
    'umask 077; mkdir -p /root/.ssh; f=/root/.ssh/authorized_keys; touch "$f"; '
    'grep -qxF "$KEY" "$f" || printf "%s\\n" "$KEY" >> "$f"'
)


def connection_vars() -> dict[str, Any]:
    """The Ansible variables that reach a test host (connection.yml)."""
    import yaml

    return yaml.safe_load(CONNECTION_VARS.read_text())


def ensure_key(key: Path = KEY) -> str:
    """The controller's public key for the test hosts; the key pair is made on first use (ssh-keygen, ed25519, no
    passphrase), under a lock so test workers booting hosts at once make one."""
    key.parent.mkdir(parents=True, exist_ok=True)
    CONTROL_DIR.mkdir(mode=0o700, parents=True, exist_ok=True)  # ssh makes no directory for its ControlPath
    pub = key.with_name(key.name + ".pub")
    with open(key.parent / ".lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (key.exists() and pub.exists()):
            tmp = key.with_name(f".{key.name}.{os.getpid()}")
            for p in (tmp, tmp.with_name(tmp.name + ".pub")):
                p.unlink(missing_ok=True)
            try:
                subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", "pdstack test hosts",
                                "-f", str(tmp)], check=True, capture_output=True, text=True, timeout=60)
            except FileNotFoundError:
                raise TesthostError("ssh-keygen is not installed: the test hosts are reached over SSH\n"
                                    "Fix: ./dev.sh setup (or apt-get install openssh-client)") from None
            except subprocess.CalledProcessError as e:
                raise TesthostError(f"ssh-keygen failed making {key}: {e.stderr.strip()}") from None
            os.replace(tmp.with_name(tmp.name + ".pub"), pub)
            os.replace(tmp, key)
    return pub.read_text().strip()


def close_masters(names: list[str]) -> None:
    """Ask the ssh ControlPersist master of each host in `names` to exit (connection.yml's ControlPath; `down` calls
    this before it removes them): a master outlives its host's container by up to ControlPersist, holding a TCP
    connection nothing answers, and a new host of the same name would get the same socket. No master: nothing to do."""
    if not names or shutil.which("ssh") is None:
        return

    def mux(op: str, name: str) -> int:
        return subprocess.run(["ssh", "-o", f"ControlPath={CONTROL_PATH}", "-O", op, "-l", "root", "-p", "22", name],
                              capture_output=True, timeout=30, check=False).returncode

    for name in names:
        if mux("exit", name) != 0:
            continue  # no master
        # "exit" is only sent: wait (briefly) until the master has gone and taken its socket along
        deadline = time.monotonic() + 10
        while mux("check", name) == 0 and time.monotonic() < deadline:
            time.sleep(0.05)


def authorize(container, public_key: str) -> None:
    """Add `public_key` to root's authorized_keys on a running host (once; a second call changes nothing)."""
    res = container.exec_run(["sh", "-c", _AUTHORIZE], environment={"KEY": public_key})
    if res.exit_code != 0:
        out = (res.output or b"").decode(errors="replace").strip()
        raise TesthostError(f"could not authorize the controller's ssh key on {container.name}: {out}")
