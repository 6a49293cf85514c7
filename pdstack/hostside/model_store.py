"""The model fetcher's bookkeeping (pdstack/hostside/model_fetch.py runs it; stdlib only): the lock and the
verification record, the run's counters and progress reports, placing a verified file, the staging directory."""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import re
import shutil
import sys
import threading
import time
from dataclasses import dataclass

from pdstack.hostside import atomic

STAGING = ".pdstack-staging"
RECORD = ".pdstack-verified.json"
CHUNK = 1 << 20
FLUSH_S = 1.0  # on a slow link the bytes still reach the .part this often, so a killed run resumes from them
TIMEOUT_S = 60
RETRIES = 3  # transient failures (reset, timeout, 5xx) in a row before a file fails
HEX64 = re.compile(r"[0-9a-f]{64}")
USER_AGENT = "pdstack-model-fetch/1"
BAD, SOURCE, SPACE = 2, 3, 4  # exit codes (1: unexpected)
FIX_LOCK = "the source does not hold the locked model: fix the lock (pdstack model lock) or the source"
FIX_SOURCE = "check --from / pdstack_model.source"
RSYNC_TRANSIENT = {10, 12, 30, 35}  # socket I/O, protocol stream, timeouts: worth another try


class Failed(Exception):
    """The run cannot go on; the message names the file and what to fix, `code` is the exit code."""

    def __init__(self, msg: str, code: int = 1):
        super().__init__(msg)
        self.code = code


class Transient(Exception):
    """One attempt failed in a way another attempt may not (connection reset, timeout, 5xx)."""


@dataclass(frozen=True)
class Entry:
    path: str
    size: int
    sha256: str


def _safe_path(path: str) -> bool:
    parts = path.split("/")
    return ("\0" not in path and "\\" not in path and all(p not in ("", ".", "..") for p in parts)
            and parts[0] != STAGING and path != RECORD)


def load_lock(lock: str) -> tuple[str, list[Entry]]:
    """The lock's sha256 (of its bytes) and its entries; Failed (exit 2) naming the first entry that is wrong."""
    try:
        with open(lock, "rb") as f:
            raw = f.read()
        doc = json.loads(raw)
    except (OSError, ValueError) as e:
        raise Failed(f"the lock {lock}: {e}", BAD) from None
    files = doc.get("files") if isinstance(doc, dict) else None
    if not isinstance(files, list):
        raise Failed(f"the lock {lock} has no \"files\" list", BAD)
    entries: list[Entry] = []
    for i, f in enumerate(files):
        where = f"the lock {lock}: files[{i}]"
        if not isinstance(f, dict):
            raise Failed(f"{where} is not an object", BAD)
        path, size, digest = f.get("path"), f.get("size"), f.get("sha256")
        if not isinstance(path, str) or not _safe_path(path):
            raise Failed(f"{where} path {path!r}: a path must be relative and POSIX, without '..', '.', a leading "
                         f"'/', empty parts or {STAGING}/{RECORD}", BAD)
        if isinstance(size, bool) or not isinstance(size, int) or size < 0:
            raise Failed(f"{where} ({path}) size {size!r}: must be a whole number of bytes", BAD)
        if not isinstance(digest, str) or not HEX64.fullmatch(digest.lower()):
            raise Failed(f"{where} ({path}) sha256 {digest!r}: must be 64 hex digits", BAD)
        entries.append(Entry(path, size, digest.lower()))
    paths = [e.path for e in entries]
    if len(set(paths)) != len(paths):
        raise Failed(f"the lock {lock} names {sorted(p for p in set(paths) if paths.count(p) > 1)[0]} twice", BAD)
    for p in paths:  # a/b and a/b/c cannot both be files
        parts = p.split("/")
        clash = next(("/".join(parts[:j]) for j in range(1, len(parts)) if "/".join(parts[:j]) in set(paths)), None)
        if clash:
            raise Failed(f"the lock {lock} has {clash} both as a file and as the directory of {p}", BAD)
    return hashlib.sha256(raw).hexdigest(), entries


def load_record(dest: str) -> dict:
    try:
        with open(os.path.join(dest, RECORD)) as f:
            doc = json.load(f)
    except (OSError, ValueError):
        return {}  # none yet, or unreadable: every file is hashed (quick) and the record written again
    return doc if isinstance(doc, dict) and isinstance(doc.get("files"), dict) else {}


def _fsync_dir(path: str) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _gb(n: float) -> str:
    return f"{n / 1e9:.2f} GB"


class Run:
    """One fetch's counters (the summary, the progress reports), shared by the worker threads."""

    def __init__(self, dest: str, check: bool, secret: str | None):
        self.dest, self.check, self.secret = dest, check, secret
        self.staging = os.path.join(dest, STAGING)
        self.mu = threading.Lock()
        self.c = dict.fromkeys(("hashed_bytes", "bytes_fetched", "bytes_resumed", "bytes_restarted"), 0)
        self.record: dict[str, dict] = {}  # the new record's files
        self.placed: list[str] = []
        self.begin("verify", 0, {}, 0)

    def begin(self, phase: str, total: int, have: dict[str, int], files: int) -> None:
        with self.mu:
            self.phase, self.t0, self.total = phase, time.monotonic(), total
            self.files_total, self.files_done = files, 0
            self.have = dict(have)  # per file: what this phase has of it (hashed, or in its .part)
            self.moved = 0  # bytes read (verify) or from the source (fetch) in this phase: the rate
            self.watch: dict[str, str] = {}  # rsync writes the .part itself: the reporter stats it

    def count(self, counter: str, n: int, path: str | None = None) -> None:
        with self.mu:
            self.c[counter] += n
            if path is not None:
                self.have[path] = self.have.get(path, 0) + n
                self.moved += max(n, 0)

    def set_have(self, path: str, n: int, done: bool = False) -> None:
        with self.mu:
            self.have[path] = n
            self.files_done += done

    def snapshot(self) -> dict:
        with self.mu:
            for path, part in self.watch.items():
                with contextlib.suppress(OSError):
                    size = os.stat(part).st_size
                    self.moved += max(0, size - self.have.get(path, 0))
                    self.have[path] = size
            done, moved, t0 = sum(self.have.values()), self.moved, self.t0
            snap = {"phase": self.phase, "bytes_done": done, "bytes_total": self.total,
                    "files_done": self.files_done, "files_total": self.files_total}
        rate = moved / max(time.monotonic() - t0, 1e-3)
        snap["rate_bps"] = round(rate)
        snap["eta_s"] = round(max(snap["bytes_total"] - done, 0) / rate) if rate > 0 else None
        return snap

    def redact(self, text: str) -> str:
        return text.replace(self.secret, "***") if self.secret else text


def _line(s: dict) -> str:
    pct = 100 * s["bytes_done"] / s["bytes_total"] if s["bytes_total"] else 100.0
    eta = f"ETA {s['eta_s']} s" if s["eta_s"] is not None else "ETA unknown"
    what, verb = ("verify", "hashed ") if s["phase"] == "verify" else ("fetch", "")
    return (f"model {what}: {_gb(s['bytes_done'])} of {_gb(s['bytes_total'])} {verb}({pct:.0f} %), "
            f"{s['rate_bps'] / 1e6:.1f} MB/s, {eta}; {s['files_done']} of {s['files_total']} files done")


def write_status(run: Run, path: str | None, state: str, snap: dict, error: str | None = None) -> None:
    if path:
        doc = {"state": state, **snap, "updated": round(time.time(), 3), **({"error": error} if error else {})}
        try:
            atomic.write(path, run.redact(json.dumps(doc)) + "\n", durable=True)
        except OSError as err:  # a report that cannot be written stops no fetch
            print(f"model fetch: cannot write --status {path}: {err}", file=sys.stderr)


def report(run: Run, every: float, status: str | None, stop: threading.Event) -> None:
    while not stop.wait(every):
        snap = run.snapshot()
        print(_line(snap), file=sys.stderr, flush=True)
        write_status(run, status, "running", snap)


def part_path(staging: str, e: Entry) -> str:
    return os.path.join(staging, *e.path.split("/")) + ".part"


def kept_bytes(part: str, size: int, drop: bool = False) -> int:
    """Bytes an earlier run left in the .part; one longer than the file is no use (`drop`: removed)."""
    try:
        k = os.stat(part).st_size
    except FileNotFoundError:
        return 0
    if k > size and drop:
        os.unlink(part)
    return k if k <= size else 0


def place(run: Run, e: Entry, part: str) -> None:
    os.chmod(part, 0o444)  # the model is read-only: a stray write shows up as an error, not as a corrupt shard
    target = os.path.join(run.dest, *e.path.split("/"))
    parent = os.path.dirname(target)
    os.makedirs(parent, 0o755, exist_ok=True)
    os.replace(part, target)  # the .part was fsynced; a reader sees the old file or the whole new one
    _fsync_dir(parent)
    st = os.stat(target)
    with run.mu:
        run.record[e.path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": e.sha256}
        run.placed.append(e.path)
    run.set_have(e.path, e.size, done=True)


def hash_file(run: Run, path: str, key: str) -> tuple[str, os.stat_result]:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        st = os.fstat(f.fileno())
        while chunk := f.read(CHUNK):
            h.update(chunk)
            run.count("hashed_bytes", len(chunk), key)
    run.set_have(key, st.st_size, done=True)
    return h.hexdigest(), st


def extra_files(dest: str, lock_paths: set[str]) -> list[str]:
    found = []
    for dirpath, dirs, names in os.walk(dest):
        rel = os.path.relpath(dirpath, dest).replace(os.sep, "/")
        if rel == ".":
            dirs[:] = [d for d in dirs if d != STAGING]
            names = [n for n in names if n != RECORD]
        found += [p for p in (n if rel == "." else f"{rel}/{n}" for n in names) if p not in lock_paths]
    return sorted(found)


def check_space(dest: str, need: int) -> None:
    where = os.path.abspath(dest)
    while not os.path.exists(where):
        where = os.path.dirname(where)
    free = shutil.disk_usage(where).free
    if need > free:
        raise Failed(f"not enough space for the model in {dest}: the fetch needs {_gb(need)} ({need} bytes), "
                     f"{where} has {_gb(free)} ({free} bytes) free; free space there or fetch elsewhere (--dest)",
                     SPACE)


def lock_dest(dest: str) -> int:
    """An exclusive flock on the dest directory for the process's life: two fetches would append to one .part."""
    fd = os.open(dest, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        os.close(fd)
        raise Failed(f"another model fetch is running into {dest}; wait for it to end", 1) from None
    return fd


def clean_staging(staging: str, keep: set[str]) -> None:
    """Remove the .part files no later run resumes (all but those of `keep`) and the empty directories."""
    for dirpath, _dirs, names in os.walk(staging, topdown=False):
        for n in names:
            rel = os.path.relpath(os.path.join(dirpath, n), staging).replace(os.sep, "/")
            if not (rel.endswith(".part") and rel[:-5] in keep):
                os.unlink(os.path.join(dirpath, n))
        with contextlib.suppress(OSError):
            os.rmdir(dirpath)
