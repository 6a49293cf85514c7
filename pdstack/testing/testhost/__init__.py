"""Local test hosts: Debian bookworm booted with systemd, as Docker containers, reachable by Ansible.

    ensure_base_image()           build the base image (baseimage.py; debootstrap + docker import) once
    up(count, prefix)             a network + hosts `<prefix>-1..count`, each booted until systemd says running
    down(prefix)                  remove exactly what `up` made: containers, /var/lib/docker volumes, network
    status(prefix)                one dict per host (format_status() makes it a table)
    inventory(prefix, path=None)  Ansible inventory (SSH to the bridge address: access.py); written when path given

Every object `up` creates carries the label `io.pdstack.testhost=<prefix>`; `down` selects by that label alone,
so it never touches the base image, another prefix's hosts, or anything a person made by hand.
No registry is reachable here: nothing is ever pulled. The root file system and `docker import` code is the
controller's (pdstack.controller.imagebuild.rootfs), shared with the image build.
"""

from pdstack.testing.testhost.baseimage import base_image_tag, ensure_base_image
from pdstack.testing.testhost.common import DEFAULT_PREFIX, LABEL, TesthostError, client
from pdstack.testing.testhost.hosts import down, format_status, host_names, network_name, status, up, volume_name
from pdstack.testing.testhost.inventory import inventory, inventory_for, write_inventory

__all__ = [
    "DEFAULT_PREFIX", "LABEL", "TesthostError", "base_image_tag", "client", "down", "ensure_base_image",
    "format_status", "host_names", "inventory", "inventory_for", "network_name", "status", "up", "volume_name",
    "write_inventory",
]
