"""A Debian root file system made with debootstrap, imported as a Docker image: the one copy of that code.

    ensure_rootfs_image(c, tag, recipe, ...)   build `tag` from `recipe` unless it exists (locked, then re-checked)

Used by the python base (bases.py) and the test hosts' systemd base (pdstack.testing.testhost). A recipe is a dict
(everything in it feeds the caller's tag): suite, variant, include (packages), remove (globs deleted after
debootstrap), files ({path: content} written after), symlinks ({path: target}), changes (Dockerfile instructions for
`docker import`).
"""

from __future__ import annotations

import collections
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild.common import BuildError, echo, lock
from pdstack.controller.imagebuild.engine import SETUP_HINT, image_exists

MIRROR = os.environ.get("PDSTACK_DEBIAN_MIRROR", "http://deb.debian.org/debian")


def debootstrap_bin() -> str | None:
    return shutil.which("debootstrap") or shutil.which("debootstrap", path="/usr/sbin:/sbin")


def preflight(what: str) -> None:
    """Root, debootstrap and tar, or a BuildError saying how to get them."""
    if os.geteuid() != 0:
        raise BuildError(
            f"building {what} runs debootstrap, which needs root\n"
            "Fix: run as root (e.g. sudo ./dev.sh setup, then sudo .venv/bin/invoke ...)"
        )
    if debootstrap_bin() is None:
        raise BuildError(f"debootstrap is not installed\nFix: {SETUP_HINT} (or apt-get install debootstrap)")
    if shutil.which("tar") is None:
        raise BuildError("tar is not installed\nFix: apt-get install tar")


class DebootstrapProgress:
    """Turns debootstrap's `I: ...` lines into one progress line: phase, counts, percent and ETA.

    The package count is known only once downloading ends; from then on each package is unpacked once and
    configured once, which is what the percentage counts (downloading is given the first DOWNLOAD_SHARE of the bar).
    On a terminal the line is redrawn in place; in a log it is printed at each phase change and every 10 s.
    """

    DOWNLOAD_SHARE = 0.4

    def __init__(self, out=sys.stderr, say: Callable[[str], None] = echo, prefix: str = "[build] "):
        self.out = out
        self.say = say
        self.prefix = prefix
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
            self.out.write("\r\033[K" + self.prefix + text + ("\n" if final else ""))
            self.out.flush()
        elif final or self.phase != self.last_phase_printed or now - self.last_print >= 10:
            self.say(text)
            self.last_print, self.last_phase_printed = now, self.phase


def run_debootstrap(recipe: Mapping[str, Any], root: Path, what: str, say: Callable[[str], None] = echo,
                    prefix: str = "[build] ") -> None:
    """debootstrap `recipe` into `root` with a progress line; a BuildError with its last output if it fails."""
    cmd = [debootstrap_bin() or "debootstrap", f"--variant={recipe['variant']}",
           f"--include={','.join(recipe['include'])}", recipe["suite"], str(root), MIRROR]
    say(f"building {what}: {' '.join(cmd)} (about a minute)")
    progress = DebootstrapProgress(say=say, prefix=prefix)
    tail: collections.deque[str] = collections.deque(maxlen=40)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, errors="replace")
    assert proc.stdout is not None
    for line in proc.stdout:
        tail.append(line.rstrip())
        progress.feed(line)
    rc = proc.wait()
    progress.render(final=True)
    if rc != 0:
        log = root / "debootstrap" / "debootstrap.log"
        raise BuildError(
            f"debootstrap of {what} failed (exit {rc}); last output:\n" + "\n".join(tail) +
            f"\n(full log, if any: {log})\n"
            f"Fix: check that {MIRROR} is reachable (set PDSTACK_DEBIAN_MIRROR to use another mirror)"
        )


def customize(root: Path, recipe: Mapping[str, Any]) -> None:
    """Delete the recipe's `remove` globs, then write its `files` and `symlinks`."""
    for pattern in recipe.get("remove", ()):
        for p in root.glob(pattern):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
    for relpath, content in recipe.get("files", {}).items():
        p = root / relpath
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(content)
        p.chmod(0o644)
    for relpath, target in recipe.get("symlinks", {}).items():
        p = root / relpath
        p.parent.mkdir(parents=True, exist_ok=True)
        if p.is_symlink() or p.exists():
            p.unlink()
        p.symlink_to(target)


def import_rootfs(c, root: Path, tag: str, changes: list[str], say: Callable[[str], None] = echo) -> None:
    """Stream `root` through tar into `docker import` as `tag`; tar's exit status is checked, not assumed."""
    t0 = time.monotonic()
    repo, _, version = tag.partition(":")
    tar = subprocess.Popen(["tar", "--numeric-owner", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
    assert tar.stdout is not None

    def chunks() -> Iterator[bytes]:
        while block := tar.stdout.read(1 << 20):
            yield block

    try:
        c.api.import_image_from_stream(chunks(), repository=repo, tag=version, changes=changes)
    finally:
        rc = tar.wait()
    if rc != 0 or not image_exists(c, tag):
        raise BuildError(f"docker import of {root} as {tag} failed (tar exit {rc})")
    size = c.images.get(tag).attrs.get("Size", 0) / 1e6
    say(f"imported {tag} ({size:.0f} MB) in {time.monotonic() - t0:.1f} s")


def _mounts_under(root: Path) -> list[str]:
    base = str(root.resolve())
    found = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            mnt = line.split()[4].encode().decode("unicode_escape")
            if mnt == base or mnt.startswith(base + "/"):
                found.append(mnt)
    return found


def remove_rootfs(root: Path, say: Callable[[str], None] = echo) -> None:
    """Delete the build tree, but never through a mount debootstrap left behind (/proc, /sys, a bound /dev)."""
    if not root.exists():
        return
    for mnt in sorted(_mounts_under(root), key=len, reverse=True):
        subprocess.run(["umount", "-l", mnt], check=False)
    left = _mounts_under(root)
    if left:
        say(f"not deleting {root}: still mounted there: {', '.join(left)}")
        return
    shutil.rmtree(root, ignore_errors=True)


def ensure_rootfs_image(c, tag: str, recipe: Mapping[str, Any], *, what: str, lock_name: str,
                        labels: Mapping[str, str] | None = None, say: Callable[[str], None] = echo,
                        prefix: str = "[build] ") -> str:
    """`tag` built from `recipe` (debootstrap + customize + import) unless it exists; one build per machine."""
    if image_exists(c, tag):
        return tag
    preflight(what)
    with lock(lock_name, say):
        if image_exists(c, tag):  # built by whoever held the lock
            return tag
        t0 = time.monotonic()
        root = Path(tempfile.mkdtemp(prefix=f"pdstack-{lock_name}-rootfs-", dir="/var/tmp"))
        try:
            run_debootstrap(recipe, root, what, say, prefix)
            customize(root, recipe)
            changes = [*recipe.get("changes", ()), *(f"LABEL {k}={v}" for k, v in (labels or {}).items())]
            import_rootfs(c, root, tag, changes, say)
        finally:
            remove_rootfs(root, say)
        say(f"{what} {tag} built in {time.monotonic() - t0:.0f} s")
    return tag
