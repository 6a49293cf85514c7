"""The model phase's part of the plan: how the fetcher on a host gets the files of the lock (roles/model).

    fetch: {"method": "http" | "rsync" | "path", "from": <base URL | rsync source | the model path itself>,
            "token_var": <the Ansible variable holding the hub token> | None}
    needs: {host: {"files": [paths], "bytes": N}}: what each serving host lacks as preflight's facts saw it
           (sizes only; the fetcher's verify finds a wrong file of the right size). Check mode reports it.

hf is http from the hub's resolve URLs, ENDPOINT/REPO/resolve/COMMIT/<path> (the URLs huggingface_hub downloads
from; the hub redirects them to its CDN, and the fetcher drops the token on a redirect to another host), so a host
needs no Python package to fetch from the hub. path fetches from the model directory itself: a file that is not
the lock's cannot be repaired and fails, naming it (verify only).
"""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from pdstack.controller.load.facts import host_model_facts
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.load.modellock import missing


def fetch_plan(dep: Deployment) -> dict[str, Any] | None:
    src = dep.model.get("source")
    if src is None:
        return None
    kind = src["type"]
    if kind == "hf":
        base = f"{src['endpoint'].rstrip('/')}/{quote(src['repo'])}/resolve/{src['revision']}"
        return {"method": "http", "from": base, "token_var": src["token_var"]}
    frm = {"http": src["url"], "rsync": src["rsync"], "path": dep.model["path"]}[kind]
    return {"method": kind, "from": frm.rstrip("/") if kind == "http" else frm, "token_var": None}


def host_needs(dep: Deployment, facts: dict[str, dict]) -> dict[str, dict[str, Any]]:
    lock = dep.model_lock
    if lock is None:
        return {}
    out = {}
    for h in dep.hosts.values():
        m = host_model_facts(dep, facts, h.name) if h.servers else None
        if m is not None:
            gone = missing(lock, m.get("files") or {}, m.get("partial") or {})
            out[h.name] = {"files": [p for p, _ in gone], "bytes": sum(n for _, n in gone)}
    return out
