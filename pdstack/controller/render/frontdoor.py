"""The front door: HAProxy's configuration, rendered from the plan's `router.frontdoor` (plan.json as a dict).

sglang-router 0.3.2's own limiter is a token bucket, not a concurrency cap (docs/facts.md, sglang-router 0.3.2), so
admission lives in HAProxy (Debian's haproxy 2.6) in front of it, on the deployment's public port:

- at most `max_concurrent_requests` (N) requests in flight to the router: the one server's `maxconn N`;
- up to `queue_size` (Q) more wait in HAProxy's backend queue and are sent, in order, as soon as a slot frees;
- beyond N + Q: refused at once with 429 + Retry-After. HAProxy has no queue-length cap of its own (a server's
  `maxqueue` only redispatches), so the frontend routes a request to the `pdstack_refuse` backend, which answers 429,
  when every slot is busy and the queue holds Q (`srv_conn` and `queue` ACLs); the refusals then have their own
  counter in HAProxy's Prometheus exporter (haproxy_backend_http_responses_total{proxy="pdstack_refuse"});
- a request that waited `queue_timeout_secs` without a slot: 503 + Retry-After. HAProxy answers a queue timeout with
  503 ("sQ" in its log) and we keep it: 503 says "the server is overloaded, retry later", which is what happened;
  408 would claim the *client* was too slow to send its request, and OpenAI-style clients retry both;
- a request takes a slot only once it arrived whole (`http-request wait-for-body`, bounded by
  request_read_timeout_secs: else 408), bodies over max_body_bytes get 413; the public bind keeps METRICS_HEADROOM
  connections of the global maxconn for the metrics listener; HAProxy's own errors are OpenAI-shaped JSON;
- response streams pass through unbuffered (`option http-no-delay`); a client that goes
  away frees its slot, and a waiter that goes away leaves the queue (`option abortonclose`);
- one time budget B (pdstack_router.request_timeout_secs): `timeout server` is B, so a request the router has not
  answered within B gets HAProxy's 504 JSON (`gateway-timeout`) and HAProxy closes the router connection; the
  router's own --request-timeout-secs is B + ROUTER_TIMEOUT_MARGIN (planner), so it never times out an attempt
  first and never retries a timed-out request (0.3.2 retries a timed-out non-stream attempt, measured); a stream
  runs at most B + margin (the router cuts it: no error event, no [DONE], measured) and may pause B between chunks;
  `timeout client` (client_timeout_secs) lets a client go that reads nothing for that long once HAProxy's
  buffers towards it are full; `hard-stop-after` bounds how long an old worker keeps draining after a reload;
- every answer carries the request's id in X-Request-Id (`unique-id`, a UUID HAProxy makes; the client's own
  X-Request-Id is replaced), which the router echoes and HAProxy's log line carries (`%ID`, with the router's
  x-smg-error-code), so an error a client reports is found in the logs;
- the router's errors leave as OpenAI-shaped JSON too: a 5xx body is never passed on (it names internal
  addresses and workers: "error sending request for url (http://127.0.0.1:...)"); a 4xx that is not JSON is
  wrapped (its text kept as the message unless it names an address); `Server` and x-smg-error-code are dropped;
- the public port is an allow-list (PUBLIC_ROUTES): the exact request targets clients need, each with its
  methods; any other target (the router's worker-management API, /flush_cache, /get_model_info, ..., in any
  spelling: case, `//`, `..`, percent-encoding, absolute-form, `;`, a query string) gets a JSON 404 naming nothing
  internal, another method a JSON 405 with `Allow`. The router's control API is reached only on the router host's
  loopback (pdstack's drain, watchdog and status);
- HTTP/1.1 only (`proto h1`): the per-source share counts connections (HAProxy 2.6's stick tables have no count of
  requests in flight), and one HTTP/1.1 connection carries one request at a time, while one HTTP/2 connection
  carries up to 100;
- no CORS by default: the router's `Access-Control-*` headers are removed from every answer; with
  `cors_origins` set, exactly those origins get a preflight answer and `Access-Control-Allow-Origin`;
- on the model routes (MODEL_ROUTES) the JSON body must name a served model where HAProxy reads it (a top-level
  "model", json_query): a body without one gets 400 `model_required`, another name 404 `model_not_found`, as
  OpenAI's API answers, and a key "model" spelled with \\u escapes (which the router decodes and HAProxy does not)
  400; a duplicate key is the router's own 400 (serde refuses it, measured);
- HAProxy's built-in Prometheus exporter (`use-service prometheus-exporter`) on its own port;
- every refusal of the front door's own says why, in the `X-Pdstack-Refusal` header and the body's "type":
  `queue-full` (429), `queue-timeout` (503), `router-down` (503: its health check failed, or a connection to it
  did), `maintenance` (503: the maintenance switch is on while the only server of a role restarts, roles/serving).
  Each carries Retry-After. Only a 503 with `router-down` means the deployment is broken; the others are "retry".

With N = -1 (admission off) no maxconn and no refusal rule are rendered.
"""

from __future__ import annotations

import argparse
import sys
from typing import Any

from pdstack.controller.plan.planner import MAINTENANCE_FILE, RUNTIME_SOCKET
from pdstack.controller.render.encoders import (
    haproxy_address,
    haproxy_text,
    json_text,
    read_plan,
    write_or_refuse,
)
from pdstack.controller.render.frontdoor_answers import (
    BODY_TOO_LARGE,
    BODY_TYPES,
    CLIENT_ERRORS,
    HAPROXY_ERRORS,
    MAINTENANCE,
    MESSAGES,
    METHOD_NOT_ALLOWED,
    MODEL_NOT_FOUND,
    MODEL_REQUIRED,
    NOT_FOUND,
    QUEUE_FULL,
    QUEUE_TIMEOUT,
    REFUSAL_HEADER,
    ROUTER_DOWN,
    SERVER_ERRORS,
    SOURCE_LIMIT,
    UPSTREAM_ERROR,
    UPSTREAM_REFUSED,
    json_error,
    json_error_lf,
)
from pdstack.controller.render.readers import Directive

BACKEND = "pdstack_router"
REFUSE_BACKEND = "pdstack_refuse"
MAINTENANCE_BACKEND = "pdstack_maintenance"
FRONTEND = "pdstack"
SERVER = "router"
# The public port's API, an allow-list: the exact request target (path, no query) -> the methods it takes.
# OpenAI's chat, completions and model list as sglang-router 0.3.2 serves them (it has no /v1/models/{id}: 404,
# measured), SGLang's native /generate (public: SGLang's own clients and bench client speak it, and the deploy
# gates (probe, recall, C=1 bench) must measure the path clients take), the router's liveness (/health: the router
# answers) and readiness (/readiness: a healthy prefill and decode behind it). GET includes HEAD (HAProxy METH_GET).
PUBLIC_ROUTES: dict[str, str] = {
    "/v1/chat/completions": "POST",
    "/v1/completions": "POST",
    "/v1/models": "GET",
    "/generate": "POST",
    "/health": "GET",
    "/readiness": "GET",
}
# the routes whose JSON body must name a served model (OpenAI's API requires "model" there)
MODEL_ROUTES = ("/v1/chat/completions", "/v1/completions")
# a key that decodes to "model" but is spelled with at least one \u escape (the router decodes it, HAProxy's
# json_query does not); -i: hex digits in either case (a plain "Model" is another key, and not matched)
ESCAPED_MODEL_KEY = (r'"(?!model")(?:m|\\u006d)(?:o|\\u006f)(?:d|\\u0064)(?:e|\\u0065)(?:l|\\u006c)"'
                     r'[ \t\r\n]*:')
# CORS, only for the origins an inventory allows: what a browser's preflight is told
CORS_MAX_AGE_SECS = 600
# the request id: HAProxy makes one per request (a UUID), sends it to the router (which echoes it) and to the client
REQUEST_ID_HEADER = "X-Request-Id"
REQUEST_ID = "%[unique-id]"
# HAProxy's httplog format (configuration.txt 8.2.3) with the request id and the captured response header (the
# router's x-smg-error-code) at the end
LOG_FORMAT = ("%ci:%cp [%tr] %ft %b/%s %TR/%Tw/%Tc/%Tr/%Ta %ST %B %CC %CS %tsc %ac/%fc/%bc/%sc/%rc %sq/%bq "
              "%hr %hs %{+Q}r id=%ID")
# an answer body that names an address or a URL is never passed on (a router 4xx that relays a worker's message)
LEAK_REGEX = r"https?://|[0-9]+\.[0-9]+\.[0-9]+\.[0-9]+|localhost|\[::"
# connections the public listener leaves to the metrics/health listener under HAProxy's global maxconn
METRICS_HEADROOM = 64
# tune.bufsize above max_body_bytes: room for the request line and headers, so a whole body fits one buffer
BUFFER_HEADROOM = 64 * 1024
# The maintenance switch: an ACL pattern file (empty: off). `add acl FILE on` / `del acl FILE on` on HAProxy's
# runtime API turn it on and off without a reload; a reload (or restart) reads the file again, so it comes back off.
MAINTENANCE_ON = "on"




def haproxy_directives(fd: dict[str, Any], *, log: str = "/dev/log local0", api_key_file: str | None = None,
                       stats_socket: str | None = RUNTIME_SOCKET, user: str | None = None,
                       chroot: str | None = None, maintenance_file: str | None = MAINTENANCE_FILE) -> list[Directive]:
    """haproxy.cfg as directives (section, keyword, args) for the plan's `router.frontdoor` dict; see
    haproxy_config for the arguments. Every word is one value: the encoder (render/encoders.py) quotes or refuses
    it, so no value can add a directive of its own."""
    n, q, t = int(fd["max_concurrent_requests"]), int(fd["queue_size"]), int(fd["queue_timeout_secs"])
    ra = str(int(fd["retry_after_secs"]))
    up = f"srv_is_up({BACKEND}/{SERVER})"
    server_timeout, client_timeout = int(fd["server_timeout_secs"]), int(fd["client_timeout_secs"])
    read_timeout = int(fd.get("request_read_timeout_secs", 10))
    max_body = int(fd.get("max_body_bytes", 4 * 1024 * 1024))
    conns = int(fd["max_connections"])
    per_source = int(fd.get("max_connections_per_source", 0))
    out: list[Directive] = []

    def add(section: str, *words: str) -> None:
        out.append(Directive(tuple(section.split()), words[0], tuple(words[1:])))

    g = "global"
    add(g, "log", *log.split())
    # one thread: the refusal ACLs and the enqueue run in one stream pass, so N + Q is exact (a thread handles far
    # more requests/s than an LLM deployment serves)
    add(g, "nbthread", "1")
    add(g, "maxconn", str(conns))
    # a request is buffered whole before it takes a slot (option http-buffer-request): a body up to max_body_bytes
    # must fit one buffer (buffers are allocated per active stream, not per idle connection)
    add(g, "tune.bufsize", str(max_body + BUFFER_HEADROOM))
    add(g, "hard-stop-after", f"{int(fd['hard_stop_after_secs'])}s")
    if chroot:
        add(g, "chroot", chroot)
    if user:
        add(g, "user", user)
        add(g, "group", user)
    if stats_socket:
        add(g, "stats", "socket", stats_socket, "mode", "660", "level", "admin")
    d = "defaults"
    for words in (("mode", "http"), ("log", "global"), ("option", "dontlognull"),
                  ("option", "http-no-delay"), ("option", "abortonclose"), ("log-format", LOG_FORMAT),
                  ("timeout", "connect", "5s"),
                  ("timeout", "queue", f"{t}s"), ("timeout", "client", f"{client_timeout}s"),
                  ("timeout", "server", f"{server_timeout}s"),
                  ("timeout", "http-request", f"{read_timeout}s"), ("timeout", "http-keep-alive", "10s")):
        add(d, *words)
    def errors(section: str) -> None:
        for status, (reason, message) in HAPROXY_ERRORS.items():
            add(section, "http-error", "status", str(status), "content-type", "application/json", "hdr",
                REFUSAL_HEADER, reason, "hdr", REQUEST_ID_HEADER, REQUEST_ID, "string",
                json_error(message, BODY_TYPES.get(reason, reason.replace("-", "_")), status))

    # in defaults (the backends' 502/504) and again on the frontend: HAProxy 2.6 answers a request it cannot parse
    # (400) with the frontend's own error messages only, not the ones it inherits
    errors(d)
    f = f"frontend {FRONTEND}"
    # below the global maxconn: a flood of idle connections to the public port leaves the metrics/health listener
    # its headroom (else monitoring goes blind exactly when it is needed)
    # HTTP/1.1 only (`proto h1`: no HTTP/2 with prior knowledge, no h2c upgrade): the per-source share below
    # counts connections, and only an HTTP/1.1 connection carries one request at a time
    add(f, "bind", haproxy_address(fd["bind"], int(fd["port"])), "maxconn", str(max(conns - METRICS_HEADROOM, 1)),
        "proto", "h1")
    errors(f)
    # the request id (a UUID per request) goes to the router, which echoes it in its answer, and into the log line
    add(f, "unique-id-format", "%[uuid()]")
    add(f, "http-request", "set-header", REQUEST_ID_HEADER, REQUEST_ID)
    add(f, "declare", "capture", "response", "len", "64")
    rid = ("hdr", REQUEST_ID_HEADER, REQUEST_ID)
    if per_source > 0:
        # one client address holds at most this many connections (in flight, queued or being read): its share.
        # Tracked at accept, so a connection counts itself; ipv6 keys hold IPv4 sources too
        add(f, "stick-table", "type", "ipv6", "size", "100k", "expire", "60s", "store", "conn_cur")
        add(f, "tcp-request", "connection", "track-sc0", "src")
        add(f, "http-request", "return", "status", "429", "content-type", "application/json", "hdr", "Retry-After",
            ra, "hdr", REFUSAL_HEADER, SOURCE_LIMIT, *rid, "string",
            json_error(f"too many connections from your address: at most {per_source} at once",
                        BODY_TYPES[QUEUE_FULL], 429), "if", "{", "sc_conn_cur(0)", "gt", str(per_source), "}")
    _public_api(add, fd, rid)
    if api_key_file:
        add(f, "http-request", "return", "status", "401", "content-type", "application/json", *rid, "string",
            json_error("missing or wrong API key (Authorization: Bearer KEY)", "authentication_error", 401),
            "unless", "{", "req.hdr(authorization)", "-m", "str", "-f", api_key_file, "}")
    too_large = json_error(f"request body too large: over {max_body} bytes", BODY_TYPES[BODY_TOO_LARGE], 413)
    # a slot (a router connection) is taken only once the whole request arrived: a declared body over the limit is
    # refused before it is read, then the body is awaited at most request_read_timeout_secs (else 408), then a
    # chunked body (no Content-Length) over the limit is refused: a client trickling its body holds a connection,
    # never a slot
    for i, fetch in enumerate(("req.hdr_val(content-length)", "req.body_size")):
        if i:
            add(f, "http-request", "wait-for-body", "time", f"{read_timeout}s")
        add(f, "http-request", "return", "status", "413", "content-type", "application/json", "hdr", REFUSAL_HEADER,
            BODY_TOO_LARGE, *rid, "string", too_large, "if", "{", fetch, "gt", str(max_body), "}")
    models = [str(m) for m in fd.get("served_models") or []]
    if models:
        _model_check(add, models, rid)
    if maintenance_file:
        # a planned restart of the only server of a role (roles/serving): new requests get 503 at once, while the
        # ones already in flight or queued finish
        add(f, "acl", "pdstack_maintenance", f"str({MAINTENANCE_ON})", "-m", "str", "-f", maintenance_file)
        add(f, "use_backend", MAINTENANCE_BACKEND, "if", "pdstack_maintenance")
    if n > 0:
        add(f, "acl", "pdstack_slots_full", f"srv_conn({BACKEND}/{SERVER})", "ge", str(n))
        add(f, "acl", "pdstack_queue_full", f"queue({BACKEND})", "ge", str(q))
        add(f, "use_backend", REFUSE_BACKEND, "if", "pdstack_slots_full", "pdstack_queue_full")
    add(f, "default_backend", BACKEND)
    b = f"backend {BACKEND}"
    add(b, "option", "httpchk", "GET", "/liveness")
    add(b, "http-check", "expect", "status", "200")
    # HAProxy's own 503s carry Retry-After and say why: the router is down (its health check failed, or a
    # connection to it failed: `observe layer4` marks it down at the first refused connection, so the answer after
    # HAProxy's retries already knows), else a waiter's queue timeout. One http-error serves both, so its header and
    # body pick by the server's state (log-format, iif).
    add(b, "http-error", "status", "503", "content-type", "application/json", "hdr", "Retry-After", ra,
        "hdr", REFUSAL_HEADER, f"%[{up},iif({QUEUE_TIMEOUT},{ROUTER_DOWN})]", "lf-string", json_error_lf(up))
    # The router's errors as OpenAI-shaped JSON, nothing internal in them: a 5xx body is replaced (its detail, an
    # internal URL or a worker's traceback, stays in the router's log; HAProxy's log line has the request id and the
    # router's x-smg-error-code), a 4xx that is not JSON is wrapped, its text kept unless it names an address
    add(b, "http-response", "wait-for-body", "time", "2s", "if", "{", "status", "ge", "400", "}")
    add(b, "http-response", "capture", "res.hdr(x-smg-error-code)", "id", "0")
    add(b, "http-response", "del-header", "Server")
    add(b, "http-response", "del-header", "x-smg-error-code")
    add(b, "acl", "pdstack_res_json", "res.hdr(content-type)", "-m", "beg", "application/json")
    add(b, "acl", "pdstack_res_leak", "res.body", "-m", "reg", "-i", LEAK_REGEX)
    add(b, "http-response", "set-var-fmt(txn.pdstack_detail)", ": %[res.body,json(utf8s)]", "if", "{", "status",
        "ge", "400", "}", "{", "res.body_size", "gt", "0", "}", "!pdstack_res_leak")
    for status, message in CLIENT_ERRORS.items():
        kind = "rate_limit_exceeded" if status == 429 else "invalid_request_error"
        add(b, "http-response", "return", "status", str(status), "content-type", "application/json", *rid,
            "lf-string", json_error(message + "@DETAIL@", kind, status).replace("@DETAIL@",
                                                                                 "%[var(txn.pdstack_detail)]"),
            "if", "{", "status", str(status), "}", "!pdstack_res_json")
        add(b, "http-response", "return", "status", str(status), "content-type", "application/json", *rid,
            "string", json_error(message, kind, status), "if", "{", "status", str(status), "}", "pdstack_res_leak")
    for status, message in SERVER_ERRORS.items():
        retry = ("hdr", "Retry-After", ra) if status == 503 else ()
        add(b, "http-response", "return", "status", str(status), "content-type", "application/json", *rid, *retry,
            "hdr", REFUSAL_HEADER, UPSTREAM_REFUSED if status == 503 else UPSTREAM_ERROR, "string",
            json_error(message, "upstream_unavailable" if status == 503 else "upstream_error", status),
            "if", "{", "status", str(status), "}")
    add(b, "http-response", "return", "status", "502", "content-type", "application/json", *rid, "hdr",
        REFUSAL_HEADER, UPSTREAM_ERROR, "string",
        json_error("the model server gave an unexpected error", "upstream_error", 502),
        "if", "{", "status", "ge", "400", "}", "!pdstack_res_json")
    limits = ("maxconn", str(n), "maxqueue", str(max(q, 1))) if n > 0 else ()
    add(b, "server", SERVER, haproxy_address(fd["backend_address"], int(fd["backend_port"])), *limits,
        "check", "inter", "2s", "fall", "2", "rise", "1", "observe", "layer4", "error-limit", "1",
        "on-error", "mark-down")
    if n > 0:
        add(f"backend {REFUSE_BACKEND}", "http-request", "return", "status", "429", "content-type",
            "application/json", "hdr", "Retry-After", ra, "hdr", REFUSAL_HEADER, QUEUE_FULL, "string",
            json_error(f"too many requests: {n} in flight and {q} waiting", BODY_TYPES[QUEUE_FULL], 429))
    if maintenance_file:
        add(f"backend {MAINTENANCE_BACKEND}", "http-request", "return", "status", "503", "content-type",
            "application/json", "hdr", "Retry-After", ra, "hdr", REFUSAL_HEADER, MAINTENANCE, "string",
            json_error(MESSAGES[MAINTENANCE], BODY_TYPES[MAINTENANCE], 503))
    m = "frontend pdstack_metrics"
    add(m, "bind", haproxy_address(fd["metrics_bind"], int(fd["metrics_port"])))
    add(m, "no", "log")
    add(m, "http-request", "use-service", "prometheus-exporter", "if", "{", "path", "/metrics", "}")
    add(m, "http-request", "return", "status", "200", "content-type", "text/plain", "string", "ok",
        "if", "{", "path", "/health", "}")
    add(m, "http-request", "return", "status", "404")
    return out


def _route_acls(add, section: str) -> None:
    """One ACL per method group of PUBLIC_ROUTES (pdstack_route_post, pdstack_route_get) and pdstack_route (any):
    the exact request target (`url`: an absolute-form target or a query string is another string), `--` before
    the patterns."""
    by_method: dict[str, list[str]] = {}
    for path, method in PUBLIC_ROUTES.items():
        by_method.setdefault(method, []).append(path)
    for method, paths in by_method.items():
        add(section, "acl", f"pdstack_route_{method.lower()}", "url", "-m", "str", "--", *paths)
    add(section, "acl", "pdstack_route", "url", "-m", "str", "--", *PUBLIC_ROUTES)


def _public_api(add, fd: dict[str, Any], rid: tuple[str, ...]) -> None:
    """The public port serves PUBLIC_ROUTES and nothing else; CORS off unless `cors_origins` names origins."""
    f = f"frontend {FRONTEND}"
    _route_acls(add, f)
    # no protocol switch reaches the router (websocket, h2c): the public API is plain HTTP/1.1 requests
    add(f, "http-request", "del-header", "Upgrade")
    origins = [str(o) for o in fd.get("cors_origins") or []]
    if origins:
        # a browser's preflight from an allowed origin, for a public route: answered here (the headers are set
        # after the response, below, like every other answer's)
        add(f, "acl", "pdstack_cors_origin", "req.fhdr(origin)", "-m", "str", "--", *origins)
        add(f, "http-request", "set-var(txn.pdstack_origin)", "req.fhdr(origin)", "if", "pdstack_cors_origin")
        add(f, "http-request", "set-var(txn.pdstack_preflight)", "bool(true)", "if", "METH_OPTIONS",
            "pdstack_cors_origin", "pdstack_route", "{", "req.hdr(access-control-request-method)", "-m", "found", "}")
        add(f, "http-request", "set-var(txn.pdstack_cors_headers)", "req.fhdr(access-control-request-headers)",
            "if", "{", "var(txn.pdstack_preflight)", "-m", "bool", "}")
        add(f, "http-request", "return", "status", "204", *rid, "if", "{", "var(txn.pdstack_preflight)", "-m",
            "bool", "}")
    methods = ", ".join(sorted({m for m in PUBLIC_ROUTES.values()}))
    add(f, "http-request", "return", "status", "404", "content-type", "application/json", "hdr", REFUSAL_HEADER,
        NOT_FOUND, *rid, "string",
        json_error("no such endpoint: this port serves "
                    + ", ".join(f"{m} {path}" for path, m in PUBLIC_ROUTES.items()), "invalid_request_error", 404),
        "unless", "pdstack_route")
    for method in sorted(set(PUBLIC_ROUTES.values())):
        allow = "GET, HEAD" if method == "GET" else method
        add(f, "http-request", "return", "status", "405", "content-type", "application/json", "hdr", "Allow", allow,
            "hdr", REFUSAL_HEADER, METHOD_NOT_ALLOWED, *rid, "string",
            json_error(f"method not allowed: this endpoint takes {allow}", "invalid_request_error", 405),
            "if", f"pdstack_route_{method.lower()}", f"!METH_{method}")
    # the router answers every request with wildcard CORS (Access-Control-Allow-Origin: *); none leaves here,
    # on any answer (http-after-response: HAProxy's own answers too), except an allowed origin's
    add(f, "http-after-response", "del-header", "Access-Control-", "-m", "beg")
    add(f, "http-after-response", "del-header", "Vary")
    if origins:
        found = ("{", "var(txn.pdstack_origin)", "-m", "found", "}")
        add(f, "http-after-response", "set-header", "Access-Control-Allow-Origin", "%[var(txn.pdstack_origin)]",
            "if", *found)
        add(f, "http-after-response", "set-header", "Vary", "Origin", "if", *found)
        pre = ("if", "{", "var(txn.pdstack_preflight)", "-m", "bool", "}")
        add(f, "http-after-response", "set-header", "Access-Control-Allow-Methods", methods, *pre)
        add(f, "http-after-response", "set-header", "Access-Control-Allow-Headers",
            "%[var(txn.pdstack_cors_headers)]", *pre)
        add(f, "http-after-response", "set-header", "Access-Control-Max-Age", str(CORS_MAX_AGE_SECS), *pre)
        add(f, "http-after-response", "set-header", "Access-Control-Expose-Headers",
            f"{REQUEST_ID_HEADER}, {REFUSAL_HEADER}, Retry-After", "if", *found)


def _model_check(add, models: list[str], rid: tuple[str, ...]) -> None:
    """On MODEL_ROUTES the body must name a served model where HAProxy reads it. OpenAI's API answers an unknown
    model with 404 model_not_found and a missing one with 400; SGLang would serve any name, or none, with the one
    model it runs. The body is whole here (wait-for-body above)."""
    f = f"frontend {FRONTEND}"
    model = "req.body,json_query('$.model')"
    add(f, "acl", "pdstack_model_route", "url", "-m", "str", "--", *MODEL_ROUTES)
    add(f, "acl", "pdstack_model_named", model, "-m", "found")
    # `--` ends the flags: a name such as "-i" is a pattern, not a flag
    add(f, "acl", "pdstack_model_served", model, "-m", "str", "--", *models)
    add(f, "acl", "pdstack_model_escaped", "req.body", "-m", "reg", "-i", ESCAPED_MODEL_KEY)
    for cond, status, code, message in (
            ("pdstack_model_escaped", 400, "model_key_escaped",
             'the key "model" is spelled with \\u escapes; write it plainly ("model")'),
            ("!pdstack_model_named", 400, "model_required",
             'the request names no model: give "model" at the top level of the JSON body (GET /v1/models lists '
             'the served ones); the front door reads it before any value nested over 20 levels deep'),
            ("!pdstack_model_served", 404, "model_not_found",
             "the model named in the request is not served here (GET /v1/models lists the served ones)")):
        reason = MODEL_NOT_FOUND if status == 404 else MODEL_REQUIRED
        add(f, "http-request", "return", "status", str(status), "content-type", "application/json", "hdr",
            REFUSAL_HEADER, reason, *rid, "string",
            json_text({"error": {"message": message, "type": "invalid_request_error", "code": code}}),
            "if", "pdstack_model_route", cond)


def header(fd: dict[str, Any]) -> list[str]:
    n, q, t = int(fd["max_concurrent_requests"]), int(fd["queue_size"]), int(fd["queue_timeout_secs"])
    return ["pdstack front door: admission control in front of sglang-router (pdstack/controller/render/frontdoor.py).",
            f"{'at most ' + str(n) + ' in flight to the router, ' + str(q) + ' waiting' if n > 0 else 'admission off'}"
            f"; beyond: 429 + Retry-After; queued over {t} s: 503 + Retry-After."]


def haproxy_config(fd: dict[str, Any], *, log: str = "/dev/log local0", api_key_file: str | None = None,
                   stats_socket: str | None = RUNTIME_SOCKET, user: str | None = None,
                   chroot: str | None = None, maintenance_file: str | None = MAINTENANCE_FILE) -> str:
    """haproxy.cfg text for the plan's `router.frontdoor` dict. `log`: HAProxy's log target (`stdout format raw
    local0` for a foreground test process); `api_key_file`: a file of accepted `Authorization` header values, one
    a line (requests without one of them get 401; read at start, before HAProxy drops privileges);
    `stats_socket`: the runtime API socket (None: none); `user`/`chroot`: as Debian's own haproxy.cfg
    (haproxy, /var/lib/haproxy; Debian's unit bind-mounts /dev/log there); `maintenance_file`: the ACL pattern file
    of the maintenance switch (it must exist, empty; read at start, before the chroot; None: no switch).
    Raises EncodeError (a ValueError) for a setting haproxy.cfg cannot carry (frontdoor_check names them first)."""
    directives = haproxy_directives(fd, log=log, api_key_file=api_key_file, stats_socket=stats_socket, user=user,
                                    chroot=chroot, maintenance_file=maintenance_file)
    return haproxy_text(directives, header(fd))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m pdstack.controller.render.frontdoor", allow_abbrev=False,
                                 description="print haproxy.cfg for the plan's front door")
    ap.add_argument("--plan", required=True, help="plan.json, or - for stdin")
    ap.add_argument("--log", default="/dev/log local0", help="HAProxy log target")
    ap.add_argument("--api-key-file", help="file of accepted Authorization header values (API key on)")
    ap.add_argument("--stats-socket", default=RUNTIME_SOCKET, help=f"runtime API socket (default {RUNTIME_SOCKET})")
    ap.add_argument("--user", help="drop privileges to this user and its group (Debian: haproxy)")
    ap.add_argument("--chroot", help="chroot directory (Debian: /var/lib/haproxy)")
    ap.add_argument("--maintenance-file", default=MAINTENANCE_FILE,
                    help=f"ACL pattern file of the maintenance switch (default {MAINTENANCE_FILE}; '' for none)")
    a = ap.parse_args(argv)
    fd = read_plan(a.plan)["router"]["frontdoor"]
    return write_or_refuse(lambda: haproxy_config(fd, log=a.log, api_key_file=a.api_key_file,
                                                  stats_socket=a.stats_socket or None, user=a.user, chroot=a.chroot,
                                                  maintenance_file=a.maintenance_file or None),
                           "frontdoor: haproxy.cfg cannot carry a setting of the plan's router.frontdoor")


if __name__ == "__main__":
    sys.exit(main())
