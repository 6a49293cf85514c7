"""The Docker engine: a pinged client, image_exists, and the classic-builder `docker build` streamer."""

from __future__ import annotations

import collections
import os
import re
import sys
import threading
import time
from pathlib import Path

from pdstack.controller.imagebuild.common import BuildError, echo

SETUP_HINT = "run ./dev.sh setup"


def client():
    """A docker SDK client that has answered a ping, or a BuildError that says how to get one."""
    import docker
    from docker.errors import DockerException

    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        c = docker.from_env(timeout=120)
        c.ping()
    except DockerException as e:
        hint = SETUP_HINT + " (it installs docker.io and starts dockerd)"
        if "Permission denied" in str(e):
            hint = "run as root, or add this user to the docker group"
        raise BuildError(f"cannot reach the Docker engine at {where}: {e}\nFix: {hint}") from e
    return c


def image_exists(c, ref: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        c.images.get(ref)
        return True
    except ImageNotFound:
        return False


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def docker_build(c, context: Path, tag: str, buildargs: dict[str, str], what: str) -> None:
    """Classic-builder build of `context` as `tag`; streams step lines with elapsed time and a heartbeat."""
    t0 = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=60)
    state = {"step": "sending context", "since": t0, "done": False}

    def heartbeat() -> None:
        while not state["done"]:
            time.sleep(15)
            if not state["done"] and time.monotonic() - state["since"] >= 15:
                echo(f"{what}: {time.monotonic() - t0:4.0f} s  still on {state['step']} "
                     f"({time.monotonic() - state['since']:.0f} s)")

    threading.Thread(target=heartbeat, daemon=True).start()
    echo(f"{what}: docker build {tag} (context {du(context) / 1e6:.0f} MB)")
    error = None
    try:
        for chunk in c.api.build(path=str(context), tag=tag, buildargs=buildargs, rm=True, forcerm=True,
                                 pull=False, decode=True, timeout=3600):
            if "error" in chunk:
                error = chunk["error"].strip()
                continue
            text = chunk.get("stream", "")
            for line in _ANSI.sub("", text).splitlines():
                line = line.rstrip()
                if not line or line.startswith(" ---> ") or line.startswith("Removing intermediate"):
                    continue
                tail.append(line)
                if line.startswith("Step "):
                    state["step"], state["since"] = line.split(" :", 1)[0], time.monotonic()
                    echo(f"{what}: {time.monotonic() - t0:4.0f} s  {line[:150]}")
                elif not line.startswith("Successfully"):
                    print(f"    {line}", file=sys.stderr, flush=True)
    except Exception as e:  # docker.errors.APIError / BuildError / connection errors
        error = error or f"{type(e).__name__}: {e}"
    finally:
        state["done"] = True
    if error:
        last = "\n".join(tail)
        raise BuildError(f"{what} failed at {state['step']}: {error}\nlast output:\n{last}")
    echo(f"{what}: built {tag} in {time.monotonic() - t0:.0f} s")


def du(path: Path) -> int:
    """Bytes under `path` (the build context's size)."""
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())
