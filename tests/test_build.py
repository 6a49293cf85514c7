"""`invoke build` (pdstack.controller.imagebuild): content-addressed inputs, the manifest and labels, both flavors
built for real, the no-op rebuild, and a patch that does not apply failing the prod build.

The slow tests build images with the local Docker engine (CI runs them; without an engine they fail under CI=true
and skip elsewhere). The prod build is the real one: the locked CUDA base (debootstrap + requirements/prod-image.lock,
built once and then found by tag), then kernels, patches, SGLang's JIT AOT and the in-image checks.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import re
import shlex
import shutil
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from pdstack.controller.imagebuild import rootfs
from pdstack.controller.imagebuild.bases import LOCKED_BASE_REPO, ensure_locked_base, resolve_base
from pdstack.controller.imagebuild.common import ROOT, BuildError, sha256_file
from pdstack.controller.imagebuild.engine import client, image_exists
from pdstack.controller.imagebuild.inputs import compute_inputs, image_tag
from pdstack.controller.imagebuild.manifest import format_manifest, manifest_path
from pdstack.controller.imagebuild.pins import default_series_dir
from pdstack.controller.imagebuild.pipeline import build
from pdstack.controller.imagebuild.wheels import pep508
from pdstack.controller.plan.planner import ROUTER_LAUNCHER
from pdstack.image.patches import read_series, series_hash

SERIES = default_series_dir()


def _copy_series(dst: Path) -> Path:
    dst.mkdir(parents=True)
    shutil.copy2(SERIES / "series", dst / "series")
    for p in read_series(SERIES):
        shutil.copy2(p, dst / p.name)
    return dst


def _break_patch(series_dir: Path) -> str:
    """Change a line the series' last patch removes, so that hunk no longer fits SGLang 0.5.23 (no fuzz saves it)."""
    last = read_series(series_dir)[-1]
    lines = last.read_text().splitlines(keepends=True)
    at = next(i for i, ln in enumerate(lines) if ln.startswith("@@"))
    gone = next(i for i in range(at + 1, len(lines)) if lines[i].startswith("-") and lines[i].strip("-\n "))
    lines[gone] = lines[gone].rstrip("\n") + "  # pdstack-test: not in upstream\n"
    last.write_text("".join(lines))
    return last.name


# ---------------------------------------------------------------------------------------------------- fast


def test_prod_inputs_cover_exactly_the_series_kernels_and_dockerfile(tmp_path):
    series = _copy_series(tmp_path / SERIES.name)
    (series / "0099-stray.patch.new").write_text("not listed in series\n")
    inputs = compute_inputs("prod", "example/base@sha256:" + "0" * 64, series_dir=series)
    names = set(inputs["files"])
    assert "images/prod/Dockerfile" in names
    assert "kernels/csrc/index_k_store_bf16.cu" in names
    assert "kernels/pdstack_kernels/build.py" in names
    assert "pdstack/image/patches.py" in names
    listed = {p.name for p in read_series(series)}
    assert {Path(n).name for n in names if n.endswith(".patch")} == listed
    assert not any(n.endswith(".patch.new") for n in names)
    assert inputs["pins"]["sglang"] == "0.5.23"
    assert inputs["pins"]["cuda_archs"] == ["sm_120a"]
    assert inputs["pins"]["patch_series_sha256"] == series_hash(series)
    assert inputs["pins"]["jit_aot"] == "require"  # a real base must AOT-compile SGLang's JIT kernels
    assert inputs["pins"]["checks"] == "on"
    assert {"images/prod/checks.py", "images/prod/model-config/config.json"} <= names
    assert len(inputs["pins"]["plan_argv_sha256"]) == 64


def test_tag_changes_with_every_kind_of_input(tmp_path):
    series = _copy_series(tmp_path / SERIES.name)
    base = "example/base@sha256:" + "1" * 64
    first = compute_inputs("prod", base, series_dir=series)
    assert compute_inputs("prod", base, series_dir=series)["sha256"] == first["sha256"]  # stable
    assert image_tag(first) == f"pdstack/sglang:{first['sha256'][:16]}"
    tags = {image_tag(first)}
    tags.add(image_tag(compute_inputs("prod", "example/base@sha256:" + "2" * 64, series_dir=series)))
    tags.add(image_tag(compute_inputs("prod", base, series_dir=series, archs=("sm_120a", "sm_90a"))))
    _break_patch(series)
    tags.add(image_tag(compute_inputs("prod", base, series_dir=series)))
    assert len(tags) == 4
    sim = compute_inputs("sim", "pdstack/pybase:x", wheels={"a-1-py3-none-any.whl": "00"})
    assert sim["sha256"] != compute_inputs("sim", "pdstack/pybase:x", wheels={"a-2-py3-none-any.whl": "00"})["sha256"]
    assert "pdstack/testing/sim/server.py" in sim["files"] and "images/sim/Dockerfile" in sim["files"]


def _sim_tag(root: Path) -> str:
    return image_tag(compute_inputs("sim", "pdstack/pybase:x", wheels={"a-1-py3-none-any.whl": "00"}, root=root))


def test_sim_tag_covers_only_what_the_sim_image_contains(tmp_path):
    # A copy of the tree the sim image is made from, plus a controller module it does not contain.
    root = tmp_path / "repo"
    for rel in ("pyproject.toml", "images/sim/Dockerfile", "pdstack", "requirements/lock.txt"):
        src = ROOT / rel
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        if src.is_dir():
            shutil.copytree(src, root / rel, ignore=shutil.ignore_patterns("__pycache__"))
        else:
            shutil.copy2(src, root / rel)
    first = _sim_tag(root)
    files = compute_inputs("sim", "x", root=root)["files"]
    assert "pdstack/testing/sim/server.py" in files and "pdstack/cli.py" in files
    assert not any(f.startswith(("pdstack/controller/", "pdstack/hostside/", "pdstack/image/",
                                 "pdstack/testing/testhost")) for f in files), sorted(files)
    planner = root / "pdstack" / "controller" / "plan" / "planner.py"
    planner.write_text(planner.read_text() + "\n# an edit the sim image does not contain\n")
    (root / "pdstack" / "testing" / "testhost" / "hosts.py").write_text("# edited\n")
    assert _sim_tag(root) == first
    engine = root / "pdstack" / "testing" / "sim" / "engine.py"
    engine.write_text(engine.read_text() + "\n# an edit inside the sim image\n")
    assert _sim_tag(root) != first


def test_sbom_names_the_one_wheel_each_locked_distribution_installed(tmp_path):
    from pdstack.controller.imagebuild import sbom

    wheels = tmp_path / "wheels"
    wheels.mkdir()
    good = wheels / "foo_bar-1.0-py3-none-any.whl"
    good.write_bytes(b"the wheel")
    other = wheels / "foo_bar-0.9-py3-none-any.whl"  # another version in the cache: not what the lock installs
    other.write_bytes(b"old")
    lock = tmp_path / "x.lock"
    lock.write_text("# header\nfoo-bar==1.0 \\\n    --hash=sha256:" + "0" * 64 + " \\\n    --hash=sha256:"
                    + sha256_file(good) + "\n    # via x\n")
    assert sbom.locked(lock) == {"foo-bar": ("1.0", {"0" * 64, sha256_file(good)})}
    assert sbom.installed_wheels(lock, wheels) == {"foo-bar": ("1.0", good.name, sha256_file(good))}
    good.write_bytes(b"tampered")
    with pytest.raises(BuildError, match="lacks the locked wheel of: foo-bar"):
        sbom.installed_wheels(lock, wheels)


def test_sbom_fills_an_empty_wheel_cache_from_the_lock_first(tmp_path, monkeypatch):
    """A fresh clone on a host that already has the image has no wheel cache: the SBOM step fills it from the lock
    (what CI's fresh clones meet), and still refuses a cache whose fill did not bring the locked wheel."""
    from pdstack.controller.imagebuild import sbom
    from pdstack.controller.imagebuild import wheels as wheel_cache

    content = b"the locked wheel"
    lock = tmp_path / "x.lock"
    lock.write_text("foo==2.0 \\\n    --hash=sha256:" + hashlib.sha256(content).hexdigest() + "\n")
    wheels = tmp_path / "cache"
    fills = []

    def fill(lk, folder):
        fills.append((lk, folder))
        folder.mkdir(parents=True, exist_ok=True)
        (folder / "foo-2.0-py3-none-any.whl").write_bytes(content)
        return {"seconds": 0.0, "bytes": len(content)}

    monkeypatch.setattr(sbom, "BUILD_DIR", tmp_path / "build")
    monkeypatch.setattr(wheel_cache, "download_locked", fill)
    out = sbom.write_sbom(lock, wheels)
    assert fills == [(lock, wheels)] and out["components"] == 1
    doc = json.loads((tmp_path / "build" / "sbom" / Path(out["path"]).name).read_text())
    assert [c["name"] for c in doc["components"]] == ["foo"]

    content = b"a different file"  # the fill brings a wheel that does not match the lock's hash
    lock.write_text("foo==2.0 \\\n    --hash=sha256:" + "1" * 64 + "\n")
    with pytest.raises(BuildError, match="lacks the locked wheel of: foo"):
        sbom.write_sbom(lock, tmp_path / "cache2")


def test_the_prod_lock_pins_every_distribution_with_hashes():
    from pdstack.controller.imagebuild import sbom
    from pdstack.controller.imagebuild.bases import PROD_LOCK

    entries = sbom.locked(PROD_LOCK)
    assert entries["sglang"][0] == "0.5.23" and entries["torch"][0] == "2.14.1"
    for name in ("sglang-kernel", "sgl-deep-gemm", "flashinfer-python", "apache-tvm-ffi", "sglang-router",
                 "mooncake-transfer-engine-cuda13", "nixl-cu13", "nixl", "nvidia-cuda-nvcc"):
        assert name in entries, name
    assert "nixl-cu12" not in entries  # left out on purpose (requirements/prod-image.in says why)
    assert all(hashes for _, hashes in entries.values())


def test_locked_base_is_the_prod_default_and_prod_only(monkeypatch):
    from pdstack.controller.imagebuild.pins import default_base

    assert default_base("prod") == "locked" and default_base("sim") == "local"
    with pytest.raises(BuildError, match="--base locked is the prod flavor's"):
        resolve_base(object(), "sim", "locked")


def test_the_locked_base_builds_in_a_clone_without_build_dir(tmp_path, monkeypatch):
    """`invoke build --flavor prod` in a fresh clone: no build/ yet (its context's temp dir goes there). Everything
    around the context is stubbed: the base missing, the wheel download and the wheel server no-ops."""
    import contextlib

    from pdstack.controller.imagebuild import bases, common

    seen = {}

    def docker_build(c, ctx, tag, args, what):
        seen["files"] = sorted(p.name for p in ctx.iterdir())
        seen["args"] = args

    missing = tmp_path / "clone" / "build"
    monkeypatch.setattr(common, "BUILD_DIR", missing)
    monkeypatch.setattr(bases, "image_exists", lambda c, tag: False)
    monkeypatch.setattr(bases, "ensure_pybase", lambda c: "pdstack/pybase:test")
    monkeypatch.setattr(bases, "lock", lambda name: contextlib.nullcontext())
    monkeypatch.setattr(bases, "download_locked", lambda lock, dest: None)
    monkeypatch.setattr(bases, "serve_wheels", lambda c, d: contextlib.nullcontext("http://172.17.0.1:1/"))
    monkeypatch.setattr(bases, "docker_build", docker_build)
    tag = ensure_locked_base(object())
    assert tag.startswith(LOCKED_BASE_REPO + ":") and missing.is_dir()
    assert seen["files"] == ["Dockerfile", "prod-image.lock"] and seen["args"]["BASE"] == "pdstack/pybase:test"
    assert list(missing.iterdir()) == []  # the context's temp dir is gone again


def test_sim_context_pins_every_wheel_by_hash_and_holds_none_of_the_cache(tmp_path, monkeypatch):
    from pdstack.controller.imagebuild import contexts

    built = []
    monkeypatch.setattr(contexts, "build_wheel", lambda src, items, out: built.append(out))
    wheels = {"torch-2.13.0+cpu-cp311-cp311-linux_x86_64.whl": "a" * 64, "aiohttp-3.9.0-py3-none-any.whl": "b" * 64,
              "sglang-0.5.23-py3-none-any.whl": "c" * 64, "xgrammar-0.2.7-cp311-cp311-linux_x86_64.whl": "d" * 64}
    contexts.sim_context(tmp_path, wheels)
    req = (tmp_path / "wheels" / "requirements.txt").read_text().splitlines()
    nodeps = (tmp_path / "wheels" / "no-deps.txt").read_text().splitlines()
    assert req == [f"torch==2.13.0+cpu --hash=sha256:{'a' * 64}", f"aiohttp==3.9.0 --hash=sha256:{'b' * 64}"]
    assert nodeps == [f"sglang==0.5.23 --hash=sha256:{'c' * 64}", f"xgrammar==0.2.7 --hash=sha256:{'d' * 64}"]
    assert not list(tmp_path.rglob("*.whl")) and built == [tmp_path / "wheels"]
    dockerfile = (tmp_path / "Dockerfile").read_text()
    assert "--require-hashes" in dockerfile and "WHEELS_URL" in dockerfile and "COPY --from" not in dockerfile


def test_pep508_from_wheel_names():
    assert pep508("torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl") == "torch==2.13.0+cpu"
    assert pep508("nvidia_cuda_nvcc-13.0.88-py3-none-manylinux2014_x86_64.whl") == "nvidia_cuda_nvcc==13.0.88"


def test_rootfs_build_needs_root(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 1000)
    with pytest.raises(BuildError, match="needs root"):
        rootfs.preflight("the python base")


def test_rootfs_build_needs_debootstrap(monkeypatch):
    monkeypatch.setattr(os, "geteuid", lambda: 0)
    monkeypatch.setattr(rootfs, "debootstrap_bin", lambda: None)
    with pytest.raises(BuildError, match=r"debootstrap is not installed[\s\S]*dev\.sh setup"):
        rootfs.preflight("the python base")


def test_debootstrap_progress_counts_packages(capsys):
    pkgs = [f"p{i}" for i in range(10)]
    lines = ["I: Retrieving InRelease", "I: Validating Packages"]
    lines += [f"I: {v} {p} 1.0" for p in pkgs for v in ("Retrieving", "Validating")]
    lines += [f"I: Extracting {p}..." for p in pkgs[:4]] + ["I: Installing core packages..."]
    lines += [f"I: Unpacking {p}..." for p in pkgs[:4]] + [f"I: Configuring {p}..." for p in pkgs[:4]]
    lines += ["I: Unpacking the base system..."] + [f"I: Unpacking {p}..." for p in pkgs[4:]]
    lines += ["I: Configuring the base system..."] + [f"I: Configuring {p}..." for p in pkgs[4:]]
    progress = rootfs.DebootstrapProgress()
    fractions = []
    for line in lines:
        progress.feed(line)
        fractions.append(progress.fraction())
    assert progress.downloaded == progress.unpacked == progress.configured == 10
    known = [f for f in fractions if f is not None]
    assert known == sorted(known) and known[-1] == 1.0
    progress.feed("I: Base system installed successfully.")
    progress.render(final=True)
    assert "100%" in capsys.readouterr().err


def test_missing_engine_says_how_to_fix(monkeypatch, tmp_path):
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-such.sock")
    with pytest.raises(BuildError) as e:
        client()
    assert "cannot reach the Docker engine" in str(e.value)
    assert "Fix:" in str(e.value) and "dev.sh setup" in str(e.value)


def test_unknown_flavor_is_refused():
    with pytest.raises(BuildError, match="--flavor prod or --flavor sim"):
        build(flavor="gpu")


def test_a_later_build_without_push_keeps_the_push_record_of_the_same_image(tmp_path):
    from pdstack.controller.imagebuild.ship import earlier_push

    pushed = {"ref": "127.0.0.1:5000/pdstack/sim:0123", "digest_ref": "127.0.0.1:5000/pdstack/sim@sha256:" + "a" * 64}
    m = tmp_path / "manifest-sim.json"
    assert earlier_push(m, "pdstack/sim:0123", "sha256:1") is None  # no manifest yet
    m.write_text(json.dumps({"tag": "pdstack/sim:0123", "image_id": "sha256:1", "pushed": pushed}))
    assert earlier_push(m, "pdstack/sim:0123", "sha256:1") == pushed
    assert earlier_push(m, "pdstack/sim:4567", "sha256:2") is None  # another build: its push is not this image's
    assert earlier_push(m, "pdstack/sim:0123", "sha256:2") is None  # same tag, rebuilt (another id)


def test_format_manifest_is_a_table():
    m = {"tag": "pdstack/sim:abc", "image_id": "sha256:" + "f" * 64, "size_bytes": 3e8, "base": {"ref": "x"},
         "inputs": {"files": {"a": "1"}}, "inputs_sha256": "ab" * 32, "noop": True, "seconds": 0.3,
         "labels": {"io.pdstack.flavor": "sim", "org.opencontainers.image.revision": "r1", "other": "hidden"}}
    text = format_manifest(m)
    assert "no-op in 0.3 s" in text and "flavor" in text and "r1" in text and "hidden" not in text


# ---------------------------------------------------------------------------------------------------- slow


@pytest.fixture(scope="module")
def docker_client():
    try:
        return client()
    except BuildError as e:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail(f"CI=true but no Docker engine: {e}")
        pytest.skip(f"no Docker engine: {e}")


def _run(c, image: str, cmd: str) -> str:
    out = c.containers.run(image, ["sh", "-c", cmd], remove=True, stderr=True)
    return out.decode()


def _manifest_ok(m: dict, flavor: str, c, path=None) -> None:
    on_disk = json.loads((path or manifest_path(flavor)).read_text())
    assert on_disk == m
    img = c.images.get(m["tag"])
    assert img.id == m["image_id"]
    assert m["size_bytes"] == img.attrs["Size"] > 0
    assert m["labels"] == img.attrs["Config"]["Labels"]
    assert m["labels"]["io.pdstack.flavor"] == flavor
    assert m["labels"]["io.pdstack.inputs.sha256"] == m["inputs_sha256"]
    assert m["tag"].endswith(":" + m["inputs_sha256"][:16])
    rev = m["labels"]["org.opencontainers.image.revision"]
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "HEAD"], capture_output=True, text=True).stdout
    assert len(rev.removesuffix("-dirty")) == 40 and int(rev[:40], 16) >= 0
    assert head.strip()  # a checkout: the label is a real commit id
    assert m["inputs"]["files"] and all(len(v) == 64 for v in m["inputs"]["files"].values())


@pytest.mark.slow
def test_sim_image_runs_the_test_engine_and_the_real_router(docker_client, tmp_path):
    c = docker_client
    # a manifest of its own: build/manifest-sim.json is what the deploying tests' inventories read, on the other
    # worker at the same time (a build without --save would drop its tarball record)
    own = tmp_path / "manifest-sim.json"
    m = build(flavor="sim", manifest=own)
    _manifest_ok(m, "sim", c, own)
    assert m["labels"]["io.pdstack.router.version"] == "0.3.2"
    assert m["labels"]["io.pdstack.test-engine"] == "true"
    out = _run(c, m["tag"], "command -v pdstack; command -v python3; pdstack sim --help; "
                            f"{shlex.join([*ROUTER_LAUNCHER, '--help'])} | head -n 3; "  # the plan's router launcher
                            "python3 -c 'import torch; print(\"torch cuda:\", torch.version.cuda)'; "
                            "python3 -c 'from pdstack.testing.sim import parsing; print(\"parsers:\", "
                            "[c.__name__ for c in parsing.classes()])'; "
                            "echo wheels: $(find / -xdev -name '*.whl' ! -path '/usr/share/python-wheels/*' | wc -l); "
                            "echo compiled: $(find /opt/pdstack/lib -path "
                            "'*/sglang/srt/function_call/__pycache__/*.pyc' | wc -l)")
    assert "/opt/pdstack/bin/pdstack" in out and "/opt/pdstack/bin/python3" in out
    assert "TEST ENGINE" in out and "--disaggregation-mode" in out
    assert "usage: launch_router" in out
    # CPU torch only (SGLang's tool-call detector and reasoning parser import it); no CUDA in the sim image
    assert "torch cuda: None" in out
    assert "parsers: ['FunctionCallParser', 'ReasoningParser', 'Tool']" in out
    # the wheels were served to the build, not copied into it (Debian's python3-venv keeps its own pip and setuptools
    # wheels in /usr/share/python-wheels); the bytecode is compiled in the image
    assert "wheels: 0" in out
    assert int(out.split("compiled: ")[1].split()[0]) > 10

    t0 = time.monotonic()
    again = build(flavor="sim", save=str(tmp_path / "sim.tar"), manifest=own)
    assert again["noop"] and again["tag"] == m["tag"] and again["image_id"] == m["image_id"]
    # the no-op itself (without --save) must stay under 5 s; measure it alone
    t1 = time.monotonic()
    third = build(flavor="sim", manifest=own)
    noop_s = time.monotonic() - t1
    assert third["noop"] and noop_s < 5, f"no-op build took {noop_s:.1f} s"
    assert time.monotonic() - t0 > 0
    saved = again["saved"]
    sha_line = (tmp_path / "sim.tar.sha256").read_text().split()
    assert sha_line == [saved["sha256"], "sim.tar"]
    assert sha256_file(tmp_path / "sim.tar") == saved["sha256"]
    with tarfile.open(tmp_path / "sim.tar") as t:
        index = json.load(t.extractfile("manifest.json"))
    assert m["tag"] in index[0]["RepoTags"]


def _file_from_image(c, image: str, path: str) -> bytes:
    ct = c.containers.create(image, ["true"])
    try:
        bits, _ = ct.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(bits))) as t:
            return t.extractfile(t.getmembers()[0]).read()
    finally:
        ct.remove(force=True)


@pytest.mark.slow
def test_prod_image_on_the_locked_base_patched_compiled_and_checked(docker_client, tmp_path):
    """The real image: our CUDA 13 base from the lock, the series applied with RECORD checks, our kernels and SGLang's
    JIT (with every index-K store our plans select) compiled for sm_120, the in-image checks passed, an SBOM."""
    c = docker_client
    m = build(flavor="prod")  # images/bases.yaml: prod: locked
    _manifest_ok(m, "prod", c)
    labels = m["labels"]
    assert labels["io.pdstack.sglang.version"] == "0.5.23"
    assert labels["io.pdstack.patches.sha256"] == series_hash(SERIES)
    assert labels["io.pdstack.kernels.archs"] == "sm_120a"
    assert labels["io.pdstack.jit-aot"] == "require" and labels["io.pdstack.checks"] == "on"
    assert m["base"]["ref"].startswith(LOCKED_BASE_REPO + ":")
    assert m["sbom"]["format"] == "CycloneDX 1.6 JSON" and m["sbom"]["components"] >= 200
    sbom = json.loads((ROOT / m["sbom"]["path"]).read_text())
    torch = next(x for x in sbom["components"] if x["name"] == "torch")
    assert torch["version"] == "2.14.1" and len(torch["externalReferences"][0]["hashes"]) == 1
    out = _run(c, m["tag"], "cat /opt/pdstack/patches/applied.txt; echo; cat /opt/pdstack/jit-aot.json; echo; "
                            "cat /opt/pdstack/checks.json; echo; "
                            "python3 -c 'import importlib.util as u; "
                            "print(\"pdk\", u.find_spec(\"pdstack_kernels\").origin)'; "
                            "python3 -c 'import torch; print(\"torch\", torch.__version__, torch.version.cuda)'; "
                            "echo lib=$PDSTACK_KERNELS_LIB")
    for p in read_series(SERIES):
        assert f"applied  {p.name}" in out
    assert f"series sha256 {series_hash(SERIES)}" in out
    assert "recorded  sglang/srt/mem_cache/deepseek_v4_memory_pool.py sha256=" in out
    assert "pdk /opt/sglang/lib/python3.11/site-packages/pdstack_kernels/__init__.py" in out
    assert "torch 2.14.1+cu130 13.0" in out
    reports = [json.loads(chunk) for chunk in _json_objects(out)]
    jit = next(r for r in reports if "compiled" in r)
    assert jit["skipped"] is None and not jit["failed"], jit
    compiled = {x["module"] for x in jit["compiled"]}
    assert any(n.startswith("index-K store bf16") for n in compiled) and any(n.startswith("index-K store fp8")
                                                                             for n in compiled)
    checks = next(r for r in reports if "imports" in r)
    assert checks["failures"] == [] and checks["launch_server_help"]["rc"] == 0 and checks["router_help"]["rc"] == 0
    assert {r["server"] for r in checks["plan_argv"]} == {"prefill-0", "decode-0"}
    assert all(r["parsed"] for r in checks["plan_argv"])
    lib = _file_from_image(c, m["tag"], "/opt/pdstack/kernels/libpdstack_kernels.so")
    assert lib[:4] == b"\x7fELF"
    (tmp_path / "lib.so").write_bytes(lib)
    cuobjdump = shutil.which("cuobjdump") or shutil.which("cuobjdump", path="/usr/local/cuda/bin:/usr/local/bin")
    if cuobjdump:
        elf = subprocess.run([cuobjdump, "--list-elf", str(tmp_path / "lib.so")], capture_output=True, text=True)
        assert "sm_120a" in elf.stdout, elf.stdout + elf.stderr
    else:
        assert b"sm_120a" in lib or b"sm_120" in lib

    t0 = time.monotonic()
    again = build(flavor="prod")
    assert again["noop"] and again["image_id"] == m["image_id"] and time.monotonic() - t0 < 5


def _json_objects(text: str):
    """The top-level JSON objects printed one after another (each report file ends with a newline)."""
    dec = json.JSONDecoder()
    i = 0
    while (i := text.find("{", i)) != -1:
        try:
            _, end = dec.raw_decode(text, i)
        except json.JSONDecodeError:
            i += 1
            continue
        yield text[i:end]
        i = end


@pytest.mark.slow
def test_a_patch_that_does_not_apply_fails_the_prod_build(docker_client, tmp_path):
    series = _copy_series(tmp_path / SERIES.name)
    broken = _break_patch(series)
    inputs_tag = image_tag(compute_inputs("prod", ensure_locked_base(docker_client), series_dir=series))
    with pytest.raises(BuildError) as e:
        build(flavor="prod", series_dir=series, manifest=tmp_path / "manifest.json")
    msg = str(e.value)
    assert broken in msg and "FAILED" in msg, msg
    assert not image_exists(docker_client, inputs_tag)
    assert not (tmp_path / "manifest.json").exists()


@pytest.mark.slow
def test_an_unreachable_base_says_how_to_bring_it_offline(docker_client):
    ref = "registry.example.invalid/sglang@sha256:" + "0" * 64
    with pytest.raises(BuildError) as e:
        resolve_base(docker_client, "prod", ref)
    msg = str(e.value)
    assert "cannot be pulled" in msg and "docker load -i base.tar" in msg and "--base locked" in msg


def test_lock_pins_without_hashes_and_local_wheels_hashed(tmp_path):
    from pdstack.controller.imagebuild.pins import hash_local_wheels, pin, pins_only

    lock = tmp_path / "lock.txt"
    lock.write_text("# header\naiohttp==3.14.5 \\\n    --hash=sha256:" + "a" * 64 + "\n    # via -r dev.in\n"
                    "torch==2.13.0+cpu\n    # via -r dev.in\n")
    assert pins_only(lock) == "aiohttp==3.14.5\ntorch==2.13.0+cpu\n"
    assert pin(lock, "torch") == "2.13.0+cpu" and pin(lock, "aiohttp") == "3.14.5"
    wheels = tmp_path / "wheels"
    wheels.mkdir()
    (wheels / "torch-2.13.0+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"torch")
    (wheels / "torch-2.14.1+cpu-cp311-cp311-manylinux_2_28_x86_64.whl").write_bytes(b"other")
    text, unhashed = hash_local_wheels(lock.read_text(), [wheels, tmp_path / "absent"])
    assert unhashed == []
    assert f"torch==2.13.0+cpu \\\n    --hash=sha256:{hashlib.sha256(b'torch').hexdigest()}\n" in text
    assert text.count("--hash=") == 2
    lock.write_text(text)
    assert pins_only(lock) == "aiohttp==3.14.5\ntorch==2.13.0+cpu\n"
    assert hash_local_wheels("numpy==2.4.6\n", [wheels]) == ("numpy==2.4.6\n", ["numpy==2.4.6"])


def test_dev_lock_is_hash_pinned_and_matches_dev_in():
    """Every pin of requirements/lock.txt carries a hash (./dev.sh installs it with --require-hashes), and the lock
    pins exactly what requirements/dev.in does."""
    from pdstack.controller.imagebuild.pins import pins_only

    req = ROOT / "requirements"
    blocks = re.split(r"\n(?=[A-Za-z])", (req / "lock.txt").read_text())
    unhashed = [b.split()[0] for b in blocks if re.match(r"[A-Za-z]", b) and "--hash=sha256:" not in b]
    assert not unhashed, f"requirements/lock.txt: no hash for {unhashed}: run `invoke lock.dev`"

    def norm(text: str) -> list[str]:
        return sorted(re.sub(r"[-_.]+", "-", p.lower()) for p in text.split())

    assert norm(pins_only(req / "lock.txt")) == norm(pins_only(req / "dev.in")), "run `invoke lock.dev`"


def test_pyproject_dependencies_are_the_locks_versions():
    """pyproject.toml's dependencies are exact pins equal to requirements/lock.txt's, so `pip install -e .` alone
    cannot drift from the locked venv (./dev.sh installs the lock first, then the project with --no-deps)."""
    import tomllib

    from pdstack.controller.imagebuild.pins import pins_only

    def norm(pin: str) -> str:
        return re.sub(r"[-_.]+", "-", pin.lower())

    locked = {norm(p).split("==")[0]: norm(p) for p in pins_only(ROOT / "requirements" / "lock.txt").split()}
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    off = [d for d in deps if "==" not in d or locked.get(norm(d).split("==")[0]) != norm(d)]
    assert not off, f"pyproject.toml pins {off}; requirements/lock.txt has " + str(
        [locked.get(norm(d).split("==")[0]) for d in off])
