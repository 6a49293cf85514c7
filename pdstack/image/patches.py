"""Apply a quilt-style patch series (kernels/patches/<pkg-version>/series) to an installed package.

A series directory holds a ``series`` file naming one ``*.patch`` per line, in order (blank lines and
``#`` comments are ignored). Each patch is a unified diff, ``-p1`` relative to site-packages
(``a/sglang/srt/...``). :func:`apply_series` first applies the whole series to a scratch copy of the
files it touches, so a patch that does not fit fails before site-packages changes at all, then
applies it for real with GNU ``patch -p1 --forward --batch``. :func:`series_hash` names the series'
exact content, for image labels.

With ``record=True`` (``--record``; what the prod image does) every file the series touches must first match its
installed distribution's ``RECORD`` hash, i.e. be the wheel's own bytes (or ours from an earlier run), and after
applying, those ``RECORD`` lines are rewritten with the patched files' sha256 and size, so ``pip`` and an SBOM see
exactly what is on disk.
"""

from __future__ import annotations

import base64
import csv
import hashlib
import io
import re
import shutil
import subprocess
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pdstack.errors import PdstackError

SERIES_FILE = "series"
_TARGET_RE = re.compile(r"^\+\+\+ (?:b/)?(\S+)", re.MULTILINE)
_SOURCE_RE = re.compile(r"^--- (?:a/)?(\S+)", re.MULTILINE)
_FILE_RE = re.compile(r"^(?:patching|checking) file '?([^'\n]+)'?$")
_HUNK_FAILED_RE = re.compile(r"^Hunk #(\d+) FAILED at (\d+)")


class PatchError(PdstackError):
    """A patch of a series does not apply; the message names the patch, the file and the hunk."""

    exit_code = 4


@dataclass(frozen=True)
class PatchResult:
    name: str
    status: str  # "applied", "would apply", or "already applied"


def read_series(series_dir: str | Path) -> list[Path]:
    """The patches of ``series_dir/series``, in order. Raises PatchError if the file or a patch is missing."""
    series_dir = Path(series_dir)
    series = series_dir / SERIES_FILE
    if not series.is_file():
        raise PatchError(f"{series} not found: a series directory needs a '{SERIES_FILE}' file listing its patches")
    patches = []
    for lineno, line in enumerate(series.read_text().splitlines(), 1):
        name = line.split("#", 1)[0].strip()
        if not name:
            continue
        path = series_dir / name
        if not path.is_file():
            raise PatchError(f"{series}:{lineno} names {name}, which is not in {series_dir}")
        patches.append(path)
    if not patches:
        raise PatchError(f"{series} lists no patches")
    return patches


def series_hash(series_dir: str | Path) -> str:
    """sha256 (hex) over the series file, then each patch's name and bytes, in series order."""
    series_dir = Path(series_dir)
    h = hashlib.sha256()
    h.update((series_dir / SERIES_FILE).read_bytes())
    for path in read_series(series_dir):
        h.update(b"\0" + path.name.encode() + b"\0")
        h.update(path.read_bytes())
    return h.hexdigest()


def _patch_binary() -> str:
    exe = shutil.which("patch")
    if exe is None:
        raise PatchError("GNU patch not found on PATH: install it (apt-get install -y patch)")
    return exe


def _touched_files(patch: Path) -> list[str]:
    """Paths (relative to site-packages) a -p1 patch reads or writes; /dev/null excluded."""
    text = patch.read_text(errors="replace")
    names = set(_TARGET_RE.findall(text)) | set(_SOURCE_RE.findall(text))
    return sorted(n for n in names if n != "/dev/null")


def _failure_message(patch: Path, root: Path, output: str) -> str:
    """'<patch>: <file> hunk #N FAILED at L' for each failed hunk, or patch's own words."""
    current = None
    failed = []
    for line in output.splitlines():
        if m := _FILE_RE.match(line.strip()):
            current = m.group(1)
        elif m := _HUNK_FAILED_RE.match(line.strip()):
            failed.append(f"{current or '?'}: hunk #{m.group(1)} FAILED at line {m.group(2)}")
    detail = "; ".join(failed) if failed else " ".join(output.split())[:500]
    return f"patch {patch.name} does not apply to {root}: {detail}"


def _run_patch(patch: Path, root: Path, *extra: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [_patch_binary(), "-p1", "--forward", "--batch", "--no-backup-if-mismatch", "-r", "-", *extra, "-d", str(root),
         "-i", str(patch.resolve())],
        capture_output=True,
        text=True,
        check=False,
    )  # fmt: skip


def _already_applied(patch: Path, root: Path) -> bool:
    """True if the patch reverses cleanly, i.e. it is already in the tree."""
    res = subprocess.run(
        [_patch_binary(), "-p1", "-R", "--dry-run", "--batch", "-d", str(root), "-i", str(patch.resolve())],
        capture_output=True,
        text=True,
        check=False,
    )
    return res.returncode == 0


def _apply_all(patches: list[Path], root: Path) -> list[PatchResult]:
    results = []
    for patch in patches:
        res = _run_patch(patch, root)
        if res.returncode == 0:
            results.append(PatchResult(patch.name, "applied"))
        elif _already_applied(patch, root):
            results.append(PatchResult(patch.name, "already applied"))
        else:
            raise PatchError(_failure_message(patch, root, res.stdout + res.stderr))
    return results


def _record_digest(data: bytes) -> str:
    return "sha256=" + base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def _records(site_packages: Path) -> dict[str, tuple[Path, str]]:
    """{path relative to site-packages: (its RECORD file, its recorded hash)} over every *.dist-info/RECORD."""
    out = {}
    for record in sorted(site_packages.glob("*.dist-info/RECORD")):
        with record.open(newline="") as f:
            for row in csv.reader(f):
                if len(row) >= 2 and row[1]:
                    out[row[0]] = (record, row[1])
    return out


def check_records(site_packages: Path, files: list[str]) -> None:
    """Every one of `files` that exists must match its RECORD hash; a PatchError names the first that does not."""
    records = _records(site_packages)
    for rel in files:
        path = site_packages / rel
        if not path.is_file():
            continue
        if rel not in records:
            raise PatchError(f"{rel} is in no *.dist-info/RECORD under {site_packages}: cannot check it is pristine")
        record, want = records[rel]
        have = _record_digest(path.read_bytes())
        if have != want:
            raise PatchError(f"{rel} differs from {record.parent.name}/RECORD ({have} != {want}): not the installed "
                             "wheel's file; reinstall the distribution before patching")


def update_records(site_packages: Path, files: list[str]) -> dict[str, str]:
    """Rewrite the RECORD lines of `files` with their current sha256 and size; {file: new hash}."""
    records = _records(site_packages)
    by_record: dict[Path, list[str]] = {}
    for rel in files:
        if rel in records and (site_packages / rel).is_file():
            by_record.setdefault(records[rel][0], []).append(rel)
    new = {}
    for record, rels in by_record.items():
        with record.open(newline="") as f:
            rows = list(csv.reader(f))
        for row in rows:
            if row and row[0] in rels:
                data = (site_packages / row[0]).read_bytes()
                row[1:3] = [_record_digest(data), str(len(data))]
                new[row[0]] = row[1]
        buf = io.StringIO()
        csv.writer(buf, lineterminator="\n").writerows(rows)
        record.write_text(buf.getvalue())
    return new


def apply_series(series_dir: str | Path, site_packages: str | Path, dry_run: bool = False,
                 record: bool = False) -> list[PatchResult]:
    """Apply every patch of ``series_dir`` to ``site_packages`` in order, all or none.

    The series first runs on a scratch copy of the touched files; a patch that fails there raises
    PatchError (a PdstackError) naming the patch, file and hunk, and nothing in site_packages changes.
    A patch that is already applied (reverses cleanly) is reported, not re-applied. ``dry_run`` stops
    after the scratch run. ``record``: check the touched files against RECORD first, update RECORD after.
    """
    site_packages = Path(site_packages)
    if not site_packages.is_dir():
        raise PatchError(f"{site_packages} is not a directory (expected a site-packages holding the package)")
    patches = read_series(series_dir)
    touched = sorted({rel for patch in patches for rel in _touched_files(patch)})
    if record:
        check_records(site_packages, touched)
    with tempfile.TemporaryDirectory(prefix="pdstack-patches-") as tmp:
        scratch = Path(tmp)
        for patch in patches:
            for rel in _touched_files(patch):
                src = site_packages / rel
                if src.is_file() and not (scratch / rel).exists():
                    (scratch / rel).parent.mkdir(parents=True, exist_ok=True)
                    shutil.copy2(src, scratch / rel)
        try:
            checked = _apply_all(patches, scratch)
        except PatchError as exc:
            raise PatchError(str(exc).replace(str(scratch), str(site_packages))) from None
    if dry_run:
        return [PatchResult(r.name, "would apply" if r.status == "applied" else r.status) for r in checked]
    results = _apply_all(patches, site_packages)
    if record:
        update_records(site_packages, touched)
    return results


def main(argv: list[str] | None = None) -> int:
    """``python -m pdstack.image.patches SERIES_DIR [SITE_PACKAGES] [--dry-run]``; one line per patch + the hash."""
    import argparse
    import sysconfig

    ap = argparse.ArgumentParser(prog="python -m pdstack.image.patches", description=main.__doc__)
    ap.add_argument("series_dir", type=Path)
    ap.add_argument("site_packages", type=Path, nargs="?", default=Path(sysconfig.get_paths()["purelib"]))
    ap.add_argument("--dry-run", action="store_true")
    ap.add_argument("--record", action="store_true",
                    help="check touched files against their RECORD hashes first; record the patched hashes after")
    args = ap.parse_args(argv)
    try:
        results = apply_series(args.series_dir, args.site_packages, dry_run=args.dry_run, record=args.record)
    except PdstackError as exc:
        print(f"error: {exc}")
        return exc.exit_code
    for r in results:
        print(f"{r.status:>15}  {r.name}")
    if args.record and not args.dry_run:
        records = _records(args.site_packages)
        for rel in sorted({rel for p in read_series(args.series_dir) for rel in _touched_files(p)}):
            if rel in records:
                print(f"{'recorded':>15}  {rel} {records[rel][1]}")
    print(f"series sha256 {series_hash(args.series_dir)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
