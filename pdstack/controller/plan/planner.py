"""The planner: a checked inventory + host facts -> the exact per-server plan (pdstack.controller.pipeline runs it).

For each prefill/decode server: GPU list, NUMA node (from the facts), cpuset (that node's CPUs), membind node,
HiCache ratio with its arithmetic, the full launch argv and environment. For the router: its argv with every
worker. The serving and router roles render units from this plan and nothing else.
"""

from __future__ import annotations

import contextlib
import ipaddress
import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pdstack.controller.load import flags, host_settings, recall_grid, variables
from pdstack.controller.load.exporters import scraped_port
from pdstack.controller.load.facts import resolve_node
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.plan import image_choice, p2p_plan
from pdstack.controller.plan import model as model_plan
from pdstack.errors import InventoryError
from pdstack.switches import (  # read by our SGLang patch series (kernels/patches) and SGLang
    PD_ENV,
    index_k_env,
    index_reader,
)

# The plan's contract with the roles: what every field is. make_plan's output is checked against it.
SCHEMA_FILE = Path(__file__).with_name("plan.schema.json")
# Grafana names the grafana role provisions and the dashboards refer to, defined once (plan.monitoring.grafana).
DATASOURCE_UID = "pdstack-prometheus"
# Dashboards are provisioned into this folder, never General: anonymous viewers got 403 there (docs/facts.md).
FOLDER = "sglang"
# The front door's runtime API and maintenance switch (the frontdoor role and the rollout read them from the plan).
MAINTENANCE_FILE = "/etc/haproxy/pdstack-maintenance.acl"
RUNTIME_SOCKET = "/run/haproxy/admin.sock"  # HAProxy's runtime API (stats socket, level admin)
# A rolling restart holds the watchdog (on the router host) with this file while a server is out: pdstack/hostside/
# drain.py writes it, watchdog.py reads it; on /run, so a reboot drops a hold a killed play left behind
WATCHDOG_HOLD_FILE = "/run/pdstack/watchdog-hold.json"
# The router's --request-timeout-secs is the request budget (pdstack_router.request_timeout_secs) plus this: HAProxy's
# `timeout server` (the budget) ends a request first, so the router never retries an attempt that timed out
ROUTER_TIMEOUT_MARGIN_SECS = 30
SGLANG_LAUNCHER = ["python3", "-m", "sglang.launch_server"]
SIM_LAUNCHER = ["pdstack", "sim"]  # the TEST ENGINE; accepts SGLang's flag names
# sglang-router 0.3.2's own launcher (sglang_router/launch_router.py), run with the `sglang` package unimportable:
# launch_router.py imports mini_lb.py (the Python debug balancer, never used here) at its top, and mini_lb.py tries
# `from sglang.srt.tracing.trace import ...` in a `try/except ImportError` (tracing for mini_lb only). Beside an
# installed SGLang (both images) that loads sglang/__init__.py, torch and transformers before the Rust router starts:
# 12.6 s of CPU on a 2-core controller, 1.1 s without (`time python3 -m sglang_router.launch_router --help` against
# this program with `--help`). The Rust router and its argument parsing are the wheel's, unchanged.
ROUTER_PROGRAM = ('import runpy, sys; sys.modules["sglang"] = None; '
                  'runpy.run_module("sglang_router.launch_router", run_name="__main__", alter_sys=True)')
ROUTER_LAUNCHER = ["python3", "-c", ROUTER_PROGRAM]


@dataclass
class HiCachePlan:
    enabled: bool
    ratio: float | None = None
    host_budget_gb: float | None = None
    device_kv_pool_gb: float | None = None
    arithmetic: list[str] = field(default_factory=list)


@dataclass
class ServerPlan:
    host: str
    address: str
    name: str
    role: str
    unit: str
    container: str
    gpus: list[int]
    tp_size: int
    numa_node: int
    numa_source: str
    cpuset_cpus: str
    cpuset_mems: str
    ports: dict[str, int]
    url: str
    hicache: HiCachePlan
    flags: list[str]
    argv: list[str]
    env: dict[str, str]
    # how a restart of this server loses nothing in flight (roles/serving, docs/rollouts.md): see rollout_plan()
    rollout: dict[str, Any] = field(default_factory=dict)


@dataclass
class RouterPlan:
    host: str
    address: str
    port: int  # the public port: the front door's
    internal_port: int  # sglang-router's, on 127.0.0.1
    prometheus_port: int
    url: str  # what clients use: the front door
    internal_url: str  # the router itself, from the router host (the watchdog probes here, past admission)
    metrics_url: str
    prefill: list[dict[str, Any]]
    decode: list[dict[str, Any]]
    flags: list[str]
    argv: list[str]
    # the admission limits as numbers: enforced by the front door (HAProxy), not by the router's own flags
    admission: dict[str, int]
    frontdoor: dict[str, Any]  # HAProxy's settings (pdstack/controller/render/frontdoor.py renders its config)
    stop_timeout_secs: int  # the router unit's stop budget: drain grace + 10 s


@dataclass
class Plan:
    inventory: str
    environment: str
    engine: str
    image: str | None
    image_id: str | None
    image_tarball: str | None
    image_pull: str | None  # REGISTRY/REPO@sha256:... pulled by the image phase instead of a tarball
    image_labels: dict[str, str]  # io.pdstack.* labels the image must carry (from the manifest; {} with a ref)
    model: dict[str, Any]
    servers: list[ServerPlan]
    router: RouterPlan
    monitoring_hosts: list[str]
    warnings: list[str]
    # where Prometheus/Grafana run and the Grafana names the dashboards use: {hosts, grafana: {datasource_uid, folder}}
    monitoring: dict[str, Any] = field(default_factory=dict)
    # the rollout bounds (pdstack_rollout, drain defaulting to the router's request timeout)
    rollout: dict[str, Any] = field(default_factory=dict)
    # the smoke phase's recall grid, default and --full, with its estimated time on the real host (load/recall_grid)
    recall: dict[str, Any] | None = None
    # per host: the PCIe settings wanted, and which are in force or wait for a reboot (load/host_settings.py)
    host_settings: dict[str, Any] = field(default_factory=dict)
    # per host: the P2P gate's GPU pairs, all-reduce groups and floors (plan/p2p_plan.py; roles/serving runs it)
    p2p: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=2)

    def validate(self) -> Plan:
        """Check the plan against plan.schema.json; a mismatch is a planner bug (or a field added without the
        schema), never a user error."""
        problems = schema_problems(self.to_dict())
        if problems:
            raise AssertionError(f"the plan does not match {SCHEMA_FILE.name} (a pdstack bug): " + "; ".join(problems))
        return self

    def for_host(self, host: str) -> Plan:
        servers = [s for s in self.servers if s.host == host]
        return Plan(**{**self.__dict__, "servers": servers})


def schema_problems(plan: dict[str, Any]) -> list[str]:
    """Every way `plan` (a plan as JSON data) departs from plan.schema.json, as '<path>: <what>'."""
    from pdstack.controller.load.schema import jsonschema_module

    jsonschema = jsonschema_module()  # only here: importing it costs ~0.5 s

    validator = jsonschema.Draft202012Validator(json.loads(SCHEMA_FILE.read_text()))
    return [f"{'/'.join(map(str, e.absolute_path)) or '(top)'}: {e.message}"
            for e in sorted(validator.iter_errors(plan), key=lambda e: list(map(str, e.absolute_path)))]


def hicache_plan(s: dict, facts: dict, node: int, reserve_gb: float) -> HiCachePlan:
    hc = s["hicache"]
    if not hc["enabled"]:
        return HiCachePlan(enabled=False)
    node_mb = next(n["mem_total_mb"] for n in facts["numa_nodes"] if n["id"] == node)
    node_gb = node_mb / 1024
    budget, pool = float(hc["host_budget_gb"]), float(hc["device_kv_pool_gb"])
    # Round down so the host pool never exceeds its budget.
    ratio = math.floor(budget / pool * 1000) / 1000
    lines = [
        f"NUMA node {node}: {node_mb} MiB = {node_gb:.1f} GiB; membind confines {s['name']} to it",
        f"  minus pdstack_numa_reserve_gb {reserve_gb:g} GiB -> {node_gb - reserve_gb:.1f} GiB for HiCache on node "
        f"{node}",
        f"  host_budget_gb {budget:g} GiB (fits: {node_gb - reserve_gb - budget:.1f} GiB left before other servers "
        "on the node)",
        f"  --hicache-ratio = host_budget_gb / device_kv_pool_gb = {budget:g} / {pool:g} = {budget / pool:.4f} "
        f"-> {ratio:.3f} (rounded down)",
        f"  host pool = {ratio:.3f} x {pool:g} GiB = {ratio * pool:.1f} GiB",
    ]
    return HiCachePlan(enabled=True, ratio=ratio, host_budget_gb=budget, device_kv_pool_gb=pool, arithmetic=lines)


def server_flags(dep: Deployment, s: dict, hc: HiCachePlan) -> list[str]:
    m = dep.model
    out = ["--model-path", m["path"], "--served-model-name", m["served_name"], "--tp-size", str(s["tp_size"]),
           "--host", "0.0.0.0", "--port", str(s["ports"]["http"]), "--context-length", str(m["context_length"]),
           "--disaggregation-mode", s["role"],
           "--disaggregation-transfer-backend", s["transfer"]["backend"]]
    if s["role"] == "prefill":
        out += ["--disaggregation-bootstrap-port", str(s["ports"]["bootstrap"])]
    if s["transfer"]["ib_device"]:
        out += ["--disaggregation-ib-device", s["transfer"]["ib_device"]]
    out += ["--enable-metrics"]
    if m["trust_remote_code"]:
        out += ["--trust-remote-code"]
    for key in ("tool_call_parser", "reasoning_parser"):  # no --chat-template: SGLang uses the model's own
        if value := variables.parser_setting(m, key):
            out += [f"--{key.replace('_', '-')}", value]
    if hc.enabled and s["role"] == "decode":
        # 0.5.23 turns a decode server's radix cache off unless this flag is given, then refuses HiCache without a
        # radix cache at start ("enable-hierarchical-cache and disable-radix-cache are mutually exclusive"):
        # srt/arg_groups/pd_disaggregation_hook.py handle_pd_disaggregation, kv_cache_hook.py (docs/recipe.md)
        out += ["--disaggregation-decode-enable-radix-cache"]
    if hc.enabled:
        out += ["--enable-hierarchical-cache", "--hicache-ratio", f"{hc.ratio:.3f}",
                "--hicache-write-policy", s["hicache"]["write_policy"],
                "--hicache-io-backend", s["hicache"]["io_backend"],
                "--hicache-mem-layout", s["hicache"]["mem_layout"]]
    try:
        return out + flags.render_extra(s["extra_args"], flags.sglang_parser())
    except flags.Unrenderable as e:  # a value the argv cannot carry as meant: refused at render, naming it
        raise InventoryError([f"server {s['name']}: {e}"]) from None




def server_env(dep: Deployment, s: dict) -> dict[str, str]:
    # NVIDIA_VISIBLE_DEVICES: the GPUs the container runtime exposes (the sim test engine just reports it)
    env = {"NVIDIA_VISIBLE_DEVICES": ",".join(map(str, s["gpus"]))}
    env.update({name: f"{dep.pd[key]:g}" if isinstance(dep.pd[key], float) else str(dep.pd[key])
                for key, name in PD_ENV.items()})
    if dep.model["family"] == "deepseek_v4":  # the same on prefill and decode: their PD page rows must match in size
        env.update(index_k_env(dep.model["index_k_dtype"], dep.model["gpu_arch"]))
    env.update({str(k): str(v) for k, v in s["env"].items()})
    return env


def router_flags(dep: Deployment, servers: list[ServerPlan]) -> tuple[list[str], list[dict], list[dict]]:
    r = dep.router
    prefill = [{"name": s.name, "url": s.url, "bootstrap_port": s.ports["bootstrap"]}
               for s in servers if s.role == "prefill"]
    decode = [{"name": s.name, "url": s.url} for s in servers if s.role == "decode"]
    out = ["--pd-disaggregation"]
    for w in prefill:
        out += ["--prefill", w["url"], str(w["bootstrap_port"])]
    for w in decode:
        out += ["--decode", w["url"]]
    # behind the front door on loopback; metrics on every address (Prometheus may be on another host)
    out += ["--host", "127.0.0.1", "--port", str(r["internal_port"]), "--prometheus-host", "0.0.0.0",
            "--prometheus-port", str(r["prometheus_port"]), "--policy", r["policy"]]
    if r["prefill_policy"]:
        out += ["--prefill-policy", r["prefill_policy"]]
    if r["decode_policy"]:
        out += ["--decode-policy", r["decode_policy"]]
    ret, hc, cb = r["retries"], r["health_check"], r["circuit_breaker"]
    # the router's own limiter off: 0.3.2's is a token bucket, not a concurrency cap (docs/facts.md, sglang-router
    # 0.3.2); the front door admits (render/frontdoor.py)
    out += ["--max-concurrent-requests", "-1",
            "--retry-max-retries", str(ret["max_retries"]),
            "--retry-initial-backoff-ms", str(ret["initial_backoff_ms"]),
            "--retry-max-backoff-ms", str(ret["max_backoff_ms"]),
            "--health-check-endpoint", hc["endpoint"],
            "--health-check-interval-secs", str(hc["interval_secs"]),
            "--health-check-timeout-secs", str(hc["timeout_secs"]),
            "--health-failure-threshold", str(hc["failure_threshold"]),
            "--health-success-threshold", str(hc["success_threshold"]),
            "--cb-failure-threshold", str(cb["failure_threshold"]),
            "--cb-timeout-duration-secs", str(cb["timeout_secs"]),
            # above the front door's budget: the router never times out (and retries) an attempt before HAProxy's
            # 504; it still caps a whole stream (render/frontdoor.py)
            "--request-timeout-secs", str(r["request_timeout_secs"] + ROUTER_TIMEOUT_MARGIN_SECS),
            "--shutdown-grace-period-secs", str(r["shutdown_grace_period_secs"])]
    try:
        return out + flags.render_extra(r["extra_args"], flags.router_parser()), prefill, decode
    except flags.Unrenderable as e:
        raise InventoryError([f"pdstack_router.{e}"]) from None


def _url_host(address: str) -> str:
    """An address as the host part of a URL (IPv6 in brackets)."""
    return f"[{address}]" if ":" in address else address


def frontdoor_bind(dep: Deployment) -> str:
    """pdstack_router.frontdoor.bind; in production its wildcard default (which an explicit wildcard cannot be told
    from) means the router host's address, when a literal IP: render/frontdoor_check.py refuses a wildcard there."""
    bind, address = dep.router["frontdoor"].get("bind") or "", dep.hosts[dep.router_host].address
    if dep.environment == "production" and bind in ("", variables.FRONTDOOR.fields["bind"].default):
        with contextlib.suppress(ValueError):
            return str(ipaddress.ip_address(address))
    return bind


def frontdoor_plan(dep: Deployment) -> dict[str, Any]:
    """The front door's settings (HAProxy on the router host): admission from pdstack_router.admission."""
    r = dep.router
    adm, fd = r["admission"], r["frontdoor"]
    return {"bind": frontdoor_bind(dep), "port": r["port"], "backend_address": "127.0.0.1",
            "backend_port": r["internal_port"],
            "max_concurrent_requests": adm["max_concurrent_requests"], "queue_size": adm["queue_size"],
            "queue_timeout_secs": adm["queue_timeout_secs"], "retry_after_secs": fd["retry_after_secs"],
            "request_read_timeout_secs": fd["request_read_timeout_secs"], "max_body_bytes": fd["max_body_bytes"],
            "max_connections_per_source": fd["max_connections_per_source"],
            "cors_origins": list(fd["cors_origins"]),
            # the one time budget: HAProxy answers 504 JSON when the router has not answered within it (the
            # router's own timeout is later, so it never retries a timed-out request)
            "server_timeout_secs": r["request_timeout_secs"], "client_timeout_secs": fd["client_timeout_secs"],
            "served_models": [dep.model["served_name"]],
            # an old worker drains at most this long after a reload (a stream lasts at most the router's timeout)
            "hard_stop_after_secs": r["request_timeout_secs"] + 60,
            "max_connections": max(4096, 4 * (adm["max_concurrent_requests"] + adm["queue_size"])),
            "metrics_bind": "0.0.0.0", "metrics_port": fd["metrics_port"],
            # HAProxy's runtime API and the maintenance switch (an ACL file) that roles/serving flips over it
            "runtime_socket": RUNTIME_SOCKET, "maintenance_file": MAINTENANCE_FILE,
            "metrics_url": f"http://{_url_host(dep.hosts[dep.router_host].address)}:{fd['metrics_port']}/metrics"}


def rollout_plan(s: ServerPlan, servers: list[ServerPlan]) -> dict[str, Any]:
    """How a restart of `s` loses nothing in flight. With another server of its role (`peers`), drain "router": it is
    taken out of the router (sglang-router 0.3.2's DELETE /workers/{id}), its in-flight requests finish, it restarts,
    passes /health and a generation through it (`probe`: prefill -> KV transfer -> decode, sent straight to the pair
    as the router would), and is put back (POST /workers with `worker`). Alone in its role, drain "frontdoor": the
    front door's maintenance switch answers new requests 503 + Retry-After while its in-flight ones finish and it
    restarts; the switch goes off once the router serves through it again."""
    peers = [o.name for o in servers if o.role == s.role and o.name != s.name]
    other = next((o for o in servers if o.role != s.role), None)
    prefill, decode = (s, other) if s.role == "prefill" else (other, s)
    worker: dict[str, Any] = {"url": s.url, "worker_type": s.role}
    if s.role == "prefill":
        worker["bootstrap_port"] = s.ports["bootstrap"]
    probe = None
    if prefill is not None and decode is not None:
        probe = {"prefill_url": prefill.url, "bootstrap_host": prefill.address,
                 "bootstrap_port": prefill.ports["bootstrap"], "decode_url": decode.url}
    return {"drain": "router" if peers else "frontdoor", "peers": peers, "worker": worker, "probe": probe}


def build_plan(dep: Deployment, facts: dict[str, dict], require_image: bool = False) -> Plan:
    """The plan of a CHECKED deployment (pdstack.controller.pipeline.make_plan checks first, then calls this, then
    reads the rendered artifacts back): a pure function of its inputs, it checks nothing but what only it can know
    (the image it resolves)."""
    launcher = SIM_LAUNCHER if dep.image["engine"] == "sim" else SGLANG_LAUNCHER
    servers: list[ServerPlan] = []
    for h, s in dep.servers():
        f = facts[h.name]
        node = resolve_node(s, f)
        if node is None:  # no GPU facts for these indices (caught above); keep mypy and readers honest
            raise InventoryError([f"host_vars/{h.name} server {s['name']}: cannot tell its NUMA node"])
        cpus = next(n["cpus"] for n in f["numa_nodes"] if n["id"] == node)
        hc = hicache_plan(s, f, node, h.numa_reserve_gb)
        fl = server_flags(dep, s, hc)
        servers.append(ServerPlan(
            host=h.name, address=h.address, name=s["name"], role=s["role"],
            unit=f"pdstack-server-{s['name']}.service", container=f"pdstack-{s['name']}", gpus=list(s["gpus"]),
            tp_size=s["tp_size"], numa_node=node,
            numa_source="override" if s["numa_override"] else "facts", cpuset_cpus=cpus, cpuset_mems=str(node),
            ports={"http": s["ports"]["http"], "bootstrap": s["ports"]["bootstrap"], "metrics": s["ports"]["http"]},
            url=f"http://{_url_host(h.address)}:{s['ports']['http']}", hicache=hc, flags=fl, argv=[*launcher, *fl],
            env=server_env(dep, s)))
    for sp in servers:
        sp.rollout = rollout_plan(sp, servers)
    rf, prefill, decode = router_flags(dep, servers)
    rh = dep.hosts[dep.router_host]
    router = RouterPlan(host=rh.name, address=rh.address, port=dep.router["port"],
                        internal_port=dep.router["internal_port"], prometheus_port=dep.router["prometheus_port"],
                        url=f"http://{_url_host(rh.address)}:{dep.router['port']}",
                        internal_url=f"http://127.0.0.1:{dep.router['internal_port']}",
                        metrics_url=f"http://{_url_host(rh.address)}:{dep.router['prometheus_port']}/metrics",
                        prefill=prefill, decode=decode, flags=rf, argv=[*ROUTER_LAUNCHER, *rf],
                        admission={k: int(dep.router["admission"][k])
                                   for k in ("max_concurrent_requests", "queue_size", "queue_timeout_secs")},
                        frontdoor=frontdoor_plan(dep),
                        stop_timeout_secs=dep.router["shutdown_grace_period_secs"] + 10)
    img = image_choice.resolve_image(dep.image, dep.warnings, require=require_image)
    pcie = {h: host_settings.wanted(dep.host_settings, facts.get(h) or {}) for h in sorted(dep.hosts)}
    return Plan(inventory=dep.source, environment=dep.environment, engine=dep.image["engine"], image=img.ref,
                image_id=img.image_id, image_tarball=img.tarball, image_pull=img.pull, image_labels=img.labels,
                model={**dep.model, "index_reader": index_reader(dep.model["index_k_dtype"]), "lock": dep.model_lock,
                       "fetch": model_plan.fetch_plan(dep),
                       "needs": model_plan.host_needs(dep, facts)}, servers=servers, router=router,
                monitoring_hosts=dep.monitoring_hosts, warnings=dep.warnings + host_settings.reboot_warnings(pcie),
                host_settings=pcie,
                p2p=p2p_plan.gate_plan(list(dep.hosts), [asdict(sp) for sp in servers], facts, dep.image["engine"]),
                monitoring={"hosts": list(dep.monitoring_hosts),
                            "grafana": {"datasource_uid": DATASOURCE_UID, "folder": FOLDER},
                            **exporter_ports(dep)},
                rollout={"drain_timeout_secs": dep.rollout["drain_timeout_secs"] or dep.router["request_timeout_secs"],
                         "probe_timeout_secs": dep.rollout["probe_timeout_secs"],
                         "watchdog_hold_file": WATCHDOG_HOLD_FILE},
                recall=recall_grid.smoke_estimates(dep.smoke, dep.model["context_length"],
                                                   recall_grid.concurrency(dep.smoke, dep.router["admission"]))
                if dep.smoke.get("enabled") else None)


def exporter_ports(dep: Deployment) -> dict[str, int]:
    """The ports Prometheus scrapes the exporters on (every host: node_exporter; GPU hosts: dcgm-exporter): the
    inventory's node_exporter_port / dcgm_exporter_port, else their roles' defaults (the one source)."""
    return {k: scraped_port(dep, k) for k in ("node_exporter_port", "dcgm_exporter_port")}
