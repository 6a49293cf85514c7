"""The prod image's SBOM: CycloneDX 1.6 JSON by cyclonedx-py (CycloneDX's own Python tool), one component per
installed distribution with its version and the sha256 of the exact wheel the image installed.

The locked base installs requirements/prod-image.lock with --require-hashes from the host's wheel cache, so the
cache's wheel of each locked version *is* what the image holds; cyclonedx-py reads a requirements file naming each
with that one hash (the lock itself lists every platform's hashes). Cached per lock: build/sbom/prod-<lock>.cdx.json.
Where the image exists but this checkout's cache does not (a fresh clone on a host that already has the image), the
cache is filled from the lock first: the same hash-checked download the base build made, so the same wheels.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild import wheels as wheel_cache
from pdstack.controller.imagebuild.common import BUILD_DIR, BuildError, echo, rel, sha256_file

_ENTRY = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)")
_HASH = re.compile(r"--hash=sha256:([0-9a-f]{64})")


def _norm(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def locked(lock: Path) -> dict[str, tuple[str, set[str]]]:
    """{normalized name: (version, {allowed sha256})} of a `uv pip compile --generate-hashes` file."""
    out: dict[str, tuple[str, set[str]]] = {}
    current = None
    for line in lock.read_text().splitlines():
        if m := _ENTRY.match(line):
            current = _norm(m.group(1))
            out[current] = (m.group(2), set())
        elif not line.startswith(" "):
            current = None
        if current and (h := _HASH.search(line)):
            out[current][1].add(h.group(1))
    return out


def installed_wheels(lock: Path, wheels: Path) -> dict[str, tuple[str, str, str]]:
    """{name: (version, wheel file, sha256)}: for each locked distribution, the cached wheel that matches its hash."""
    want = locked(lock)
    found: dict[str, tuple[str, str, str]] = {}
    for w in sorted(wheels.glob("*.whl")):
        name, version = w.name.split("-")[:2]
        key = _norm(name)
        if key in want and want[key][0] == version:
            digest = sha256_file(w)
            if digest in want[key][1]:
                found[key] = (version, w.name, digest)
    missing = sorted(set(want) - set(found))
    if missing:
        raise BuildError(f"the wheel cache {wheels} lacks the locked wheel of: {', '.join(missing)}\n"
                         "Fix: invoke build fills it (pip download --require-hashes); remove the folder to refill it")
    return found


def _tool() -> str:
    exe = Path(sys.executable).parent / "cyclonedx-py"
    found = str(exe) if exe.exists() else shutil.which("cyclonedx-py")
    if not found:
        raise BuildError("cyclonedx-py is not installed\nFix: ./dev.sh setup (cyclonedx-bom: requirements/lock.txt)")
    return found


def write_sbom(lock: Path, wheels: Path) -> dict[str, Any]:
    """The SBOM of what `lock` installed from `wheels` (cached per lock); {path, sha256, format, components}."""
    out = BUILD_DIR / "sbom" / f"prod-{sha256_file(lock)[:16]}.cdx.json"
    if not out.is_file():
        out.parent.mkdir(parents=True, exist_ok=True)
        try:
            found = installed_wheels(lock, wheels)
        except BuildError:
            wheel_cache.download_locked(lock, wheels)
            found = installed_wheels(lock, wheels)
        req = out.with_suffix(".requirements.txt")
        req.write_text("".join(f"{n}=={v} --hash=sha256:{h}  # {f}\n" for n, (v, f, h) in sorted(found.items())))
        r = subprocess.run([_tool(), "requirements", str(req), "--of", "JSON", "--sv", "1.6", "-o", str(out)],
                           capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"cyclonedx-py failed:\n{r.stderr[-2000:]}")
        echo(f"SBOM: {rel(out)} ({len(found)} components, CycloneDX 1.6)")
    doc = json.loads(out.read_text())
    return {"path": rel(out), "sha256": sha256_file(out), "format": f"CycloneDX {doc.get('specVersion')} JSON",
            "components": len(doc.get("components", [])), "tool": "cyclonedx-py (cyclonedx-bom 7.5.0)"}
