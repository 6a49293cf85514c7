"""Local test hosts: Debian bookworm booted with systemd, as Docker containers, reachable by Ansible.

    baseimage.ensure_base_image()           build the base image (debootstrap + docker import) once
    hosts.up(count, prefix)                 a network + hosts `<prefix>-1..count`, each booted until systemd says
                                            running
    hosts.down(prefix)                      remove exactly what `up` made: containers, /var/lib/docker volumes, network
    hosts.status(prefix)                    one dict per host (hosts.format_status() makes it a table)
    inventory.inventory(prefix, path=None)  Ansible inventory (SSH to the bridge address: access.py); written when
                                            path given
    common                                  the label, the default prefix, TesthostError, the Docker client

Every object `up` creates carries the label `io.pdstack.testhost=<prefix>`; `down` selects by that label alone,
so it never touches the base image, another prefix's hosts, or anything a person made by hand.
No registry is reachable here: nothing is ever pulled. The root file system and `docker import` code is the
controller's (pdstack.controller.imagebuild.rootfs), shared with the image build.
"""
