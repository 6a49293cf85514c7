"""Bad inventories: each must fail in preflight with a message naming the variable and the fix.

Every case copies inventory/production, breaks one thing, and runs the same code `pdstack plan` and the preflight
role run. None of them contacts a host (there is none: the facts come from a recorded topology).
"""

from __future__ import annotations

import copy
import json
import random
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdstack.controller import pipeline
from pdstack.controller.check import extra_args, network, preflight
from pdstack.controller.load import flags, inventory, rules, tables
from pdstack.controller.load.facts import load_facts
from pdstack.controller.load.variables import ROLE_PORT_VARS
from pdstack.controller.plan import planner
from pdstack.errors import InventoryError

ROOT = Path(__file__).resolve().parents[1]
PROD = ROOT / "inventory" / "production"
TOPO = ROOT / "tests" / "topologies"
SERVERS = Path("host_vars/gpu01/servers.yml")


def _edit(inv: Path, rel: str | Path, fn) -> None:
    p = inv / rel
    data = yaml.safe_load(p.read_text()) if p.exists() else {}
    fn(data)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(data, sort_keys=False))


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    d = tmp_path / "production"
    shutil.copytree(PROD, d)
    return d


def plan(inv: Path, topo: str = "reference-2node-8gpu.json"):
    dep = inventory.load(inv)
    return pipeline.make_plan(dep, load_facts(TOPO / topo, list(dep.hosts)))


def servers(fn):
    return lambda d: fn(d["pdstack_servers"])


ROUTER = "group_vars/all/router.yml"
MODEL = "group_vars/all/model.yml"
IMAGE = "group_vars/all/image.yml"
SMOKE = "group_vars/all/smoke.yml"
ROLLOUT = "group_vars/all/rollout.yml"
ADDRESS = Path("host_vars/gpu01/address.yml")


def C(name: str, rel, edit, expected: list[str], facts=None, deploy: bool = False, stage: str = "static"):
    """One bad inventory: `edit` changes file `rel` of a copy of inventory/production (or, with rel None, gets the
    inventory directory); `facts` edits the recorded topology; `expected`: fragments of the message (the variable,
    what is wrong, the fix). stage "static": caught by the static checks alone (no facts, before any host is
    contacted); "topology": needs the host's facts."""
    return pytest.param(rel, edit, expected, facts, deploy, stage, id=name)


def server(i: int, **kw):
    return servers(lambda s: s[i].update(**kw))


def extra(i: int, **kw):
    return servers(lambda s: s[i]["extra_args"].update({k.replace("_", "-"): v for k, v in kw.items()}))


def extra_kv(i: int, key: str, value):
    return servers(lambda s: s[i]["extra_args"].update({key: value}))


def env(i: int, key: str, value):
    return servers(lambda s: s[i].setdefault("env", {}).update({key: value}))


def router(**kw):
    return lambda d: d["pdstack_router"].update(**kw)


def router_extra(key: str, value):
    return lambda d: d["pdstack_router"].setdefault("extra_args", {}).update({key: value})


def model(**kw):
    return lambda d: d["pdstack_model"].update(**kw)


def address(value):
    return lambda d: d.update(pdstack_address=value)


def two_hosts(gpu02_address: str = "10.0.0.12", gpu01_address: str | None = "10.0.0.11"):
    """gpu01 keeps prefill (and router, monitoring); decode moves to a second host gpu02."""
    def edit(inv: Path):
        hosts = yaml.safe_load((inv / "hosts.yml").read_text())
        hosts["all"]["children"]["gpu"]["hosts"]["gpu02"] = {"ansible_host": gpu02_address, "ansible_user": "root"}
        (inv / "hosts.yml").write_text(yaml.safe_dump(hosts))
        data = yaml.safe_load((inv / SERVERS).read_text())
        decode = data["pdstack_servers"].pop(1)
        (inv / SERVERS).write_text(yaml.safe_dump(data))
        (inv / "host_vars/gpu02").mkdir()
        (inv / "host_vars/gpu02/servers.yml").write_text(yaml.safe_dump({"pdstack_servers": [decode]}))
        if gpu01_address:
            (inv / ADDRESS).write_text(yaml.safe_dump({"pdstack_address": gpu01_address}))
    return edit


def with_model(**cfg):
    """Facts as the facts script reports them with --model-path: the model's config.json was read."""
    return lambda f: f.update(model={"path": "/models/nvidia/DeepSeek-V4-Flash-NVFP4", **cfg})


def _max_queued(d):
    d["pdstack_servers"][0]["extra_args"]["max-queued-requests"] = 32


def _max_queued_without_admission(inv: Path):
    _edit(inv, SERVERS, _max_queued)
    _edit(inv, ROUTER, lambda d: d["pdstack_router"].update(admission={"max_concurrent_requests": -1}))


NAME_RULE = "letters, digits, '.', '_' and '-'"

CASES = [
    # --- the original 27
    C("hicache-size-dsv4", SERVERS, extra(0, hicache_size=150),
      ["extra_args.hicache-size", "DeepSeek V4 rejects --hicache-size", "host_budget_gb"]),
    C("overlapping-gpus", SERVERS, server(1, gpus=[3, 4, 5, 6]),
      ["pdstack_servers[1] (decode-0).gpus", "GPU 3 is also used by prefill-0"], stage="topology"),
    C("gpu-beyond-count", SERVERS, server(1, gpus=[6, 7, 8, 9]),
      ["decode-0).gpus", "GPU(s) [8, 9] do not exist", "has 8 GPU(s)"], stage="topology"),
    C("tp-mismatch", SERVERS, server(0, tp_size=2),
      ["prefill-0).tp_size", "2 does not match its 4 GPUs", "set tp_size: 4"]),
    C("numa-node-missing", SERVERS, server(0, numa_node=3, numa_override=True),
      ["prefill-0).numa_node", "has no NUMA node 3"], stage="topology"),
    C("numa-mismatch", SERVERS, server(0, numa_node=1),
      ["prefill-0).numa_node", "1 is not the node its GPUs hang off (0)", "numa_override: true"], stage="topology"),
    C("port-collision", SERVERS, servers(lambda s: s[1]["ports"].update(http=30000)),
      ["decode-0).ports.http", "port 30000 on host gpu01 is already taken", "prefill-0).ports.http"]),
    C("router-port-collision", ROUTER, router(port=8998), ["pdstack_router.port", "port 8998", "ports.bootstrap"]),
    C("hicache-over-node-memory", SERVERS, servers(lambda s: s[0]["hicache"].update(host_budget_gb=240)),
      ["hicache.host_budget_gb", "240 GiB on NUMA node 0", "lower host_budget_gb"], stage="topology"),
    C("max-queued-without-admission", None, _max_queued_without_admission,
      ["extra_args.max-queued-requests", "ignores it on PD servers",
       "pdstack_router.admission.max_concurrent_requests"]),
    C("typo-server-key", SERVERS, server(0, tp_szie=4),
      ["pdstack_servers[0].tp_szie", "unknown key", "did you mean 'tp_size'"]),
    C("typo-router-key", ROUTER, lambda d: d["pdstack_router"]["admission"].update(queue_sise=10),
      ["pdstack_router.admission.queue_sise", "did you mean 'queue_size'"]),
    C("typo-hicache-key", SERVERS, servers(lambda s: s[0]["hicache"].update(host_budget=10)),
      ["hicache.host_budget", "did you mean 'host_budget_gb'"]),
    C("typo-top-level-var", ROUTER, lambda d: d.update(pdstack_routr=d.pop("pdstack_router")),
      ["pdstack_routr", "unknown pdstack variable", "did you mean 'pdstack_router'"]),
    C("abbreviated-sglang-flag", SERVERS, extra_kv(1, "cuda-graph-max-bs", 8),
      ["decode-0).extra_args", "SGLang 0.5.23 rejects it", "cuda-graph-max-bs", "did you mean"]),
    C("unknown-sglang-flag", SERVERS, extra_kv(0, "mem-fraction", 0.8),
      ["prefill-0).extra_args", "SGLang 0.5.23 rejects it", "--mem-fraction"]),
    # --- issue 45: what Ansible would read differently, by class
    C("admission-shadowed-in-host-vars", "host_vars/gpu01/router.yml", lambda d: d.update(pdstack_router={
        "port": 8000, "admission": {"max_concurrent_requests": 4096, "queue_size": 100000}}),
      ["pdstack_router (host_vars/gpu01/router.yml:1): set for host gpu01, but it is a deployment-wide setting",
       "move it to group_vars/all"]),
    C("image-shadowed-in-a-group", "group_vars/gpu/image.yml", lambda d: d.update(pdstack_image={"ref": "x"}),
      ["pdstack_image (group_vars/gpu/image.yml:1): set for group gpu"]),
    C("two-addresses-from-two-groups", None, lambda inv: (inv / "hosts.yml").write_text(
        (inv / "hosts.yml").read_text().replace("    router:\n      hosts:\n        gpu01:\n",
                                                "    router:\n      vars:\n        ansible_host: 10.9.9.9\n"
                                                "      hosts:\n        gpu01:\n")),
      ["ansible_host: host gpu01 gets it from 2 places (hosts.yml:", "keep it in one place"]),
    C("profile-flipped-in-host-vars", "host_vars/gpu01/profile.yml", lambda d: d.update(pdstack_environment="local"),
      ["pdstack_environment (host_vars/gpu01/profile.yml:1): set for host gpu01, but it is a deployment-wide "
       "setting"]),
    C("profile-flipped-in-group-vars", "group_vars/all/deployment.yml", lambda d: d.update(pdstack_environment="test"),
      ["pdstack_environment: test (group_vars/all/deployment.yml:", "would switch production's checks off",
       "pdstack_image.engine is sglang"]),
    C("top-level-merge-key", "group_vars/all/merged.yml", lambda d: d.update({"<<": {"pdstack_environment": "test"}}),
      ["group_vars/all/merged.yml:1: a YAML merge key (<<) among the variables", "write each variable out"]),
    C("served-name-look-alike", MODEL, lambda d: d["pdstack_model"].update(served_name="deepseek-v4-fl\u0430sh"),
      ["pdstack_model.served_name", "U+0430 CYRILLIC SMALL LETTER A, not ASCII", "'deepseek-v4-flash'"]),
    C("served-name-past-an-argv-word", MODEL, lambda d: d["pdstack_model"].update(served_name="x" * 200_000),
      ["pdstack_model.served_name: 200000 characters, over 256"]),
    C("ld-audit-in-env", SERVERS, env(0, "LD_AUDIT", "/tmp/x.so"),
      ["(prefill-0).env.LD_AUDIT", "the dynamic loader reads it", "remove env.LD_AUDIT"]),
    C("pythonstartup-in-env", SERVERS, env(1, "PYTHONSTARTUP", "/tmp/x.py"),
      ["(decode-0).env.PYTHONSTARTUP", "Python reads it at startup"]),
    C("glibc-tunables-in-env", SERVERS, env(1, "GLIBC_TUNABLES", "glibc.malloc.check=3"),
      ["env.GLIBC_TUNABLES", "glibc's loader reads it"]),
    C("gpu-numa-node-minus-one-on-two-nodes", SERVERS, lambda d: None,
      ["(prefill-0).gpus: GPUs [0, 1, 2, 3] report NUMA node(s) [-1]", "no affinity", "numa_override: true"],
      facts=lambda f: [g.update(numa_node=-1) for g in f["gpus"][:4]], stage="topology"),
    C("numa-nodes-with-overlapping-cpus", SERVERS, lambda d: None,
      ["malformed facts (NUMA nodes 0 and 1 both list CPU 0", "overlapping cpusets"],
      facts=lambda f: f["numa_nodes"][1].update(cpus="0-40"), stage="topology"),
    # --- the front door (issue 44): admission decode cannot run; CORS origins a browser never sends
    C("admission-above-decode-capacity", SERVERS, extra(1, max_running_requests=16),
      ["pdstack_router.admission.max_concurrent_requests: 32 (+ 1 for the watchdog's probe)",
       "max-running-requests", "= 16",
       "lower max_concurrent_requests to 15", "raise the decode servers' max-running-requests to 33"]),
    C("admission-equal-to-decode-capacity", SERVERS, extra(1, max_running_requests=32),
      ["max_concurrent_requests: 32 (+ 1", "= 32", "to 31"]),
    C("cors-wildcard-origin", ROUTER, lambda d: d["pdstack_router"].update(frontdoor={"cors_origins": ["*"]}),
      ["pdstack_router.frontdoor.cors_origins: '*' is not a browser origin", "scheme://host[:port]"],
      stage="topology"),
    C("cors-origin-with-path", ROUTER,
      lambda d: d["pdstack_router"].update(frontdoor={"cors_origins": ["https://chat.example.com/"]}),
      ["cors_origins: 'https://chat.example.com/' is not a browser origin"], stage="topology"),
    C("cors-origin-default-port", ROUTER,
      lambda d: d["pdstack_router"].update(frontdoor={"cors_origins": ["https://chat.example.com:443"]}),
      ["a browser sends no port when it is the scheme's default", "https://chat.example.com"], stage="topology"),
    C("cors-origin-upper-case", ROUTER,
      lambda d: d["pdstack_router"].update(frontdoor={"cors_origins": ["https://Chat.example.com"]}),
      ["is not a browser origin", "lower case"], stage="topology"),
    C("owned-flag-in-extra", SERVERS, extra_kv(0, "tp-size", 4),
      ["extra_args.tp-size", "the planner renders --tp-size itself", "tp_size"]),
    C("wrong-type", SERVERS, server(0, tp_size="four"), ["pdstack_servers[0].tp_size", "expected integer", "'four'"]),
    C("bad-choice", SERVERS, servers(lambda s: s[0]["transfer"].update(backend="rdma")),
      ["transfer.backend", "'rdma' is not one of", "'mooncake'"]),
    C("sim-in-production", IMAGE, lambda d: d["pdstack_image"].update(engine="sim"),
      ["pdstack_image.engine", "TEST ENGINE", "engine: sglang"]),
    C("no-decode", SERVERS, servers(lambda s: s.pop(1)), ["no decode server", "role: decode"]),
    C("duplicate-names", SERVERS, server(1, name="prefill-0"), ["name: 'prefill-0' is also used", "unique"]),
    C("missing-model-path", MODEL, lambda d: d["pdstack_model"].pop("path"), ["pdstack_model.path: required"]),
    C("relative-model-path", MODEL, model(path="models/x"), ["pdstack_model.path", "must be an absolute path"]),
    C("hicache-without-pool-size", SERVERS, servers(lambda s: s[0]["hicache"].pop("device_kv_pool_gb")),
      ["hicache.device_kv_pool_gb: required when hicache.enabled"]),
    C("metrics-port-differs", SERVERS, servers(lambda s: s[0]["ports"].update(metrics=9100)),
      ["ports.metrics", "serves /metrics on its HTTP port"]),
    C("gpus-span-nodes", SERVERS, servers(lambda s: (s[0].update(gpus=[2, 3, 4, 5]), s[1].update(gpus=[0, 1, 6, 7]))),
      ["prefill-0).gpus", "hang off NUMA nodes [0, 1]"], stage="topology"),

    # --- names that become unit, container and file names: one rule, said in the message
    C("name-with-space", SERVERS, server(0, name="prefill 0"),
      ["pdstack_servers[0].name", "'prefill 0' is not a valid name", NAME_RULE, "systemd unit"]),
    C("name-path-traversal", SERVERS, server(1, name="../decode/0"),
      ["pdstack_servers[1].name", "'../decode/0' is not a valid name", "file name"]),
    C("name-empty", SERVERS, server(0, name=""), ["pdstack_servers[0].name", "'' is not a valid name"]),
    C("name-leading-dash", SERVERS, server(0, name="-prefill"),
      ["pdstack_servers[0].name", "starting with a letter or digit"]),
    C("name-too-long", SERVERS, server(0, name="p" * 64), ["pdstack_servers[0].name", "1-63 characters"]),
    C("name-non-ascii", SERVERS, server(0, name="préfill"), ["pdstack_servers[0].name", "not a valid name"]),
    C("name-with-dollar", SERVERS, server(1, name="decode$0"), ["pdstack_servers[1].name", "not a valid name"]),
    C("name-takes-the-routers-container", SERVERS, server(1, name="router"),
      ["pdstack_servers[1].name", "'router' is reserved", "container pdstack-router"]),
    C("names-differ-only-in-case", SERVERS, server(1, name="PREFILL-0"),
      ["decode-0" if False else "PREFILL-0", "is also used on gpu01", "unique"]),

    # --- extra_args: ownership by meaning (argparse dest), not spelling
    C("alias-model", SERVERS, extra_kv(0, "model", "/elsewhere"),
      ["prefill-0).extra_args.model", "the planner renders --model-path itself", "model_path",
       "set pdstack_model.path instead"]),
    C("alias-tensor-parallel-size", SERVERS, extra_kv(1, "tensor-parallel-size", 4),
      ["extra_args.tensor-parallel-size", "renders --tp-size itself", "tp_size instead"]),
    C("alias-enable-hicache", SERVERS, extra_kv(0, "enable-hicache", True),
      ["extra_args.enable-hicache", "renders --enable-hierarchical-cache", "hicache.enabled"]),
    C("alias-mooncake-ib-device", SERVERS, extra_kv(0, "mooncake-ib-device", "mlx5_0"),
      ["extra_args.mooncake-ib-device", "transfer.ib_device instead"]),
    C("owned-port", SERVERS, extra_kv(1, "port", 31000), ["extra_args.port", "renders --port", "ports.http"]),
    C("owned-host", SERVERS, extra_kv(1, "host", "127.0.0.1"),
      ["extra_args.host", "renders --host itself, servers listen on 0.0.0.0", "remove extra_args.host"]),
    C("owned-disaggregation-mode", SERVERS, extra_kv(0, "disaggregation-mode", "null"),
      ["extra_args.disaggregation-mode", "the server's role"]),
    C("owned-context-length", SERVERS, extra_kv(0, "context-length", 4096),
      ["extra_args.context-length", "pdstack_model.context_length"]),
    C("owned-hicache-ratio", SERVERS, extra_kv(0, "hicache-ratio", 2.0),
      ["extra_args.hicache-ratio", "the planner computes it"]),
    C("gpu-set-dp-size", SERVERS, extra_kv(0, "dp-size", 2),
      ["extra_args.dp-size", "changes which or how many GPUs", "remove extra_args.dp-size"]),
    C("gpu-set-data-parallel-size-alias", SERVERS, extra_kv(0, "data-parallel-size", 2),
      ["extra_args.data-parallel-size", "--dp-size changes which or how many GPUs"]),
    C("gpu-set-pp-size", SERVERS, extra_kv(1, "pp-size", 2), ["extra_args.pp-size", "how many GPUs"]),
    C("gpu-set-base-gpu-id", SERVERS, extra_kv(1, "base-gpu-id", 4),
      ["extra_args.base-gpu-id", "which or how many GPUs"]),
    C("gpu-set-gpu-id-step", SERVERS, extra_kv(1, "gpu-id-step", 2), ["extra_args.gpu-id-step", "GPUs"]),
    C("gpu-set-nnodes", SERVERS, extra_kv(0, "nnodes", 2), ["extra_args.nnodes", "on one host"]),
    C("gpu-set-node-rank", SERVERS, extra_kv(0, "node-rank", 1), ["extra_args.node-rank", "GPUs"]),
    C("gpu-set-nccl-init-addr-alias", SERVERS, extra_kv(0, "nccl-init-addr", "10.0.0.1:5000"),
      ["extra_args.nccl-init-addr", "--dist-init-addr changes"]),
    C("gpu-set-device", SERVERS, extra_kv(0, "device", "cpu"), ["extra_args.device", "GPUs"]),

    # --- router extra_args: same rule with sglang-router's parser; the worker set is the inventory's
    C("router-worker-urls", ROUTER, router_extra("worker-urls", ["http://10.9.9.9:30000"]),
      ["pdstack_router.extra_args.worker-urls", "adds workers from outside the inventory", "remove"]),
    C("router-extra-decode", ROUTER, router_extra("decode", "http://10.9.9.9:30001"),
      ["pdstack_router.extra_args.decode", "renders --decode itself", "pdstack_servers"]),
    C("router-service-discovery", ROUTER, router_extra("service-discovery", True),
      ["extra_args.service-discovery", "outside the inventory"]),
    C("router-health-interval", ROUTER, router_extra("health-check-interval-secs", 1),
      ["extra_args.health-check-interval-secs", "pdstack_router.health_check.interval_secs"]),
    C("router-health-failure-threshold", ROUTER, router_extra("health-failure-threshold", 9),
      ["extra_args.health-failure-threshold", "health_check.failure_threshold"]),
    C("router-retry-backoff", ROUTER, router_extra("retry-max-backoff-ms", 10),
      ["extra_args.retry-max-backoff-ms", "pdstack_router.retries.max_backoff_ms"]),
    C("router-disable-retries", ROUTER, router_extra("disable-retries", True),
      ["extra_args.disable-retries", "pdstack_router.retries.max_retries"]),
    C("router-prometheus-host", ROUTER, router_extra("prometheus-host", "127.0.0.1"),
      ["extra_args.prometheus-host", "Prometheus on the monitoring host"]),
    C("router-unknown-flag", ROUTER, router_extra("polcy", "random"),
      ["pdstack_router.extra_args.polcy", "sglang-router 0.3.2 rejects it", "did you mean 'policy'"]),
    C("router-bad-value", ROUTER, router_extra("cache-threshold", "high"),
      ["pdstack_router.extra_args", "sglang-router 0.3.2 rejects it", "cache-threshold"]),

    # --- values: the form the flag takes, and what a unit can carry
    C("mapping-for-scalar-flag", SERVERS, extra_kv(0, "mem-fraction-static", {"a": 1}),
      ["extra_args.mem-fraction-static", "a mapping, but --mem-fraction-static takes one value"]),
    C("list-for-scalar-flag", SERVERS, extra_kv(1, "chunked-prefill-size", [4096, 8192]),
      ["extra_args.chunked-prefill-size", "a list, but --chunked-prefill-size takes one value"]),
    C("invalid-json-string", SERVERS, extra_kv(0, "json-model-override-args", "{not json"),
      ["extra_args.json-model-override-args", "takes JSON", "not valid JSON", "YAML mapping"]),
    C("json-with-space-in-string", SERVERS, extra_kv(0, "json-model-override-args", {"architectures": ["A B"]}),
      ["extra_args.json-model-override-args", "whitespace", "systemd unit"]),
    # a value a unit cannot carry as it is (tokenizer-path stands for any flag): server, value, the message
    *(C(f"value-with-{what}", SERVERS, extra_kv(i, "tokenizer-path", value), ["extra_args.tokenizer-path", *msg])
      for what, i, value, msg in [
          ("space", 0, "/models/my tokenizer", ["contains whitespace", "change the value"]),
          ("dollar", 0, "/models/$HOME", ["'$'", "systemd expands it"]),
          ("newline", 1, "/models/a\nExecStartPre=/bin/sh", ["whitespace"]),
          ("quote", 1, "/models/it's", ["single quote"]),
          ("backslash", 1, "/models/a\\b", ["backslash"])]),
    C("switch-with-value", SERVERS, extra_kv(0, "disable-radix-cache", "yes"),
      ["extra_args.disable-radix-cache", "is a switch and takes no value", "write true"]),
    C("extra-arg-without-value", SERVERS, extra_kv(0, "disable-cuda-graph", None),
      ["extra_args.disable-cuda-graph", "no value (YAML null)", "write true for a switch"]),
    C("value-flag-given-true", SERVERS, extra_kv(0, "mem-fraction-static", True),
      ["extra_args.mem-fraction-static", "takes a value, got true"]),
    C("bad-choice-in-extra", SERVERS, extra_kv(0, "kv-cache-dtype", "fp3"),
      ["extra_args", "SGLang 0.5.23 rejects it", "fp3"], stage="static"),
    C("model-path-with-space", MODEL, model(path="/models/my model"),
      ["pdstack_model.path", "'/models/my model'", "no spaces"]),
    C("model-path-with-colon", MODEL, model(path="/models/a:b"), ["pdstack_model.path", "--volume"]),
    C("model-path-traversal", MODEL, model(path="/models/../etc"),
      ["pdstack_model.path", "not a normalized path", "'/etc'"]),
    C("model-path-root", MODEL, model(path="/"), ["pdstack_model.path", "root directory"]),
    C("served-name-with-space", MODEL, model(served_name="deepseek v4"),
      ["pdstack_model.served_name", "whitespace", "deepseek-v4-flash"]),
    C("served-name-with-quote", MODEL, model(served_name="it's"), ["pdstack_model.served_name", "single quote"]),
    C("image-ref-invalid", IMAGE,
      lambda d: d.update(pdstack_image={"ref": "PdStack/SGLang latest", "engine": "sglang"}),
      ["pdstack_image.ref", "is not a container image reference", "[registry/]name[:tag]"]),
    C("registry-ref-not-a-digest", IMAGE,
      lambda d: d.update(pdstack_image={"ref": "reg.example.com/pdstack/sglang:0123", "registry": "reg.example.com",
                                        "engine": "sglang"}),
      ["pdstack_image.ref", "is not a digest reference",
       "set ref to reg.example.com/pdstack/sglang@sha256:<digest>", "or set manifest instead"]),
    C("registry-ref-other-registry", IMAGE,
      lambda d: d.update(pdstack_image={"ref": "a.example.com/pdstack/sglang@sha256:" + "0" * 64,
                                        "registry": "b.example.com:5000", "engine": "sglang"}),
      ["pdstack_image.ref", "names registry a.example.com", "b.example.com:5000/pdstack/sglang@sha256:"]),
    C("registry-is-a-url", IMAGE, lambda d: d["pdstack_image"].update(registry="http://10.0.0.5:5000"),
      ["pdstack_image.registry", "'http://10.0.0.5:5000' is not a registry address", "HOST[:PORT]", "no scheme"]),
    C("registry-read-as-hub-namespace", IMAGE, lambda d: d["pdstack_image"].update(registry="myregistry"),
      ["pdstack_image.registry", "Docker Hub namespace", "myregistry:5000"]),
    C("registry-and-tarball", IMAGE,
      lambda d: d["pdstack_image"].update(registry="10.0.0.5:5000", tarball="build/images/prod.tar"),
      ["pdstack_image.tarball", "together with pdstack_image.registry", "remove one of them"]),
    C("digest-without-registry", IMAGE, lambda d: d["pdstack_image"].update(digest="sha256:" + "a" * 64),
      ["pdstack_image.digest", "only with pdstack_image.registry", "set registry, or remove digest"]),
    C("digest-malformed", IMAGE,
      lambda d: d["pdstack_image"].update(registry="10.0.0.5:5000", digest="sha256:ABC"),
      ["pdstack_image.digest", "'sha256:ABC' is not an image digest", "64 lower-case hex", "pushed.digest_ref"]),
    C("health-endpoint-not-a-path", ROUTER, lambda d: d["pdstack_router"]["health_check"].update(endpoint="health"),
      ["pdstack_router.health_check.endpoint", "starting with '/'", "/health"]),

    # --- env: planner-owned variables, names, values
    # the planner's own variables: server, variable, value, what the message names (the variable first)
    *(C(name, SERVERS, env(i, var, value), msg) for name, i, var, value, msg in [
        ("env-owns-visible-devices", 0, "NVIDIA_VISIBLE_DEVICES", "0,1,2,3,4,5,6,7",
         ["prefill-0).env.NVIDIA_VISIBLE_DEVICES", "the planner sets", "the server's gpus"]),
        ("env-cuda-visible-devices", 1, "CUDA_VISIBLE_DEVICES", "0",
         ["env.CUDA_VISIBLE_DEVICES", "the planner sets", "gpus"]),
        ("env-owns-bf16-index-k", 1, "PDSTACK_DSV4_BF16_INDEX_K", "0",
         ["decode-0).env.PDSTACK_DSV4_BF16_INDEX_K", "pdstack_model.index_k_dtype"]),
        ("env-owns-pd-timeout", 0, "SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "10",
         ["env.SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT", "pdstack_pd.bootstrap_timeout_s"]),
        ("env-owns-sm120-switch", 0, "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "0",
         ["env.SGLANG_FP8_PAGED_MQA_LOGITS_TORCH", "pdstack_model.index_k_dtype and gpu_arch"])]),
    C("env-bad-name", SERVERS, env(0, "MY-VAR", "1"), ["env.MY-VAR", "not an environment variable name"]),
    C("env-bool-value", SERVERS, env(0, "NCCL_DEBUG_X", True), ["env.NCCL_DEBUG_X", "YAML boolean", 'quote']),
    C("env-mapping-value", SERVERS, env(0, "X", {"a": 1}), ["env.X", "one string"]),
    C("env-newline-value", SERVERS, env(0, "X", "a\nY=b"), ["env.X", "line break"]),
    C("env-leading-space", SERVERS, env(0, "X", " a"), ["env.X", "leading or trailing whitespace"]),

    # --- numbers with their real limits
    C("tp-size-not-power-of-two", SERVERS, server(0, gpus=[0, 1, 2], tp_size=3),
      ["prefill-0).tp_size", "3 is not a power of two", "tp_size: 2"]),
    C("hicache-ratio-zero", SERVERS, servers(lambda s: s[0]["hicache"].update(host_budget_gb=0.1)),
      ["prefill-0).hicache", "0.1 / 180 = 0.0006 -> 0.000", "a host pool of 0 GiB", "raise host_budget_gb"]),
    C("hicache-budget-zero", SERVERS, servers(lambda s: s[0]["hicache"].update(host_budget_gb=0)),
      ["hicache.host_budget_gb", "must be > 0"]),
    C("hicache-pool-negative", SERVERS, servers(lambda s: s[1]["hicache"].update(device_kv_pool_gb=-5)),
      ["hicache.device_kv_pool_gb", "must be > 0"]),
    C("numa-reserve-negative", SERVERS, lambda d: d.update(pdstack_numa_reserve_gb=-200),
      ["pdstack_numa_reserve_gb", "-200 must be >= 0"]),
    C("numa-node-negative", SERVERS, server(0, numa_node=-1, numa_override=True), ["numa_node", "must be >= 0"]),
    C("context-length-zero", MODEL, model(context_length=0), ["pdstack_model.context_length", "must be > 0"]),
    C("context-length-beyond-model", MODEL, model(context_length=10_000_000),
      ["pdstack_model.context_length", "10000000 is beyond the model's 1048576", "max_position_embeddings",
       "context_length <= 1048576"],
      facts=with_model(context_length=1048576, context_key="max_position_embeddings", num_attention_heads=64),
      stage="topology"),
    C("tp-does-not-divide-heads", MODEL, model(served_name="deepseek-v4-flash"),
      ["prefill-0).tp_size", "4 does not divide the model's 6 attention heads", "e.g. 2"],
      facts=with_model(context_length=1048576, context_key="max_position_embeddings", num_attention_heads=6),
      stage="topology"),
    C("queue-size-negative", ROUTER, lambda d: d["pdstack_router"]["admission"].update(queue_size=-1),
      ["pdstack_router.admission.queue_size", "must be >= 0"]),
    C("admission-zero", ROUTER, lambda d: d["pdstack_router"]["admission"].update(max_concurrent_requests=0),
      ["max_concurrent_requests", "must be -1 (off) or > 0"]),
    C("retries-negative", ROUTER, lambda d: d["pdstack_router"]["retries"].update(max_retries=-1),
      ["pdstack_router.retries.max_retries", ">= 0"]),
    C("backoff-cap-below-initial", ROUTER,
      lambda d: d["pdstack_router"]["retries"].update(initial_backoff_ms=500, max_backoff_ms=100),
      ["retries.max_backoff_ms", "below initial_backoff_ms 500"]),

    C("rollout-drain-zero", ROLLOUT, lambda d: d["pdstack_rollout"].update(drain_timeout_secs=0),
      ["pdstack_rollout.drain_timeout_secs", "must be > 0", "whole number of seconds, e.g. 600"]),
    C("rollout-drain-not-a-number", ROLLOUT, lambda d: d["pdstack_rollout"].update(drain_timeout_secs="10m"),
      ["pdstack_rollout.drain_timeout_secs", "expected integer", "'10m'"]),
    C("rollout-drain-beyond-request-timeout", ROLLOUT, lambda d: d["pdstack_rollout"].update(drain_timeout_secs=900),
      ["pdstack_rollout.drain_timeout_secs: 900 s is longer than pdstack_router.request_timeout_secs 600 s",
       "set drain_timeout_secs <= 600, or leave it unset"]),
    C("rollout-probe-negative", ROLLOUT, lambda d: d["pdstack_rollout"].update(probe_timeout_secs=-5),
      ["pdstack_rollout.probe_timeout_secs", "must be > 0"]),
    C("rollout-unknown-key", ROLLOUT, lambda d: d["pdstack_rollout"].update(drain_timeout=30),
      ["pdstack_rollout.drain_timeout", "unknown key", "did you mean 'drain_timeout_secs'?"]),

    C("context-length-beyond-dsv4", MODEL, model(context_length=10_000_000),
      ["pdstack_model.context_length", "beyond DeepSeek V4's 1048576-token context", "context_length <= 1048576"]),
    C("mem-fraction-above-one", SERVERS, extra_kv(0, "mem-fraction-static", 1.5),
      ["prefill-0).extra_args.mem-fraction-static", "1.5 is out of range", "0 < value < 1"]),
    C("chunked-prefill-zero", SERVERS, extra_kv(0, "chunked-prefill-size", 0),
      ["extra_args.chunked-prefill-size", "0 is out of range", "-1 (no chunking)"]),
    C("page-size-not-power-of-two", SERVERS, servers(lambda s: [x["extra_args"].update({"page-size": 48}) for x in s]),
      ["extra_args.page-size", "48 is out of range", "a power of two"]),
    C("one-setting-twice-by-alias", SERVERS, servers(lambda s: s[0]["extra_args"].update(
        {"ep-size": 4, "expert-parallel-size": 2})),
      ["prefill-0).extra_args", "ep-size, expert-parallel-size all set ep_size", "keep one of them"]),
    C("gpu-arch-does-not-match-the-gpus", SERVERS, lambda d: None,
      ["pdstack_model.gpu_arch: sm_120", "NVIDIA H200 (sm_90)", "set gpu_arch: sm_90"],
      facts=lambda f: [g.update(name="NVIDIA H200") for g in f["gpus"]], stage="topology"),

    C("path-flag-outside-the-mount", SERVERS, extra_kv(0, "chat-template", "/etc/pdstack/template.jinja"),
      ["prefill-0).extra_args.chat-template", "/etc/pdstack/template.jinja is outside pdstack_model.path",
       "the only host directory the server's container mounts", "put the file under"]),
    C("router-path-flag", ROUTER, router_extra("tokenizer-path", "/models/nvidia/DeepSeek-V4-Flash-NVFP4"),
      ["pdstack_router.extra_args.tokenizer-path", "the router's container mounts no host directory"]),
    C("secret-in-extra-args", SERVERS, extra_kv(0, "api-key", "sk-123"),
      ["prefill-0).extra_args.api-key", "--api-key is a secret", "world-readable", "remove it"]),
    C("router-secret-in-extra-args", ROUTER, router_extra("api-key", "sk-123"),
      ["pdstack_router.extra_args.api-key", "is a secret"]),
    C("env-path", SERVERS, env(0, "PATH", "/opt/bin"), ["env.PATH", "comes from the image", "python3", "remove"]),

    # --- every port the deployment listens on, per host
    C("server-on-ssh-port", SERVERS, servers(lambda s: s[0]["ports"].update(http=22)),
      ["prefill-0).ports.http", "port 22 is privileged", "pick a port >= 1024"]),
    C("server-on-node-exporter", SERVERS, servers(lambda s: s[1]["ports"].update(http=9100)),
      ["decode-0).ports.http", "port 9100 on host gpu01 is already taken", "node_exporter",
       "node_exporter_port (roles/node_exporter/defaults)"]),
    C("server-on-prometheus", SERVERS, servers(lambda s: s[1]["ports"].update(http=9090)),
      ["decode-0).ports.http", "port 9090", "Prometheus"]),
    C("server-on-grafana", SERVERS, servers(lambda s: s[1]["ports"].update(http=3000)),
      ["decode-0).ports.http", "port 3000", "Grafana"]),
    C("server-on-dcgm", SERVERS, servers(lambda s: s[0]["ports"].update(http=9400)),
      ["prefill-0).ports.http", "port 9400", "dcgm-exporter"]),
    C("bootstrap-privileged", SERVERS, servers(lambda s: s[0]["ports"].update(bootstrap=80)),
      ["prefill-0).ports.bootstrap", "port 80 is privileged"]),
    C("bootstrap-on-http", SERVERS, servers(lambda s: s[0]["ports"].update(bootstrap=30001)),
      ["ports.http: port 30001 on host gpu01 is already taken", "ports.bootstrap"]),
    C("router-privileged", ROUTER, router(port=443), ["pdstack_router.port", "port 443 is privileged"]),
    C("router-metrics-on-server", ROUTER, router(prometheus_port=30001),
      ["pdstack_router.prometheus_port", "port 30001 on host gpu01 is already taken", "decode-0"]),
    C("router-metrics-on-node-exporter", ROUTER, router(prometheus_port=9100),
      ["pdstack_router.prometheus_port", "node_exporter"]),
    C("router-port-equals-metrics", ROUTER, router(port=29000),
      ["pdstack_router.prometheus_port: port 29000", "pdstack_router.port"]),
    C("extra-nccl-port-collides", SERVERS, extra_kv(1, "nccl-port", 30000),
      ["decode-0).extra_args.nccl-port", "port 30000 on host gpu01 is already taken", "prefill-0).ports.http"]),
    C("extra-port-out-of-range", SERVERS, extra_kv(0, "nccl-port", 70000),
      ["extra_args.nccl-port", "70000 is not a TCP port (1-65535)"]),
    C("extra-grpc-port-privileged", SERVERS, extra_kv(0, "grpc-port", 22),
      ["extra_args.grpc-port", "port 22 is privileged"]),

    # --- addresses: a host name or IP, reachable by the other hosts
    C("address-is-url", ADDRESS, address("http://gpu02:9"),
      ["host_vars/gpu01 pdstack_address", "is a URL", "only the host name or IP"]),
    C("address-with-port", ADDRESS, address("gpu02:9"), ["pdstack_address", "carries a port"]),
    C("address-not-a-hostname", ADDRESS, address("gpu_02!"),
      ["pdstack_address", "neither an IP address nor a host name"]),
    C("address-bad-ipv4", ADDRESS, address("999.1.1.1"), ["pdstack_address", "not a valid IPv4 address"]),
    C("address-unspecified", ADDRESS, address("0.0.0.0"), ["pdstack_address", "the unspecified address"]),
    C("address-loopback-multi-host", None, two_hosts(gpu02_address="127.0.0.1"),
      ["ansible_host of host gpu02", "127.0.0.1 is a loopback address", "spans 2 hosts"]),
    C("address-localhost-multi-host", None, two_hosts(gpu01_address="localhost"),
      ["host_vars/gpu01 pdstack_address", "localhost is a loopback address"]),
    C("address-ipv6-loopback-multi-host", None, two_hosts(gpu02_address="::1"), ["::1 is a loopback address"]),
    C("address-loopback-in-production", ADDRESS, address("127.0.0.1"),
      ["host_vars/gpu01 pdstack_address", "127.0.0.1 is a loopback address", "smoke gate"]),
    C("address-shared-by-two-hosts", None, two_hosts(gpu02_address="10.0.0.11"),
      ["ansible_host of host gpu02", "10.0.0.11 is also the address of host gpu01"]),
    C("address-documentation-range-deploy", None, lambda inv: None,
      ["ansible_host of host gpu01", "192.0.2.10 is in the documentation range 192.0.2.0/24", "real address"],
      deploy=True),
    C("ansible-host-documentation-range", ADDRESS, address("10.0.0.10"),
      ["ansible_host of host gpu01 (hosts.yml): 192.0.2.10 is in the documentation range", "cannot reach the host"],
      deploy=True),
    C("address-documentation-range-other-net", ADDRESS, address("203.0.113.7"),
      ["pdstack_address", "documentation range 203.0.113.0/24"], deploy=True),

    # --- prefill and decode agree on what the KV transfer depends on
    C("transfer-backend-differs", SERVERS, servers(lambda s: s[0]["transfer"].update(backend="nixl")),
      ["transfer.backend differs between servers that exchange KV pages", "prefill-0 (prefill, gpu01): nixl",
       "same transfer.backend"]),
    C("kv-cache-dtype-one-side", SERVERS, extra_kv(0, "kv-cache-dtype", "fp8_e4m3"),
      ["--kv-cache-dtype (extra_args) differs", "decode-0 (decode, gpu01): default", "extra_args.kv-cache-dtype"]),
    C("page-size-differs", SERVERS, servers(lambda s: (s[0]["extra_args"].update({"page-size": 64}),
                                                      s[1]["extra_args"].update({"page-size": 32}))),
      ["--page-size (extra_args) differs", "64", "32"]),
    C("transfer-env-one-side", SERVERS, env(1, "MOONCAKE_PROTOCOL", "tcp"),
      ["env.MOONCAKE_PROTOCOL differs", "prefill-0 (prefill, gpu01): unset", "same value"]),

    # --- InfiniBand device: a name by rule, present on the host
    C("ib-device-bad-name", SERVERS, servers(lambda s: s[0]["transfer"].update(ib_device="mlx5 0")),
      ["transfer.ib_device", "not an InfiniBand device name", "ibv_devices"]),
    C("ib-device-json-mapping", SERVERS, servers(lambda s: s[0]["transfer"].update(ib_device='{"0": "mlx5_0"}')),
      ["transfer.ib_device", "comma-separated list"]),
    C("ib-device-not-on-host", SERVERS, servers(lambda s: [x["transfer"].update(ib_device="mlx5_9") for x in s]),
      ["transfer.ib_device: mlx5_9 not on host gpu01", "mlx5_0, mlx5_1", "unset ib_device"],
      facts=lambda f: f.update(infiniband=["mlx5_0", "mlx5_1"]), stage="topology"),
    C("ib-device-host-has-none", SERVERS, servers(lambda s: [x["transfer"].update(ib_device="mlx5_0") for x in s]),
      ["mlx5_0 not on host gpu01", "no devices"], facts=lambda f: f.update(infiniband=[]), stage="topology"),

    # --- the smoke gate: one that could never pass is an inventory error
    C("smoke-length-beyond-context", MODEL, model(context_length=16000),
      ["pdstack_smoke.grid.lengths", "[16384, 24576, 32768, 49152, 65536, 98304, 131072] are past "
       "pdstack_model.context_length 16000", "built 64 tokens shorter"]),
    C("smoke-horizon-unreachable", SMOKE, lambda d: d["pdstack_smoke"].update(min_horizon=200000),
      ["pdstack_smoke.min_horizon", "beyond the longest recall length 131072", "never pass"]),
    C("smoke-gate-short-of-the-context", SMOKE, lambda d: d["pdstack_smoke"].update(min_horizon=16000),
      ["production's recall gate must reach the context it serves", "min_horizon at least 65536 (now 16000)"]),
    C("smoke-grid-over-budget", SMOKE, lambda d: d["pdstack_smoke"].update(recall_budget_s=60),
      ["pdstack_smoke.grid: its recall run is estimated at", "over pdstack_smoke.recall_budget_s 60 s",
       "pdstack_smoke.full"]),
    C("smoke-without-tokenizer", SMOKE, lambda d: d["pdstack_smoke"].pop("tokenizer"),
      ["pdstack_smoke.tokenizer: unset", "the model's tokenizer directory on the controller", "enabled: false"]),

    C("smoke-bench-concurrency-not-numbers", SMOKE, lambda d: d["pdstack_smoke"]["bench"].update(concurrency=[1, "a"]),
      ["pdstack_smoke.bench.concurrency", "must be a list of concurrency levels > 0"]),

    # --- facts that are not what the facts script writes: a message, not a traceback
    C("facts-malformed", SERVERS, lambda d: None, ["host gpu01: malformed facts", "numa_nodes", "pdstack facts"],
      facts=lambda f: f.update(numa_nodes="two"), stage="topology"),
]


def _apply(inv: Path, rel, edit) -> None:
    if rel is None:
        edit(inv)
    else:
        _edit(inv, rel, edit)


def _facts(tmp_path: Path, facts_edit) -> Path:
    if facts_edit is None:
        return TOPO / "reference-2node-8gpu.json"
    topo = json.loads((TOPO / "reference-2node-8gpu.json").read_text())
    facts_edit(topo)
    f = tmp_path / "facts.json"
    f.write_text(json.dumps(topo))
    return f


def test_at_least_75_bad_inventories():
    assert len(CASES) >= 75


@pytest.mark.parametrize(("rel", "edit", "expected", "facts_edit", "deploy", "stage"), CASES)
def test_bad_inventory_is_rejected_with_its_message(inv: Path, tmp_path: Path, rel, edit, expected, facts_edit,
                                                    deploy, stage):
    before = {p: p.read_bytes() for p in inv.rglob("*") if p.is_file()}
    _apply(inv, rel, edit)
    facts = _facts(tmp_path, facts_edit)
    with pytest.raises(InventoryError) as err:
        dep = inventory.load(inv)
        pipeline.make_plan(dep, load_facts(facts, list(dep.hosts)), deploy=deploy)
    msg = str(err.value)
    for fragment in expected:
        assert fragment in msg, f"{fragment!r} not in:\n{msg}"
    if stage == "static":  # caught without facts: before the preflight reads anything from a host
        try:
            problems = preflight.static_problems(inventory.load(inv), deploy=deploy)
        except InventoryError as e:
            problems = e.problems
        text = "\n".join(problems)
        assert all(fragment in text for fragment in expected), f"static checks miss it:\n{text}"
    # the good inventory is still good: the failure is the edit's, not a side effect
    for p in inv.rglob("*"):  # files the edit added are emptied, not removed (Ansible caches directory listings)
        if p.is_file() and p not in before:
            p.write_text("{}\n")
    for p, data in before.items():
        p.write_bytes(data)
    assert plan(inv).servers


def test_max_queued_with_router_admission_is_a_warning_not_an_error(inv: Path):
    _edit(inv, SERVERS, _max_queued)
    p = plan(inv)
    assert any("does nothing on a PD server" in w for w in p.warnings)
    assert "--max-queued-requests" in p.servers[0].flags


def test_all_problems_are_listed_at_once(inv: Path):
    _edit(inv, SERVERS, servers(lambda s: (s[0].update(tp_size=2), s[1]["ports"].update(http=30000))))
    with pytest.raises(InventoryError) as err:
        plan(inv)
    assert len(err.value.problems) == 2


def test_hicache_budgets_of_servers_sharing_a_node_add_up(inv: Path):
    # each 150 GiB fits alone; pinned to the same node they need 300 GiB of its 187.6
    _edit(inv, SERVERS, servers(lambda s: s[0].update(numa_node=1, numa_override=True)))
    with pytest.raises(InventoryError, match=r"prefill-0 150 GiB, decode-0 150 GiB = 300 GiB on NUMA node 1"):
        plan(inv)


def test_interleaved_topology_rejects_reference_gpu_split(inv: Path):
    with pytest.raises(InventoryError, match=r"hang off NUMA nodes \[0, 1\]"):
        plan(inv, "interleaved-2node-8gpu.json")


def test_numa_override_allows_pinning(inv: Path):
    _edit(inv, SERVERS, servers(lambda s: s[0].update(numa_node=1, numa_override=True, hicache={"enabled": False})))
    p = plan(inv)
    assert p.servers[0].numa_node == 1 and p.servers[0].numa_source == "override"
    assert p.servers[0].cpuset_cpus == "32-63,96-127"


def test_simulated_gpus_refused_for_sglang_engine(inv: Path, tmp_path: Path):
    topo = json.loads((TOPO / "reference-2node-8gpu.json").read_text())
    topo["gpu_source"] = "simulated"
    f = tmp_path / "sim.json"
    f.write_text(json.dumps(topo))
    dep = inventory.load(inv)
    with pytest.raises(InventoryError, match="GPUs are simulated"):
        pipeline.make_plan(dep, load_facts(f, list(dep.hosts)))


def test_missing_facts_say_how_to_get_them(inv: Path):
    dep = inventory.load(inv)
    with pytest.raises(InventoryError, match=r"no facts; run the facts phase .* `pdstack plan --facts"):
        pipeline.make_plan(dep, {})


def test_cli_reports_problems_and_exit_code(inv: Path):
    _edit(inv, SERVERS, servers(lambda s: s[0].update(tp_size=2)))
    r = subprocess.run([sys.executable, "-m", "pdstack", "plan", "-i", str(inv), "--facts",
                        str(TOPO / "reference-2node-8gpu.json")], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2
    assert "tp_size: 2 does not match its 4 GPUs" in r.stderr
    assert r.stdout == ""


def test_missing_inventory_is_a_clear_error(tmp_path: Path):
    with pytest.raises(InventoryError, match="does not exist; pass -i inventory/production"):
        inventory.load(tmp_path / "nope")


# ------------------------------------------------------------------------------ what is accepted, and how it renders


def test_mapping_for_a_json_flag_is_rendered_as_compact_json(inv: Path):
    _edit(inv, SERVERS, servers(lambda s: [x["extra_args"].update(
        {"json-model-override-args": {"rope_theta": 10000, "architectures": ["DeepseekV4ForCausalLM"]}}) for x in s]))
    fl = plan(inv).servers[0].flags
    value = fl[fl.index("--json-model-override-args") + 1]
    assert value == '{"rope_theta":10000,"architectures":["DeepseekV4ForCausalLM"]}'
    assert flags.check_sglang(fl) is None


def test_false_turns_a_default_on_switch_off(inv: Path):
    _edit(inv, SERVERS, extra_kv(0, "enable-fused-qk-norm-rope", False))
    assert "--no-enable-fused-qk-norm-rope" in plan(inv).servers[0].flags


def test_the_production_example_ratio_below_one_is_a_warning_with_its_arithmetic(inv: Path):
    warnings = "\n".join(plan(inv).warnings)
    assert "prefill-0).hicache: --hicache-ratio = host_budget_gb / device_kv_pool_gb = 150 / 180 = 0.8333 -> 0.833" \
        in warnings
    assert "host pool (149.9 GiB) is smaller than the device pool (180 GiB)" in warnings
    assert "L2 cache effectiveness is reduced" in warnings and "raise host_budget_gb to >= 180" in warnings


def test_interleaved_host_gets_no_spurious_hicache_budget_message(inv: Path):
    with pytest.raises(InventoryError) as err:
        plan(inv, "interleaved-2node-8gpu.json")
    assert all("hang off NUMA nodes" in p for p in err.value.problems), err.value.problems


def test_numa_override_across_nodes_warns_which_gpus_are_remote(inv: Path):
    _edit(inv, SERVERS, servers(lambda s: s[0].update(numa_node=1, numa_override=True, hicache={"enabled": False})))
    warnings = "\n".join(plan(inv).warnings)
    assert "prefill-0).numa_override: the server is pinned to NUMA node 1, but GPU(s) [0, 1, 2, 3] hang off node(s) " \
        "[0]" in warnings


def test_ipv6_address_is_bracketed_in_urls(inv: Path):
    _edit(inv, ADDRESS, address("fd00::10"))
    p = plan(inv)
    assert p.servers[0].url == "http://[fd00::10]:30000" and p.router.url == "http://[fd00::10]:8000"
    assert flags.check_router(p.router.flags) is None


def test_documentation_address_warns_when_planning_and_is_refused_by_preflight(inv: Path):
    assert any("192.0.2.10 is in the documentation range" in w and "preflight refuses it" in w
               for w in plan(inv).warnings)
    r = subprocess.run([sys.executable, "-m", "pdstack", "preflight", "--static", "-i", str(inv)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and "192.0.2.10 is in the documentation range 192.0.2.0/24" in r.stderr


@pytest.mark.parametrize(("model_facts", "warning"), [
    (None, "the facts do not describe /models/nvidia/DeepSeek-V4-Flash-NVFP4/config.json"),
    ({"error": "cannot read config.json: No such file or directory"}, "could not read"),
    ({"context_length": 1048576, "num_attention_heads": 64}, None),
], ids=["facts-without-model", "config-unreadable", "config-read"])
def test_model_limits_are_checked_when_the_facts_read_config_json_and_it_says_so_when_not(
        inv: Path, tmp_path: Path, model_facts, warning):
    facts = _facts(tmp_path, None if model_facts is None else with_model(**model_facts))
    dep = inventory.load(inv)
    p = pipeline.make_plan(dep, load_facts(facts, list(dep.hosts)))
    said = [w for w in p.warnings if "were not checked against the model" in w]
    assert (warning in said[0]) if warning else not said, p.warnings


def test_allow_longer_context_env_turns_the_refusal_into_a_warning(inv: Path, tmp_path: Path):
    _edit(inv, SERVERS, servers(lambda s: [x.setdefault("env", {}).update(
        SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN="1") for x in s]))
    facts = _facts(tmp_path, with_model(context_length=65536, num_attention_heads=64))
    dep = inventory.load(inv)
    p = pipeline.make_plan(dep, load_facts(facts, list(dep.hosts)))
    assert any("beyond the model's 65536" in w and "SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN=1" in w
               for w in p.warnings)


def test_ib_device_present_on_the_host_is_rendered(inv: Path, tmp_path: Path):
    _edit(inv, SERVERS, servers(lambda s: [x["transfer"].update(ib_device="mlx5_0,mlx5_1") for x in s]))
    facts = _facts(tmp_path, lambda f: f.update(infiniband=["mlx5_0", "mlx5_1"]))
    dep = inventory.load(inv)
    fl = pipeline.make_plan(dep, load_facts(facts, list(dep.hosts))).servers[1].flags
    assert fl[fl.index("--disaggregation-ib-device") + 1] == "mlx5_0,mlx5_1"


def test_every_flag_the_planner_renders_is_owned_by_meaning(inv: Path, tmp_path: Path):
    # no extra_args, and every optional flag the planner can render: prefill, HiCache, IB device, trust-remote-code
    _edit(inv, SERVERS, servers(lambda s: [(x["transfer"].update(ib_device="mlx5_0"), x.update(extra_args={}))
                                           for x in s]))
    dep = inventory.load(inv)  # an IB device is checked against the host's facts: they list it
    p = pipeline.make_plan(dep, load_facts(_facts(tmp_path, lambda f: f.update(infiniband=["mlx5_0"])),
                                                    list(dep.hosts)))
    owned = set(extra_args.dests(flags.sglang_parser(), tables.OWNED_FLAGS))
    for s in p.servers:
        assert set(flags.dests_set(flags.sglang_parser(), s.flags)) - owned == set(), s.name
    router_owned = set(extra_args.dests(flags.router_parser(), tables.OWNED_ROUTER_FLAGS))
    assert set(flags.dests_set(flags.router_parser(), p.router.flags)) - router_owned == set()


def test_listeners_cover_every_service_of_the_deployment(inv: Path):
    dep = inventory.load(inv)
    by_what = {c.what: c.port for c in network.listeners(dep)}
    assert {"node_exporter": 9100, "Prometheus": 9090, "Grafana": 3000, "dcgm-exporter": 9400}.items() <= \
        by_what.items()
    assert by_what["sshd (Ansible reaches the host there)"] == 22
    assert by_what["the front door (HAProxy, the public port)"] == 8000
    assert by_what["sglang-router's HTTP port (on 127.0.0.1, behind the front door)"] == 8001
    assert by_what["sglang-router's metrics"] == 29000 and by_what["the front door's Prometheus exporter"] == 8404


# ------------------------------------------------------------------------------ fuzz: wrong types everywhere

FUZZ_VALUES = [None, "", "x y", -1, 0, 1.5, True, [], {}, [1, "a"], {"a": {"b": 1}}]


def _paths(value, prefix=()):
    yield prefix
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _paths(v, (*prefix, i))


def _replace(value, path, new):
    if not path:
        return new
    out = copy.deepcopy(value)
    ref = out
    for k in path[:-1]:
        ref = ref[k]
    ref[path[-1]] = new
    return out


def test_fuzz_wrong_types_everywhere_give_a_message_never_a_traceback():
    hostvars, groups = inventory.load_hostvars(PROD)
    hostvars["gpu01"]["pdstack_address"] = "10.0.0.10"
    facts = load_facts(TOPO / "reference-2node-8gpu.json", list(hostvars))
    paths = [p for p in _paths(hostvars["gpu01"]) if len(p) >= 1]
    tried = refused = 0
    for path in paths:
        for new in FUZZ_VALUES:
            hv = {"gpu01": _replace(hostvars["gpu01"], path, new)}
            tried += 1
            try:
                p = pipeline.make_plan(inventory.build_deployment(hv, groups), facts)
            except InventoryError as e:
                refused += 1
                assert e.problems and all(isinstance(p, str) and p for p in e.problems)
                continue
            for s in p.servers:  # what is accepted renders into something a unit and an env file carry
                assert all(rules.unit_value_problem(w) is None for w in s.argv), (path, new, s.argv)
                assert all(rules.env_value_problem(v) is None for v in s.env.values()), (path, new, s.env)
                assert rules.name_problem(s.name) is None
    assert tried > 1000 and refused > tried // 2, (tried, refused)


def test_fuzz_extra_args_of_every_kind_give_a_message_never_a_traceback():
    hostvars, groups = inventory.load_hostvars(PROD)
    hostvars["gpu01"]["pdstack_address"] = "10.0.0.10"
    facts = load_facts(TOPO / "reference-2node-8gpu.json", list(hostvars))
    options = sorted(o[2:] for o in flags.sglang_parser()._option_string_actions if o.startswith("--"))
    router_options = sorted(o[2:] for o in flags.router_parser()._option_string_actions if o.startswith("--"))
    rng = random.Random(11)
    for key in rng.sample(options, 40) + rng.sample(router_options, 15):
        for new in [*FUZZ_VALUES, "1", 8]:
            hv = copy.deepcopy(hostvars)
            if key in router_options and key not in options:
                hv["gpu01"]["pdstack_router"].setdefault("extra_args", {})[key] = new
            else:
                hv["gpu01"]["pdstack_servers"][0]["extra_args"][key] = new
            try:
                p = pipeline.make_plan(inventory.build_deployment(hv, groups), facts)
            except InventoryError as e:
                assert e.problems
                continue
            for s in p.servers:  # what is accepted is what the unit can carry and SGLang parses
                assert all(rules.unit_value_problem(w) is None for w in s.flags), s.flags
                assert flags.check_sglang(s.flags) is None
            assert flags.check_router(p.router.flags) is None


def test_facts_script_reads_the_models_context_length_as_sglang_does(tmp_path: Path):
    from pdstack.hostside import facts as facts_script

    (tmp_path / "config.json").write_text(json.dumps({
        "text_config": {"max_position_embeddings": 4096, "rope_scaling": {"factor": 4, "type": "yarn"},
                        "num_attention_heads": 64, "num_key_value_heads": 8}}))
    (tmp_path / ".pdstack-staging" / "shards").mkdir(parents=True)
    (tmp_path / ".pdstack-staging" / "shards" / "a.safetensors.part").write_bytes(b"x" * 7)
    m = facts_script.model_facts(str(tmp_path))
    disk = m.pop("disk")
    assert m == {"path": str(tmp_path), "context_length": 16384, "context_key": "max_position_embeddings",
                 "num_attention_heads": 64, "num_key_value_heads": 8,
                 # the model phase's room check: the files there, and what a broken transfer left in staging
                 "files": {"config.json": (tmp_path / "config.json").stat().st_size},
                 "partial": {"shards/a.safetensors": 7}}
    assert disk["path"] == str(tmp_path) and disk["free_bytes"] > 0
    gone = facts_script.model_facts(str(tmp_path / "nope" / "deeper"))
    assert "error" in gone and gone["disk"]["path"] == str(tmp_path)  # the nearest directory that exists
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "config.json").write_text("{")
    assert "not JSON" in facts_script.model_facts(str(tmp_path / "bad"))["error"]


def test_a_flag_the_planner_starts_rendering_is_owned_without_a_table_entry(inv: Path, monkeypatch):
    real = planner.server_flags
    monkeypatch.setattr(planner, "server_flags", lambda dep, s, hc: [*real(dep, s, hc), "--max-running-requests",
                                                                      "64"])
    _edit(inv, SERVERS, extra_kv(0, "max-running-requests", 32))
    with pytest.raises(InventoryError, match=r"extra_args.max-running-requests: the planner renders "
                                             "--max-running-requests itself; set the pdstack inventory variable"):
        plan(inv)


def test_every_fixed_listener_names_a_real_role_default():
    # The port list reads roles/<role>/defaults/main.yml, with no fallback: a renamed role or variable is an error.
    import re

    src = (ROOT / "pdstack" / "controller" / "check" / "network.py").read_text()
    fixed = re.findall(r'_fixed\("(\w+)",', src)
    assert sorted(fixed) == sorted(ROLE_PORT_VARS), fixed
    for key, role in ROLE_PORT_VARS.items():
        assert rules.role_default(role, key) is not None, f"roles/{role}/defaults/main.yml has no {key}"
        assert 1024 <= rules.role_port(role, key) <= 65535, (role, key)
    # the preflight role hands these variables to the planner (and so to this check) with the pdstack_* ones
    resolved = (ROOT / "roles" / "preflight" / "tasks" / "resolved.yml").read_text()
    wanted = re.search(r"__preflight_wanted: '(.*)'", resolved).group(1)
    assert all(re.match(wanted, k) for k in ROLE_PORT_VARS), wanted
    assert not re.match(wanted, "node_exporter_textfile_dir")
    with pytest.raises(ValueError, match="roles/node_exporter/defaults/main.yml: node_exporter_portt is None"):
        rules.role_port("node_exporter", "node_exporter_portt")


def test_exporter_ports_have_one_source_the_role_defaults(inv: Path):
    """9100 (node_exporter) and 9400 (dcgm-exporter) are written once, in their roles' defaults; preflight's port
    check, scrape.py's defaults, the plan and the prometheus role's scrape ports all read them and agree."""
    import re

    from ansible.parsing.dataloader import DataLoader
    from ansible.template import Templar, trust_as_template

    from pdstack.controller.render.monitoring import scrape

    ne = rules.role_port("node_exporter", "node_exporter_port")
    dc = rules.role_port("dcgm_exporter", "dcgm_exporter_port")
    assert (ne, dc) == (9100, 9400)
    assert (scrape.NODE_EXPORTER_PORT, scrape.DCGM_EXPORTER_PORT) == (ne, dc)
    by_what = {c.what: c.port for c in network.listeners(inventory.load(inv))}
    assert (by_what["node_exporter"], by_what["dcgm-exporter"]) == (ne, dc)
    mon = plan(inv).to_dict()["monitoring"]
    assert (mon["node_exporter_port"], mon["dcgm_exporter_port"]) == (ne, dc)
    defaults = yaml.safe_load((ROOT / "roles" / "prometheus" / "defaults" / "main.yml").read_text())
    t = Templar(loader=DataLoader(), variables={"prometheus_plan": {"monitoring": mon}})
    assert [int(t.template(trust_as_template(defaults[k]))) for k in ("prometheus_node_exporter_port",
                                                   "prometheus_dcgm_exporter_port")] == [ne, dc]
    # nowhere else are they written (the 9400 after dcgm-exporter's -p is the port inside its container)
    spelled = []
    for f in [*(ROOT / "pdstack").rglob("*.py"), *(ROOT / "roles").glob("*/defaults/*.yml"),
              *(ROOT / "roles").glob("*/tasks/*.yml"), *(ROOT / "roles").rglob("*.j2")]:
        for n, line in enumerate(f.read_text().splitlines(), 1):
            if re.search(r"\b(9100|9400)\b", line.replace("}}:9400 ", "}}:CONTAINER ")):
                spelled.append(f"{f.relative_to(ROOT)}:{n}: {line.strip()}")
    assert sorted(spelled) == ["roles/dcgm_exporter/defaults/main.yml:10: dcgm_exporter_port: 9400",
                               "roles/node_exporter/defaults/main.yml:10: node_exporter_port: 9100"], spelled


MONITORING = "group_vars/all/monitoring.yml"


def _listener(dep, what: str) -> dict[str, tuple]:
    return {c.host: (c.port, c.variable) for c in network.listeners(dep) if c.what == what}


def test_preflight_checks_the_ports_the_inventory_moves(inv: Path):
    """A port the inventory moves (group_vars or host_vars) is the one checked and the one the plan uses; the
    role's default port is then free."""
    _edit(inv, MONITORING, lambda d: d.update(node_exporter_port=9200, grafana_port="3300"))
    dep = inventory.load(inv)
    assert _listener(dep, "node_exporter") == {"gpu01": (9200, "node_exporter_port (inventory, host gpu01)")}
    assert _listener(dep, "Grafana") == {"gpu01": (3300, "grafana_port (inventory, host gpu01)")}
    assert _listener(dep, "dcgm-exporter") == {"gpu01": (9400, "dcgm_exporter_port (roles/dcgm_exporter/defaults)")}
    assert plan(inv).monitoring["node_exporter_port"] == 9200  # what the prometheus role scrapes
    # a server on the old default port is fine now; one on the moved port clashes, naming where it was moved
    _edit(inv, SERVERS, servers(lambda s: s[1]["ports"].update(http=9100)))
    assert plan(inv).servers[1].ports["http"] == 9100
    _edit(inv, SERVERS, servers(lambda s: s[1]["ports"].update(http=9200)))
    with pytest.raises(InventoryError, match=r"decode-0\).ports.http: port 9200 on host gpu01 is already taken by "
                                             r"node_exporter_port \(inventory, host gpu01\) \(node_exporter\)"):
        plan(inv)


def test_a_moved_port_that_is_not_a_port_or_differs_by_host_is_refused(inv: Path):
    _edit(inv, MONITORING, lambda d: d.update(prometheus_listen="0.0.0.0:http"))
    with pytest.raises(InventoryError, match=r"prometheus_listen \(inventory, host gpu01\): '0.0.0.0:http' is not a "
                                             r"TCP port"):
        plan(inv)
    (inv / MONITORING).write_text("{}\n")
    two_hosts()(inv)
    _edit(inv, "host_vars/gpu02/monitoring.yml", lambda d: d.update(node_exporter_port=9200))
    with pytest.raises(InventoryError, match=r"node_exporter_port: differs between hosts \(gpu01 9100, gpu02 9200\), "
                                             r"but Prometheus scrapes one port on every host; set it once in "
                                             r"group_vars/all"):
        plan(inv)
