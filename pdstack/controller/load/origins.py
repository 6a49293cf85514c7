"""Where each value Ansible resolved came from, read from Ansible itself: one reader.

ansible-core 2.19 tags every value its loader reads with an Origin (file, line, column: its data tagging,
ansible/_internal/_datatag/_tags.py). pdstack's values are the ones Ansible's own InventoryManager and
VariableManager resolve (load/inventory.py); this module reads, from the same objects and without a parser of its
own:

- locations(): the file and line of every value and nested value a host gets, for messages;
- definitions(): every place a variable is defined for a host, level by level in Ansible's precedence (group all's
  inventory vars, the host's groups' inventory vars, group_vars/all, group_vars/<group>, the host's own inventory
  vars, host_vars/<host>), from the inventory objects and the vars files Ansible's loader read, so that a setting
  shadowed at a higher level is reported with both origins (shadowing());
- Recorder: every file Ansible's loader read while resolving, so that the strict lint (load/files.py,
  load/yamlsafe.py, which reads no value pdstack uses) is proven to have covered each of them (unlinted()).

Nothing here templates or runs anything: a tagged value is only looked at.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

Entity = tuple[str, str]  # ("group" | "host", name)


def origin(value: Any) -> tuple[str, int] | None:
    """(path, line) Ansible's loader tagged `value` with; None for a value it did not read from a file."""
    from ansible._internal._datatag._tags import Origin

    tag = Origin.get_tag(value)
    if tag is None or not tag.path or tag.line_num is None:
        return None
    return tag.path, tag.line_num


@dataclass
class Recorder:
    """Wraps a DataLoader's load_from_file: every file Ansible reads (the yaml inventory plugin's inventory files,
    the host_group_vars plugin's vars files) with what it read, by real path."""

    files: dict[str, Any] = field(default_factory=dict)  # by the path Ansible opened (its Origin paths)

    def attach(self, loader) -> None:
        read = loader.load_from_file

        def load_from_file(path, *args, **kwargs):
            data = read(path, *args, **kwargs)
            self.files.setdefault(os.path.abspath(path), data)
            return data

        loader.load_from_file = load_from_file


class Places:
    """Renders an Origin path as the messages do: relative to the inventory directory, with the key's line."""

    def __init__(self, base: Path, recorder: Recorder):
        self.base = str(base.resolve())
        self.recorder = recorder

    def rel(self, path: str) -> str:
        """`path` relative to the inventory directory, as Ansible reached it (host_group_vars starts from the
        directory's real path and follows the links below it as they are)."""
        path = os.path.abspath(path)
        return os.path.relpath(path, self.base) if path.startswith(self.base + os.sep) else path

    def where(self, value: Any, key: Any = None) -> str | None:
        """"file:line" of a variable: its key's line when Ansible tagged the key, else its value's."""
        o = origin(key) if key is not None else None
        o = o or origin(value)
        return f"{self.rel(o[0])}:{o[1]}" if o else None

    def entity_files(self, kind: str, name: str) -> list[tuple[str, dict]]:
        """(file, its top-level mapping) of every vars file Ansible read for entity (kind, name), in its order."""
        sub = "group_vars" if kind == "group" else "host_vars"
        out = []
        for path, data in self.recorder.files.items():
            parts = Path(self.rel(path)).parts
            if len(parts) < 2 or parts[0] != sub or not isinstance(data, dict):
                continue
            if parts[1] == name or (len(parts) == 2 and Path(parts[1]).stem == name and Path(parts[1]).suffix):
                out.append((path, data))
        return sorted(out)


def locations(value: Any, path: str, places: Places, out: dict[str, str], key: Any = None) -> None:
    """{path: "file:line"} for `value` and everything nested in it, as Ansible tagged them."""
    where = places.where(value, key)
    if where:
        out[path] = where
    if isinstance(value, dict):
        for k, v in value.items():
            locations(v, f"{path}.{k}", places, out, k)
    elif isinstance(value, list | tuple):
        for i, item in enumerate(value):
            locations(item, f"{path}[{i}]", places, out)


def definitions(inv, host, places: Places, wanted) -> dict[str, list[tuple[Entity, str]]]:
    """{variable: [(entity, "file:line"), ...]}: every place `host` gets each `wanted(name)` variable from, lowest
    precedence first (Ansible's default VARIABLE_PRECEDENCE, which load/sources.py pins; ansible/vars/manager.py
    get_vars). Within one entity, the last of its files wins, as host_group_vars combines them."""
    from ansible.inventory.helpers import sort_groups

    groups = [inv.groups["all"], *sort_groups([g for g in host.get_groups() if g.name != "all"])]
    levels: list[tuple[Entity, dict, str | None]] = []
    levels += [(("group", g.name), g.get_vars(), None) for g in groups[:1]]  # all_inventory
    levels += [(("group", g.name), g.get_vars(), None) for g in groups[1:]]  # groups_inventory
    for g in groups:  # all_plugins_inventory, groups_plugins_inventory
        levels += [(("group", g.name), data, path) for path, data in places.entity_files("group", g.name)]
    levels.append((("host", host.name), host.get_vars(), None))
    levels += [(("host", host.name), data, path) for path, data in places.entity_files("host", host.name)]
    out: dict[str, list[tuple[Entity, str]]] = {}
    for entity, data, path in levels:
        for k, v in data.items():
            if wanted(k):
                where = places.where(v, k) or (places.rel(path) if path else f"{entity[0]} {entity[1]}")
                out.setdefault(str(k), []).append((entity, where))
    return out


def shadowing(defs: dict[str, list[tuple[Entity, str]]], host: str, group_wide: set[str], one_place: set[str]
              ) -> list[str]:
    """A setting `host` gets from more than one precedence level, where Ansible silently uses the highest: a
    deployment-wide setting (`group_wide`) lives in group_vars/all only; one of `one_place` (a host's servers, its
    address) is set in one place."""
    out = []
    for var, found in sorted(defs.items()):
        if var in group_wide:
            in_all = [where for entity, where in found if entity == ("group", "all")]
            shadows = f"it shadows {in_all[-1]} for host {host}" if in_all else f"host {host} would take it from here"
            for (kind, name), where in found:
                if (kind, name) != ("group", "all"):
                    out.append(f"{var} ({where}): set for {kind} {name}, but it is a deployment-wide setting that "
                               f"lives in group_vars/all only (Ansible would let this one win: {shadows}); move it "
                               "to group_vars/all and remove it here")
        elif var in one_place:
            per_entity: dict[Entity, str] = {}
            for entity, where in found:
                per_entity[entity] = where  # within an entity the later file wins (the lint refuses two files)
            if len(per_entity) > 1:
                wheres = list(per_entity.values())
                out.append(f"{var}: host {host} gets it from {len(wheres)} places ({', '.join(wheres)}); Ansible "
                           f"would silently use the last ({wheres[-1]}): keep it in one place")
    return out


def unlinted(recorder: Recorder, linted: set[str], places: Places) -> list[str]:
    """Files Ansible's loader read that the strict lint did not: the lint must cover every source Ansible reads."""
    return [f"{places.rel(p)}: Ansible read it but pdstack's strict reading of the inventory did not; pdstack cannot "
            "vouch for it: move it out of the inventory (or report this as a pdstack bug)"
            for p in sorted(recorder.files) if os.path.realpath(p) not in linted]
