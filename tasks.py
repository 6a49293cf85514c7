"""pdstack's Invoke tasks. Thin: the logic lives in the pdstack package, where it is unit-tested.

    invoke --list                    every task
    invoke demo                      local test host -> site.yml -> summary (the README's main job)
    invoke tune                      the fastest recipe that still recalls, on the running deployment
    invoke test                      lint + the whole test suite (the README's test command runs this)
    invoke testhost.up --count 3     boot local systemd test hosts;  invoke testhost.down removes them
"""

from __future__ import annotations

import os
import shlex
import sys
from pathlib import Path

from invoke import Collection, Context, Exit, task

ROOT = Path(__file__).resolve().parent
PY = sys.executable
BIN = Path(PY).parent


def default_inventory() -> str:
    """The inventory every task defaults to: ansible.cfg's (the local test host), so `invoke plan`, `deploy` and
    `rollback` without -i all mean the same deployment."""
    import configparser

    cfg = configparser.ConfigParser()
    cfg.read(ROOT / "ansible.cfg")
    return cfg.get("defaults", "inventory", fallback="inventory/local")


def _no_dry(c: Context, what: str) -> None:
    """Tasks that call pdstack's Python (not a shell command) cannot honour --dry: refuse instead of doing the work."""
    if c.config.run.dry:
        raise Exit(f"invoke {what}: --dry cannot show this task without running it (it calls pdstack's build and "
                   "test-host code, not shell commands); run it without --dry, or `invoke plan` to see a deployment",
                   2)


def _env() -> dict[str, str]:
    # ansible-playbook must run from the venv (the preflight role calls pdstack with ansible_playbook_python)
    return {"PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}", "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"),
            "PYTHONUNBUFFERED": "1"}


@task(help={"fix": "let ruff fix what it can"})
def lint(c: Context, fix: bool = False) -> None:
    """Ruff, yamllint and ansible-lint (production profile)."""
    with c.cd(str(ROOT)):
        c.run(f"{BIN}/ruff check {'--fix ' if fix else ''}.", echo=True, env=_env())
        c.run(f"{BIN}/yamllint --strict .", echo=True, env=_env())
        c.run(f"{BIN}/ansible-lint --offline --profile production", echo=True, env=_env())


@task(help={"k": "only tests matching this pytest -k expression", "fast": "skip tests marked slow",
            "no_lint": "skip the linters", "workers": "pytest-xdist worker processes (0: one process, no xdist)"})
def test(c: Context, k: str = "", fast: bool = False, no_lint: bool = False, workers: int = 3) -> None:
    """Lint and the whole test suite (integration tests included; they are marked slow and run here too), on
    `workers` pytest-xdist processes: each group of shared-host test files (pyproject.toml's
    pdstack_shared_host_tests) on one, the rest beside them. The linters (`invoke lint`, about a minute of one core)
    run beside pytest; their output follows pytest's, and either failing fails the task."""
    import contextlib
    import signal
    import subprocess
    import tempfile

    args = ["-m", "not slow"] if fast else []
    if k:
        args += ["-k", k]
    if workers > 0:
        args += ["-n", str(workers), "--dist", "loadgroup", "--durations", "30"]
    linting, lint_log = None, tempfile.TemporaryFile()
    if not no_lint and not c.config.run.dry:
        print(f"{BIN}/invoke lint  (beside pytest; its output follows pytest's)", flush=True)
        linting = subprocess.Popen([str(BIN / "invoke"), "lint"], cwd=ROOT, env={**os.environ, **_env()},
                                   stdout=lint_log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                   start_new_session=True)  # a group of its own: killed whole below
    try:
        with c.cd(str(ROOT)):
            r = c.run(f"{PY} -m pytest {' '.join(map(shlex.quote, args))}", echo=True, pty=sys.stdout.isatty(),
                      env=_env(), warn=True)
    except BaseException:  # Ctrl-C, or invoke itself failing: the linters do not outlive the task
        if linting is not None:
            with contextlib.suppress(ProcessLookupError):  # invoke lint and the linter it runs
                os.killpg(linting.pid, signal.SIGKILL)
            linting.wait()
        raise
    failed = [] if r is None or r.ok else [f"pytest (exit {r.exited})"]
    if linting is not None:
        lint_rc = linting.wait()
        lint_log.seek(0)
        sys.stdout.write(f"\n==== invoke lint (ran beside pytest): exit {lint_rc} ====\n")
        sys.stdout.write(lint_log.read().decode("utf-8", "replace"))
        sys.stdout.flush()
        if lint_rc:
            failed.append(f"invoke lint (exit {lint_rc})")
    lint_log.close()
    if failed:
        raise Exit(f"invoke test: {' and '.join(failed)} failed", 1)


@task(help={"inventory": "inventory directory (default: ansible.cfg's, the local test host)",
            "facts": "recorded facts file or directory", "json": "print JSON", "host": "only this host"})
def plan(c: Context, inventory: str = "", facts: str = "", json: bool = False, host: str = "") -> None:
    """Print the deployment plan for an inventory (`pdstack plan`)."""
    cmd = [PY, "-m", "pdstack", "plan", "-i", inventory or default_inventory()]
    cmd += ["--facts", facts] if facts else []
    cmd += ["--json"] if json else []
    cmd += ["--host", host] if host else []
    with c.cd(str(ROOT)):
        c.run(shlex.join(cmd), echo=True, env=_env())


@task(help={"inventory": "inventory directory (default: ansible.cfg's, the local test host)",
            "check": "check mode: report what would change, change nothing", "tags": "only these tags (comma list)",
            "skip_tags": "skip these tags", "extra": "extra ansible-playbook arguments"})
def deploy(c: Context, inventory: str = "", check: bool = False, tags: str = "", skip_tags: str = "",
           extra: str = "") -> None:
    """Run site.yml (every phase: preflight, facts, ...) against an inventory."""
    cmd = [str(BIN / "ansible-playbook"), "site.yml"]
    cmd += ["-i", inventory] if inventory else []
    cmd += ["--check", "--diff"] if check else []
    cmd += ["--tags", tags] if tags else []
    cmd += ["--skip-tags", skip_tags] if skip_tags else []
    inv = Path(inventory or default_inventory()).resolve()
    if inv == ROOT / "inventory" / "local" or inv.parent == ROOT / "inventory" / "test":
        # the sim inventories fetch their model from the controller's mirror (nginx; a no-op when it serves)
        from pdstack.testing import mirror
        print(f"model mirror: {mirror.ensure()} (nginx, left running; pdstack/testing/mirror.py)")
    with c.cd(str(ROOT)):
        r = c.run(shlex.join(cmd) + (f" {extra}" if extra else ""), echo=True, warn=True, pty=sys.stdout.isatty(),
                  env=_env())
    if not r.ok:
        raise Exit(f"site.yml failed (rc {r.exited}); the failing task's message above says what to fix", r.exited)


@task(help={"count": "number of hosts", "prefix": "container name prefix"})
def testhost_up(c: Context, count: int = 1, prefix: str = "pdstack-local") -> None:
    """Boot local Debian bookworm test hosts (systemd in containers), reachable by Ansible."""
    _no_dry(c, "testhost.up")
    from pdstack.errors import PdstackError
    from pdstack.testing.testhost import hosts
    try:
        names = hosts.up(count=count, prefix=prefix)
    except PdstackError as e:
        raise Exit(str(e), 1) from e
    print("test hosts up: " + ", ".join(names))


@task(help={"prefix": "container name prefix"})
def testhost_down(c: Context, prefix: str = "pdstack-local") -> None:
    """Remove exactly what testhost.up made (containers, volumes, network)."""
    _no_dry(c, "testhost.down")
    from pdstack.errors import PdstackError
    from pdstack.testing.testhost import hosts
    try:
        removed = hosts.down(prefix=prefix)
    except PdstackError as e:
        raise Exit(str(e), 1) from e
    print(f"removed: {removed}")


@task(help={"prefix": "container name prefix"})
def testhost_status(c: Context, prefix: str = "pdstack-local") -> None:
    """Show the local test hosts."""
    from pdstack.testing.testhost import hosts
    print(hosts.format_status(hosts.status(prefix=prefix)))


@task(help={"arch": "CUDA arch to build for (repeatable; default sm_120a, or PDSTACK_CUDA_ARCHS)",
            "out": "output directory"}, iterable=["arch"])
def kernels(c: Context, arch: list[str] | None = None, out: str = "build/kernels") -> None:
    """Build pdstack's CUDA kernels ahead of time (nvcc; default sm_120a)."""
    cmd = [PY, "-m", "pdstack_kernels.build", "--out", out]
    for a in arch or []:
        cmd += ["--arch", a]
    with c.cd(str(ROOT)):
        c.run(shlex.join(cmd), echo=True, env={**_env(), "PYTHONPATH": str(ROOT / "kernels")})


@task(help={"count": "number of local test hosts"})
def demo(c: Context, count: int = 1) -> None:
    """The main job on the embedded default: build the sim image, boot the local test host, run site.yml (which
    ends with the smoke checks), print the summary."""
    _no_dry(c, "demo")
    from concurrent.futures import ThreadPoolExecutor

    from pdstack.controller.imagebuild.contexts import sim_wheels
    from pdstack.errors import PdstackError
    from pdstack.testing.testhost import baseimage
    # the test host's base image beside the sim image: on a cold machine both start with a debootstrap, which waits
    # on the network and the disk more than on the CPU (each a no-op when its image exists); the sim image's wheels
    # download beside the python base's debootstrap too (the build's own sim_wheels() waits on the download's lock,
    # then finds them in build/wheels)
    with ThreadPoolExecutor(2) as pool:
        base = pool.submit(baseimage.ensure_base_image)
        wheels = pool.submit(sim_wheels)
        try:
            build_image(c, flavor="sim", save="build/images/sim.tar")
            wheels.result()
            base.result()
        except PdstackError as e:
            raise Exit(str(e), 1) from e
    testhost_up(c, count=count)
    deploy(c)
    print("\n==== pdstack demo: what was deployed ====")
    with c.cd(str(ROOT)):
        c.run(shlex.join([PY, "-m", "pdstack", "plan", "-i", "inventory/local", "--facts", "build/state/local/facts"]),
              echo=False, env=_env())
    summary = ROOT / "build" / "smoke" / "local" / "latest" / "summary.txt"
    print("\n==== pdstack demo: smoke checks ====")
    print(summary.read_text() if summary.exists() else f"(no smoke summary at {summary})")
    print("where to look: plan build/state/local/plan.json; smoke results, recall.png (heatmap) in "
          f"{summary.parent.resolve()}; units: docker exec pdstack-local-1 systemctl status 'pdstack-*'; "
          "remove the host: invoke testhost.down")


@task(help={"inventory": "inventory directory (default: ansible.cfg's, the local test host)",
            "json": "print JSON", "watch": "refresh every N seconds (0: once)"})
def status(c: Context, inventory: str = "", json: bool = False, watch: int = 0) -> None:
    """Read-only health of a deployment (`pdstack status`): exit 0 well, 1 attention, 2 bad inventory, 3 unreachable."""
    cmd = [PY, "-m", "pdstack", "status", "-i", inventory or default_inventory()]
    cmd += ["--json"] if json else []
    cmd += ["--watch", str(watch)] if watch else []
    with c.cd(str(ROOT)):
        r = c.run(shlex.join(cmd), echo=False, warn=True, pty=sys.stdout.isatty(), env=_env())
    if not r.ok:
        raise Exit(code=r.exited)


@task(help={"inventory": "inventory directory (default: ansible.cfg's, the local test host)",
            "tune_file": "the candidates (default: <inventory>.tune.yml)", "objective": "c1_decode_tps or "
            "aggregate_tps", "tpot_p99_ms_max": "aggregate_tps: the TPOT p99 bound (ms)",
            "check": "only plan the candidates, check the sweep and print the run's estimate",
            "skip": "a candidate to leave out, by name (repeatable)"}, iterable=["skip"])
def tune(c: Context, inventory: str = "", tune_file: str = "", objective: str = "", tpot_p99_ms_max: float = 0,
         check: bool = False, skip: list[str] | None = None) -> None:
    """Try the tune file's candidates on the running deployment (rolling restart, recall gate, SGLang's bench
    sweep), restore the plan, report the fastest that still recalls (`pdstack tune`; docs/tune.md)."""
    cmd = [PY, "-m", "pdstack", "tune", "-i", inventory or default_inventory()]
    cmd += ["--tune", tune_file] if tune_file else []
    cmd += ["--objective", objective] if objective else []
    cmd += ["--tpot-p99-ms-max", str(tpot_p99_ms_max)] if tpot_p99_ms_max else []
    cmd += ["--check"] if check else []
    cmd += [a for name in skip or [] for a in ("--skip", name)]
    with c.cd(str(ROOT)):
        r = c.run(shlex.join(cmd), echo=True, warn=True, pty=sys.stdout.isatty(), env=_env())
    if not r.ok:
        raise Exit(f"tune: exit {r.exited} (the lines above say why; results stay in build/tune/)", r.exited)


@task(help={"inventory": "inventory directory (default: ansible.cfg's, the local test host)"})
def rollback(c: Context, inventory: str = "") -> None:
    """Return every server and the router to the image deployed before the current one (kept on each host)."""
    cmd = [str(BIN / "ansible-playbook"), "playbooks/rollback.yml"] + (["-i", inventory] if inventory else [])
    with c.cd(str(ROOT)):
        r = c.run(shlex.join(cmd), echo=True, warn=True, pty=sys.stdout.isatty(), env=_env())
    if not r.ok:
        raise Exit("rollback failed; the failing task's message above says why", r.exited)


@task(help={"flavor": "prod (SGLang + our kernels and patches) or sim (the test engine + sglang-router)",
            "base": "base image: locked | local | an image reference (default: images/bases.yaml)",
            "save": "also write the image as a tarball (.tar or .tar.gz) plus PATH.sha256, for the playbooks",
            "push": "also push to this registry (REGISTRY/pdstack/<flavor>:<tag>)"})
def build_image(c: Context, flavor: str = "prod", base: str = "", save: str = "", push: str = "") -> None:
    """Build the serving (prod) or test-engine (sim) image; a no-op when an image of the same inputs exists."""
    _no_dry(c, "build")
    from pdstack.controller.imagebuild import manifest, pipeline
    from pdstack.errors import PdstackError
    try:
        m = pipeline.build(flavor=flavor, base=base or None, save=save or None, push=push or None)
    except PdstackError as e:
        raise Exit(f"invoke build: {e}", 1) from e
    print(manifest.format_manifest(m))


PROD_LOCK_CMD = ["pip", "compile", "--generate-hashes", "--python-platform", "x86_64-manylinux_2_36",
                 "--python-version", "3.11", "--no-emit-package", "nixl-cu12", "--quiet", "requirements/prod-image.in",
                 "-o", "requirements/prod-image.lock"]


@task(help={"upgrade": "re-resolve every package to its newest allowed version (default: keep what the lock has)"})
def lock_prod_image(c: Context, upgrade: bool = False) -> None:
    """Regenerate requirements/prod-image.lock (hash-locked serving stack) from requirements/prod-image.in with uv."""
    uv = BIN / "uv"
    if not uv.exists():
        raise Exit(f"{uv} is missing: run ./dev.sh setup (uv is pinned in requirements/lock.txt)", 1)
    with c.cd(str(ROOT)):
        c.run(shlex.join([str(uv), *PROD_LOCK_CMD, *(["--upgrade"] if upgrade else [])]), echo=True, env=_env())


DEV_LOCK_CMD = ["pip", "compile", "--no-deps", "--generate-hashes", "--python-version", "3.11", "--quiet",
                "requirements/dev.in", "-o", "requirements/lock.txt"]


@task
def lock_dev(c: Context) -> None:
    """Regenerate requirements/lock.txt (the dev venv, hash-locked) from requirements/dev.in with uv."""
    from pdstack.controller.imagebuild.pins import hash_local_wheels

    uv = BIN / "uv"
    if not uv.exists():
        raise Exit(f"{uv} is missing: run ./dev.sh setup (uv is pinned in requirements/lock.txt)", 1)
    # the machine's pip find-links (where the CPU torch wheel lies): uv reads no pip configuration
    probe = c.run(f"{BIN / 'python'} -m pip config get global.find-links", hide=True, warn=True)
    links = (os.environ.get("PIP_FIND_LINKS", "") + " " + (probe.stdout if probe.ok else "")).split()
    links = list(dict.fromkeys(links))
    with c.cd(str(ROOT)):
        c.run(shlex.join([str(uv), *DEV_LOCK_CMD, *(a for d in links for a in ("--find-links", d))]), echo=True,
              env=_env())
    lock_file = ROOT / "requirements" / "lock.txt"
    if c.config.run.dry:
        print(f"then: hash the wheels of {' '.join(links) or '(no find-links)'} that {lock_file} pins without a hash")
        return
    text, unhashed = hash_local_wheels(lock_file.read_text(), [Path(d.removeprefix("file://")) for d in links])
    lock_file.write_text(text)
    if unhashed:
        raise Exit(f"requirements/lock.txt: no hash for {', '.join(unhashed)} (no index or find-links folder has "
                   "its wheel): ./dev.sh would refuse the lock", 1)


build = Collection("build")
build.add_task(build_image, name="image", default=True)

testhost = Collection("testhost")
testhost.add_task(testhost_up, name="up")
testhost.add_task(testhost_down, name="down")
testhost.add_task(testhost_status, name="status")

lock = Collection("lock")
lock.add_task(lock_prod_image, name="prod-image")
lock.add_task(lock_dev, name="dev")

ns = Collection(lint, test, plan, deploy, status, tune, rollback, kernels, demo, testhost, build, lock)
ns.configure({"run": {"echo": True}})
