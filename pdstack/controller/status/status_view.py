"""`pdstack status`'s table for a terminal: what each host reported, then every finding with its next command.

Pure text from the view (status.py builds it); colour only when asked (the command asks on a terminal).
"""

from __future__ import annotations

import time
from typing import Any

from pdstack.controller.status.status_judge import ATTENTION, NOTE, UNREACHABLE, ago, refusals, unit_state

COLORS = {"red": "31", "yellow": "33", "green": "32", "bold": "1", "dim": "2"}


def _c(text: str, color: str, on: bool) -> str:
    return f"\x1b[{COLORS[color]}m{text}\x1b[0m" if on else text


def table(rows: list[list[str]], indent: str = "  ") -> list[str]:
    widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
    return [indent + "  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in rows]


def _image(rep: dict[str, Any], container: str) -> str:
    d = rep.get("docker") or {}
    c = (d.get("containers") or {}).get(container)
    if c is None:
        return "no container"
    plan = (rep.get("plan") or {}).get("image")
    same = c["image_ref"] == plan and (not d.get("plan_image_id") or c["image_id"] == d["plan_image_id"])
    return f"{c['image_ref']} (= plan)" if same else f"{c['image_ref']} (plan: {plan})"


def _unit(rep: dict[str, Any], unit: str) -> str:
    u = (rep.get("units") or {}).get(unit) or {}
    if not u:
        return "?"
    since = u.get("active_since") if u.get("ActiveState") == "active" else None
    up = ""
    if isinstance(since, (int, float)):  # how long it has been up, by the host's clock (its report's time)
        up = " " + ago((rep.get("time") or time.time()) - since).removesuffix(" ago")
    return f"{u.get('ActiveState', '?')}/{u.get('SubState', '?')}{up}"


def servers(view: dict[str, Any]) -> list[str]:
    rows = [["host", "server", "role", "unit", "restarts 1h", "image", "/health"]]
    for host, rep in sorted(view["hosts"].items()):
        for s in rep.get("servers") or []:
            h = s.get("health") or {}
            n = (rep.get("restarts_1h") or {}).get(s["unit"], "?")
            rows.append([host, s["name"], s["role"], _unit(rep, s["unit"]), str(n), _image(rep, s["container"]),
                         f"{h.get('status') or 'no answer'} ({h.get('seconds', 0):.2f} s)"])
    return ["SERVERS", *table(rows)] if len(rows) > 1 else ["SERVERS  none reported"]


def profile(view: dict[str, Any]) -> list[str]:
    """The profile the deployed plan runs under (production's checks, or the test engine's local/test), per host."""
    seen: dict[tuple[Any, Any], list[str]] = {}
    for host, rep in sorted(view["hosts"].items()):
        plan = rep.get("plan") or {}
        if plan.get("profile"):
            seen.setdefault((plan["profile"], plan.get("engine")), []).append(host)
    return [f"PROFILE  {prof} (engine {engine})" + (f"  on {', '.join(hosts)}" if len(seen) > 1 else "")
            for (prof, engine), hosts in sorted(seen.items(), key=str)]


def index_keys(view: dict[str, Any]) -> list[str]:
    """Which DSA index keys the deployed plan set, and which kernel reads them (the plan's switches decide it)."""
    seen = {((rep.get("plan") or {}).get("index_keys"), (rep.get("plan") or {}).get("index_reader"))
            for rep in view["hosts"].values() if (rep.get("plan") or {}).get("index_keys")}
    return [f"INDEX KEYS  {dtype}: {reader}" for dtype, reader in sorted(seen)]


def router(host: str, rep: dict[str, Any]) -> list[str]:
    r = rep["router"]
    lines = [f"ROUTER  {host}  unit {_unit(rep, r['unit'])}  readiness {r.get('readiness') or 'no answer'}"]
    circuit = r.get("circuit") or {}
    rows = [[w.get("worker_type") or "?", w.get("url") or "?", "healthy" if w.get("is_healthy") else "UNHEALTHY",
             "circuit " + {0: "closed", 1: "open", 2: "half-open"}.get(int(circuit.get(w.get("url"), 0)), "?")]
            for w in r.get("workers") or []]
    return lines + (table(rows) if rows else ["  workers: " + (r.get("workers_error") or "none")])


def frontdoor(host: str, rep: dict[str, Any], view: dict[str, Any]) -> list[str]:
    fd = rep["frontdoor"]
    if fd.get("error"):
        return [f"FRONT DOOR  {host}  {fd['error']}"]
    refused, requests = refusals(view, host, fd)
    five = (", ".join(f"{k} {v}" for k, v in refused.items()) + f" of {requests} requests") if requests is not None \
        else "no Prometheus answer"
    since = ", ".join(f"{k} {v}" for k, v in (fd.get("refused_total") or {}).items())
    maint = "ON" if fd.get("maintenance") else "off"
    return [f"FRONT DOOR  {host}  router {fd.get('router_status')}  in flight {fd.get('in_flight')}/{fd.get('slots')}"
            f"  queued {fd.get('queued')}/{fd.get('queue_limit')}  maintenance {maint}",
            f"  refused, last 5 min: {five}", f"  refused since HAProxy started: {since} "
            f"(of {fd.get('requests_total')} requests)"]


def watchdog(host: str, rep: dict[str, Any], now: float) -> list[str]:
    wd = rep.get("watchdog")
    if not wd or wd.get("error"):
        return [f"WATCHDOG  {host}  {(wd or {}).get('error') or 'not installed'}"]
    st, cfg = wd.get("state") or {}, wd.get("config") or {}
    recent = [r for r in st.get("restarts") or [] if now - r[0] < 3600]
    code = st.get("last_probe_code")
    probe = "none yet" if code is None else "ok" if code == 0 else f"FAILED at {st.get('last_probe_stage')} ({code})"
    if (st.get("held_until") or 0) > now:
        probe = f"held by a planned restart ({st.get('held_reason')})"
    last = f"{st.get('last_restart') and ago(now - st['last_restart'])}" if st.get("last_restart") else "never"
    if recent:
        last += f" ({recent[-1][1]}; {st.get('last_probe_stage') or ''})"
    backoff = f"ON: {st.get('alert_reason')}" if st.get("alert") else "no"
    return [f"WATCHDOG  {host}  timer {_unit(rep, 'pdstack-watchdog.timer')}  last probe "
            f"{ago(now - st['last_run']) if st.get('last_run') else 'never'}: {probe}",
            f"  restarts last hour {len(recent)}/{cfg.get('max_restarts_per_hour')}  last restart {last}  "
            f"backoff {backoff}"]


def smoke(s: dict[str, Any] | None) -> list[str]:
    if not s:
        return ["SMOKE  no result on this controller"]
    if s.get("error"):
        return [f"SMOKE  {s['error']}"]
    verdicts = ", ".join(f"{k} {'ok' if v else 'FAIL'}" for k, v in (s.get("verdicts") or {}).items())
    tps = f"{s['c1_tps']:.1f}" if isinstance(s.get("c1_tps"), (int, float)) else "?"
    return [f"SMOKE  {'passed' if s.get('passed') else 'FAILED'} {ago(s.get('age_s'))}: recall horizon "
            f"{s.get('horizon')} (min {s.get('min_horizon')}), C=1 {tps} tok/s (floor {s.get('floor_tps')}); "
            f"{verdicts}",
            f"  {s.get('dir')}"]


def alerts(view: dict[str, Any]) -> list[str]:
    proms = [(h, r["prometheus"]) for h, r in sorted(view["hosts"].items()) if r.get("prometheus")]
    if not proms:
        mons = view.get("monitoring_hosts") or []
        why = ", ".join(f"{h}: " + ("unreachable" if (view["hosts"].get(h) or {}).get("unreachable") else
                                   "prometheus.service " + unit_state(((view["hosts"].get(h) or {}).get(
                                       "monitoring_units") or {}).get("prometheus.service"))) for h in mons)
        return [f"ALERTS  no Prometheus answered: nothing evaluates the alerts ({why or 'no monitoring host'})"]
    firing = [a for _, p in proms for a in p.get("alerts") or [] if a.get("state") == "firing"]
    return [f"ALERTS  {len(firing)} firing" + (": " + ", ".join(sorted({a['name'] for a in firing})) if firing else "")
            + f"  (Prometheus on {', '.join(h for h, _ in proms)})"]


def gpus(view: dict[str, Any]) -> list[str]:
    rows = [["host", "gpu", "memory used", "util"]]
    for host, rep in sorted(view["hosts"].items()):
        for g in (rep.get("dcgm") or {}).get("gpus") or []:
            used, free = g.get("fb_used_mib"), g.get("fb_free_mib")
            mem = "?" if used is None or free is None else f"{used / 1024:.1f} / {(used + free) / 1024:.1f} GiB"
            rows.append([host, str(g.get("gpu")), mem, f"{g.get('util_pct', '?'):.0f} %"
                         if isinstance(g.get("util_pct"), float) else "?"])
    return ["GPUS", *table(rows)] if len(rows) > 1 else []


def render(view: dict[str, Any], color: bool = False, now: float | None = None) -> str:
    now = view.get("time") or time.time() if now is None else now
    stamp = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(view.get("time") or now))
    out = [_c(f"pdstack status  {view.get('inventory')}  {stamp}  ({view.get('seconds', 0):.1f} s)", "bold", color),
           ""]
    out += profile(view) + servers(view) + index_keys(view)
    for host, rep in sorted(view["hosts"].items()):
        if rep.get("unreachable") or rep.get("failed"):
            out.append(_c(f"HOST  {host}  {rep.get('unreachable') or rep.get('failed')}", "red", color))
        if rep.get("router"):
            out += router(host, rep)
        if rep.get("frontdoor") is not None:
            out += frontdoor(host, rep, view)
        if rep.get("router"):
            out += watchdog(host, rep, now)
    out += smoke(view.get("smoke")) + alerts(view) + gpus(view)
    findings = view.get("findings") or []
    bad = [f for f in findings if f["level"] in (ATTENTION, UNREACHABLE)]
    notes = [f for f in findings if f["level"] == NOTE]
    out.append("")
    if bad:
        out.append(_c(f"ATTENTION ({len(bad)})", "red", color))
    for f in bad + notes:
        mark = _c("!", "red", color) if f in bad else _c("-", "yellow", color)
        out.append(f"{mark} {f['where']}: {f['what']}")
        if f.get("next"):
            out.append(_c(f"    next: {f['next']}", "dim", color))
    if not bad:
        out.append(_c("all well", "green", color) + (f" ({len(notes)} note(s) above)" if notes else ""))
    return "\n".join(out)
