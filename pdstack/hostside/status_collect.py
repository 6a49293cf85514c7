"""What `pdstack status` reads on one host, as one JSON object on stdout. It only reads: nothing here changes a unit,
a file or a server.

The controller runs this file through Ansible (`ansible -m script`, the inventory and connection site.yml uses) with
the host's own python3 (standard library only), so it works exactly when the serving containers do not. What it reads
is this host's part of the plan, /etc/pdstack/plan.json (roles/facts writes it), and from it:

- each server's unit (`systemctl show`), its restarts in the last hour (systemd's own "Started" journal entries), its
  container's image against the plan's (`docker inspect`), its /health on 127.0.0.1;
- on the router host: the router unit, its /workers and circuit breakers (its Prometheus port), the front door
  (HAProxy's runtime API: `show stat`, the maintenance switch), the watchdog's config, state file and timer;
- where Prometheus listens on 127.0.0.1 (a monitoring host): its firing alerts and the front door's refusals of the
  last 5 minutes by reason; on every host the monitoring units' states (prometheus, grafana-server: only those
  installed), so a monitoring host whose Prometheus does not answer says why; where dcgm-exporter listens (GPU
  hosts): GPU memory and utilisation.
A part that cannot be read is recorded under its own `error`, never a traceback: the controller judges it.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import io
import json
import os
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path
from typing import Any

from pdstack.hostside import haproxy

PLAN = "/etc/pdstack/plan.json"
IMAGES = "/etc/pdstack/images.json"
WATCHDOG_CONFIG = "/etc/pdstack/watchdog.json"
UNIT_PROPS = ("Id", "LoadState", "ActiveState", "SubState", "Result", "NRestarts", "ActiveEnterTimestamp",
              "ExecMainStatus", "UnitFileState", "LastTriggerUSec")
STARTED = "39f53479d3a045ac8e11786248231fbf"  # systemd's catalog: "Unit ... has finished starting up"
MONITORING_UNITS = ("prometheus.service", "grafana-server.service")
HOUR_S = 3600.0
TIMEOUT_S = 3.0


def _run(argv: list[str], timeout: float = 10.0) -> tuple[int, str, str]:
    try:
        p = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
        return p.returncode, p.stdout, p.stderr.strip()
    except (OSError, subprocess.TimeoutExpired) as e:
        return -1, "", str(e)


def http_get(url: str, timeout: float = TIMEOUT_S) -> tuple[int | None, str]:
    """(status, body); status None with the reason as body when nothing answered."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:  # noqa: S310 (loopback URLs from the plan)
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, ValueError) as e:
        return None, str(getattr(e, "reason", e))


# ---------------------------------------------------------------- parsers (pure: unit-tested on recorded text)


def parse_systemctl_show(text: str) -> dict[str, dict[str, str]]:
    """`systemctl show -p ... UNIT...` (blocks separated by a blank line) -> {Id: {property: value}}."""
    units: dict[str, dict[str, str]] = {}
    for block in text.strip().split("\n\n"):
        props = dict(line.split("=", 1) for line in block.splitlines() if "=" in line)
        if props.get("Id"):
            units[props["Id"]] = props
    return units


def systemd_timestamp(value: str) -> float | None:
    """`Wed 2026-12-02 13:01:02 UTC` (systemctl show's form) -> epoch seconds; None for empty or 'n/a'."""
    value = (value or "").strip()
    if not value or value == "n/a":
        return None
    parts = value.split()
    if len(parts) >= 3:
        try:
            t = time.strptime(" ".join(parts[1:3]), "%Y-%m-%d %H:%M:%S")
        except ValueError:
            return None
        zone = parts[3] if len(parts) > 3 else "UTC"
        if zone in ("UTC", "GMT"):
            import calendar
            return float(calendar.timegm(t))
        return time.mktime(t)
    return None


def restarts_last_hour(journal_json: str, now: float) -> dict[str, int]:
    """From `journalctl -o json` lines of systemd's "Started" entries (oldest first): per unit, the starts in the last
    hour that followed an earlier start (the first start a journal holds is a deploy, not a restart)."""
    seen: set[str] = set()
    out: dict[str, int] = {}
    for line in journal_json.splitlines():
        try:
            e = json.loads(line)
            unit, ts = e["UNIT"], int(e["__REALTIME_TIMESTAMP"]) / 1e6
        except (ValueError, KeyError, TypeError):
            continue
        out.setdefault(unit, 0)
        if unit in seen and now - ts < HOUR_S:
            out[unit] += 1
        seen.add(unit)
    return out


def parse_haproxy_stat(text: str) -> dict[str, dict[str, str]]:
    """HAProxy's `show stat` CSV -> {"proxy/svname": row}."""
    text = text.lstrip("# ")
    rows = csv.DictReader(io.StringIO(text))
    return {f"{r.get('pxname')}/{r.get('svname')}": r for r in rows if r.get("pxname")}


def _int(v: Any) -> int:
    try:
        return int(v)
    except (TypeError, ValueError):
        return 0


def frontdoor_counts(stat: dict[str, dict[str, str]]) -> dict[str, Any]:
    """In flight, queued, the router server's state and the refusals since HAProxy started, by reason."""
    server = stat.get("pdstack_router/router", {})
    backend = stat.get("pdstack_router/BACKEND", {})
    return {
        "in_flight": _int(server.get("scur")), "slots": _int(server.get("slim")),
        "queued": _int(backend.get("qcur")), "queue_limit": _int(server.get("qlimit")),
        "router_status": server.get("status", "") or "absent",
        "requests_total": _int(stat.get("pdstack/FRONTEND", {}).get("req_tot")),
        "refused_total": {
            "queue-full": _int(stat.get("pdstack_refuse/BACKEND", {}).get("hrsp_4xx")),
            "maintenance": _int(stat.get("pdstack_maintenance/BACKEND", {}).get("hrsp_5xx")),
            "queue-timeout/router-down": _int(backend.get("econ")),
        },
    }


def parse_prom_text(text: str, names: tuple[str, ...]) -> list[tuple[str, dict[str, str], float]]:
    """The samples of `names` in Prometheus' text format: (name, labels, value)."""
    out = []
    for line in text.splitlines():
        if not line or line[0] == "#":
            continue
        name, _, rest = line.partition("{")
        labels: dict[str, str] = {}
        if rest:
            lab, _, value = rest.rpartition("}")
            for part in _split_labels(lab):
                k, _, v = part.partition("=")
                labels[k.strip()] = v.strip().strip('"')
        else:
            name, _, value = line.partition(" ")
        if name.strip() not in names:
            continue
        try:
            out.append((name.strip(), labels, float(value.split()[0])))
        except (ValueError, IndexError):
            continue
    return out


def _split_labels(text: str) -> list[str]:
    parts, cur, quoted = [], "", False
    for ch in text:
        if ch == '"' and not cur.endswith("\\"):
            quoted = not quoted
        if ch == "," and not quoted:
            parts.append(cur)
            cur = ""
        else:
            cur += ch
    return [p for p in [*parts, cur] if p.strip()]


def dcgm_gpus(text: str) -> list[dict[str, Any]]:
    """GPU memory (MiB) and utilisation (%) per GPU from dcgm-exporter's /metrics."""
    names = ("DCGM_FI_DEV_FB_USED", "DCGM_FI_DEV_FB_FREE", "DCGM_FI_DEV_GPU_UTIL")
    gpus: dict[str, dict[str, Any]] = {}
    for name, labels, value in parse_prom_text(text, names):
        g = gpus.setdefault(labels.get("gpu", "?"), {"gpu": labels.get("gpu", "?")})
        g[{"DCGM_FI_DEV_FB_USED": "fb_used_mib", "DCGM_FI_DEV_FB_FREE": "fb_free_mib",
           "DCGM_FI_DEV_GPU_UTIL": "util_pct"}[name]] = value
    return sorted(gpus.values(), key=lambda g: _int(g["gpu"]))


# ---------------------------------------------------------------- readers (each returns data or {"error": ...})


def read_json(path: str) -> dict[str, Any] | None:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as e:
        return {"error": f"{path}: {e}"}


def units(names: list[str]) -> dict[str, Any]:
    rc, out, err = _run(["systemctl", "show", "--no-pager", "-p", ",".join(UNIT_PROPS), *names])
    if rc != 0:
        return {"error": f"systemctl show: {err or rc}"}
    parsed = parse_systemctl_show(out)
    for props in parsed.values():  # epoch seconds, for the controller's "since" (its clock, not this host's format)
        props["active_since"] = systemd_timestamp(props.get("ActiveEnterTimestamp", ""))
    return parsed


def monitoring_units() -> dict[str, Any]:
    """The monitoring units installed here (LoadState loaded), by name; {} where none is, {"error": ...} without
    systemd."""
    got = units(list(MONITORING_UNITS))
    if "error" in got:
        return got
    return {k: v for k, v in got.items() if v.get("LoadState") == "loaded"}


def journal_restarts(names: list[str], now: float) -> dict[str, int] | dict[str, str]:
    rc, out, err = _run(["journalctl", "--no-pager", "-q", "-o", "json", "--output-fields=UNIT",
                         "_PID=1", f"MESSAGE_ID={STARTED}", *[f"UNIT={n}" for n in names]])
    if rc != 0:
        return {"error": f"journalctl: {err or rc}"}
    return restarts_last_hour(out, now)


def containers(names: list[str], image: str) -> dict[str, Any]:
    rc, out, err = _run(["docker", "inspect", *names], timeout=10)
    found: dict[str, Any] = {}
    try:
        for c in json.loads(out or "[]"):
            found[c["Name"].lstrip("/")] = {"image_ref": c["Config"]["Image"], "image_id": c["Image"],
                                            "running": c["State"]["Running"], "started_at": c["State"]["StartedAt"]}
    except (ValueError, KeyError, TypeError) as e:
        return {"error": f"docker inspect: {e}: {err}"}
    rc, out = 1, ""
    if image:
        rc, out, _ = _run(["docker", "image", "inspect", "--format", "{{.Id}}", image], timeout=10)
    return {"containers": found, "plan_image_id": out.strip() if rc == 0 else None,
            "error": None if found or rc == 0 else (err or "docker inspect failed")}


def runtime_api(sock: str, command: str) -> str:
    return haproxy.runtime_api(sock, command, TIMEOUT_S)


def frontdoor(fd: dict[str, Any]) -> dict[str, Any]:
    sock = fd.get("runtime_socket") or "/run/haproxy/admin.sock"
    try:
        stat = parse_haproxy_stat(runtime_api(sock, "show stat"))
        acl = runtime_api(sock, f"show acl {fd.get('maintenance_file')}") if fd.get("maintenance_file") else ""
    except OSError as e:
        return {"error": f"HAProxy's runtime API {sock}: {e}"}
    out = frontdoor_counts(stat)
    out["maintenance"] = any(line.split()[-1:] == ["on"] for line in acl.splitlines())
    return out


def router(r: dict[str, Any]) -> dict[str, Any]:
    base = (r.get("internal_url") or "").rstrip("/")
    status, body = http_get(base + "/workers")
    out: dict[str, Any] = {"workers_status": status}
    try:
        out["workers"] = [{k: w.get(k) for k in ("url", "worker_type", "is_healthy", "id")}
                          for w in json.loads(body).get("workers", [])] if status == 200 else None
    except (ValueError, AttributeError) as e:
        out["workers"], out["workers_error"] = None, str(e)
    if status != 200:
        out["workers_error"] = body[:200]
    out["readiness"] = http_get(base + "/readiness")[0]
    mstatus, mbody = http_get(f"http://127.0.0.1:{r.get('prometheus_port')}/metrics")
    out["circuit"] = {lab.get("worker", "?"): value for _, lab, value in
                      parse_prom_text(mbody, ("smg_worker_cb_state",))} if mstatus == 200 else None
    return out


def prometheus(port: int) -> dict[str, Any] | None:
    base = f"http://127.0.0.1:{port}/api/v1"
    status, body = http_get(base + "/alerts")
    if status is None:
        return None  # no Prometheus on this host
    try:
        alerts = [{"name": a["labels"].get("alertname"), "state": a.get("state"), "labels": a["labels"],
                   "summary": a.get("annotations", {}).get("summary", ""), "active_at": a.get("activeAt")}
                  for a in json.loads(body)["data"]["alerts"]]
    except (ValueError, KeyError, TypeError) as e:
        return {"error": f"{base}/alerts answered {status}: {e}"}
    out: dict[str, Any] = {"alerts": alerts, "refused_5m": {}, "requests_5m": {}}
    queries = {
        "queue-full": 'increase(haproxy_backend_http_responses_total{proxy="pdstack_refuse"}[5m])',
        "maintenance": 'increase(haproxy_backend_http_responses_total{proxy="pdstack_maintenance"}[5m])',
        "queue-timeout/router-down": 'increase(haproxy_backend_connection_errors_total{proxy="pdstack_router"}[5m])',
        "requests": 'increase(haproxy_frontend_http_requests_total{proxy="pdstack"}[5m])',
    }
    for reason, q in queries.items():
        s, b = http_get(base + "/query?" + urllib.parse.urlencode({"query": f"sum by (host) ({q})"}))
        try:
            for r in json.loads(b)["data"]["result"] if s == 200 else []:
                host = r["metric"].get("host", "?")
                value = round(float(r["value"][1]))
                if reason == "requests":
                    out["requests_5m"][host] = value
                else:
                    out["refused_5m"].setdefault(host, {})[reason] = value
        except (ValueError, KeyError, TypeError, IndexError):
            continue
    return out


def dcgm(port: int) -> dict[str, Any] | None:
    status, body = http_get(f"http://127.0.0.1:{port}/metrics")
    return {"gpus": dcgm_gpus(body)} if status == 200 else None


def health(port: int) -> dict[str, Any]:
    t0 = time.monotonic()
    status, body = http_get(f"http://127.0.0.1:{port}/health")
    return {"status": status, "seconds": round(time.monotonic() - t0, 3), "error": None if status else body}


# ---------------------------------------------------------------- the whole host


def collect(plan_path: str, *, prometheus_port: int, dcgm_port: int, images_path: str = IMAGES,
            watchdog_path: str = WATCHDOG_CONFIG) -> dict[str, Any]:
    """The host's report. The ports come from the controller (the roles' defaults, the plan's): one source."""
    now = time.time()
    out: dict[str, Any] = {"host": socket.gethostname(), "time": now, "plan_file": plan_path}
    plan = read_json(plan_path)
    if plan is None or "error" in plan:
        out["plan"] = None
        out["plan_error"] = (plan or {}).get("error") or f"{plan_path} does not exist (not deployed here)"
        plan = {}
    else:
        model = plan.get("model") or {}
        out["plan"] = {"inventory": plan.get("inventory"), "engine": plan.get("engine"), "image": plan.get("image"),
                       "profile": plan.get("environment"),
                       "index_keys": model.get("index_k_dtype"), "index_reader": model.get("index_reader"),
                       "host_settings": plan.get("host_settings")}
    servers = plan.get("servers") or []
    rt = plan.get("router") or None
    names = [s["unit"] for s in servers] + (["pdstack-router.service", "haproxy.service", "pdstack-watchdog.timer",
                                             "pdstack-watchdog.service"] if rt else [])
    with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
        jobs = {
            "units": pool.submit(units, names) if names else None,
            # the watchdog's oneshot service "starts" every interval: only long-running units' restarts count
            "restarts": pool.submit(journal_restarts, [n for n in names if "watchdog" not in n], now)
            if names else None,
            "docker": pool.submit(containers, [s["container"] for s in servers] + (["pdstack-router"] if rt else []),
                                  plan.get("image", "")) if servers or rt else None,
            "health": {s["name"]: pool.submit(health, s["ports"]["http"]) for s in servers},
            "router": pool.submit(router, rt) if rt else None,
            "frontdoor": pool.submit(frontdoor, rt.get("frontdoor") or {}) if rt else None,
            "prometheus": pool.submit(prometheus, prometheus_port),
            "monitoring_units": pool.submit(monitoring_units),
            "dcgm": pool.submit(dcgm, dcgm_port) if plan.get("engine") == "sglang" else None,
        }
        got = {k: (v.result() if hasattr(v, "result") else v) for k, v in jobs.items() if k != "health"}
        got["health"] = {k: f.result() for k, f in jobs["health"].items()}
    out["units"] = got["units"] or {}
    out["restarts_1h"] = got["restarts"] or {}
    out["docker"] = got["docker"] or {}
    out["servers"] = [{"name": s["name"], "role": s["role"], "unit": s["unit"], "container": s["container"],
                       "port": s["ports"]["http"], "health": got["health"][s["name"]]} for s in servers]
    out["router"] = None if not rt else {**got["router"], "unit": "pdstack-router.service",
                                         "container": "pdstack-router"}
    out["planned_workers"] = [{"name": w.get("name"), "role": role, "url": w.get("url")}
                              for role in ("prefill", "decode") for w in (rt or {}).get(role) or []]
    out["frontdoor"] = got["frontdoor"]
    out["prometheus"] = got["prometheus"]
    out["prometheus_port"] = prometheus_port
    out["monitoring_units"] = got["monitoring_units"]
    out["dcgm"] = got["dcgm"]
    out["images"] = read_json(images_path)
    if rt:
        cfg = read_json(watchdog_path)
        out["watchdog"] = None if cfg is None else watchdog(cfg)
    else:
        out["watchdog"] = None
    return out


def watchdog(cfg: dict[str, Any]) -> dict[str, Any]:
    if "error" in cfg:
        return {"error": cfg["error"]}
    state = read_json(cfg.get("state_file") or "/var/lib/pdstack/watchdog.json")
    return {"config": {k: cfg.get(k) for k in ("failures_before_restart", "max_restarts_per_hour", "state_file")},
            "state": state or {}, "error": (state or {}).get("error")}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="status_collect.py", description=__doc__.splitlines()[0])
    p.add_argument("--plan", default=PLAN)
    p.add_argument("--prometheus-port", type=int, required=True, help="Prometheus' port on a monitoring host")
    p.add_argument("--dcgm-port", type=int, required=True, help="dcgm-exporter's port on a GPU host")
    a = p.parse_args(argv)
    os.environ.setdefault("SYSTEMD_COLORS", "0")  # systemctl's and journalctl's output is parsed, not shown
    json.dump(collect(a.plan, prometheus_port=a.prometheus_port, dcgm_port=a.dcgm_port), sys.stdout)
    sys.stdout.write("\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
