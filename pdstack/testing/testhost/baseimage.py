"""The test hosts' base image: Debian bookworm with systemd, made by the controller's rootfs code (debootstrap +
`docker import`, pdstack.controller.imagebuild.rootfs) from the recipe below; cached by the recipe's hash."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdstack.controller.imagebuild.common import digest
from pdstack.controller.imagebuild.rootfs import ensure_rootfs_image
from pdstack.testing.testhost import zipimport_cache
from pdstack.testing.testhost.common import client, echo

BASE_LABEL = "io.pdstack.testhost.base"
BASE_REPO = "pdstack/testhost-base"

# The base image recipe. Everything here feeds the image tag, so changing any of it builds a new image.
SUITE = "bookworm"
VARIANT = "minbase"
# The smallest set that boots (docs/facts.md#this-workplaces-machines-tests-and-the-local-demo),
# plus what deploying into the host needs without a network round trip:
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
# Test hosts only: Python caches the bytecode of what it imports from a zip (Ansible's AnsiballZ payloads; every
# task compiled ~56 module_utils files again): one ping task's payload 152-175 ms -> 86-98 ms (zipimport_cache.py).
_DIST = "usr/lib/python3/dist-packages"
ROOTFS_FILES[f"{_DIST}/{zipimport_cache.MODULE}.py"] = Path(zipimport_cache.__file__).read_text()
ROOTFS_FILES[f"{_DIST}/{zipimport_cache.MODULE}.pth"] = f"import {zipimport_cache.MODULE}\n"
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
    return f"{BASE_REPO}:{digest(recipe())[:12]}"


def ensure_base_image() -> str:
    """Build the test host base image unless an image with this recipe's tag exists; return the tag."""
    tag = base_image_tag()
    return ensure_rootfs_image(client(), tag, recipe(), what="the test host base image", lock_name="testhost-base",
                               labels={BASE_LABEL: tag.partition(":")[2]}, say=echo, prefix="[testhost] ")
