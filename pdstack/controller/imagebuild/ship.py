"""Shipping a built image: `docker save` to a tarball (+ sha256, for the playbooks' image phase) or a registry push."""

from __future__ import annotations

import gzip
import hashlib
import json
import time
from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild.common import BuildError, echo, lock


def save_image(c, img, tag: str, path: Path) -> dict[str, Any]:
    """docker save to `path` (gzip level 1 if it ends in .gz) + `path.sha256`; skipped when it already holds img.
    One save to a path at a time on this machine (two test workers save the sim image to build/images/sim.tar)."""
    with lock(f"save-{path.name}"):
        return _save(c, img, tag, path)


def _save(c, img, tag: str, path: Path) -> dict[str, Any]:
    meta_path = path.with_name(path.name + ".json")
    sha_path = path.with_name(path.name + ".sha256")
    if meta_path.is_file() and path.is_file() and sha_path.is_file():
        meta = json.loads(meta_path.read_text())
        # "named": the tag the archive carries (older tarballs lack it: saved with the image's first tag, saved again)
        if meta.get("image_id") == img.id and meta.get("bytes") == path.stat().st_size and meta.get("named") == tag:
            echo(f"{path} already holds {tag}")
            return meta
    path.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    total = img.attrs.get("Size", 0)
    h = hashlib.sha256()
    tmp = path.with_name(path.name + ".part")
    done, last = 0, 0.0

    class _Hashing:
        def __init__(self, f):
            self.f = f

        def write(self, b):
            h.update(b)
            return self.f.write(b)

        def flush(self):
            self.f.flush()

    with open(tmp, "wb") as raw:
        sink = _Hashing(raw)
        writer: Any = gzip.GzipFile(fileobj=sink, mode="wb", compresslevel=1, mtime=0) if path.suffix == ".gz" \
            else sink
        # named=tag: the archive names exactly this tag (named=True takes the image's first tag, which after a
        # --push can be REGISTRY/...: the image phase would then load an image without the plan's tag)
        for chunk in img.save(chunk_size=1 << 20, named=tag):
            writer.write(chunk)
            done += len(chunk)
            if time.monotonic() - last > 5:
                last = time.monotonic()
                echo(f"save: {done / 1e6:.0f} / ~{total / 1e6:.0f} MB ({time.monotonic() - t0:.0f} s)")
        if writer is not sink:
            writer.close()
    tmp.replace(path)
    digest = h.hexdigest()
    sha_path.write_text(f"{digest}  {path.name}\n")
    meta = {"path": str(path), "sha256": digest, "bytes": path.stat().st_size, "image_id": img.id, "tag": tag,
            "named": tag}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    echo(f"saved {tag} to {path} ({meta['bytes'] / 1e6:.0f} MB, {time.monotonic() - t0:.0f} s); sha256 in {sha_path}")
    return meta


def push_image(c, img, tag: str, registry: str) -> dict[str, str]:
    """Tag and push REGISTRY/<repo>:<tag>; {ref, digest_ref}: digest_ref (REGISTRY/<repo>@sha256:...) is what a host
    pulls, so it gets exactly this image whatever the tag later points at."""
    repo, _, version = tag.partition(":")
    target = f"{registry.rstrip('/')}/{repo}"
    img.tag(target, version)
    try:
        for line in c.images.push(target, tag=version, stream=True, decode=True):
            if "error" in line:
                raise BuildError(line["error"])
            if line.get("status") and not line.get("progressDetail"):
                echo(f"push: {line['status']}")
    except BuildError as e:
        raise BuildError(f"pushing {target}:{version} failed: {e}\nFix: check that {registry} is reachable and "
                         "that you are logged in (docker login); or use --save and let the playbooks load it") from e
    except Exception as e:
        raise BuildError(f"pushing {target}:{version} failed: {e}\nFix: check that {registry} is reachable "
                         "(docker login), or use --save and let the playbooks load the tarball") from e
    pushed = c.images.get(f"{target}:{version}").attrs.get("RepoDigests") or []
    digest_ref = next((d for d in pushed if d.startswith(target + "@")), None)
    if digest_ref is None:
        raise BuildError(f"pushed {target}:{version} but the engine reports no repo digest for it: {pushed}")
    return {"ref": f"{target}:{version}", "digest_ref": digest_ref}


def earlier_push(manifest: Path, tag: str, image_id: str) -> dict[str, str] | None:
    """The `pushed` record of the manifest at `manifest` when it describes this very image (same tag and id), so
    that a later `invoke build` without --push (e.g. the demo's --save) keeps the digest the image phase pulls."""
    try:
        old = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return None
    if old.get("tag") == tag and old.get("image_id") == image_id and isinstance(old.get("pushed"), dict):
        return old["pushed"]
    return None
