"""The host-side artifact: pdstack/hostside (standard library only) as one zip application, pdstack-hostside.pyz.

Every role and unit that runs code on a host runs this one file with the host's python3 (`python3 -I
pdstack-hostside.pyz COMMAND ...`, the commands in pdstack/hostside/__main__.py); roles/hostside installs it once per
host. The preflight builds it on the controller (roles/preflight tasks/static.yml) into build/state/<inventory>/, and
`pdstack status` runs the same file through `ansible -m script`.

It is built here, in render/, because it is what the roles put on the hosts, made from sources on the controller
before any host changes, like the units and configs rendered from the plan. The bytes depend on the sources only:
entries sorted, each stored (no compression, so no zlib version in the result) with the zip epoch as its time and
mode 0644. The same code gives the same file, so ansible.builtin.copy reports a change exactly when the code changed.
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import zipfile
from pathlib import Path

from pdstack.hostside import atomic

ROOT = Path(__file__).resolve().parents[3]
FILENAME = "pdstack-hostside.pyz"
# The zip's own entry point: the dispatcher of pdstack/hostside/__main__.py.
MAIN = b"import sys\n\nfrom pdstack.hostside.__main__ import main\n\nsys.exit(main())\n"
_EPOCH = (1980, 1, 1, 0, 0, 0)


def sources(root: Path = ROOT) -> list[str]:
    """The files the artifact carries, relative to the repository root: the package root and all of hostside/."""
    return ["pdstack/__init__.py", *sorted(p.relative_to(root).as_posix()
                                           for p in (root / "pdstack" / "hostside").glob("*.py"))]


def build_bytes(root: Path = ROOT) -> bytes:
    entries = {name: (root / name).read_bytes() for name in sources(root)}
    entries["__main__.py"] = MAIN
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w", zipfile.ZIP_STORED) as z:
        for name in sorted(entries):
            info = zipfile.ZipInfo(name, date_time=_EPOCH)
            info.create_system = 3  # unix, so the mode below is read as one
            info.external_attr = 0o100644 << 16
            z.writestr(info, entries[name], compress_type=zipfile.ZIP_STORED)
    return buf.getvalue()


def build(dest: Path, root: Path = ROOT) -> str:
    """Write the artifact to `dest` (replaced atomically, and only when its bytes differ); its sha256."""
    data = build_bytes(root)
    if not dest.is_file() or dest.read_bytes() != data:
        atomic.write(dest, data)  # a reader (a copy task, a status run) sees the old file or the whole new one
    return hashlib.sha256(data).hexdigest()


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdstack.controller.render.hostside",
                                 description="build pdstack-hostside.pyz; prints {path, sha256} as JSON")
    ap.add_argument("--out", required=True, type=Path, help=f"where to write it (a file, e.g. .../{FILENAME})")
    a = ap.parse_args(argv)
    out = a.out.resolve()
    json.dump({"path": str(out), "sha256": build(out)}, sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
