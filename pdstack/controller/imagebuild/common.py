"""What every imagebuild module shares: paths, the error type, progress output, hashing, the build locks."""

from __future__ import annotations

import contextlib
import hashlib
import json
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pdstack.controller.locks import exclusive
from pdstack.errors import PdstackError

ROOT = Path(__file__).resolve().parents[3]
IMAGES = ROOT / "images"
BUILD_DIR = ROOT / "build"
LOCK_DIR = Path("/run/lock")
LABEL_PREFIX = "io.pdstack"

FLAVORS = ("prod", "sim")
REPOS = {"prod": "pdstack/sglang", "sim": "pdstack/sim"}
PYBASE_REPO = "pdstack/pybase"
CUDA_ARCHS = ("sm_120a",)


class BuildError(PdstackError):
    """An image could not be built, found, saved or pushed; the message says how to fix it."""

    exit_code = 5


def echo(msg: str) -> None:
    """Progress for people, on stderr (stdout stays free for machine output)."""
    print(f"[build] {msg}", file=sys.stderr, flush=True)


def sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def digest(obj: Any) -> str:
    """sha256 of a JSON-able object (keys sorted): the tag of a recipe."""
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def rel(p: Path) -> str:
    """`p` relative to the repository root when it is inside it."""
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def lock(name: str, say=echo):
    """One build of `name` at a time on this machine (CI and engineers share one engine): /run/lock/pdstack-NAME.lock"""
    return exclusive(LOCK_DIR / f"pdstack-{name}.lock", f"{name} build", say)


@contextlib.contextmanager
def context_dir() -> Iterator[Path]:
    """A docker build context: a temporary directory under build/ (made first: a fresh clone has none), removed
    after the build."""
    BUILD_DIR.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="pdstack-ctx-", dir=BUILD_DIR) as tmp:
        yield Path(tmp)
