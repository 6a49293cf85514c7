"""Grafana dashboards, generated with grafana-foundation-sdk and committed as JSON (monitoring/dashboards/).

`python -m pdstack.controller.monitoring dashboards` rewrites the JSON; tests/test_monitoring.py fails when the
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

DATASOURCE_UID = "pdstack-prometheus"  # provisioned by the monitoring role with this uid
FOLDER = "sglang"  # provisioned into this folder, never General (anonymous viewers get 403 there)
DS = dm.DataSourceRef(type_val="prometheus", uid=DATASOURCE_UID)
RI = "$__rate_interval"
ROOT = Path(__file__).resolve().parents[3]
DASHBOARD_DIR = ROOT / "monitoring" / "dashboards"


@dataclass
class P:
    """A panel: title, unit, [(expr, legend)], and its kind (timeseries or stat)."""

    title: str
    unit: str
    queries: list[tuple[str, str]]
    description: str = ""
    kind: str = "timeseries"
    width: int = 12


@dataclass
class D:
    uid: str
    title: str
    description: str
    rows: list[tuple[str, list[P]]]
    variables: list[str] = field(default_factory=list)


def q99(metric: str, by: str = "role", sel: str = "", quantile: float = 0.99) -> str:
    return f"histogram_quantile({quantile}, sum by (le, {by}) (rate({metric}_bucket{sel}[{RI}])))"


PD_OVERVIEW = D(
    uid="pdstack-pd-overview", title="pdstack / PD overview",
    description="Prefill/decode serving behind sglang-router: throughput, latency, queues per stage, KV transfer, "
                "HiCache, admission refusals, worker health.",
    rows=[
        ("Throughput", [
            P("Generated tokens/s (decode)", "short",
              [(f'sum by (server) (rate(sglang:generation_tokens_total{{role="decode"}}[{RI}]))', "{{server}}")]),
            P("Prompt tokens/s (prefill)", "short",
              [(f'sum by (server) (rate(sglang:prompt_tokens_total{{role="prefill"}}[{RI}]))', "{{server}}")]),
            P("Router responses/s by status", "reqps",
              [(f"sum by (status_code) (rate(smg_http_responses_total[{RI}]))", "{{status_code}}")]),
            P("Decode throughput (SGLang gauge)", "short",
              [('sglang:gen_throughput{role="decode"}', "{{server}}")]),
        ]),
        ("Latency", [
            P("Time to first token", "s",
              [(q99("sglang:time_to_first_token_seconds"), "p99 {{role}}"),
               (q99("sglang:time_to_first_token_seconds", quantile=0.5), "p50 {{role}}")],
              "TTFT measured by the servers; budget in the PdstackTTFTOverBudget alert."),
            P("Inter-token latency", "s",
              [(q99("sglang:inter_token_latency_seconds", sel='{role="decode"}'), "p99 {{role}}"),
               (q99("sglang:inter_token_latency_seconds", sel='{role="decode"}', quantile=0.5), "p50 {{role}}")]),
            P("End-to-end latency (router)", "s",
              [(f"histogram_quantile(0.99, sum by (le) (rate(smg_router_request_duration_seconds_bucket[{RI}])))",
                "p99 router"),
               (q99("sglang:e2e_request_latency_seconds", sel='{role="decode"}'), "p99 decode server")]),
        ]),
        ("Queues per stage", [
            P("Requests waiting, per PD stage", "short",
              [('sum by (server) (sglang:num_queue_reqs{role="prefill"})', "prefill waiting {{server}}"),
               ('sum by (server) (sglang:num_prefill_bootstrap_queue_reqs{role="prefill"})',
                "prefill bootstrap {{server}}"),
               ('sum by (server) (sglang:num_prefill_inflight_queue_reqs{role="prefill"})',
                "prefill inflight (KV sending) {{server}}"),
               ('sum by (server) (sglang:num_decode_prealloc_queue_reqs{role="decode"})', "decode prealloc {{server}}"),
               ('sum by (server) (sglang:num_decode_transfer_queue_reqs{role="decode"})',
                "decode transfer {{server}}"),
               ('sum by (server) (sglang:num_queue_reqs{role="decode"})', "decode waiting {{server}}")],
              "Prefill: waiting -> bootstrap (for decode's handshake) -> inflight (KV sent); decode: prealloc -> "
              "transfer (KV arriving) -> waiting -> running."),
            P("Running requests", "short",
              [("sum by (server) (sglang:num_running_reqs)", "{{server}}"),
               ("sum by (worker) (smg_worker_requests_active)", "router active {{worker}}")]),
            P("KV cache token usage", "percentunit", [("sglang:token_usage", "{{server}}")]),
        ]),
        ("KV transfer", [
            P("KV transfer latency", "ms",
              [(q99("sglang:kv_transfer_latency_ms", by="server"), "p99 {{server}}"),
               (q99("sglang:kv_transfer_latency_ms", by="server", quantile=0.5), "p50 {{server}}")]),
            P("KV transfer / bootstrap failures and aborts per second", "reqps",
              [(f"sum by (server) (rate(sglang:num_transfer_failed_reqs_total[{RI}]))", "transfer failed {{server}}"),
               (f"sum by (server) (rate(sglang:num_bootstrap_failed_reqs_total[{RI}]))",
                "bootstrap failed {{server}}"),
               (f"sum by (server) (rate(sglang:num_aborted_requests_total[{RI}]))", "aborted {{server}}")]),
        ]),
        ("HiCache", [
            P("HiCache host pool usage", "percentunit",
              [("pdstack:hicache_host_usage:ratio", "{{server}}")],
              "hicache_host_used_tokens / hicache_host_total_tokens; alert at 95 %."),
            P("Prefix cache hit rate", "percentunit", [("sglang:cache_hit_rate", "{{server}}")]),
        ]),
        ("Admission (front door, HAProxy)", [
            P("Refused requests/s (429 queue full, 503 queue timeout)", "reqps",
              [(f'sum by (host) (rate(haproxy_backend_http_responses_total{{proxy="pdstack_refuse"}}[{RI}]))',
                "429 queue full {{host}}"),
               (f'sum by (host) (rate(haproxy_backend_connection_errors_total{{proxy="pdstack_router"}}[{RI}]))',
                "503 queue timeout / router refused {{host}}")],
              "HAProxy's counters: backend pdstack_refuse answers every 429; a queue timeout is a connection "
              "error of backend pdstack_router."),
            P("In flight to the router and waiting, against the limits", "short",
              [('sum by (host) (haproxy_server_current_sessions{proxy="pdstack_router"})', "in flight {{host}}"),
               ('sum by (host) (haproxy_backend_current_queue{proxy="pdstack_router"})', "waiting {{host}}"),
               ('max by (host) (haproxy_server_limit_sessions{proxy="pdstack_router"})',
                "max_concurrent_requests {{host}}"),
               ('max by (host) (haproxy_server_queue_limit{proxy="pdstack_router"})', "queue_size {{host}}")],
              "HAProxy's gauges: server maxconn = max_concurrent_requests, maxqueue = queue_size."),
            P("Front door requests/s by status class", "reqps",
              [(f'sum by (code) (rate(haproxy_frontend_http_responses_total{{proxy="pdstack"}}[{RI}]))', "{{code}}")]),
        ]),
        ("Router worker health", [
            P("Worker health (1 healthy)", "short", [("smg_worker_health", "{{worker}}")]),
            P("Circuit breaker state (0 closed, 1 open, 2 half-open)", "short",
              [("smg_worker_cb_state", "{{worker}}")]),
            P("Circuit breaker outcomes/s", "reqps",
              [(f"sum by (worker, outcome) (rate(smg_worker_cb_outcomes_total[{RI}]))", "{{outcome}} {{worker}}"),
               ("sum by (worker) (smg_worker_cb_consecutive_failures)", "consecutive failures {{worker}}")]),
        ]),
    ],
)

NODE = D(
    uid="pdstack-node", title="pdstack / Node health per NUMA node",
    description="Each host's memory and CPU per NUMA node (servers are membound to one node), HiCache budgets, "
                "NUMA misses, disks, network. From node_exporter and pdstack's textfile metrics.",
    variables=["host"],
    rows=[
        ("Memory per NUMA node", [
            P("Memory used per NUMA node", "percentunit",
              [('pdstack:numa_memory_used:ratio{host=~"$host"}', "{{host}} node {{node}}")]),
            P("Free memory vs HiCache budgets per NUMA node", "bytes",
              [('node_memory_numa_MemFree{host=~"$host"}', "free {{host}} node {{node}}"),
               ('node_memory_numa_MemTotal{host=~"$host"}', "total {{host}} node {{node}}"),
               ('sum by (host, numa_node) (pdstack_hicache_host_budget_bytes{host=~"$host"})',
                "HiCache budgets {{host}} node {{numa_node}}")]),
            P("NUMA misses/s (memory served from the other node)", "short",
              [(f'rate(node_memory_numa_numa_miss_total{{host=~"$host"}}[{RI}])', "{{host}} node {{node}}")]),
        ]),
        ("CPU per NUMA node", [
            P("CPU busy per NUMA node", "percentunit",
              [(f'sum by (host, numa_node) (rate(node_cpu_seconds_total{{host=~"$host",mode!="idle"}}[{RI}]) '
                f'* on (host, cpu) group_left (numa_node) pdstack_numa_node_cpu) / on (host, numa_node) '
                f'count by (host, numa_node) (pdstack_numa_node_cpu{{host=~"$host"}})',
                "{{host}} node {{numa_node}}")]),
            P("Load average (1m)", "short", [('node_load1{host=~"$host"}', "{{host}}")]),
        ]),
        ("Disk and network", [
            P("Filesystem free", "percentunit",
              [('node_filesystem_avail_bytes{host=~"$host",fstype!~"tmpfs|overlay|squashfs"} / '
                'node_filesystem_size_bytes{host=~"$host",fstype!~"tmpfs|overlay|squashfs"}',
                "{{host}} {{mountpoint}}")]),
            P("Network receive/transmit", "Bps",
              [(f'sum by (host) (rate(node_network_receive_bytes_total{{host=~"$host",device!="lo"}}[{RI}]))',
                "rx {{host}}"),
               (f'sum by (host) (rate(node_network_transmit_bytes_total{{host=~"$host",device!="lo"}}[{RI}]))',
                "tx {{host}}")]),
            P("Scrape targets up", "short", [('up{host=~"$host"}', "{{job}} {{instance}}")]),
        ]),
    ],
)

GPU = D(
    uid="pdstack-gpu", title="pdstack / GPUs",
    description="dcgm-exporter on each GPU host: utilization, memory, temperature, power, clocks, PCIe, XID errors.",
    variables=["host"],
    rows=[
        ("GPUs", [
            P("GPU utilization", "percent", [('DCGM_FI_DEV_GPU_UTIL{host=~"$host"}', "{{host}} GPU {{gpu}}")]),
            P("Framebuffer memory used", "percentunit",
              [('DCGM_FI_DEV_FB_USED{host=~"$host"} / (DCGM_FI_DEV_FB_USED{host=~"$host"} + '
                'DCGM_FI_DEV_FB_FREE{host=~"$host"})', "{{host}} GPU {{gpu}}")]),
            P("GPU temperature", "celsius", [('DCGM_FI_DEV_GPU_TEMP{host=~"$host"}', "{{host}} GPU {{gpu}}")]),
            P("Power draw", "watt", [('DCGM_FI_DEV_POWER_USAGE{host=~"$host"}', "{{host}} GPU {{gpu}}")]),
            P("SM clock", "rothz", [('DCGM_FI_DEV_SM_CLOCK{host=~"$host"}', "{{host}} GPU {{gpu}}")]),
            P("PCIe traffic", "Bps",
              [('DCGM_FI_PROF_PCIE_TX_BYTES{host=~"$host"}', "tx {{host}} GPU {{gpu}}"),
               ('DCGM_FI_PROF_PCIE_RX_BYTES{host=~"$host"}', "rx {{host}} GPU {{gpu}}")]),
            P("Last XID error (0 none)", "none", [('DCGM_FI_DEV_XID_ERRORS{host=~"$host"}', "{{host}} GPU {{gpu}}")],
              kind="stat"),
        ]),
    ],
)

DASHBOARDS = [PD_OVERVIEW, NODE, GPU]


def _panel(p: P, pid: int) -> gts.Panel | gstat.Panel:
    b = gts.Panel() if p.kind == "timeseries" else gstat.Panel()
    b = b.id(pid).title(p.title).unit(p.unit).datasource(DS).span(p.width).height(8)
    if p.description:
        b = b.description(p.description)
    for i, (expr, legend) in enumerate(p.queries):
        b = b.with_target(gp.Dataquery().expr(expr).legend_format(legend).ref_id(chr(ord("A") + i)).datasource(DS))
    return b


def build(d: D) -> dict:
    b = (gd.Dashboard(d.title).uid(d.uid).description(d.description).tags(["pdstack", FOLDER])
         .time("now-1h", "now").refresh("30s").timezone("browser").readonly())
    for v in d.variables:
        b = b.with_variable(gd.QueryVariable(v).label(v).datasource(DS).query(f"label_values(up, {v})")
                            .multi(True).include_all(True).all_value(".*")
                            .refresh(dm.VariableRefresh.ON_DASHBOARD_LOAD))
    pid = 0
    for row, panels in d.rows:
        pid += 1
        b = b.with_row(gd.Row(row).id(pid))
        for p in panels:
            pid += 1
            b = b.with_panel(_panel(p, pid))
    return json.loads(json.dumps(b.build(), cls=JSONEncoder))


def render(d: D) -> str:
    return json.dumps(build(d), indent=2, sort_keys=True) + "\n"


def write_all(out: Path = DASHBOARD_DIR) -> list[Path]:
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for d in DASHBOARDS:
        path = out / f"{d.uid}.json"
        path.write_text(render(d))
        paths.append(path)
    return paths
