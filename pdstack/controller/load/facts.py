"""Host facts as recorded: a JSON file (one host's facts, or {host: facts}) or a directory of <host>.json files."""

from __future__ import annotations

import json
from pathlib import Path

from pdstack.errors import FactsError


def load_facts(path: str | Path | None, hosts: list[str]) -> dict[str, dict]:
    """Facts per host from a recorded JSON file (one host's facts, or {"host": facts}) or a directory of
    <host>.json files. None -> no facts."""
    if path is None:
        return {}
    p = Path(path)
    if p.is_dir():
        return {f.stem: _read_facts(f) for f in sorted(p.glob("*.json")) if f.stem in hosts}
    if not p.exists():
        raise FactsError(f"facts file {p} does not exist; record one with `pdstack facts > FILE` on the host")
    data = _read_facts(p)
    if "numa_nodes" in data:  # one host's facts: apply to every host (a recorded single-host topology)
        return dict.fromkeys(hosts, data)
    return {h: data[h] for h in hosts if h in data}


def _read_facts(p: Path) -> dict:
    try:
        data = json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as e:
        raise FactsError(f"facts file {p}: {e}") from e
    if not isinstance(data, dict):
        raise FactsError(f"facts file {p}: expected a JSON object")
    return data
