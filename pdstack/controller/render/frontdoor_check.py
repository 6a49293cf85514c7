"""The front door's settings checked where they land: in haproxy.cfg, against what HAProxy 2.6 can actually run.

`haproxy -c` is not enough: it accepts a `maxconn` the process then cannot start with (it needs 2 x maxconn + a few
file descriptors and exits "Cannot raise FD limit"), so the limits here are HAProxy's own, measured (docs/facts.md,
"HAProxy"). The rendered text is also read back (readers.parse_haproxy) and must hold exactly the directives the
renderer wrote: no value can add, drop or change a directive.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Any

from pdstack.controller.plan.planner import MAINTENANCE_FILE, RUNTIME_SOCKET
from pdstack.controller.render import frontdoor
from pdstack.controller.render.encoders import EncodeError, haproxy_address, haproxy_word
from pdstack.controller.render.readers import parse_haproxy

# HAProxy keeps timers in ms in a signed 32-bit int: `timeout ...` and `hard-stop-after` above 2**31-1 ms
# (~24.8 days) are refused by `haproxy -c` ("timer overflow", measured on 2.6.12).
MAX_TIMEOUT_SECS = (2**31 - 1) // 1000
# global maxconn: HAProxy needs 2 x maxconn + ~14 file descriptors at start (measured: with a hard limit of 20000,
# maxconn 9993 starts, 9994 exits "Cannot raise FD limit to 20002"); a root process may raise its limit to
# fs.nr_open (1048576 by default), so 500000 leaves room for the listeners, checks and sockets.
MAX_CONNECTIONS = 500_000
# a request body is buffered whole (tune.bufsize above it); 64 MiB keeps one buffer per request being read sane
MAX_BODY_BYTES = 64 * 1024 * 1024

# the inventory variable behind each front-door setting (messages name it)
SOURCES = {
    "bind": "pdstack_router.frontdoor.bind",
    "port": "pdstack_router.port",
    "backend_address": "pdstack_router (the router's loopback address)",
    "backend_port": "pdstack_router.internal_port",
    "metrics_bind": "pdstack_router.frontdoor (metrics address)",
    "metrics_port": "pdstack_router.frontdoor.metrics_port",
    "max_concurrent_requests": "pdstack_router.admission.max_concurrent_requests",
    "queue_size": "pdstack_router.admission.queue_size",
    "queue_timeout_secs": "pdstack_router.admission.queue_timeout_secs",
    "retry_after_secs": "pdstack_router.frontdoor.retry_after_secs",
    "request_read_timeout_secs": "pdstack_router.frontdoor.request_read_timeout_secs",
    "max_body_bytes": "pdstack_router.frontdoor.max_body_bytes",
    "max_connections_per_source": "pdstack_router.frontdoor.max_connections_per_source",
    "cors_origins": "pdstack_router.frontdoor.cors_origins",
    "server_timeout_secs": "pdstack_router.request_timeout_secs (HAProxy's timeout server)",
    "client_timeout_secs": "pdstack_router.frontdoor.client_timeout_secs",
    "served_models": "pdstack_model.served_name",
    "hard_stop_after_secs": "pdstack_router.request_timeout_secs (+ 60 s: HAProxy's hard-stop-after)",
    "max_connections": "pdstack_router.admission (max_concurrent_requests + queue_size: HAProxy's global maxconn)",
}
WILDCARDS = ("0.0.0.0", "::")
# a browser's Origin (RFC 6454): http or https, a lower-case DNS name, IPv4 or bracketed IPv6, an optional port
ORIGIN_RE = re.compile(r"(?P<scheme>https?)://(?P<host>[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
                       r"(?:\.[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?)*|\[[0-9a-f:.]+\])(?::(?P<port>[1-9][0-9]{0,4}))?")


def _literal(value: Any) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(value) if isinstance(value, str) else None
    except ValueError:
        return None


def bind_problems(fd: dict[str, Any], router_address: str, production: bool) -> list[str]:
    """The public bind: a literal address (a name is resolved by HAProxy at start, on the host), never a wildcard in
    production, and an address of the router host (else HAProxy cannot bind it, mid-deploy, after the servers
    restarted): the router host's pdstack_address, or outside production a wildcard or loopback."""
    src, bind = SOURCES["bind"], fd.get("bind")
    addr = _literal(bind)
    if addr is None:
        return [f"{src}: {bind!r} is not a literal IP address (host:port is rendered from it and "
                f"pdstack_router.port); set it to the router host's address, e.g. {router_address}"]
    router = _literal(router_address)
    if str(addr) in WILDCARDS:
        if production:
            return [f"{src}: {bind} listens on every address of the router host, refused in production; set it to "
                    f"the router host's address ({router_address}, its pdstack_address)"]
        return []
    if addr.is_loopback and not production:
        return []
    if router is None:
        return [f"{src}: {bind} cannot be checked against the router host's address {router_address!r} (not a "
                "literal IP): set the router host's pdstack_address to its IP"]
    if addr != router:
        return [f"{src}: {bind} is not the router host's address ({router_address}): HAProxy could not bind it on "
                f"that host; set it to {router_address}" + ("" if production else " (or 0.0.0.0)")]
    return []


def limit_problems(fd: dict[str, Any]) -> list[str]:
    """Ports, timeouts and connection limits HAProxy can carry and run."""
    out = []
    for key in ("port", "backend_port", "metrics_port"):
        v = fd.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or not 1 <= v <= 65535:
            out.append(f"{SOURCES[key]}: {v!r} is not a TCP port (1-65535)")
    for key in ("queue_timeout_secs", "server_timeout_secs", "client_timeout_secs", "hard_stop_after_secs",
                "retry_after_secs", "request_read_timeout_secs"):
        v = fd.get(key)
        if isinstance(v, bool) or not isinstance(v, int) or v < 0:
            out.append(f"{SOURCES[key]}: {v!r} is not a whole number of seconds >= 0")
        elif v > MAX_TIMEOUT_SECS:
            out.append(f"{SOURCES[key]}: {v} s is over HAProxy's timer limit of {MAX_TIMEOUT_SECS} s (2**31-1 ms, "
                       "~24.8 days); use a smaller value")
    models = fd.get("served_models", [])
    if not isinstance(models, list):
        out.append(f"{SOURCES['served_models']}: {models!r} is not a list of names")
    for m in models if isinstance(models, list) else ():
        try:
            haproxy_word(m)
        except EncodeError as e:
            out.append(f"{SOURCES['served_models']}: the front door checks requests against it in haproxy.cfg, which "
                       f"cannot carry it: {e}")
    out.extend(cors_problems(fd.get("cors_origins", [])))
    b = fd.get("max_body_bytes")
    if isinstance(b, bool) or not isinstance(b, int) or not 1 <= b <= MAX_BODY_BYTES:
        out.append(f"{SOURCES['max_body_bytes']}: {b!r} is not a byte count 1-{MAX_BODY_BYTES} (a body is buffered "
                   "whole, one buffer per request being read: HAProxy's tune.bufsize)")
    p = fd.get("max_connections_per_source", 0)
    if isinstance(p, bool) or not isinstance(p, int) or not 0 <= p <= MAX_CONNECTIONS:
        out.append(f"{SOURCES['max_connections_per_source']}: {p!r} is not 0 (no limit) or a connection count "
                   f"1-{MAX_CONNECTIONS}")
    n, q, m = fd.get("max_concurrent_requests"), fd.get("queue_size"), fd.get("max_connections")
    for key, v in (("max_concurrent_requests", n), ("queue_size", q), ("max_connections", m)):
        if isinstance(v, bool) or not isinstance(v, int):
            out.append(f"{SOURCES[key]}: {v!r} is not an integer")
    if out:
        return out
    if n != -1 and not 1 <= n <= MAX_CONNECTIONS:
        out.append(f"{SOURCES['max_concurrent_requests']}: {n} is neither -1 (admission off) nor 1-{MAX_CONNECTIONS}")
    if q < 0 or q > MAX_CONNECTIONS:
        out.append(f"{SOURCES['queue_size']}: {q} is outside 0-{MAX_CONNECTIONS}")
    if m > MAX_CONNECTIONS:
        out.append(f"{SOURCES['max_connections']}: HAProxy's maxconn would be {m}, over {MAX_CONNECTIONS} (HAProxy "
                   f"needs 2 fds per connection and cannot start past fs.nr_open; docs/facts.md, HAProxy): lower "
                   "max_concurrent_requests + queue_size")
    elif n > 0 and n + q > m - frontdoor.METRICS_HEADROOM:
        out.append(f"{SOURCES['max_connections']}: the public listener's maxconn {m - frontdoor.METRICS_HEADROOM} "
                   f"(maxconn {m} less {frontdoor.METRICS_HEADROOM} kept for the metrics listener) is below "
                   f"max_concurrent_requests + queue_size ({n + q}): requests would wait for a connection slot "
                   "outside the queue")
    return out


def cors_problems(origins: Any) -> list[str]:
    """Each CORS origin exactly as a browser sends its Origin header (RFC 6454 serialisation: scheme, lower-case
    host, an explicit port only when not the default), compared byte for byte by the front door: no wildcard, no
    path, no "null" (sandboxed pages and files share it)."""
    src = SOURCES["cors_origins"]
    if not isinstance(origins, list):
        return [f"{src}: {origins!r} is not a list of origins (e.g. [https://chat.example.com])"]
    out = []
    for o in origins:
        m = ORIGIN_RE.fullmatch(o) if isinstance(o, str) else None
        if m is None:
            out.append(f"{src}: {o!r} is not a browser origin: write scheme://host[:port] in lower case, nothing "
                       "after it (e.g. https://chat.example.com); a wildcard or \"null\" is not accepted")
            continue
        port = m.group("port")
        if port and (int(port) > 65535 or (m.group("scheme"), int(port)) in (("http", 80), ("https", 443))):
            out.append(f"{src}: {o!r}: a browser sends no port when it is the scheme's default, and no port above "
                       f"65535; write {m.group('scheme')}://{m.group('host')}")
    return out


def readback_problems(fd: dict[str, Any], **render: Any) -> list[str]:
    """Render haproxy.cfg in memory as the frontdoor role does and read it back: every value must be one word the
    encoder can carry, and the text must parse back to exactly the directives the renderer meant."""
    for key, port in (("bind", "port"), ("backend_address", "backend_port"), ("metrics_bind", "metrics_port")):
        try:
            haproxy_address(fd.get(key), fd.get(port))
        except EncodeError as e:
            return [f"{SOURCES[key]}: {e}"]
    try:
        meant = frontdoor.haproxy_directives(fd, **render)
        text = frontdoor.haproxy_config(fd, **render)
    except (EncodeError, KeyError, TypeError, ValueError) as e:
        return [f"pdstack_router.frontdoor: haproxy.cfg cannot be rendered: {e}"]
    try:
        back = parse_haproxy(text)
    except ValueError as e:
        return [f"pdstack_router.frontdoor: the rendered haproxy.cfg does not read back: {e}"]
    if back != meant:
        diff = next((f"{a} != {b}" for a, b in zip(back, meant, strict=False) if a != b),
                    f"{len(back)} directives read back, {len(meant)} rendered")
        return [f"pdstack_router.frontdoor: the rendered haproxy.cfg reads back differently ({diff}): a value "
                "changed the configuration's structure"]
    return []


# what roles/frontdoor passes (the API key file's path is the role's default; its content never matters here)
ROLE_RENDER = {"user": "haproxy", "chroot": "/var/lib/haproxy", "api_key_file": "/etc/haproxy/pdstack-api-keys"}


def frontdoor_problems(fd: dict[str, Any], router_address: str, production: bool) -> list[str]:
    """Every problem of the plan's `router.frontdoor` as haproxy.cfg would carry it (make_plan runs this)."""
    out = bind_problems(fd, router_address, production) + limit_problems(fd)
    if out:
        return out
    render = {**ROLE_RENDER, "stats_socket": fd.get("runtime_socket") or RUNTIME_SOCKET,
              "maintenance_file": fd.get("maintenance_file") or MAINTENANCE_FILE}
    return readback_problems(fd, **render)
