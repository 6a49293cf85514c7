"""Rules for values that leave the inventory: identifiers, paths, addresses, unit-safe strings, ports.

Each rule is written once, as strict as its strictest consumer, and each check returns the message that names
the rule (or None). preflight.py applies them to every value of its class; inventory.py uses the identifier rule
in the schema.
"""

from __future__ import annotations

import ipaddress
import posixpath
import re
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import Any

# ---------------------------------------------------------------------------------------------- identifiers

# A server name becomes a systemd unit name (pdstack-server-<name>.service: [A-Za-z0-9:_.\\-@], <= 255 bytes), a
# Docker container name (pdstack-<name>: [a-zA-Z0-9][a-zA-Z0-9_.-]+) and a file name (/etc/pdstack/<name>.env: no
# "/", not "." or ".."). The intersection, with room for the prefixes and suffixes:
NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,62}")
NAME_RULE = ("1-63 characters of letters, digits, '.', '_' and '-', starting with a letter or digit (it becomes "
             "a systemd unit, a container and a file name)")


# Containers pdstack runs besides the servers are pdstack-<these>: a server of that name would take (and its unit's
# `docker rm -f` would kill) theirs.
RESERVED_NAMES = ("router", "dcgm-exporter", "watchdog", "prometheus", "grafana", "node-exporter", "haproxy",
                  "frontdoor", "front-door")


def name_problem(v: Any) -> str | None:
    if not isinstance(v, str) or not NAME_RE.fullmatch(v):
        return f"{v!r} is not a valid name: use {NAME_RULE}, e.g. 'prefill-0'"
    if v.lower() in RESERVED_NAMES:
        return (f"{v!r} is reserved: container pdstack-{v} is another pdstack service's; pick another name, e.g. "
                "'prefill-0'")
    return None


# An inventory host name names controller files (build/state/<inventory>/facts/<host>.json) and Prometheus labels.
HOST_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,252}")

# An environment variable name (docker --env-file takes KEY=VALUE lines; POSIX names)
ENV_NAME_RE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")

# An InfiniBand device as /sys/class/infiniband names it (mlx5_0, ibp12s0, rocep1s0f0), or a comma-separated list
IB_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")

# A Docker image reference: [registry[:port]/]path[:tag][@digest] (distribution/reference's grammar, simplified)
IMAGE_REF_RE = re.compile(
    r"(?:[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]+)?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@(?P<digest>[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:"
    r"[0-9a-fA-F]{32,}))?")
# The one digest Docker pulls by: sha256 and 64 lower-case hex digits (the OCI image spec's sha256 encoding;
# `docker pull name@sha256:<40 hex>` fails with "invalid reference format").
DIGEST_RE = re.compile(r"sha256:[0-9a-f]{64}")


def image_ref_problem(v: str) -> str | None:
    m = IMAGE_REF_RE.fullmatch(v)
    if not m:
        return (f"{v!r} is not a container image reference ([registry/]name[:tag][@sha256:digest], lower-case "
                "name, no spaces); e.g. pdstack/sglang:0123456789abcdef")
    if m.group("digest") is not None and (msg := digest_problem(m.group("digest"))):
        return f"{v!r} pins a digest Docker cannot pull by: {msg}"
    if "/" in v and (port := _registry_port(v.partition("/")[0])) is not None and not 1 <= port <= 65535:
        return f"{v!r} names registry port {port}, which is not a TCP port (1-65535)"
    return None


REGISTRY_RE = re.compile(r"[a-zA-Z0-9](?:[a-zA-Z0-9.-]*[a-zA-Z0-9])?(?::[0-9]{1,5})?")


def _registry_port(first: str) -> int | None:
    """The port of a reference's first component when it has one (HOST:PORT), else None."""
    _host, sep, port = first.partition(":")
    return int(port) if sep and port.isdigit() else None


def registry_problem(v: str) -> str | None:
    """None when `v` is a registry address Docker reads as one in REGISTRY/name@digest (HOST[:PORT])."""
    if not REGISTRY_RE.fullmatch(v):
        return (f"{v!r} is not a registry address: give HOST[:PORT] as the hosts reach it, no scheme, path or "
                "spaces (e.g. registry.example.com:5000)")
    host, sep, port = v.partition(":")
    if sep and (port.startswith("0") or not 1 <= int(port) <= 65535):
        return (f"{v!r}: port {port} is not a TCP port (1-65535, no leading zero); give the port the registry "
                f"listens on, e.g. {host}:5000")
    if ":" not in v and "." not in host and host != "localhost":
        # distribution/reference: a first component without '.' or ':' (and not localhost) is a Docker Hub namespace
        return (f"{v!r} would be read by Docker as a Docker Hub namespace, not a registry: add the port "
                f"({v}:5000) or the domain ({v}.example.com)")
    return None


def digest_problem(v: str) -> str | None:
    if not DIGEST_RE.fullmatch(v):
        return f"{v!r} is not an image digest: expected sha256: followed by 64 lower-case hex digits"
    return None


def split_digest_ref(ref: str) -> tuple[str, str, str] | None:
    """(registry, repository path, digest) of REGISTRY/PATH@sha256:<hex>; None when `ref` has no registry part or
    no sha256 digest."""
    name, sep, dig = ref.partition("@")
    if not sep or digest_problem(dig) or "/" not in name:
        return None
    registry, _, path = name.partition("/")
    if registry_problem(registry):
        return None
    return registry, path.partition(":")[0] if ":" in path.rsplit("/", 1)[-1] else path, dig


# ------------------------------------------------------------------------------------ values reaching a unit


def flag_like_problem(v: Any) -> str | None:
    """A value that follows a flag in an argv must not itself look like one (argparse would read '-x' as a flag)."""
    if isinstance(v, str) and v.startswith("-"):
        return (f"{v!r} starts with '-': on the command line it would be read as a flag, not as this value; remove "
                "the leading '-'")
    return None


# The unit template writes each argv word with Ansible's `quote` (shell quoting) and doubles '%'; systemd reads
# single-quoted words literally except that it still expands $VARS and C escapes ("\n") in ExecStart. So a word
# is safe when it has no whitespace, no control character, no quote of the kind shell quoting nests, no '$' and
# no backslash. Whatever else would be needed cannot be quoted safely through both layers: it is refused.
UNSAFE_CHARS = {"'": "a single quote", "\\": "a backslash", "$": "a '$' (systemd expands it)",
                "`": "a backquote"}
UNIT_VALUE_RULE = "no whitespace, control characters, quotes ('), backslashes, '$' or '`'"


def unit_value_problem(v: str) -> str | None:
    """None when `v` can be carried as one word of a systemd ExecStart= line (and a docker argv) unchanged."""
    for ch in v:
        if ch.isspace():
            return f"{v!r} contains whitespace, which cannot be passed safely through the systemd unit"
        if not ch.isprintable():
            return f"{v!r} contains a control character ({ch!r}), which cannot be passed through the systemd unit"
        if ch in UNSAFE_CHARS:
            return f"{v!r} contains {UNSAFE_CHARS[ch]}, which cannot be passed safely through the systemd unit"
    if v in ("", ";"):
        return f"{v!r} is empty or a command separator in a systemd ExecStart= line"
    return None


def env_value_problem(v: str) -> str | None:
    """docker --env-file: one KEY=VALUE per line, the value taken literally (no quoting at all)."""
    for ch in v:
        if ch in "\n\r" or not ch.isprintable() and not ch == "\t":
            return f"{v!r} contains a line break or control character, which an env file cannot carry"
    if v != v.strip():
        return f"{v!r} has leading or trailing whitespace, which docker's --env-file keeps or drops unpredictably"
    return None


# A host path that reaches `docker run --volume PATH:PATH:ro` (':' and ',' split the volume spec) and the unit
PATH_RE = re.compile(r"/[A-Za-z0-9._+@=/-]*")
PATH_RULE = "an absolute path of letters, digits and . _ + @ = - / (no spaces, ':' or ',': it becomes a --volume)"


def host_path_problem(v: str) -> str | None:
    if not v.startswith("/"):
        return f"{v!r} must be an absolute path on the host"
    if not PATH_RE.fullmatch(v):
        return f"{v!r} is not {PATH_RULE}"
    parts = v.split("/")
    if any(p in (".", "..") for p in parts) or "//" in v or (len(v) > 1 and v.endswith("/")):
        return f"{v!r} is not a normalized path (no '.', '..', '//' or trailing '/'); write it as {_norm(v)!r}"
    if v == "/":
        return f"{v!r} is the root directory; point it at the model directory"
    return None


def _norm(v: str) -> str:
    return posixpath.normpath(v)


def path_within(path: str, root: str) -> bool:
    """`path` names `root` or a file below it once normalised ('..' and '//' resolved the way the kernel does for
    a path without symlinks): `<root>/../../etc/x` is outside, whatever its prefix says."""
    p, r = posixpath.normpath(path), posixpath.normpath(root)
    if p.startswith("//"):  # POSIX keeps a leading '//' as implementation-defined; Linux reads it as '/'
        p = "/" + p.lstrip("/")
    return p == r or p.startswith(r.rstrip("/") + "/")


# ---------------------------------------------------------------------------------------------- addresses

HOSTNAME_RE = re.compile(r"(?=.{1,253}$)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?"
                         r"(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\.?")
DOC_NETS = [ipaddress.ip_network(n) for n in ("192.0.2.0/24", "198.51.100.0/24", "203.0.113.0/24", "2001:db8::/32")]


@dataclass(frozen=True)
class Address:
    text: str
    ip: ipaddress.IPv4Address | ipaddress.IPv6Address | None

    @property
    def url_host(self) -> str:
        return f"[{self.text}]" if isinstance(self.ip, ipaddress.IPv6Address) else self.text


def parse_address(v: str) -> tuple[Address | None, str | None]:
    """(address, None) or (None, what is wrong). A host name (RFC 1123) or an IP address; never a URL or host:port."""
    if "://" in v or "/" in v:
        return None, f"{v!r} is a URL or path; give only the host name or IP address (e.g. gpu02 or 10.0.0.12)"
    try:
        return Address(v, ipaddress.ip_address(v)), None
    except ValueError:
        pass
    if v.count(":") == 1 or (v.startswith("[") and "]" in v):
        return None, f"{v!r} carries a port; give only the host name or IP address (ports come from the plan)"
    if re.fullmatch(r"[0-9.]+", v):
        return None, f"{v!r} is not a valid IPv4 address"
    if not HOSTNAME_RE.fullmatch(v):
        return None, (f"{v!r} is neither an IP address nor a host name (letters, digits, '-' and '.' labels, "
                      "RFC 1123)")
    return Address(v, None), None


def _plain_ip(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """An IPv4-mapped IPv6 address (::ffff:127.0.0.1) as the IPv4 address it is: the kernel routes it there, but
    Python 3.11's ipaddress calls ::ffff:127.0.0.1 neither loopback nor ::ffff:0.0.0.0 unspecified."""
    return ip.ipv4_mapped if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None else ip


def is_loopback(a: Address) -> bool:
    """The one loopback rule: 127.0.0.0/8, ::1, either IPv4-mapped (::ffff:127.x.y.z), and the names that RFC 6761
    reserves for it (localhost, *.localhost; localhost.localdomain as distributions alias it)."""
    if a.ip is not None:
        return _plain_ip(a.ip).is_loopback
    name = a.text.lower().rstrip(".")
    return name in ("localhost", "localhost.localdomain") or name.endswith(".localhost")


def is_unspecified(a: Address) -> bool:
    """0.0.0.0, :: or ::ffff:0.0.0.0: a listen address, never one a host is reached at."""
    return a.ip is not None and _plain_ip(a.ip).is_unspecified


def is_local(a: Address) -> bool:
    """Loopback or unspecified: an address that names no other host."""
    return is_loopback(a) or is_unspecified(a)


def doc_net(a: Address) -> str | None:
    if a.ip is None:
        return None
    return next((str(n) for n in DOC_NETS if a.ip.version == n.version and a.ip in n), None)


# ---------------------------------------------------------------------------------------------- ports

PRIVILEGED_BELOW = 1024


@dataclass(frozen=True)
class Listener:
    """One TCP port something of the deployment listens on, on one host."""

    host: str
    port: int
    variable: str  # where it is set (the fix goes there)
    what: str
    privileged_ok: bool = False  # may be < 1024 (sshd; a front door on 80/443)


@cache
def role_default(role: str, key: str) -> Any:
    """A role's default (roles/<role>/defaults/main.yml): the ports of services pdstack installs."""
    import yaml

    p = Path(__file__).resolve().parents[3] / "roles" / role / "defaults" / "main.yml"
    try:
        return (yaml.safe_load(p.read_text()) or {}).get(key)
    except OSError:
        return None


def port_of(value: Any) -> Any:
    """The port of a port variable's value (8000, "8000", "0.0.0.0:9090"); the value itself when it is none."""
    v = value.rsplit(":", 1)[1] if isinstance(value, str) and ":" in value else value
    if isinstance(v, bool):
        return value
    try:
        return int(v)
    except (TypeError, ValueError, OverflowError):  # not a number; inf
        return value


def role_port(role: str, key: str) -> int:
    """The port of a role's default `key` (a port, or host:port): the one source of the fixed ports of services
    pdstack installs (node_exporter, dcgm-exporter, Prometheus, Grafana); everything else reads it from here."""
    v = role_default(role, key)
    if isinstance(v, str) and ":" in v:
        v = v.rsplit(":", 1)[1]
    try:
        return int(v)
    except (TypeError, ValueError):
        raise ValueError(f"roles/{role}/defaults/main.yml: {key} is {v!r}, not a port") from None


# Environment variables that make a process load or run code it was not started with, by class: the dynamic
# loader's (ld.so(8): every LD_* variable, LD_AUDIT and LD_PRELOAD among them, and GLIBC_TUNABLES), glibc's
# locale and charset loaders, Python's startup and import path (python(1): PYTHONSTARTUP, PYTHONPATH, PYTHONHOME,
# PYTHONBREAKPOINT, PYTHONWARNINGS imports the category's module), and shells' startup hooks.
_DANGEROUS_ENV_PREFIXES = (("LD_", "the dynamic loader reads it (ld.so(8)): it can load a library into the server"),
                           ("PYTHON", "Python reads it at startup (python(1)): it can import or run other code"),
                           ("BASH_FUNC_", "bash imports it as a function"))
_DANGEROUS_ENV = {"GLIBC_TUNABLES": "glibc's loader reads it", "GCONV_PATH": "glibc loads charset modules from it",
                  "LOCPATH": "glibc loads locales from it", "NLSPATH": "glibc loads message catalogs from it",
                  "BASH_ENV": "bash runs it at startup", "ENV": "sh runs it at startup",
                  "SHELLOPTS": "bash reads its options from it", "PS4": "bash expands it when tracing",
                  "PERL5OPT": "perl reads its options from it", "PERL5LIB": "perl loads modules from it",
                  "NODE_OPTIONS": "node reads its options from it", "RUBYOPT": "ruby reads its options from it"}
# Python's variables that change no code path (kept usable)
_HARMLESS_PYTHON_ENV = ("PYTHONUNBUFFERED", "PYTHONFAULTHANDLER", "PYTHONDONTWRITEBYTECODE", "PYTHONHASHSEED",
                        "PYTHONIOENCODING", "PYTHONUTF8")


def dangerous_env(name: str) -> str | None:
    """Why env `name` may not be set on a server (it loads or runs code), or None."""
    if name in _HARMLESS_PYTHON_ENV:
        return None
    if name in _DANGEROUS_ENV:
        return f"{name}: {_DANGEROUS_ENV[name]}, so it could run code the image does not hold"
    for prefix, why in _DANGEROUS_ENV_PREFIXES:
        if name.startswith(prefix):
            return f"{name}: {why}"
    return None


def non_ascii(text: str) -> str | None:
    """The first character of `text` outside printable ASCII, named (a look-alike letter such as Cyrillic 'о' for
    'o', a BOM, NUL or another control character), or None."""
    import unicodedata

    for i, ch in enumerate(text):
        if not (" " <= ch <= "~"):
            name = unicodedata.name(ch, None) or ("NUL" if ch == "\0" else "a control character")
            return f"character {i + 1} is U+{ord(ch):04X} {name}, not ASCII"
    return None


def ascii_skeleton(text: str) -> str:
    """`text` with look-alike letters folded to ASCII where Unicode decomposes them or their name says so (Cyrillic
    and Greek letters named like a Latin one), for "did you mean" hints only."""
    import unicodedata

    out = []
    for ch in text:
        if ch <= "~":
            out.append(ch)
            continue
        base = unicodedata.normalize("NFKD", ch)[0]
        if base <= "~":
            out.append(base)
            continue
        name = unicodedata.name(ch, "")
        latin = {"A": "a", "E": "e", "O": "o", "P": "r", "C": "c", "X": "x", "Y": "y", "I": "i", "K": "k", "M": "m",
                 "H": "n", "T": "t", "B": "b", "ES": "s", "IE": "e", "ER": "r", "EN": "n", "KA": "k", "EM": "m",
                 "TE": "t", "U": "u", "HA": "x", "OMICRON": "o", "ALPHA": "a", "RHO": "p", "NU": "v"}
        word = name.rsplit(" ", 1)[-1] if ("CYRILLIC" in name or "GREEK" in name) else ""
        out.append(latin.get(word, "?"))
    return "".join(out)
