"""How Ansible reaches the test hosts: over SSH, as it reaches production hosts, with `docker exec` as the transport.

The connection variables live in one file, inventory/test/common/group_vars/all/connection.yml (the local demo's
inventory links to it; `inventory_for()` reads it): Ansible's `ssh` connection, pipelining and a ControlPersist
master per host, whose ProxyCommand is `docker exec -i HOST /usr/sbin/sshd -i` (sshd in inetd mode, on that pipe).
So the hosts need no address the controller can resolve, and a task costs one multiplexed ssh channel on a running
master instead of a `docker exec` (docker CLI, dockerd, containerd, runc) of its own: measured on a test host (2
cores), 40 `stat` tasks took 10.1 s of machine CPU through community.docker.docker and 7.4-8.1 s this way
(docs/testing.md, "The test hosts over SSH").

The key is the checkout's own, made once here (build/testhost/ssh/id_ed25519, never committed), and `up()`
authorizes it for root on every host it boots or finds. Host keys are not checked (StrictHostKeyChecking=no in
connection.yml): the transport is the local Docker socket, which already names the container, not a network.
"""

from __future__ import annotations

import fcntl
import os
import subprocess
from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild.common import ROOT
from pdstack.testing.testhost.common import TesthostError

KEY_DIR = ROOT / "build" / "testhost" / "ssh"
KEY = KEY_DIR / "id_ed25519"
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


def authorize(container, public_key: str) -> None:
    """Add `public_key` to root's authorized_keys on a running host (once; a second call changes nothing)."""
    res = container.exec_run(["sh", "-c", _AUTHORIZE], environment={"KEY": public_key})
    if res.exit_code != 0:
        out = (res.output or b"").decode(errors="replace").strip()
        raise TesthostError(f"could not authorize the controller's ssh key on {container.name}: {out}")
