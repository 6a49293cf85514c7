"""The manifest of a built image (build/manifest-<flavor>.json), its labels check, and the table for people."""

from __future__ import annotations

import subprocess
from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild.common import BUILD_DIR, LABEL_PREFIX, ROOT, BuildError


def git_revision() -> str:
    r = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True)
    if r.returncode != 0:
        return "unknown"
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no", "--",
                            "images", "kernels", "pdstack", "pyproject.toml", "requirements"],
                           capture_output=True, text=True).stdout.strip()
    return r.stdout.strip() + ("-dirty" if dirty else "")


def manifest_path(flavor: str) -> Path:
    return BUILD_DIR / f"manifest-{flavor}.json"


def check_labels(flavor: str, labels: dict[str, str], inputs: dict[str, Any]) -> None:
    want = {f"{LABEL_PREFIX}.flavor": flavor, f"{LABEL_PREFIX}.inputs.sha256": inputs["sha256"]}
    if flavor == "prod":
        pins = inputs["pins"]
        want |= {f"{LABEL_PREFIX}.sglang.version": pins["sglang"],
                 f"{LABEL_PREFIX}.patches.sha256": pins["patch_series_sha256"],
                 f"{LABEL_PREFIX}.kernels.archs": " ".join(pins["cuda_archs"])}
    bad = {k: (labels.get(k), v) for k, v in want.items() if labels.get(k) != v}
    if bad:
        raise BuildError(f"image labels disagree with its inputs: {bad}\nFix: docker rmi the image and build again")


def format_manifest(m: dict[str, Any]) -> str:
    """A short table for people; the manifest file is the machine form."""
    rows = [("image", m["tag"]), ("id", m["image_id"][:19]), ("size", f"{m['size_bytes'] / 1e6:.0f} MB"),
            ("base", m["base"]["ref"]),
            ("inputs", f"{len(m['inputs']['files'])} files, sha256 {m['inputs_sha256'][:16]}"),
            ("result", f"{'no-op' if m['noop'] else 'built'} in {m['seconds']:.1f} s")]
    rows += [(k.removeprefix("io.pdstack."), v) for k, v in sorted(m["labels"].items())
             if k.startswith("io.pdstack.") or k.endswith(".revision")]
    if m.get("build_seconds") is not None:
        rows.append(("docker build", f"{m['build_seconds']:.0f} s"))
    if m.get("sbom"):
        rows.append(("sbom", f"{m['sbom']['path']} ({m['sbom']['components']} components, {m['sbom']['format']})"))
    if m.get("saved"):
        rows.append(("saved", f"{m['saved']['path']} (sha256 {m['saved']['sha256'][:16]})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)
