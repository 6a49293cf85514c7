"""`pdstack status`'s verdicts: what the hosts reported (pdstack/hostside/status_collect.py), judged.

Pure (no I/O): a view in, findings out, so every problem class is unit-tested on fake reports. A finding is
`attention` (exit 1: it says what is wrong and the next command to run), `unreachable` (exit 3) or `note` (shown,
exit unchanged: e.g. restarts in the last hour, which every deploy's rollout also makes).
"""

from __future__ import annotations

import shlex
import time
from dataclasses import asdict, dataclass
from typing import Any

ATTENTION, NOTE, UNREACHABLE = "attention", "note", "unreachable"
EXIT_OK, EXIT_ATTENTION, EXIT_INVENTORY, EXIT_UNREACHABLE = 0, 1, 2, 3
WATCHDOG_RESET = ("python3 -I /usr/local/lib/pdstack/pdstack-hostside.pyz watchdog "
                  "--config /etc/pdstack/watchdog.json --reset")
REFUSED_RATIO = 0.05  # the PdstackFrontDoorRefusingRequests alert's threshold (monitoring/rules)


@dataclass
class Finding:
    level: str
    where: str
    what: str
    next: str = ""

    def to_dict(self) -> dict[str, str]:
        return asdict(self)


def on_host(inventory: str, host: str, command: str) -> str:
    """The next command, run on `host` the way pdstack reaches it (Ansible's inventory and connection)."""
    return f"ansible {host} -i {inventory} -m shell -a {shlex.quote(command)}"


def exit_code(findings: list[Finding]) -> int:
    levels = {f.level for f in findings}
    return EXIT_UNREACHABLE if UNREACHABLE in levels else EXIT_ATTENTION if ATTENTION in levels else EXIT_OK


def ago(seconds: float | None) -> str:
    if seconds is None:
        return "never"
    s = max(0.0, seconds)
    return f"{s:.0f} s ago" if s < 120 else f"{s / 60:.0f} min ago" if s < 7200 else f"{s / 3600:.1f} h ago"


def judge(view: dict[str, Any], now: float | None = None) -> list[Finding]:
    now = time.time() if now is None else now
    inv = view.get("inventory", "INVENTORY")
    out: list[Finding] = []
    monitoring = set(view.get("monitoring_hosts") or [])
    for host, rep in sorted((view.get("hosts") or {}).items()):
        if rep.get("unreachable"):
            addr = (view.get("reach") or {}).get(host) or host
            what = " (a monitoring host: nothing evaluates the alerts)" if host in monitoring else ""
            out.append(Finding(UNREACHABLE, host, f"cannot be reached{what}: {rep['unreachable']}",
                               f"reach it first: ssh {addr} (is it up, is sshd listening, is the key right?); "
                               f"ansible {host} -i {inv} -m ping -vvv shows the connection Ansible makes and its "
                               "error"))
            continue
        if rep.get("failed"):
            out.append(Finding(ATTENTION, host, f"the status collector failed: {rep['failed']}",
                               on_host(inv, host, "/usr/bin/python3 --version; ls -l /etc/pdstack") + " (it runs "
                               "pdstack/hostside/status_collect.py with the host's /usr/bin/python3)"))
            continue
        if host in monitoring:
            out += _monitoring(inv, host, rep, view.get("prometheus_port"))
        if not rep.get("plan"):
            out.append(Finding(ATTENTION, host, f"not deployed: {rep.get('plan_error') or 'no plan.json'}",
                               f"invoke deploy -i {inv}"))
            continue
        out += _reboot(inv, host, rep, (view.get("reach") or {}).get(host) or host)
        out += _servers(inv, host, rep)
        if rep.get("router"):
            out += _router(inv, host, rep)
        if rep.get("frontdoor") is not None:
            out += _frontdoor(inv, host, rep, view)
        if rep.get("router"):
            out += _watchdog(inv, host, rep, now)
        if rep.get("prometheus"):
            out += _alerts(inv, host, rep["prometheus"])
    out += _smoke(inv, view.get("smoke"), now)
    return out


def _servers(inv: str, host: str, rep: dict[str, Any]) -> list[Finding]:
    out = []
    units, docker = rep.get("units") or {}, rep.get("docker") or {}
    plan_image = (rep.get("plan") or {}).get("image")
    if "error" in units:
        out.append(Finding(ATTENTION, host, f"unit states unreadable: {units['error']}",
                           on_host(inv, host, "systemctl list-units 'pdstack-*'")))
    containers = docker.get("containers") or {}
    for s in rep.get("servers") or []:
        where, unit = f"{s['name']} on {host}", units.get(s["unit"]) or {}
        journal = on_host(inv, host, f"journalctl -u {s['unit']} -n 50 --no-pager")
        state = f"{unit.get('ActiveState', '?')}/{unit.get('SubState', '?')}"
        if unit and unit.get("ActiveState") != "active":
            out.append(Finding(ATTENTION, where, f"unit {s['unit']} is {state} (result {unit.get('Result', '?')})",
                               f"{journal}; to start it as planned: invoke deploy -i {inv}"))
            continue
        h = s.get("health") or {}
        if h.get("status") != 200:
            out.append(Finding(ATTENTION, where, f"/health on port {s['port']} answers "
                               f"{h.get('status') or 'nothing'}{': ' + h['error'] if h.get('error') else ''}",
                               journal))
        c = containers.get(s["container"])
        if c is None and not docker.get("error"):
            out.append(Finding(ATTENTION, where, f"unit {state} but no container {s['container']}", journal))
        elif c is not None and plan_image and (c["image_ref"] != plan_image or (
                docker.get("plan_image_id") and c["image_id"] != docker["plan_image_id"])):
            out.append(Finding(ATTENTION, where, f"runs image {c['image_ref']} ({c['image_id'][:19]}), the plan says "
                               f"{plan_image} ({(docker.get('plan_image_id') or 'not on the host')[:19]})",
                               f"invoke deploy -i {inv} (rolls it to the plan's image); or invoke rollback"))
        n = (rep.get("restarts_1h") or {}).get(s["unit"], 0)
        if isinstance(n, int) and n > 0:
            out.append(Finding(NOTE, where, f"restarted {n}x in the last hour (systemd, the watchdog or a rollout)",
                               journal))
    return out


def _reboot(inv: str, host: str, rep: dict[str, Any], addr: str) -> list[Finding]:
    """The PCIe settings that waited for a reboot at the last deploy (the plan's host_settings on the host)."""
    hs = (rep.get("plan") or {}).get("host_settings") or {}
    if not hs.get("pending_reboot"):
        return []
    serving = " and serves without them (pdstack_host.reboot_policy warn)" if hs.get("reboot_policy") == "warn" else ""
    return [Finding(ATTENTION, host, f"waits for a reboot (as of its last deploy){serving}: "
                    + "; ".join(hs["pending_reboot"]),
                    f"reboot it when its servers may stop (ssh {addr} systemctl reboot), then invoke deploy -i {inv}")]


def _router(inv: str, host: str, rep: dict[str, Any]) -> list[Finding]:
    r, out, where = rep["router"], [], f"router on {host}"
    unit = (rep.get("units") or {}).get(r["unit"]) or {}
    journal = on_host(inv, host, f"journalctl -u {r['unit']} -n 50 --no-pager")
    if unit and unit.get("ActiveState") != "active":
        out.append(Finding(ATTENTION, where, f"unit {r['unit']} is {unit.get('ActiveState')}/{unit.get('SubState')}",
                           f"{journal}; then invoke deploy -i {inv}"))
        return out
    if r.get("workers") is None:
        out.append(Finding(ATTENTION, where, f"/workers answers {r.get('workers_status') or 'nothing'}: "
                           f"{r.get('workers_error') or ''}".rstrip(": "), journal))
        return out
    listed = {w.get("url"): w for w in r["workers"]}
    for s in rep.get("planned_workers") or []:
        w = listed.get(s["url"])
        if w is None:
            out.append(Finding(ATTENTION, where, f"{s['role']} {s['name']} ({s['url']}) is not among the router's "
                               "workers (taken out by a rollout that failed?)", f"invoke deploy -i {inv} (the router "
                               "phase puts every worker of the plan back)"))
        elif not w.get("is_healthy"):
            out.append(Finding(ATTENTION, where, f"marks {s['role']} {s['name']} ({s['url']}) unhealthy", journal))
    for url, state in sorted((r.get("circuit") or {}).items()):
        if state:
            out.append(Finding(ATTENTION, where, f"circuit breaker of {url} is {'open' if state == 1 else 'half-open'}"
                               ": requests skip it", journal))
    if r.get("readiness") not in (200, None) and not out:
        out.append(Finding(ATTENTION, where, f"/readiness answers {r.get('readiness')}", journal))
    return out


def _frontdoor(inv: str, host: str, rep: dict[str, Any], view: dict[str, Any]) -> list[Finding]:
    fd, out, where = rep["frontdoor"], [], f"front door on {host}"
    journal = on_host(inv, host, "journalctl -u haproxy -n 50 --no-pager")
    if fd.get("error"):
        return [Finding(ATTENTION, where, fd["error"], journal)]
    if fd.get("maintenance"):
        out.append(Finding(ATTENTION, where, "refuses every new request: the maintenance switch is on (503 "
                           "maintenance; a rolling restart sets it and clears it when done)",
                           "if no deploy is running: " + on_host(inv, host, "systemctl reload haproxy")
                           + " (a reload reads the empty switch file again)"))
    if fd.get("router_status", "").split()[:1] != ["UP"]:
        out.append(Finding(ATTENTION, where, f"marks the router {fd.get('router_status')}: clients get 503 "
                           "router-down", on_host(inv, host, "journalctl -u pdstack-router -n 50 --no-pager")))
    refused, requests = refusals(view, host, fd)
    # maintenance refusals are a rolling restart's, by design: shown; the others count against the 5 % threshold
    busy = {k: v for k, v in refused.items() if v and k != "maintenance"}
    total = sum(busy.values())
    if total and requests and total / requests > REFUSED_RATIO:
        if busy.get("queue-full"):  # busy: more than N in flight and Q waiting
            nxt = ("raise pdstack_router.admission (docs/admission.md) or add capacity; Prometheus: "
                   "pdstack:frontdoor_refused:rate5m")
        else:  # 503s after the queue timeout, or the router down
            nxt = on_host(inv, host, "journalctl -u pdstack-router -n 50 --no-pager") + " (a queue timeout or the " \
                "router down; haproxy's journal tells which)"
        out.append(Finding(ATTENTION, where, f"refused {total} of {requests} requests in the last 5 minutes ("
                           + ", ".join(f"{k} {v}" for k, v in busy.items()) + ")", nxt))
    elif total:
        out.append(Finding(NOTE, where, f"refused {total} request(s) in the last 5 minutes ("
                           + ", ".join(f"{k} {v}" for k, v in busy.items()) + ")"))
    if refused.get("maintenance"):
        out.append(Finding(NOTE, where, f"refused {refused['maintenance']} request(s) in the last 5 minutes with its "
                           "maintenance switch on (a rolling restart of the only server of a role)"))
    return out


def refusals(view: dict[str, Any], host: str, fd: dict[str, Any]) -> tuple[dict[str, int], int | None]:
    """The front door's refusals of the last 5 minutes by reason, and its requests, from a monitoring host's
    Prometheus; without one, nothing (HAProxy's own counters are since its start: shown, not judged)."""
    for rep in (view.get("hosts") or {}).values():
        prom = rep.get("prometheus") or {}
        if host in (prom.get("refused_5m") or {}) or host in (prom.get("requests_5m") or {}):
            return dict(prom["refused_5m"].get(host, {})), prom.get("requests_5m", {}).get(host)
    return {}, None


def _watchdog(inv: str, host: str, rep: dict[str, Any], now: float) -> list[Finding]:
    wd, where = rep.get("watchdog"), f"watchdog on {host}"
    journal = on_host(inv, host, "journalctl -u pdstack-watchdog -n 50 --no-pager")
    if wd is None:
        return [Finding(NOTE, where, "not installed (watchdog_enabled: false, or /etc/pdstack/watchdog.json missing)")]
    if wd.get("error"):
        return [Finding(ATTENTION, where, wd["error"], journal)]
    out, st, cfg = [], wd.get("state") or {}, wd.get("config") or {}
    timer = (rep.get("units") or {}).get("pdstack-watchdog.timer") or {}
    if timer and timer.get("ActiveState") != "active":
        out.append(Finding(ATTENTION, where, f"timer pdstack-watchdog.timer is {timer.get('ActiveState')}: nothing "
                           "un-wedges a stuck decode", f"invoke deploy -i {inv} --tags watchdog_run"))
    recent = [r for r in st.get("restarts") or [] if now - r[0] < 3600]
    budget = cfg.get("max_restarts_per_hour")
    if st.get("alert"):
        out.append(Finding(ATTENTION, where, f"backing off: gave up restarting ({st.get('alert_reason')})",
                           f"{journal}; fix the cause, then {on_host(inv, host, WATCHDOG_RESET)}"))
    elif st.get("last_probe_code") not in (0, None):
        out.append(Finding(ATTENTION, where, f"last probe {ago(now - st.get('last_run', now))} failed at "
                           f"{st.get('last_probe_stage')} (exit {st.get('last_probe_code')}, "
                           f"{st.get('consecutive_failures', 0)} in a row): {st.get('last_probe_message', '')}",
                           journal))
    if recent and not st.get("alert"):
        out.append(Finding(NOTE, where, f"restarted {len(recent)} unit(s) in the last hour (budget {budget}); last "
                           f"{recent[-1][1]} {ago(now - recent[-1][0])}", journal))
    if (st.get("held_until") or 0) > now:
        out.append(Finding(NOTE, where, f"held at its last run by a planned restart ({st.get('held_reason')}): no "
                           f"probe, no restart, for {ago(st['held_until'] - now).removesuffix(' ago')} more",
                           f"{journal} (a rollout releases it when done; the hold lapses by itself)"))
    return out


def unit_state(unit: dict[str, Any] | None) -> str:
    if not unit:
        return "not installed"
    return f"{unit.get('ActiveState', '?')}/{unit.get('SubState', '?')} (result {unit.get('Result', '?')})"


def _monitoring(inv: str, host: str, rep: dict[str, Any], port: int | None) -> list[Finding]:
    """A host of the monitoring group: its Prometheus must answer (else no alert is evaluated, by anyone) and its
    Grafana unit must run. The unit states come from the collector (absent from an older collector's report)."""
    units, out = rep.get("monitoring_units"), []
    known = isinstance(units, dict) and "error" not in units  # read by this collector: {} means none installed
    units = units if known else {}
    redeploy = f"invoke deploy -i {inv} --tags monitoring (starts them as planned)"
    if rep.get("prometheus") is None:
        where = f"127.0.0.1:{port or rep.get('prometheus_port') or '?'}"
        state = f"unit prometheus.service {unit_state(units.get('prometheus.service'))}" if known else \
            "its unit's state unknown"
        out.append(Finding(ATTENTION, f"prometheus on {host}", f"does not answer on {where} ({state}): no alert is "
                           "evaluated and the front door's refusals are not counted",
                           on_host(inv, host, "journalctl -u prometheus -n 50 --no-pager") + f"; then {redeploy}"))
    grafana = units.get("grafana-server.service")
    # installed and not running; not installed is how grafana_enabled: false leaves a host (the test hosts: no
    # Grafana package is reachable there), so it is no finding
    if known and grafana and grafana.get("ActiveState") != "active":
        out.append(Finding(ATTENTION, f"grafana on {host}", f"unit grafana-server.service {unit_state(grafana)}: "
                           "the dashboards do not answer",
                           on_host(inv, host, "journalctl -u grafana-server -n 50 --no-pager") + f"; then {redeploy}"))
    return out


def _alerts(inv: str, host: str, prom: dict[str, Any]) -> list[Finding]:
    if prom.get("error"):
        return [Finding(ATTENTION, f"prometheus on {host}", prom["error"],
                        on_host(inv, host, "journalctl -u prometheus -n 50 --no-pager"))]
    out = []
    for a in prom.get("alerts") or []:
        level = ATTENTION if a.get("state") == "firing" else NOTE
        out.append(Finding(level, f"alert {a.get('name')}", f"{a.get('state')} since {a.get('active_at')}: "
                           f"{a.get('summary') or a.get('labels')}",
                           f"open http://{host}:9090/alerts (monitoring/rules/pdstack.rules.yml says what it means)"))
    return out


def _smoke(inv: str, smoke: dict[str, Any] | None, now: float) -> list[Finding]:
    if not smoke:
        return [Finding(NOTE, "smoke", "no smoke result on this controller for this inventory",
                        f"invoke deploy -i {inv} (its last phase runs the gates)")]
    if smoke.get("error"):
        return [Finding(ATTENTION, "smoke", smoke["error"], f"invoke deploy -i {inv}")]
    if not smoke.get("passed"):
        return [Finding(ATTENTION, "smoke", f"the last smoke run ({ago(smoke.get('age_s'))}) failed: "
                        + ", ".join(smoke.get("failed") or ["?"]), f"less {smoke.get('dir')}/summary.txt")]
    return []
