"""Fetch the model directory a lock file describes, verify every file, keep a verification record (stdlib only).

Runs on the target host with the host's own python3 and nothing else: the model phase runs it as the host-side
artifact's `model-fetch` command (`python3 pdstack-hostside.pyz model-fetch fetch ...`), with its two siblings
(model_store.py: the lock, the record, the counters; model_source.py: http, path, rsync) in the same zip. The lock
(`pdstack model lock`) is the model: {"model": NAME, "revision": COMMIT (optional), "files": [{"path":
"config.json", "size": 1234, "sha256": "<64 hex>"}, ...]}, each path relative and POSIX (no '..', no leading '/', no
empty part).

Subcommands:

  fetch  --lock LOCK --dest DIR --source http|path|rsync --from URL_OR_PATH [--jobs N] [--verify quick|full]
         [--progress-every S] [--status FILE] [--only GLOB ...] [--check] [--auth-env VAR]
         make DIR hold exactly the lock's files (files not in the lock are left alone and listed as "extra"):
         http fetches BASE/<quoted path> (with --auth-env VAR: `Authorization: Bearer $VAR`, dropped on a redirect
         to another host, as huggingface_hub does), path copies from a local directory, rsync runs
         `rsync --append-verify` from HOST:/DIR, rsync://HOST/MODULE/DIR or a local directory. --only handles the
         lock entries matching a glob (fnmatch on the path); --check changes nothing and says what a run would do.
  (the lock itself is made on the controller: `pdstack model lock`, pdstack/controller/load/modellock.py)

How fetch works: each file is downloaded into DIR/.pdstack-staging/<path>.part (the same filesystem, so the final
os.replace is atomic), flushed as it comes so a killed run resumes from those bytes (an HTTP Range request, a seek,
or rsync's append), checked against the lock's size and sha256, made read-only (0444) and moved into place.
DIR/.pdstack-verified.json records {"lock_sha256", "files": {path: {"size", "mtime_ns", "sha256"}}} for the files
verified: --verify quick (default) accepts a file whose size and mtime_ns match its record without reading it, and
hashes the others of the right size; --verify full hashes every file. Every --progress-every seconds (default 10) a
line on stderr and, with --status, the same facts as JSON ({"state": "running"|"done"|"failed", "phase",
"bytes_done", "bytes_total", "rate_bps", "eta_s", "files_done", "files_total"}). At the end one JSON object on stdout,
also on failure: {"ok", "changed", "check", "fetched", "repaired", "verified", "hashed_bytes", "bytes_fetched",
"bytes_resumed", "bytes_restarted", "missing_bytes", "seconds", "extra", "error" (on failure)}.

Exit codes: 0 done; 1 unexpected; 2 the lock, or a file the source served, is wrong (the file named), or a usage
error; 3 the source failed (HTTP error, unreachable, file missing: the file and the URL named; resets, timeouts and
5xx/408/429 are retried, resuming, 3 times in a row); 4 not enough space (checked before any byte moves). The bearer
token never appears in any output.
"hashed_bytes" counts what was read back from disk to hash (files in place, bytes kept in .part files, what rsync
wrote); what comes over HTTP or from a path source is hashed on the way in.
"""

from __future__ import annotations

import argparse
import fnmatch
import json
import os
import stat
import sys
import threading
import time
import traceback
from concurrent.futures import ThreadPoolExecutor

from pdstack.hostside import atomic
from pdstack.hostside.model_source import Source, fetch_file
from pdstack.hostside.model_store import (
    RECORD,
    Entry,
    Failed,
    Run,
    check_space,
    clean_staging,
    extra_files,
    hash_file,
    kept_bytes,
    load_lock,
    load_record,
    lock_dest,
    part_path,
    report,
    write_status,
)


def classify(run: Run, entries: list[Entry], old: dict, full: bool,
             jobs: int) -> tuple[list[tuple[Entry, os.stat_result]], list[Entry], list[Entry]]:
    """(accepted [(entry, stat)], missing, wrong): which lock files the dest holds already and which to fetch."""
    accepted, to_hash, missing, wrong = [], [], [], []
    for e in entries:
        target = os.path.join(run.dest, *e.path.split("/"))
        try:
            st = os.stat(target)
        except FileNotFoundError:
            missing.append(e)
            continue
        if not stat.S_ISREG(st.st_mode):
            raise Failed(f"{target} is not a regular file, the lock says {e.path} is one: move it away", 1)
        rec = old.get(e.path) if isinstance(old.get(e.path), dict) else {}
        if (not full and st.st_size == e.size == rec.get("size") and st.st_mtime_ns == rec.get("mtime_ns")
                and rec.get("sha256") == e.sha256):
            accepted.append((e, st))  # quick: as the record saw it, so not read again
        elif st.st_size == e.size:
            to_hash.append(e)
        else:
            wrong.append(e)
    run.begin("verify", sum(e.size for e in to_hash), {}, len(to_hash))
    with ThreadPoolExecutor(jobs) as pool:
        hashed = list(pool.map(lambda e: hash_file(run, os.path.join(run.dest, *e.path.split("/")), e.path),
                               to_hash))
    for e, (digest, st) in zip(to_hash, hashed, strict=True):
        if digest == e.sha256:
            accepted.append((e, st))
        else:
            wrong.append(e)
    return accepted, missing, wrong


def _fetch_all(run: Run, src: Source, todo: list[Entry], jobs: int) -> list[Failed]:
    """Every file gets its try (one that fails stops no other: a re-run has less to do); the failures, in order."""
    with ThreadPoolExecutor(jobs) as pool:
        futures = [pool.submit(fetch_file, run, src, e) for e in todo]
    failures = []
    for fut in futures:
        err = fut.exception()
        if isinstance(err, Failed):
            failures.append(err)
        elif err is not None:
            failures.append(Failed(f"{type(err).__name__}: {err}", 1))
    return failures


def _fetch(a: argparse.Namespace, run: Run, out: dict) -> None:
    lock_sha, every = load_lock(a.lock)
    src = Source(a.source, a.origin, run.secret)
    entries = [e for e in every if not a.only or any(fnmatch.fnmatchcase(e.path, g) for g in a.only)]
    lock_paths, handled = {e.path for e in every}, {e.path for e in entries}
    if not a.check:
        os.makedirs(a.dest, 0o755, exist_ok=True)
        lock_dest(a.dest)
    old = load_record(a.dest)
    old_files = old.get("files", {})
    run.record = {p: v for p, v in old_files.items() if p in lock_paths and p not in handled}
    accepted, missing, wrong = classify(run, entries, old_files, a.verify == "full", a.jobs)
    chmods = 0
    for e, st in accepted:
        run.record[e.path] = {"size": st.st_size, "mtime_ns": st.st_mtime_ns, "sha256": e.sha256}
        if stat.S_IMODE(st.st_mode) != 0o444:  # chmod keeps the mtime: the record stays true
            chmods += 1
            if not a.check:
                os.chmod(os.path.join(a.dest, *e.path.split("/")), 0o444)
    todo = sorted(missing + wrong, key=lambda e: e.path)
    kept = {e.path: kept_bytes(part_path(run.staging, e), e.size) for e in todo}
    out.update(verified=len(accepted), fetched=sorted(e.path for e in missing),
               repaired=sorted(e.path for e in wrong), missing_bytes=sum(e.size - kept[e.path] for e in todo),
               extra=extra_files(a.dest, lock_paths))
    check_space(a.dest, out["missing_bytes"])
    failures: list[Failed] = []
    if todo and not a.check:
        os.makedirs(run.staging, 0o755, exist_ok=True)
        run.begin("fetch", sum(e.size for e in todo), kept, len(todo))
        failures = _fetch_all(run, src, todo, a.jobs)
        placed = set(run.placed)
        out["fetched"] = [p for p in out["fetched"] if p in placed]
        out["repaired"] = [p for p in out["repaired"] if p in placed]
    vouched = None  # the lock whose every file this record vouches for
    if not failures:
        vouched = lock_sha if not a.only or old.get("lock_sha256") == lock_sha else None
    new = {"lock_sha256": vouched, "files": dict(sorted(run.record.items()))}
    record_changed = new != old
    if record_changed and not a.check:
        atomic.write(os.path.join(a.dest, RECORD), json.dumps(new, indent=1) + "\n", durable=True)
    out["changed"] = bool((todo if a.check else run.placed) or chmods or record_changed)
    if failures:
        msg = "; ".join(str(f) for f in failures[:3])
        raise Failed(msg + (f"; and {len(failures) - 3} more files failed" if len(failures) > 3 else ""),
                     failures[0].code)
    if not a.check and os.path.isdir(run.staging):
        clean_staging(run.staging, lock_paths - handled)


def fetch(a: argparse.Namespace) -> tuple[int, dict]:
    t0 = time.monotonic()
    token = os.environ.get(a.auth_env) if a.auth_env else None
    run = Run(a.dest, a.check, token or None)
    if a.auth_env and not token:
        print(f"model fetch: {a.auth_env} is not set (or empty): fetching without a token", file=sys.stderr)
    out: dict = {"ok": False, "changed": False, "check": a.check, "fetched": [], "repaired": [], "verified": 0}
    stop = threading.Event()
    reporter = threading.Thread(target=report, args=(run, a.progress_every, a.status, stop), daemon=True)
    reporter.start()
    code, error = 0, None
    try:
        _fetch(a, run, out)
        out["ok"] = True
    except Failed as err:
        code, error = err.code, str(err)
    except Exception as err:  # the summary still goes out
        code, error = 1, f"{type(err).__name__}: {err}"
        print(run.redact(traceback.format_exc()), file=sys.stderr, end="")
    finally:
        stop.set()
        reporter.join()
    out.update(run.c, seconds=round(time.monotonic() - t0, 3))
    out.setdefault("missing_bytes", 0)
    out.setdefault("extra", [])
    if error:
        out["error"] = run.redact(error)
    write_status(run, a.status, "done" if code == 0 else "failed", run.snapshot(), out.get("error"))
    return code, out


def _positive(kind):
    def parse(v: str):
        n = kind(v)
        if n <= 0:
            raise argparse.ArgumentTypeError(f"{v} is not > 0")
        return n
    return parse


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="model_fetch.py", description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    f = sub.add_parser("fetch", help="make --dest hold the lock's files, verified")
    f.add_argument("--lock", required=True)
    f.add_argument("--dest", required=True)
    f.add_argument("--source", required=True, choices=["http", "path", "rsync"])
    f.add_argument("--from", dest="origin", required=True, metavar="URL_OR_PATH")
    f.add_argument("--jobs", type=_positive(int), default=4)
    f.add_argument("--verify", choices=["quick", "full"], default="quick")
    f.add_argument("--progress-every", type=_positive(float), default=10.0, metavar="SECONDS")
    f.add_argument("--status", metavar="FILE", help="the progress as JSON, rewritten atomically")
    f.add_argument("--only", action="extend", nargs="+", metavar="GLOB", help="only the lock paths matching")
    f.add_argument("--check", action="store_true", help="change nothing; report what a run would do")
    f.add_argument("--auth-env", metavar="VAR", help="send `Authorization: Bearer $VAR` (http)")
    a = ap.parse_args(argv)
    code, out = fetch(a)
    if "error" in out:
        print(f"model_fetch.py fetch: {out['error']}", file=sys.stderr)
    secret = os.environ.get(a.auth_env) if a.auth_env else None
    text = json.dumps(out)
    print(text.replace(secret, "***") if secret else text, flush=True)
    return code


if __name__ == "__main__":
    sys.exit(main())
