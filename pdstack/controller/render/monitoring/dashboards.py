"""Grafana dashboards, generated with grafana-foundation-sdk and committed as JSON (monitoring/dashboards/).

`python -m pdstack.controller.render.monitoring dashboards` rewrites the JSON; tests/test_monitoring.py fails when the
committed JSON and this generator disagree. Every panel query here is evaluated against a real Prometheus in the slow
test (GPU panels against recorded dcgm-exporter output), so a query that returns nothing fails CI.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

from grafana_foundation_sdk.builders import dashboard as gd
from grafana_foundation_sdk.builders import prometheus as gp
from grafana_foundation_sdk.builders import stat as gstat
from grafana_foundation_sdk.builders import timeseries as gts
from grafana_foundation_sdk.cog.encoder import JSONEncoder
from grafana_foundation_sdk.models import dashboard as dm

from pdstack.controller.plan.planner import DATASOURCE_UID, FOLDER

DATASOURCE = dm.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
RATE = "$__rate_interval"  # the rate window Grafana picks for the scrape interval and the zoom
ROOT = Path(__file__).resolve().parents[4]
DASHBOARD_DIR = ROOT / "monitoring" / "dashboards"


@dataclass
class Panel:
    """A panel to generate: title, unit, [(expr, legend)], and its kind (timeseries or stat)."""

    title: str
    unit: str
    queries: list[tuple[str, str]]
    description: str = ""
    kind: str = "timeseries"
    width: int = 12


@dataclass
class Dashboard:
    uid: str
    title: str
    description: str
    rows: list[tuple[str, list[Panel]]]
    variables: list[str] = field(default_factory=list)


def q99(metric: str, by: str = "role", selector: str = "", quantile: float = 0.99) -> str:
    """The `quantile` of histogram `metric` per `by` label, from its buckets' rate."""
    return f"histogram_quantile({quantile}, sum by (le, {by}) (rate({metric}_bucket{selector}[{RATE}])))"


PD_OVERVIEW = Dashboard(
    uid="pdstack-pd-overview", title="pdstack / PD overview",
    description="Prefill/decode serving behind sglang-router: throughput, latency, queues per stage, KV transfer, "
                "HiCache, admission refusals, worker health.",
    rows=[
        ("Throughput", [
            Panel("Generated tokens/s (decode)", "short",
                  [(f'sum by (server) (rate(sglang:generation_tokens_total{{role="decode"}}[{RATE}]))', "{{server}}")]),
            Panel("Prompt tokens/s (prefill)", "short",
                  [(f'sum by (server) (rate(sglang:prompt_tokens_total{{role="prefill"}}[{RATE}]))', "{{server}}")]),
            Panel("Router responses/s by status", "reqps",
                  [(f"sum by (status_code) (rate(smg_http_responses_total[{RATE}]))", "{{status_code}}")]),
            Panel("Decode throughput (SGLang gauge)", "short",
                  [('sglang:gen_throughput{role="decode"}', "{{server}}")]),
        ]),
        ("Latency", [
            Panel("Time to first token", "s",
                  [(q99("sglang:time_to_first_token_seconds"), "p99 {{role}}"),
                   (q99("sglang:time_to_first_token_seconds", quantile=0.5), "p50 {{role}}")],
                  "TTFT measured by the servers; budget in the PdstackTTFTOverBudget alert."),
            Panel("Inter-token latency", "s",
                  [(q99("sglang:inter_token_latency_seconds", selector='{role="decode"}'), "p99 {{role}}"),
                   (q99("sglang:inter_token_latency_seconds", selector='{role="decode"}', quantile=0.5),
                    "p50 {{role}}")]),
            Panel("End-to-end latency (router)", "s",
                  [(f"histogram_quantile(0.99, sum by (le) (rate(smg_router_request_duration_seconds_bucket[{RATE}])))",
                    "p99 router"),
                   (q99("sglang:e2e_request_latency_seconds", selector='{role="decode"}'), "p99 decode server")]),
        ]),
        ("Queues per stage", [
            Panel("Requests waiting, per PD stage", "short",
                  [('sum by (server) (sglang:num_queue_reqs{role="prefill"})', "prefill waiting {{server}}"),
                   ('sum by (server) (sglang:num_prefill_bootstrap_queue_reqs{role="prefill"})',
                    "prefill bootstrap {{server}}"),
                   ('sum by (server) (sglang:num_prefill_inflight_queue_reqs{role="prefill"})',
                    "prefill inflight (KV sending) {{server}}"),
                   ('sum by (server) (sglang:num_decode_prealloc_queue_reqs{role="decode"})',
                    "decode prealloc {{server}}"),
                   ('sum by (server) (sglang:num_decode_transfer_queue_reqs{role="decode"})',
                    "decode transfer {{server}}"),
                   ('sum by (server) (sglang:num_queue_reqs{role="decode"})', "decode waiting {{server}}")],
                  "Prefill: waiting -> bootstrap (for decode's handshake) -> inflight (KV sent); decode: prealloc -> "
                  "transfer (KV arriving) -> waiting -> running."),
            Panel("Running requests", "short",
                  [("sum by (server) (sglang:num_running_reqs)", "{{server}}"),
                   ("sum by (worker) (smg_worker_requests_active)", "router active {{worker}}")]),
            Panel("KV cache token usage", "percentunit", [("sglang:token_usage", "{{server}}")]),
        ]),
        ("KV transfer", [
            Panel("KV transfer latency", "ms",
                  [(q99("sglang:kv_transfer_latency_ms", by="server"), "p99 {{server}}"),
                   (q99("sglang:kv_transfer_latency_ms", by="server", quantile=0.5), "p50 {{server}}")]),
            Panel("KV transfer / bootstrap failures and aborts per second", "reqps",
                  [(f"sum by (server) (rate(sglang:num_transfer_failed_reqs_total[{RATE}]))",
                    "transfer failed {{server}}"),
                   (f"sum by (server) (rate(sglang:num_bootstrap_failed_reqs_total[{RATE}]))",
                    "bootstrap failed {{server}}"),
                   (f"sum by (server) (rate(sglang:num_aborted_requests_total[{RATE}]))", "aborted {{server}}")]),
        ]),
        ("HiCache", [
            Panel("HiCache host pool usage", "percentunit",
                  [("pdstack:hicache_host_usage:ratio", "{{server}}")],
                  "hicache_host_used_tokens / hicache_host_total_tokens; alert at 95 %."),
            Panel("Prefix cache hit rate", "percentunit", [("sglang:cache_hit_rate", "{{server}}")]),
        ]),
        ("Admission (front door, HAProxy)", [
            Panel("Refused requests/s (429 queue full, 503 queue timeout, 503 maintenance)", "reqps",
                  [(f'sum by (host) (rate(haproxy_backend_http_responses_total{{proxy="pdstack_refuse"}}[{RATE}]))',
                    "429 queue full {{host}}"),
                   (f'sum by (host) (rate(haproxy_backend_connection_errors_total{{proxy="pdstack_router"}}[{RATE}]))',
                    "503 queue timeout / router refused {{host}}"),
                   (f'sum by (host) (rate(haproxy_backend_http_responses_total{{proxy="pdstack_maintenance"}}'
                    f'[{RATE}]))', "503 maintenance (a rolling restart) {{host}}")],
                  "HAProxy's counters: backend pdstack_refuse answers every 429; a queue timeout is a connection "
                  "error of backend pdstack_router; backend pdstack_maintenance answers while the maintenance switch "
                  "is on (the only server of a role restarting)."),
            Panel("In flight to the router and waiting, against the limits", "short",
                  [('sum by (host) (haproxy_server_current_sessions{proxy="pdstack_router"})', "in flight {{host}}"),
                   ('sum by (host) (haproxy_backend_current_queue{proxy="pdstack_router"})', "waiting {{host}}"),
                   ('max by (host) (haproxy_server_limit_sessions{proxy="pdstack_router"})',
                    "max_concurrent_requests {{host}}"),
                   ('max by (host) (haproxy_server_queue_limit{proxy="pdstack_router"})', "queue_size {{host}}")],
                  "HAProxy's gauges: server maxconn = max_concurrent_requests, maxqueue = queue_size."),
            Panel("Front door requests/s by status class", "reqps",
                  [(f'sum by (code) (rate(haproxy_frontend_http_responses_total{{proxy="pdstack"}}[{RATE}]))',
                    "{{code}}")]),
        ]),
        ("Router worker health", [
            Panel("Worker health (1 healthy)", "short", [("smg_worker_health", "{{worker}}")]),
            Panel("Circuit breaker state (0 closed, 1 open, 2 half-open)", "short",
                  [("smg_worker_cb_state", "{{worker}}")]),
            Panel("Circuit breaker outcomes/s", "reqps",
                  [(f"sum by (worker, outcome) (rate(smg_worker_cb_outcomes_total[{RATE}]))", "{{outcome}} {{worker}}"),
                   ("sum by (worker) (smg_worker_cb_consecutive_failures)", "consecutive failures {{worker}}")]),
        ]),
    ],
)

NODE = Dashboard(
    uid="pdstack-node", title="pdstack / Node health per NUMA node",
    description="Each host's memory and CPU per NUMA node (servers are membound to one node), HiCache budgets, "
                "NUMA misses, disks, network. From node_exporter and pdstack's textfile metrics.",
    variables=["host"],
    rows=[
        ("Memory per NUMA node", [
            Panel("Memory used per NUMA node", "percentunit",
                  [('pdstack:numa_memory_used:ratio{host=~"$host"}', "{{host}} node {{node}}")]),
            Panel("Free memory vs HiCache budgets per NUMA node", "bytes",
                  [('node_memory_numa_MemFree{host=~"$host"}', "free {{host}} node {{node}}"),
                   ('node_memory_numa_MemTotal{host=~"$host"}', "total {{host}} node {{node}}"),
                   ('sum by (host, numa_node) (pdstack_hicache_host_budget_bytes{host=~"$host"})',
                    "HiCache budgets {{host}} node {{numa_node}}")]),
            Panel("NUMA misses/s (memory served from the other node)", "short",
                  [(f'rate(node_memory_numa_numa_miss_total{{host=~"$host"}}[{RATE}])', "{{host}} node {{node}}")]),
        ]),
        ("CPU per NUMA node", [
            Panel("CPU busy per NUMA node", "percentunit",
                  [(f'sum by (host, numa_node) (rate(node_cpu_seconds_total{{host=~"$host",mode!="idle"}}[{RATE}]) '
                    f'* on (host, cpu) group_left (numa_node) pdstack_numa_node_cpu) / on (host, numa_node) '
                    f'count by (host, numa_node) (pdstack_numa_node_cpu{{host=~"$host"}})',
                    "{{host}} node {{numa_node}}")]),
            Panel("Load average (1m)", "short", [('node_load1{host=~"$host"}', "{{host}}")]),
        ]),
        ("Disk and network", [
            Panel("Filesystem free", "percentunit",
                  [('node_filesystem_avail_bytes{host=~"$host",fstype!~"tmpfs|overlay|squashfs"} / '
                    'node_filesystem_size_bytes{host=~"$host",fstype!~"tmpfs|overlay|squashfs"}',
                    "{{host}} {{mountpoint}}")]),
            Panel("Network receive/transmit", "Bps",
                  [(f'sum by (host) (rate(node_network_receive_bytes_total{{host=~"$host",device!="lo"}}[{RATE}]))',
                    "rx {{host}}"),
                   (f'sum by (host) (rate(node_network_transmit_bytes_total{{host=~"$host",device!="lo"}}[{RATE}]))',
                    "tx {{host}}")]),
            Panel("Scrape targets up", "short", [('up{host=~"$host"}', "{{job}} {{instance}}")]),
        ]),
    ],
)

GPU = Dashboard(
    uid="pdstack-gpu", title="pdstack / GPUs",
    description="dcgm-exporter on each GPU host: utilization, memory, temperature, power, clocks, PCIe, XID errors.",
    variables=["host"],
    rows=[
        ("GPUs", [
            Panel("GPU utilization", "percent", [('DCGM_FI_DEV_GPU_UTIL{host=~"$host"}', "{{host}} GPU {{gpu}}")]),
            Panel("Framebuffer memory used", "percentunit",
                  [('DCGM_FI_DEV_FB_USED{host=~"$host"} / (DCGM_FI_DEV_FB_USED{host=~"$host"} + '
                    'DCGM_FI_DEV_FB_FREE{host=~"$host"})', "{{host}} GPU {{gpu}}")]),
            Panel("GPU temperature", "celsius", [('DCGM_FI_DEV_GPU_TEMP{host=~"$host"}', "{{host}} GPU {{gpu}}")]),
            Panel("Power draw", "watt", [('DCGM_FI_DEV_POWER_USAGE{host=~"$host"}', "{{host}} GPU {{gpu}}")]),
            Panel("SM clock", "rothz", [('DCGM_FI_DEV_SM_CLOCK{host=~"$host"}', "{{host}} GPU {{gpu}}")]),
            Panel("PCIe traffic", "Bps",
                  [('DCGM_FI_PROF_PCIE_TX_BYTES{host=~"$host"}', "tx {{host}} GPU {{gpu}}"),
                   ('DCGM_FI_PROF_PCIE_RX_BYTES{host=~"$host"}', "rx {{host}} GPU {{gpu}}")]),
            Panel("Last XID error (0 none)", "none",
                      [('DCGM_FI_DEV_XID_ERRORS{host=~"$host"}', "{{host}} GPU {{gpu}}")], kind="stat"),
        ]),
    ],
)

DASHBOARDS = [PD_OVERVIEW, NODE, GPU]


def _panel(spec: Panel, panel_id: int) -> gts.Panel | gstat.Panel:
    panel = gts.Panel() if spec.kind == "timeseries" else gstat.Panel()
    panel = panel.id(panel_id).title(spec.title).unit(spec.unit).datasource(DATASOURCE).span(spec.width).height(8)
    if spec.description:
        panel = panel.description(spec.description)
    for n, (expr, legend) in enumerate(spec.queries):
        ref_id = chr(ord("A") + n)  # A, B, C, ... as Grafana names a panel's queries
        panel = panel.with_target(gp.Dataquery().expr(expr).legend_format(legend).ref_id(ref_id).datasource(DATASOURCE))
    return panel


def build(spec: Dashboard) -> dict:
    dash = (gd.Dashboard(spec.title).uid(spec.uid).description(spec.description).tags(["pdstack", FOLDER])
            .time("now-1h", "now").refresh("30s").timezone("browser").readonly())
    for label in spec.variables:
        dash = dash.with_variable(gd.QueryVariable(label).label(label).datasource(DATASOURCE)
                                  .query(f"label_values(up, {label})").multi(True).include_all(True).all_value(".*")
                                  .refresh(dm.VariableRefresh.ON_DASHBOARD_LOAD))
    panel_id = 0
    for row, panels in spec.rows:
        panel_id += 1
        dash = dash.with_row(gd.Row(row).id(panel_id))
        for panel in panels:
            panel_id += 1
            dash = dash.with_panel(_panel(panel, panel_id))
    return json.loads(json.dumps(dash.build(), cls=JSONEncoder))


def render(spec: Dashboard) -> str:
    return json.dumps(build(spec), indent=2, sort_keys=True) + "\n"


def write_all(out: Path = DASHBOARD_DIR) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for spec in DASHBOARDS:
        path = out / f"{spec.uid}.json"
        path.write_text(render(spec))
        paths.append(path)
    return paths
