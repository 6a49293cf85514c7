"""What the front door (render/frontdoor.py) answers when it answers itself: every answer is OpenAI-shaped JSON
({"error": {"message", "type", "code"}}), and each refusal of its own names its reason in the X-Pdstack-Refusal
header and the body's "type", so clients, the probe and the gates tell "busy" from "router down" from "a planned
restart" without parsing prose (the probe's names agree: pdstack/hostside/probe.py). The router's own errors are
rewritten with the messages here (CLIENT_ERRORS, SERVER_ERRORS), and HAProxy's own errors with HAPROXY_ERRORS.
"""

from __future__ import annotations

from pdstack.controller.render.encoders import json_text

# the header that names a refusal's reason, and the reasons
REFUSAL_HEADER = "X-Pdstack-Refusal"
QUEUE_FULL, QUEUE_TIMEOUT, ROUTER_DOWN, MAINTENANCE = "queue-full", "queue-timeout", "router-down", "maintenance"
BODY_TOO_LARGE, REQUEST_TIMEOUT, SOURCE_LIMIT = "body-too-large", "request-timeout", "source-limit"
MODEL_NOT_FOUND, UPSTREAM_ERROR, UPSTREAM_REFUSED = "model-not-found", "upstream-error", "upstream-refused"
NOT_FOUND, METHOD_NOT_ALLOWED, MODEL_REQUIRED = "not-found", "method-not-allowed", "model-required"
# the router's error statuses that are rewritten (0.3.2 answers these; any other status >= 400 is rewritten as 502)
CLIENT_ERRORS = {400: "bad request", 401: "unauthorized", 403: "forbidden", 404: "not found: no such endpoint",
                 405: "method not allowed", 406: "not acceptable", 408: "request timeout", 409: "conflict",
                 411: "length required", 413: "request body too large", 414: "URI too long",
                 415: "unsupported media type", 422: "unprocessable request", 429: "too many requests",
                 431: "request headers too large"}
SERVER_ERRORS = {500: "the model server failed on this request",
                 501: "not implemented by the model server",
                 502: "the model server gave no valid answer",
                 503: "no model server is available right now; retry after Retry-After seconds",
                 504: "the model server did not answer in time"}
# Every other answer HAProxy itself may give, as OpenAI-shaped JSON with its reason (header and body "type"):
# status -> (reason, message). 503 is the backend's (queue timeout or router down, below).
HAPROXY_ERRORS = {
    400: ("bad-request", "bad request: the request is not valid HTTP"),
    403: ("forbidden", "forbidden: the front door refused the request"),
    408: (REQUEST_TIMEOUT, "request timeout: the whole request did not arrive within the read timeout"),
    413: (BODY_TOO_LARGE, "request body too large"),
    429: (QUEUE_FULL, "too many requests"),
    500: ("internal-error", "internal error in the front door"),
    502: ("bad-gateway", "bad gateway: the router gave an invalid or no response"),
    503: ("unavailable", "service unavailable"),
    504: ("gateway-timeout", "gateway timeout: the router did not answer in time"),
}


def json_error(message: str, kind: str, code: int) -> str:
    # OpenAI-style error body: one haproxy.cfg word (the encoder quotes it)
    return json_text({"error": {"message": message, "type": kind, "code": code}})


# the JSON body's "type" per reason (OpenAI-style names where one exists)
BODY_TYPES = {QUEUE_FULL: "rate_limit_exceeded", QUEUE_TIMEOUT: "overloaded", ROUTER_DOWN: "router_down",
              MAINTENANCE: "maintenance", BODY_TOO_LARGE: "invalid_request_error", REQUEST_TIMEOUT: "timeout",
              "bad-request": "invalid_request_error"}
MESSAGES = {
    QUEUE_TIMEOUT: "overloaded: no router slot became free within the queue timeout",
    ROUTER_DOWN: "router down: sglang-router behind the front door does not answer",
    MAINTENANCE: "maintenance: a server is restarting on purpose; retry after Retry-After seconds",
}


def json_error_lf(up: str) -> str:
    """The body of HAProxy's own 503 as a log-format string: queue timeout while the router is up, else router
    down (`iif`: its arguments may hold spaces, not commas, parentheses or brackets)."""
    body = json_error("@MSG@", "@TYPE@", 503)
    if any(c in MESSAGES[k] for k in (QUEUE_TIMEOUT, ROUTER_DOWN) for c in ",()[]%'"):
        raise ValueError("the queue-timeout and router-down messages must not contain , ( ) [ ] % or '")
    return (body.replace("@TYPE@", f"%[{up},iif({BODY_TYPES[QUEUE_TIMEOUT]},{BODY_TYPES[ROUTER_DOWN]})]")
            .replace("@MSG@", f"%[{up},iif({MESSAGES[QUEUE_TIMEOUT]},{MESSAGES[ROUTER_DOWN]})]"))
