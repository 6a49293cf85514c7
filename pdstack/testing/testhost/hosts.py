"""Test host containers: a network + hosts `<prefix>-1..count`, each booted until systemd says running; removal by
label only."""

from __future__ import annotations

import time
from typing import Any

from pdstack.testing import mirror
from pdstack.testing.testhost import access
from pdstack.testing.testhost.baseimage import ensure_base_image
from pdstack.testing.testhost.common import DEFAULT_PREFIX, LABEL, TesthostError, client, echo

BOOT_TIMEOUT_S = 90.0

# `docker run` flags measured to boot systemd here (docs/facts.md#this-workplaces-machines-tests-and-the-local-demo;
# --privileged fails: CAP_SYS_RESOURCE is not in the bounding set). RTMIN+3 is systemd's "halt" signal: without it
# `docker stop` waits its full 10 s.
HOST_RUN_KWARGS: dict[str, Any] = {
    "stop_signal": "RTMIN+3",
    "cap_add": ["ALL"],
    "cap_drop": ["SYS_RESOURCE"],
    "security_opt": ["seccomp=unconfined", "apparmor=unconfined"],
    "cgroupns": "host",
    "tmpfs": {"/run": "", "/run/lock": "", "/tmp": ""},
}


def _gateway(net) -> str:
    net.reload()
    return net.attrs["IPAM"]["Config"][0]["Gateway"]


def _labels(prefix: str) -> dict[str, str]:
    return {LABEL: prefix}


def _filters(prefix: str) -> dict[str, list[str]]:
    return {"label": [f"{LABEL}={prefix}"]}


def check_prefix(prefix: str) -> None:
    ok = prefix and prefix[0].isalnum() and all(ch.isalnum() or ch in "-_." for ch in prefix)
    if not ok or len(prefix) > 48:
        raise TesthostError(
            f"invalid test host prefix {prefix!r}: use 1-48 letters, digits, '-', '_' or '.', starting alphanumeric"
        )



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
                    "Fix: check that the engine allows the flags in pdstack.testing.testhost.hosts.HOST_RUN_KWARGS "
                    "(cgroup mount, capabilities); see docs/facts.md, \"This workplace's machines\""
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
    check_prefix(prefix)
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
                # the controller as the hosts reach it, their network's gateway (Docker's "host-gateway" is the
                # default bridge's 172.17.0.1, which the Docker inside a host takes for its own bridge): the model
                # mirror the sim inventories fetch from listens there (pdstack/testing/mirror.py)
                extra_hosts={mirror.HOST_NAME: _gateway(net)},
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
    public_key = access.ensure_key()
    for name in names:  # Ansible reaches them over SSH (access.py), with this checkout's key
        access.authorize(c.containers.get(name), public_key)
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

    check_prefix(prefix)
    c = client()
    t0 = time.monotonic()
    removed: dict[str, list[str]] = {"containers": [], "volumes": [], "networks": []}
    doomed = c.containers.list(all=True, filters=_filters(prefix))
    access.close_masters([ct.name for ct in doomed])
    for ct in doomed:
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
    check_prefix(prefix)
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


