"""Drain and undrain one server for a rolling restart (roles/serving/tasks/restart.yml runs it; stdlib only).

Two ways to keep clients from noticing a restart (the plan's `rollout.drain` for the server):

  router     the server has a peer of its role: take it out of sglang-router (DELETE /workers/{id}), wait until the
             router no longer lists it; after the restart put it back (POST /workers) and wait until it is healthy
  frontdoor  the only server of its role: the front door's maintenance switch (an HAProxy ACL, set through the
             runtime API socket) answers new requests 503 + Retry-After while those in flight finish

Subcommands (each prints one JSON object on stdout; exit 0 = done, 1 = failed with the reason on stderr, 2 = usage):

  mode         --router URL --drain router|frontdoor --socket PATH [--hold-file PATH --hold-seconds S
               --hold-reason TEXT]: which way applies now ("none" when no router answers /workers yet, a first
               deploy, or the front door's socket is missing); with --hold-*, it also holds the watchdog (`hold`),
               whatever the way: the first step of a restart (roles/serving/tasks/restart.yml) is one task
  out          --router URL --worker-url URL [--timeout S]: out of the router (a worker it does not list: unchanged)
  wait         --metrics URL --gauges server|frontdoor [--timeout S]: poll the in-flight gauges until they sum to 0
               on two polls in a row, a second apart (a request routed just before `out` is counted by then);
               {"drained": false} after the timeout is not a failure: the restart goes on (docker stop's grace)
  in           --router URL --worker JSON [--timeout S]: back into the router, wait until it lists it healthy
  maintenance  on|off --socket PATH --acl FILE: the front door's switch (`add acl` / `del acl` on the runtime API)
  hold         --file PATH --seconds S --reason TEXT: the watchdog (pdstack/hostside/watchdog.py) stands down until
               S seconds from now: a planned restart is not a wedge, and its probes fail while the server is down
               or the router has not taken it back yet (counted, they can make it restart the other servers)
  release      --file PATH: the watchdog watches again (the hold also lapses by itself after S seconds)
  finish       --hold-file PATH [--socket PATH --acl FILE]: the restart's `always` step as one task: the front
               door's maintenance off (with --socket; a failure to switch it is reported in the JSON and on
               stderr, not fatal, as a switch that was never on), then `release`; exit 1 only when the hold stays

The routes and the answers are sglang-router 0.3.2's worker API (GET /workers -> {"workers": [{"id", "url",
"is_healthy", ...}]}, DELETE /workers/{id} -> 202, POST /workers -> 202) and HAProxy 2.6's runtime API (an empty
answer means done); tests/test_drain.py runs every subcommand against the real router and the real HAProxy.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time
import urllib.error
import urllib.request

from pdstack.hostside import atomic, haproxy, watchdog_state

# The gauges that count a server's requests in flight (SGLang's names: running, waiting, and the PD queues) and the
# front door's (HAProxy's Prometheus exporter: sessions at and queued for the router backend).
GAUGES = {
    "server": re.compile(r"(?m)^sglang:(?:num_running_reqs|num_queue_reqs|num_prefill_bootstrap_queue_reqs|"
                         r"num_prefill_inflight_queue_reqs|num_decode_prealloc_queue_reqs|"
                         r"num_decode_transfer_queue_reqs)(?:\{[^}]*\})?\s+(\S+)$"),
    "frontdoor": re.compile(r"(?m)^haproxy_(?:server_current_sessions|backend_current_queue)"
                            r"\{[^}]*proxy=\"pdstack_router\"[^}]*\}\s+(\S+)$"),
}
POLL_S = 1.0
# polls in a row that must see nothing in flight (wait_drained)
QUIET_POLLS = 2


class Failed(Exception):
    """The step did not happen; the message says what was asked, what came back, and where to look."""


def _http(method: str, url: str, body: dict | None = None, timeout: float = 10.0) -> tuple[int, str]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:  # noqa: S310 (the plan's URLs: http to a host)
            return r.status, r.read().decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read().decode("utf-8", "replace")
    except (OSError, ValueError) as e:  # refused, timed out, reset: no answer
        return -1, str(e)


def workers(router: str) -> list[dict] | None:
    """The router's workers, or None when it does not answer /workers with 200 and JSON."""
    status, text = _http("GET", router.rstrip("/") + "/workers", timeout=5.0)
    if status != 200:
        return None
    try:
        listed = json.loads(text).get("workers")
    except (ValueError, AttributeError):
        return None
    return listed if isinstance(listed, list) else None


def _listed(router: str, url: str) -> list[dict]:
    return [w for w in workers(router) or [] if isinstance(w, dict) and w.get("url") == url]


def mode(router: str, drain: str, sock: str, acl: str | None = None) -> dict:
    if workers(router) is None:
        return {"mode": "none", "reason": f"{router}/workers does not answer: no router serves yet"}
    if drain == "frontdoor" and not os.path.exists(sock):
        return {"mode": "none", "reason": f"the front door's runtime socket {sock} is missing: no front door"}
    if drain == "frontdoor" and acl and not _acl_loaded(sock, acl):
        # HAProxy runs, but not pdstack's configuration (Debian's own, with the same socket: an earlier run stopped
        # before the front door phase), so no client reaches these servers through it: nothing to switch
        return {"mode": "none", "reason": f"the HAProxy at {sock} does not carry the maintenance switch {acl}: the "
                                          "front door is not configured yet"}
    return {"mode": drain, "reason": ""}


def _acl_loaded(sock: str, acl: str) -> bool:
    """Whether the running HAProxy loaded the ACL file `acl` (runtime API `show acl`: `ID (FILE) ...` a line)."""
    return any(f"({acl})" in line for line in runtime_api(sock, "show acl").splitlines())


def _until(done, timeout: float) -> int:
    """Poll `done()` every POLL_S until it is true; the number of polls, or 0 after `timeout` seconds."""
    deadline, polls = time.monotonic() + timeout, 0
    while True:
        polls += 1
        if done():
            return polls
        if time.monotonic() >= deadline:
            return 0
        time.sleep(POLL_S)


def take_out(router: str, url: str, timeout: float) -> dict:
    listed = _listed(router, url)
    if not listed:
        return {"changed": False, "msg": f"the router does not list {url}"}
    for w in listed:
        status, text = _http("DELETE", f"{router.rstrip('/')}/workers/{w.get('id')}")
        if status not in (200, 202, 404):
            raise Failed(f"DELETE {router}/workers/{w.get('id')} ({url}) answered {status}: {text[:200]}")
    if not _until(lambda: not _listed(router, url), timeout):
        raise Failed(f"the router still lists {url} {timeout:.0f} s after DELETE /workers/{{id}}")
    return {"changed": True, "msg": f"{url} is out of the router", "ids": [w.get("id") for w in listed]}


def put_back(router: str, worker: dict, timeout: float) -> dict:
    url = worker.get("url")
    if not isinstance(url, str) or not url:
        raise Failed(f"the worker to put back has no url: {json.dumps(worker)[:200]}")
    changed = False
    if not _listed(router, url):
        status, text = _http("POST", router.rstrip("/") + "/workers", worker)
        if status not in (200, 201, 202):
            raise Failed(f"POST {router}/workers for {url} answered {status}: {text[:200]}")
        changed = True
    if not _until(lambda: any(w.get("is_healthy") for w in _listed(router, url)), timeout):
        raise Failed(f"the router does not list {url} healthy {timeout:.0f} s after POST /workers "
                     f"(its log: journalctl -u pdstack-router)")
    return {"changed": changed, "msg": f"{url} is back in the router, healthy"}


def in_flight(metrics_url: str, gauges: str) -> float | None:
    """The sum of the in-flight gauges, or None when the metrics do not answer."""
    status, text = _http("GET", metrics_url, timeout=5.0)
    if status != 200:
        return None
    return sum(float(v) for v in GAUGES[gauges].findall(text))


def wait_drained(metrics_url: str, gauges: str, timeout: float) -> dict:
    """Drained: the gauges sum to 0 on QUIET_POLLS polls in a row (POLL_S apart). One zero is not enough: a request
    the router sent just before `out` took the server out (or one still in a socket, not yet counted) shows up in
    the gauges a moment later, and a restart then would cut it off (the router answers it 502)."""
    last: list[float | None] = [None]
    zeros = [0]

    def drained() -> bool:
        last[0] = in_flight(metrics_url, gauges)
        zeros[0] = zeros[0] + 1 if last[0] == 0 else 0
        return zeros[0] >= QUIET_POLLS

    polls = _until(drained, timeout)
    return {"changed": False, "drained": bool(polls), "polls": polls, "in_flight": last[0]}


def runtime_api(sock: str, command: str, timeout: float = 5.0) -> str:
    """One command on HAProxy's runtime API (a unix socket); its answer, stripped."""
    if "\n" in command or "\r" in command or ";" in command:
        raise Failed(f"refusing a runtime API command with a line break or ';': {command!r}")
    try:
        return haproxy.runtime_api(sock, command, timeout).strip()
    except OSError as e:
        raise Failed(f"the front door's runtime API at {sock}: {e} (is haproxy running? systemctl status "
                     f"haproxy)") from e


def maintenance(state: str, sock: str, acl: str) -> dict:
    if state == "on":
        answer = runtime_api(sock, f"add acl {acl} on")
        if answer:
            raise Failed(f"the front door refused `add acl {acl} on`: {answer}")
        return {"changed": True, "msg": "maintenance on: new requests get 503 + Retry-After"}
    answer = runtime_api(sock, f"del acl {acl} on")
    # not set (a run that failed before switching it on): nothing to undo
    return {"changed": not answer, "msg": "maintenance off" + (f" ({answer})" if answer else "")}


def hold(path: str, seconds: float, reason: str) -> dict:
    """Write the watchdog's hold file: {"until": epoch seconds, "reason": text}, atomically (the watchdog reads it
    with pdstack/hostside/watchdog.py's read_hold; tests/test_watchdog.py writes it with this function)."""
    if not 0 < seconds <= watchdog_state.MAX_HOLD_S:
        raise Failed(f"--seconds {seconds:g}: a hold lasts more than 0 and at most {watchdog_state.MAX_HOLD_S} s")
    until = time.time() + seconds
    try:
        atomic.write(path, json.dumps({"until": until, "reason": reason}))
    except OSError as e:
        raise Failed(f"cannot write the watchdog's hold file {path}: {e}") from e
    return {"changed": True, "until": until, "msg": f"watchdog held for {seconds:g} s: {reason}"}


def release(path: str) -> dict:
    try:
        os.unlink(path)
    except FileNotFoundError:
        return {"changed": False, "msg": "no hold to release"}
    except OSError as e:
        raise Failed(f"cannot remove the watchdog's hold file {path}: {e}") from e
    return {"changed": True, "msg": "watchdog released"}


def finish(hold_file: str, sock: str | None, acl: str | None) -> dict:
    """Maintenance off (when `sock`), then the hold released, the second whatever the first did."""
    out: dict = {"changed": False, "maintenance": None}
    if sock:
        try:
            out["maintenance"] = maintenance("off", sock, acl or "")
            out["changed"] = out["maintenance"]["changed"]
        except Failed as e:
            out["maintenance"] = {"changed": False, "error": str(e)}
            print(f"drain.py finish: maintenance off: {e}", file=sys.stderr)
    out["release"] = release(hold_file)
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="drain.py", description=__doc__.split("\n", 1)[0])
    sub = ap.add_subparsers(dest="cmd", required=True)
    m = sub.add_parser("mode")
    m.add_argument("--router", required=True)
    m.add_argument("--drain", required=True, choices=["router", "frontdoor"])
    m.add_argument("--socket", required=True)
    m.add_argument("--acl", help="the maintenance switch's ACL file: without it loaded, the front door is not "
                   "pdstack's yet (mode none)")
    m.add_argument("--hold-file", help="also hold the watchdog (as `hold --file`): the plan's "
                   "rollout.watchdog_hold_file")
    m.add_argument("--hold-seconds", type=float)
    m.add_argument("--hold-reason")
    o = sub.add_parser("out")
    o.add_argument("--router", required=True)
    o.add_argument("--worker-url", required=True)
    o.add_argument("--timeout", type=float, default=30.0)
    w = sub.add_parser("wait")
    w.add_argument("--metrics", required=True)
    w.add_argument("--gauges", required=True, choices=sorted(GAUGES))
    w.add_argument("--timeout", type=float, default=60.0)
    i = sub.add_parser("in")
    i.add_argument("--router", required=True)
    i.add_argument("--worker", required=True, help="the worker as JSON (the plan's rollout.worker)")
    i.add_argument("--timeout", type=float, default=60.0)
    mt = sub.add_parser("maintenance")
    mt.add_argument("state", choices=["on", "off"])
    mt.add_argument("--socket", required=True)
    mt.add_argument("--acl", required=True)
    h = sub.add_parser("hold")
    h.add_argument("--file", required=True, help="the plan's rollout.watchdog_hold_file")
    h.add_argument("--seconds", required=True, type=float)
    h.add_argument("--reason", required=True)
    r = sub.add_parser("release")
    r.add_argument("--file", required=True)
    f = sub.add_parser("finish")
    f.add_argument("--hold-file", required=True)
    f.add_argument("--socket", help="the front door's runtime socket: switch maintenance off (frontdoor mode)")
    f.add_argument("--acl")
    a = ap.parse_args(argv)
    if a.cmd == "mode" and len({a.hold_file is None, a.hold_seconds is None, a.hold_reason is None}) > 1:
        ap.error("mode: --hold-file, --hold-seconds and --hold-reason go together (all three or none)")
    if a.cmd == "finish" and bool(a.socket) != bool(a.acl):
        ap.error("finish: --socket and --acl go together (the front door's maintenance switch)")
    try:
        if a.cmd == "mode":
            # mode first (it only reads; a failure leaves no hold behind, and this task is before the restart's
            # block, so no `always` would release one), then the hold: a restart that cannot hold the watchdog
            # fails here, before anything changed
            out = mode(a.router, a.drain, a.socket, a.acl)
            if a.hold_file is not None:
                out["hold"] = hold(a.hold_file, a.hold_seconds, a.hold_reason)
        elif a.cmd == "out":
            out = take_out(a.router, a.worker_url, a.timeout)
        elif a.cmd == "wait":
            out = wait_drained(a.metrics, a.gauges, a.timeout)
        elif a.cmd == "in":
            try:
                worker = json.loads(a.worker)
            except ValueError as e:
                raise Failed(f"--worker is not JSON: {e}") from e
            if not isinstance(worker, dict):
                raise Failed("--worker must be a JSON object (the plan's rollout.worker)")
            out = put_back(a.router, worker, a.timeout)
        elif a.cmd == "hold":
            out = hold(a.file, a.seconds, a.reason)
        elif a.cmd == "release":
            out = release(a.file)
        elif a.cmd == "finish":
            out = finish(a.hold_file, a.socket, a.acl)
        else:
            out = maintenance(a.state, a.socket, a.acl)
    except Failed as e:
        print(f"drain.py {a.cmd}: {e}", file=sys.stderr)
        return 1
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
