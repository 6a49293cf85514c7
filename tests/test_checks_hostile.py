"""Hostile inventories (issue 19, classes 4-8): a careless or hostile edit of a production inventory is refused before
any host changes, naming the variable and the fix.

Every case is a copy of inventory/production with a real-looking address (the unedited copy plans for a deploy,
placeholder checks included) and one edit; facts are the recorded reference host's (8 GPUs, two NUMA nodes of
251.6 GiB), as the facts script writes them (an `infiniband` list, empty: the reference host has no RDMA device).
"""

from __future__ import annotations

import copy
import json
import shutil
from pathlib import Path

import pytest
import yaml

from pdstack.controller import pipeline
from pdstack.controller.check import budgets
from pdstack.controller.load import inventory, rules
from pdstack.controller.load.facts import load_facts
from pdstack.errors import InventoryError

ROOT = Path(__file__).resolve().parents[1]
PROD = ROOT / "inventory" / "production"
REF = json.loads((ROOT / "tests" / "topologies" / "reference-2node-8gpu.json").read_text())
SERVERS = "host_vars/gpu01/servers.yml"
ROUTER = "group_vars/all/router.yml"
MODEL = "group_vars/all/model.yml"
IMAGE = "group_vars/all/image.yml"
ADDRESS = "host_vars/gpu01/address.yml"
REAL = "10.20.30.11"  # a real-looking address: not loopback, not a documentation range
MODEL_PATH = "/models/nvidia/DeepSeek-V4-Flash-NVFP4"


def _yaml_edit(inv: Path, rel: str, fn) -> None:
    p = inv / rel
    data = yaml.safe_load(p.read_text()) if p.exists() else {}
    fn(data)
    p.parent.mkdir(parents=True, exist_ok=True)
    p.write_text(yaml.safe_dump(data, sort_keys=False, width=1 << 20))


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    d = tmp_path / "production"
    shutil.copytree(PROD, d)
    _yaml_edit(d, "hosts.yml", lambda h: h["all"]["children"]["gpu"]["hosts"]["gpu01"].update(ansible_host=REAL))
    return d


def _facts(tmp_path: Path, edit=None, hosts=("gpu01",)) -> Path:
    """The reference host's facts for each host; `edit(facts_by_host)` changes them."""
    by_host = {h: {**copy.deepcopy(REF), "hostname": h, "infiniband": []} for h in hosts}
    if edit is not None:
        edit(by_host)
    f = tmp_path / "facts.json"
    f.write_text(json.dumps(by_host))
    return f


def refused(inv: Path, tmp_path: Path, facts_edit=None) -> str:
    """The message of the InventoryError a deploy of `inv` gets (the same checks `pdstack preflight` runs)."""
    with pytest.raises(InventoryError) as err:  # never another exception: a traceback is not a refusal
        dep = inventory.load(inv)
        facts = load_facts(_facts(tmp_path, facts_edit, tuple(dep.hosts)), list(dep.hosts))
        pipeline.make_plan(dep, facts, deploy=True)
    return str(err.value)


def servers(fn):
    return lambda inv: _yaml_edit(inv, SERVERS, lambda d: fn(d["pdstack_servers"]))


def server(i: int, **kw):
    return servers(lambda s: s[i].update(**kw))


def extra(i: int, key: str, value):
    return servers(lambda s: s[i]["extra_args"].update({key: value}))


def hicache(i: int, **kw):
    return servers(lambda s: s[i]["hicache"].update(**kw))


def transfer(i: int | None, **kw):
    return servers(lambda s: [x["transfer"].update(**kw) for j, x in enumerate(s) if i is None or j == i])


def env(i: int, values: dict):
    return servers(lambda s: s[i].setdefault("env", {}).update(values))


def router(fn):
    return lambda inv: _yaml_edit(inv, ROUTER, lambda d: fn(d["pdstack_router"]))


def image(**kw):
    def edit(d):
        d["pdstack_image"].update(kw)
        for k in [k for k, v in d["pdstack_image"].items() if v is None]:
            del d["pdstack_image"][k]
    return lambda inv: _yaml_edit(inv, IMAGE, edit)


def model(**kw):
    return lambda inv: _yaml_edit(inv, MODEL, lambda d: d["pdstack_model"].update(kw))


def address(value: str):
    return lambda inv: _yaml_edit(inv, ADDRESS, lambda d: d.update(pdstack_address=value))


def two_hosts(gpu02_address: str = "10.20.30.12"):
    """Decode moves to a second host gpu02 (gpu01 keeps prefill, the router and monitoring)."""
    def edit(inv: Path):
        _yaml_edit(inv, "hosts.yml", lambda h: h["all"]["children"]["gpu"]["hosts"].update(
            gpu02={"ansible_host": gpu02_address, "ansible_user": "root"}))
        data = yaml.safe_load((inv / SERVERS).read_text())
        decode = data["pdstack_servers"].pop(1)
        (inv / SERVERS).write_text(yaml.safe_dump(data))
        (inv / "host_vars/gpu02").mkdir()
        (inv / "host_vars/gpu02/servers.yml").write_text(yaml.safe_dump({"pdstack_servers": [decode]}))
    return edit


def both(*edits):
    def edit(inv: Path):
        for e in edits:
            e(inv)
    return edit


def C(name: str, edit, expected: list, facts=None):
    """One hostile edit; `expected`: fragments of the refusal (the variable, what is wrong, the fix). A tuple of
    fragments: any one of them (the loader refuses some edits before the checks see them, in its own words: the
    check's message is then the defence for values that arrive by `--vars`, as the preflight role passes them)."""
    return pytest.param(edit, expected, facts, id=name)


def assert_fragments(msg: str, expected: list) -> None:
    for fragment in expected:
        alternatives = fragment if isinstance(fragment, tuple) else (fragment,)
        assert any(a in msg for a in alternatives), f"none of {alternatives!r} in:\n{msg}"


LOAD_NULL = "is empty (null); remove the key or give it a value"
LOAD_QUOTED = "is a quoted number; write it without quotes"


def _comment_out_admission(inv: Path) -> None:
    p = inv / ROUTER
    lines = p.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.strip() == "admission:")
    out = lines[:start + 1] + [f"#{line}" if line.startswith("    ") else line for line in lines[start + 1:]]
    p.write_text("\n".join(out) + "\n")


def test_the_unedited_production_copy_plans_for_a_deploy(inv: Path, tmp_path: Path):
    dep = inventory.load(inv)
    plan = pipeline.make_plan(dep, load_facts(_facts(tmp_path), list(dep.hosts)), deploy=True)
    assert [s.name for s in plan.servers] == ["prefill-0", "decode-0"]
    assert plan.router.frontdoor["max_concurrent_requests"] == 32
    assert not any("documentation range" in w for w in plan.warnings), plan.warnings


# ------------------------------------------------------------------ class 4: production protection switched off

PRODUCTION = [
    C("admission-off", router(lambda r: r["admission"].update(max_concurrent_requests=-1)),
      ["pdstack_router.admission.max_concurrent_requests: -1 (admission control off) in production",
       "set pdstack_router.admission.max_concurrent_requests (e.g. 32)", ROUTER]),
    C("admission-section-null", router(lambda r: r.update(admission=None)),
      [("pdstack_router.admission.max_concurrent_requests: -1", "pdstack_router.admission: " + LOAD_NULL),
       ("commented-out, null", "group_vars/all/router.yml:")]),
    C("admission-commented-out", _comment_out_admission,
      [("pdstack_router.admission.max_concurrent_requests: -1", "pdstack_router.admission: " + LOAD_NULL),
       ("queue_size (e.g. 64)", "group_vars/all/router.yml:")]),
    C("admission-removed", router(lambda r: r.pop("admission")),
      ["pdstack_router.admission.max_concurrent_requests: -1"]),
    C("transfer-fake", transfer(None, backend="fake"),
      ["pdstack_servers[0] (prefill-0).transfer.backend: 'fake'", "moves no KV", "transfer.backend: mooncake"]),
    C("transfer-ascend", transfer(None, backend="ascend"), ["(decode-0).transfer.backend: 'ascend'", "NVIDIA"]),
    C("transfer-mori", transfer(None, backend="mori"), ["(prefill-0).transfer.backend: 'mori'", "ROCm"]),
    C("engine-sim", image(engine="sim"), ["pdstack_image.engine: 'sim' is the TEST ENGINE", "set engine: sglang"]),
    C("ib-device-on-one-side-of-the-pair", transfer(0, ib_device="mlx5_0"),
      ["(decode-0).transfer.ib_device: unset, but its PD peers name their RDMA devices",
       "prefill-0 (prefill, gpu01: mlx5_0)", "set transfer.ib_device on this decode server"],
      facts=lambda f: f["gpu01"].update(infiniband=["mlx5_0"])),
    C("ib-device-with-facts-that-list-none-at-all", transfer(None, ib_device="mlx5_0"),
      ["(prefill-0).transfer.ib_device: mlx5_0 is set, but host gpu01's facts list no InfiniBand devices at all",
       "record the facts again with `pdstack facts`", "unset ib_device"],
      facts=lambda f: f["gpu01"].pop("infiniband")),
    C("ib-device-the-host-lacks", transfer(None, ib_device="mlx5_1"),
      ["(decode-0).transfer.ib_device: mlx5_1 not on host gpu01", "mlx5_0", "unset ib_device"],
      facts=lambda f: f["gpu01"].update(infiniband=["mlx5_0"])),
    C("rdma-on-one-host-of-the-pair-only", two_hosts(),
      ["(prefill-0).transfer.backend: mooncake moves KV over RDMA", "host gpu01 has RDMA devices (mlx5_0)",
       "host gpu02 lists none", "transfer.backend: mooncake_tcp"],
      facts=lambda f: f["gpu01"].update(infiniband=["mlx5_0"])),
    C("rdma-peer-host-facts-without-a-list", two_hosts(),
      ["(prefill-0).transfer.backend: mooncake moves KV over RDMA", "host gpu02 have no InfiniBand list at all",
       "record gpu02's facts again"],
      facts=lambda f: (f["gpu01"].update(infiniband=["mlx5_0"]), f["gpu02"].pop("infiniband"))),
]


@pytest.mark.parametrize(("edit", "expected", "facts"), PRODUCTION)
def test_production_protection_cannot_be_switched_off(inv: Path, tmp_path: Path, edit, expected, facts):
    edit(inv)
    msg = refused(inv, tmp_path, facts)
    assert_fragments(msg, expected)


def _router_old_beside_router(inv: Path) -> None:
    """router_old.yml sorts after router.yml, so its pdstack_router replaces the whole mapping: admission off."""
    (inv / "group_vars/all/router_old.yml").write_text("pdstack_router:\n  port: 8000\n")


def _second_admission_key(inv: Path) -> None:
    p = inv / ROUTER
    p.write_text(p.read_text() + "  admission:\n    max_concurrent_requests: -1\n")


@pytest.mark.parametrize("edit", [_router_old_beside_router, _second_admission_key],
                         ids=["router-old-yml-overrides", "second-admission-key"])
def test_admission_switched_off_from_another_file_or_key_is_refused(inv: Path, tmp_path: Path, edit):
    """Either the loader refuses the shadowing itself, or the production profile refuses what it left: both name
    pdstack_router and what to do."""
    edit(inv)
    msg = refused(inv, tmp_path)
    assert ("pdstack_router" in msg or "key 'admission' is set twice" in msg) and (
        "admission" in msg or "router_old.yml" in msg), msg


def test_the_production_profile_is_production_only(inv: Path, tmp_path: Path):
    """A local deployment of the test engine may run without admission and with the fake backend (a test of the
    path, not the KV); the same line on a deployment of the real engine is refused (the profile is derived from
    the engine, not declared: issue 45)."""
    local = lambda d: _yaml_edit(d, "group_vars/all/deployment.yml",  # noqa: E731
                                 lambda v: v.update(pdstack_environment="local"))
    both(transfer(None, backend="fake"), router(lambda r: r["admission"].update(max_concurrent_requests=-1)),
         local)(inv)
    with pytest.raises(InventoryError, match=r"pdstack_environment: local \(group_vars/all/deployment.yml:\d+\) "
                                             r"would switch production's checks off, but pdstack_image.engine is "
                                             r"sglang"):
        inventory.load(inv)
    _yaml_edit(inv, IMAGE, lambda v: v["pdstack_image"].update(engine="sim"))
    dep = inventory.load(inv)
    plan = pipeline.make_plan(dep, load_facts(_facts(tmp_path), list(dep.hosts)), deploy=True)
    assert plan.router.frontdoor["max_concurrent_requests"] == -1 and plan.environment == "local"


def test_mooncake_tcp_needs_no_rdma_on_either_side(inv: Path, tmp_path: Path):
    both(transfer(None, backend="mooncake_tcp"), two_hosts())(inv)
    dep = inventory.load(inv)
    facts = _facts(tmp_path, lambda f: f["gpu01"].update(infiniband=["mlx5_0"]), ("gpu01", "gpu02"))
    assert pipeline.make_plan(dep, load_facts(facts, list(dep.hosts)), deploy=True).servers


# ------------------------------------------------------------------ class 5: budgets where they land

BUDGETS = [
    C("device-pool-misread-ratio-100", hicache(0, device_kv_pool_gb=1.5),
      ["(prefill-0).hicache.device_kv_pool_gb: 1.5 GiB is implausibly small",
       "host_budget_gb 150 / 1.5 = 100.000", "3250 GiB", "of NUMA node 0's 187.6 GiB", "'KV Cache is allocated'"]),
    C("device-pool-larger-than-its-gpus", hicache(1, device_kv_pool_gb=400),
      ["(decode-0).hicache.device_kv_pool_gb: 400 GiB is more than its 4 GPU(s) hold",
       "mem-fraction-static 0.85: 325.0 GiB", "'KV Cache is allocated'"]),
    C("cpu-offload-beyond-the-node", extra(0, "cpu-offload-gb", 200),
      ["host_vars/gpu01 hicache.host_budget_gb, extra_args.cpu-offload-gb:",
       "prefill-0 800 GiB (CPU offload of weights: cpu-offload-gb 200 x 4 TP rank(s))", "on NUMA node 0",
       "187.6 GiB", "lower extra_args.cpu-offload-gb"]),
    C("cpu-offload-and-hicache-add-up", extra(1, "cpu-offload-gb", 10),
      ["decode-0 150 GiB, decode-0 40 GiB (CPU offload", "= 190 GiB on NUMA node 1", "lower host_budget_gb"]),
    C("cpu-offload-not-a-number", extra(0, "cpu-offload-gb", "lots"),
      ["(prefill-0).extra_args.cpu-offload-gb: 'lots' is not a number of GiB", "cpu-offload-gb: 16"]),
    C("hicache-size-of-another-family", both(model(family="other"), extra(0, "hicache-size", 20)),
      ["(prefill-0).extra_args.hicache-size: --hicache-size overrides the --hicache-ratio",
       "remove extra_args.hicache-size and set hicache.host_budget_gb"]),
    C("numa-node-in-extra-args", extra(0, "numa-node", [1]),
      ["(prefill-0).extra_args.numa-node: the plan binds the server to a NUMA node itself",
       "remove extra_args.numa-node", "numa_override: true"]),
    C("weights-cpu-backup", extra(1, "enable-weights-cpu-backup", True),
      ["(decode-0).extra_args.enable-weights-cpu-backup: --enable-weights-cpu-backup puts a host copy",
       "cannot count against the NUMA node's budget", "remove extra_args.enable-weights-cpu-backup"]),
    C("paged-experts", extra(0, "enable-paged-experts", True), ["extra_args.enable-paged-experts", "cannot count"]),
    C("host-budget-infinite", hicache(0, host_budget_gb=float("inf")),
      [("(prefill-0).hicache.host_budget_gb: inf is not a finite number",
        "pdstack_servers[0].hicache.host_budget_gb (host_vars/gpu01/servers.yml:16): .inf is not a finite number")]),
    C("host-budget-310-digits", hicache(1, host_budget_gb=10 ** 310),
      [("(decode-0).hicache.host_budget_gb: 1000", "pdstack_servers[1].hicache.host_budget_gb (host_vars/gpu01"),
       ("is not a finite number", "is beyond 2**53")]),
    C("device-pool-nan", hicache(0, device_kv_pool_gb=float("nan")),
      [("pdstack_servers[0].hicache.device_kv_pool_gb: nan",
        "pdstack_servers[0].hicache.device_kv_pool_gb (host_vars/gpu01/servers.yml:17): .nan is not a finite")]),
    C("mem-fraction-infinite", extra(0, "mem-fraction-static", float("inf")),
      [("(prefill-0).extra_args.mem-fraction-static: inf is not a finite number",
        "pdstack_servers[0].extra_args.mem-fraction-static (host_vars/gpu01/servers.yml:24): .inf is not a finite"),
       ("0 < value < 1", "write a number")]),
    C("page-size-infinite", servers(lambda s: [x["extra_args"].update({"page-size": float("inf")}) for x in s]),
      [("extra_args.page-size: inf is not a finite number", "extra_args.page-size (host_vars/gpu01/servers.yml:27): "
        ".inf is not a finite number")]),
    # numbers that arrive as strings are checked as the number SGLang's parser makes of them
    C("mem-fraction-as-a-string", extra(0, "mem-fraction-static", "1.5"),
      [("(prefill-0).extra_args.mem-fraction-static: '1.5' is out of range",
        "pdstack_servers[0].extra_args: mem-fraction-static: '1.5' " + LOAD_QUOTED),
       ("0 < value < 1", "(1.5)")]),
    C("nccl-port-as-a-string-on-a-taken-port", extra(0, "nccl-port", "30001"),
      [("(decode-0).ports.http: port 30001 on host gpu01 is already taken by",
        "pdstack_servers[0].extra_args: nccl-port: '30001' " + LOAD_QUOTED),
       ("(prefill-0).extra_args.nccl-port", "(30001)")]),
    C("cpu-offload-as-a-string", extra(0, "cpu-offload-gb", "200"),
      [("prefill-0 800 GiB (CPU offload of weights: cpu-offload-gb 200 x 4 TP rank(s))",
        "pdstack_servers[0].extra_args: cpu-offload-gb: '200' " + LOAD_QUOTED)]),
    C("mem-fraction-string-inf", extra(1, "mem-fraction-static", "inf"),
      [("(decode-0).extra_args.mem-fraction-static: 'inf' is not a finite number",
        "pdstack_servers[1].extra_args: mem-fraction-static: 'inf' is not a finite number")]),
    *(C(f"numa-binding-env-{k}", env(0, {k: "0"}),
        [f"(prefill-0).env.{k}: {k} switches SGLang's own NUMA/CPU binding", f"remove env.{k}"])
      for k in budgets.NUMA_ENV),
]


@pytest.mark.parametrize(("edit", "expected", "facts"), BUDGETS)
def test_host_memory_is_counted_where_it_lands(inv: Path, tmp_path: Path, edit, expected, facts):
    edit(inv)
    msg = refused(inv, tmp_path, facts)
    assert_fragments(msg, expected)


def test_a_cpu_offload_within_the_node_plans(inv: Path, tmp_path: Path):
    extra(0, "cpu-offload-gb", 5)(inv)  # 150 + 5 x 4 = 170 of 187.6 GiB
    dep = inventory.load(inv)
    fl = pipeline.make_plan(dep, load_facts(_facts(tmp_path), list(dep.hosts)), deploy=True).servers[0].flags
    assert fl[fl.index("--cpu-offload-gb") + 1] == "5"


@pytest.mark.parametrize("value", [True, "1e3", [1], {"a": 1}, float("-inf"), -(10 ** 400), 2 ** 53 + 1, None])
def test_finite_number_takes_only_real_numbers(value):
    assert budgets.finite_number(value) is None


# ------------------------------------------------------------------ class 6: paths and references as what they are

PATHS = [
    C("chat-template-climbs-out-of-the-model", extra(0, "chat-template", f"{MODEL_PATH}/../../../etc/x.jinja"),
      ["(prefill-0).extra_args.chat-template", "(that is /etc/x.jinja) is outside pdstack_model.path",
       f"put the file under {MODEL_PATH}"]),
    C("chat-template-in-a-sibling-with-the-same-prefix", extra(1, "chat-template", f"{MODEL_PATH}-evil/x.jinja"),
      ["(decode-0).extra_args.chat-template", "is outside pdstack_model.path"]),
    C("chat-template-relative-dotdot", extra(0, "chat-template", "../../etc/x.jinja"),
      ["extra_args.chat-template: ../../etc/x.jinja climbs out", "absolute path under pdstack_model.path"]),
    C("config-at-file-outside-the-model", extra(0, "hicache-storage-backend-extra-config", "@/etc/shadow"),
      ["extra_args.hicache-storage-backend-extra-config: /etc/shadow is outside pdstack_model.path"]),
    C("digest-of-40-hex", image(registry="registry.example.com:5000", digest="sha256:" + "a" * 40),
      ["pdstack_image.digest", "64 lower-case hex digits", "invoke build --push"]),
    C("ref-with-a-40-hex-digest", image(manifest=None, ref="registry.example.com:5000/pdstack/sglang@sha256:"
                                        + "b" * 40),
      ["pdstack_image.ref", "pins a digest Docker cannot pull by", "64 lower-case hex digits"]),
    C("registry-port-99999", image(registry="registry.example.com:99999"),
      ["pdstack_image.registry", "port 99999 is not a TCP port (1-65535", "registry.example.com:5000"]),
    C("registry-port-0", image(registry="registry.example.com:0"), ["pdstack_image.registry", "port 0"]),
    C("ref-registry-port-70000", image(manifest=None, ref="registry.example.com:70000/pdstack/sglang:abc"),
      ["pdstack_image.ref", "registry port 70000"]),
    C("address-ipv4-mapped-loopback", address("::ffff:127.0.0.1"),
      ["host_vars/gpu01 pdstack_address: ::ffff:127.0.0.1 is a loopback address", "smoke gate"]),
    C("address-loopback-net-not-127-0-0-1", address("127.8.9.10"), ["127.8.9.10 is a loopback address"]),
    C("address-localhost-upper-case", address("LOCALHOST"), ["LOCALHOST is a loopback address"]),
    C("address-ipv4-mapped-unspecified", address("::ffff:0.0.0.0"), ["::ffff:0.0.0.0 is the unspecified address"]),
    C("peer-at-ipv4-mapped-loopback", two_hosts("::ffff:127.0.0.1"),
      ["ansible_host of host gpu02", "::ffff:127.0.0.1 is a loopback address", "spans 2 hosts"]),
    C("peer-at-the-same-address-ipv4-mapped", two_hosts(f"::ffff:{REAL}"),
      [f"::ffff:{REAL} is also the address of host gpu01", "list it once"]),
]


@pytest.mark.parametrize(("edit", "expected", "facts"), PATHS)
def test_paths_and_references_are_checked_as_what_they_are(inv: Path, tmp_path: Path, edit, expected, facts):
    edit(inv)
    msg = refused(inv, tmp_path, facts)
    assert_fragments(msg, expected)


def test_a_chat_template_under_the_model_plans(inv: Path, tmp_path: Path):
    extra(0, "chat-template", f"{MODEL_PATH}/templates//chat.jinja")(inv)
    dep = inventory.load(inv)
    fl = pipeline.make_plan(dep, load_facts(_facts(tmp_path), list(dep.hosts)), deploy=True).servers[0].flags
    assert f"{MODEL_PATH}/templates//chat.jinja" in fl


@pytest.mark.parametrize("text", ["127.0.0.1", "127.255.255.254", "::1", "::ffff:127.0.0.1", "::ffff:127.1.2.3",
                                  "0:0:0:0:0:ffff:7f00:1", "localhost", "LocalHost.", "db.localhost",
                                  "localhost.localdomain"])
def test_one_loopback_rule_for_every_spelling(text):
    a, err = rules.parse_address(text)
    assert err is None and rules.is_loopback(a) and rules.is_local(a)


@pytest.mark.parametrize("text", ["10.0.0.1", "::ffff:10.0.0.1", "128.0.0.1", "fe80::1", "localhost-1", "mylocalhost"])
def test_addresses_that_are_not_loopback(text):
    a, err = rules.parse_address(text)
    assert err is None and not rules.is_loopback(a)


@pytest.mark.parametrize(("path", "inside"), [
    (f"{MODEL_PATH}/t.jinja", True), (f"{MODEL_PATH}//a/./t.jinja", True), (MODEL_PATH, True),
    (f"{MODEL_PATH}/a/../t.jinja", True), (f"{MODEL_PATH}/../x", False), (f"{MODEL_PATH}x/t.jinja", False),
    (f"{MODEL_PATH}/a/../../x", False), ("/etc/passwd", False), (f"//{MODEL_PATH[1:]}/../../etc", False),
])
def test_path_containment_is_by_normalised_path(path, inside):
    assert rules.path_within(path, MODEL_PATH) is inside


# ------------------------------------------------------------------ class 7: env that does not fit the process

ENV = [
    C("env-40000-variables", env(0, {f"V{i}": "1" for i in range(40000)}),
      ["(prefill-0).env: 40000 variables", "at most 1000 variables and 64 KiB", "ARG_MAX"]),
    C("env-over-64-kib", env(1, {f"BIG{i}": "x" * 8000 for i in range(9)}),
      ["(decode-0).env: 9 variables, 72", "64 KiB in all"]),
    *(C(f"env-replaces-{k}", env(0, {k: "/opt/evil"}),
        [f"(prefill-0).env.{k}: {k} comes from the image", "replaces the image's value", f"remove env.{k}"])
      for k in ("LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH", "PATH", "CUDA_HOME")),
    C("env-name-starts-with-a-digit", env(1, {"1BAD": "x"}), ["env.1BAD: '1BAD' is not an environment variable"]),
    C("env-name-with-a-dash", env(1, {"A-B": "x"}), ["env.A-B: 'A-B' is not an environment variable name"]),
    C("env-name-with-an-equals-sign", env(0, {"A=B": "x"}), ["'A=B' is not an environment variable name"]),
]


@pytest.mark.parametrize(("edit", "expected", "facts"), ENV)
def test_env_is_bounded_and_leaves_the_image_alone(inv: Path, tmp_path: Path, edit, expected, facts):
    edit(inv)
    msg = refused(inv, tmp_path, facts)
    assert_fragments(msg, expected)


# ------------------------------------------------------------------ class 8: a name SGLang would read as a flag

NAMES = [
    C("served-name-leading-dash", model(served_name="-deepseek-v4-flash"),
      ["pdstack_model.served_name: '-deepseek-v4-flash' starts with '-'",
       ("like deepseek-v4-flash", "remove the leading '-'")]),
    C("served-name-is-a-flag", model(served_name="--port"), ["pdstack_model.served_name: '--port' starts with '-'"]),
]


@pytest.mark.parametrize(("edit", "expected", "facts"), NAMES)
def test_a_served_name_is_never_a_flag(inv: Path, tmp_path: Path, edit, expected, facts):
    edit(inv)
    msg = refused(inv, tmp_path, facts)
    assert_fragments(msg, expected)


# ------------------------------------------------------------------ no hostile value makes a check crash

HOSTILE = [None, True, False, "", "-", "--port", "1e999", "inf", "nan", "0x10", " 7 ", "a\nb", "x" * 140000,
           float("inf"), float("-inf"), float("nan"), 10 ** 310, -(10 ** 310), 2 ** 63, -1, 0, 1.5, [], [None],
           [float("inf")], ["--decode", "http://203.0.113.66:30001"], {}, {"a": float("nan")}, "@/etc/x", "../x"]
FREE_FORM = ["mem-fraction-static", "cpu-offload-gb", "hicache-size", "nccl-port", "chat-template", "page-size",
             "numa-node", "enable-paged-experts", "offload-group-size", "hicache-storage-backend-extra-config",
             "cuda-graph-bs-decode", "tokenizer-path"]


@pytest.fixture(scope="module")
def prod_dep(tmp_path_factory):
    d = tmp_path_factory.mktemp("hostile") / "production"
    shutil.copytree(PROD, d)
    _yaml_edit(d, "hosts.yml", lambda h: h["all"]["children"]["gpu"]["hosts"]["gpu01"].update(ansible_host=REAL))
    return inventory.load(d), {"gpu01": {**copy.deepcopy(REF), "infiniband": ["mlx5_0"]}}


def _checks(dep, facts) -> list[str]:
    from pdstack.controller.check import preflight
    return preflight.static_problems(dep, deploy=True) + preflight.topology_problems(dep, facts)


@pytest.mark.parametrize("key", FREE_FORM)
def test_no_extra_args_value_crashes_a_check(prod_dep, key):
    """extra_args values reach the checks as YAML wrote them: each hostile one is a problem or fine, never a
    traceback (the real suite's fuzz of types covers the schema's own fields)."""
    base, facts = prod_dep
    for value in HOSTILE:
        dep = copy.deepcopy(base)
        dep.hosts["gpu01"].servers[0]["extra_args"][key] = value
        problems = _checks(dep, facts)
        assert all(isinstance(m, str) and m for m in problems)


@pytest.mark.parametrize("where", ["env", "hicache.host_budget_gb", "hicache.device_kv_pool_gb", "numa_reserve",
                                   "ib_device"])
def test_no_hostile_number_or_string_crashes_a_check(prod_dep, where):
    base, facts = prod_dep
    for value in HOSTILE:
        dep = copy.deepcopy(base)
        s = dep.hosts["gpu01"].servers[1]
        if where == "env":
            s["env"]["X"] = value
        elif where.startswith("hicache."):
            if not isinstance(value, int | float) or isinstance(value, bool):
                continue  # the schema types these: numbers only
            s["hicache"][where.partition(".")[2]] = value
        elif where == "numa_reserve":
            if budgets.finite_number(value) is None:
                continue  # the loader types it: a finite number (h-load)
            dep.hosts["gpu01"].numa_reserve_gb = float(value)
        elif isinstance(value, str):
            s["transfer"]["ib_device"] = value
        _checks(dep, facts)
