"""The bases the flavors build FROM: the python base (debootstrap), the offline stand-in, or an image reference.

    ensure_pybase()         local Debian bookworm + Python base (rootfs.py); built once, then found by tag
    ensure_offline_base()   CI's stand-in for the SGLang CUDA base (images/base-offline)
    resolve_base(c, flavor, base)   --base (or images/bases.yaml) -> a reference present on this machine
"""

from __future__ import annotations

import shutil
import tempfile
from pathlib import Path

from pdstack.controller.imagebuild.common import (
    BUILD_DIR,
    IMAGES,
    LABEL_PREFIX,
    OFFLINE_BASE_REPO,
    PYBASE_REPO,
    BuildError,
    digest,
    echo,
    lock,
    sha256_file,
)
from pdstack.controller.imagebuild.engine import client, docker_build, image_exists
from pdstack.controller.imagebuild.pins import default_base, sglang_version, torch_version
from pdstack.controller.imagebuild.rootfs import ensure_rootfs_image
from pdstack.controller.imagebuild.wheels import download_wheels, link_or_copy, pep508

OFFLINE = "offline"
LOCAL = "local"

# The CUDA 13.0 compiler as PyPI wheels (verified: these five compile kernels/csrc for sm_120a; nvvm carries cicc,
# crt the host-side headers, cuda-runtime libcudart_static + cuda_runtime.h, cccl the libcu++/CUB headers).
NVCC_WHEELS = (
    "nvidia-cuda-nvcc==13.0.88",
    "nvidia-cuda-crt==13.0.88",
    "nvidia-nvvm==13.0.88",
    "nvidia-cuda-runtime==13.0.96",
    "nvidia-cuda-cccl==13.0.85",
)

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


def _offline_wheels() -> tuple[Path, dict[str, str]]:
    return download_wheels("base-offline", [f"torch=={torch_version()}", "setuptools>=68"],
                           no_deps=[f"sglang=={sglang_version()}", *NVCC_WHEELS])


def offline_base_tag(wheels: dict[str, str]) -> str:
    recipe = {"pybase": pybase_tag(), "dockerfile": sha256_file(IMAGES / "base-offline" / "Dockerfile"),
              "wheels": wheels}
    return f"{OFFLINE_BASE_REPO}:{digest(recipe)[:12]}"


def ensure_offline_base(c=None) -> str:
    """CI's stand-in for the SGLang CUDA base (see images/base-offline/Dockerfile); built once, then found by tag."""
    c = c or client()
    folder, wheels = _offline_wheels()
    tag = offline_base_tag(wheels)
    if image_exists(c, tag):
        return tag
    pybase = ensure_pybase(c)
    with lock("build-base-offline"):
        if image_exists(c, tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="pdstack-ctx-", dir=BUILD_DIR) as tmp:
            ctx = Path(tmp)
            shutil.copy2(IMAGES / "base-offline" / "Dockerfile", ctx / "Dockerfile")
            for w in wheels:
                link_or_copy(folder / w, ctx / "wheels" / w)
            no_deps = [w for w in wheels if w.startswith(("sglang-", "nvidia_"))]
            (ctx / "wheels" / "requirements.txt").write_text(
                "".join(f"{pep508(w)}\n" for w in wheels if w not in no_deps))
            (ctx / "wheels" / "no-deps.txt").write_text("".join(f"{pep508(w)}\n" for w in no_deps))
            docker_build(c, ctx, tag, {"BASE": pybase}, "offline base")
    return tag


def resolve_base(c, flavor: str, base: str | None) -> str:
    """--base (or images/bases.yaml) -> a base image reference present on this machine."""
    ref = (base or default_base(flavor)).strip()
    if ref == OFFLINE:
        if flavor != "prod":
            raise BuildError("--base offline is the prod flavor's stand-in base; the sim flavor uses --base local")
        return ensure_offline_base(c)
    if ref == LOCAL:
        return ensure_pybase(c)
    if image_exists(c, ref):
        if flavor == "prod" and "@sha256:" not in ref and not ref.startswith(OFFLINE_BASE_REPO + ":"):
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
            "  - build CI's offline stand-in (CPU torch, sglang --no-deps, nvcc from PyPI): "
            "invoke build --base offline (or invoke build.base-offline)"
        ) from e
    return ref
