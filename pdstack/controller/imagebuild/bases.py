"""The bases the flavors build FROM: the python base (debootstrap), our locked CUDA base, or an image reference.

    ensure_pybase()         local Debian bookworm + Python base (rootfs.py); built once, then found by tag
    ensure_locked_base()    the prod default: pybase + requirements/prod-image.lock (images/base-sglang)
    resolve_base(c, flavor, base)   --base (or images/bases.yaml) -> a reference present on this machine
"""

from __future__ import annotations

import shutil

from pdstack.controller.imagebuild.common import (
    IMAGES,
    LABEL_PREFIX,
    PYBASE_REPO,
    ROOT,
    BuildError,
    context_dir,
    digest,
    echo,
    lock,
    sha256_file,
)
from pdstack.controller.imagebuild.engine import client, docker_build, image_exists
from pdstack.controller.imagebuild.pins import default_base
from pdstack.controller.imagebuild.rootfs import ensure_rootfs_image
from pdstack.controller.imagebuild.wheels import download_locked, serve_wheels

LOCAL = "local"
LOCKED = "locked"
LOCKED_BASE_REPO = "pdstack/sglang-base"
PROD_LOCK = ROOT / "requirements" / "prod-image.lock"
PROD_WHEELS = ROOT / ".cache" / "wheels" / "prod"

# The Python base (debootstrap): everything here feeds its tag.
PYBASE_RECIPE = {
    "suite": "bookworm",
    "variant": "minbase",
    "include": ["python3", "python3-venv", "patch", "ca-certificates"],
    "remove": ["var/cache/apt/archives/*.deb", "var/lib/apt/lists/*_*", "var/log/bootstrap.log", "etc/resolv.conf"],
    "changes": ['CMD ["python3"]'],
}


def pybase_tag() -> str:
    return f"{PYBASE_REPO}:{digest(PYBASE_RECIPE)[:12]}"


def ensure_pybase(c=None) -> str:
    """Debian bookworm (debootstrap, minbase) with python3 + venv + patch; built once, then found by tag."""
    return ensure_rootfs_image(c or client(), pybase_tag(), PYBASE_RECIPE, what="the python base",
                               lock_name="build-pybase", labels={f"{LABEL_PREFIX}.base": "pybase"})


def locked_base_tag() -> str:
    recipe = {"pybase": pybase_tag(), "dockerfile": sha256_file(IMAGES / "base-sglang" / "Dockerfile"),
              "lock": sha256_file(PROD_LOCK)}
    return f"{LOCKED_BASE_REPO}:{digest(recipe)[:12]}"


def ensure_locked_base(c=None) -> str:
    """Our CUDA 13 base: the python base + every distribution of requirements/prod-image.lock, hash-checked.

    Found by tag when the lock, the Dockerfile and the python base are unchanged (no download, no build). Otherwise
    the host's wheel cache (.cache/wheels/prod) is filled (only missing files are fetched) and served to the build.
    """
    c = c or client()
    tag = locked_base_tag()
    if image_exists(c, tag):
        return tag
    pybase = ensure_pybase(c)
    with lock("build-base-sglang"):
        if image_exists(c, tag):
            return tag
        download_locked(PROD_LOCK, PROD_WHEELS)
        with context_dir() as ctx, serve_wheels(c, PROD_WHEELS) as url:
            shutil.copy2(IMAGES / "base-sglang" / "Dockerfile", ctx / "Dockerfile")
            shutil.copy2(PROD_LOCK, ctx / "prod-image.lock")
            docker_build(c, ctx, tag, {"BASE": pybase, "WHEELS_URL": url, "LOCK_SHA256": sha256_file(PROD_LOCK)},
                         "locked CUDA base")
    return tag


def resolve_base(c, flavor: str, base: str | None) -> str:
    """--base (or images/bases.yaml) -> a base image reference present on this machine."""
    ref = (base or default_base(flavor)).strip()
    if ref == LOCAL:
        return ensure_pybase(c)
    if ref == LOCKED:
        if flavor != "prod":
            raise BuildError("--base locked is the prod flavor's CUDA base; the sim flavor uses --base local")
        return ensure_locked_base(c)
    if image_exists(c, ref):
        if flavor == "prod" and "@sha256:" not in ref and not ref.startswith(LOCKED_BASE_REPO + ":"):
            echo(f"warning: base {ref} is not pinned by digest; production pins it (images/bases.yaml)")
        return ref
    echo(f"base {ref} is not on this machine; pulling it")
    try:
        c.images.pull(ref)
    except Exception as e:
        raise BuildError(
            f"base image {ref} is not on this machine and cannot be pulled: {e}\n"
            "Fix, one of:\n"
            f"  - where a registry is reachable: docker pull {ref} && docker save {ref} -o base.tar;\n"
            f"    here: docker load -i base.tar, then invoke build --base {ref}\n"
            "  - build our own CUDA base from requirements/prod-image.lock (the default): invoke build --base locked"
        ) from e
    return ref
