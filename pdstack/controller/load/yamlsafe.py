"""A strict YAML reader for inventory files: what Ansible would read silently differently is refused, with file:line.

Ansible reads group_vars/host_vars with YAML 1.1 and its own loader: a second key in one mapping wins silently, an
alias bomb expands without bound, a fifo blocks, `off` becomes False and `030001` the octal 12289, and `{{ ... }}`
is evaluated (lookups run code). pdstack reads every file first with this module and refuses those before Ansible
(or anything else) opens it. Nothing here evaluates a template: the one allowed form (`{{ inventory_dir }}` joined
to a literal path) is recognised by a regular expression and resolved by `resolve_template`.
"""

from __future__ import annotations

import math
import os
import re
import stat
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

MAX_FILE_BYTES = 1 << 20  # one inventory file; the shipped ones are about 1 KiB
MAX_TOTAL_BYTES = 8 << 20  # every file of one inventory together
MAX_FILES = 2000
MAX_DEPTH = 48  # nesting of mappings and lists
MAX_NODES = 200_000  # nodes of one file with every alias expanded (a 400-byte alias bomb has ~10^9)
MAX_INT = 2 ** 53  # beyond it a number is not exact in JSON (and as a float), so no inventory number may be

VAR_EXTS = (".yml", ".yaml", ".json", "")  # what Ansible's host_group_vars plugin reads
INVENTORY_EXTS = (".yml", ".yaml", ".json")
YAML11_BOOL_WORDS = ("yes", "no", "on", "off", "y", "n")
TEMPLATE_OPENERS = ("{{", "{%", "{#")
VAULT_HEADER = "$ANSIBLE_VAULT;"  # a file encrypted whole with ansible-vault starts so

_LoaderBase = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
_DECIMAL_INT = re.compile(r"[-+]?(0|[1-9][0-9]*)")
# plain scalars PyYAML (1.1) reads as text that YAML 1.2 reads as numbers: 065838 (leading zero, not octal), 1e5
_NUMBER_TO_OTHERS = re.compile(r"[-+]?0[0-9]+|[-+]?[0-9]+(\.[0-9]*)?[eE][-+]?[0-9]+")
_DECIMAL_FLOAT = re.compile(r"[-+]?([0-9]+\.[0-9]*|\.[0-9]+)([eE][-+]?[0-9]+)?")
# The one template form the shipped inventories use: a path next to the inventory, resolved without Jinja.
_ALLOWED_TEMPLATES = (
    re.compile(r"\{\{\s*\(\s*inventory_dir\s*~\s*'(?P<rest>[A-Za-z0-9._/-]*)'\s*\)\s*\|\s*realpath\s*\}\}"),
    re.compile(r"\{\{\s*inventory_dir\s*\}\}(?P<rest>[A-Za-z0-9._/-]*)"),
)


@dataclass
class Source:
    """Where one variable is set: the file (relative to the inventory), and its key and value nodes."""

    file: str
    key: yaml.Node
    value: yaml.Node

    def where(self) -> str:
        return f"{self.file}:{self.key.start_mark.line + 1}"


@dataclass
class Scan:
    """What scan_inventory found: problems, and per entity (("group"|"host", name)) each variable's sources."""

    problems: list[str] = field(default_factory=list)
    entities: dict[tuple[str, str], dict[str, list[Source]]] = field(default_factory=dict)
    var_dirs: dict[tuple[str, str], str] = field(default_factory=dict)  # entity -> the file/dir naming it
    files: set[str] = field(default_factory=set)  # the real path of every file read (origins.unlinted)


def is_pdstack_var(name: Any, extra: tuple[str, ...] = ()) -> bool:
    return isinstance(name, str) and (name.startswith("pdstack_") or name in extra)


# ------------------------------------------------------------------------------------------------- one file


def read_file(path: Path, rel: str, problems: list[str], budget: list[int] | None = None,
              decrypt: Any = None) -> yaml.Node | None:
    """The composed YAML document of `path` (None when empty or refused); problems name `rel` and the line. A file
    encrypted whole with ansible-vault is read through `decrypt` (load/vault.py), by the same rules."""
    try:
        st = os.stat(path)
    except OSError as e:
        problems.append(f"{rel}: cannot be read ({e.strerror}); fix or remove it")
        return None
    if not stat.S_ISREG(st.st_mode):
        kind = "a fifo" if stat.S_ISFIFO(st.st_mode) else "a device" if stat.S_ISCHR(st.st_mode) or stat.S_ISBLK(
            st.st_mode) else "a socket" if stat.S_ISSOCK(st.st_mode) else "not a regular file"
        problems.append(f"{rel}: is {kind}, not a regular file; inventory files must be plain files: remove it")
        return None
    if st.st_size > MAX_FILE_BYTES:
        problems.append(f"{rel}: {st.st_size} bytes, over the {MAX_FILE_BYTES} bytes an inventory file may have; "
                        "split it or remove what is not inventory")
        return None
    if budget is not None:
        budget[0] -= st.st_size
        if budget[0] < 0:
            problems.append(f"{rel}: the inventory's files are over {MAX_TOTAL_BYTES} bytes together; remove what "
                            "is not inventory")
            return None
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_FILE_BYTES + 1)
        text = data.decode("utf-8")
    except OSError as e:
        problems.append(f"{rel}: cannot be read ({e.strerror}); fix or remove it")
        return None
    except UnicodeDecodeError as e:
        problems.append(f"{rel}: not UTF-8 text (byte {e.start}); save it as UTF-8")
        return None
    if text.startswith(VAULT_HEADER):
        if decrypt is None:
            problems.append(f"{rel}: encrypted whole with ansible-vault, and no vault password was given: give it "
                            "the way Ansible takes one (ANSIBLE_VAULT_PASSWORD_FILE, or vault_password_file in "
                            "ansible.cfg; ansible-playbook also takes --vault-password-file)")
            return None
        try:
            text = decrypt(text)
        except ValueError as e:
            problems.append(f"{rel}: encrypted whole with ansible-vault: {e}")
            return None
    if text.startswith("\ufeff"):
        problems.append(f"{rel}: starts with a byte-order mark (U+FEFF, bytes EF BB BF); save it as UTF-8 without a "
                        "BOM")
        return None
    if "\0" in text:
        problems.append(f"{rel}:{text.count(chr(10), 0, text.index(chr(0))) + 1}: holds a NUL byte (U+0000); remove "
                        "it (a text editor shows it as ^@)")
        return None
    return parse_text(text, rel, problems)


def parse_text(text: str, rel: str, problems: list[str]) -> yaml.Node | None:
    """Compose `text` strictly: syntax, one document, depth, expanded size and duplicate keys checked."""
    before = len(problems)
    try:
        _check_events(text, rel, problems)
        if len(problems) > before:
            return None
        docs = list(yaml.compose_all(text, Loader=_LoaderBase))
    except yaml.YAMLError as e:
        problems.append(_syntax(e, rel))
        return None
    except RecursionError:
        problems.append(f"{rel}: nested too deeply; at most {MAX_DEPTH} levels of mappings and lists")
        return None
    if len(docs) > 1:
        problems.append(f"{rel}:{docs[1].start_mark.line + 1}: a second YAML document ('---'); one document per "
                        "file: move it to its own file")
        return None
    node = docs[0] if docs else None
    if node is None:
        return None
    size = _expanded_size(node, {})
    if size > MAX_NODES:
        problems.append(f"{rel}: {size} values with every alias (*name) expanded, over {MAX_NODES}: an alias bomb? "
                        "write the values out, without anchors and aliases")
        return None
    _duplicates(node, rel, problems)
    return node if len(problems) == before else None


def _syntax(e: yaml.YAMLError, rel: str) -> str:
    mark = getattr(e, "problem_mark", None) or getattr(e, "context_mark", None)
    where = f"{rel}:{mark.line + 1}:{mark.column + 1}" if mark is not None else rel
    what = " ".join(str(x) for x in (getattr(e, "context", None), getattr(e, "problem", None)) if x) or str(e)
    return (f"{where}: YAML syntax error: {what}; fix the indentation or quoting there (a value holding ': ', '#', "
            "'{' or starting with '*', '&', '!', '%', '@' or '`' needs quotes)")


def _check_events(text: str, rel: str, problems: list[str]) -> None:
    """Depth and document bounds from the event stream, before anything is composed (no recursion here)."""
    loader = _LoaderBase(text)
    try:
        depth = 0
        while loader.check_event():
            ev = loader.get_event()
            if isinstance(ev, yaml.CollectionStartEvent):
                depth += 1
                if depth > MAX_DEPTH:
                    problems.append(f"{rel}:{ev.start_mark.line + 1}: nested more than {MAX_DEPTH} levels deep; "
                                    "flatten it")
                    return
            elif isinstance(ev, yaml.CollectionEndEvent):
                depth -= 1
    finally:
        loader.dispose()


def _expanded_size(node: yaml.Node, memo: dict[int, int]) -> int:
    """Nodes of `node` with every alias expanded, computed once per shared node (so a bomb is measured, not
    expanded). Capped just above MAX_NODES."""
    if id(node) in memo:
        return memo[id(node)]
    memo[id(node)] = MAX_NODES + 1  # a cycle counts as too big
    n = 1
    if isinstance(node, yaml.SequenceNode):
        for item in node.value:
            n += _expanded_size(item, memo)
            if n > MAX_NODES:
                break
    elif isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            n += _expanded_size(k, memo) + _expanded_size(v, memo)
            if n > MAX_NODES:
                break
    memo[id(node)] = min(n, MAX_NODES + 1)
    return memo[id(node)]


def _duplicates(node: yaml.Node, rel: str, problems: list[str], seen: set[int] | None = None) -> None:
    seen = set() if seen is None else seen
    if id(node) in seen:
        return
    seen.add(id(node))
    if isinstance(node, yaml.MappingNode):
        first: dict[str, yaml.Node] = {}
        for k, v in node.value:
            if isinstance(k, yaml.ScalarNode):
                if k.value in first:
                    problems.append(f"{rel}:{k.start_mark.line + 1}: key {k.value!r} is set twice in one mapping "
                                    f"(lines {first[k.value].start_mark.line + 1} and {k.start_mark.line + 1}); "
                                    "Ansible would silently keep the last: remove one of them")
                else:
                    first[k.value] = k
            _duplicates(v, rel, problems, seen)
    elif isinstance(node, yaml.SequenceNode):
        for item in node.value:
            _duplicates(item, rel, problems, seen)


# -------------------------------------------------------------------------------- the values of pdstack variables


def check_value(node: yaml.Node, path: str, rel: str, problems: list[str], aliased: set[int]) -> None:
    """Refuse what YAML 1.1 (Ansible) would read differently from what the text says, and templates, in one
    pdstack variable's value. `aliased`: nodes that appear more than once in the file (anchors and aliases)."""
    line = node.start_mark.line + 1
    where = f"{path} ({rel}:{line})"
    if id(node) in aliased:
        problems.append(f"{where}: an anchor or alias (&name / *name) in a pdstack value; write the value out "
                        "(aliases are not allowed in pdstack variables)")
        return
    if msg := explicit_tag(node):
        problems.append(f"{where}: {msg}")
        return
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            key = k.value if isinstance(k, yaml.ScalarNode) else "?"
            if key == "<<":
                problems.append(f"{where}: a YAML merge key (<<) in a pdstack value; write the keys out")
                continue
            if isinstance(k, yaml.ScalarNode) and (msg := scalar_problem(k)):
                problems.append(f"{path}.{key} ({rel}:{k.start_mark.line + 1}): the key: {msg}")
                continue
            check_value(v, f"{path}.{key}", rel, problems, aliased)
    elif isinstance(node, yaml.SequenceNode):
        for i, item in enumerate(node.value):
            check_value(item, f"{path}[{i}]", rel, problems, aliased)
    elif isinstance(node, yaml.ScalarNode):
        msg = scalar_problem(node)
        if msg:
            problems.append(f"{where}: {msg}")


# the tags a node may carry without saying so; `!vault` is Ansible's encrypted value (decrypted by Ansible)
_DEFAULT_TAGS = {yaml.MappingNode: "tag:yaml.org,2002:map", yaml.SequenceNode: "tag:yaml.org,2002:seq"}
_ALLOWED_TAGS = ("!vault",)


def explicit_tag(node: yaml.Node) -> str | None:
    """An explicit tag (`!!int "030001"`, `!!binary`, `!!omap`, `!custom`): the text then says something else than the
    value Ansible reads (the quoted 030001 is the octal 12289). None for an untagged node or `!vault`."""
    if node.tag in _ALLOWED_TAGS:
        return None
    if isinstance(node, yaml.ScalarNode):
        implicit = (yaml.resolver.Resolver().resolve(yaml.ScalarNode, node.value, (True, False))
                    if node.style in (None, "") else "tag:yaml.org,2002:str")
        if node.tag == implicit:
            return None
    elif node.tag == _DEFAULT_TAGS.get(type(node)):
        return None
    shown = node.tag.replace("tag:yaml.org,2002:", "!!")
    return (f"an explicit YAML tag ({shown}) makes Ansible read the text as something else than it says; remove the "
            "tag and write the value plainly (a number unquoted, in decimal; a text quoted)")


def scalar_problem(node: yaml.ScalarNode) -> str | None:
    """What is wrong with one scalar of a pdstack value, as written (its text, its quoting, its resolved tag)."""
    text, tag = node.value, node.tag.rsplit(":", 1)[-1]
    if any(o in text for o in TEMPLATE_OPENERS) and not allowed_template(text):
        return (f"{text!r} is a Jinja template; pdstack values are never templated (a lookup would run code on the "
                "controller): write the value itself (the only template allowed is '{{ inventory_dir }}/<path>')")
    if node.style not in (None, ""):  # quoted or block scalar: a string, as written
        return None
    low = text.lower()
    if low in YAML11_BOOL_WORDS:
        read = f"the boolean {low in ('yes', 'on', 'y')}" if tag == "bool" else "a string, other YAML readers as a bool"
        return (f"unquoted {text} is read by YAML 1.1 (Ansible) as {read}; quote it: \"{text}\" (or write true or "
                "false for a switch)")
    if tag == "str" and _NUMBER_TO_OTHERS.fullmatch(text):
        return (f"unquoted {text} is a number to other YAML readers (YAML 1.2) and a text to this one; write the "
                f"number in plain decimal ({_plain(text)}), or quote it (\"{text}\") if it is a text")
    if tag == "int" and not _DECIMAL_INT.fullmatch(text):
        value = _shown(yaml.safe_load(text))
        digits = text.lstrip("+-").replace("_", "").lstrip("0") or "0"
        fix = f"write {text[0] if text[0] in '+-' else ''}{digits}" if digits.isdigit() else f"write {value}"
        return (f"{text} is read by YAML 1.1 as the number {value} (leading zero: octal; ':': base 60; 0x/0b, '_'); "
                f"{fix}, or quote it (\"{text}\") if it is a text")
    if tag == "float":
        if low.lstrip("+-") in (".inf", ".nan"):
            return f"{text} is not a finite number; write a number"
        if not _DECIMAL_FLOAT.fullmatch(text):
            return (f"{text} is read by YAML 1.1 as the number {_shown(yaml.safe_load(text))}; write it as a plain "
                    f"decimal number, or quote it (\"{text}\") if it is a text")
    if tag == "int" and (len(text.lstrip("+-")) > 17 or abs(int(text)) > MAX_INT):
        return f"{text} is beyond 2**53 (not exact as a number); write a smaller number"
    if tag == "float" and (not math.isfinite(float(text)) or abs(float(text)) > MAX_INT):
        return f"{text} is not a finite number within 2**53; write a smaller number"
    if tag == "timestamp":
        return f"unquoted {text} is read by YAML as a date; quote it: \"{text}\""
    return None


def _plain(text: str) -> str:
    try:
        v = float(text)
    except ValueError:
        return text
    return str(int(v)) if v.is_integer() and abs(v) <= MAX_INT else repr(v)


def _shown(value: Any) -> str:
    """A number as a message may show it (a 5000-digit one is cut: str() of it would raise)."""
    if isinstance(value, int) and value.bit_length() > 64:
        return f"of {value.bit_length()} bits"
    return repr(value)


def allowed_template(text: str) -> bool:
    return any(p.fullmatch(text) for p in _ALLOWED_TEMPLATES)


def resolve_template(text: str, inventory_dir: str) -> str:
    """The value of an allowed template (see allowed_template), computed without Jinja; other text unchanged."""
    for i, p in enumerate(_ALLOWED_TEMPLATES):
        m = p.fullmatch(text)
        if m:
            joined = inventory_dir + m.group("rest")
            return os.path.realpath(joined) if i == 0 else joined
    return text


def aliased_nodes(node: yaml.Node) -> set[int]:
    """ids of the nodes reached more than once (an anchor and its aliases compose to one shared node)."""
    seen: set[int] = set()
    twice: set[int] = set()
    stack = [node]
    while stack:
        n = stack.pop()
        if id(n) in seen:
            twice.add(id(n))
            continue
        seen.add(id(n))
        if isinstance(n, yaml.SequenceNode):
            stack.extend(n.value)
        elif isinstance(n, yaml.MappingNode):
            for k, v in n.value:
                stack.extend((k, v))
    return twice


def construct(node: yaml.Node | None) -> Any:
    """The Python value of a node that passed the checks (safe types only)."""
    if node is None:
        return None
    loader = yaml.SafeLoader("")
    try:
        return loader.construct_document(node)
    finally:
        loader.dispose()


def load_vars_text(text: str, rel: str = "<text>", extra: tuple[str, ...] = ()) -> dict[str, Any]:
    """One vars file's variables, read strictly: raises InventoryError naming `rel` and the line, else returns exactly
    what the text means. (The whole inventory goes through scan_inventory; this is the same rule for one text.)"""
    from pdstack.errors import InventoryError

    problems: list[str] = []
    node = parse_text(text, rel, problems)
    if node is not None:
        top_vars(node, rel, problems, extra)
    if problems:
        raise InventoryError(problems)
    value = construct(node)
    return value or {}


def top_vars(node: yaml.Node, rel: str, problems: list[str], extra: tuple[str, ...] = (),
             aliased: set[int] | None = None) -> list[tuple[str, yaml.Node, yaml.Node]]:
    """(name, key node, value node) of each variable of a vars mapping, the pdstack ones checked (check_value).
    `aliased`: the shared nodes of the whole file (default: of `node`)."""
    if not isinstance(node, yaml.MappingNode):
        problems.append(f"{rel}:{node.start_mark.line + 1}: variables must be a mapping of names to values "
                        "(name: value lines)")
        return []
    aliased = aliased_nodes(node) if aliased is None else aliased
    out = []
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode):
            problems.append(f"{rel}:{k.start_mark.line + 1}: a variable name must be a plain word")
            continue
        if k.value == "<<":
            problems.append(f"{rel}:{k.start_mark.line + 1}: a YAML merge key (<<) among the variables: Ansible merges "
                            "its keys in as variables (a pdstack setting among them, unchecked); write each variable "
                            "out")
            continue
        if is_pdstack_var(k.value, extra):
            if id(v) in aliased:
                problems.append(f"{k.value} ({rel}:{k.start_mark.line + 1}): set with an anchor or alias (&name / "
                                "*name); write the value out (aliases are not allowed in pdstack variables)")
                continue
            check_value(v, k.value, rel, problems, aliased)
        out.append((k.value, k, v))
    return out
