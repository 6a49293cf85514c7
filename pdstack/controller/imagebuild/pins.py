"""Pinned versions, read from requirements/ (one source), and the default base of each flavor (images/bases.yaml)."""

from __future__ import annotations

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


def sglang_version() -> str:
    return pin(ROOT / "requirements" / "sglang.txt", "sglang")


def router_version() -> str:
    return pin(ROOT / "requirements" / "lock.txt", "sglang-router")


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
