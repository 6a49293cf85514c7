"""The host-side wheel cache and pure wheels of our own code.

Wheels are downloaded on the host (its pip sees the local find-links and CA settings; containers cannot reach PyPI)
into build/wheels/<set>-<hash>/ and installed in the image with --no-index.
"""

from __future__ import annotations

import contextlib
import functools
import http.server
import ipaddress
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

from pdstack.controller.imagebuild.common import BUILD_DIR, ROOT, BuildError, digest, echo, sha256_file
from pdstack.controller.imagebuild.common import lock as machine_lock
from pdstack.controller.imagebuild.pins import pins_only

WHEEL_CACHE = BUILD_DIR / "wheels"


def download_wheels(name: str, requirements: list[str], *, no_deps: list[str] = ()) -> tuple[Path, dict[str, str]]:
    """pip-download `requirements` (constrained by requirements/lock.txt) and `no_deps` into a cached folder.

    Returns (folder, {wheel file: sha256}). The folder is keyed by the request + lock.txt, so a second call
    downloads nothing; its `wheels.json` lists what it holds.
    """
    pins = ROOT / "requirements" / "lock.txt"
    key = digest({"req": requirements, "no_deps": list(no_deps), "lock": sha256_file(pins)})[:12]
    folder = WHEEL_CACHE / f"{name}-{key}"
    index = folder / "wheels.json"
    if index.is_file():
        return folder, json.loads(index.read_text())
    # one download per folder at a time: two test workers building the sim image at once on a cold machine would
    # each download, and the second would replace the folder the first one's build reads its wheels from
    with machine_lock(f"wheels-{name}-{key}"):
        if index.is_file():
            return folder, json.loads(index.read_text())
        return _download(name, requirements, no_deps, pins, folder)


def _download(name: str, requirements: list[str], no_deps, lock: Path, folder: Path) -> tuple[Path, dict[str, str]]:
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=WHEEL_CACHE))
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(tmp)]
    echo(f"wheels: downloading {name} ({', '.join(requirements + list(no_deps))}) on the host")
    constraints = tmp / "constraints.txt"  # the lock's versions; its hashes would hold every download to the lock
    constraints.write_text(pins_only(lock))
    for args in ([*pip, "-c", str(constraints), *requirements] if requirements else None,
                 [*pip, "--no-deps", *no_deps] if no_deps else None):
        if not args:
            continue
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError(f"pip download failed ({' '.join(args[3:])}):\n{r.stderr[-2000:]}\n"
                             "Fix: the host's pip must reach PyPI or a find-links folder holding these wheels "
                             "(see /etc/pip.conf)")
    constraints.unlink()
    wheels = {p.name: sha256_file(p) for p in sorted(tmp.glob("*.whl"))}
    (tmp / "wheels.json").write_text(json.dumps(wheels, indent=1) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder, wheels


def pep508(wheel: str) -> str:
    """'torch-2.13.0+cpu-cp311-...whl' -> 'torch==2.13.0+cpu'."""
    name, version = wheel.split("-")[:2]
    return f"{name}=={version}"


def build_wheel(src: Path, items: tuple[str, ...], out: Path) -> Path:
    """A pure wheel of the project at `src` (pdstack or kernels/), built on the host from a copy of `items` only
    (paths relative to `src`: files or folders)."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build", "*.egg-info", ".pytest_cache")
    with tempfile.TemporaryDirectory(prefix="pdstack-wheel-") as tmp:
        work = Path(tmp) / "src"
        work.mkdir()
        for item in items:
            (work / item).parent.mkdir(parents=True, exist_ok=True)
            if (src / item).is_dir():
                shutil.copytree(src / item, work / item, ignore=ignore)
            else:
                shutil.copy2(src / item, work / item)
        # SOURCE_DATE_EPOCH: the same sources give the same wheel bytes, so the image's COPY of it stays cached
        # (and every layer after it).
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(work)], capture_output=True, text=True,
                           env={**os.environ, "SOURCE_DATE_EPOCH": "315532800"})
        if r.returncode != 0:
            raise BuildError(f"building a wheel of {src} failed:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    return next(out.glob("*.whl"))


def download_locked(lock: Path, folder: Path) -> dict[str, float]:
    """Fill `folder` with every wheel of the hash-locked `lock` (pip download --require-hashes --no-deps).

    pip keeps a file that is already there and matches its hash, so a filled cache downloads nothing more.
    Returns {"seconds", "bytes"} of the folder afterwards.
    """
    with machine_lock(f"wheels-{folder.name}"):  # one pip download into a folder at a time
        return _download_locked(lock, folder)


def _download_locked(lock: Path, folder: Path) -> dict[str, float]:
    folder.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    echo(f"wheels: filling {rel_or_abs(folder)} from {lock.name} on the host (pip download --require-hashes)")
    args = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--require-hashes", "--only-binary", ":all:",
            "-d", str(folder), "-r", str(lock)]
    r = subprocess.run(args, capture_output=True, text=True)
    if r.returncode != 0:
        err = "\n".join(ln for ln in r.stderr.splitlines() if not ln.startswith("WARNING: Location"))
        raise BuildError(f"pip download of {lock} failed:\n{err[-3000:]}\n"
                         "Fix: the host's pip must reach PyPI (see /etc/pip.conf); after editing "
                         "requirements/prod-image.in run `invoke lock.prod-image`")
    size = sum(p.stat().st_size for p in folder.glob("*.whl"))
    echo(f"wheels: {len(list(folder.glob('*.whl')))} wheels, {size / 1e9:.2f} GB, in {time.monotonic() - t0:.0f} s")
    return {"seconds": round(time.monotonic() - t0, 1), "bytes": size}


def rel_or_abs(p: Path) -> str:
    try:
        return str(p.relative_to(ROOT))
    except ValueError:
        return str(p)


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, format, *args):  # noqa: A002 - the base class's signature
        pass


WHEELS_PORT = 47623  # fixed, so a retried build finds the install layer in its cache (the URL is a build arg)


@contextlib.contextmanager
def serve_wheels(c, folder: Path) -> Iterator[str]:
    """Serve `folder` read-only over HTTP on the docker bridge's gateway address, for `pip --find-links` in a build.

    The wheels never enter the build context nor a layer; the server listens only while the build runs."""
    ipam = c.networks.get("bridge").attrs["IPAM"]["Config"][0]
    # The default bridge often reports only its subnet; its gateway (docker0) is then the subnet's first address.
    gateway = ipam.get("Gateway") or str(next(ipaddress.ip_network(ipam["Subnet"]).hosts()))
    handler = functools.partial(_QuietHandler, directory=str(folder))
    try:
        server = http.server.ThreadingHTTPServer((gateway, WHEELS_PORT), handler)
    except OSError:
        server = http.server.ThreadingHTTPServer((gateway, 0), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://{gateway}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
