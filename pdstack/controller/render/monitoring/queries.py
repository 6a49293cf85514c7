"""Evaluate every dashboard panel query against a Prometheus (HTTP API) and report those that return no series."""

from __future__ import annotations

import json
import urllib.parse
import urllib.request
from dataclasses import dataclass
from pathlib import Path

# Template variables as Grafana substitutes them with "All" selected (allValue ".*"), and a rate window that holds
# several scrapes of the test's short scrape interval.
DEFAULT_VARS = {"$__rate_interval": "1m", "$__interval": "15s", "$host": ".*"}


@dataclass
class Query:
    dashboard: str
    panel: str
    ref_id: str
    expr: str

    def __str__(self) -> str:
        return f"{self.dashboard} / {self.panel} [{self.ref_id}]: {self.expr}"


def dashboard_queries(path: Path) -> list[Query]:
    d = json.loads(Path(path).read_text())
    out = []
    for p in d.get("panels", []):
        for t in p.get("targets", []) or []:
            out.append(Query(d["uid"], p.get("title", ""), t.get("refId", ""), t["expr"]))
    return out


def substitute(expr: str, variables: dict[str, str] | None = None) -> str:
    for k, v in sorted((variables or DEFAULT_VARS).items(), key=lambda kv: -len(kv[0])):
        expr = expr.replace(k, v)
    return expr


def instant(prometheus: str, expr: str, timeout: float = 10.0) -> list[dict]:
    url = f"{prometheus}/api/v1/query?" + urllib.parse.urlencode({"query": expr})
    with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (local Prometheus)
        body = json.loads(r.read())
    if body.get("status") != "success":
        raise RuntimeError(f"{expr}: {body}")
    return body["data"]["result"]


def empty_queries(prometheus: str, queries: list[Query], variables: dict[str, str] | None = None) -> list[Query]:
    """The queries that return no series (or fail) right now."""
    bad = []
    for q in queries:
        try:
            if not instant(prometheus, substitute(q.expr, variables)):
                bad.append(q)
        except Exception as e:  # noqa: BLE001 (reported with the query)
            bad.append(Query(q.dashboard, q.panel, q.ref_id, f"{q.expr} -> {e}"))
    return bad
