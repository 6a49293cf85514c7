"""The host-side wheel cache and pure wheels of our own code.

Wheels are downloaded on the host (its pip sees the local find-links and CA settings; containers cannot reach PyPI)
into build/wheels/<set>-<hash>/ and installed in the image with --no-index.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from pdstack.controller.imagebuild.common import BUILD_DIR, ROOT, BuildError, digest, echo, sha256_file

WHEEL_CACHE = BUILD_DIR / "wheels"


def download_wheels(name: str, requirements: list[str], *, no_deps: list[str] = ()) -> tuple[Path, dict[str, str]]:
    """pip-download `requirements` (constrained by requirements/lock.txt) and `no_deps` into a cached folder.

    Returns (folder, {wheel file: sha256}). The folder is keyed by the request + lock.txt, so a second call
    downloads nothing; its `wheels.json` lists what it holds.
    """
    lock = ROOT / "requirements" / "lock.txt"
    key = digest({"req": requirements, "no_deps": list(no_deps), "lock": sha256_file(lock)})[:12]
    folder = WHEEL_CACHE / f"{name}-{key}"
    index = folder / "wheels.json"
    if index.is_file():
        return folder, json.loads(index.read_text())
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=WHEEL_CACHE))
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(tmp)]
    echo(f"wheels: downloading {name} ({', '.join(requirements + list(no_deps))}) on the host")
    for args in ([*pip, "-c", str(lock), *requirements] if requirements else None,
                 [*pip, "--no-deps", *no_deps] if no_deps else None):
        if not args:
            continue
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError(f"pip download failed ({' '.join(args[3:])}):\n{r.stderr[-2000:]}\n"
                             "Fix: the host's pip must reach PyPI or a find-links folder holding these wheels "
                             "(see /etc/pip.conf)")
    wheels = {p.name: sha256_file(p) for p in sorted(tmp.glob("*.whl"))}
    (tmp / "wheels.json").write_text(json.dumps(wheels, indent=1) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder, wheels


def link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


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
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(work)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"building a wheel of {src} failed:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    return next(out.glob("*.whl"))
