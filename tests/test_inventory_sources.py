"""One reader (issue 45): pdstack checks exactly the sources Ansible reads, and refuses, by name, every other one.

Each case is a copy of inventory/production with one edit. What Ansible would read but pdstack did not (an INI file,
an executable, a subdirectory, another vars-file extension or plugin through the environment) is refused before
anything reads the inventory, and no inventory script ever runs during `pdstack preflight --static`; YAML whose text
says another thing than Ansible reads (a merge key among the variables, an explicit tag), a BOM or NUL, a look-alike
group name, a lock that is not the whole checkpoint and an argv word execve refuses are refused naming the place.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pdstack.controller import pipeline
from pdstack.controller.load import inventory, modellock
from pdstack.controller.load.facts import load_facts
from pdstack.controller.render import readback
from pdstack.errors import InventoryError

ROOT = Path(__file__).resolve().parents[1]
PROD = ROOT / "inventory" / "production"
TOPO = ROOT / "tests" / "topologies" / "reference-2node-8gpu.json"


@pytest.fixture
def inv(tmp_path: Path) -> Path:
    d = tmp_path / "production"
    shutil.copytree(PROD, d)
    hosts = d / "hosts.yml"  # a real-looking address: preflight refuses the example's documentation range
    hosts.write_text(hosts.read_text().replace("192.0.2.10", "10.20.30.40"))
    return d


def refused(inv: Path) -> str:
    with pytest.raises(InventoryError) as err:
        inventory.load(inv)
    return str(err.value)


def _static(inv: Path, **env: str) -> subprocess.CompletedProcess:
    """`pdstack preflight --static` as the preflight role runs it (from the checkout, its ansible.cfg), with `env`."""
    return subprocess.run([sys.executable, "-m", "pdstack", "preflight", "--static", "-i", str(inv)], cwd=ROOT,
                          env={**os.environ, **env}, capture_output=True, text=True, timeout=120)


def test_an_ini_file_a_script_and_a_subdirectory_beside_hosts_yml_are_refused_and_nothing_runs(inv: Path,
                                                                                                tmp_path: Path):
    marker = tmp_path / "script-ran"
    (inv / "hosts").write_text("[router]\n10.9.9.9\n[monitoring]\nevil ansible_host=10.6.6.6\n")
    script = inv / "inventory.sh"
    script.write_text(f"#!/bin/sh\ntouch {marker}\necho '{{}}'\n")
    script.chmod(0o755)
    (inv / "facts").mkdir()
    (inv / "facts" / "gpu01.json").write_text("{}\n")
    (inv / "NOTES.md").write_text("ignored by Ansible (INVENTORY_IGNORE_EXTS): allowed\n")
    r = _static(inv)
    out = r.stdout + r.stderr
    assert r.returncode == 2, out
    assert "hosts (in " in out and "Ansible would read it as an inventory source" in out, out
    assert "inventory.sh (in " in out and "facts/ (in " in out and "NOTES.md" not in out, out
    assert not marker.exists()
    msg = refused(inv)  # the library path too
    assert "hosts (in " in msg and not marker.exists()


@pytest.mark.parametrize(("var", "value", "named"), [
    ("ANSIBLE_YAML_FILENAME_EXT", ".yml,.conf", "yaml_valid_extensions / ANSIBLE_YAML_FILENAME_EXT = .yml, .conf "
                                                "(env: ANSIBLE_YAML_FILENAME_EXT)"),
    ("ANSIBLE_INVENTORY_ENABLED", "script,yaml", "enable_plugins / ANSIBLE_INVENTORY_ENABLED = script, yaml "
                                                 "(env: ANSIBLE_INVENTORY_ENABLED)"),
    ("ANSIBLE_VARS_ENABLED", "host_group_vars,community.general.x", "ANSIBLE_VARS_ENABLED"),
    ("ANSIBLE_HASH_BEHAVIOUR", "merge",
     "hash_behaviour / ANSIBLE_HASH_BEHAVIOUR = merge (env: ANSIBLE_HASH_BEHAVIOUR)"),
    ("ANSIBLE_PRECEDENCE", "all_plugins_inventory,all_inventory,groups_inventory,groups_plugins_inventory",
     "precedence / ANSIBLE_PRECEDENCE = all_plugins_inventory, all_inventory"),
])
def test_an_ansible_setting_that_reads_other_sources_is_refused_by_name(inv: Path, var: str, value: str,
                                                                        named: str):
    r = _static(inv, **{var: value})
    assert r.returncode == 2 and named in r.stdout + r.stderr, r.stdout + r.stderr
    assert _static(inv).returncode == 0


def test_the_repositorys_ansible_cfg_enables_the_yaml_inventory_plugin_only():
    r = subprocess.run([str(Path(sys.executable).parent / "ansible-config"), "dump", "--only-changed"], cwd=ROOT,
                       env={**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}, capture_output=True,
                       text=True, timeout=60)
    line = next(ln for ln in r.stdout.splitlines() if ln.startswith("INVENTORY_ENABLED"))
    assert line.endswith("= ['yaml']"), line


@pytest.mark.parametrize(("text", "expected"), [
    ('pdstack_router:\n  port: !!int "08000"\n', "pdstack_router.port (group_vars/all/extra.yml:2): an explicit YAML "
                                                "tag (!!int)"),
    ("pdstack_router: !!omap [{port: 8000}]\n", "an explicit YAML tag (!!omap)"),
    ("base: &b {pdstack_environment: test}\n<<: *b\n", "group_vars/all/extra.yml:2: a YAML merge key (<<)"),
])
def test_yaml_that_ansible_reads_as_something_else_is_refused(inv: Path, text: str, expected: str):
    (inv / "group_vars" / "all" / "extra.yml").write_text(text)
    assert expected in refused(inv)


@pytest.mark.parametrize(("data", "expected"), [
    (b"\xef\xbb\xbfpdstack_x: 1\n", "group_vars/all/extra.yml: starts with a byte-order mark (U+FEFF"),
    (b"a: 1\nb: 2\x00\n", "group_vars/all/extra.yml:2: holds a NUL byte (U+0000)"),
])
def test_a_bom_or_nul_is_named(inv: Path, data: bytes, expected: str):
    (inv / "group_vars" / "all" / "extra.yml").write_bytes(data)
    assert expected in refused(inv)


def test_a_look_alike_group_name_is_pointed_at(inv: Path):
    hosts = (inv / "hosts.yml").read_text()
    (inv / "hosts.yml").write_text(hosts.replace("    router:\n", "    r\u043euter:\n"))
    msg = refused(inv)
    assert "group 'r\u043euter' (hosts.yml): character 2 is U+043E CYRILLIC SMALL LETTER O, not ASCII" in msg, msg
    assert "did you mean 'router'?" in msg


def test_a_lock_is_the_whole_checkpoint_within_sane_sizes(tmp_path: Path):
    lock = json.loads((ROOT / "inventory" / "locks" / "pdstack-sim.json").read_text())
    assert modellock.problems(lock, "lock") == []
    missing = {**lock, "files": [f for f in lock["files"] if f["path"] != "model-00002-of-00003.safetensors"]}
    [msg] = modellock.problems(missing, "lock")
    assert "the checkpoint has 3 shards but the lock misses model-00002-of-00003.safetensors" in msg, msg
    huge = {**lock, "files": [{**f, "size": 10 ** 30} if f["path"] == "config.json" else f for f in lock["files"]]}
    assert "files[0].size: 1000000000000000000000000000000 is not a size in bytes of 0-1099511627776" in \
        modellock.problems(huge, "lock")[0]
    odd = {**lock, "files": [*lock["files"], {**lock["files"][1], "path": "model-00001-of-00004.safetensors"}]}
    assert "shards say different totals (00003, 00004)" in modellock.problems(odd, "lock")[0]


def test_an_argv_word_past_what_execve_takes_is_refused(inv: Path):
    dep = inventory.load(inv)
    plan = pipeline.make_plan(dep, load_facts(TOPO, list(dep.hosts)))
    assert readback.argv_size_problems(plan) == []
    s = plan.servers[0]
    s.flags[-1] = "x" * readback.MAX_ARG_STRLEN
    [msg] = readback.argv_size_problems(plan)
    assert f"server {s.name}: the word after" in msg and "131071 per argument (MAX_ARG_STRLEN)" in msg, msg


def _vaulted_local(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of inventory/local with group_vars/all/router.yml encrypted whole and the served name an inline
    !vault value, and the password file (made with ansible-vault itself)."""
    from site_helpers import vaulted

    inv = tmp_path / "local"
    shutil.copytree(ROOT / "inventory" / "local", inv)  # symlinks copied as files
    (tmp_path / "locks").symlink_to(ROOT / "inventory" / "locks")
    return inv, vaulted(inv, tmp_path, "group_vars/all/router.yml", "group_vars/all/model.yml", "served_name")


def test_a_vault_encrypted_inventory_is_read_with_ansibles_usual_password_ways(tmp_path: Path):
    """A vars file encrypted whole and an inline !vault value: `pdstack plan` reads them with the password Ansible's
    configuration names (ANSIBLE_VAULT_PASSWORD_FILE), the preflight role with the one ansible-playbook was given
    (--vault-password-file), by the same strict rules; without a password the file is named, with the fix."""
    inv, pw = _vaulted_local(tmp_path)
    plan = [sys.executable, "-m", "pdstack", "plan", "-i", str(inv), "--facts",
            str(ROOT / "tests" / "topologies" / "single-node-4gpu.json")]
    r = subprocess.run(plan, cwd=ROOT, capture_output=True, text=True, timeout=120,
                       env={**os.environ, "ANSIBLE_VAULT_PASSWORD_FILE": str(pw)})
    assert r.returncode == 0 and "--served-model-name deepseek-v4-flash" in r.stdout, r.stdout + r.stderr
    env = {k: v for k, v in os.environ.items() if not k.startswith("ANSIBLE_VAULT")}
    r = subprocess.run(plan, cwd=ROOT, capture_output=True, text=True, timeout=120, env=env)
    assert r.returncode == 2 and "group_vars/all/router.yml: encrypted whole with ansible-vault" in r.stderr, r.stderr
    book = tmp_path / "static.yml"
    book.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.include_role: {name: preflight, tasks_from: static}\n")
    run = [str(Path(sys.executable).parent / "ansible-playbook"), str(book), "-i", str(inv)]
    pb_env = {**env, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles")}
    r = subprocess.run([*run, "--vault-password-file", str(pw)], cwd=ROOT, env=pb_env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    r = subprocess.run([*run, "-e", "pdstack_tag={{ lookup('pipe', 'id') }}", "--vault-password-file", str(pw)],
                       cwd=ROOT, env=pb_env, capture_output=True, text=True, timeout=300)
    assert r.returncode != 0 and "pdstack_tag (-e #1)" in r.stdout + r.stderr, (r.stdout + r.stderr)[-3000:]


def _generated(tmp_path: Path, rng, i: int) -> Path:
    """A random inventory of the supported shape: 1-3 hosts in gpu/router/monitoring/extra groups, pdstack values
    set at the levels Ansible merges (group_vars/all as a file or a directory, another group, hosts.yml's host
    vars, host_vars as a file or a directory), some of them set twice across levels where pdstack allows it."""
    import yaml

    inv = tmp_path / f"gen{i}"
    hosts = [f"h{j}" for j in range(rng.randint(1, 3))]
    extra = rng.choice([None, "edge"])
    groups = {"gpu": hosts, "router": [hosts[0]], "monitoring": [rng.choice(hosts)], **({extra: hosts[-1:]}
                                                                                      if extra else {})}
    doc: dict = {"all": {"children": {}}}
    for g, members in groups.items():
        doc["all"]["children"][g] = {"hosts": {h: ({"ansible_host": f"10.1.0.{hosts.index(h) + 1}"}
                                                   if g == "gpu" else None) for h in members}}
    (inv / "group_vars" / "all").mkdir(parents=True)
    (inv / "hosts.yml").write_text(yaml.safe_dump(doc))
    top = {"pdstack_environment": "local", "pdstack_smoke": {"min_horizon": rng.choice([0, 1000, 4000])},
           "pdstack_router": {"port": rng.randint(8000, 8100), "admission": {"max_concurrent_requests":
                                                                              rng.choice([-1, 4, 32])}}}
    if rng.random() < 0.5:
        for k, v in top.items():
            (inv / "group_vars" / "all" / f"{k}.yml").write_text(yaml.safe_dump({k: v}))
    else:
        (inv / "group_vars" / "all" / "main.yml").write_text(yaml.safe_dump(top))
    if extra:
        (inv / "group_vars" / f"{extra}.yml").write_text(yaml.safe_dump({"node_exporter_port": 9200}))
    for h in hosts:
        servers = {"pdstack_servers": [{"name": f"{h}-s", "role": rng.choice(["prefill", "decode"]),
                                        "gpus": [0]}],
                   "pdstack_numa_reserve_gb": rng.choice([0, 8, 16.5])}
        if rng.random() < 0.5:
            (inv / "host_vars").mkdir(exist_ok=True)
            (inv / "host_vars" / f"{h}.yml").write_text(yaml.safe_dump(servers))
        else:
            (inv / "host_vars" / h).mkdir(parents=True)
            for k, v in servers.items():
                (inv / "host_vars" / h / f"{k}.yaml").write_text(yaml.safe_dump({k: v}))
    return inv


def test_pdstack_reads_exactly_what_ansible_inventory_resolves_for_generated_inventories(tmp_path: Path):
    """Property: for random inventories of the supported shape and random -e values in each of its forms, the
    variables pdstack checks (load_located: every pdstack_* and port variable, per host) equal what
    `ansible-inventory --list -e ...` resolves with the repository's configuration, and a variable an -e sets is
    located at that -e; adding an INI source, a merge key or an explicit tag to any of them is refused."""
    import random

    import yaml

    rng = random.Random(45)
    cli = str(Path(sys.executable).parent / "ansible-inventory")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg")}
    for i in range(12):
        inv = _generated(tmp_path, rng, i)
        extra = _extra_vars(tmp_path, rng, i)
        ours, groups, where = inventory.load_located(inv, tuple(extra))
        r = subprocess.run([cli, "-i", str(inv), "--list", *(a for e in extra for a in ("-e", e))], cwd=ROOT,
                           env=env, capture_output=True, text=True, timeout=60, check=True)
        theirs = json.loads(r.stdout)["_meta"]["hostvars"]
        want = {h: {k: v for k, v in hv.items() if k.startswith("pdstack_") or k in ours[h]} for h, hv in
                theirs.items()}
        assert ours == want, (i, extra, ours, want)
        last: dict[str, str] = {}  # variable -> where the last -e setting it is named
        for n, e in enumerate(extra, 1):
            if e.startswith("@"):
                last.update(dict.fromkeys(yaml.safe_load(Path(e[1:]).read_text()), f"-e {e}:"))
            else:
                last.update(dict.fromkeys([e.split("=")[0]] if e[0] != "{" else json.loads(e), f"-e #{n}"))
        for v, named in last.items():
            assert where[v].startswith(named) if v.startswith("pdstack_") and v in where else True, (v, where)
        assert all(where[v].startswith(n) for v, n in last.items() if v in ("pdstack_router", "pdstack_smoke"))
        assert sorted(groups["gpu"]) == sorted(json.loads(r.stdout)["gpu"]["hosts"])
        bad = rng.choice(["ini", "merge", "tag"])
        if bad == "ini":
            (inv / "more").write_text("[gpu]\nh9 ansible_host=10.6.6.6\n")
        elif bad == "merge":
            (inv / "group_vars" / "all" / "z.yml").write_text("<<: {pdstack_smoke: {min_horizon: 1}}\n")
        else:
            (inv / "group_vars" / "all" / "z.yml").write_text('pdstack_pd: {x: !!int "010"}\n')
        with pytest.raises(InventoryError):
            inventory.load(inv)


def test_vars_beside_the_playbooks_are_refused_by_name(tmp_path: Path):
    """Ansible reads group_vars/ and host_vars/ beside a playbook for every host of the run; pdstack's tree has none,
    and a checkout that grows one is refused naming it."""
    from pdstack.controller.load import sources

    assert sources.playbook_vars_problems(ROOT) == []
    (tmp_path / "site.yml").write_text("[]\n")
    (tmp_path / "playbooks" / "host_vars").mkdir(parents=True)
    (tmp_path / "group_vars").mkdir()
    found = sources.playbook_vars_problems(tmp_path)
    assert [p.split(" ")[0] for p in found] == ["group_vars/", "playbooks/host_vars/"], found
    assert "beside site.yml" in found[0] and "beside playbooks/*.yml" in found[1]


def test_every_file_ansible_read_must_be_one_the_lint_read(inv: Path):
    """The invariant that makes the lint and Ansible's loading one reading: the files Ansible's loader opened are
    compared with the ones the strict lint read, and one the lint missed is named (load/origins.py)."""
    from pdstack.controller.load import origins

    rec = origins.Recorder()
    rec.files = {str(inv / "hosts.yml"): {}, str(inv / "group_vars" / "all" / "new.yml"): {}}
    places = origins.Places(inv, rec)
    found = origins.unlinted(rec, {os.path.realpath(inv / "hosts.yml")}, places)
    assert len(found) == 1 and found[0].startswith("group_vars/all/new.yml: Ansible read it"), found
    assert inventory.load(inv).hosts  # the shipped shape: every file Ansible read was linted


def test_a_shadowed_deployment_setting_names_both_origins(inv: Path):
    (inv / "group_vars" / "gpu.yml").write_text("pdstack_router:\n  port: 9999\n")
    msg = refused(inv)
    assert "pdstack_router (group_vars/gpu.yml:1): set for group gpu" in msg, msg
    assert "it shadows group_vars/all/router.yml:" in msg, msg


def _extra_vars(tmp_path: Path, rng, i: int) -> list[str]:
    """Random -e values in the three forms ansible-playbook reads (key=value words, inline YAML/JSON, @FILE)."""
    import yaml

    out = []
    for j in range(rng.randint(0, 3)):
        form = rng.choice(["kv", "json", "file"])
        value = {"pdstack_smoke": {"min_horizon": rng.choice([0, 2000, 5000])}} if rng.random() < 0.5 else {
            "pdstack_router": {"port": rng.randint(8200, 8300), "admission": {"max_concurrent_requests": 8}}}
        if form == "kv":
            out.append(f"pdstack_note_{j}=v{rng.randint(0, 9)}")
        elif form == "json":
            out.append(json.dumps(value))
        else:
            f = tmp_path / f"e{i}-{j}.yml"
            f.write_text(yaml.safe_dump(value))
            out.append(f"@{f}")
    return out


def test_an_ssh_host_alias_that_would_win_over_ansible_host_is_refused(inv: Path):
    """ansible_ssh_host is read by the ssh connection after ansible_host (ansible/plugins/connection/ssh.py: its
    `host` option's vars), so it silently moves the deploy to another machine than the address pdstack renders."""
    (inv / "host_vars" / "gpu01" / "conn.yml").write_text("ansible_ssh_host: 10.66.6.6\n")
    msg = refused(inv)
    assert "ansible_ssh_host (host_vars/gpu01/conn.yml:1): Ansible's ssh connection reads it after ansible_host" \
        in msg and "10.66.6.6" in msg, msg


def test_the_deploy_path_reads_the_inventory_as_pdstack_plan_does(inv: Path, tmp_path: Path):
    """site.yml's preflight (its action plugin, in ansible-playbook's process, with the run's -e and vault secrets)
    refuses what `pdstack plan` refuses from Ansible's own loading: a shadowed deployment-wide setting, an ssh
    address alias; the same inventory without them passes."""
    book = tmp_path / "static.yml"
    book.write_text("- hosts: localhost\n  connection: local\n  gather_facts: false\n  tasks:\n"
                    "    - ansible.builtin.include_role: {name: preflight, tasks_from: static}\n")
    env = {**os.environ, "ANSIBLE_CONFIG": str(ROOT / "ansible.cfg"), "ANSIBLE_ROLES_PATH": str(ROOT / "roles")}
    run = [str(Path(sys.executable).parent / "ansible-playbook"), str(book), "-i", str(inv)]
    (inv / "group_vars" / "gpu.yml").write_text("pdstack_router:\n  port: 9999\n")
    (inv / "host_vars" / "gpu01" / "conn.yml").write_text("ansible_ssh_host: 10.66.6.6\n")
    r = subprocess.run(run, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    out = r.stdout + r.stderr
    assert r.returncode != 0 and "pdstack_router (group_vars/gpu.yml:1): set for group gpu" in out, out[-3000:]
    assert "ansible_ssh_host (host_vars/gpu01/conn.yml:1)" in out, out[-3000:]
    (inv / "group_vars" / "gpu.yml").unlink()
    (inv / "host_vars" / "gpu01" / "conn.yml").unlink()
    r = subprocess.run([*run, "-e", "some_other_var=1"], cwd=ROOT, env=env, capture_output=True, text=True,
                       timeout=300)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
