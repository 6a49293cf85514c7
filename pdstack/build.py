"""`invoke build`: the serving image (prod) and the test-engine image (sim), content-addressed.

    build(flavor="prod"|"sim", base=None, save=None, push=None)   build (or find) the image; write the manifest
    compute_inputs(flavor, base_ref)                                every input file's sha256 + pins -> the tag
    ensure_pybase()                                                 local Debian bookworm + Python base (debootstrap)
    ensure_offline_base()                                           CI's stand-in for the SGLang CUDA base

The image tag is the first 16 hex digits of a sha256 over every input: the Dockerfile and the files it copies,
the patch series (series file + the patches it lists), the kernel sources, the pinned versions, and the base
reference. When an image with that tag exists, `build` only rewrites the manifest (a no-op; well under 5 s).
Nothing is ever pulled unless the base is a registry reference that is not on this machine.
Wheels are downloaded on the host (its pip sees the local find-links and CA settings; containers cannot reach PyPI)
into build/wheels/<set>-<hash>/ and installed in the image with --no-index.
"""

from __future__ import annotations

import collections
import gzip
import hashlib
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pdstack.controller.locks import exclusive
from pdstack.errors import PdstackError

ROOT = Path(__file__).resolve().parent.parent
IMAGES = ROOT / "images"
BUILD_DIR = ROOT / "build"
WHEEL_CACHE = BUILD_DIR / "wheels"
LOCK_DIR = Path("/run/lock")

FLAVORS = ("prod", "sim")
REPOS = {"prod": "pdstack/sglang", "sim": "pdstack/sim"}
PYBASE_REPO = "pdstack/pybase"
OFFLINE_BASE_REPO = "pdstack/sglang-base-offline"
LABEL_PREFIX = "io.pdstack"
OFFLINE = "offline"
LOCAL = "local"

CUDA_ARCHS = ("sm_120a",)
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


class BuildError(PdstackError):
    """An image could not be built, found, saved or pushed; the message says how to fix it."""

    exit_code = 5


def echo(msg: str) -> None:
    print(f"[build] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- pins


def _pin(path: Path, name: str) -> str:
    for line in path.read_text().splitlines():
        m = re.match(rf"^{re.escape(name)}==(\S+)", line.strip(), re.IGNORECASE)
        if m:
            return m.group(1)
    raise BuildError(f"{path} pins no {name}: add `{name}==<version>`")


def sglang_version() -> str:
    return _pin(ROOT / "requirements" / "sglang.txt", "sglang")


def router_version() -> str:
    return _pin(ROOT / "requirements" / "lock.txt", "sglang-router")


def torch_version() -> str:
    return _pin(ROOT / "requirements" / "lock.txt", "torch")


def default_series_dir() -> Path:
    return ROOT / "kernels" / "patches" / f"sglang-{sglang_version()}"


def default_base(flavor: str) -> str:
    """images/bases.yaml's entry for the flavor (offline / local / an image reference)."""
    import yaml

    bases = yaml.safe_load((IMAGES / "bases.yaml").read_text()) or {}
    ref = str(bases.get(flavor) or "").strip()
    if not ref:
        raise BuildError(f"images/bases.yaml has no base for flavor {flavor!r}: add `{flavor}: offline` or a reference")
    return ref


# ---------------------------------------------------------------------------------------------------- hashing


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            h.update(block)
    return h.hexdigest()


def _tree(root: Path, rel_to: Path = ROOT) -> dict[str, Path]:
    """Every file under root that a build would copy (no caches, no build outputs), keyed by repo-relative path."""
    out = {}
    for p in sorted(root.rglob("*")):
        parts = set(p.relative_to(root).parts)
        if p.is_file() and not parts & {"__pycache__", "build", ".pytest_cache"} and p.suffix not in (".pyc", ".so"):
            out[str(p.relative_to(rel_to))] = p
    return out


def _digest(obj: Any) -> str:
    return hashlib.sha256(json.dumps(obj, sort_keys=True).encode()).hexdigest()


def _rel(p: Path) -> str:
    try:
        return str(p.resolve().relative_to(ROOT))
    except ValueError:
        return str(p)


def _input_files(flavor: str, series_dir: Path) -> dict[str, Path]:
    from pdstack.image.patches import read_series

    if flavor == "prod":
        files = {
            "images/prod/Dockerfile": IMAGES / "prod" / "Dockerfile",
            "images/prod/jit_aot.py": IMAGES / "prod" / "jit_aot.py",
            "kernels/pyproject.toml": ROOT / "kernels" / "pyproject.toml",
            "pdstack/__init__.py": ROOT / "pdstack" / "__init__.py",
            "pdstack/errors.py": ROOT / "pdstack" / "errors.py",
            "pdstack/image/__init__.py": ROOT / "pdstack" / "image" / "__init__.py",
            "pdstack/image/patches.py": ROOT / "pdstack" / "image" / "patches.py",
        }
        files |= _tree(ROOT / "kernels" / "csrc")
        files |= _tree(ROOT / "kernels" / "pdstack_kernels")
        # Only what the series lists: a stray .patch.new beside it is not an input and is not copied.
        files[_rel(series_dir / "series")] = series_dir / "series"
        files |= {_rel(p): p for p in read_series(series_dir)}
        return files
    if flavor == "sim":
        files = {"images/sim/Dockerfile": IMAGES / "sim" / "Dockerfile", "pyproject.toml": ROOT / "pyproject.toml"}
        files |= _tree(ROOT / "pdstack")
        return files
    raise BuildError(f"unknown flavor {flavor!r}: use one of {', '.join(FLAVORS)}")


def compute_inputs(flavor: str, base_ref: str, *, series_dir: Path | None = None,
                   archs: tuple[str, ...] = CUDA_ARCHS, wheels: dict[str, str] | None = None) -> dict[str, Any]:
    """Every input of the flavor's image: {files: {path: sha256}, pins: {...}, base: ref, sha256: the whole}."""
    series_dir = Path(series_dir or default_series_dir())
    files = {name: _sha256_file(p) for name, p in sorted(_input_files(flavor, series_dir).items())}
    if flavor == "prod":
        from pdstack.image.patches import series_hash

        pins = {"sglang": sglang_version(), "cuda_archs": list(archs), "patch_series": series_dir.name,
                "patch_series_sha256": series_hash(series_dir), "jit_aot": _jit_mode(base_ref)}
    else:
        pins = {"sglang-router": router_version(), "wheels": wheels or {}}
    inputs = {"flavor": flavor, "files": files, "pins": pins, "base": base_ref}
    inputs["sha256"] = _digest({k: inputs[k] for k in ("flavor", "files", "pins", "base")})
    return inputs


def image_tag(inputs: dict[str, Any]) -> str:
    return f"{REPOS[inputs['flavor']]}:{inputs['sha256'][:16]}"


def _jit_mode(base_ref: str) -> str:
    # The offline base has CPU torch: SGLang's JIT cannot run there. A real base must manage it.
    return "auto" if base_ref.startswith(OFFLINE_BASE_REPO + ":") else "require"


# ---------------------------------------------------------------------------------------------------- docker


def client():
    """A pinged docker client, or a BuildError saying how to get one."""
    from pdstack import testhost

    try:
        return testhost.client()
    except PdstackError as e:
        raise BuildError(str(e)) from e


def image_exists(c, ref: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        c.images.get(ref)
        return True
    except ImageNotFound:
        return False


def _lock(name: str):
    """One build of `name` at a time on this machine (engineers and CI share one engine)."""
    return exclusive(LOCK_DIR / f"pdstack-build-{name}.lock", "build", echo)


_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def docker_build(c, context: Path, tag: str, buildargs: dict[str, str], what: str) -> None:
    """Classic-builder build of `context` as `tag`; streams step lines with elapsed time and a heartbeat."""
    t0 = time.monotonic()
    tail: collections.deque[str] = collections.deque(maxlen=60)
    state = {"step": "sending context", "since": t0, "done": False}

    def heartbeat() -> None:
        while not state["done"]:
            time.sleep(15)
            if not state["done"] and time.monotonic() - state["since"] >= 15:
                echo(f"{what}: {time.monotonic() - t0:4.0f} s  still on {state['step']} "
                     f"({time.monotonic() - state['since']:.0f} s)")

    threading.Thread(target=heartbeat, daemon=True).start()
    echo(f"{what}: docker build {tag} (context {_du(context) / 1e6:.0f} MB)")
    error = None
    try:
        for chunk in c.api.build(path=str(context), tag=tag, buildargs=buildargs, rm=True, forcerm=True,
                                 pull=False, decode=True, timeout=3600):
            if "error" in chunk:
                error = chunk["error"].strip()
                continue
            text = chunk.get("stream", "")
            for line in _ANSI.sub("", text).splitlines():
                line = line.rstrip()
                if not line or line.startswith(" ---> ") or line.startswith("Removing intermediate"):
                    continue
                tail.append(line)
                if line.startswith("Step "):
                    state["step"], state["since"] = line.split(" :", 1)[0], time.monotonic()
                    echo(f"{what}: {time.monotonic() - t0:4.0f} s  {line[:150]}")
                elif not line.startswith("Successfully"):
                    print(f"    {line}", file=sys.stderr, flush=True)
    except Exception as e:  # docker.errors.APIError / BuildError / connection errors
        error = error or f"{type(e).__name__}: {e}"
    finally:
        state["done"] = True
    if error:
        last = "\n".join(tail)
        raise BuildError(f"{what} failed at {state['step']}: {error}\nlast output:\n{last}")
    echo(f"{what}: built {tag} in {time.monotonic() - t0:.0f} s")


def _du(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


# ---------------------------------------------------------------------------------------------------- wheels


def download_wheels(name: str, requirements: list[str], *, no_deps: list[str] = ()) -> tuple[Path, dict[str, str]]:
    """pip-download `requirements` (constrained by requirements/lock.txt) and `no_deps` into a cached folder.

    Returns (folder, {wheel file: sha256}). The folder is keyed by the request + lock.txt, so a second call
    downloads nothing; its `wheels.json` lists what it holds.
    """
    lock = ROOT / "requirements" / "lock.txt"
    key = _digest({"req": requirements, "no_deps": list(no_deps), "lock": _sha256_file(lock)})[:12]
    folder = WHEEL_CACHE / f"{name}-{key}"
    index = folder / "wheels.json"
    if index.is_file():
        return folder, json.loads(index.read_text())
    WHEEL_CACHE.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=WHEEL_CACHE))
    pip = [sys.executable, "-m", "pip", "download", "-q", "--only-binary", ":all:", "-d", str(tmp)]
    echo(f"wheels: downloading {name} ({', '.join(requirements + list(no_deps))}) on the host")
    for args in ([*pip, "-c", str(lock), *requirements] if requirements else None,
                 [*pip, "--no-deps", *no_deps] if no_deps else None):
        if not args:
            continue
        r = subprocess.run(args, capture_output=True, text=True)
        if r.returncode != 0:
            shutil.rmtree(tmp, ignore_errors=True)
            raise BuildError(f"pip download failed ({' '.join(args[3:])}):\n{r.stderr[-2000:]}\n"
                             "Fix: the host's pip must reach PyPI or a find-links folder holding these wheels "
                             "(see /etc/pip.conf); torch comes from /opt/wheels (torch-2.13.0+cpu)")
    wheels = {p.name: _sha256_file(p) for p in sorted(tmp.glob("*.whl"))}
    (tmp / "wheels.json").write_text(json.dumps(wheels, indent=1) + "\n")
    if folder.exists():
        shutil.rmtree(folder)
    tmp.rename(folder)
    return folder, wheels


def _link_or_copy(src: Path, dst: Path) -> None:
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copy2(src, dst)


def _pep508(wheel: str) -> str:
    """'torch-2.13.0+cpu-cp311-...whl' -> 'torch==2.13.0+cpu'."""
    name, version = wheel.split("-")[:2]
    return f"{name}=={version}"


def build_wheel(src: Path, items: tuple[str, ...], out: Path) -> Path:
    """A pure wheel of the project at `src` (pdstack or kernels/), built on the host from a copy of `items` only."""
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc", "*.so", "build", "*.egg-info", ".pytest_cache")
    with tempfile.TemporaryDirectory(prefix="pdstack-wheel-") as tmp:
        work = Path(tmp) / "src"
        work.mkdir()
        for item in items:
            if (src / item).is_dir():
                shutil.copytree(src / item, work / item, ignore=ignore)
            else:
                shutil.copy2(src / item, work / item)
        r = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "--no-build-isolation",
                            "-w", str(out), str(work)], capture_output=True, text=True)
        if r.returncode != 0:
            raise BuildError(f"building a wheel of {src} failed:\n{r.stdout[-1500:]}{r.stderr[-1500:]}")
    return next(out.glob("*.whl"))


# ---------------------------------------------------------------------------------------------------- bases


def pybase_tag() -> str:
    return f"{PYBASE_REPO}:{_digest(PYBASE_RECIPE)[:12]}"


def ensure_pybase(c=None) -> str:
    """Debian bookworm (debootstrap, minbase) with python3 + venv + patch; built once, then found by tag."""
    from pdstack import testhost

    c = c or client()
    tag = pybase_tag()
    if image_exists(c, tag):
        return tag
    try:
        testhost._preflight_build()
    except PdstackError as e:
        raise BuildError(str(e)) from e
    with _lock("pybase"):
        if image_exists(c, tag):
            return tag
        t0 = time.monotonic()
        root = Path(tempfile.mkdtemp(prefix="pdstack-pybase-rootfs-", dir="/var/tmp"))
        try:
            rc, tail = testhost.run_debootstrap(PYBASE_RECIPE["variant"], PYBASE_RECIPE["include"],
                                                PYBASE_RECIPE["suite"], root, "the python base")
            if rc != 0:
                raise BuildError(f"debootstrap failed (exit {rc}):\n" + "\n".join(tail) +
                                 f"\nFix: check that {testhost.MIRROR} is reachable (PDSTACK_DEBIAN_MIRROR)")
            for pattern in PYBASE_RECIPE["remove"]:
                for p in root.glob(pattern):
                    p.unlink() if not p.is_dir() or p.is_symlink() else shutil.rmtree(p)
            repo, _, version = tag.partition(":")
            tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
            assert tar.stdout is not None

            def chunks() -> Iterator[bytes]:
                while block := tar.stdout.read(1 << 20):
                    yield block

            c.api.import_image_from_stream(chunks(), repository=repo, tag=version,
                                           changes=[*PYBASE_RECIPE["changes"], f"LABEL {LABEL_PREFIX}.base=pybase"])
            if tar.wait() != 0 or not image_exists(c, tag):
                raise BuildError(f"docker import of the python base as {tag} failed")
        finally:
            testhost._remove_rootfs(root)
        echo(f"python base {tag} built in {time.monotonic() - t0:.0f} s")
    return tag


def _offline_wheels() -> tuple[Path, dict[str, str]]:
    return download_wheels("base-offline", [f"torch=={torch_version()}", "setuptools>=68"],
                           no_deps=[f"sglang=={sglang_version()}", *NVCC_WHEELS])


def offline_base_tag(wheels: dict[str, str]) -> str:
    recipe = {"pybase": pybase_tag(), "dockerfile": _sha256_file(IMAGES / "base-offline" / "Dockerfile"),
              "wheels": wheels}
    return f"{OFFLINE_BASE_REPO}:{_digest(recipe)[:12]}"


def ensure_offline_base(c=None) -> str:
    """CI's stand-in for the SGLang CUDA base (see images/base-offline/Dockerfile); built once, then found by tag."""
    c = c or client()
    folder, wheels = _offline_wheels()
    tag = offline_base_tag(wheels)
    if image_exists(c, tag):
        return tag
    pybase = ensure_pybase(c)
    with _lock("base-offline"):
        if image_exists(c, tag):
            return tag
        with tempfile.TemporaryDirectory(prefix="pdstack-ctx-", dir=BUILD_DIR) as tmp:
            ctx = Path(tmp)
            shutil.copy2(IMAGES / "base-offline" / "Dockerfile", ctx / "Dockerfile")
            for w in wheels:
                _link_or_copy(folder / w, ctx / "wheels" / w)
            no_deps = [w for w in wheels if w.startswith(("sglang-", "nvidia_"))]
            (ctx / "wheels" / "requirements.txt").write_text(
                "".join(f"{_pep508(w)}\n" for w in wheels if w not in no_deps))
            (ctx / "wheels" / "no-deps.txt").write_text("".join(f"{_pep508(w)}\n" for w in no_deps))
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


# ---------------------------------------------------------------------------------------------------- contexts


def _prod_context(ctx: Path, series_dir: Path) -> None:
    from pdstack.image.patches import read_series

    shutil.copy2(IMAGES / "prod" / "Dockerfile", ctx / "Dockerfile")
    # Exactly what the image runs of pdstack (pdstack/image/__init__.py says so): the package root, errors, image/.
    (ctx / "tools" / "pdstack" / "image").mkdir(parents=True)
    for f in ("__init__.py", "errors.py", "image/__init__.py", "image/patches.py"):
        shutil.copy2(ROOT / "pdstack" / f, ctx / "tools" / "pdstack" / f)
    shutil.copy2(IMAGES / "prod" / "jit_aot.py", ctx / "tools" / "jit_aot.py")
    dst = ctx / "patches" / series_dir.name
    dst.mkdir(parents=True)
    shutil.copy2(series_dir / "series", dst / "series")
    for p in read_series(series_dir):
        shutil.copy2(p, dst / p.name)
    build_wheel(ROOT / "kernels", ("pyproject.toml", "pdstack_kernels", "csrc"), ctx / "kernels")


# What SGLang's tool-call detector and reasoning parser import (pdstack/testing/sim/parsing.py); sglang and xgrammar
# themselves go in --no-deps (their own requirements are GPU builds).
SIM_PARSER_WHEELS = ["openai", "transformers", "partial_json_parser", "regex", "pydantic", "orjson", "msgspec",
                     "pybase64", "requests", "pillow", "ipython", "numpy", "apache-tvm-ffi"]
SIM_NO_DEPS = ["xgrammar"]


def _sim_wheels() -> tuple[Path, dict[str, str]]:
    return download_wheels("sim", [f"sglang-router=={router_version()}", "aiohttp", "prometheus-client",
                                   f"torch=={torch_version()}", *SIM_PARSER_WHEELS],
                           no_deps=[f"sglang=={sglang_version()}",
                                    *(f"{w}=={_pin(ROOT / 'requirements' / 'lock.txt', w)}" for w in SIM_NO_DEPS)])


def _sim_context(ctx: Path, folder: Path, wheels: dict[str, str]) -> None:
    shutil.copy2(IMAGES / "sim" / "Dockerfile", ctx / "Dockerfile")
    for w in wheels:
        _link_or_copy(folder / w, ctx / "wheels" / w)
    no_deps = [w for w in wheels if w.startswith(("sglang-", *(f"{n}-" for n in SIM_NO_DEPS)))]
    (ctx / "wheels" / "requirements.txt").write_text("".join(f"{_pep508(w)}\n" for w in wheels if w not in no_deps))
    (ctx / "wheels" / "no-deps.txt").write_text("".join(f"{_pep508(w)}\n" for w in no_deps))
    build_wheel(ROOT, ("pyproject.toml", "pdstack"), ctx / "wheels")


# ---------------------------------------------------------------------------------------------------- build


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
    wheels_folder, wheels = _sim_wheels() if flavor == "sim" else (None, None)
    inputs = compute_inputs(flavor, base_ref, series_dir=series, archs=archs, wheels=wheels)
    tag = image_tag(inputs)
    noop = image_exists(c, tag)
    if noop:
        echo(f"{tag} exists (inputs unchanged): nothing to build")
    else:
        with _lock(flavor):
            noop = image_exists(c, tag)
            if not noop:
                args = {"BASE": base_ref, "INPUTS_SHA256": inputs["sha256"], "GIT_REVISION": git_revision()}
                BUILD_DIR.mkdir(parents=True, exist_ok=True)
                with tempfile.TemporaryDirectory(prefix="pdstack-ctx-", dir=BUILD_DIR) as tmp:
                    ctx = Path(tmp)
                    if flavor == "prod":
                        _prod_context(ctx, series)
                        pins = inputs["pins"]
                        args |= {"SGLANG_VERSION": pins["sglang"], "CUDA_ARCHS": " ".join(archs),
                                 "PATCH_SERIES": pins["patch_series"],
                                 "PATCH_SERIES_SHA256": pins["patch_series_sha256"], "JIT_AOT": pins["jit_aot"]}
                    else:
                        assert wheels_folder is not None and wheels is not None
                        _sim_context(ctx, wheels_folder, wheels)
                        args |= {"ROUTER_VERSION": router_version()}
                    docker_build(c, ctx, tag, args, f"{flavor} image")
    img = c.images.get(tag)
    labels = img.attrs.get("Config", {}).get("Labels") or {}
    _check_labels(flavor, labels, inputs)
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
        "git_revision": git_revision(),
    }
    if save:
        out["saved"] = save_image(c, img, tag, Path(save))
    if push:
        out["pushed"] = push_image(c, img, tag, push)
    out["seconds"] = round(time.monotonic() - t0, 2)
    path = Path(manifest) if manifest else manifest_path(flavor)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(out, indent=2, sort_keys=True) + "\n")
    echo(f"{tag}: {out['size_bytes'] / 1e6:.0f} MB, {'no-op' if noop else 'built'} in {out['seconds']:.1f} s; "
         f"manifest {_rel(path)}")
    return out


def _check_labels(flavor: str, labels: dict[str, str], inputs: dict[str, Any]) -> None:
    want = {f"{LABEL_PREFIX}.flavor": flavor, f"{LABEL_PREFIX}.inputs.sha256": inputs["sha256"]}
    if flavor == "prod":
        pins = inputs["pins"]
        want |= {f"{LABEL_PREFIX}.sglang.version": pins["sglang"],
                 f"{LABEL_PREFIX}.patches.sha256": pins["patch_series_sha256"],
                 f"{LABEL_PREFIX}.kernels.archs": " ".join(pins["cuda_archs"])}
    bad = {k: (labels.get(k), v) for k, v in want.items() if labels.get(k) != v}
    if bad:
        raise BuildError(f"image labels disagree with its inputs: {bad}\nFix: docker rmi the image and build again")


def save_image(c, img, tag: str, path: Path) -> dict[str, Any]:
    """docker save to `path` (gzip level 1 if it ends in .gz) + `path.sha256`; skipped when it already holds img."""
    meta_path = path.with_name(path.name + ".json")
    sha_path = path.with_name(path.name + ".sha256")
    if meta_path.is_file() and path.is_file() and sha_path.is_file():
        meta = json.loads(meta_path.read_text())
        if meta.get("image_id") == img.id and meta.get("bytes") == path.stat().st_size:
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
        for chunk in img.save(chunk_size=1 << 20, named=True):
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
    meta = {"path": str(path), "sha256": digest, "bytes": path.stat().st_size, "image_id": img.id, "tag": tag}
    meta_path.write_text(json.dumps(meta, indent=2) + "\n")
    echo(f"saved {tag} to {path} ({meta['bytes'] / 1e6:.0f} MB, {time.monotonic() - t0:.0f} s); sha256 in {sha_path}")
    return meta


def push_image(c, img, tag: str, registry: str) -> str:
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
    return f"{target}:{version}"


def format_manifest(m: dict[str, Any]) -> str:
    """A short table for people; the manifest file is the machine form."""
    rows = [("image", m["tag"]), ("id", m["image_id"][:19]), ("size", f"{m['size_bytes'] / 1e6:.0f} MB"),
            ("base", m["base"]["ref"]),
            ("inputs", f"{len(m['inputs']['files'])} files, sha256 {m['inputs_sha256'][:16]}"),
            ("result", f"{'no-op' if m['noop'] else 'built'} in {m['seconds']:.1f} s")]
    rows += [(k.removeprefix("io.pdstack."), v) for k, v in sorted(m["labels"].items())
             if k.startswith("io.pdstack.") or k.endswith(".revision")]
    if m.get("saved"):
        rows.append(("saved", f"{m['saved']['path']} (sha256 {m['saved']['sha256'][:16]})"))
    width = max(len(k) for k, _ in rows)
    return "\n".join(f"{k.ljust(width)}  {v}" for k, v in rows)

