"""HAProxy's runtime API over its unix socket (the front door's `stats socket`): one command, its whole answer.

drain.py switches the front door's maintenance ACL with it, status_collect.py reads `show stat` and `show acl`.
Standard library only, so no socat on the host.
"""

from __future__ import annotations

import socket


def runtime_api(sock: str, command: str, timeout: float) -> str:
    """Send one command line, read until HAProxy closes the connection; the answer as text. OSError on failure."""
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as s:
        s.settimeout(timeout)
        s.connect(sock)
        s.sendall(command.encode() + b"\n")
        chunks = []
        while chunk := s.recv(65536):
            chunks.append(chunk)
    return b"".join(chunks).decode("utf-8", "replace")
