"""The planner on recorded topologies, and every flag it can render checked by the pinned parsers."""

from __future__ import annotations

import argparse
import itertools
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from pdstack.controller import pipeline
from pdstack.controller.load import flags, inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.plan import image_choice, planner
from pdstack.controller.plan.text import render_text
from pdstack.errors import InventoryError
from pdstack.switches import PD_ENV

ROOT = Path(__file__).resolve().parents[1]
TOPO = ROOT / "tests" / "topologies"
REF = TOPO / "reference-2node-8gpu.json"


def prod_plan() -> planner.Plan:
    dep = inventory.load(ROOT / "inventory" / "production")
    return pipeline.make_plan(dep, load_facts(REF, list(dep.hosts)))


def test_reference_plan_places_prefill_on_numa0_and_decode_on_numa1():
    p = prod_plan()
    pre, dec = p.servers
    assert (pre.role, pre.gpus, pre.numa_node, pre.cpuset_cpus, pre.cpuset_mems) == (
        "prefill", [0, 1, 2, 3], 0, "0-31,64-95", "0")
    assert (dec.role, dec.gpus, dec.numa_node, dec.cpuset_cpus, dec.cpuset_mems) == (
        "decode", [4, 5, 6, 7], 1, "32-63,96-127", "1")
    assert pre.numa_source == dec.numa_source == "facts"


def test_hicache_ratio_is_budget_over_device_pool_rounded_down():
    pre = prod_plan().servers[0]
    assert pre.hicache.ratio == 0.833  # 150 / 180 = 0.8333..., never rounded up past the budget
    assert pre.hicache.ratio * pre.hicache.device_kv_pool_gb <= pre.hicache.host_budget_gb
    i = pre.flags.index("--hicache-ratio")
    assert pre.flags[i + 1] == "0.833"
    assert "--hicache-size" not in pre.flags
    text = "\n".join(pre.hicache.arithmetic)
    assert "150 / 180 = 0.8333" in text and "251.6 GiB" in text and "pdstack_numa_reserve_gb 64" in text


def test_argv_is_launcher_plus_flags_and_roles_differ():
    pre, dec = prod_plan().servers
    assert pre.argv[:3] == ["python3", "-m", "sglang.launch_server"]
    assert pre.argv[3:] == pre.flags
    assert pre.flags[pre.flags.index("--disaggregation-mode") + 1] == "prefill"
    assert pre.flags[pre.flags.index("--disaggregation-bootstrap-port") + 1] == "8998"
    assert "--disaggregation-bootstrap-port" not in dec.flags
    assert pre.env["PDSTACK_DSV4_BF16_INDEX_K"] == dec.env["PDSTACK_DSV4_BF16_INDEX_K"] == "1"
    assert pre.env["SGLANG_FP8_PAGED_MQA_LOGITS_TORCH"] == "1"  # sm_120: no DeepGEMM
    assert pre.env["NVIDIA_VISIBLE_DEVICES"] == "0,1,2,3" and dec.env["NVIDIA_VISIBLE_DEVICES"] == "4,5,6,7"
    # SGLang's PD timeouts, defaults as SGLang 0.5.23's own (environ.py)
    assert pre.env["SGLANG_DISAGGREGATION_BOOTSTRAP_TIMEOUT"] == "300"
    assert pre.env["SGLANG_DISAGGREGATION_HEARTBEAT_INTERVAL"] == "5"
    assert pre.env["SGLANG_HEALTH_CHECK_TIMEOUT"] == "20"


def test_a_decode_with_hicache_keeps_its_radix_cache_as_0523_requires():
    """0.5.23 turns a decode server's radix cache off unless --disaggregation-decode-enable-radix-cache is given, and
    then refuses HiCache at start (srt/arg_groups/pd_disaggregation_hook.py, kv_cache_hook.py): the planner renders
    the flag for a decode with HiCache, and only there; the test engine refuses the start without it, as SGLang."""
    pre, dec = prod_plan().servers
    assert dec.hicache.enabled and "--enable-hierarchical-cache" in dec.flags
    assert "--disaggregation-decode-enable-radix-cache" in dec.flags
    assert "--disaggregation-decode-enable-radix-cache" not in pre.flags
    from pdstack.cli import build_parser
    from pdstack.testing.sim import speed
    argv = ["sim", "--disaggregation-mode", "decode", "--enable-hierarchical-cache"]
    refused = speed.model(vars(build_parser(argv).parse_args(argv))).startup_error
    assert refused and "mutually exclusive" in refused
    argv.append("--disaggregation-decode-enable-radix-cache")
    assert speed.model(vars(build_parser(argv).parse_args(argv))).startup_error is None


def test_router_argv_lists_every_worker_behind_the_front_door():
    plan = prod_plan()
    r = plan.router
    a = r.argv
    # upstream's launcher, with sglang unimportable (it would load torch for mini_lb's optional tracing)
    assert a[:2] == ["python3", "-c"] and 'run_module("sglang_router.launch_router"' in a[2]
    assert 'sys.modules["sglang"] = None' in a[2]
    assert a[a.index("--prefill") + 1: a.index("--prefill") + 3] == ["http://192.0.2.10:30000", "8998"]
    assert a[a.index("--decode") + 1] == "http://192.0.2.10:30001"
    # the router's own limiter is off (a token bucket in 0.3.2, docs/facts.md#sglang-router-032): admission is the
    # front door's
    assert a[a.index("--max-concurrent-requests") + 1] == "-1"
    assert "--queue-size" not in a and "--queue-timeout-secs" not in a
    from sglang_router.launch_router import parse_router_args
    parsed = parse_router_args(r.flags)
    assert parsed.prefill_urls == [("http://192.0.2.10:30000", 8998)]
    assert parsed.decode_urls == ["http://192.0.2.10:30001"]
    # on loopback behind the front door, which has the public port
    assert (parsed.host, parsed.port) == ("127.0.0.1", 8001) and r.internal_url == "http://127.0.0.1:8001"
    assert r.url == "http://192.0.2.10:8000"
    assert parsed.max_concurrent_requests == -1
    # failure behaviour chosen (docs/failure.md): breaker retries after 10 s, drain and stop agree
    assert parsed.cb_timeout_duration_secs == 10
    assert parsed.shutdown_grace_period_secs == 120 and r.stop_timeout_secs == 130
    fd = r.frontdoor
    assert (fd["port"], fd["backend_address"], fd["backend_port"]) == (8000, "127.0.0.1", 8001)
    assert (fd["max_concurrent_requests"], fd["queue_size"], fd["queue_timeout_secs"]) == (32, 64, 30)
    # one budget (issue 25): HAProxy's server timeout is it; the router's own is later, so it never retries a
    # timed-out attempt before HAProxy's 504
    assert fd["server_timeout_secs"] == 600 and parsed.request_timeout_secs == 600 + planner.ROUTER_TIMEOUT_MARGIN_SECS
    assert fd["hard_stop_after_secs"] > parsed.request_timeout_secs
    assert fd["client_timeout_secs"] == 30 and fd["served_models"] == [plan.model["served_name"]]


def test_front_door_config_from_the_plan_passes_haproxy_check(tmp_path: Path):
    """The rendered haproxy.cfg is accepted by the real haproxy (`haproxy -c`, what the role's validate: runs)."""
    import subprocess

    from pdstack.controller.plan.planner import MAINTENANCE_FILE, RUNTIME_SOCKET
    from pdstack.controller.render import frontdoor

    haproxy = shutil.which("haproxy") or "/usr/sbin/haproxy"
    if not Path(haproxy).exists():
        pytest.fail("haproxy is not installed: apt-get install haproxy (./dev.sh setup does)")
    fd = prod_plan().router.frontdoor
    assert (fd["runtime_socket"], fd["maintenance_file"]) == (RUNTIME_SOCKET, MAINTENANCE_FILE)
    (tmp_path / "maintenance.acl").write_text("")  # the role writes it empty (the switch off) before haproxy -c
    for key_file in (None, str(tmp_path / "keys")):
        (tmp_path / "keys").write_text("Bearer not-a-secret\n")
        cfg = frontdoor.haproxy_config(fd, api_key_file=key_file, stats_socket=None,
                                       maintenance_file=str(tmp_path / "maintenance.acl"))
        assert "maxconn 32 " in cfg and "queue(pdstack_router) ge 64" in cfg and "timeout queue 30s" in cfg
        assert ("-f " + str(key_file) in cfg) == (key_file is not None)
        (tmp_path / "haproxy.cfg").write_text(cfg)
        r = subprocess.run([haproxy, "-c", "-f", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
        assert r.returncode == 0 and "ALERT" not in r.stdout + r.stderr, r.stdout + r.stderr
    # every refusal of its own names its reason in X-Pdstack-Refusal (the probe and recall read it)
    for reason in ("queue-full", "maintenance"):
        assert f"hdr X-Pdstack-Refusal {reason} " in cfg, reason
    assert "hdr X-Pdstack-Refusal %[srv_is_up(pdstack_router/router),iif(queue-timeout,router-down)]" in cfg
    assert "observe layer4 error-limit 1 on-error mark-down" in cfg  # a refused connection marks it down at once
    off = frontdoor.haproxy_config({**fd, "max_concurrent_requests": -1}, stats_socket=None)
    assert "maxconn 32" not in off and "pdstack_refuse" not in off


# Each index-key choice sets every switch that decides the reader, so SGLang's own sm_120 defaults (model_hook.py sets
# both of its switches when unset) decide nothing; the plan and its text name the reader.
INDEX_K_READERS = {
    "bf16": ({"PDSTACK_DSV4_BF16_INDEX_K": "1", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",
              "SGLANG_OPT_USE_TILELANG_INDEXER": "1"}, "bf16_paged_mqa_logits"),
    "fp8-torch": ({"PDSTACK_DSV4_BF16_INDEX_K": "0", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",
                   "SGLANG_OPT_USE_TILELANG_INDEXER": "0"}, "fp8_paged_mqa_logits_torch"),
    "fp8-tilelang": ({"PDSTACK_DSV4_BF16_INDEX_K": "0", "SGLANG_FP8_PAGED_MQA_LOGITS_TORCH": "1",
                      "SGLANG_OPT_USE_TILELANG_INDEXER": "1"}, "tilelang_fp8_paged_mqa_logits"),
}


@pytest.mark.parametrize("dtype", sorted(INDEX_K_READERS))
def test_index_k_choice_renders_every_switch_and_names_the_reader(tmp_path: Path, dtype):
    inv = tmp_path / "p"
    shutil.copytree(ROOT / "inventory" / "production", inv)
    f = inv / "group_vars/all/model.yml"
    d = yaml.safe_load(f.read_text())
    d["pdstack_model"]["index_k_dtype"] = dtype
    f.write_text(yaml.safe_dump(d))
    dep = inventory.load(inv)
    p = pipeline.make_plan(dep, load_facts(REF, list(dep.hosts)))
    env, reader = INDEX_K_READERS[dtype]
    assert all({k: s.env.get(k) for k in env} == env for s in p.servers)
    assert reader in p.model["index_reader"] and f"index keys {dtype}: " in render_text(p)


def test_index_k_fp8_alone_is_refused_naming_the_choices(tmp_path: Path):
    inv = tmp_path / "p"
    shutil.copytree(ROOT / "inventory" / "production", inv)
    f = inv / "group_vars/all/model.yml"
    f.write_text(f.read_text().replace("index_k_dtype: bf16", "index_k_dtype: fp8"))
    with pytest.raises(InventoryError, match="pdstack_model.index_k_dtype: 'fp8' is not one of 'bf16', 'fp8-torch'"):
        inventory.load(inv)


def _variants():
    """Every combination of the planner's optional outputs, so the union covers every flag it can render."""
    yield from itertools.product(
            ("prefill", "decode"), (True, False), ("mlx5_0", None), (True, False), (None, "cache_aware"),
            (None, "power_of_two"))


def test_every_flag_the_planner_can_render_is_spelled_exactly_as_sglang_parses_it():
    dep = inventory.load(ROOT / "inventory" / "production")
    facts = json.loads(REF.read_text())
    rendered: set[str] = set()
    router_rendered: set[str] = set()
    for role, hicache, ib, trc, ppol, dpol in _variants():
        s = dict(dep.hosts["gpu01"].servers[0 if role == "prefill" else 1])
        s["hicache"] = {**s["hicache"], "enabled": hicache}
        s["transfer"] = {**s["transfer"], "ib_device": ib}
        dep.model["trust_remote_code"] = trc
        hc = planner.hicache_plan(s, facts, 0, 64)
        fl = planner.server_flags(dep, s, hc)
        assert flags.check_sglang(fl) is None, fl
        rendered |= {t for t in fl if t.startswith("--")}
        dep.router["prefill_policy"], dep.router["decode_policy"] = ppol, dpol
        sp = planner.ServerPlan(host="h", address="a", name="n", role=role, unit="u", container="c", gpus=[0],
                                tp_size=1, numa_node=0, numa_source="facts", cpuset_cpus="0", cpuset_mems="0",
                                ports={"http": 1, "bootstrap": 2, "metrics": 1}, url="http://a:1", hicache=hc,
                                flags=fl, argv=fl, env={})
        other = planner.ServerPlan(**{**sp.__dict__, "role": "decode" if role == "prefill" else "prefill"})
        rf, _, _ = planner.router_flags(dep, [sp, other])
        assert flags.check_router(rf) is None, rf
        router_rendered |= {t for t in rf if t.startswith("--")}
    # each flag is an exact option string of SGLang 0.5.23's own parser (no abbreviation can sneak through)
    options = flags.sglang_options()
    assert rendered <= options, rendered - options
    assert {"--hicache-ratio", "--disaggregation-ib-device", "--trust-remote-code", "--enable-hierarchical-cache",
            "--disaggregation-bootstrap-port"} <= rendered
    router_opts = {o for a in flags.router_parser()._actions for o in a.option_strings}
    assert router_rendered <= router_opts, router_rendered - router_opts
    assert {"--prefill-policy", "--decode-policy", "--cb-timeout-duration-secs",
            "--shutdown-grace-period-secs"} <= router_rendered


@pytest.mark.parametrize("argv", [["--tp", "4"], ["--cuda-graph-max-bs", "8"], ["--mem-frac", "0.8"]])
def test_abbreviations_that_sglang_itself_would_accept_or_misread_are_rejected(argv):
    # SGLang's own parser (abbreviations on) does not reject these as unknown, which is how `--tp` reached units
    from pdstack.upstream import sglang_module
    ServerArgs = sglang_module("sglang.srt.server_args").ServerArgs  # noqa: N806 - SGLang's class
    loose = argparse.ArgumentParser()
    ServerArgs.add_cli_args(loose)
    try:
        loose.parse_args(["--model-path", "/m", *argv])
        loose_ok = True
    except SystemExit:
        loose_ok = False  # ambiguous abbreviation (exit 2)
    strict = flags.check_sglang(["--model-path", "/m", *argv])
    assert strict is not None and argv[0] in strict
    if argv[0] == "--tp":
        assert loose_ok  # the trap: upstream's parser takes it silently


def test_plan_cli_json_and_host_filter():
    out = subprocess.run([sys.executable, "-m", "pdstack", "plan", "-i", "inventory/production", "--facts", str(REF),
                          "--json", "--host", "gpu01"], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    data = json.loads(out.stdout)
    assert [s["name"] for s in data["servers"]] == ["prefill-0", "decode-0"]
    assert data["servers"][0]["hicache"]["ratio"] == 0.833
    assert data["router"]["argv"][3] == "--pd-disaggregation"


def test_plan_text_prints_the_arithmetic():
    out = subprocess.run([sys.executable, "-m", "pdstack", "plan", "-i", "inventory/production", "--facts", str(REF)],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert "--hicache-ratio = host_budget_gb / device_kv_pool_gb = 150 / 180" in out.stdout
    assert "cpuset-cpus 32-63,96-127  cpuset-mems 1" in out.stdout


def test_local_inventory_plans_on_a_simulated_host():
    dep = inventory.load(ROOT / "inventory" / "local")
    from pdstack.hostside.facts import collect
    facts = collect(simulate_gpus=2)
    p = pipeline.make_plan(dep, dict.fromkeys(dep.hosts, facts))
    assert p.engine == "sim" and p.servers[0].argv[:2] == ["pdstack", "sim"]
    assert p.servers[0].hicache.ratio == 0.5


def test_pd_timeout_defaults_are_sglangs_own():
    from pdstack.controller.load.variables import PD
    from pdstack.upstream import sglang_module
    environ = sglang_module("sglang.srt.environ")
    for key, name in PD_ENV.items():
        upstream = getattr(environ.Envs, name, None)
        if upstream is None:  # SGLANG_HEALTH_CHECK_TIMEOUT is read with os.getenv in 0.5.23
            continue
        assert PD.fields[key].default == upstream.default, name


def test_missing_build_manifest_warns_when_planning_and_fails_when_deploying(tmp_path: Path):
    inv = tmp_path / "p"
    shutil.copytree(ROOT / "inventory" / "production", inv)
    f = inv / "group_vars/all/image.yml"
    f.write_text(yaml.safe_dump({"pdstack_image": {"manifest": str(tmp_path / "none.json"), "engine": "sglang"}}))
    # deploying refuses the example's documentation-range address before it gets to the image
    hosts = inv / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("192.0.2.10", "10.1.2.3"))
    dep = inventory.load(inv)
    facts = load_facts(REF, list(dep.hosts))
    p = pipeline.make_plan(dep, facts)
    assert p.image is None and any("build the image first: invoke build --flavor prod" in w for w in p.warnings)
    with pytest.raises(InventoryError, match="cannot read .*none.json"):
        pipeline.make_plan(inventory.load(inv), facts, require_image=True)


def test_build_manifest_gives_tag_id_and_absolute_tarball(tmp_path: Path):
    m = tmp_path / "manifest-prod.json"
    m.write_text(json.dumps({"tag": "pdstack/sglang:0123456789abcdef", "image_id": "sha256:ab",
                             "saved": {"path": "build/images/prod.tar"}}))
    ref, image_id, tarball, pull, _ = image_choice.resolve_image({"manifest": str(m), "ref": None, "tarball": None,
                                                              "engine": "sglang"}, [])
    assert (ref, image_id, pull) == ("pdstack/sglang:0123456789abcdef", "sha256:ab", None)
    assert Path(tarball).is_absolute() and tarball.endswith("build/images/prod.tar")


DIGEST = "sha256:" + "5" * 64
SIM_TAG = "pdstack/sim:0123456789abcdef"


def _manifest(tmp_path: Path, **over) -> Path:
    """A sim manifest as `invoke build --flavor sim --save ... --push 127.0.0.1:5000` writes it."""
    m = {"flavor": "sim", "tag": SIM_TAG, "image_id": "sha256:ab", "saved": {"path": "build/images/sim.tar"},
         "labels": {"io.pdstack.flavor": "sim", "io.pdstack.inputs.sha256": "f" * 64, "org.x": "not ours"},
         "pushed": {"ref": f"127.0.0.1:5000/{SIM_TAG}", "digest_ref": f"127.0.0.1:5000/pdstack/sim@{DIGEST}"}}
    m.update(over)
    f = tmp_path / "manifest-sim.json"
    f.write_text(json.dumps({k: v for k, v in m.items() if v is not None}))
    return f


def _image(manifest: Path, **kw) -> dict:
    return {"manifest": str(manifest), "ref": None, "tarball": None, "registry": None, "digest": None,
            "engine": "sim", **kw}


def test_registry_pulls_the_pushed_digest_from_the_hosts_registry_address(tmp_path: Path):
    # pushed through the controller's loopback; the hosts reach the same registry at another address
    img = image_choice.resolve_image(_image(_manifest(tmp_path), registry="172.18.0.1:5000"), [])
    assert img.pull == f"172.18.0.1:5000/pdstack/sim@{DIGEST}"
    assert img.ref == SIM_TAG and img.tarball is None and img.image_id == "sha256:ab"  # units keep running the tag
    assert img.labels == {"io.pdstack.flavor": "sim", "io.pdstack.inputs.sha256": "f" * 64}


def test_registry_without_a_push_fails_when_deploying_and_warns_when_planning(tmp_path: Path):
    image = _image(_manifest(tmp_path, pushed=None), registry="172.18.0.1:5000")
    with pytest.raises(InventoryError, match=r"pdstack_image.registry is set, but .* records no push of "
                                             r"pdstack/sim:0123456789abcdef .*invoke build --flavor sim --push .*"
                                             r"or set pdstack_image.digest"):
        image_choice.resolve_image(image, [])
    warnings: list[str] = []
    assert image_choice.resolve_image(image, warnings, require=False).ref is None and "records no push" in warnings[0]
    # an explicit digest instead of the push record
    img = image_choice.resolve_image({**image, "digest": DIGEST}, [])
    assert img.pull == f"172.18.0.1:5000/pdstack/sim@{DIGEST}"


def test_registry_refuses_a_digest_the_manifest_did_not_push(tmp_path: Path):
    other = "sha256:" + "6" * 64
    with pytest.raises(InventoryError, match=rf"pdstack_image.digest: {other} is not the digest .* recorded for "
                                             rf"{SIM_TAG} \({DIGEST}.*remove digest"):
        image_choice.resolve_image(_image(_manifest(tmp_path), registry="172.18.0.1:5000", digest=other), [])


def test_registry_refuses_a_push_record_of_another_image(tmp_path: Path):
    stale = {"ref": "127.0.0.1:5000/pdstack/sim:fedcba9876543210",
             "digest_ref": f"127.0.0.1:5000/pdstack/sim@{DIGEST}"}
    with pytest.raises(InventoryError, match=r"pdstack_image.manifest: .* records a push of .*fedcba9876543210.* not "
                                             r"of its image pdstack/sim:0123456789abcdef; push this image again"):
        image_choice.resolve_image(_image(_manifest(tmp_path, pushed=stale), registry="172.18.0.1:5000"), [])


def test_a_manifest_of_the_other_flavor_is_refused(tmp_path: Path):
    with pytest.raises(InventoryError, match=r"pdstack_image.manifest: .* describes a sim image, but "
                                             r"pdstack_image.engine 'sglang' runs the prod image; point manifest at "
                                             r"build/manifest-prod.json"):
        image_choice.resolve_image(_image(_manifest(tmp_path), engine="sglang"), [])


def test_a_digest_ref_with_a_registry_is_pulled_and_run_as_is():
    ref = f"172.18.0.1:5000/pdstack/sim@{DIGEST}"
    img = image_choice.resolve_image({"manifest": None, "ref": ref, "tarball": None, "registry": "172.18.0.1:5000",
                                 "digest": None, "engine": "sim"}, [])
    assert (img.ref, img.pull, img.tarball, img.labels) == (ref, ref, None, {})


def _with_model(tmp_path: Path, **model) -> inventory.Deployment:
    inv = tmp_path / "p"
    shutil.copytree(ROOT / "inventory" / "production", inv)
    f = inv / "group_vars/all/model.yml"
    d = yaml.safe_load(f.read_text())
    d["pdstack_model"].update(model)
    f.write_text(yaml.safe_dump(d))
    return inventory.load(inv)


def _value(fl: list[str], flag: str) -> str | None:
    return fl[fl.index(flag) + 1] if flag in fl else None


def test_deepseek_v4_renders_its_tool_call_and_reasoning_parsers_and_no_chat_template():
    for s in prod_plan().servers:
        assert _value(s.flags, "--tool-call-parser") == "deepseekv4"
        assert _value(s.flags, "--reasoning-parser") == "deepseek-v4"
        assert "--chat-template" not in s.flags  # SGLang takes the model's own (tokenizer config)
        assert flags.check_sglang(s.flags) is None
    # both are choices of the pinned SGLang's own parser
    assert "deepseekv4" in flags.sglang_choices("--tool-call-parser")
    assert "deepseek-v4" in flags.sglang_choices("--reasoning-parser")


def test_parsers_can_be_overridden_or_turned_off(tmp_path: Path):
    dep = _with_model(tmp_path, tool_call_parser="deepseekv41", reasoning_parser="off")
    p = pipeline.make_plan(dep, load_facts(REF, list(dep.hosts)))
    assert _value(p.servers[0].flags, "--tool-call-parser") == "deepseekv41"
    assert "--reasoning-parser" not in p.servers[0].flags
    other = _with_model(tmp_path / "o", family="other")
    assert "--tool-call-parser" not in pipeline.make_plan(
        other, load_facts(REF, list(other.hosts))).servers[0].flags


def test_a_parser_sglang_does_not_know_is_refused_naming_the_variable(tmp_path: Path):
    with pytest.raises(InventoryError) as e:
        _with_model(tmp_path, tool_call_parser="deepseek-v4", reasoning_parser="deepseekv4")
    text = str(e.value)
    assert "pdstack_model.tool_call_parser: 'deepseek-v4' is not a --tool-call-parser of SGLang 0.5.23" in text
    assert "pdstack_model.reasoning_parser: 'deepseekv4' is not a --reasoning-parser" in text
    assert "'off'" in text
