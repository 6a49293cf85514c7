"""The Ansible inventory of the test hosts (over SSH: access.py, connection.yml)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from pdstack.testing.testhost import access
from pdstack.testing.testhost.common import DEFAULT_PREFIX
from pdstack.testing.testhost.hosts import status


def inventory_for(names: list[str], group: str = "testhosts") -> dict[str, Any]:
    """An Ansible YAML inventory (as a dict) reaching `names` as the test inventories do (connection.yml)."""
    return {
        "all": {
            "children": {group: {"hosts": {n: {"ansible_host": n} for n in names}}},
            "vars": {**access.connection_vars(), "ansible_python_interpreter": "/usr/bin/python3"},
        }
    }


def inventory(prefix: str = DEFAULT_PREFIX, path: str | os.PathLike[str] | None = None) -> dict[str, Any]:
    """The inventory of `prefix`'s existing hosts; also written as YAML to `path` when given."""
    names = [row["name"] for row in status(prefix)]
    inv = inventory_for(names)
    if path is not None:
        write_inventory(inv, path)
    return inv


def write_inventory(inv: dict[str, Any], path: str | os.PathLike[str]) -> Path:
    import yaml

    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    header = "# Written by pdstack.testing.testhost.inventory(); regenerated on every call.\n"
    p.write_text(header + yaml.safe_dump(inv))
    return p
