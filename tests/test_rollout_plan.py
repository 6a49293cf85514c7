"""Rollouts and the front door's refusals, fast: what the plan says a restart of each server does (drained out of the
router with a peer of its role, the front door's maintenance switch alone), the rollout bounds, and how the probe and
recall read the front door's refusals (router down is not "busy"). The real runs: tests/test_site.py (rolling
restarts on test hosts), tests/sim/test_failure.py (the front door's answers, real HAProxy)."""

from __future__ import annotations

import http.server
import json
import threading
from pathlib import Path

import pytest

from pdstack.controller import pipeline
from pdstack.controller.load import inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.plan import planner
from pdstack.controller.plan import text as plan_text
from pdstack.controller.plan.planner import MAINTENANCE_FILE
from pdstack.controller.render import frontdoor_answers as answers
from pdstack.hostside import probe
from pdstack.hostside.facts import collect

ROOT = Path(__file__).resolve().parents[1]


def _plan(inv: str, gpus: int = 2) -> planner.Plan:
    dep = inventory.load(ROOT / inv)
    return pipeline.make_plan(dep, dict.fromkeys(dep.hosts, collect(simulate_gpus=gpus))).validate()


def test_two_decodes_drain_through_the_router_and_the_only_prefill_through_the_front_door():
    plan = _plan("inventory/test/two-decode", gpus=3)
    by = {s.name: s for s in plan.servers}
    assert [(s.name, s.role) for s in plan.servers] == [("prefill-0", "prefill"), ("decode-0", "decode"),
                                                         ("decode-1", "decode")]
    assert {s.host for s in plan.servers} == {"pdstack-roll-1"}  # both decodes on one host: the role keeps them apart
    assert by["decode-0"].rollout["drain"] == "router" and by["decode-0"].rollout["peers"] == ["decode-1"]
    assert by["decode-1"].rollout["peers"] == ["decode-0"]
    assert by["prefill-0"].rollout["drain"] == "frontdoor" and by["prefill-0"].rollout["peers"] == []
    # what POST /workers gets to put it back: its URL as the router lists it (the router's argv), its type
    assert by["decode-1"].rollout["worker"] == {"url": "http://pdstack-roll-1:30002", "worker_type": "decode"}
    assert by["prefill-0"].rollout["worker"] == {"url": "http://pdstack-roll-1:30000", "worker_type": "prefill",
                                                 "bootstrap_port": 8998}
    assert [w["url"] for w in plan.router.decode] == ["http://pdstack-roll-1:30001", "http://pdstack-roll-1:30002"]
    # the probe pair: the restarted decode with the prefill, at its bootstrap address
    assert by["decode-1"].rollout["probe"] == {"prefill_url": "http://pdstack-roll-1:30000",
                                               "bootstrap_host": "pdstack-roll-1", "bootstrap_port": 8998,
                                               "decode_url": "http://pdstack-roll-1:30002"}
    assert by["prefill-0"].rollout["probe"]["decode_url"] == "http://pdstack-roll-1:30001"
    assert plan.rollout == {"drain_timeout_secs": 30, "probe_timeout_secs": 30,  # inventory/test/common
                            "watchdog_hold_file": planner.WATCHDOG_HOLD_FILE}
    text = plan_text.render_text(plan)
    assert "taken out of the router while it drains (peers: decode-1)" in text
    assert "the front door answers 503 + Retry-After while it drains (the only prefill)" in text


def test_one_of_each_role_drains_through_the_front_door_and_drain_defaults_to_the_request_timeout():
    plan = _plan("inventory/test/one-host")
    assert {s.rollout["drain"] for s in plan.servers} == {"frontdoor"}
    dep = inventory.load(ROOT / "inventory/production")
    prod = pipeline.make_plan(dep, load_facts(ROOT / "tests/topologies/reference-2node-8gpu.json",
                                                     list(dep.hosts)))
    # unset drain_timeout_secs: the router's request timeout (no request outlives it)
    assert prod.rollout == {"drain_timeout_secs": dep.router["request_timeout_secs"], "probe_timeout_secs": 120,
                            "watchdog_hold_file": planner.WATCHDOG_HOLD_FILE}
    assert prod.router.frontdoor["maintenance_file"] == MAINTENANCE_FILE


def test_the_front_door_and_the_probe_agree_on_the_refusal_names():
    assert answers.REFUSAL_HEADER == probe.REFUSAL_HEADER
    assert (answers.QUEUE_FULL, answers.QUEUE_TIMEOUT, answers.ROUTER_DOWN, answers.MAINTENANCE) == (
        probe.QUEUE_FULL, probe.QUEUE_TIMEOUT, probe.ROUTER_DOWN_REASON, probe.MAINTENANCE)
    # the bodies' types are what refusal_reason falls back on without the header
    assert probe.refusal_reason(503, None, json.dumps({"error": {"type": answers.BODY_TYPES["router-down"]}})) \
        == "router-down"
    assert probe.refusal_reason(503, None, json.dumps({"error": {"type": answers.BODY_TYPES["queue-timeout"]}})) \
        == "queue-timeout"


@pytest.mark.parametrize(("status", "header", "body", "reason"), [
    (429, "queue-full", "", "queue-full"),
    (429, None, "", "queue-full"),  # another limiter's 429
    (408, None, "", "queue-timeout"),
    (503, "queue-timeout", "", "queue-timeout"),
    (503, "router-down", "", "router-down"),
    (503, "maintenance", "", "maintenance"),
    (503, None, '{"error": "No available decode workers"}', None),  # the router's own 503: the deployment's error
    (500, None, "", None),
    (503, "something-else", "", None),
])
def test_refusal_reason(status, header, body, reason):
    assert probe.refusal_reason(status, header, body) == reason


class _Answer(http.server.BaseHTTPRequestHandler):
    status, headers, body = 503, {}, b""

    def do_POST(self):  # noqa: N802 (http.server's name)
        self.rfile.read(int(self.headers.get("Content-Length", 0)))
        self.send_response(self.status)
        for k, v in self.headers_out.items():
            self.send_header(k, v)
        self.send_header("Content-Length", str(len(self.body)))
        self.end_headers()
        self.wfile.write(self.body)

    def log_message(self, *args):
        pass


def _answering(status: int, headers: dict, body: str):
    cls = type("A", (_Answer,), {"status": status, "headers_out": headers, "body": body.encode()})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), cls)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv


@pytest.mark.parametrize(("reason", "code", "words"), [
    ("router-down", probe.ROUTER_DOWN, "router down"),
    ("maintenance", probe.ADMISSION, "maintenance"),
    ("queue-timeout", probe.ADMISSION, "queue timeout"),
    ("queue-full", probe.ADMISSION, "queue full"),
])
def test_the_probe_names_the_front_doors_answer(reason, code, words):
    """The answers frontdoor.py renders (header, body type), as HAProxy sends them: router down is exit 10 (the
    gates say "router down"), the others are busy (11), never a restartable failure."""
    status = 429 if reason == "queue-full" else 503
    body = json.dumps({"error": {"message": answers.MESSAGES.get(reason, "x"), "type": answers.BODY_TYPES[reason],
                                 "code": status}})
    srv = _answering(status, {"Retry-After": "2", answers.REFUSAL_HEADER: reason}, body)
    try:
        r = probe.probe(f"http://127.0.0.1:{srv.server_address[1]}", first_token_timeout=5, stall_timeout=2,
                        total_timeout=5)
    finally:
        srv.shutdown()
    assert r.code == code and r.http_status == status, r
    assert words in r.message, r.message


@pytest.mark.parametrize(("reason", "status", "asked", "graded"), [
    ("router-down", "http", 1, "router down"),  # the answer: not retried, named
    ("maintenance", "refused", 3, "maintenance"),  # busy: retried with backoff (retries=2), then refused
])
def test_recall_retries_busy_refusals_but_not_the_router_down(reason, status, asked, graded):
    from pdstack.controller.gates import recall
    from pdstack.controller.gates.needles import Needle

    body = json.dumps({"error": {"message": answers.MESSAGES[reason], "type": answers.BODY_TYPES[reason],
                                 "code": 503}})
    seen = []

    class Counting(_Answer):
        def do_POST(self):  # noqa: N802
            seen.append(self.path)
            super().do_POST()

    cls = type("C", (Counting,), {"status": 503, "headers_out": {"Retry-After": "1", answers.REFUSAL_HEADER: reason},
                                  "body": body.encode()})
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), cls)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    try:
        out = recall.ask(f"http://127.0.0.1:{srv.server_address[1]}", "prompt", Needle("k", "1234", 50),
                         timeout=5, max_new_tokens=4, retries=2, backoff_s=0.01)
    finally:
        srv.shutdown()
    assert (out.status, out.http_status, len(seen)) == (status, 503, asked), out
    assert graded in out.detail, out.detail
