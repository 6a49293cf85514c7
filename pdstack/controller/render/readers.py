"""The sinks' readers: each parses what its encoder (render/encoders.py) writes as the sink itself does, so a
rendered artifact can be read back and compared with what was meant (render/readback.py, render/artifacts.py,
tests/test_encoders.py). Each implements the sink's documented rules (systemd.syntax and systemd.service "Command
lines", as systemd's extract_first_word reads them; HAProxy 2.6 configuration.txt 2.2 "Quoting and escaping";
docker/cli pkg/kvfile; the Prometheus text format) for what the encoders emit, and refuses anything whose meaning
would depend on the host (an environment variable, a specifier) rather than guess.
"""

from __future__ import annotations

import re
from typing import NamedTuple

_PROM_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


_C_ESCAPES = {"a": "\a", "b": "\b", "f": "\f", "n": "\n", "r": "\r", "t": "\t", "v": "\v", "\\": "\\", '"': '"',
              "'": "'", "s": " "}



def _escape(line: str, i: int, table: dict[str, str]) -> tuple[str, int] | None:
    """The backslash escape at line[i] ("\\n", "\\x41", ...): (the character, how many characters it takes), or None
    when `table` and the \\xHH form do not name it."""
    nxt = line[i + 1:i + 2]
    if nxt in table:
        return table[nxt], 2
    if nxt == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", line[i + 2:i + 4]):
        return chr(int(line[i + 2:i + 4], 16)), 4
    return None


def _plain(c: str, quote: str | None, word: list[str]) -> str | None:
    """A character that is neither an escape nor an expansion: a quote opens or closes (the quote state after it is
    returned), any other character, the other kind of quote inside quotes included, joins the word."""
    if quote is None and c in "'\"":
        return c
    if c == quote:
        return None
    word.append(c)
    return quote


def _word(word: list[str], quote: str | None) -> str:
    """The word read, once its end is reached; a quote still open there is refused."""
    if quote is not None:
        raise ValueError(f"unterminated {quote} quote")
    return "".join(word)


def systemd_split(line: str, environ: dict[str, str] | None = None) -> list[str]:
    """systemd's reading of an ExecStart= value: words split on whitespace, '...' and "..." wrap (part of) a word,
    C-style escapes in and out of quotes, `%%` -> `%` (other specifiers refused: the unit has no instance here),
    `$$` -> `$`, and `$NAME`/`${NAME}` expanded from `environ` (refused when absent: the argv would depend on
    the host's environment)."""
    env = environ or {}
    words: list[str] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n:
            return words
        if line[i] == ";" and (i + 1 == n or line[i + 1] in " \t"):
            raise ValueError("a lone ';' separates commands: a second command in ExecStart=")
        word: list[str] = []
        quote = None
        while i < n:
            c = line[i]
            if quote is None and c in " \t":
                break
            if c == "%":
                if line[i + 1:i + 2] != "%":
                    raise ValueError(f"specifier %{line[i + 1:i + 2]} at column {i}: the value depends on the unit")
                word.append("%")
                i += 2
                continue
            if c == "$":
                if line[i + 1:i + 2] == "$":
                    word.append("$")
                    i += 2
                    continue
                m = re.match(r"\$(?:\{([A-Za-z_][A-Za-z0-9_]*)\}|([A-Za-z_][A-Za-z0-9_]*))", line[i:])
                if m is None:
                    word.append("$")
                    i += 1
                    continue
                name = m.group(1) or m.group(2)
                if name not in env:
                    raise ValueError(f"${name} at column {i}: the argv would take the host's environment variable")
                word.append(env[name])
                i += m.end()
                continue
            if c == "\\":
                esc = _escape(line, i, _C_ESCAPES)
                if esc is None:
                    raise ValueError(f"escape \\{line[i + 1:i + 2]} at column {i} is not one systemd reads the same "
                                     "way")
                word.append(esc[0])
                i += esc[1]
                continue
            quote = _plain(c, quote, word)
            i += 1
        words.append(_word(word, quote))


def parse_env_file(text: str) -> dict[str, str]:
    """Docker 28's reading of an --env-file: comment and blank lines skipped, leading whitespace dropped, KEY=VALUE
    split at the first '=', one pair of matching quotes around the value stripped. A line without '=' would copy
    the host's variable: refused here (we never write one)."""
    out: dict[str, str] = {}
    for no, raw in enumerate(text.split("\n"), 1):
        line = raw[:-1] if raw.endswith("\r") else raw
        line = line.lstrip()
        if not line or line.startswith("#"):
            continue
        key, eq, value = line.partition("=")
        if not eq:
            raise ValueError(f"line {no}: {line!r} has no '=' (docker would take the host's {key})")
        if not key or any(c.isspace() for c in key):
            raise ValueError(f"line {no}: variable {key!r} is empty or holds whitespace")
        if len(value) >= 2 and value[0] == value[-1] and value[0] in "'\"":
            value = value[1:-1]  # docker 28 (pkg/kvfile trimQuotes)
        out[key] = value
    return out


def parse_docker_volume(spec: str) -> tuple[str, str, str]:
    src, dst, mode = spec.split(":")
    return src, dst, mode


class Directive(NamedTuple):
    """One haproxy.cfg line: `section` is its section's header words (e.g. ('frontend', 'pdstack')), `keyword`
    the first word, `args` the rest."""

    section: tuple[str, ...]
    keyword: str
    args: tuple[str, ...]


SECTION_KEYWORDS = ("global", "defaults", "frontend", "backend", "listen", "resolvers", "peers", "userlist",
                    "program", "http-errors", "ring", "mailers", "cache")


_HAPROXY_ESCAPES = {" ": " ", "#": "#", "\\": "\\", "'": "'", '"': '"', "$": "$", "n": "\n", "r": "\r", "t": "\t"}


def haproxy_split(line: str) -> list[str]:
    """HAProxy's cutting of one line into words (configuration.txt 2.2): backslash escapes outside and inside
    double quotes, nothing interpreted inside single quotes, an unquoted # starts a comment. `$NAME` inside double
    quotes (an environment variable) is refused: what it becomes depends on the host."""
    words: list[str] = []
    i, n = 0, len(line)
    while True:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] == "#":
            return words
        word: list[str] = []
        quote = None
        while i < n:
            c = line[i]
            if quote is None and (c in " \t" or c == "#"):
                break
            if quote == "'":
                if c == "'":
                    quote = None
                else:
                    word.append(c)
                i += 1
                continue
            if c == "\\":
                esc = _escape(line, i, _HAPROXY_ESCAPES)
                if esc is None:  # HAProxy keeps a backslash before any other character
                    esc = (c, 1)
                word.append(esc[0])
                i += esc[1]
                continue
            if quote == '"' and c == "$":
                raise ValueError(f"column {i}: $ inside double quotes expands an environment variable")
            quote = _plain(c, quote, word)
            i += 1
        words.append(_word(word, quote))


def parse_haproxy(text: str) -> list[Directive]:
    """The directives of a haproxy.cfg (the read-back of haproxy_text): a line whose first word is a section
    keyword opens that section; every other line belongs to the section above it."""
    out: list[Directive] = []
    section: tuple[str, ...] | None = None
    for no, line in enumerate(text.split("\n"), 1):
        try:
            words = haproxy_split(line)
        except ValueError as e:
            raise ValueError(f"haproxy.cfg line {no}: {e}") from None
        if not words:
            continue
        if words[0] in SECTION_KEYWORDS:
            section = tuple(words)
            continue
        if section is None:
            raise ValueError(f"haproxy.cfg line {no}: {words[0]!r} outside any section")
        out.append(Directive(section, words[0], tuple(words[1:])))
    return out


def parse_prom_labels(text: str) -> dict[str, str]:
    """The labels of `{k="v",...}` as Prometheus' text parser reads them."""
    if not (text.startswith("{") and text.endswith("}")):
        raise ValueError(f"{text[:40]!r} is not a label set")
    out: dict[str, str] = {}
    i, body = 0, text[1:-1]
    while i < len(body):
        m = _PROM_NAME.match(body, i)
        if m is None or body[m.end():m.end() + 2] != '="':
            raise ValueError(f"column {i}: expected name=\"value\"")
        j, val = m.end() + 2, []
        while j < len(body) and body[j] != '"':
            if body[j] == "\\":
                nxt = body[j + 1:j + 2]
                if nxt not in ('\\', '"', "n"):
                    raise ValueError(f"column {j}: escape \\{nxt} is not one of \\\\ \\\" \\n")
                val.append("\n" if nxt == "n" else nxt)
                j += 2
                continue
            val.append(body[j])
            j += 1
        if j >= len(body):
            raise ValueError("unterminated label value")
        out[m.group()] = "".join(val)
        i = j + 1
        if body[i:i + 1] == ",":
            i += 1
    return out
