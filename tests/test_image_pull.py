"""The image phase pulling by digest from a real registry (Debian's docker-registry, distribution 2.8, started on
the controller for the test), against a systemd test host.

`invoke build --flavor sim --push 127.0.0.1:PORT` (the controller reaches the registry on loopback); the test host
reaches the same registry at its network's gateway, plain HTTP, so the test writes `insecure-registries` into the
host's /etc/docker/daemon.json (the test host only: pdstack never writes daemon.json). Then: a digest the manifest
did not push fails in preflight with nothing on the host; site.yml (tags host,image) pulls by digest, tags the
image as the plan's tag, checks its id and labels against the manifest and records it for rollback, without any
tarball; the second run and check mode change nothing; a digest the registry lacks fails with the fix and changes
nothing; the tarball path checks the manifest's id and labels too; without insecure-registries the failure names
that setting.

PDSTACK_SHIP_PROD=1 also measures shipping the prod image (~11 GB) to the test host once, with the real image
phase: `docker save` + tarball copy + `docker load`, then push + pull by digest (figures printed and written to
build/ship-prod.json; docs/images.md, "Shipping 11 GB", quotes them). It needs ~35 GB of free disk and refuses to start
with less than that plus a 10 GB margin.
Slow: CI runs it (dev.sh installs docker-registry).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
import site_helpers
from site_helpers import BIN, ROOT, changed_tasks, engine_or_skip, host_file, recap, sh

# pyproject.toml's pdstack_shared_host_tests lists this file: one xdist worker runs every test of the pdstack-pull-N
# hosts, in file order (pdstack/testing/parallel.py)
pytestmark = pytest.mark.slow

# the one-host layout on a host of its own (inventory/test/pull-host), so this file runs beside tests/test_site.py
ONE = ROOT / "inventory" / "test" / "pull-host"

PREFIX = "pdstack-pull"  # inventory/test/pull-host names pdstack-pull-1
HOST = "pdstack-pull-1"
REGISTRY_BIN = shutil.which("docker-registry") or "/usr/bin/docker-registry"
WRONG = "sha256:" + "1" * 64


def playbook(*args: str, timeout: int = 1800) -> subprocess.CompletedProcess:
    return site_helpers.playbook(ONE, *args, timeout=timeout)


def image_vars(**image) -> str:
    return json.dumps({"pdstack_image": {"engine": "sim", **image}})


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def registry(tmp_path_factory):
    """docker-registry on 0.0.0.0:PORT (the controller pushes on loopback, test hosts pull at their gateway)."""
    engine_or_skip()
    if not Path(REGISTRY_BIN).exists():
        if os.environ.get("CI"):
            pytest.fail("CI=true but docker-registry is not installed; ./dev.sh setup installs it")
        pytest.skip("docker-registry is not installed (apt-get install docker-registry; ./dev.sh setup does)")
    d = tmp_path_factory.mktemp("registry")
    port = _free_port()
    (d / "config.yml").write_text(
        "version: 0.1\nlog:\n  level: warn\nstorage:\n  filesystem:\n    rootdirectory: " + str(d / "data") +
        f"\nhttp:\n  addr: 0.0.0.0:{port}\n")
    log = open(d / "registry.log", "w")
    proc = subprocess.Popen([REGISTRY_BIN, "serve", str(d / "config.yml")], stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 30
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/v2/", timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None and time.monotonic() < deadline, (d / "registry.log").read_text()
            time.sleep(0.2)
        yield {"port": port, "dir": d / "data"}
    finally:
        proc.terminate()
        proc.wait(timeout=30)
        log.close()
        shutil.rmtree(d / "data", ignore_errors=True)


@pytest.fixture(scope="module")
def host(registry):
    """One fresh test host whose Docker (installed by the host phase) trusts the plain-HTTP registry."""
    from pdstack.testing.testhost import common, hosts
    hosts.down(prefix=PREFIX)
    hosts.up(count=1, prefix=PREFIX)
    try:
        net = common.client().networks.get(hosts.network_name(PREFIX))
        gateway = net.attrs["IPAM"]["Config"][0]["Gateway"]
        reg = f"{gateway}:{registry['port']}"
        # The test host's setting, written before the host phase installs Docker: a plain-HTTP registry that is
        # not on loopback must be listed, or docker pull insists on HTTPS.
        daemon = json.dumps({"insecure-registries": [reg]})
        assert sh(HOST, "sh", "-c", f"mkdir -p /etc/docker && printf '%s\\n' '{daemon}' > /etc/docker/daemon.json"
                  ).returncode == 0
        yield {"name": HOST, "registry": reg}
    finally:
        hosts.down(prefix=PREFIX)


@pytest.fixture(scope="module")
def pushed(registry, tmp_path_factory):
    """`invoke build --flavor sim --push 127.0.0.1:PORT`: the manifest with pushed.digest_ref, written to a file of
    this module's own (`manifest_file`): build/manifest-sim.json and build/images/sim.tar are what the deploying
    tests on the other worker read at the same time."""
    from pdstack.controller.imagebuild.pipeline import build
    own = tmp_path_factory.mktemp("manifest") / "manifest-sim.json"
    m = build("sim", push=f"127.0.0.1:{registry['port']}", manifest=own)
    m["manifest_file"] = str(own)
    yield m
    subprocess.run(["docker", "rmi", m["pushed"]["ref"]], capture_output=True, timeout=60)  # the push's tag only


def _digest(m: dict) -> str:
    return m["pushed"]["digest_ref"].rpartition("@")[2]


def test_a_digest_the_manifest_did_not_push_fails_before_the_host_changes(host, pushed):
    r = playbook("--tags", "host,image", "-e", image_vars(manifest=pushed["manifest_file"],
                                                          registry=host["registry"], digest=WRONG))
    assert r.returncode != 0
    assert f"pdstack_image.digest: {WRONG} is not the digest" in r.stdout, r.stdout[-3000:]
    assert _digest(pushed) in r.stdout and "remove digest to use the manifest's" in r.stdout
    assert host_file(HOST, "/etc/pdstack/plan.json") is None
    assert sh(HOST, "test", "-e", "/usr/bin/docker").returncode != 0


@pytest.fixture(scope="module")
def pulled(host, pushed):
    """site.yml's host + image phases with pdstack_image.registry: (result, seconds)."""
    t0 = time.monotonic()
    r = playbook("--tags", "host,image", "-e", image_vars(manifest=pushed["manifest_file"],
                                                          registry=host["registry"]))
    assert r.returncode == 0, r.stdout[-6000:]
    return r, time.monotonic() - t0


def test_the_image_phase_pulls_by_digest_and_a_second_run_changes_nothing(host, pushed, pulled):
    r, _ = pulled
    ref = f"{host['registry']}/pdstack/sim@{_digest(pushed)}"
    assert f"pulled {ref}" in r.stdout, r.stdout[-4000:]
    assert "Image | copy the tarball" not in r.stdout
    info = json.loads(sh(HOST, "docker", "image", "inspect", pushed["tag"]).stdout)[0]
    assert info["Id"] == pushed["image_id"]  # the very build the manifest describes, under the plan's tag
    assert ref in info["RepoDigests"]
    assert info["Config"]["Labels"]["io.pdstack.inputs.sha256"] == pushed["inputs_sha256"]
    assert sh(HOST, "sh", "-c", "ls /var/lib/pdstack/images/*.tar").returncode != 0  # no tarball was copied
    assert json.loads(host_file(HOST, "/etc/pdstack/images.json"))["current"] == pushed["tag"]
    vars_ = image_vars(manifest=pushed["manifest_file"], registry=host["registry"])
    again = playbook("--tags", "host,image", "-e", vars_)
    assert again.returncode == 0, again.stdout[-4000:]
    assert recap(again.stdout)[HOST]["changed"] == 0, changed_tasks(again.stdout)
    assert f"pulled {ref}" not in again.stdout  # present by digest: no pull
    check = playbook("--tags", "host,image", "--check", "-e", vars_)
    assert check.returncode == 0, check.stdout[-4000:]
    assert recap(check.stdout)[HOST]["changed"] == 0, changed_tasks(check.stdout)


def test_a_digest_the_registry_lacks_fails_with_the_fix_and_changes_nothing(host, pulled):
    record = host_file(HOST, "/etc/pdstack/images.json")
    ref = f"{host['registry']}/pdstack/sim@{WRONG}"
    r = playbook("--tags", "image", "-e", image_vars(ref=ref, registry=host["registry"]))
    assert r.returncode != 0
    assert f"docker pull {ref} failed on {HOST}, nothing changed there" in r.stdout, r.stdout[-3000:]
    assert f"{host['registry']} has no image with digest {WRONG}" in r.stdout
    assert recap(r.stdout)[HOST]["changed"] == 0
    assert host_file(HOST, "/etc/pdstack/images.json") == record


def test_the_tarball_path_checks_the_manifests_id_and_labels_too(host, pushed, pulled, tmp_path):
    from pdstack.controller.imagebuild.pipeline import build
    tar = tmp_path / "sim.tar"
    saved = build("sim", save=str(tar), manifest=Path(pushed["manifest_file"]))
    try:  # the 1.7 GB tarball goes, whatever happens
        _tarball_path_checks(host, pushed, saved, tmp_path)
    finally:
        for f in (tar, tar.with_name(tar.name + ".sha256"), tar.with_name(tar.name + ".json")):
            f.unlink(missing_ok=True)


def _tarball_path_checks(host, pushed, saved, tmp_path):
    assert saved["pushed"] == pushed["pushed"]  # a build without --push keeps the push record of the same image
    assert sh(HOST, "docker", "rmi", pushed["tag"], f"{host['registry']}/pdstack/sim@{_digest(pushed)}").returncode == 0
    r = playbook("--tags", "image", "-e", image_vars(manifest=pushed["manifest_file"]))
    assert r.returncode == 0, r.stdout[-4000:]
    assert "Image | docker load" in r.stdout and recap(r.stdout)[HOST]["changed"] > 0
    assert json.loads(sh(HOST, "docker", "image", "inspect", pushed["tag"]).stdout)[0]["Id"] == pushed["image_id"]
    # a manifest that describes another build: refused before the serving phase, naming both ids
    other = dict(saved, image_id="sha256:" + "2" * 64)
    (tmp_path / "manifest-sim.json").write_text(json.dumps(other))
    r = playbook("--tags", "image", "-e", image_vars(manifest=str(tmp_path / "manifest-sim.json")))
    assert r.returncode != 0
    assert f"{pushed['tag']} on {HOST} is not the build the manifest describes: id {pushed['image_id']}" in r.stdout, \
        r.stdout[-3000:]
    assert "sha256:" + "2" * 64 in r.stdout and "save it again (invoke build --save PATH)" in r.stdout


def test_a_plain_http_registry_the_host_does_not_trust_names_insecure_registries(host, pulled):
    # last: takes the test host's insecure-registries setting away
    assert sh(HOST, "sh", "-c", "rm /etc/docker/daemon.json && systemctl restart docker").returncode == 0
    ref = f"{host['registry']}/pdstack/sim@{WRONG}"
    r = playbook("--tags", "image", "-e", image_vars(ref=ref, registry=host["registry"]))
    assert r.returncode != 0
    assert "serves plain HTTP and the host's Docker expects HTTPS" in r.stdout, r.stdout[-3000:]
    assert f'add "insecure-registries": ["{host["registry"]}"] to /etc/docker/daemon.json' in r.stdout


# ------------------------------------------------------------------ the 11 GB prod image, measured once

def _task_seconds(out: str, name: str) -> float:
    """Seconds profile_tasks reports for the task named `name` (the TASKS RECAP)."""
    m = re.search(rf"^image : {re.escape(name)}.*?-+ ([0-9.]+)s$", out, re.M)
    return float(m.group(1)) if m else float("nan")


def _free_gb() -> float:
    return shutil.disk_usage("/var/lib/docker").free / 1e9


class _LowestFree:
    """Samples the free disk every second while shipping (the figure says how close it came to the 10 GB floor)."""

    def __enter__(self):
        import threading
        self.lowest, self._stop = _free_gb(), threading.Event()
        self._t = threading.Thread(target=self._run, daemon=True)
        self._t.start()
        return self

    def _run(self):
        while not self._stop.wait(1.0):
            self.lowest = min(self.lowest, _free_gb())

    def __exit__(self, *exc):
        self._stop.set()
        self._t.join()


def _say(msg: str) -> None:
    print(f"[ship-prod] {msg} ({_free_gb():.1f} GB free)", file=sys.stderr, flush=True)


@pytest.mark.skipif(not os.environ.get("PDSTACK_SHIP_PROD"), reason="set PDSTACK_SHIP_PROD=1 to measure (~35 GB)")
def test_ship_the_prod_image_to_a_test_host_once(host, registry):
    """The real image phase, both ways. The tarball is gzip -1 (`--save build/images/prod.tar.gz`): docker load
    unpacks the whole archive into the daemon's tmp before it registers the layers, so a plain .tar needs ~4x the
    image on this one disk at the peak (controller tarball + host copy + unpacked + layers), a .tar.gz ~3x."""
    # after the pull tests: the host's Docker must trust the registry again
    sh(HOST, "sh", "-c", f"printf '%s\\n' '{json.dumps({'insecure-registries': [host['registry']]})}' > "
       "/etc/docker/daemon.json && systemctl restart docker")
    from pdstack.controller.imagebuild.pipeline import build
    m = build("prod")
    size = m["size_bytes"] / 1e9
    fig: dict = {"tag": m["tag"], "image_bytes": m["size_bytes"], "free_gb_before": round(_free_gb(), 1)}
    _say(f"prod image {m['tag']}: {size:.1f} GB")
    if _free_gb() < size + 10:
        pytest.skip(f"{_free_gb():.1f} GB free: saving {size:.1f} GB needs {size + 10:.1f}")
    tar = ROOT / "build" / "images" / "prod.tar.gz"
    with _LowestFree() as low:
        try:
            t0 = time.monotonic()
            saved = build("prod", save=str(tar))["saved"]
            fig["save_s"], fig["tarball_bytes"] = round(time.monotonic() - t0, 1), saved["bytes"]
            _say(f"saved {saved['bytes'] / 1e9:.1f} GB in {fig['save_s']} s")
            gz = saved["bytes"] / 1e9
            # the phase: this tarball + its copy on the host + unpacked + the layers, and 10 GB left; the same
            # commands by hand can drop this tarball once it is copied
            need_phase, need_split = 2 * gz + 2 * size + 10, gz + 2 * size + 10
            if _free_gb() >= need_phase:
                fig["mode"] = "the image phase (ansible-playbook site.yml --tags image)"
                t0 = time.monotonic()
                r = playbook("--tags", "image", "-e", image_vars(ref=m["tag"], tarball=str(tar)))
                fig["load_phase_s"] = round(time.monotonic() - t0, 1)
                assert r.returncode == 0, r.stdout[-4000:]
                for k, name in [("copy_s", "Image | copy the tarball"), ("sha256_s", "Image | checksum the copy"),
                                ("docker_load_s", "Image | docker load")]:
                    fig[k] = _task_seconds(r.stdout, name)
            elif _free_gb() >= need_split:
                fig["mode"] = ("the image phase's commands one by one (its copy module, sha256, docker load), the "
                               f"controller's tarball removed before the load: {_free_gb():.1f} GB free < "
                               f"{need_phase:.1f} for the phase")
                _say(fig["mode"])
                dest = "/var/lib/pdstack/images/prod.tar.gz"
                env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
                t0 = time.monotonic()
                r = subprocess.run([str(BIN / "ansible"), HOST, "-i", str(ONE), "-m", "ansible.builtin.copy", "-a",
                                    f"src={tar} dest={dest} mode=0600"], cwd=ROOT, env=env, capture_output=True,
                                   text=True, timeout=3600)
                fig["copy_s"] = round(time.monotonic() - t0, 1)
                assert r.returncode == 0, r.stdout[-3000:] + r.stderr[-3000:]
                tar.unlink()
                t0 = time.monotonic()
                r2 = sh(HOST, "sha256sum", dest, timeout=3600)
                fig["sha256_s"] = round(time.monotonic() - t0, 1)
                assert r2.stdout.split()[0] == saved["sha256"], r2.stdout + r2.stderr
                t0 = time.monotonic()
                r3 = sh(HOST, "docker", "load", "--input", dest, timeout=3600)
                fig["docker_load_s"] = round(time.monotonic() - t0, 1)
                assert r3.returncode == 0, r3.stdout + r3.stderr
                sh(HOST, "rm", "-f", dest)
                fig["load_phase_s"] = round(fig["copy_s"] + fig["sha256_s"] + fig["docker_load_s"], 1)
            else:
                pytest.skip(f"{_free_gb():.1f} GB free after the save: loading on the test host needs "
                            f"{need_split:.1f}")
            _say(f"copy + sha256 + load: {fig['load_phase_s']} s ({fig['mode']})")
        finally:
            for f in (tar, tar.with_name(tar.name + ".sha256"), tar.with_name(tar.name + ".json")):
                f.unlink(missing_ok=True)
        fig["lowest_free_gb_load"] = round(low.lowest, 1)
    assert sh(HOST, "docker", "rmi", m["tag"], timeout=600).returncode == 0  # room for the pull
    need = 2 * gz + size + 10  # the registry's blobs, the host's download of them, the layers; 10 GB left
    if _free_gb() < need:
        (ROOT / "build" / "ship-prod.json").write_text(json.dumps(fig, indent=2) + "\n")
        pytest.skip(f"{_free_gb():.1f} GB free: push + pull need {need:.1f} (load figures in build/ship-prod.json)")
    with _LowestFree() as low:
        t0 = time.monotonic()
        p = build("prod", push=f"127.0.0.1:{registry['port']}")["pushed"]
        fig["push_s"] = round(time.monotonic() - t0, 1)
        fig["registry_bytes"] = sum(f.stat().st_size for f in registry["dir"].rglob("*") if f.is_file())
        _say(f"pushed {p['digest_ref']} in {fig['push_s']} s ({fig['registry_bytes'] / 1e9:.1f} GB in the registry)")
        try:
            ref = f"{host['registry']}/pdstack/sglang@{p['digest_ref'].rpartition('@')[2]}"
            t0 = time.monotonic()
            r = playbook("--tags", "image", "-e", image_vars(ref=ref, registry=host["registry"]))
            fig["pull_phase_s"] = round(time.monotonic() - t0, 1)
            assert r.returncode == 0, r.stdout[-4000:]
            fig["pull_line"] = " ".join(next((ln for ln in r.stdout.split("\n\n") if "msg: pulled " in ln), "").split())
            fig["pull_progress_lines"] = r.stdout.count("pulling " + ref)
            _say(f"image phase (pull): {fig['pull_phase_s']} s")
        finally:
            subprocess.run(["docker", "rmi", p["ref"]], capture_output=True, timeout=120)
        fig["lowest_free_gb_pull"] = round(low.lowest, 1)
    out = ROOT / "build" / "ship-prod.json"
    out.write_text(json.dumps(fig, indent=2) + "\n")
    print(json.dumps(fig, indent=2), file=sys.stderr, flush=True)
