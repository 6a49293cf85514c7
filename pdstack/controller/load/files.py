"""The strict lint of an inventory's files, read before Ansible opens any of them; it produces no value pdstack uses.

The values come from Ansible's own loading (load/inventory.py, load/origins.py). This lint reads the same files
(load/origins.unlinted proves it covered each one Ansible read) for what Ansible would accept silently: YAML that
reads as something else than it says (yamlsafe), and a pdstack variable set in two files of one entity
(group_vars/all/router.yml and router_old.yml; group_vars/all.yml and group_vars/all/x.yml; hosts.yml and
host_vars/), refused naming both instead of the later one silently winning.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import yaml

from pdstack.controller.load import yamlsafe
from pdstack.controller.load.yamlsafe import Scan, Source

Entity = tuple[str, str]  # ("group" | "host", name)
# suffixes no vars file has (Ansible's INVENTORY_IGNORE_EXTS): a host_vars/ entry with another one, e.g. 10.0.0.1,
# is the vars file of the host of that full name
IGNORED_EXTS = (".md", ".txt", ".rst", ".orig", ".bak", ".swp", ".pyc", ".pyo", ".retry", ".cfg", ".ini", ".rpm")


def scan_inventory(src: Path, extra: tuple[str, ...] = (), decrypt=None) -> Scan:
    """Read every file Ansible would read for inventory `src` (a directory or one inventory file); `decrypt` reads
    a file encrypted whole with ansible-vault (load/vault.py)."""
    scan = Scan()
    base = src if src.is_dir() else src.parent
    budget = [yamlsafe.MAX_TOTAL_BYTES]
    files = [src] if not src.is_dir() else sorted(
        p for p in src.iterdir() if not p.name.startswith(".") and p.suffix in yamlsafe.INVENTORY_EXTS)
    for p in files:
        rel = _rel(p, base)
        node = yamlsafe.read_file(p, rel, scan.problems, budget, decrypt)
        scan.files.add(os.path.realpath(p))
        if node is not None:
            _inventory_vars(node, rel, scan, extra, yamlsafe.aliased_nodes(node))
    count = [0]
    for kind, sub in (("group", "group_vars"), ("host", "host_vars")):
        d = base / sub
        if not d.is_dir():
            continue
        for entry in sorted(d.iterdir()):
            if entry.name.startswith("."):
                continue
            if entry.is_dir():
                name, found = entry.name, _walk(entry, set(), count, scan.problems, base)
            elif entry.suffix in yamlsafe.VAR_EXTS[:-1]:
                name, found = entry.stem, [entry]
                count[0] += 1
            elif entry.suffix in IGNORED_EXTS or entry.name.endswith("~"):
                continue  # router.yml.bak, notes.md: no host or group is named so, Ansible does not read them
            else:  # host_vars/10.0.0.1: Ansible reads it for the host of that name
                name, found = entry.name, [entry]
                count[0] += 1
            if count[0] > yamlsafe.MAX_FILES:
                scan.problems.append(f"{sub}: more than {yamlsafe.MAX_FILES} vars files; remove what is not "
                                     "inventory")
                break
            for p in found:
                rel = _rel(p, base)
                node = yamlsafe.read_file(p, rel, scan.problems, budget, decrypt)
                scan.files.add(os.path.realpath(p))
                if node is not None and (found_vars := yamlsafe.top_vars(node, rel, scan.problems, extra)):
                    scan.var_dirs.setdefault((kind, name), _rel(entry, base))  # it sets something
                    _add(scan, (kind, name), rel, found_vars, extra)
    for (kind, name), variables in scan.entities.items():
        for var, sources in variables.items():
            if len(sources) > 1:
                scan.problems.append(
                    f"{var}: set {len(sources)} times for {kind} {name}: {', '.join(s.where() for s in sources)}; "
                    "Ansible would silently use the one it reads last: keep it in one file and delete the others")
    return scan


def _rel(p: Path, base: Path) -> str:
    try:
        return str(p.relative_to(base))
    except ValueError:
        return str(p)


def _walk(d: Path, seen: set[str], count: list[int], problems: list[str], base: Path) -> list[Path]:
    """The vars files under directory `d` as Ansible's host_group_vars plugin finds them (sorted, recursive,
    hidden files and other extensions skipped), symlink loops and too many files refused."""
    real = os.path.realpath(d)
    if real in seen:
        problems.append(f"{_rel(d, base)}: a symlink loop; remove the link")
        return []
    seen = seen | {real}
    out: list[Path] = []
    for p in sorted(d.iterdir()):
        if p.name.startswith(".") or p.name.endswith("~"):
            continue
        if p.is_dir():
            out += _walk(p, seen, count, problems, base)
        elif p.suffix in yamlsafe.VAR_EXTS[:-1] or "." not in p.name:
            count[0] += 1
            if count[0] > yamlsafe.MAX_FILES:
                problems.append(f"{_rel(d, base)}: more than {yamlsafe.MAX_FILES} vars files; remove what is not "
                                "inventory")
                return out
            out.append(p)
    return out


def _add(scan: Scan, entity: Entity, rel: str, found: list[tuple[str, yaml.Node, yaml.Node]],
         extra: tuple[str, ...]) -> None:
    """Record where each pdstack variable (and each of `extra`) of `entity` is set."""
    variables = scan.entities.setdefault(entity, {})
    for name, k, v in found:
        if yamlsafe.is_pdstack_var(name, extra):
            variables.setdefault(name, []).append(Source(rel, k, v))


def _inventory_vars(node: yaml.Node, rel: str, scan: Scan, extra: tuple[str, ...], aliased: set[int]) -> None:
    """Variables a YAML inventory file sets inline: `vars:` of a group, and a host's mapping under `hosts:`."""
    if not isinstance(node, yaml.MappingNode):
        return
    for gk, gv in node.value:
        if isinstance(gk, yaml.ScalarNode) and isinstance(gv, yaml.MappingNode):
            _group(gk.value, gv, rel, scan, extra, aliased)


def _group(name: str, node: yaml.MappingNode, rel: str, scan: Scan, extra: tuple[str, ...], aliased: set[int]
           ) -> None:
    for k, v in node.value:
        if not isinstance(k, yaml.ScalarNode) or not isinstance(v, yaml.MappingNode):
            continue
        if k.value == "vars":
            _add(scan, ("group", name), rel, yamlsafe.top_vars(v, rel, scan.problems, extra, aliased), extra)
        elif k.value == "hosts":
            for hk, hv in v.value:
                if isinstance(hk, yaml.ScalarNode) and isinstance(hv, yaml.MappingNode):
                    _add(scan, ("host", hk.value), rel, yamlsafe.top_vars(hv, rel, scan.problems, extra, aliased),
                         extra)
        elif k.value == "children":
            for ck, cv in v.value:
                if isinstance(ck, yaml.ScalarNode) and isinstance(cv, yaml.MappingNode):
                    _group(ck.value, cv, rel, scan, extra, aliased)


def unmatched(scan: Scan, hosts: list[str], groups: list[str]) -> list[str]:
    """host_vars/<name> naming no host, group_vars/<name> naming no group: Ansible ignores them without a word."""
    problems = []
    for (kind, name), where in sorted(scan.var_dirs.items()):
        known = hosts if kind == "host" else groups
        if name in known:
            continue
        hint = difflib.get_close_matches(name, known, n=1, cutoff=0.6)
        fix = f"rename it to {where.rsplit('/', 1)[0]}/{hint[0]}" if hint else "rename it or remove it"
        problems.append(f"{where}: {where.split('/', 1)[0]}/{name} names no {kind} of the inventory ({kind}s are "
                        f"{', '.join(sorted(known))}); its variables would be ignored: {fix}")
    return problems
