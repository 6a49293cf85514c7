"""One encoder per sink: every value reaches its sink (argv, systemd unit, env file, haproxy.cfg, nft script, docker
flags, JSON) through the sink's encoder, which refuses what that sink cannot carry, and each has its reader, so a
rendered artifact can be read back and compared with what was meant (render/readback.py, tests/test_encoders.py).

An encoder raises EncodeError (a ValueError) naming the value and why; callers prefix the variable it came from.
A renderer's command line (firewall.py, frontdoor.py) reads the plan with read_plan and ends in write_or_refuse.
Each sink's reader is in render/readers.py.
"""

from __future__ import annotations

import ipaddress
import json
import re
import sys
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from pdstack.controller.load import flags
from pdstack.controller.render.readers import (
    SECTION_KEYWORDS,
    Directive,
)

ENV_KEY = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")


class EncodeError(ValueError):
    """A value its sink cannot carry."""


def read_plan(path: str) -> dict[str, Any]:
    """plan.json from a file, or from stdin for `-` (a renderer's --plan)."""
    return json.loads(sys.stdin.read() if path == "-" else Path(path).read_text())


def write_or_refuse(render: Callable[[], str], refusal: str) -> int:
    """A renderer's command line ends here: `render()`'s text on stdout (exit 0), or `refusal: why` on stderr (exit
    2) for a value of the plan its sink cannot carry (make_plan refuses those first; a hand-edited plan.json lands
    here)."""
    try:
        text = render()
    except EncodeError as e:
        print(f"{refusal}: {e}", file=sys.stderr)
        return 2
    sys.stdout.write(text)
    return 0


def _text(value: Any, sink: str) -> str:
    if not isinstance(value, str):
        raise EncodeError(f"{value!r} is a {type(value).__name__}, not a string ({sink} takes text)")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as e:
        raise EncodeError(f"{value!r} is not valid Unicode text ({e.reason}); {sink} files are UTF-8") from None
    return value


def _no_control(value: str, sink: str, allow_tab: bool = False) -> str:
    for c in value:
        if _CONTROL.match(c) and not (allow_tab and c == "\t"):
            what = {"\n": "a newline", "\r": "a carriage return", "\x00": "a NUL byte"}.get(c, f"control character "
                                                                                               f"{c!r}")
            raise EncodeError(f"{value!r} holds {what}, which {sink} cannot carry (it would end or split the line)")
    return value


# ------------------------------------------------------------------------------------------------ argv words


def argv_word(value: Any) -> str:
    """One word of a process's argv: any text but NUL (execve ends a word there)."""
    w = _text(value, "an argv word")
    if "\x00" in w:
        raise EncodeError(f"{w!r} holds a NUL byte, which no argv word can carry")
    return w


def _argv(value: Any, item: int | None) -> str:
    w = argv_word(value)
    try:
        return flags.argv_word("?", w, item)
    except flags.Unrenderable as e:
        raise EncodeError(str(e).removeprefix("extra_args.?: ")) from None


def argv_item(value: Any) -> str:
    """A list item of a multi-value flag (nargs '+'/'*'): a word starting with '-' would be read as a flag (argparse
    ends the list there and parses the rest: `[x, --decode, URL]` adds a worker), so it is refused. The rule lives
    in load/flags.py (argv_word), which renders extra_args."""
    return _argv(value, 0)


def argv_value(value: Any) -> str:
    """The single value of a flag: a word starting with '-' that is not a number reads as a flag."""
    return _argv(value, None)


# ----------------------------------------------------------------------------------------- systemd unit files

_SYSTEMD_SAFE = re.compile(r"[A-Za-z0-9_./:,+=@-]+")


def systemd_value(value: Any) -> str:
    """A unit file setting's value (Description=, ...): one line, `%` specifiers escaped as `%%`."""
    return _no_control(_text(value, "a systemd unit line"), "a systemd unit line").replace("%", "%%")


def systemd_word(value: Any) -> str:
    """One word of ExecStart= (systemd.service "Command lines"): bare when plain, else in double quotes with C-style
    escapes for \\ and "; `%` (specifiers) as `%%` and `$` (environment expansion) as `$$`. A newline or control
    character is refused (systemd would end the line there)."""
    w = _no_control(argv_word(value), "an ExecStart word")
    if _SYSTEMD_SAFE.fullmatch(w):
        return w
    inner = w.replace("\\", "\\\\").replace('"', '\\"').replace("%", "%%").replace("$", "$$")
    return f'"{inner}"'


def systemd_exec(argv: Sequence[Any]) -> str:
    """ExecStart='s value for `argv`; the first word is the executable (an absolute path or a plain name)."""
    if not argv:
        raise EncodeError("an empty argv has no executable")
    if str(argv[0]).startswith(("-", "@", "+", "!", ":")):
        raise EncodeError(f"executable {argv[0]!r} starts with a character systemd reads as a prefix (-@+!:)")
    return " ".join(systemd_word(w) for w in argv)


# ------------------------------------------------------------------------------------- environment-file lines


ENV_LINE_MAX = 64 * 1024 - 1  # bufio.MaxScanTokenSize: docker refuses a longer line


def env_line(key: Any, value: Any) -> str:
    """One KEY=VALUE line of the env file docker reads (`docker run --env-file`, docker/cli pkg/kvfile: no escapes,
    the value is the rest of the line, lines split at LF with a trailing CR dropped, at most 64 KiB; docker 28 also
    strips one pair of matching quotes around the value, older versions keep them, so such a value is refused)."""
    k = _text(key, "an environment-file key")
    if not ENV_KEY.fullmatch(k):
        raise EncodeError(f"environment variable name {k!r} is not [A-Za-z_][A-Za-z0-9_]*")
    v = _no_control(_text(value, "an environment-file value"), "an environment-file line", allow_tab=True)
    if len(v) >= 2 and v[0] == v[-1] and v[0] in "'\"":
        raise EncodeError(f"value {v[:40]!r} starts and ends with {v[0]}: docker 28 strips them, older docker keeps "
                          "them; drop the quotes (values are taken as is)")
    line = f"{k}={v}"
    if len(line.encode()) > ENV_LINE_MAX:
        raise EncodeError(f"{k}=... is {len(line.encode())} bytes; docker's env-file reader stops at {ENV_LINE_MAX}")
    return line


def env_file(env: dict[str, Any]) -> str:
    return "".join(env_line(k, v) + "\n" for k, v in env.items())


# -------------------------------------------------------------------------------------------- docker run flags


def docker_env(key: Any, value: Any) -> list[str]:
    """`--env KEY=VALUE` (no NUL: an argv word)."""
    k = _text(key, "a docker --env name")
    if not ENV_KEY.fullmatch(k):
        raise EncodeError(f"environment variable name {k!r} is not [A-Za-z_][A-Za-z0-9_]*")
    return ["--env", argv_word(f"{k}={_text(value, 'a docker --env value')}")]


def docker_volume(source: Any, target: Any, mode: str = "ro") -> list[str]:
    """`--volume SRC:DST:MODE`: docker splits the spec at ':' (and ',' in modes), so neither path may hold one; both
    must be absolute and one line."""
    out = []
    for what, p in (("source", source), ("target", target)):
        s = _no_control(_text(p, f"a docker --volume {what}"), f"a docker --volume {what}")
        if not s.startswith("/"):
            raise EncodeError(f"--volume {what} {s!r} is not an absolute path")
        if ":" in s or "," in s:
            raise EncodeError(f"--volume {what} {s!r} holds ':' or ',', which split docker's volume spec")
        out.append(s)
    if mode not in ("ro", "rw"):
        raise EncodeError(f"--volume mode {mode!r} is not ro or rw")
    return ["--volume", argv_word(f"{out[0]}:{out[1]}:{mode}")]


# ------------------------------------------------------------------------------------------------------ JSON


def json_text(value: Any, **kw: Any) -> str:
    """JSON for any reader: ASCII only, and NaN/Infinity (not JSON) refused."""
    try:
        return json.dumps(value, ensure_ascii=True, allow_nan=False, **kw)
    except ValueError as e:
        raise EncodeError(f"{value!r} is not JSON: {e}") from None


# ----------------------------------------------------------------------------------------------------- HAProxy

_HAPROXY_SAFE = re.compile(r"[^\s#'\"\\]+")


def haproxy_word(value: Any) -> str:
    """One word of haproxy.cfg (HAProxy 2.6 configuration.txt 2.2): bare when it holds no space, #, quote or
    backslash; else strongly quoted ('...', nothing interpreted inside) when it holds no single quote; else weakly
    quoted ("...", with \\\\, \\" and \\$ escaped: `$NAME` would expand an environment variable). Control
    characters (a newline would start a directive of its own) and the empty word are refused."""
    w = _no_control(_text(value, "a haproxy.cfg word"), "a haproxy.cfg line")
    if not w:
        raise EncodeError("an empty haproxy.cfg word")
    if _HAPROXY_SAFE.fullmatch(w):
        return w
    if "'" not in w:
        return f"'{w}'"
    return '"' + w.replace("\\", "\\\\").replace('"', '\\"').replace("$", "\\$") + '"'


def haproxy_address(address: Any, port: Any) -> str:
    """ADDRESS:PORT of a `bind` or `server` line: a literal IP (a name is resolved by HAProxy at start, on the host;
    any other text could be a second word or directive) and a TCP port. IPv6 is written as HAProxy reads it
    (`::1:8000`, the last colon separates the port)."""
    a = _no_control(_text(address, "a haproxy.cfg address"), "a haproxy.cfg line")
    try:
        ip = ipaddress.ip_address(a)
    except ValueError:
        raise EncodeError(f"{a!r} is not a literal IP address (haproxy.cfg takes ADDRESS:PORT here)") from None
    if isinstance(port, bool) or not isinstance(port, int) or not 1 <= port <= 65535:
        raise EncodeError(f"port {port!r} is not a TCP port (an integer 1-65535)")
    return f"{ip}:{port}"


def haproxy_text(directives: Iterable[Directive], header: Sequence[str] = ()) -> str:
    """haproxy.cfg from `directives` (sections in the order they first appear, consecutive), each word encoded;
    `header`: comment lines (one line each, '# ' prepended)."""
    out = [f"# {_no_control(_text(h, 'a haproxy.cfg comment'), 'a haproxy.cfg comment')}" for h in header]
    current: tuple[str, ...] | None = None
    seen: set[tuple[str, ...]] = set()
    for d in directives:
        if d.section != current:
            if d.section in seen:
                raise EncodeError(f"section {' '.join(d.section)!r} appears twice (its directives must be together)")
            if not d.section or d.section[0] not in SECTION_KEYWORDS:
                raise EncodeError(f"{d.section!r} is not a HAProxy section header")
            if current is not None:
                out.append("")
            out.append(" ".join(haproxy_word(w) for w in d.section))
            current = d.section
            seen.add(current)
        if d.keyword in SECTION_KEYWORDS or d.keyword.startswith("."):
            raise EncodeError(f"keyword {d.keyword!r} would open a section or a conditional block")
        out.append("    " + " ".join(haproxy_word(w) for w in (d.keyword, *d.args)))
    return "\n".join(out) + "\n"


# ---------------------------------------------------------------------------------------------------- nftables

_NFT_IDENT = re.compile(r"[A-Za-z][A-Za-z0-9_]{0,31}")


def nft_address(value: Any) -> str:
    """An IPv4/IPv6 address or CIDR as nft reads it (normalised; anything else refused: a name would be resolved
    by nft at load time, a word could be a keyword)."""
    s = _text(value, "an nft address")
    try:
        return str(ipaddress.ip_network(s.strip(), strict=False))
    except ValueError:
        raise EncodeError(f"{s!r} is not an IP address or CIDR") from None


def nft_port(value: Any) -> str:
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 65535:
        raise EncodeError(f"{value!r} is not a TCP port (an integer 1-65535)")
    return str(value)


def nft_ident(value: Any) -> str:
    s = _text(value, "an nft name")
    if not _NFT_IDENT.fullmatch(s):
        raise EncodeError(f"{s!r} is not an nft table/chain/set name ([A-Za-z][A-Za-z0-9_]{{0,31}})")
    return s


def nft_comment(value: Any) -> str:
    """Text after '#' to the end of the line: no newline or control character (it would end the comment and the
    rest would be a rule)."""
    return _no_control(_text(value, "an nft comment"), "an nft comment line")


def nft_string(value: Any) -> str:
    """A quoted nft string (`comment "..."`, an interface name): no double quote, no control character, at most
    127 bytes (NFT_USERDATA's comment limit is 128 with the NUL)."""
    s = _no_control(_text(value, "an nft string"), "an nft string")
    if '"' in s:
        raise EncodeError(f"{s!r} holds a double quote, which nft strings cannot escape")
    if len(s.encode()) > 127:
        raise EncodeError(f"{s[:40]!r}... is {len(s.encode())} bytes; nft strings hold at most 127")
    return f'"{s}"'


# ------------------------------------------------------------------------------- Prometheus text exposition

_PROM_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


def prom_label(value: Any) -> str:
    """A label value of the Prometheus text format (node_exporter's textfile collector reads it), quoted: backslash,
    double quote and line feed escaped as the format defines; other control characters refused."""
    v = _text(str(value) if isinstance(value, int) and not isinstance(value, bool) else value, "a Prometheus label")
    _no_control(v.replace("\n", " "), "a Prometheus label value")
    return '"' + v.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n") + '"'


def prom_labels(labels: dict[str, Any]) -> str:
    for k in labels:
        if not _PROM_NAME.fullmatch(k) or k.startswith("__"):
            raise EncodeError(f"{k!r} is not a Prometheus label name")
    return "{" + ",".join(f"{k}={prom_label(v)}" for k, v in labels.items()) + "}"
