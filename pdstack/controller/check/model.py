"""The model phase's checks (pdstack_model.source and its lock), before any host changes.

static:  the source names what its type needs and nothing another type needs; an hf source is pinned to a commit;
         the lock belongs to the inventory's model (hf: the same repo and commit; else the lock's `model` is the
         last component of pdstack_model.path, the directory it was made from).
facts:   each serving host's filesystem under pdstack_model.path has room for the bytes still missing (the lock's
         files less what is already there in full, and what a broken transfer left in staging) plus the margin
         (source.free_margin_gb). The facts script (pdstack/hostside/facts.py) reports free bytes and the sizes of
         the files present.
"""

from __future__ import annotations

from pdstack.controller.load.facts import host_model_facts
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.load.modellock import missing_bytes

# the keys each source type uses; every other key of SOURCE is refused for it (a url on an rsync source is a typo)
NEEDS = {"hf": ("repo", "revision"), "http": ("url",), "rsync": ("rsync",), "path": ()}
ONLY = {"url": "http", "rsync": "rsync", "repo": "hf", "revision": "hf"}


def static_problems(dep: Deployment, p: list[str]) -> None:
    src = dep.model.get("source")
    if src is None:
        if dep.environment == "production":
            dep.warnings.append("pdstack_model.source is unset: the model phase does not fetch or verify the weights "
                                "(a rebuilt host serves only if someone copied them by hand); set a source and a "
                                "lock (docs/model.md)")
        return
    kind = src["type"]
    for key in NEEDS.get(kind, ()):
        if not src.get(key):
            p.append(f"pdstack_model.source.{key}: required for type {kind}; "
                     + {"repo": "give the Hugging Face repo id, e.g. nvidia/DeepSeek-V4-Flash-NVFP4",
                        "revision": "pin the commit the lock was made from (40 hex); a branch moves under the lock",
                        "url": "give the mirror's base URL (a file's URL is URL/<path in the lock>)",
                        "rsync": "give the source directory, HOST:/DIR or rsync://HOST/MODULE/DIR"}[key])
    for key, owner in ONLY.items():
        if src.get(key) and owner != kind:
            p.append(f"pdstack_model.source.{key}: only used by type {owner}, and the source is type {kind}; remove "
                     f"it or set type: {owner}")
    lock = dep.model_lock
    if lock is None:
        return  # unreadable or malformed: the loader reported it
    where = f"pdstack_model.source.lock {lock['file']}"
    if kind == "hf":
        if src.get("repo") and lock["model"] != src["repo"]:
            p.append(f"{where}: is the lock of {lock['model']}, but the source is {src['repo']}; lock this repo "
                     f"(pdstack model lock --hf {src['repo']} --revision {src.get('revision') or 'REV'} -o ...) or "
                     "point source.lock at its lock")
        elif src.get("revision") and lock.get("revision") != src["revision"]:
            p.append(f"{where}: was made at revision {lock.get('revision') or '(none)'}, but source.revision is "
                     f"{src['revision']}; the served files would not be the lock's: relock at {src['revision']} or "
                     f"set revision: {lock.get('revision')}")
    else:
        name = dep.model["path"].rstrip("/").rsplit("/", 1)[-1]
        if lock["model"] != name and not dep.model["path"].endswith("/" + lock["model"]):
            p.append(f"{where}: is the lock of model {lock['model']!r}, but pdstack_model.path "
                     f"{dep.model['path']} is {name!r}; use that model's lock, or relock "
                     f"(pdstack model lock --model {name} DIR -o {lock['file']})")


def size(n: int) -> str:
    return f"{n / 1e9:.2f} GB" if n >= 10**8 else f"{n / 1e6:.1f} MB"


def facts_problems(dep: Deployment, facts: dict[str, dict], p: list[str]) -> None:
    src, lock = dep.model.get("source"), dep.model_lock
    if src is None or lock is None:
        return
    margin = float(src["free_margin_gb"]) * 1e9
    for h in dep.hosts.values():
        if not h.servers or h.name not in facts:
            continue
        m = host_model_facts(dep, facts, h.name)
        if m is None:
            dep.warnings.append(f"host {h.name}: the facts do not report the free space under {dep.model['path']}, "
                                "so the room for the model was not checked before the fetch")
            continue
        disk = m["disk"]
        need = missing_bytes(lock, m.get("files") or {}, m.get("partial") or {})
        if need and disk["free_bytes"] < need + margin:
            p.append(f"host {h.name}: {disk['path']} has {size(disk['free_bytes'])} free, but the model needs "
                     f"{size(need)} more ({lock['model']}: {size(lock['bytes'])} in the lock, less what "
                     f"is there) plus pdstack_model.source.free_margin_gb {src['free_margin_gb']} GB; free space "
                     "there, or move pdstack_model.path to a larger filesystem. Nothing was fetched")
