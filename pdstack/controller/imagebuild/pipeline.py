"""`build()`: resolve the base, hash the inputs, build unless an image with that tag exists, write the manifest."""

from __future__ import annotations

import contextlib
import json
import os
import time
from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild.bases import LOCKED_BASE_REPO, PROD_LOCK, PROD_WHEELS, resolve_base
from pdstack.controller.imagebuild.common import CUDA_ARCHS, FLAVORS, BuildError, context_dir, echo, lock, rel
from pdstack.controller.imagebuild.contexts import prod_context, sim_context, sim_wheels
from pdstack.controller.imagebuild.engine import client, docker_build, image_exists
from pdstack.controller.imagebuild.inputs import compute_inputs, image_tag
from pdstack.controller.imagebuild.manifest import check_labels, git_revision, manifest_path
from pdstack.controller.imagebuild.pins import default_series_dir, router_version
from pdstack.controller.imagebuild.sbom import write_sbom
from pdstack.controller.imagebuild.ship import earlier_push, push_image, save_image
from pdstack.controller.imagebuild.wheels import serve_wheels


def build(flavor: str = "prod", base: str | None = None, save: str | None = None, push: str | None = None,
          series_dir: str | Path | None = None, archs: tuple[str, ...] = CUDA_ARCHS,
          manifest: str | Path | None = None) -> dict[str, Any]:
    """Build the flavor's image unless one with the same inputs exists; write and return the manifest."""
    t0 = time.monotonic()
    if flavor not in FLAVORS:
        raise BuildError(f"unknown flavor {flavor!r}: use --flavor prod or --flavor sim")
    c = client()
    base_ref = resolve_base(c, flavor, base)
    series = Path(series_dir) if series_dir else default_series_dir()
    wheels_folder, wheels = sim_wheels() if flavor == "sim" else (None, None)
    inputs = compute_inputs(flavor, base_ref, series_dir=series, archs=archs, wheels=wheels)
    tag = image_tag(inputs)
    noop = image_exists(c, tag)
    build_seconds = None
    if noop:
        echo(f"{tag} exists (inputs unchanged): nothing to build")
    else:
        with lock(f"build-{flavor}"):
            noop = image_exists(c, tag)
            if not noop:
                args = {"BASE": base_ref, "INPUTS_SHA256": inputs["sha256"], "GIT_REVISION": git_revision()}
                with context_dir() as ctx:
                    if flavor == "prod":
                        prod_context(ctx, series)
                        pins = inputs["pins"]
                        args |= {"SGLANG_VERSION": pins["sglang"], "CUDA_ARCHS": " ".join(archs),
                                 "PATCH_SERIES": pins["patch_series"],
                                 "PATCH_SERIES_SHA256": pins["patch_series_sha256"], "JIT_AOT": pins["jit_aot"],
                                 "CHECKS": pins["checks"]}
                    else:
                        assert wheels_folder is not None and wheels is not None
                        sim_context(ctx, wheels)
                        args |= {"ROUTER_VERSION": router_version()}
                    t_build = time.monotonic()
                    # the sim's wheels are served to its build (images/sim/Dockerfile); prod's come with its base
                    served = serve_wheels(c, wheels_folder) if wheels_folder else contextlib.nullcontext()
                    with served as url:
                        docker_build(c, ctx, tag, args | ({"WHEELS_URL": url} if url else {}), f"{flavor} image")
                    build_seconds = round(time.monotonic() - t_build, 1)
    img = c.images.get(tag)
    labels = img.attrs.get("Config", {}).get("Labels") or {}
    check_labels(flavor, labels, inputs)
    out = {
        "flavor": flavor,
        "tag": tag,
        "image_id": img.id,
        "size_bytes": img.attrs.get("Size", 0),
        "labels": labels,
        "base": {"ref": base_ref, "image_id": c.images.get(base_ref).id},
        "inputs_sha256": inputs["sha256"],
        "inputs": {"files": inputs["files"], "pins": inputs["pins"]},
        "noop": noop,
        "build_seconds": build_seconds,
        "git_revision": git_revision(),
    }
    if flavor == "prod":
        if base_ref.startswith(LOCKED_BASE_REPO + ":"):
            out["sbom"] = write_sbom(PROD_LOCK, PROD_WHEELS)
        else:
            out["sbom"] = None
            out["sbom_note"] = (f"no SBOM: base {base_ref} is not ours (requirements/prod-image.lock describes only "
                                "the locked base); scan that image with its vendor's SBOM")
    if save:
        out["saved"] = save_image(c, img, tag, Path(save))
    path = Path(manifest) if manifest else manifest_path(flavor)
    if push:
        out["pushed"] = push_image(c, img, tag, push)
    elif pushed := earlier_push(path, tag, img.id):
        out["pushed"] = pushed  # a later build of the same image without --push keeps the digest hosts pull
    out["seconds"] = round(time.monotonic() - t0, 2)
    path.parent.mkdir(parents=True, exist_ok=True)
    # atomically: a playbook (the image phase) may read this manifest while another build of the same flavor writes
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    tmp.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    tmp.replace(path)
    echo(f"{tag}: {out['size_bytes'] / 1e6:.0f} MB, {'no-op' if noop else 'built'} in {out['seconds']:.1f} s; "
         f"manifest {rel(path)}")
    return out
