"""ssh's ProxyCommand for the local test hosts, used with ProxyUseFdpass=yes (connection.yml): connects to port 22 of
the container HOST at the bridge address the controller's Docker gives it, and hands the connected socket to ssh,
which then talks to the host's sshd directly. The test hosts' names resolve only inside their Docker network, and
nothing relays the bytes: a pipe through `docker exec -i HOST sshd -i` (the docker CLI, dockerd and the shim)
costs several times the CPU for the same copy (docs/log.md, "The test hosts over SSH", has the figures).

Runs as `/usr/bin/python3 -I ssh_connect.py HOST PORT` (the standard library only; no venv needed).
"""

from __future__ import annotations

import socket
import subprocess
import sys

INSPECT = "{{range .NetworkSettings.Networks}}{{.IPAddress}} {{end}}"


def address(host: str) -> str:
    """The container's first bridge address; SystemExit naming the fix when there is none."""
    try:
        got = subprocess.run(["docker", "inspect", "--type", "container", "--format", INSPECT, host],
                             capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise SystemExit(f"pdstack ssh_connect: cannot ask Docker for test host {host!r}: {e}") from None
    ips = got.stdout.split()
    if got.returncode != 0 or not ips:
        why = got.stderr.strip() or "it has no network address (stopped?)"
        raise SystemExit(f"pdstack ssh_connect: no running test host container {host!r}: {why}\n"
                         "Fix: boot it (invoke testhost.up, or the test's fixture)")
    return ips[0]


def main(argv: list[str]) -> int:
    if len(argv) != 3 or not argv[2].isdigit():
        raise SystemExit("usage: ssh_connect.py HOST PORT  (ssh's ProxyCommand, with ProxyUseFdpass=yes)")
    host, port = argv[1], int(argv[2])
    ip = address(host)
    try:
        conn = socket.create_connection((ip, port), timeout=15)
    except OSError as e:
        raise SystemExit(f"pdstack ssh_connect: {host} ({ip}) port {port}: {e}; is its sshd running?") from None
    # ssh made our stdout one end of a Unix socket pair: the connected socket goes back over it
    with socket.socket(fileno=sys.stdout.fileno()) as back:
        socket.send_fds(back, [b"\0"], [conn.fileno()])
        back.detach()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
