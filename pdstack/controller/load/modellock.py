"""The model lock: every file of the served model with its size and sha256 (`pdstack model lock`).

    {"model": "<hf repo id, or the model directory's name>", "revision": "<hf commit; absent otherwise>",
     "files": [{"path": "config.json", "size": 1234, "sha256": "<64 hex>"}, ...]}

It is committed beside the inventory (pdstack_model.source.lock); the plan carries it and the model phase makes
the host's pdstack_model.path exactly that (pdstack/hostside/model_fetch.py verifies every file against it).

`pdstack model lock DIR [--model NAME] [-o FILE]`: the lock of a local copy (every file hashed; dotfiles skipped).
`pdstack model lock --hf REPO --revision REV [--endpoint URL] [-o FILE]`: the lock of a Hugging Face repo at a commit
(REV may be a branch: the lock records the commit it resolved to), from the hub's file metadata: LFS files (the
weights) carry their sha256 there, so nothing large is downloaded; the few small non-LFS files (config, tokenizer
json) are downloaded to hash them. The token comes from HF_TOKEN (huggingface_hub's own variable), never an argument.

missing() is what a fetch still has to write against what a host reports: the model check (room for it) and the
plan (the files the fetch moves) both count with it.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import re
import sys
from pathlib import Path, PurePosixPath
from typing import Any

SHA256_RE = re.compile(r"[0-9a-f]{64}")
# The fetcher's own files inside the model directory (pdstack/hostside/model_fetch.py): never part of a lock
RESERVED = (".pdstack-staging", ".pdstack-verified.json")
# Bounds no real model file or model reaches (the largest shards of today's models are ~10 GB, whole models a few
# TB); a lock beyond them is a typo or an attack on the room checks (check/model.py adds sizes up)
MAX_FILE_BYTES = 1 << 40
MAX_MODEL_BYTES = 1 << 44
# a sharded checkpoint's files, as transformers names them (modeling_utils: "{prefix}-{i:05d}-of-{n:05d}{ext}")
SHARD_RE = re.compile(r"(?P<prefix>.+)-(?P<i>[0-9]{5})-of-(?P<n>[0-9]{5})(?P<ext>\.safetensors|\.bin)")


def path_problem(p: Any) -> str | None:
    if not isinstance(p, str) or not p:
        return "path must be a non-empty string"
    pp = PurePosixPath(p)
    if p.startswith("/") or "\\" in p or any(part in ("", ".", "..") for part in p.split("/")):
        return f"{p!r} is not a plain relative path (no leading '/', no '.', '..' or empty parts)"
    if pp.parts[0] in RESERVED or any(ord(c) < 32 for c in p):
        return f"{p!r} is reserved for the fetcher's own files or holds control characters"
    return None


def problems(lock: Any, where: str) -> list[str]:
    """Everything wrong with a lock's shape, each naming the entry; [] when it is a lock."""
    fix = "; regenerate it with `pdstack model lock`"
    if not isinstance(lock, dict) or not isinstance(lock.get("files"), list):
        return [f"{where}: not a model lock (expected {{\"model\", \"files\": [...]}}){fix}"]
    out = []
    if not isinstance(lock.get("model"), str) or not lock["model"]:
        out.append(f"{where}: `model` is missing; it names the model the lock is for{fix}")
    seen: set[str] = set()
    for i, f in enumerate(lock["files"]):
        at = f"{where} files[{i}]"
        if not isinstance(f, dict):
            out.append(f"{at}: expected {{path, size, sha256}}{fix}")
            continue
        if msg := path_problem(f.get("path")):
            out.append(f"{at}.path: {msg}{fix}")
        elif f["path"] in seen:
            out.append(f"{at}.path: {f['path']} is listed twice{fix}")
        else:
            seen.add(f["path"])
        size = f.get("size")
        if not isinstance(size, int) or isinstance(size, bool) or not 0 <= size <= MAX_FILE_BYTES:
            out.append(f"{at}.size: {f.get('size')!r} is not a size in bytes of 0-{MAX_FILE_BYTES} (1 TiB){fix}")
        if not isinstance(f.get("sha256"), str) or not SHA256_RE.fullmatch(f["sha256"]):
            out.append(f"{at}.sha256: {f.get('sha256')!r} is not 64 lowercase hex digits{fix}")
    if not out and "config.json" not in seen:
        out.append(f"{where}: lists no config.json, which SGLang and preflight read; lock the whole model "
                   "directory")
    if not out and sum(f["size"] for f in lock["files"]) > MAX_MODEL_BYTES:
        out.append(f"{where}: its files add up to over {MAX_MODEL_BYTES} bytes (16 TiB), which no model has{fix}")
    return out + ([] if out else shard_problems(seen, where))


def shard_problems(paths: set[str], where: str) -> list[str]:
    """A sharded checkpoint is whole: for each `{prefix}-i-of-n` family, shards 1..n, one n. (The shards' index,
    model.safetensors.index.json, names the same files; the fetcher checks each file's sha256 against the lock.)"""
    families: dict[tuple[str, str], dict[str, set[int]]] = {}
    for p in paths:
        if m := SHARD_RE.fullmatch(p):
            families.setdefault((m["prefix"], m["ext"]), {}).setdefault(m["n"], set()).add(int(m["i"]))
    out = []
    for (prefix, ext), by_n in sorted(families.items()):
        if len(by_n) > 1:
            out.append(f"{where}: {prefix}-*{ext} shards say different totals ({', '.join(sorted(by_n))}); lock one "
                       "checkpoint: regenerate it with `pdstack model lock`")
            continue
        n, have = next(iter(by_n.items()))
        missing = sorted(set(range(1, int(n) + 1)) - have)
        if missing or int(n) == 0 or max(have) > int(n):
            shown = ", ".join(f"{prefix}-{i:05d}-of-{n}{ext}" for i in missing[:3]) + (" ..." if len(missing) > 3
                                                                                        else "")
            out.append(f"{where}: the checkpoint has {int(n)} shards but the lock "
                       + (f"misses {shown}" if missing else "numbers them beyond it")
                       + ": SGLang would fail to load the model; regenerate it with `pdstack model lock` over the "
                       "whole model directory")
    return out


def read(path: Path) -> tuple[dict | None, list[str]]:
    try:
        lock = json.loads(path.read_text())
    except OSError as e:
        return None, [f"pdstack_model.source.lock: cannot read {path} ({e.strerror or e}); write it with "
                      f"`pdstack model lock DIR -o {path}` or fix the path (relative to the inventory directory)"]
    except ValueError as e:
        return None, [f"pdstack_model.source.lock: {path} is not JSON ({e}); regenerate it with `pdstack model lock`"]
    found = problems(lock, f"pdstack_model.source.lock {path}")
    return (None, found) if found else (lock, [])


def digest(lock: dict) -> str:
    """The lock's identity: sha256 of its canonical JSON (model, revision, files sorted by path)."""
    canon = {"model": lock["model"], "revision": lock.get("revision"),
             "files": sorted(({"path": f["path"], "size": f["size"], "sha256": f["sha256"]} for f in lock["files"]),
                             key=lambda f: f["path"])}
    return hashlib.sha256(json.dumps(canon, sort_keys=True, separators=(",", ":")).encode()).hexdigest()


def total_bytes(lock: dict) -> int:
    return sum(f["size"] for f in lock["files"])


def _sha256_file(path: Path) -> str:
    with open(path, "rb") as f:
        return hashlib.file_digest(f, "sha256").hexdigest()


def from_dir(directory: Path, model: str | None = None) -> dict:
    """The lock of a local model directory: every file under it except dotfiles (and what lies under dot-dirs)."""
    files = []
    for root, dirs, names in os.walk(directory):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in sorted(names):
            if name.startswith("."):
                continue
            p = Path(root) / name
            rel = p.relative_to(directory).as_posix()
            files.append({"path": rel, "size": p.stat().st_size, "sha256": _sha256_file(p)})
    return {"model": model or directory.resolve().name, "files": sorted(files, key=lambda f: f["path"])}


def from_hub(repo: str, revision: str, endpoint: str | None = None) -> dict:
    """The lock of a Hugging Face repo at `revision`, from the hub's metadata (huggingface_hub's HfApi)."""
    import tempfile

    from huggingface_hub import HfApi, hf_hub_download

    api = HfApi(endpoint=endpoint)
    commit = api.model_info(repo, revision=revision).sha
    files = []
    with tempfile.TemporaryDirectory() as tmp:
        for entry in api.list_repo_tree(repo, revision=commit, recursive=True, expand=True):
            if not hasattr(entry, "size") or entry.path.split("/")[-1].startswith("."):
                continue  # folders; .gitattributes and other dotfiles are not the model
            if entry.lfs is not None:
                files.append({"path": entry.path, "size": entry.lfs.size, "sha256": entry.lfs.sha256})
            else:
                local = hf_hub_download(repo, entry.path, revision=commit, cache_dir=tmp, endpoint=endpoint)
                files.append({"path": entry.path, "size": entry.size, "sha256": _sha256_file(Path(local))})
    return {"model": repo, "revision": commit, "files": sorted(files, key=lambda f: f["path"])}


def render(lock: dict) -> str:
    return json.dumps(lock, indent=1) + "\n"


# ---------------------------------------------------------------- `pdstack model lock`


def register(parser: argparse.ArgumentParser) -> None:
    sub = parser.add_subparsers(dest="model_command", metavar="SUBCOMMAND", required=True)
    p = sub.add_parser("lock", help="print (or write) the lock of a model directory or a Hugging Face repo")
    p.add_argument("dir", nargs="?", help="a local copy of the model")
    p.add_argument("--model", help="the name the lock records (default: the directory's name; pdstack_model.path "
                   "must end with it)")
    p.add_argument("--hf", metavar="REPO", help="lock a Hugging Face repo instead, from the hub's metadata")
    p.add_argument("--revision", help="with --hf: the commit (or a branch, resolved to its commit)")
    p.add_argument("--endpoint", help="with --hf: a hub mirror (default: HF_ENDPOINT or huggingface.co)")
    p.add_argument("-o", "--out", help="write the lock here instead of printing it")


def run(args: argparse.Namespace) -> int:
    if bool(args.dir) == bool(args.hf):
        print("pdstack model lock: give a model directory, or --hf REPO --revision REV (not both)", file=sys.stderr)
        return 2
    if args.hf:
        if not args.revision:
            print("pdstack model lock: --hf needs --revision (a commit, or a branch to resolve)", file=sys.stderr)
            return 2
        try:
            lock = from_hub(args.hf, args.revision, args.endpoint)
        except Exception as e:  # the hub's errors (offline, 401, unknown repo/revision) in its own words
            print(f"pdstack model lock: {args.hf}@{args.revision}: {type(e).__name__}: {e}", file=sys.stderr)
            return 3
    else:
        d = Path(args.dir)
        if not d.is_dir():
            print(f"pdstack model lock: {d} is not a directory", file=sys.stderr)
            return 2
        lock = from_dir(d, args.model)
    found = problems(lock, args.dir or args.hf)
    if found:
        print("pdstack model lock: " + "; ".join(found), file=sys.stderr)
        return 2
    if args.out:
        Path(args.out).write_text(render(lock))
        print(f"wrote {args.out}: {len(lock['files'])} files, {total_bytes(lock) / 1e9:.3f} GB", file=sys.stderr)
    else:
        sys.stdout.write(render(lock))
    return 0


def missing(lock: dict[str, Any], present: dict[str, int], partial: dict[str, int]) -> list[tuple[str, int]]:
    """(path, bytes still to write) of each locked file a fetch must write: a file present at its locked size needs
    none (a wrong hash at the right size is found by the fetcher's verify, and its space comes back on the move); a
    partial transfer in staging needs the rest."""
    out = []
    for f in lock["files"]:
        if present.get(f["path"]) == f["size"]:
            continue
        done = partial.get(f["path"], 0)
        out.append((f["path"], f["size"] - done if 0 <= done <= f["size"] else f["size"]))
    return out


def missing_bytes(lock: dict[str, Any], present: dict[str, int], partial: dict[str, int]) -> int:
    return sum(n for _, n in missing(lock, present, partial))
