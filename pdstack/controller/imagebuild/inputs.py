"""What each flavor's image is made of, and the content hash over exactly that (the image tag).

The same lists decide what the build context copies (contexts.py) and what is hashed here, so an edit to a file the
image does not contain never changes its tag: the sim image holds only the package root, the CLI and testing/sim.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild.common import (
    CUDA_ARCHS,
    FLAVORS,
    REPOS,
    ROOT,
    BuildError,
    digest,
    rel,
    sha256_file,
)
from pdstack.controller.imagebuild.pins import default_series_dir, router_version, sglang_version

# pdstack as the prod image runs it (pdstack/image/__init__.py says why): the package root, errors, image/.
PROD_TOOLS = ("pdstack/__init__.py", "pdstack/errors.py", "pdstack/image/__init__.py", "pdstack/image/patches.py",
              "pdstack/image/p2p.py")  # the P2P gate: PYTHONPATH=/opt/pdstack/tools python3 -m pdstack.image.p2p
# pdstack as the sim image runs it: `pdstack sim` (cli.py dispatches; it imports only the chosen subcommand).
SIM_SOURCES = (
    "pyproject.toml",
    "pdstack/__init__.py",
    "pdstack/__main__.py",
    "pdstack/cli.py",
    "pdstack/errors.py",
    "pdstack/switches.py",
    "pdstack/upstream.py",
    "pdstack/testing/__init__.py",
    "pdstack/testing/sim",
)
# The prod image's build-time tools and check inputs (images/prod/): JIT AOT, the in-image checks, the model config.
PROD_IMAGE_FILES = ("images/prod/Dockerfile", "images/prod/jit_aot.py", "images/prod/checks.py",
                    "images/prod/model-config/config.json")
# The plan whose argv the in-image checks parse: the production inventory on the reference topology.
PLAN_INVENTORY = "inventory/production"
PLAN_FACTS = "tests/topologies/reference-2node-8gpu.json"
# kernels/ as the prod image's pdstack-kernels wheel is built from it.
KERNEL_SOURCES = ("kernels/pyproject.toml", "kernels/pdstack_kernels", "kernels/csrc")
_SKIP_PARTS = {"__pycache__", "build", ".pytest_cache"}
_SKIP_SUFFIXES = (".pyc", ".so")


def tree(top: Path, root: Path = ROOT) -> dict[str, Path]:
    """Every file under `top` that a build would copy (no caches, no build outputs), keyed by path relative to root."""
    out = {}
    for p in sorted(top.rglob("*")):
        parts = set(p.relative_to(top).parts)
        if p.is_file() and not parts & _SKIP_PARTS and not p.name.endswith(_SKIP_SUFFIXES) \
                and not any(part.endswith(".egg-info") for part in parts):
            out[str(p.relative_to(root))] = p
    return out


def expand(items: tuple[str, ...], root: Path = ROOT) -> dict[str, Path]:
    """Files and folders (relative to root) -> every file they hold."""
    files: dict[str, Path] = {}
    for item in items:
        p = root / item
        files |= tree(p, root) if p.is_dir() else {item: p}
    return files


def input_files(flavor: str, series_dir: Path, root: Path = ROOT) -> dict[str, Path]:
    """What the flavor's build context holds (repo-relative path -> file): the image contains this and no more."""
    from pdstack.image.patches import read_series

    if flavor == "prod":
        files = expand((*PROD_IMAGE_FILES, *PROD_TOOLS, *KERNEL_SOURCES), root)
        # Only what the series lists: a stray file beside it is not an input and is not copied.
        files[rel(series_dir / "series")] = series_dir / "series"
        files |= {rel(p): p for p in read_series(series_dir)}
        return files
    if flavor == "sim":
        return expand(("images/sim/Dockerfile", *SIM_SOURCES), root)
    raise BuildError(f"unknown flavor {flavor!r}: use one of {', '.join(FLAVORS)}")


def compute_inputs(flavor: str, base_ref: str, *, series_dir: Path | None = None,
                   archs: tuple[str, ...] = CUDA_ARCHS, wheels: dict[str, str] | None = None,
                   root: Path = ROOT) -> dict[str, Any]:
    """Every input of the flavor's image: {files: {path: sha256}, pins: {...}, base: ref, sha256: the whole}.

    `root` is the tree the files are read from (the repository; a test passes a copy)."""
    series_dir = Path(series_dir or default_series_dir())
    files = {name: sha256_file(p) for name, p in sorted(input_files(flavor, series_dir, root).items())}
    if flavor == "prod":
        from pdstack.image.patches import series_hash

        pins = {"sglang": sglang_version(), "cuda_archs": list(archs), "patch_series": series_dir.name,
                "patch_series_sha256": series_hash(series_dir), "jit_aot": "require", "checks": "on",
                "plan_argv_sha256": digest(plan_argv())}
    else:
        pins = {"sglang-router": router_version(), "wheels": wheels or {}}
    inputs = {"flavor": flavor, "files": files, "pins": pins, "base": base_ref}
    inputs["sha256"] = digest({k: inputs[k] for k in ("flavor", "files", "pins", "base")})
    return inputs


def plan_argv() -> dict[str, dict]:
    """{server: {flags, env}} of the production plan on the reference topology (what checks.py parses in the image).

    Derived from the inventory and the recorded facts, so its digest is a pin: an inventory edit that changes a
    server's flags rebuilds the checks layer, and nothing else does. The image build is a driver, as `pdstack plan`
    is: it runs the whole pipeline (checks, plan, read-back), so the argv it pins is the one a deploy would run."""
    from pdstack.controller import pipeline
    from pdstack.controller.load import inventory
    from pdstack.controller.load.facts import load_facts

    dep = inventory.load(ROOT / PLAN_INVENTORY)
    facts = load_facts(ROOT / PLAN_FACTS, list(dep.hosts))
    plan = pipeline.make_plan(dep, facts, require_image=False)
    return {s.name: {"role": s.role, "flags": list(s.flags), "env": dict(s.env)} for s in plan.servers}


def image_tag(inputs: dict[str, Any]) -> str:
    return f"{REPOS[inputs['flavor']]}:{inputs['sha256'][:16]}"
