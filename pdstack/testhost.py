"""Local test hosts: Debian bookworm booted with systemd, as Docker containers, reachable by Ansible.

    ensure_base_image()           build the base image (debootstrap + docker import) once; cached by recipe hash
    up(count, prefix)             a network + hosts `<prefix>-1..count`, each booted until systemd says running
    down(prefix)                  remove exactly what `up` made: containers, /var/lib/docker volumes, network
    status(prefix)                one dict per host (format_status() makes it a table)
    inventory(prefix, path=None)  Ansible inventory (community.docker.docker connection); written when path given

Every object `up` creates carries the label `io.pdstack.testhost=<prefix>`; `down` selects by that label alone,
so it never touches the base image, another prefix's hosts, or anything a person made by hand.
No registry is reachable here: nothing is ever pulled.
"""

from __future__ import annotations

import collections
import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pdstack.controller.locks import exclusive
from pdstack.errors import PdstackError

LABEL = "io.pdstack.testhost"
BASE_LABEL = "io.pdstack.testhost.base"
BASE_REPO = "pdstack/testhost-base"
DEFAULT_PREFIX = "pdstack-local"
BOOT_TIMEOUT_S = 90.0
LOCK_PATH = Path("/run/lock/pdstack-testhost-base.lock")
MIRROR = os.environ.get("PDSTACK_DEBIAN_MIRROR", "http://deb.debian.org/debian")

SETUP_HINT = "run ./dev.sh setup"

# The base image recipe. Everything here feeds the image tag, so changing any of it builds a new image.
SUITE = "bookworm"
VARIANT = "minbase"
# FACTS.md's set, plus what deploying into the host needs without a network round trip:
# python3-apt for ansible.builtin.apt, ca-certificates for https apt sources (e.g. a vendor repo), procps for ps/pgrep.
INCLUDE = (
    "systemd",
    "systemd-sysv",
    "dbus",
    "openssh-server",
    "python3",
    "python3-apt",
    "sudo",
    "iproute2",
    "ca-certificates",
    "procps",
)
IMAGE_CHANGES = ('CMD ["/sbin/init"]', "ENV container=docker")

# Files written into the root file system after debootstrap (path -> content).
ROOTFS_FILES = {
    # Updates and security too, like a real host; debootstrap writes only the release itself.
    "etc/apt/sources.list": (
        "deb http://deb.debian.org/debian bookworm main\n"
        "deb http://deb.debian.org/debian bookworm-updates main\n"
        "deb http://deb.debian.org/debian-security bookworm-security main\n"
    ),
    # Empty machine-id: systemd makes one per container at boot instead of every host sharing the build's.
    "etc/machine-id": "",
    # Per-host SSH host keys at first boot (the build's keys are deleted; sshd refuses to start without keys).
    "etc/systemd/system/pdstack-ssh-hostkeys.service": (
        "[Unit]\n"
        "Description=Generate this test host's SSH host keys (pdstack)\n"
        "Before=ssh.service\n"
        "ConditionPathExists=!/etc/ssh/ssh_host_ed25519_key\n"
        "\n"
        "[Service]\n"
        "Type=oneshot\n"
        "ExecStart=/usr/bin/ssh-keygen -A\n"
        "\n"
        "[Install]\n"
        "WantedBy=multi-user.target ssh.service\n"
    ),
}
ROOTFS_SYMLINKS = {
    "etc/systemd/system/multi-user.target.wants/pdstack-ssh-hostkeys.service": "../pdstack-ssh-hostkeys.service",
    "etc/systemd/system/ssh.service.wants/pdstack-ssh-hostkeys.service": "../pdstack-ssh-hostkeys.service",
}
# Removed after debootstrap: build-machine leftovers and caches (globs, relative to the root).
ROOTFS_REMOVE = (
    "etc/ssh/ssh_host_*",
    "var/lib/dbus/machine-id",
    "etc/resolv.conf",
    "var/cache/apt/archives/*.deb",
    "var/lib/apt/lists/*_*",
    "var/log/bootstrap.log",
)

# `docker run` flags FACTS.md measured to boot systemd here (--privileged fails: CAP_SYS_RESOURCE is not in the
# bounding set). RTMIN+3 is systemd's "halt" signal: without it `docker stop` waits its full 10 s.
HOST_RUN_KWARGS: dict[str, Any] = {
    "stop_signal": "RTMIN+3",
    "cap_add": ["ALL"],
    "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    "cgroupns": "host",
    "tmpfs": {"/run": "", "/run/lock": "", "/tmp": ""},
}


class TesthostError(PdstackError):
    """A local test host could not be built, booted or removed."""

    exit_code = 4


def echo(msg: str) -> None:
    """Progress for people, on stderr (stdout stays free for machine output)."""
    print(f"[testhost] {msg}", file=sys.stderr, flush=True)


# ---------------------------------------------------------------------------------------------------- docker engine


def client():
    """A docker SDK client that has answered a ping, or a TesthostError that says how to get one."""
    import docker
    from docker.errors import DockerException

    where = os.environ.get("DOCKER_HOST", "unix:///var/run/docker.sock")
    try:
        c = docker.from_env(timeout=120)
        c.ping()
    except DockerException as e:
        hint = SETUP_HINT + " (it installs docker.io and starts dockerd)"
        if "Permission denied" in str(e):
            hint = "run as root, or add this user to the docker group"
        raise TesthostError(f"cannot reach the Docker engine at {where}: {e}\nFix: {hint}") from e
    return c


def _labels(prefix: str) -> dict[str, str]:
    return {LABEL: prefix}


def _filters(prefix: str) -> dict[str, list[str]]:
    return {"label": [f"{LABEL}={prefix}"]}


def _check_prefix(prefix: str) -> None:
    ok = prefix and prefix[0].isalnum() and all(ch.isalnum() or ch in "-_." for ch in prefix)
    if not ok or len(prefix) > 48:
        raise TesthostError(
            f"invalid test host prefix {prefix!r}: use 1-48 letters, digits, '-', '_' or '.', starting alphanumeric"
        )


# ---------------------------------------------------------------------------------------------------- base image


def recipe() -> dict[str, Any]:
    """Everything that decides the base image's content; its hash is the image tag."""
    return {
        "suite": SUITE,
        "variant": VARIANT,
        "include": list(INCLUDE),
        "changes": list(IMAGE_CHANGES),
        "files": ROOTFS_FILES,
        "symlinks": ROOTFS_SYMLINKS,
        "remove": list(ROOTFS_REMOVE),
    }


def base_image_tag() -> str:
    digest = hashlib.sha256(json.dumps(recipe(), sort_keys=True).encode()).hexdigest()[:12]
    return f"{BASE_REPO}:{digest}"


def _image_exists(c, tag: str) -> bool:
    from docker.errors import ImageNotFound

    try:
        c.images.get(tag)
        return True
    except ImageNotFound:
        return False


def _build_lock():
    """One base image build at a time on this machine (several engineers/CI jobs share one engine)."""
    return exclusive(LOCK_PATH, "base image build", echo)


def ensure_base_image() -> str:
    """Build the test host base image unless an image with this recipe's tag exists; return the tag."""
    c = client()
    tag = base_image_tag()
    if _image_exists(c, tag):
        return tag
    _preflight_build()
    with _build_lock():
        if _image_exists(c, tag):  # built by whoever held the lock
            return tag
        t0 = time.monotonic()
        root = Path(tempfile.mkdtemp(prefix="pdstack-testhost-rootfs-", dir="/var/tmp"))
        try:
            _debootstrap(root)
            _customize_rootfs(root)
            _import(c, root, tag)
        finally:
            _remove_rootfs(root)
        echo(f"base image {tag} built in {time.monotonic() - t0:.0f} s")
    return tag


def _debootstrap_bin() -> str | None:
    return shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")


def _preflight_build() -> None:
    if os.geteuid() != 0:
        raise TesthostError(
            "building the test host base image runs debootstrap, which needs root\n"
            "Fix: run as root (e.g. sudo ./dev.sh setup, then sudo .venv/bin/invoke testhost.up)"
        )
    if _debootstrap_bin() is None:
        raise TesthostError(f"debootstrap is not installed\nFix: {SETUP_HINT} (or apt-get install debootstrap)")
    if shutil.which("tar") is None:
        raise TesthostError("tar is not installed\nFix: apt-get install tar")


class _DebootstrapProgress:
    """Turns debootstrap's `I: ...` lines into one progress line: phase, counts, percent and ETA.

    The package count is known only once downloading ends; from then on each package is unpacked once and
    configured once, which is what the percentage counts (downloading is given the first DOWNLOAD_SHARE of the bar).
    On a terminal the line is redrawn in place; in a log it is printed at each phase change and every 10 s.
    """

    DOWNLOAD_SHARE = 0.4

    def __init__(self, out=sys.stderr):
        self.out = out
        self.tty = out.isatty()
        self.t0 = time.monotonic()
        self.install_t0: float | None = None
        self.downloaded = self.unpacked = self.configured = 0
        self.phase = "resolving"
        self.last_print = 0.0
        self.last_phase_printed = ""

    def feed(self, line: str) -> None:
        if not line.startswith("I: "):
            return
        words = line[3:].split()
        if len(words) < 2:
            return
        verb, obj = words[0], words[1]
        pkg = obj not in ("the", "required")  # "Unpacking the base system...", "Configuring required packages..."
        if verb == "Validating" and obj not in ("Packages", "InRelease", "Release"):
            self.downloaded += 1
            self.phase = "downloading"
        elif verb == "Retrieving":
            self.phase = "downloading"
        elif verb in ("Extracting", "Installing"):
            self.phase = "extracting" if verb == "Extracting" else "installing core packages"
        elif verb in ("Unpacking", "Configuring"):
            if self.install_t0 is None:
                self.install_t0 = time.monotonic()
            if pkg:
                if verb == "Unpacking":
                    self.unpacked += 1
                else:
                    self.configured += 1
            if obj == "the" or self.phase not in ("installing core packages", "installing"):
                self.phase = "installing"
        elif verb == "Base":
            self.phase = "installed"
        self.render()

    def fraction(self) -> float | None:
        if self.install_t0 is None or not self.downloaded:
            return None
        done = min(1.0, (self.unpacked + self.configured) / (2 * self.downloaded))
        return self.DOWNLOAD_SHARE + (1 - self.DOWNLOAD_SHARE) * done

    def render(self, final: bool = False) -> None:
        now = time.monotonic()
        elapsed = now - self.t0
        frac = 1.0 if final else self.fraction()
        if frac is None:
            bar, eta_s = "[" + " " * 30 + "]    ", ""
        else:
            bar = f"[{'#' * int(frac * 30):<30}] {frac * 100:3.0f}%"
            eta_s = ""
            part = (frac - self.DOWNLOAD_SHARE) / (1 - self.DOWNLOAD_SHARE)
            if not final and self.install_t0 is not None and part > 0.1:
                spent = now - self.install_t0
                eta_s = f", ~{spent / part - spent:.0f} s left"
        counts = f"{self.downloaded} packages"
        if self.install_t0 is not None:
            counts += f", {self.unpacked} unpacked, {self.configured} configured"
        text = f"debootstrap {bar} {elapsed:3.0f} s{eta_s}  {self.phase} ({counts})"
        if self.tty:
            self.out.write("\r\033[K[testhost] " + text + ("\n" if final else ""))
            self.out.flush()
        elif final or self.phase != self.last_phase_printed or now - self.last_print >= 10:
            echo(text)
            self.last_print, self.last_phase_printed = now, self.phase


def run_debootstrap(variant: str, include: list[str], suite: str, root: Path, what: str) -> tuple[int, list[str]]:
    """debootstrap into `root` with a progress line; (exit code, last lines of its output)."""
    cmd = [_debootstrap_bin() or "debootstrap", f"--variant={variant}", f"--include={','.join(include)}", suite,
           str(root), MIRROR]
    echo(f"building {what}: {' '.join(cmd)} (about a minute)")
    progress = _DebootstrapProgress()
    tail: collections.deque[str] = collections.deque(maxlen=40)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        tail.append(line.rstrip())
        progress.feed(line)
    rc = proc.wait()
    progress.render(final=True)
    return rc, list(tail)


def _debootstrap(root: Path) -> None:
    rc, tail = run_debootstrap(VARIANT, INCLUDE, SUITE, root, "the test host base image")
    if rc != 0:
        log = root / "debootstrap" / "debootstrap.log"
        raise TesthostError(
            f"debootstrap failed (exit {rc}); last output:\n" + "\n".join(tail) + f"\n(full log, if any: {log})\n"
            f"Fix: check that {MIRROR} is reachable (set PDSTACK_DEBIAN_MIRROR to use another mirror)"
        )


def _customize_rootfs(root: Path) -> None:
    for pattern in ROOTFS_REMOVE:
        for p in root.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    for rel, content in ROOTFS_FILES.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        p.chmod(0o644)
    for rel, target in ROOTFS_SYMLINKS.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        p.symlink_to(target)


def _import(c, root: Path, tag: str) -> None:
    t0 = time.monotonic()
    repo, _, version = tag.partition(":")
    changes = [*IMAGE_CHANGES, f"LABEL {BASE_LABEL}={version}"]
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    assert tar.stdout is not None

    def chunks() -> Iterator[bytes]:
        while block := tar.stdout.read(1 << 20):
            yield block

    try:
        c.api.import_image_from_stream(chunks(), repository=repo, tag=version, changes=changes)
    finally:
        rc = tar.wait()
    if rc != 0 or not _image_exists(c, tag):
        raise TesthostError(f"docker import of {root} as {tag} failed (tar exit {rc})")
    size = c.images.get(tag).attrs.get("Size", 0) / 1e6
    echo(f"imported {tag} ({size:.0f} MB) in {time.monotonic() - t0:.1f} s")


def _mounts_under(root: Path) -> list[str]:
    base = str(root.resolve())
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4].encode().decode("unicode_escape")
            if mnt == base or mnt.startswith(base + "/"):
                found.append(mnt)
    return found


def _remove_rootfs(root: Path) -> None:
    """Delete the build tree, but never through a mount debootstrap left behind (/proc, /sys, a bound /dev)."""
    if not root.exists():
        return
    for mnt in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", mnt], check=False)
    left = _mounts_under(root)
    if left:
        echo(f"not deleting {root}: still mounted there: {', '.join(left)}")
        return
    shutil.rmtree(root, ignore_errors=True)


# ---------------------------------------------------------------------------------------------------- hosts


def host_names(count: int, prefix: str = DEFAULT_PREFIX) -> list[str]:
    return [f"{prefix}-{i}" for i in range(1, count + 1)]


def network_name(prefix: str) -> str:
    return prefix


def volume_name(host: str) -> str:
    return f"{host}-var-lib-docker"


def _ensure_network(c, prefix: str):
    from docker.errors import NotFound

    name = network_name(prefix)
    try:
        net = c.networks.get(name)
    except NotFound:
        echo(f"creating network {name}")
        return c.networks.create(name, driver="bridge", labels=_labels(prefix))
    if (net.attrs.get("Labels") or {}).get(LABEL) != prefix:
        raise TesthostError(
            f"a Docker network named {name} exists but was not made by pdstack testhost (no {LABEL}={prefix} label)\n"
            f"Fix: remove it (docker network rm {name}) or use another prefix"
        )
    return net


def _ensure_volume(c, host: str, prefix: str) -> str:
    from docker.errors import NotFound

    name = volume_name(host)
    try:
        vol = c.volumes.get(name)
    except NotFound:
        c.volumes.create(name, labels=_labels(prefix))
        return name
    if (vol.attrs.get("Labels") or {}).get(LABEL) != prefix:
        raise TesthostError(
            f"a Docker volume named {name} exists but was not made by pdstack testhost (no {LABEL}={prefix} label)\n"
            f"Fix: remove it (docker volume rm {name}) or use another prefix"
        )
    return name


def _get_container(c, name: str):
    from docker.errors import NotFound

    try:
        return c.containers.get(name)
    except NotFound:
        return None


def _system_state(container) -> str:
    """`systemctl is-system-running` inside the host ('' when it cannot be asked yet)."""
    try:
        res = container.exec_run(["systemctl", "is-system-running"], demux=False)
    except Exception:  # the container stopped, or exec raced the boot
        return ""
    lines = (res.output or b"").decode(errors="replace").strip().splitlines()
    return lines[-1].strip() if lines else ""


def _wait_booted(c, names: list[str], timeout: float = BOOT_TIMEOUT_S) -> dict[str, str]:
    """Wait until every host's systemd says running or degraded; raise with a diagnosis otherwise."""
    deadline = time.monotonic() + timeout
    pending = list(names)
    states: dict[str, str] = {}
    while pending:
        for name in list(pending):
            ct = c.containers.get(name)
            if ct.status not in ("running", "created", "restarting"):
                logs = ct.logs(tail=30).decode(errors="replace")
                raise TesthostError(
                    f"test host {name} stopped while booting (status {ct.status}); its last output:\n{logs}\n"
                    "Fix: check that the engine allows the flags in pdstack.testhost.HOST_RUN_KWARGS "
                    "(cgroup mount, capabilities); see FACTS.md"
                )
            state = _system_state(ct)
            states[name] = state
            if state in ("running", "degraded"):
                pending.remove(name)
                if state == "degraded":
                    failed = ct.exec_run(["systemctl", "--failed", "--no-legend", "--plain"]).output.decode().strip()
                    echo(f"{name}: systemd is degraded; failed units: {failed or '?'}")
        if not pending:
            break
        if time.monotonic() > deadline:
            detail = []
            for name in pending:
                ct = c.containers.get(name)
                jobs = ct.exec_run(["systemctl", "list-jobs", "--no-legend"]).output.decode(errors="replace")
                detail.append(f"{name}: state {states.get(name) or 'unknown'!r}; pending jobs:\n{jobs.strip()}")
            raise TesthostError(
                f"test host(s) did not finish booting within {timeout:.0f} s:\n" + "\n".join(detail) + "\n"
                f"Fix: inspect with `docker exec {pending[0]} systemctl list-jobs`; remove with testhost.down"
            )
        time.sleep(0.25)
    return states


def up(count: int = 1, prefix: str = DEFAULT_PREFIX) -> list[str]:
    """Make sure hosts `<prefix>-1..count` exist, run, and have booted systemd; return their names.

    Idempotent: hosts that already run are left alone (not restarted, not recreated); stopped ones are started.
    Hosts numbered above `count` (from an earlier, larger `up`) are left as they are; `down` removes them.
    """
    _check_prefix(prefix)
    if count < 1:
        raise TesthostError(f"count must be at least 1, got {count}")
    c = client()
    tag = ensure_base_image()
    t0 = time.monotonic()
    names = host_names(count, prefix)
    existing = {name: _get_container(c, name) for name in names}
    for name, ct in existing.items():  # refuse before changing anything
        if ct is not None and (ct.labels or {}).get(LABEL) != prefix:
            raise TesthostError(
                f"a container named {name} exists but was not made by pdstack testhost (no {LABEL}={prefix} label)\n"
                f"Fix: remove it (docker rm -f {name}) or use another prefix"
            )
    volumes = {name: _ensure_volume(c, name, prefix) for name, ct in existing.items() if ct is None}
    net = _ensure_network(c, prefix)
    created, started = [], []
    for name, ct in existing.items():
        if ct is None:
            vol = volumes[name]
            c.containers.run(
                tag,
                detach=True,
                name=name,
                hostname=name,
                labels=_labels(prefix),
                network=net.name,
                volumes={
                    "/sys/fs/cgroup": {"bind": "/sys/fs/cgroup", "mode": "rw"},
                    vol: {"bind": "/var/lib/docker", "mode": "rw"},
                },
                **HOST_RUN_KWARGS,
            )
            created.append(name)
        elif ct.status != "running":
            if ct.image.tags and tag not in ct.image.tags:
                echo(f"{name} runs an older base image ({ct.image.tags[0]}); `down` then `up` to rebuild it")
            if ct.status == "paused":
                ct.unpause()
            else:
                ct.start()
            started.append(name)
    if created or started:
        what = ", ".join(filter(None, [created and f"created {len(created)}", started and f"started {len(started)}"]))
        echo(f"{what}; waiting for systemd")
    _wait_booted(c, names)
    extra = sorted(
        (ct.name for ct in c.containers.list(all=True, filters=_filters(prefix)) if ct.name not in names),
        key=_host_index,
    )
    if extra:
        echo(f"also present (from an earlier up): {', '.join(extra)}; `down` removes them")
    echo(f"{len(names)} host(s) up in {time.monotonic() - t0:.1f} s: {', '.join(names)}")
    return names


def _host_index(name: str) -> int:
    tail = name.rsplit("-", 1)[-1]
    return int(tail) if tail.isdigit() else 1 << 30


def down(prefix: str = DEFAULT_PREFIX) -> dict[str, list[str]]:
    """Remove the containers, volumes and network labelled `io.pdstack.testhost=<prefix>`; return what was removed."""
    from docker.errors import NotFound

    _check_prefix(prefix)
    c = client()
    t0 = time.monotonic()
    removed: dict[str, list[str]] = {"containers": [], "volumes": [], "networks": []}
    for ct in c.containers.list(all=True, filters=_filters(prefix)):
        try:  # kill, not stop: the volume goes too, so there is nothing to shut down cleanly for
            ct.remove(force=True, v=True)
        except NotFound:
            continue
        removed["containers"].append(ct.name)
    for vol in c.volumes.list(filters=_filters(prefix)):
        try:
            vol.remove(force=True)
        except NotFound:
            continue
        removed["volumes"].append(vol.name)
    for net in c.networks.list(filters=_filters(prefix)):
        try:
            net.remove()
        except NotFound:
            continue
        removed["networks"].append(net.name)
    for k in removed:
        removed[k].sort(key=lambda n: (_host_index(n.removesuffix("-var-lib-docker")), n))
    n = sum(len(v) for v in removed.values())
    echo(f"removed {n} object(s) labelled {LABEL}={prefix} in {time.monotonic() - t0:.1f} s")
    return removed


def status(prefix: str = DEFAULT_PREFIX) -> list[dict[str, Any]]:
    """One dict per host of `prefix`: name, container state, systemd state, IP address, image."""
    _check_prefix(prefix)
    c = client()
    rows = []
    for ct in sorted(c.containers.list(all=True, filters=_filters(prefix)), key=lambda ct: _host_index(ct.name)):
        nets = ct.attrs.get("NetworkSettings", {}).get("Networks", {})
        rows.append(
            {
                "name": ct.name,
                "state": ct.status,
                "systemd": _system_state(ct) if ct.status == "running" else "",
                "ip": (nets.get(network_name(prefix)) or {}).get("IPAddress", ""),
                "image": ct.attrs.get("Config", {}).get("Image", ""),
            }
        )
    return rows


def format_status(rows: list[dict[str, Any]]) -> str:
    """A table for people (status() itself is the machine form)."""
    if not rows:
        return "no test hosts"
    cols = ["name", "state", "systemd", "ip", "image"]
    widths = {k: max(len(k), *(len(str(r[k])) for r in rows)) for k in cols}
    lines = ["  ".join(k.upper().ljust(widths[k]) for k in cols)]
    lines += ["  ".join(str(r[k]).ljust(widths[k]) for k in cols) for r in rows]
    return "\n".join(lines)


def inventory_for(names: list[str], group: str = "testhosts") -> dict[str, Any]:
    """An Ansible YAML inventory (as a dict) reaching `names` through `docker exec`."""
    return {
        "all": {
            "children": {group: {"hosts": {n: {"ansible_host": n} for n in names}}},
            "vars": {
                "ansible_connection": "community.docker.docker",
                "ansible_python_interpreter": "/usr/bin/python3",
            },
        }
    }


def inventory(prefix: str = DEFAULT_PREFIX, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The inventory of `prefix`'s existing hosts; also written as YAML to `path` when given."""
    names = [row["name"] for row in status(prefix)]
    inv = inventory_for(names)
    if path is not None:
        write_inventory(inv, path)
    return inv


def write_inventory(inv: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    import yaml

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text("# Written by pdstack.testhost.inventory(); regenerated on every call.\n" + yaml.safe_dump(inv))
    return p
