"""Pinned versions, read from requirements/ (one source), and the default base of each flavor (images/bases.yaml)."""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

from pdstack.controller.imagebuild.common import IMAGES, ROOT, BuildError


def pin(path: Path, name: str) -> str:
    """The exact version `path` pins for `name` (`name==X`)."""
    for line in path.read_text().splitlines():
        m = re.match(rf"^{re.escape(name)}==(\S+)", line.strip(), re.IGNORECASE)
        if m:
            return m.group(1)
    raise BuildError(f"{path} pins no {name}: add `{name}==<version>`")


def pins_only(path: Path) -> str:
    """`path`'s `name==version` lines without their hashes: a constraints file for pip (a hash in a constraints
    file puts pip in hash-checking mode for every requirement, so a download of packages the lock lacks fails)."""
    pin_line = re.compile(r"^([A-Za-z0-9][^\s\\]*==\S+)")
    pins = [m.group(1) for line in path.read_text().splitlines() if (m := pin_line.match(line))]
    return "".join(f"{p}\n" for p in pins)


def hash_local_wheels(lock: str, find_links: list[Path]) -> tuple[str, list[str]]:
    """Add `--hash` lines to the pins of `lock` (uv pip compile output) that have none: uv hashes what an index
    publishes, not the wheels of a local find-links folder (the CPU torch). Returns (text, pins still unhashed)."""
    out, unhashed = [], []
    for line in lock.splitlines():
        m = re.match(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)$", line)
        if not m:
            out.append(line)
            continue
        name, version = m.groups()
        stem = f"{re.sub(r'[-_.]+', '_', name)}-{version}-".lower()
        wheels = sorted(w for d in find_links if d.is_dir() for w in d.glob("*.whl") if w.name.lower().startswith(stem))
        if not wheels:
            unhashed.append(f"{name}=={version}")
            out.append(line)
            continue
        hashes = sorted({hashlib.sha256(w.read_bytes()).hexdigest() for w in wheels})
        out.append(f"{line} \\")
        out += [f"    --hash=sha256:{h}" + (" \\" if i < len(hashes) - 1 else "") for i, h in enumerate(hashes)]
    return "\n".join(out) + "\n", unhashed


def sglang_version() -> str:
    return pin(ROOT / "requirements" / "sglang.txt", "sglang")


def router_version() -> str:
    return pin(ROOT / "requirements" / "lock.txt", "sglang-router")


def torch_version() -> str:
    return pin(ROOT / "requirements" / "lock.txt", "torch")


def default_series_dir() -> Path:
    return ROOT / "kernels" / "patches" / f"sglang-{sglang_version()}"


def default_base(flavor: str) -> str:
    """images/bases.yaml's entry for the flavor (locked / local / an image reference)."""
    import yaml

    bases = yaml.safe_load((IMAGES / "bases.yaml").read_text()) or {}
    ref = str(bases.get(flavor) or "").strip()
    if not ref:
        raise BuildError(f"images/bases.yaml has no base for flavor {flavor!r}: add "
                         f"`{flavor}: locked` (prod), `local` (sim) or a reference")
    return ref
