"""Local test hosts (pdstack.testing.testhost).

The fast tests need nothing. The slow ones boot real systemd containers on the local Docker engine; they skip only
when no engine answers (CI starts one with ./dev.sh setup). They use their own random prefix, so they never touch a
developer's `pdstack-local` hosts, and they remove everything they made.
"""

from __future__ import annotations

import hashlib
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
import yaml

from pdstack.errors import PdstackError
from pdstack.testing.testhost import access, baseimage, common, zipimport_cache
from pdstack.testing.testhost import hosts as testhosts
from pdstack.testing.testhost.inventory import inventory, inventory_for, write_inventory

REPO = Path(__file__).resolve().parents[1]
COLLECTIONS = REPO / ".collections"


# ---------------------------------------------------------------------------------------------------- fast


def test_unreachable_engine_says_how_to_fix(monkeypatch):
    monkeypatch.setenv("DOCKER_HOST", "unix:///nonexistent/docker.sock")
    with pytest.raises(PdstackError, match=r"\./dev\.sh setup"):
        common.client()


def test_base_image_tag_follows_the_recipe(monkeypatch):
    tag = baseimage.base_image_tag()
    assert tag.startswith("pdstack/testhost-base:") and len(tag.split(":")[1]) == 12
    assert baseimage.base_image_tag() == tag
    monkeypatch.setattr(baseimage, "INCLUDE", (*baseimage.INCLUDE, "less"))
    assert baseimage.base_image_tag() != tag


def _zip_import_in_a_fresh_python(tmp_path, cache_dir, body: str) -> subprocess.CompletedProcess:
    """A new interpreter with the cache installed (as the test host's .pth line does) imports `zmod` from a zip."""
    import zipfile

    z = tmp_path / f"payload-{uuid.uuid4().hex[:6]}.zip"  # a new path every time, like AnsiballZ's temp zip
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("zmod.py", body)
    code = (f"import sys; sys.path[:0] = [{str(REPO)!r}, {str(z)!r}]; "
            "from pdstack.testing.testhost import zipimport_cache as c; "
            f"c.CACHE_DIR = {str(cache_dir)!r}; c.install(); import zmod; print(zmod.where())")
    return subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)


def test_zipimport_cache_compiles_once_per_source_and_keeps_each_runs_path(tmp_path):
    import marshal

    cache = tmp_path / "cache"
    body = "def where():\n    return where.__code__.co_filename\n"
    one = _zip_import_in_a_fresh_python(tmp_path, cache, body)
    assert one.returncode == 0 and "payload-" in one.stdout, one.stderr
    [entry] = cache.iterdir()
    # what the next run executes comes from the cache: swap the entry for other code and the next import runs it,
    # under that run's own zip path (tracebacks point at what ran), not the first run's
    entry.write_bytes(marshal.dumps(compile("def where():\n    return 'cached ' + where.__code__.co_filename\n",
                                            "elsewhere.py", "exec")))
    two = _zip_import_in_a_fresh_python(tmp_path, cache, body)
    assert two.returncode == 0, two.stderr
    assert two.stdout.startswith("cached ") and "payload-" in two.stdout and two.stdout.split()[1] != one.stdout.strip()
    # a changed source is another entry; a torn or foreign cache file is compiled again, as without the cache
    assert _zip_import_in_a_fresh_python(tmp_path, cache, body + "X = 1\n").returncode == 0
    assert len(list(cache.iterdir())) == 2
    for f in cache.iterdir():
        f.write_bytes(b"\xe3\x00")
    three = _zip_import_in_a_fresh_python(tmp_path, cache, body)
    assert three.returncode == 0 and three.stdout.startswith(str(tmp_path)), three.stderr


def test_zipimport_cache_without_a_writable_directory_compiles_as_before(tmp_path):
    blocked = tmp_path / "file-not-dir"
    blocked.write_text("")
    r = _zip_import_in_a_fresh_python(tmp_path, blocked / "cache", "def where():\n    return 'ok'\n")
    assert (r.returncode, r.stdout.strip()) == (0, "ok"), r.stderr


def test_the_venv_install_caches_zip_imports_in_a_fresh_python_and_is_idempotent(tmp_path):
    """What ./dev.sh does for its venv: the two files in a site directory; a new interpreter that reads that site
    directory (as a venv's python reads its site-packages) caches what it imports from a zip, in the given dir."""
    import zipfile

    site_dir, cache = tmp_path / "site", tmp_path / "cache"
    site_dir.mkdir()
    assert zipimport_cache.install_into(str(site_dir), str(cache)) is True
    assert zipimport_cache.install_into(str(site_dir), str(cache)) is False  # the second run writes nothing
    z = tmp_path / "payload.zip"
    with zipfile.ZipFile(z, "w") as f:
        f.writestr("zmod2.py", "X = 41 + 1\n")
    code = (f"import site, sys; site.addsitedir({str(site_dir)!r}); sys.path.insert(0, {str(z)!r}); "
            "import zipimport, zmod2; print(zipimport._compile_source.__module__, zmod2.X)")
    r = subprocess.run([sys.executable, "-S", "-c", code], capture_output=True, text=True, timeout=60)
    assert (r.returncode, r.stdout.split()) == (0, ["pdstack_zipimport_cache", "42"]), r.stderr
    assert len(list(cache.iterdir())) == 1
    (site_dir / "pdstack_zipimport_cache.pth").write_text("import os\n")  # an edited or stale line is rewritten
    assert zipimport_cache.install_into(str(site_dir), str(cache)) is True


def test_base_image_installs_the_zipimport_cache_for_every_python3():
    files = baseimage.recipe()["files"]
    dist = "usr/lib/python3/dist-packages"
    assert files[f"{dist}/pdstack_zipimport_cache.pth"] == "import pdstack_zipimport_cache\n"
    assert "zipimport._compile_source = compile_source" in files[f"{dist}/pdstack_zipimport_cache.py"]


@pytest.mark.parametrize("bad", ["", "-x", "a b", "a/b", "x" * 49])
def test_prefix_is_checked(bad):
    with pytest.raises(PdstackError, match="invalid test host prefix"):
        testhosts.check_prefix(bad)


def test_inventory_reaches_hosts_over_ssh_through_docker_exec(tmp_path):
    """The written inventory carries the test inventories' own connection variables (connection.yml, one file)."""
    inv = inventory_for(["h-1", "h-2"])
    path = write_inventory(inv, tmp_path / "inv.yml")
    loaded = yaml.safe_load(path.read_text())
    assert loaded == inv
    conn = yaml.safe_load((REPO / "inventory/test/common/group_vars/all/connection.yml").read_text())
    assert loaded["all"]["vars"] == {**conn, "ansible_python_interpreter": "/usr/bin/python3"}
    assert conn["ansible_connection"] == "ssh" and conn["ansible_user"] == "root"
    assert "/pdstack/testing/testhost/ssh_connect.py %h %p" in conn["ansible_ssh_common_args"]
    assert "-o ProxyUseFdpass=yes" in conn["ansible_ssh_common_args"]
    assert conn["ansible_ssh_private_key_file"].endswith("/build/testhost/ssh/id_ed25519")
    assert loaded["all"]["children"]["testhosts"]["hosts"] == {
        "h-1": {"ansible_host": "h-1"},
        "h-2": {"ansible_host": "h-2"},
    }
    # the demo's inventory reads the same file
    local = REPO / "inventory/local/group_vars/all/connection.yml"
    assert local.is_symlink() and local.resolve() == (REPO / "inventory/test/common/group_vars/all/connection.yml")


def test_the_key_is_made_once_and_kept(tmp_path):
    key = tmp_path / "ssh" / "id_ed25519"
    pub = access.ensure_key(key)
    assert pub.startswith("ssh-ed25519 ") and pub.endswith(" pdstack test hosts")
    assert oct(key.stat().st_mode & 0o777) == "0o600"
    before = key.read_bytes()
    assert access.ensure_key(key) == pub and key.read_bytes() == before  # a second call makes nothing new
    assert sorted(p.name for p in key.parent.iterdir()) == [".lock", "id_ed25519", "id_ed25519.pub"]


# ------------------------------------------------------------------------------------------------ slow (real Docker)


@pytest.fixture(scope="module")
def engine():
    try:
        return common.client()
    except PdstackError as e:
        pytest.skip(f"no Docker engine reachable ({str(e).splitlines()[0]}); ./dev.sh setup starts one")


def _prefix() -> str:
    return f"pdstest-{uuid.uuid4().hex[:6]}"


def _labelled(engine, prefix: str) -> dict[str, set[str]]:
    f = {"label": [f"{common.LABEL}={prefix}"]}
    return {
        "containers": {c.name for c in engine.containers.list(all=True, filters=f)},
        "volumes": {v.name for v in engine.volumes.list(filters=f)},
        "networks": {n.name for n in engine.networks.list(filters=f)},
    }


@pytest.fixture(scope="module")
def hosts(engine):
    prefix = _prefix()
    try:
        names = testhosts.up(count=2, prefix=prefix)
        yield prefix, names
    finally:
        testhosts.down(prefix)


@pytest.mark.slow
def test_up_boots_systemd_hosts(engine, hosts):
    prefix, names = hosts
    assert names == [f"{prefix}-1", f"{prefix}-2"]
    for name in names:
        ct = engine.containers.get(name)
        assert ct.status == "running"
        assert ct.labels[common.LABEL] == prefix
        state = ct.exec_run(["systemctl", "is-system-running"]).output.decode().strip()
        assert state in ("running", "degraded"), f"{name}: systemd says {state}"
        assert ct.exec_run(["hostname"]).output.decode().strip() == name
        mounts = {m["Destination"]: m for m in ct.attrs["Mounts"]}
        assert mounts["/var/lib/docker"]["Name"] == testhosts.volume_name(name)
    assert [row["name"] for row in testhosts.status(prefix)] == names
    assert all(row["systemd"] in ("running", "degraded") and row["ip"] for row in testhosts.status(prefix))


@pytest.mark.slow
def test_hosts_answer_ansible_ping(hosts, tmp_path):
    prefix, names = hosts
    assert (COLLECTIONS / "ansible_collections/ansible/posix").is_dir(), "run ./dev.sh setup (extracts .collections)"
    inv = tmp_path / "inventory.yml"
    inventory(prefix, inv)
    env = {**os.environ, "ANSIBLE_COLLECTIONS_PATH": str(COLLECTIONS), "ANSIBLE_NOCOLOR": "1"}
    ansible = Path(sys.executable).parent / "ansible"
    res = subprocess.run(
        [str(ansible), "-i", str(inv), "all", "-m", "ansible.builtin.ping", "-o"],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert res.returncode == 0, res.stdout + res.stderr
    for name in names:
        assert any(line.startswith(f"{name} | SUCCESS") and "pong" in line for line in res.stdout.splitlines()), (
            res.stdout
        )

    # the base image's zipimport cache ran inside Ansible's own module run, and a second payload (another temp zip
    # path) reuses what the first compiled
    def cached(name: str) -> set[str]:
        out = subprocess.run(["docker", "exec", name, "ls", zipimport_cache.CACHE_DIR], capture_output=True,
                             text=True, check=True).stdout
        return set(out.split())

    first = {n: cached(n) for n in names}
    assert all(len(v) > 20 for v in first.values()), {n: len(v) for n, v in first.items()}
    again = subprocess.run([str(ansible), "-i", str(inv), "all", "-m", "ansible.builtin.ping", "-o"], cwd=REPO,
                           env=env, capture_output=True, text=True, timeout=180)
    assert again.returncode == 0, again.stdout + again.stderr
    assert {n: cached(n) for n in names} == first
    # it came over SSH, from the controller (the network's gateway): a session of root's, which docker exec never opens
    gateway = engine_gateway(prefix)
    for name in names:
        log = subprocess.run(["docker", "exec", name, "journalctl", "-q", "--no-pager", "-t", "sshd"],
                             capture_output=True, text=True, check=True).stdout
        assert f"Accepted publickey for root from {gateway} " in log, log[-2000:]
    # each host's ControlPersist master sits at connection.yml's ControlPath (ssh's %C: sha1 of this machine's name,
    # the host, port 22, root) until down() closes it, as the fixture's teardown does
    sockets = {n: access.CONTROL_DIR / ("pdstack-" + hashlib.sha1(f"{socket.gethostname()}{n}22root".encode())
                                        .hexdigest()) for n in names}
    assert all(p.is_socket() for p in sockets.values()), sockets
    access.close_masters(names)
    assert not any(p.exists() for p in sockets.values()), sockets


def engine_gateway(prefix: str) -> str:
    net = common.client().networks.get(testhosts.network_name(prefix))
    return net.attrs["IPAM"]["Config"][0]["Gateway"]


@pytest.mark.slow
def test_the_proxy_command_names_a_host_that_is_not_there(engine):
    script = REPO / "pdstack/testing/testhost/ssh_connect.py"
    r = subprocess.run(["/usr/bin/python3", "-I", str(script), "pdstack-no-such-host-1", "22"], capture_output=True,
                       text=True, timeout=60)
    assert r.returncode != 0
    assert "no running test host container 'pdstack-no-such-host-1'" in r.stderr and "invoke testhost.up" in r.stderr
    r = subprocess.run(["/usr/bin/python3", "-I", str(script), "h"], capture_output=True, text=True, timeout=60)
    assert r.returncode != 0 and "usage: ssh_connect.py HOST PORT" in r.stderr


@pytest.mark.slow
def test_second_up_changes_nothing(engine, hosts):
    prefix, names = hosts

    def snapshot():
        cts = {n: engine.containers.get(n) for n in names}
        return _labelled(engine, prefix), {n: (c.id, c.attrs["State"]["StartedAt"]) for n, c in cts.items()}

    before = snapshot()
    assert testhosts.up(count=2, prefix=prefix) == names
    # the controller's key, authorized by each up, is there once
    key = access.KEY.with_name(access.KEY.name + ".pub").read_text().strip()
    for name in names:
        lines = engine.containers.get(name).exec_run(["cat", "/root/.ssh/authorized_keys"]).output.decode().splitlines()
        assert lines.count(key) == 1, lines
    assert snapshot() == before


@pytest.mark.slow
def test_up_starts_a_stopped_host_and_keeps_its_volume(engine, hosts):
    prefix, names = hosts
    ct = engine.containers.get(names[1])
    ct.exec_run(["touch", "/var/lib/docker/marker"])
    ct.stop(timeout=20)  # RTMIN+3: systemd halts in about a second
    assert testhosts.up(count=2, prefix=prefix) == names
    ct.reload()
    assert ct.status == "running"
    assert ct.exec_run(["test", "-e", "/var/lib/docker/marker"]).exit_code == 0
    assert ct.exec_run(["systemctl", "is-system-running"]).output.decode().strip() in ("running", "degraded")


@pytest.mark.slow
def test_up_refuses_a_foreign_container_with_a_host_name(engine):
    prefix = _prefix()
    image = baseimage.ensure_base_image()
    foreign = engine.containers.create(image, name=f"{prefix}-1")
    try:
        with pytest.raises(PdstackError, match="not made by pdstack testhost"):
            testhosts.up(count=1, prefix=prefix)
        engine.containers.get(foreign.id)  # still there
    finally:
        foreign.remove(force=True)
        testhosts.down(prefix)


@pytest.mark.slow
def test_down_removes_exactly_what_up_made(engine, hosts):
    prefix, names = hosts
    image = baseimage.ensure_base_image()
    other = f"{prefix}-other"
    decoys = {
        # Same naming pattern, no label: down must select by label, not by name.
        "container": engine.containers.create(image, name=f"{prefix}-3"),
        "volume": engine.volumes.create(testhosts.volume_name(f"{prefix}-3")),
        "network": engine.networks.create(f"{prefix}-decoy"),
        # Labelled, but for another prefix.
        "other": engine.containers.create(image, name=f"{other}-1", labels={common.LABEL: other}),
    }
    try:
        expected = {
            "containers": names,
            "volumes": [testhosts.volume_name(n) for n in names],
            "networks": [testhosts.network_name(prefix)],
        }
        assert _labelled(engine, prefix) == {k: set(v) for k, v in expected.items()}
        assert testhosts.down(prefix) == expected
        assert _labelled(engine, prefix) == {"containers": set(), "volumes": set(), "networks": set()}
        engine.containers.get(decoys["container"].id)
        engine.volumes.get(decoys["volume"].name)
        engine.networks.get(decoys["network"].id)
        engine.containers.get(decoys["other"].id)
        engine.images.get(image)  # the base image cache stays
        assert testhosts.down(prefix) == {"containers": [], "volumes": [], "networks": []}
    finally:
        decoys["container"].remove(force=True)
        decoys["other"].remove(force=True)
        decoys["volume"].remove(force=True)
        decoys["network"].remove()
