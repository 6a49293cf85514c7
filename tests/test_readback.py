"""Every rendered artifact read back before any host changes (issue 19, classes 1 and 2): each injection example
from the issue is refused by make_plan, naming the variable; and with the encoders bypassed (a tampered plan), the
read-back itself still catches the change."""

from __future__ import annotations

import copy
import json
import shutil
import socket
import subprocess
from pathlib import Path

import pytest
import yaml

from pdstack.controller import pipeline
from pdstack.controller.load import inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.render import artifacts, frontdoor, frontdoor_check, readback
from pdstack.errors import InventoryError

ROOT = Path(__file__).resolve().parents[1]
REF = ROOT / "tests" / "topologies" / "reference-2node-8gpu.json"
HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
REAL = "203.0.113.10"  # a real-looking address for the copy of inventory/production
ROUTER = "group_vars/all/router.yml"
SERVERS = "host_vars/gpu01/servers.yml"


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    d = tmp_path / "production"
    shutil.copytree(ROOT / "inventory" / "production", d)
    hosts = d / "hosts.yml"
    hosts.write_text(hosts.read_text().replace("192.0.2.10", REAL))
    return d


def _edit(inv: Path, rel: str, fn) -> None:
    p = inv / rel
    data = yaml.safe_load(p.read_text())
    fn(data)
    p.write_text(yaml.safe_dump(data, sort_keys=False))


def _plan(inv: Path):
    dep = inventory.load(inv)
    return pipeline.make_plan(dep, load_facts(REF, list(dep.hosts)))


def _refused(inv: Path, *fragments: str) -> str:
    with pytest.raises(InventoryError) as e:
        _plan(inv)
    text = str(e.value)
    for f in fragments:
        assert f in text, (f, text)
    return text


def test_an_unedited_production_copy_with_a_real_address_plans_and_binds_that_address(inv: Path):
    plan = _plan(inv)
    assert plan.router.frontdoor["bind"] == REAL  # production: one address, the router host's, not 0.0.0.0
    cfg = frontdoor.haproxy_config(plan.router.frontdoor)
    assert f"bind {REAL}:8000" in cfg


@pytest.mark.parametrize("where,key,value", [
    ("router", "request-id-headers", ["x-request-id", "--decode", "http://203.0.113.66:30001"]),
    ("server", "cuda-graph-bs-decode", [1, 2, "--host", "127.0.0.1"]),
    ("server", "cuda-graph-bs-decode", [1, "-2"]),
])
def test_list_items_that_read_as_flags_are_refused_naming_the_key(inv: Path, where: str, key: str, value):
    if where == "router":
        _edit(inv, ROUTER, lambda d: d["pdstack_router"].setdefault("extra_args", {}).update({key: value}))
    else:
        _edit(inv, SERVERS, lambda d: d["pdstack_servers"][1]["extra_args"].update({key: value}))
    # the loader refuses it first (load/variables.py); the argv encoder (flags.argv_word) would, for --vars values
    text = _refused(inv, "extra_args", key, "starts with '-'")
    assert "pdstack_router" in text if where == "router" else "pdstack_servers[1]" in text, text


@pytest.mark.parametrize("bind,why", [
    ("0.0.0.0:8000\n    http-request allow", "not a literal IP address"),
    (f"{REAL}\n    http-request allow\n    use_backend pdstack_router", "not a literal IP address"),
    (f"{REAL} http-request allow", "not a literal IP address"),
    ("gpu01", "not a literal IP address"),
    ("::", "every address"),
    ("10.9.9.9", "not the router host's address"),
    ("127.0.0.1", "not the router host's address"),
])
def test_a_bad_front_door_bind_is_refused_naming_it(inv: Path, bind: str, why: str):
    _edit(inv, ROUTER, lambda d: d["pdstack_router"].setdefault("frontdoor", {}).update(bind=bind))
    _refused(inv, "pdstack_router.frontdoor.bind", why)


@pytest.mark.parametrize("edit,var", [
    (lambda r: r["admission"].update(queue_size=10**9), "pdstack_router.admission"),
    (lambda r: r["admission"].update(max_concurrent_requests=10**9), "pdstack_router.admission"),
    (lambda r: r.update(request_timeout_secs=10**9), "pdstack_router.request_timeout_secs"),
    (lambda r: r["admission"].update(queue_timeout_secs=10**9), "pdstack_router.admission.queue_timeout_secs"),
    (lambda r: r["frontdoor"].update(max_body_bytes=10**9), "pdstack_router.frontdoor.max_body_bytes"),
    (lambda r: r["frontdoor"].update(max_body_bytes=0), "pdstack_router.frontdoor.max_body_bytes"),
    (lambda r: r["frontdoor"].update(request_read_timeout_secs=10**9),
     "pdstack_router.frontdoor.request_read_timeout_secs"),
    (lambda r: r["frontdoor"].update(request_read_timeout_secs=0),
     "pdstack_router.frontdoor.request_read_timeout_secs"),
    (lambda r: r["frontdoor"].update(max_connections_per_source=-1),
     "pdstack_router.frontdoor.max_connections_per_source"),
])
def test_limits_haproxy_cannot_run_are_refused_naming_the_variable(inv: Path, edit, var: str):
    _edit(inv, ROUTER, lambda d: edit(d["pdstack_router"]))
    _refused(inv, var)


def test_an_env_value_the_env_file_cannot_carry_is_refused_naming_it(inv: Path):
    _edit(inv, SERVERS, lambda d: d["pdstack_servers"][0].setdefault("env", {}).update(
        PDSTACK_X="1\nLD_PRELOAD=/tmp/x.so"))
    _refused(inv, "PDSTACK_X")


# ------------------------------------------------------------------ the read-back alone (encoders bypassed)


@pytest.fixture(scope="module")
def good():
    dep = inventory.load(ROOT / "inventory" / "production")
    return dep, pipeline.make_plan(dep, load_facts(REF, list(dep.hosts)))


def test_the_shipped_plan_reads_back_clean(good):
    dep, plan = good
    assert artifacts.artifact_problems(plan, dep) == [] and readback.plan_problems(plan, dep) == []


def test_a_worker_smuggled_into_the_router_argv_is_caught(good):
    dep, plan = good
    p = copy.deepcopy(plan)
    p.router.flags += ["--decode", "http://203.0.113.66:30001"]
    out = readback.router_settings_problems(p)
    assert any("decode workers" in x and "203.0.113.66" in x and "outside the inventory" in x for x in out), out
    p = copy.deepcopy(plan)
    p.router.flags += ["--host", "0.0.0.0"]
    assert any("host = '0.0.0.0'" in x for x in readback.router_settings_problems(p))


def test_a_server_moved_onto_loopback_or_another_port_is_caught(good):
    dep, plan = good
    for words, dest in ((["--host", "127.0.0.1"], "host"), (["--port", "31000"], "port"),
                        (["--disaggregation-bootstrap-port", "9999"], "disaggregation_bootstrap_port")):
        p = copy.deepcopy(plan)
        p.servers[0].flags += words
        out = readback.server_settings_problems(p)
        assert any(f"server {p.servers[0].name}" in x and f"{dest} =" in x for x in out), (words, out)


@pytest.mark.parametrize("word", ["$HOME", "a\\nb", "${PATH}", "x\ny", "50%\\"])
def test_an_argv_word_the_unit_template_cannot_carry_is_caught_naming_the_key(good, word: str):
    """The unit templates quote with shlex.quote and escape %; systemd also expands $ and reads backslash escapes
    inside quotes, so these words would reach the process changed (or split the line)."""
    dep, plan = good
    p = copy.deepcopy(plan)
    s = p.servers[0]
    s.argv += ["--chat-template", word]
    spec = {**next(x for _h, x in dep.servers() if x["name"] == s.name)}
    spec["extra_args"] = {**spec["extra_args"], "chat-template": word}
    out = artifacts._exec_problems(f"server {s.name}", s.argv, 3, spec["extra_args"], {})
    assert out and all("extra_args.chat-template" in x for x in out), out
    for fine in ("plain/x.jinja", "it's", "50%", 'a "b" c'):  # shlex quoting that systemd reads the same
        assert artifacts._exec_problems("x", [*s.argv[:-2], "--chat-template", fine], 3, spec["extra_args"], {}) == []


def test_env_files_read_back_to_the_same_dict(good):
    dep, plan = good
    for s in plan.servers:
        assert artifacts.env_problems(s.name, s.env, {}) == []
    assert artifacts.env_problems("s", {"A": "x\r"}, {"A": 1})[0].startswith("s: env.A:")
    assert "B (the planner's)" in artifacts.env_problems("s", {"B": "\x00"}, {})[0]


def test_front_door_limits_checked_where_they_land(good):
    _dep, plan = good
    fd = plan.router.frontdoor
    addr = plan.router.address
    assert frontdoor_check.frontdoor_problems(fd, addr, True) == []
    cases = {"queue_timeout_secs": frontdoor_check.MAX_TIMEOUT_SECS + 1, "server_timeout_secs": 10**9,
             "client_timeout_secs": -1,
             "hard_stop_after_secs": 2**31, "max_connections": frontdoor_check.MAX_CONNECTIONS + 1,
             "port": 70000, "metrics_port": 0, "queue_size": -1, "max_concurrent_requests": True,
             "request_read_timeout_secs": frontdoor_check.MAX_TIMEOUT_SECS + 1, "max_body_bytes": 0}
    cases_more = [("request_read_timeout_secs", "10"), ("max_body_bytes", frontdoor_check.MAX_BODY_BYTES + 1),
                  ("max_body_bytes", True), ("max_body_bytes", None), ("max_connections_per_source", -1),
                  ("max_connections_per_source", frontdoor_check.MAX_CONNECTIONS + 1),
                  ("max_connections_per_source", "2"), ("served_models", ["a\nmodel"])]
    for key, v in cases.items():
        out = frontdoor_check.frontdoor_problems({**fd, key: v}, addr, True)
        assert out and frontdoor_check.SOURCES[key] in out[0], (key, out)
    for key, v in cases_more:
        out = frontdoor_check.frontdoor_problems({**fd, key: v}, addr, True)
        assert out and frontdoor_check.SOURCES[key] in out[0], (key, out)
    # the public listener's maxconn (global - METRICS_HEADROOM) must hold N + Q
    n, q = fd["max_concurrent_requests"], fd["queue_size"]
    tight = {**fd, "max_connections": n + q + frontdoor.METRICS_HEADROOM - 1}
    out = frontdoor_check.frontdoor_problems(tight, addr, True)
    assert out and "public listener" in out[0], out
    assert frontdoor_check.frontdoor_problems({**tight, "max_connections": n + q + frontdoor.METRICS_HEADROOM},
                                              addr, True) == []
    assert frontdoor_check.frontdoor_problems({**fd, "bind": "0.0.0.0"}, addr, False) == []
    assert frontdoor_check.frontdoor_problems({**fd, "bind": "0.0.0.0"}, addr, True)


def test_rendered_haproxy_cfg_reads_back_as_its_directives(good):
    _dep, plan = good
    fd = plan.router.frontdoor
    kw = dict(api_key_file="/etc/haproxy/keys", user="haproxy", chroot="/var/lib/haproxy")
    from pdstack.controller.render.readers import parse_haproxy

    assert parse_haproxy(frontdoor.haproxy_config(fd, **kw)) == frontdoor.haproxy_directives(fd, **kw)
    off = {**fd, "max_concurrent_requests": -1}
    assert parse_haproxy(frontdoor.haproxy_config(off)) == frontdoor.haproxy_directives(off)


def _free_port() -> int:
    with socket.socket() as so:
        so.bind(("127.0.0.1", 0))
        return so.getsockname()[1]


@pytest.mark.skipif(not Path(HAPROXY).exists(), reason="needs haproxy")
def test_a_maxconn_haproxy_checks_but_cannot_run_is_refused(good, tmp_path: Path):
    """Why the limits are checked where they land: with maxconn 10**9 `haproxy -c` passes, and the process then
    exits at start (it cannot get 2 x maxconn file descriptors); the plan's own config passes -c and runs."""
    _dep, plan = good
    fd = {**plan.router.frontdoor, "bind": "127.0.0.1", "port": _free_port(), "metrics_bind": "127.0.0.1",
          "metrics_port": _free_port()}
    (tmp_path / "m.acl").write_text("")

    def check_and_run(settings: dict) -> tuple[int, int]:
        cfg = tmp_path / "h.cfg"
        cfg.write_text(frontdoor.haproxy_config(settings, log="stdout format raw local0", stats_socket=None,
                                                maintenance_file=str(tmp_path / "m.acl")))
        c = subprocess.run([HAPROXY, "-c", "-f", str(cfg)], capture_output=True, timeout=30).returncode
        try:
            run = subprocess.run([HAPROXY, "-db", "-f", str(cfg)], capture_output=True, timeout=2).returncode
        except subprocess.TimeoutExpired:
            run = None  # still running after 2 s: it started
        return c, run

    assert check_and_run(fd) == (0, None)
    huge = {**fd, "max_connections": 10**9}
    c, run = check_and_run(huge)
    assert c == 0 and run not in (None, 0)
    assert any("maxconn" in x for x in frontdoor_check.limit_problems(huge))


def test_plan_json_holds_no_number_json_cannot_carry(good):
    _dep, plan = good
    assert artifacts.json_problems(plan) == []
    p = copy.deepcopy(plan)
    p.model["mem"] = [1.0, float("nan")]
    out = artifacts.json_problems(p)
    assert out and "model.mem.1" in out[0], out


def test_the_render_clis_refuse_a_hand_edited_plan_without_a_traceback(good, tmp_path: Path, capsys):
    from pdstack.controller.render import firewall

    _dep, plan = good
    data = plan.to_dict()
    data["router"]["frontdoor"]["bind"] = "0.0.0.0:8000\n    http-request allow"
    f = tmp_path / "plan.json"
    f.write_text(json.dumps(data))
    assert frontdoor.main(["--plan", str(f)]) == 2
    assert "holds a newline" in capsys.readouterr().err
    data["servers"][0]["host"] = data["router"]["host"]
    f.write_text(json.dumps(data))
    assert firewall.main(["--plan", str(f), "--host", data["router"]["host"], "--peer", "10.0.0.1\nflush ruleset"]) == 2
    assert "not an IP address" in capsys.readouterr().err


def test_cors_origins_a_browser_sends_are_accepted_and_read_back(good):
    """Origins as browsers serialise them pass and land in haproxy.cfg as one pattern each; an inventory without
    them renders no CORS answer at all (the router's wildcard headers are only removed)."""
    _dep, plan = good
    fd = {**plan.router.frontdoor, "cors_origins": ["https://chat.example.com", "http://10.0.0.5:3000",
                                                    "http://[fd00::1]:8080"]}
    assert frontdoor_check.frontdoor_problems(fd, fd["bind"], True) == []
    from pdstack.controller.render.readers import parse_haproxy

    back = parse_haproxy(frontdoor.haproxy_config(fd))
    acl = [d.args for d in back if d.keyword == "acl" and d.args[0] == "pdstack_cors_origin"]
    assert acl == [("pdstack_cors_origin", "req.fhdr(origin)", "-m", "str", "--", *fd["cors_origins"])]
    off = frontdoor.haproxy_config(plan.router.frontdoor)
    assert "Access-Control-Allow-Origin" not in off and "del-header Access-Control- -m beg" in off
    for bad in ("*", "null", "https://chat.example.com/", "HTTPS://chat.example.com", "https://x.example:99999",
                "http://x.example:80", "https://a b", 7):
        out = frontdoor_check.frontdoor_problems({**fd, "cors_origins": [bad]}, fd["bind"], True)
        assert out and "pdstack_router.frontdoor.cors_origins" in out[0], (bad, out)


def test_the_public_routes_are_exactly_what_docs_admission_md_lists():
    """docs/admission.md's table of what the public port serves is the allow-list the renderer uses."""
    text = (Path(__file__).resolve().parents[1] / "docs" / "admission.md").read_text()
    import re

    listed = dict((p, m) for m, p in re.findall(r"^ *\| `(GET|POST)` \| `(/[^`]*)` \|", text, re.M))
    assert listed == frontdoor.PUBLIC_ROUTES
