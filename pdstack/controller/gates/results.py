"""Result files of the smoke tools (recall, bench, smoke): JSON for machines, one format everywhere."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any


def write_json(path: str | os.PathLike, data: Any) -> Path:
    """Write `data` as indented JSON (creating the directory); returns the path."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(json.dumps(data, indent=1) + "\n")
    return p
