"""The image the plan's units run, from pdstack_image: an explicit ref, or the manifest `invoke build` wrote, loaded
from a tarball or pulled by digest from pdstack_image.registry (the image phase reads the choice from the plan)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, NamedTuple

from pdstack.controller.load import rules
from pdstack.errors import InventoryError


class ImageChoice(NamedTuple):
    """What the plan says about the image: the reference units run, and how the image phase gets it there."""

    ref: str | None  # the reference every unit runs
    image_id: str | None  # docker image id from the manifest (the image phase checks it after a load or pull)
    tarball: str | None  # absolute controller path of the tarball to copy and `docker load` (no registry)
    pull: str | None  # REGISTRY/REPO@sha256:... the image phase `docker pull`s instead (pdstack_image.registry)
    labels: dict[str, str]  # io.pdstack.* labels from the manifest that the image on the host must carry


def _need(msg: str, require: bool, warnings: list[str]) -> None:
    if require:
        raise InventoryError([msg])
    warnings.append(msg + " (the plan shows no image until then)")


def resolve_image(image: dict[str, Any], warnings: list[str], require: bool = True) -> ImageChoice:
    """The image from pdstack_image: an explicit ref, or the manifest `invoke build` wrote; pulled by digest when
    pdstack_image.registry is set. A missing manifest (or push) is an error when `require` (deploying), else a
    warning and no image (planning). The static checks (preflight) have already vetted the formats."""
    flavor = "sim" if image["engine"] == "sim" else "prod"
    registry = image.get("registry")
    if image["manifest"] is None:
        pull = image["ref"] if registry else None
        return ImageChoice(image["ref"], None, None if pull else image["tarball"], pull, {})
    p = Path(image["manifest"])
    try:
        m = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        how = f"--push {registry}" if registry else f"--save build/images/{flavor}.tar"
        _need(f"pdstack_image.manifest: cannot read {p} ({e}); build the image first: invoke build --flavor {flavor} "
              f"{how}", require, warnings)
        return ImageChoice(None, None, None, None, {})
    if m.get("flavor", flavor) != flavor:
        raise InventoryError([f"pdstack_image.manifest: {p} describes a {m['flavor']} image, but "
                              f"pdstack_image.engine {image['engine']!r} runs the {flavor} image; point manifest at "
                              f"build/manifest-{flavor}.json (or set engine to match)"])
    tag = m["tag"]
    labels = {k: v for k, v in sorted((m.get("labels") or {}).items()) if k.startswith("io.pdstack.")}
    if not registry:
        saved = (m.get("saved") or {}).get("path")
        tarball = image["tarball"] or saved
        # relative paths are the repo root's (where `invoke build` and ansible-playbook run); the image role needs
        # them absolute
        return ImageChoice(tag, m.get("image_id"), str(Path(tarball).resolve()) if tarball else None, None, labels)
    repo = tag.partition(":")[0]
    pushed = m.get("pushed") or {}
    parts = rules.split_digest_ref(pushed.get("digest_ref") or "")
    if pushed and (parts is None or parts[1] != repo or not str(pushed.get("ref", "")).endswith(f"/{tag}")):
        raise InventoryError([f"pdstack_image.manifest: {p} records a push of {pushed.get('ref')!r} "
                              f"({pushed.get('digest_ref')!r}), not of its image {tag}; push this image again: "
                              f"invoke build --flavor {flavor} --push <registry>"])
    digest = image.get("digest")
    if parts and digest and digest != parts[2]:
        raise InventoryError([f"pdstack_image.digest: {digest} is not the digest {p} recorded for {tag} "
                              f"({parts[2]}, pushed as {pushed['digest_ref']}); remove digest to use the manifest's, "
                              f"or point manifest at the build that pushed {digest}"])
    digest = digest or (parts[2] if parts else None)
    if digest is None:
        _need(f"pdstack_image.registry is set, but {p} records no push of {tag} (no pushed.digest_ref), so there is "
              f"no digest to pull: push it with `invoke build --flavor {flavor} --push <registry as this machine "
              f"reaches it>` (e.g. 127.0.0.1:5000), or set pdstack_image.digest", require, warnings)
        return ImageChoice(None, None, None, None, {})
    return ImageChoice(tag, m.get("image_id"), None, f"{registry}/{repo}@{digest}", labels)
