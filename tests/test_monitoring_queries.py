"""Every dashboard query returns series from a real Prometheus (slow; CI runs it).

Prometheus 2.42 (Debian) scrapes, every second, with the scrape config controller/render/monitoring generates: a sim
prefill and a sim decode (the TEST ENGINE, SGLang's metric names), the real sglang-router 0.3.2 in front of them, the
front door (the real HAProxy and its Prometheus exporter; admission limits small enough that a burst gets 429/503),
node_exporter 1.5 (NUMA meminfo + pdstack's textfile metrics), and a static server that replays the recorded
dcgm-exporter sample (monitoring/recorded/; written by hand, no GPU here). It loads monitoring/rules/pdstack.rules.yml,
so the dashboards' recording rules are evaluated too.
"""

from __future__ import annotations

import http.server
import json
import shutil
import threading
import time
from contextlib import ExitStack
from pathlib import Path

import pytest
import yaml

from pdstack.controller.render.monitoring import dashboards, queries, scrape
from pdstack.hostside import facts as host_facts
from pdstack.testing.sim.launch import (
    LOCALHOST,
    FrontDoorProcess,
    ManagedProcess,
    RouterProcess,
    SimProcess,
    free_port,
    http_post_json,
)

ROOT = Path(__file__).resolve().parents[1]
RULES = ROOT / "monitoring" / "rules" / "pdstack.rules.yml"
DCGM_SAMPLE = ROOT / "monitoring" / "recorded" / "dcgm-exporter-8x-rtx-pro-6000.prom"
NODE_EXPORTER = shutil.which("prometheus-node-exporter") or shutil.which("node_exporter")
PROMETHEUS = shutil.which("prometheus")
HOST = "testhost"
FAST = ["--prefill-tokens-per-s", "1000000", "--decode-tokens-per-s", "2000", "--bootstrap-timeout-s", "2",
        "--enable-hierarchical-cache", "--hicache-ratio", "2"]
# front door admission: one request at a time, a queue of 2 that times out after 1 s -> a burst gets 429/503
ADMISSION = {"max_concurrent_requests": 1, "queue_size": 2, "queue_timeout_secs": 1}
ROUTER_FAST = ["--request-timeout-secs", "5", "--retry-max-retries", "2", "--retry-initial-backoff-ms", "10",
               "--retry-max-backoff-ms", "50", "--worker-startup-timeout-secs", "20",
               "--worker-startup-check-interval", "1", "--max-concurrent-requests", "-1"]

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not (NODE_EXPORTER and PROMETHEUS),
                                 reason="needs Debian's prometheus and prometheus-node-exporter (./dev.sh setup)")]


def test_plan(prefill: SimProcess, decode: SimProcess, router: RouterProcess, fd: FrontDoorProcess) -> dict:
    """A plan (the planner's shape, the fields monitoring reads) for the processes of this test."""
    def server(p: SimProcess, name: str, node: int) -> dict:
        return {"host": HOST, "address": LOCALHOST, "name": name, "role": p.role, "numa_node": node, "gpus": [node],
                "ports": {"http": p.port, "bootstrap": p.bootstrap_port, "metrics": p.port},
                "hicache": {"enabled": True, "host_budget_gb": 1.0}}
    return {"inventory": "tests/test_monitoring_queries", "engine": "sim",
            "servers": [server(prefill, "prefill-0", 0), server(decode, "decode-0", 0)],
            "router": {"host": HOST, "address": LOCALHOST, "prometheus_port": router.metrics_port,
                       "flags": ["--pd-disaggregation"], "admission": dict(ADMISSION), "frontdoor": {**fd.fd}},
            "monitoring_hosts": [HOST]}


test_plan.__test__ = False  # a helper, not a test


def serve_file(path: Path) -> tuple[http.server.ThreadingHTTPServer, int]:
    body = path.read_bytes()

    class H(http.server.BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a):
            pass

    srv = http.server.ThreadingHTTPServer((LOCALHOST, 0), H)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    return srv, srv.server_address[1]


def generate(router: RouterProcess | FrontDoorProcess, n: int, text: str = "Tell me about the weather",
             tokens: int = 16) -> list[int]:
    codes = []
    for _ in range(n):
        status, _ = http_post_json(router.url + "/generate",
                                   {"text": text, "sampling_params": {"max_new_tokens": tokens}}, timeout=20)
        codes.append(status)
    return codes


def burst(router: FrontDoorProcess, n: int) -> list[int]:
    out: list[int] = []
    ths = [threading.Thread(target=lambda: out.extend(generate(router, 1, tokens=4))) for _ in range(n)]
    for t in ths:
        t.start()
    for t in ths:
        t.join(30)
    return out


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("monitoring")
    with ExitStack() as es:
        prefill = SimProcess("prefill", tmp, FAST)
        es.callback(prefill.stop)
        # a decode with HiCache keeps its radix cache, as the planner renders it (SGLang 0.5.23 refuses it otherwise)
        decode = SimProcess("decode", tmp, [*FAST, "--disaggregation-decode-enable-radix-cache"])
        es.callback(decode.stop)
        prefill.start()
        decode.start()
        router = RouterProcess([prefill], [decode], tmp, ROUTER_FAST)
        es.callback(router.stop)
        router.start()
        fd = FrontDoorProcess(router, tmp, **ADMISSION)
        es.callback(fd.stop)
        fd.start()
        plan = test_plan(prefill, decode, router, fd)

        textfile = tmp / "textfile"
        textfile.mkdir()
        (textfile / "pdstack.prom").write_text(scrape.textfile_metrics(plan, HOST, host_facts.collect()))
        ne_port = free_port()
        ne = ManagedProcess("node_exporter", [NODE_EXPORTER, f"--web.listen-address={LOCALHOST}:{ne_port}",
                                              "--collector.meminfo_numa",
                                              f"--collector.textfile.directory={textfile}"], tmp / "node_exporter.log")
        es.callback(ne.stop)
        ne.start()
        ne.wait_http(f"http://{LOCALHOST}:{ne_port}/metrics", 15)

        dcgm, dcgm_port = serve_file(DCGM_SAMPLE)
        es.callback(dcgm.shutdown)

        prom_port = free_port()
        cfg = scrape.prometheus_config(plan, hosts={HOST: LOCALHOST}, scrape_interval="1s", evaluation_interval="1s",
                                       node_exporter_port=ne_port, dcgm_port=dcgm_port, gpu=True,
                                       rule_files=[str(RULES)], prometheus_target=f"{LOCALHOST}:{prom_port}")
        (tmp / "prometheus.yml").write_text(yaml.safe_dump(cfg, sort_keys=False))
        prom = ManagedProcess("prometheus", [PROMETHEUS, f"--config.file={tmp / 'prometheus.yml'}",
                                             f"--storage.tsdb.path={tmp / 'data'}",
                                             f"--web.listen-address={LOCALHOST}:{prom_port}"], tmp / "prometheus.log")
        es.callback(prom.stop)
        prom.start()
        url = f"http://{LOCALHOST}:{prom_port}"
        prom.wait_http(url + "/-/ready", 30)

        # traffic: successes (counters, histograms, KV transfers), then a burst against a slow prefill so the
        # front door answers 429 (queue full) and 503 (queue timeout), then successes again so every rate window
        # holds samples
        assert set(generate(fd, 3)) == {200}
        prefill.fault(slow_prefill_s=0.7)
        refused = burst(fd, 6)
        prefill.fault(slow_prefill_s=None)
        assert {429, 503} <= set(refused), refused
        yield {"prometheus": url, "router": fd, "refused": refused}


def _wait_all_series(prometheus: str, qs: list[queries.Query], timeout: float) -> list[queries.Query]:
    deadline = time.monotonic() + timeout
    bad = qs
    while True:
        bad = queries.empty_queries(prometheus, bad)
        if not bad or time.monotonic() > deadline:
            return bad
        time.sleep(1)


def test_every_target_is_up(stack):
    expected = {"prometheus", "sglang", "sglang-router", "haproxy", "node", "dcgm"}
    deadline = time.monotonic() + 20
    while True:
        up = {(r["metric"]["job"], r["metric"]["instance"]): r["value"][1]
              for r in queries.instant(stack["prometheus"], "up")}
        ok = {job for job, _ in up} == expected and set(up.values()) == {"1"}
        if ok or time.monotonic() > deadline:
            break
        time.sleep(0.5)
    assert ok, up


def test_the_checker_reports_a_query_without_series(stack):
    bogus = queries.Query("x", "bogus panel", "A", 'sglang:num_running_reqs{role="nonexistent"}')
    assert queries.empty_queries(stack["prometheus"], [bogus]) == [bogus]


@pytest.mark.parametrize("uid", [d.uid for d in dashboards.DASHBOARDS])
def test_every_panel_query_returns_series(stack, uid):
    generate(stack["router"], 2)  # counters move inside the rate window
    qs = queries.dashboard_queries(dashboards.DASHBOARD_DIR / f"{uid}.json")
    assert qs, uid
    bad = _wait_all_series(stack["prometheus"], qs, timeout=20)
    assert not bad, "queries without series:\n" + "\n".join(map(str, bad))


def test_rules_load_and_no_alert_fires_on_a_healthy_stack(stack):
    body = json.loads(queries.urllib.request.urlopen(stack["prometheus"] + "/api/v1/rules", timeout=5).read())
    groups = {g["name"]: g for g in body["data"]["groups"]}
    assert set(groups) == {"pdstack.recording", "pdstack.serving", "pdstack.router", "pdstack.hosts"}
    assert all(r["health"] == "ok" for g in groups.values() for r in g["rules"]), groups
    firing = [a for a in queries.instant(stack["prometheus"], 'ALERTS{alertstate="firing"}')]
    assert firing == [], firing
