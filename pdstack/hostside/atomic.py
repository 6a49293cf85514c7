"""One atomic file write for every host-side writer and the controller's artifact build.

A reader (the watchdog reading a hold, node_exporter's textfile collector, the model record, a copy task) sees the
old file or the whole new one, never a part: the bytes go to a temporary file beside the target, which then
replaces it (os.replace is atomic within one file system). Mode 0644.
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path


def write(path: str | os.PathLike[str], data: str | bytes, durable: bool = False) -> None:
    """Write `data` to `path` atomically, creating its directory. `durable`: fsync the bytes before the rename, so a
    power loss leaves the old file or the whole new one (the model fetcher's record and status)."""
    p = Path(path)
    p.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=p.parent, prefix=f".{p.name}.")
    try:
        with os.fdopen(fd, "wb" if isinstance(data, bytes) else "w") as f:
            f.write(data)
            if durable:
                f.flush()
                os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        os.replace(tmp, p)
    except BaseException:
        Path(tmp).unlink(missing_ok=True)
        raise
