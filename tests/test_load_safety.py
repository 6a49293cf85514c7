"""The inventory loaded safely (issue 19): what Ansible would read silently differently, or run, is refused.

Every case is a copy of inventory/production with one edit written as text (the traps are in how YAML is written,
so the edits do not go through a YAML dumper), and asserts that the InventoryError names the file (and line), the
variable and the fix. The property tests generate hostile scalars and assert the loader refuses them with the file
named, or returns exactly the value the text means.
"""

from __future__ import annotations

import os
import random
import re
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from pdstack.controller.load import inventory, yamlsafe
from pdstack.errors import InventoryError

ROOT = Path(__file__).resolve().parents[1]
PROD = ROOT / "inventory" / "production"
ROUTER = "group_vars/all/router.yml"
MODEL = "group_vars/all/model.yml"
SMOKE = "group_vars/all/smoke.yml"
SERVERS = "host_vars/gpu01/servers.yml"
HOSTS = "hosts.yml"

BOMB = """lol0: &a ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]
lol1: &b [*a, *a, *a, *a, *a, *a, *a, *a, *a]
lol2: &c [*b, *b, *b, *b, *b, *b, *b, *b, *b]
lol3: &d [*c, *c, *c, *c, *c, *c, *c, *c, *c]
lol4: &e [*d, *d, *d, *d, *d, *d, *d, *d, *d]
lol5: &f [*e, *e, *e, *e, *e, *e, *e, *e, *e]
lol6: &g [*f, *f, *f, *f, *f, *f, *f, *f, *f]
lol7: &h [*g, *g, *g, *g, *g, *g, *g, *g, *g]
lol8: &i [*h, *h, *h, *h, *h, *h, *h, *h, *h]
"""


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    d = tmp_path / "production"
    shutil.copytree(PROD, d)
    return d


def refused(inv: Path) -> str:
    """The message of the InventoryError loading `inv` raises (it must raise one, and quickly)."""
    t = time.monotonic()
    with pytest.raises(InventoryError) as err:
        inventory.load(inv)
    assert time.monotonic() - t < 10
    return str(err.value)


def sub(rel: str, old: str, new: str, count: int = 1):
    """An edit: replace `old` by `new` in file `rel` (which must hold it)."""
    def edit(inv: Path) -> None:
        p = inv / rel
        text = p.read_text()
        assert old in text, (rel, old)
        p.write_text(text.replace(old, new, count))
    return edit


def write(rel: str, text: str):
    def edit(inv: Path) -> None:
        (inv / rel).parent.mkdir(parents=True, exist_ok=True)
        (inv / rel).write_text(text)
    return edit


def append(rel: str, text: str):
    def edit(inv: Path) -> None:
        with open(inv / rel, "a") as f:
            f.write(text)
    return edit


def line_of(inv: Path, rel: str, text: str) -> int:
    return (inv / rel).read_text().splitlines().index(text) + 1


def check(inv: Path, edit, expected: list[str]) -> str:
    edit(inv)
    msg = refused(inv)
    for fragment in expected:
        assert fragment in msg, f"{fragment!r} not in:\n{msg}"
    return msg


def test_the_shipped_inventories_load_unchanged():
    for name in ("production", "local", "test/one-host", "test/three-host", "test/two-decode"):
        dep = inventory.load(ROOT / "inventory" / name)
        assert dep.hosts and dep.locations, name
        where = dep.locations["pdstack_router"] if "pdstack_router" in dep.locations else None
        assert where is None or where.startswith("group_vars/all/router.yml:")
    lock = inventory.load(ROOT / "inventory" / "local").model["source"]["lock"]  # the allowed template, resolved
    assert lock == str(ROOT / "inventory" / "locks" / "pdstack-sim.json")


# --------------------------------------------------------------------- class 3: YAML that Ansible reads unsafely

YAML_CASES = [
    pytest.param(append(ROUTER, "  admission:\n    max_concurrent_requests: -1\n"),
                 [ROUTER + ":", "'admission' is set twice", "remove one"], id="duplicate-nested-key"),
    pytest.param(append(ROUTER, "pdstack_router:\n  port: 8000\n"),
                 [ROUTER + ":", "'pdstack_router' is set twice"], id="duplicate-top-key"),
    pytest.param(append(SERVERS, "pdstack_numa_reserve_gb: 0\n"),
                 [SERVERS + ":", "'pdstack_numa_reserve_gb' is set twice"], id="duplicate-host-key"),
    pytest.param(write("group_vars/all/lol.yml", BOMB), ["group_vars/all/lol.yml", "alias bomb"], id="alias-bomb"),
    pytest.param(write("group_vars/all/lol.yml", "pdstack_pd:\n  x: &a [1, 2]\n  y: *a\n"),
                 ["pdstack_pd", "group_vars/all/lol.yml:", "anchor or alias"], id="alias-in-pdstack-value"),
    pytest.param(write("group_vars/all/lol.yml", "port: &p 8000\npdstack_pd: *p\n"),
                 ["pdstack_pd (group_vars/all/lol.yml:2)", "anchor or alias"], id="pdstack-var-set-by-alias"),
    pytest.param(write("group_vars/all/lol.yml", "base: &b {port: 1}\npdstack_pd:\n  <<: *b\n"),
                 ["pdstack_pd", "lol.yml:", "merge key"], id="merge-key"),
    pytest.param(write("group_vars/all/big.yml", "# " + "x" * (2 << 20) + "\n"),
                 ["group_vars/all/big.yml", "bytes, over"], id="huge-file"),
    pytest.param(write("group_vars/all/deep.yml", "x: " + "[" * 200 + "]" * 200 + "\n"),
                 ["group_vars/all/deep.yml:1", "nested more than"], id="deep-nesting"),
    pytest.param(write("group_vars/all/two.yml", "a: 1\n---\nb: 2\n"),
                 ["group_vars/all/two.yml:3", "second YAML document"], id="two-documents"),
    pytest.param(write("group_vars/all/bin.yml", "a: 1\n\udcff\n"), ["group_vars/all/bin.yml", "UTF-8"],
                 id="not-utf8"),
]


def _write_bytes(rel: str, data: bytes):
    def edit(inv: Path) -> None:
        (inv / rel).write_bytes(data)
    return edit


YAML_CASES[-1] = pytest.param(_write_bytes("group_vars/all/bin.yml", b"a: 1\n\xff\xfe\n"),
                              ["group_vars/all/bin.yml", "UTF-8"], id="not-utf8")


@pytest.mark.parametrize(("edit", "expected"), YAML_CASES)
def test_yaml_ansible_would_read_unsafely_is_refused(inv: Path, edit, expected):
    check(inv, edit, expected)


def test_non_regular_files_are_refused_without_being_opened(inv: Path):
    os.mkfifo(inv / "group_vars/all/pipe.yml")  # opening it would block forever
    os.symlink("/dev/zero", inv / "host_vars/gpu01/zero.yml")
    msg = refused(inv)
    assert "group_vars/all/pipe.yml: is a fifo" in msg and "remove it" in msg
    assert "host_vars/gpu01/zero.yml: is a device" in msg


def test_symlink_loops_and_dangling_links_are_refused(inv: Path):
    os.symlink(".", inv / "group_vars/all/loop")
    os.symlink(inv / "nowhere.yml", inv / "group_vars/all/gone.yml")
    msg = refused(inv)
    assert "group_vars/all/loop: a symlink loop" in msg and "group_vars/all/gone.yml: cannot be read" in msg


def test_ansible_host_is_read_by_the_same_rules(inv: Path, tmp_path: Path):
    marker = tmp_path / "ran"
    sub(HOSTS, "ansible_host: 192.0.2.10", f"ansible_host: \"{{{{ lookup('pipe', 'touch {marker}') }}}}\"")(inv)
    msg = refused(inv)
    assert "ansible_host (hosts.yml:" in msg and "Jinja template" in msg and not marker.exists()


def test_too_many_vars_files_are_refused_quickly(inv: Path):
    for i in range(2100):
        (inv / f"group_vars/g{i}.yml").write_text("a: 1\n")
    assert "group_vars: more than 2000 vars files" in refused(inv)


def test_a_vars_file_named_by_a_whole_host_name_is_read_strictly_too(inv: Path):
    os.mkfifo(inv / "host_vars/10.0.0.1")  # the vars of a host named 10.0.0.1: Ansible would open it
    (inv / "host_vars/notes.md").write_text("not: [yaml\n")  # Ansible reads no .md: neither does pdstack
    msg = refused(inv)
    assert "host_vars/10.0.0.1: is a fifo" in msg and "notes.md" not in msg


def test_a_fifo_as_hosts_file_is_refused(inv: Path):
    (inv / HOSTS).unlink()
    os.mkfifo(inv / HOSTS)
    assert "hosts.yml: is a fifo" in refused(inv)


# ------------------------------------------------------------------------------ YAML 1.1 traps in pdstack values

TRAP_CASES = [
    pytest.param(sub(MODEL, "  # tool_call_parser: deepseekv4", "  tool_call_parser: off"),
                 ["pdstack_model.tool_call_parser", MODEL + ":", 'quote it: "off"'], id="bool-off"),
    pytest.param(sub(SERVERS, "enabled: true", "enabled: yes"),
                 ["pdstack_servers[0].hicache.enabled", SERVERS + ":", "write true or false"], id="bool-yes"),
    pytest.param(sub(SMOKE, "variant: [single, multikey]", "variant: N"),
                 ["pdstack_smoke.grid.variant", 'quote it: "N"'], id="bool-n"),
    pytest.param(sub(SERVERS, "    extra_args:\n", "    env: {NCCL_IB_DISABLE: On}\n    extra_args:\n"),
                 ["pdstack_servers[0].env.NCCL_IB_DISABLE", 'quote it: "On"'], id="bool-env-value"),
    pytest.param(sub(SERVERS, "    extra_args:\n", "    env: {off: x}\n    extra_args:\n"),
                 ["pdstack_servers[0].env.off", "the key"], id="bool-key"),
    pytest.param(sub(SERVERS, "{http: 30001}", "{http: 030001}"),
                 ["pdstack_servers[1].ports.http", SERVERS + ":", "write 30001"], id="octal-port"),
    pytest.param(sub(ROUTER, "queue_timeout_secs: 30", "queue_timeout_secs: 1:30"),
                 ["pdstack_router.admission.queue_timeout_secs", "base 60", "write 90"], id="base60"),
    pytest.param(sub(ROUTER, "port: 8000", "port: 8_000"), ["pdstack_router.port", "write 8000"], id="underscore"),
    pytest.param(sub(ROUTER, "port: 8000", "port: 0x1F40"), ["pdstack_router.port", "write 8000"], id="hex"),
    pytest.param(sub(MODEL, "served_name: deepseek-v4-flash", "served_name: 2024-01-01"),
                 ["pdstack_model.served_name", "date", 'quote it: "2024-01-01"'], id="date"),
    pytest.param(sub(SMOKE, "timeout_s: 600", "timeout_s: .inf"), ["pdstack_smoke.timeout_s", "not a finite"],
                 id="inf"),
    pytest.param(sub(SMOKE, "tolerance: 0.2", "tolerance: .NaN"), ["pdstack_smoke.bench.tolerance", "not a finite"],
                 id="nan"),
    pytest.param(sub(ROUTER, "request_timeout_secs: 600", "request_timeout_secs: 1" + "0" * 309),
                 ["pdstack_router.request_timeout_secs", "beyond 2**53"], id="310-digits"),
    pytest.param(sub(ROUTER, "request_timeout_secs: 600", "request_timeout_secs: 1" + "0" * 5000),
                 ["pdstack_router.request_timeout_secs", "beyond 2**53"], id="5000-digits"),
    pytest.param(sub(ROUTER, "request_timeout_secs: 600", "request_timeout_secs: 1.0e+400"),
                 ["pdstack_router.request_timeout_secs", "not a finite"], id="float-overflow"),
]


@pytest.mark.parametrize(("edit", "expected"), TRAP_CASES)
def test_yaml11_traps_in_pdstack_values_are_refused_with_the_fix(inv: Path, edit, expected):
    msg = check(inv, edit, expected)
    assert re.search(r"\.yml:\d+", msg), msg


# ------------------------------------------------------------------------------------ class 3: no template runs

TEMPLATE_CASES = [
    pytest.param(MODEL, "served_name: deepseek-v4-flash",
                 "served_name: \"{{ lookup('pipe', 'touch MARKER') }}\"", "pdstack_model.served_name", id="lookup"),
    pytest.param(MODEL, "served_name: deepseek-v4-flash", "served_name: \"{% if true %}x{% endif %}\"",
                 "pdstack_model.served_name", id="statement"),
    pytest.param(SMOKE, "tokenizer: /srv/models/DeepSeek-V4-Flash-NVFP4",
                 "tokenizer: \"{{ inventory_dir }}/{{ lookup('pipe', 'touch MARKER') }}\"", "pdstack_smoke.tokenizer",
                 id="allowed-form-with-more"),
    pytest.param(SERVERS, "watchdog-timeout: 600\n  - name: decode-0",
                 "watchdog-timeout: \"{{ lookup('pipe', 'touch MARKER') }}\"\n  - name: decode-0",
                 "pdstack_servers[0].extra_args.watchdog-timeout", id="extra-args"),
    pytest.param(HOSTS, "ansible_user: root", "ansible_user: root\n          pdstack_address: \"{{ lookup('pipe', "
                 "'touch MARKER') }}\"", "pdstack_address", id="inline-in-hosts-file"),
    pytest.param(SMOKE, "lengths: [1024, 1984, 2112, 4096, 8192, 16384, 32768, 65536, 131072]",
                 "lengths: [1000, \"{# x #}\"]",
                 "pdstack_smoke.grid.lengths[1]", id="comment-in-list"),
]


@pytest.mark.parametrize(("rel", "old", "new", "variable"), TEMPLATE_CASES)
def test_templates_in_pdstack_values_are_refused_and_never_evaluated(inv: Path, tmp_path: Path, rel, old, new,
                                                                      variable):
    marker = tmp_path / "ran"
    msg = check(inv, sub(rel, old, new.replace("MARKER", str(marker))), [variable, rel + ":", "Jinja template",
                                                                          "write the value itself"])
    assert not marker.exists(), msg


def test_the_allowed_template_is_resolved_without_jinja(inv: Path):
    sub(SMOKE, "tokenizer: /srv/models/DeepSeek-V4-Flash-NVFP4", "tokenizer: \"{{ inventory_dir }}/tok\"")(inv)
    assert inventory.load(inv).smoke["tokenizer"] == f"{inv}/tok"


@pytest.mark.parametrize("hostile", ["bomb", "huge", "many-values", "lookup"])
def test_preflight_static_finishes_within_10s_on_hostile_input(inv: Path, tmp_path: Path, hostile):
    marker = tmp_path / "ran"
    {"bomb": write("group_vars/all/lol.yml", BOMB),
     "huge": write("group_vars/all/big.yml", "a: [" + "1, " * (4 << 20) + "]\n"),
     "many-values": write("group_vars/all/big.yml", "a: [" + "1, " * 340_000 + "]\n"),  # just under the size bound
     "lookup": sub(MODEL, "served_name: deepseek-v4-flash",
                   f"served_name: \"{{{{ lookup('pipe', 'touch {marker}') }}}}\""),
     }[hostile](inv)
    t = time.monotonic()
    r = subprocess.run([sys.executable, "-m", "pdstack", "preflight", "--static", "-i", str(inv)], capture_output=True,
                       text=True, timeout=10, cwd=ROOT, env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert time.monotonic() - t < 10
    assert r.returncode != 0 and "group_vars/all/" in r.stderr + r.stdout and "Traceback" not in r.stderr, r.stderr
    assert not marker.exists()


# -------------------------------------------------------------------- class 4: one variable in two files, nulls

TWO_FILE_CASES = [
    pytest.param(lambda inv: shutil.copy(inv / ROUTER, inv / "group_vars/all/router_old.yml"),
                 ["pdstack_router", "set 2 times for group all", f"{ROUTER}:", "group_vars/all/router_old.yml:",
                  "keep it in one file"], id="router-old"),
    pytest.param(write("group_vars/all.yml", "pdstack_environment: local\n"),
                 ["pdstack_environment", "group_vars/all.yml:1", "group_vars/all/deployment.yml:"], id="all-yml"),
    pytest.param(write("host_vars/gpu01.yml", "pdstack_numa_reserve_gb: 0\n"),
                 ["pdstack_numa_reserve_gb", "host gpu01", "host_vars/gpu01.yml:1", SERVERS], id="host-file-and-dir"),
    pytest.param(sub(HOSTS, "ansible_user: root", "ansible_user: root\n          pdstack_numa_reserve_gb: 0"),
                 ["pdstack_numa_reserve_gb", "hosts.yml:", SERVERS], id="hosts-file-and-host-vars"),
    pytest.param(sub(HOSTS, "all:\n", "all:\n  vars:\n    pdstack_environment: local\n"),
                 ["pdstack_environment", "hosts.yml:", "group_vars/all/deployment.yml"], id="hosts-file-group-vars"),
]


@pytest.mark.parametrize(("edit", "expected"), TWO_FILE_CASES)
def test_a_pdstack_variable_in_two_files_names_both(inv: Path, edit, expected):
    check(inv, edit, expected)


def _comment_out(rel: str, first: str, lines: int):
    def edit(inv: Path) -> None:
        text = (inv / rel).read_text().splitlines()
        i = text.index(first) + 1
        text[i:i + lines] = ["#" + t for t in text[i:i + lines]]
        (inv / rel).write_text("\n".join(text) + "\n")
    return edit


def _comment_all_but_first(rel: str):
    def edit(inv: Path) -> None:
        text = (inv / rel).read_text().splitlines()
        i = next(n for n, t in enumerate(text) if t.startswith("pdstack_"))
        (inv / rel).write_text("\n".join(text[:i + 1] + ["#" + t for t in text[i + 1:]]) + "\n")
    return edit


NULL_CASES = [
    pytest.param(_comment_all_but_first(ROUTER), "pdstack_router", ROUTER, id="router-section"),
    pytest.param(_comment_out(ROUTER, "  admission:", 3), "pdstack_router.admission", ROUTER, id="admission"),
    pytest.param(_comment_out(SERVERS, "    hicache:", 9), "pdstack_servers[0].hicache", SERVERS, id="hicache"),
    pytest.param(sub(SERVERS, "ports: {http: 30001}", "ports:"), "pdstack_servers[1].ports", SERVERS, id="ports"),
    pytest.param(sub(MODEL, "  # reasoning_parser: deepseek-v4", "  reasoning_parser: ~"),
                 "pdstack_model.reasoning_parser", MODEL, id="tilde"),
    pytest.param(write("host_vars/gpu01/address.yml", "pdstack_address: null\n"), "pdstack_address",
                 "host_vars/gpu01/address.yml:1", id="address"),
    pytest.param(_comment_all_but_first("group_vars/all/rollout.yml"), "pdstack_rollout", "rollout.yml",
                 id="rollout"),
]


@pytest.mark.parametrize(("edit", "variable", "where"), NULL_CASES)
def test_a_null_section_is_an_error_not_defaults(inv: Path, edit, variable, where):
    check(inv, edit, [variable, "is empty (null)", "remove the key or give it a value", where])


# ----------------------------------------------------------------------------- class 5: numbers by one rule

NUMBER_CASES = [
    pytest.param(sub(SERVERS, "mem-fraction-static: 0.85", "mem-fraction-static: \"1.5\""),
                 ["extra_args", "mem-fraction-static", "'1.5' is a quoted number", "without quotes"],
                 id="quoted-float"),
    pytest.param(sub(SERVERS, "watchdog-timeout: 600", "nccl-port: \"30001\""),
                 ["extra_args", "nccl-port", "without quotes (30001)"], id="quoted-port-flag"),
    pytest.param(sub(SERVERS, "{http: 30001}", "{http: \"30001\"}"),
                 ["pdstack_servers[1].ports.http", "got the string '30001'", "write it without quotes"],
                 id="quoted-port"),
    pytest.param(sub(ROUTER, "queue_size: 64", "queue_size: ' 64'"),
                 ["pdstack_router.admission.queue_size", "without quotes", ROUTER], id="quoted-queue"),
    pytest.param(sub(SERVERS, "device_kv_pool_gb: 180", "device_kv_pool_gb: '1.5'"),
                 ["hicache.device_kv_pool_gb", "without quotes"], id="quoted-budget"),
    pytest.param(sub(MODEL, "context_length: 131072", "context_length: true"),
                 ["pdstack_model.context_length", "expected integer, got boolean"], id="bool-is-not-int"),
    pytest.param(sub(SERVERS, "chunked-prefill-size: 8192", "chunked-prefill-size: 8192.5"),
                 ["chunked-prefill-size", "not a whole number"], id="float-for-int-flag"),
    pytest.param(sub(SERVERS, "watchdog-timeout: 600", "watchdog-timeout: \"1e400\""),
                 ["watchdog-timeout", "not a finite number"], id="string-inf-for-float-flag"),
    pytest.param(sub(SERVERS, "watchdog-timeout: 600", "watchdog-timeout: 1e3"),
                 ["watchdog-timeout", "number to other YAML readers", "plain decimal (1000)"], id="exponent"),
    pytest.param(sub(SERVERS, "{http: 30001}", "{http: 030008}"),
                 ["ports.http", "number to other YAML readers", "(30008)"], id="leading-zero-not-octal"),
    pytest.param(sub(SERVERS, "gpus: [0, 1, 2, 3]", "gpus: [0, 1, 2, 9007199254740993]"),
                 ["pdstack_servers[0].gpus[3]", "beyond 2**53"], id="big-in-list"),
]


@pytest.mark.parametrize(("edit", "expected"), NUMBER_CASES)
def test_numbers_are_normalised_by_one_rule(inv: Path, edit, expected):
    check(inv, edit, expected)


@pytest.mark.parametrize("bad", [float("inf"), float("-inf"), float("nan"), 10 ** 400, -(2 ** 60), 2 ** 53 + 1])
@pytest.mark.parametrize("where", [("pdstack_router", "request_timeout_secs"), ("pdstack_smoke", "timeout_s"),
                                   ("pdstack_numa_reserve_gb", None), ("extra_args", "mem-fraction-static"),
                                   ("env", "X"), ("node_exporter_port", None)])
def test_resolved_variables_get_the_same_number_rule_and_no_traceback(bad, where):
    """--vars (what Ansible resolved, JSON) reaches build_deployment without the YAML reader: same rule."""
    hostvars, groups = inventory.load_hostvars(PROD)
    hv = hostvars["gpu01"]
    var, key = where
    if var in ("extra_args", "env"):
        hv["pdstack_servers"][0].setdefault(var, {})[key] = bad
    elif key is None:
        hv[var] = bad
    else:
        hv[var][key] = bad
    with pytest.raises(InventoryError) as err:
        inventory.build_deployment(hostvars, groups)
    assert "not a finite number" in str(err.value) or "beyond 2**53" in str(err.value)
    assert (key or var) in str(err.value)


# ---------------------------------------------------------------------- class 7: hosts and files that don't match

def _rename_group_member(group: str, new: str):
    def edit(inv: Path) -> None:
        text = (inv / HOSTS).read_text()
        head = f"    {group}:\n      hosts:\n        "
        text = text.replace(head + "gpu01:", head + f"{new}:")
        (inv / HOSTS).write_text(text)
    return edit


HOST_CASES = [
    pytest.param(lambda inv: (inv / "host_vars/gpu01").rename(inv / "host_vars/gpu-01"),
                 ["host_vars/gpu-01 names no host", "hosts are gpu01", "rename it to host_vars/gpu01"],
                 id="host-vars-dir-typo"),
    pytest.param(write("host_vars/gpu1.yml", "pdstack_address: 10.0.0.11\n"),
                 ["host_vars/gpu1 names no host", "rename it to host_vars/gpu01"], id="host-vars-file-typo"),
    pytest.param(write("group_vars/routr.yml", "pdstack_environment: production\n"),
                 ["group_vars/routr names no group", "rename it to group_vars/router"], id="group-vars-typo"),
    pytest.param(_rename_group_member("router", "gpu1"),
                 ["group 'router' names host 'gpu1'", "typo of 'gpu01'", "hosts.yml"], id="router-group-typo"),
    pytest.param(_rename_group_member("monitoring", "gpu001"),
                 ["group 'monitoring' names host 'gpu001'", "typo of 'gpu01'"], id="monitoring-group-typo"),
    pytest.param(sub(HOSTS, "      hosts:\n        gpu01:\n", "      hosts:\n        GPU01:\n          ansible_host: "
                     "10.0.0.12\n        gpu01:\n"), ["GPU01 and gpu01", "differ only by case"], id="case-twins"),
    pytest.param(sub(HOSTS, "          ansible_host: 192.0.2.10   # TEST-NET placeholder: put the real address "
                     "here\n", ""), ["host gpu01", "no address", "set ansible_host"], id="no-address"),
]


@pytest.mark.parametrize(("edit", "expected"), HOST_CASES)
def test_hosts_and_files_that_do_not_match_are_named(inv: Path, edit, expected):
    check(inv, edit, expected)


# -------------------------------------------------------------------------------------- class 8: messages

MESSAGE_CASES = [
    pytest.param(sub(ROUTER, "  port: 8000", "  port: [8000"), [ROUTER + ":", "YAML syntax error"], id="syntax"),
    pytest.param(sub(ROUTER, "  port: 8000", "  port: 8000\n   bad: x"), [ROUTER + ":", "YAML syntax error"],
                 id="indentation"),
    pytest.param(sub(MODEL, "served_name: deepseek-v4-flash", "served_name: -deepseek-v4-flash"),
                 ["pdstack_model.served_name", "starts with '-'", "read as a flag", MODEL + ":"],
                 id="served-name-dash"),
    pytest.param(sub(SERVERS, "watchdog-timeout: 600\n  - name: decode-0",
                     "watchdog-timeout: 600\n      request-id-headers: [x-request-id, --decode]\n  - name: decode-0"),
                 ["request-id-headers", "'--decode' starts with '-'"], id="flag-in-list-item"),
    pytest.param(sub(SERVERS, "transfer: {backend: mooncake}", "transfer: {backend: mooncake, ib_device: -x}"),
                 ["transfer.ib_device", "starts with '-'"], id="ib-device-dash"),
]


@pytest.mark.parametrize(("edit", "expected"), MESSAGE_CASES)
def test_messages_name_the_file_the_variable_and_the_fix(inv: Path, edit, expected):
    msg = check(inv, edit, expected)
    assert "Traceback" not in msg


@pytest.mark.parametrize(("value", "expected"), [(False, "quote it"), (True, "quote it"), (None, "remove the key")])
def test_a_resolved_bool_or_null_where_a_string_is_meant_says_quote_it(value, expected):
    hostvars, groups = inventory.load_hostvars(PROD)
    hostvars["gpu01"]["pdstack_model"]["tool_call_parser"] = value
    with pytest.raises(InventoryError) as err:
        inventory.build_deployment(hostvars, groups)
    assert "pdstack_model.tool_call_parser" in str(err.value) and expected in str(err.value)


def test_schema_problems_name_the_file_and_line_the_value_came_from(inv: Path):
    sub(ROUTER, "queue_size: 64", "queue_size: -3.5")(inv)
    line = line_of(inv, ROUTER, "    queue_size: -3.5")
    assert f"pdstack_router.admission.queue_size: expected integer, got float -3.5 ({ROUTER}:{line})" in refused(inv)


# -------------------------------------------------------------------------------- property: hostile scalars

def _case(rng: random.Random) -> tuple[str, object]:
    """(YAML text of one scalar, the value it means; None: ambiguous or hostile, so it must be refused)."""
    word = rng.choice(["yes", "no", "on", "off", "y", "n"])
    word = "".join(c.upper() if rng.random() < 0.5 else c for c in word)
    n = rng.randrange(1, 70000)
    kind = rng.randrange(12)
    if kind == 0:
        return word, None  # YAML 1.1: a bool (or a string that other readers take for one)
    if kind == 1:
        return f"'{word}'", word
    if kind == 2:
        return "0" + str(n), None  # leading zero: octal in YAML 1.1
    if kind == 3:
        return f"{max(n // 60, 1)}:{n % 60:02d}", None  # base 60
    if kind == 4:
        return rng.choice(["\"{{ x }}\"", "'{% if 1 %}a{% endif %}'", "\"a{# c #}\"",
                           "\"{{ lookup('env', 'HOME') }}\""]), None
    if kind == 5:
        return str(n), n
    if kind == 6:
        return f'"{word}"', word
    if kind == 7:
        return f"'0{n}'", f"0{n}"
    if kind == 8:
        text = rng.choice(["true", "false", "True", "FALSE"])
        return text, text.lower() == "true"
    if kind == 9:
        return f"{n}.5", n + 0.5
    if kind == 10:
        return f"name-{n}", f"name-{n}"
    return rng.choice([".inf", "-.inf", ".nan", "1" + "0" * rng.randrange(17, 400), f"{n}_000", f"0x{n:x}",
                       "2024-01-0" + str(n % 9 + 1)]), None


def test_property_hostile_scalars_are_refused_with_the_file_or_read_exactly():
    rng = random.Random(19)
    rel = "group_vars/all/x.yml"
    refused_n = read_n = 0
    for _ in range(400):
        text, meant = _case(rng)
        for doc in (f"pdstack_x:\n  key: {text}\n", f"pdstack_x: {{key: {text}}}\n", f"pdstack_x: [{text}]\n"):
            path = "pdstack_x[0]" if doc.startswith("pdstack_x: [") else "pdstack_x.key"
            try:
                value = yamlsafe.load_vars_text(doc, rel)
            except InventoryError as e:
                refused_n += 1
                assert f"{path} ({rel}:" in str(e), (doc, str(e))
                assert meant is None, (doc, str(e))  # what the text clearly means is never refused
                continue
            read_n += 1
            got = value["pdstack_x"][0] if path.endswith("[0]") else value["pdstack_x"]["key"]
            assert meant is not None and got == meant and type(got) is type(meant), (doc, got, meant)
    assert refused_n > 300 and read_n > 300, (refused_n, read_n)


def test_property_aliases_never_reach_a_pdstack_value():
    rng = random.Random(7)
    for _ in range(100):
        depth = rng.randrange(1, 6)
        doc = "base: &a [1, 2]\n" + "pdstack_x:\n" + "".join("  " * (i + 1) + f"k{i}:\n" for i in range(depth))
        doc += "  " * (depth + 1) + "v: *a\n"
        with pytest.raises(InventoryError) as err:
            yamlsafe.load_vars_text(doc, "host_vars/h/x.yml")
        assert "host_vars/h/x.yml:" in str(err.value) and "alias" in str(err.value)


def test_the_deploy_path_refuses_a_lookup_before_ansible_templates_it(tmp_path: Path):
    """site.yml's first phase (playbooks/preflight.yml) reads the files strictly (`pdstack preflight --files`) before
    it writes the resolved variables, which is where Ansible would template the value and run the lookup."""
    inv = tmp_path / "local"
    shutil.copytree(ROOT / "inventory" / "local", inv)
    marker = tmp_path / "lookup-ran"
    model = inv / "group_vars/all/model.yml"
    model.write_text(model.read_text().replace(
        "served_name: deepseek-v4-flash", f"served_name: \"{{{{ lookup('pipe', 'touch {marker}') }}}}\""))
    assert "lookup('pipe'" in model.read_text()
    env = {**os.environ, "ANSIBLE_NOCOLOR": "1", "ANSIBLE_FORCE_COLOR": "0"}
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-playbook"), "playbooks/preflight.yml", "-i",
                        str(inv)], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert r.returncode != 0, r.stdout[-2000:]
    assert "read the inventory and the -e extra vars as pdstack plan does" in r.stdout, r.stdout[-3000:]
    assert "pdstack_model.served_name" in r.stdout, r.stdout[-3000:]
    assert "template" in r.stdout.lower(), r.stdout[-3000:]
    assert not marker.exists(), "the lookup ran on the controller"
    assert "resolved pdstack variables" not in r.stdout  # it stopped before Ansible templated anything


def test_a_checks_refusal_names_the_file_and_line_of_its_variable(tmp_path: Path):
    """The checks name a server's value as host_vars/H pdstack_servers[i] (name).path; the message then carries the
    file and line the inventory set it at (load/files.py's locations), as the loader's own messages do."""
    from pdstack.controller import pipeline

    inv = tmp_path / "production"
    shutil.copytree(PROD, inv)
    f = inv / "host_vars/gpu01/servers.yml"
    lines = f.read_text().splitlines()
    n = next(i for i, line in enumerate(lines) if "backend: mooncake" in line)
    lines[n] = lines[n].replace("backend: mooncake", "backend: fake")
    f.write_text("\n".join(lines) + "\n")
    dep = inventory.load(inv)
    with pytest.raises(InventoryError) as e:
        pipeline.make_plan(dep, {"gpu01": {}}, deploy=True)
    hit = [p for p in e.value.problems if "(prefill-0).transfer.backend: 'fake'" in p]
    assert hit and hit[0].endswith(f"(host_vars/gpu01/servers.yml:{n + 1})"), e.value.problems
