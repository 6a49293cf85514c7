"""The inventory model: one typed description of a deployment, read from an Ansible inventory's group_vars/host_vars.

Variables (see inventory/production for a commented example; docs/inventory.md):

  group_vars/all/deployment.yml  pdstack_environment   production | local | test
  group_vars/all/model.yml       pdstack_model          model path on the host, served name, context length, family
  group_vars/all/image.yml       pdstack_image          build manifest or image reference, tarball or registry (pull
                                                        by digest), engine (sglang, or the sim test engine)
  group_vars/all/router.yml      pdstack_router         router policy, admission control, retries, health checks
  group_vars/all/rollout.yml     pdstack_rollout        rolling restarts: drain and probe bounds
  group_vars/all/host.yml        pdstack_host           PCIe host settings and the reboot policy
  host_vars/<host>/servers.yml   pdstack_servers        the prefill/decode servers of that host
  host_vars/<host>/*.yml         pdstack_address        address other hosts reach this one at (default: ansible_host)

Groups: `router` (exactly one host) runs sglang-router; `monitoring` (one or more) runs Prometheus/Grafana.
Prefill and decode hosts are those whose pdstack_servers say so; one host may hold several roles.
"""

from __future__ import annotations

import argparse
import difflib
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from pdstack.controller.load import files, rules, sources, vault, yamlsafe
from pdstack.controller.load.hosts import host_problems
from pdstack.controller.load.schema import Schema, numbers_problems, plain, validate_field
from pdstack.controller.load.variables import HOST_LEVEL, ROLE_PORT_VARS, TOP_LEVEL
from pdstack.errors import InventoryError


@dataclass
class Host:
    name: str
    address: str
    groups: list[str]
    servers: list[dict[str, Any]]
    numa_reserve_gb: float
    address_source: str = "pdstack_address"  # or "ansible_host": where `address` came from (messages name it)
    ansible_host: str = ""  # where Ansible connects (may differ from address)
    role_vars: dict[str, Any] = field(default_factory=dict)  # the ROLE_PORT_VARS the inventory sets for this host


@dataclass
class Deployment:
    """The whole deployment as typed, defaults-filled mappings."""

    source: str
    environment: str
    model: dict[str, Any]
    image: dict[str, Any]
    router: dict[str, Any]
    pd: dict[str, Any]
    hosts: dict[str, Host]
    router_host: str
    monitoring_hosts: list[str]
    warnings: list[str] = field(default_factory=list)
    smoke: dict[str, Any] = field(default_factory=dict)
    rollout: dict[str, Any] = field(default_factory=dict)
    host_settings: dict[str, Any] = field(default_factory=dict)  # pdstack_host (load/host_settings.py)
    locations: dict[str, str] = field(default_factory=dict)  # variable path -> "file:line" (see located())
    # pdstack_model.source.lock as read (modellock.py), with its `file` and `digest`; None without a source
    model_lock: dict[str, Any] | None = None

    def servers(self) -> list[tuple[Host, dict[str, Any]]]:
        return [(h, s) for h in self.hosts.values() for s in h.servers]

    def service_port(self, host: str, key: str) -> tuple[Any, str]:
        """(port, where it is set) of role variable `key` (ROLE_PORT_VARS) on `host`: the inventory's value when it
        sets one, else the role's default. The port is an int, or the raw value when it is not a port."""

        role = ROLE_PORT_VARS[key]
        h = self.hosts[host]
        if key not in h.role_vars:
            return rules.role_port(role, key), f"{key} (roles/{role}/defaults)"
        return rules.port_of(h.role_vars[key]), f"{key} (inventory, host {host})"


def load_hostvars(source: str | os.PathLike) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]]]:
    """Read an Ansible inventory the way ansible-playbook does: hostvars (pdstack_* ones) and groups."""
    hostvars, groups, _ = load_located(source)
    return hostvars, groups


def check_files(source: str | os.PathLike, decrypt: vault.Decrypt | None = None) -> None:
    """Read every file of the inventory strictly (files.scan_inventory) and nothing else: what the preflight role
    runs before Ansible templates any variable of it, so a `{{ lookup('pipe', ...) }}` in a pdstack value is refused
    before the deploy path could evaluate it. Raises InventoryError."""
    src = Path(source)
    if not src.exists():
        raise InventoryError([f"inventory {str(src)!r} does not exist; pass -i inventory/production (or local, test)"])
    bad = sources.config_problems() + sources.tree_problems(src)
    if bad:
        raise InventoryError(bad)
    if decrypt is None:
        decrypt = vault.decrypter(vault.loader())
    scan = files.scan_inventory(src, (*ROLE_PORT_VARS, "ansible_host"), decrypt)
    if scan.problems:
        raise InventoryError(scan.problems)


def load_located(source: str | os.PathLike, extra_vars: tuple[str, ...] = (), loader=None
                 ) -> tuple[dict[str, dict[str, Any]], dict[str, list[str]], dict[str, str]]:
    """load_hostvars, and where each pdstack value is set ({variable path: "file:line"}).

    One reader: the values are those Ansible's own InventoryManager and VariableManager resolve (its yaml inventory
    plugin, its host_group_vars vars plugin, its vault secrets, its precedence; `extra_vars` as ansible-playbook's
    -e, through its own load_extra_vars), and where each came from is the Origin Ansible tagged it with
    (load/origins.py). Before Ansible opens anything, every file is linted strictly (files.scan_inventory: duplicate
    keys, aliases, explicit tags, YAML 1.1 traps, templates, a variable set in two files, fifos, size; it produces no
    value), and afterwards every file Ansible's loader read must be one the lint read. Nothing is templated: the one
    allowed form ({{ inventory_dir }}/<path>) is resolved by yamlsafe, no Jinja runs. `loader`: a fresh DataLoader
    holding the run's vault secrets (the preflight role's action plugin); by default the secrets Ansible's
    configuration names (load/vault.py)."""
    from ansible.errors import AnsibleError
    from ansible.inventory.manager import InventoryManager

    from pdstack.controller.load import extra_vars as extra_reader
    from pdstack.controller.load import origins

    src = Path(source)
    if not src.exists():
        raise InventoryError([f"inventory {str(src)!r} does not exist; pass -i inventory/production (or local, test)"])
    bad = sources.config_problems() + sources.tree_problems(src)  # before anything reads it
    if bad:
        raise InventoryError(bad)
    loader = loader or vault.loader()  # with the vault secrets Ansible's configuration names
    scan = files.scan_inventory(src, (*ROLE_PORT_VARS, "ansible_host"), vault.decrypter(loader))  # read these too
    extra_problems, extra_origins = extra_reader.check(extra_vars)
    if scan.problems or extra_problems:
        raise InventoryError(scan.problems + extra_problems)
    sources.pin()
    recorder = origins.Recorder()
    recorder.attach(loader)
    places = origins.Places(src if src.is_dir() else src.parent, recorder)
    locations: dict[str, str] = {}
    try:
        inv = InventoryManager(loader=loader, sources=[str(src)])
        vm = extra_reader.variable_manager(loader, inv, extra_vars)
        hostvars: dict[str, dict[str, Any]] = {}
        shadowed: list[str] = []
        for host in inv.get_hosts():
            raw = vm.get_vars(host=host)
            inv_dir = str(raw.get("inventory_dir") or (src if src.is_dir() else src.parent).resolve())
            wanted = {k: raw[k] for k in raw if k.startswith("pdstack_") or k in ROLE_PORT_VARS}
            hv = _resolve(plain(wanted), inv_dir)
            if "ansible_host" in raw:  # only when set: a host without any address is an error in production
                hv["ansible_host"] = str(raw["ansible_host"])
            hostvars[host.name] = hv
            defs = origins.definitions(inv, host, places, lambda k: str(k).startswith("pdstack_")
                                       or k in (*ROLE_PORT_VARS, "ansible_host", "ansible_ssh_host"))
            for k, v in wanted.items():
                path = f"host_vars/{host.name}.{k}" if k in HOST_LEVEL else k
                if k in HOST_LEVEL or len(hostvars) == 1:
                    origins.locations(v, path, places, locations)
                    if k in extra_origins:
                        locations[path] = extra_origins[k]
                    elif k in defs:
                        locations[path] = defs[k][-1][1]  # the key's line in the file that won
            if "ansible_ssh_host" in raw:  # the ssh plugin reads it after ansible_host: it would win
                where = (defs.get("ansible_ssh_host") or [(None, "an extra var")])[-1][1]
                shadowed.append(f"ansible_ssh_host ({where}): Ansible's ssh connection reads it after ansible_host, "
                                f"so host {host.name} would be deployed at {raw['ansible_ssh_host']} while pdstack "
                                "renders the address other hosts reach it at from ansible_host/pdstack_address; "
                                "set ansible_host instead and remove it")
            shadowed.extend(origins.shadowing({k: d for k, d in defs.items() if k not in extra_origins}, host.name,
                                              set(TOP_LEVEL), {*HOST_LEVEL, "ansible_host"}))
        groups = {g: [h.name for h in inv.groups[g].get_hosts()] for g in inv.groups}
    except AnsibleError as e:
        raise InventoryError([f"inventory {src}: Ansible could not read it: {e}"]) from e
    if not hostvars:
        raise InventoryError([f"inventory {src}: no hosts; list the GPU host(s) in hosts.yml"])
    linted = scan.files | {os.path.realpath(o[1:]) for o in extra_vars if isinstance(o, str) and o.startswith("@")}
    problems = (origins.unlinted(recorder, linted, places) + list(dict.fromkeys(shadowed))
                + files.unmatched(scan, sorted(hostvars), sorted(groups)))
    if problems:
        raise InventoryError(problems)
    return hostvars, groups, locations


def _resolve(value: Any, inventory_dir: str) -> Any:
    """The allowed templates of `value` resolved (yamlsafe.resolve_template); everything else as it is."""
    if isinstance(value, dict):
        return {k: _resolve(v, inventory_dir) for k, v in value.items()}
    if isinstance(value, list):
        return [_resolve(v, inventory_dir) for v in value]
    if isinstance(value, str) and "{{" in value:
        return yamlsafe.resolve_template(value, inventory_dir)
    return value


def _members(groups: dict[str, Any], group: str) -> list[str]:
    members = groups.get(group) if isinstance(groups, dict) else None
    return [m for m in members if isinstance(m, str)] if isinstance(members, list) else []


def build_deployment(hostvars: dict[str, dict[str, Any]], groups: dict[str, list[str]], source: str = "?",
                     locations: dict[str, str] | None = None) -> Deployment:
    """Validate and type the variables. Raises InventoryError listing every problem found, each naming the file and
    line its value came from when `locations` (load_located) knows it."""
    locations = dict(locations or {})  # _build adds the tune overlay's keys
    try:
        return _build(hostvars, groups, source, locations)
    except InventoryError as e:
        raise InventoryError(list(dict.fromkeys(located(p, locations) for p in e.problems))) from None


# how the checks name a server's value: "host_vars/gpu01 pdstack_servers[0] (prefill-0).transfer.backend: ..."
_SERVER_WHERE = re.compile(r"^(host_vars/[^\s.]+) (pdstack_servers\[\d+\])(?: \([^)]*\))?((?:\.[\w\-]+|\[\d+\])*)")


def located(problem: str, locations: dict[str, str]) -> str:
    """`problem` with " (file:line)" of the variable it starts with (the longest known prefix of its path)."""
    m = _SERVER_WHERE.match(problem)
    path = f"{m[1]}.{m[2]}{m[3]}" if m else re.split(r"[:\s]", problem, maxsplit=1)[0]
    while path:
        if path in locations:
            where = locations[path]
            return problem if where.split(":")[0] in problem else f"{problem} ({where})"
        cut = max(path.rfind("."), path.rfind("["))
        path = path[:cut] if cut > 0 else ""
    return problem


def _build(hostvars: dict[str, dict[str, Any]], groups: dict[str, list[str]], source: str,
           locations: dict[str, str]) -> Deployment:
    problems: list[str] = []
    first = next(iter(hostvars.values()))
    # numbers first, by one rule (finite, within 2**53): every later check and message may then use them
    for key in TOP_LEVEL:
        numbers_problems(first.get(key), key, problems)
    for name, hv in hostvars.items():
        for k in hv:
            if k in HOST_LEVEL or k in ROLE_PORT_VARS:
                numbers_problems(hv[k], f"host_vars/{name}.{k}", problems)
    if problems:
        raise InventoryError(problems)
    problems += host_problems(hostvars, groups, first.get("pdstack_environment"))
    top: dict[str, Any] = {}
    for key, f in TOP_LEVEL.items():
        # group_vars/all values are the same on every host; host-specific overrides of these are not supported.
        if any(hv.get(key) != first.get(key) for hv in hostvars.values()):
            problems.append(f"{key}: differs between hosts; set it once in group_vars/all, not per host")
        top[key] = validate_field(f, first.get(key), key, problems, key in first)
    problems += _profile_problems(top, locations)
    hostvars = _with_tune(top.get("pdstack_tune"), hostvars, locations, problems)
    if (top.get("pdstack_tune") or {}).get("index_k_dtype") and isinstance(top.get("pdstack_model"), dict):
        top["pdstack_model"]["index_k_dtype"] = top["pdstack_tune"]["index_k_dtype"]  # the candidate's reader
    # unknown pdstack_* variables are almost always typos
    known = set(TOP_LEVEL) | set(HOST_LEVEL) | {"pdstack_sim_gpus"}  # sim GPUs: read by the facts role only
    for name, hv in hostvars.items():
        for k in hv:
            if k.startswith("pdstack_") and k not in known:
                hint = difflib.get_close_matches(k, sorted(known), n=1)
                problems.append(f"{k} (host {name}): unknown pdstack variable"
                                + (f"; did you mean '{hint[0]}'?" if hint else ""))

    hosts: dict[str, Host] = {}
    for name, hv in hostvars.items():
        hs = Schema(f"host {name}", HOST_LEVEL).validate({k: hv[k] for k in HOST_LEVEL if k in hv},
                                                         f"host_vars/{name}", problems)
        servers = hs.get("pdstack_servers")
        reserve = hs.get("pdstack_numa_reserve_gb")
        address = hs.get("pdstack_address")
        hosts[name] = Host(
            name=name,
            address=address if isinstance(address, str) and address else str(hv.get("ansible_host", name)),
            groups=sorted(g for g, members in groups.items()
                          if isinstance(members, list) and name in members and g not in ("all", "ungrouped")),
            servers=servers if isinstance(servers, list) else [],
            numa_reserve_gb=float(reserve) if isinstance(reserve, int | float) and not isinstance(reserve, bool)
            else 0.0,
            address_source="pdstack_address" if isinstance(address, str) and address else "ansible_host",
            ansible_host=str(hv.get("ansible_host", name)),
            role_vars={k: hv[k] for k in ROLE_PORT_VARS if k in hv},
        )

    router_hosts = [h for h in _members(groups, "router") if h in hosts]
    if len(router_hosts) != 1:
        problems.append(f"group 'router': needs exactly one host, has {router_hosts or 'none'}; put the host that "
                        "runs sglang-router under the router group in hosts.yml")
    monitoring = [h for h in _members(groups, "monitoring") if h in hosts]
    if not monitoring:
        problems.append("group 'monitoring': empty; put the host that runs Prometheus/Grafana under the "
                        "monitoring group in hosts.yml")

    model_lock = _model_lock(top["pdstack_model"], source, problems)
    if problems:
        raise InventoryError(problems)
    return Deployment(
        model_lock=model_lock,
        source=source,
        environment=top["pdstack_environment"],
        model=top["pdstack_model"],
        image=top["pdstack_image"],
        router=top["pdstack_router"],
        pd=top["pdstack_pd"],
        hosts=hosts,
        router_host=router_hosts[0],
        monitoring_hosts=monitoring,
        smoke=top["pdstack_smoke"],
        rollout=top["pdstack_rollout"],
        host_settings=top["pdstack_host"],
        locations=locations,
        warnings=[f"tuning candidate {(top['pdstack_tune'] or {}).get('name') or '(unnamed)'} applied "
                  "(pdstack_tune): this plan is the inventory's with its overlay, not the inventory's own"]
        if top.get("pdstack_tune") else [],
    )


def _profile_problems(top: dict[str, Any], locations: dict[str, str]) -> list[str]:
    """The profile is derived, not declared: production's checks are off (local, test) only for a deployment that
    cannot serve the real model, the test engine's (pdstack_image.engine: sim). One line in any file, -e included,
    cannot switch them off for an SGLang deployment."""
    env, image = top.get("pdstack_environment"), top.get("pdstack_image")
    engine = image.get("engine") if isinstance(image, dict) else None
    if env in (None, "production") or engine in (None, "sim"):
        return []
    where = locations.get("pdstack_environment", "an extra var or a file Ansible read")
    return [f"pdstack_environment: {env} ({where}) would switch production's checks off, but pdstack_image.engine is "
            f"{engine}: a deployment that serves the real model always gets them (the local and test profiles are "
            "for the test engine, engine: sim); remove pdstack_environment's override or set it to production"]


def _with_tune(tune: dict[str, Any] | None, hostvars: dict[str, dict[str, Any]], locations: dict[str, str],
               problems: list[str]) -> dict[str, dict[str, Any]]:
    """hostvars with the tuning candidate's overlay (pdstack_tune, load/tune_overlay.py) merged into its servers."""
    from pdstack.controller.load import tune_overlay

    if not locations.get("pdstack_tune", "-e ").startswith("-e "):  # only `invoke tune` passes it, as an -e
        problems.append(f"pdstack_tune ({locations['pdstack_tune']}): a tuning candidate's overlay, which `invoke "
                        "tune` passes as an extra var for one run; an inventory never sets it: remove it, and put "
                        "the setting in the servers' extra_args or env")
        return hostvars
    if not tune:
        return hostvars
    found: list[str] = []
    for selector, change in (tune.get("servers") or {}).items():
        tune_overlay.TUNE_SERVERS.validate(change, f"pdstack_tune.servers.{selector}", found)
    if found:
        problems.extend(found)
        return hostvars
    merged, where = tune_overlay.apply(tune, hostvars, problems)
    for host in tune.get("topology") or {}:  # a replaced server list: its values come from the overlay, not a file
        stale = f"host_vars/{host}.pdstack_servers"
        for k in [k for k in locations if k == stale or k.startswith((stale + ".", stale + "["))]:
            del locations[k]
    locations.update(where)
    return merged


def _model_lock(model: Any, source: str, problems: list[str]) -> dict[str, Any] | None:
    """The lock pdstack_model.source.lock names (relative to the inventory directory), read and shape-checked."""
    from pdstack.controller.load import modellock

    src = model.get("source") if isinstance(model, dict) else None
    if not isinstance(src, dict) or not isinstance(src.get("lock"), str) or not src["lock"]:
        return None
    path = Path(src["lock"]) if src["lock"].startswith("/") else Path(source) / src["lock"]
    inv = Path(source).resolve()
    if inv.is_dir() and path.resolve().is_relative_to(inv):
        problems.append(f"pdstack_model.source.lock: {src['lock']} is inside the inventory directory {source}, where "
                        "Ansible reads every file as inventory (or variables); keep locks beside it, e.g. "
                        "inventory/locks/<model>.json, and give the path relative to the inventory")
        return None
    lock, found = modellock.read(path)
    problems.extend(found)
    if lock is None:
        return None
    return {**lock, "file": str(path), "digest": modellock.digest(lock), "bytes": modellock.total_bytes(lock)}


def load(source: str | os.PathLike, resolved: str | os.PathLike | None = None,
         extra_vars: tuple[str, ...] = ()) -> Deployment:
    """The deployment of inventory `source`, with `extra_vars` (-e values, as ansible-playbook reads them). With
    `resolved` (a JSON file {"hostvars": {host: vars}, "groups": {...}} that the preflight role writes from what
    Ansible resolved, extra vars included) those variables are used instead of reading the inventory again, so
    `ansible-playbook -e ...` reaches the plan."""
    locations: dict[str, str] = {}
    if resolved is not None and extra_vars:
        raise InventoryError([f"-e with --vars {resolved}: the resolved variables already hold the run's extra vars; "
                              "give one or the other"])
    if resolved is None:
        hostvars, groups, locations = load_located(source, tuple(extra_vars))
    else:
        import json
        try:
            data = json.loads(Path(resolved).read_text())
            hostvars, groups = data["hostvars"], data["groups"]
        except (OSError, ValueError, KeyError) as e:
            raise InventoryError([f"--vars {resolved}: not a resolved-inventory file ({e})"]) from e
        if not isinstance(hostvars, dict) or not isinstance(groups, dict) or not all(
                isinstance(v, dict) for v in hostvars.values()):
            raise InventoryError([f"--vars {resolved}: not a resolved-inventory file (hostvars must map each host "
                                  "to its variables)"])
        if not hostvars:
            raise InventoryError([f"inventory {source}: no hosts; list the GPU host(s) in hosts.yml"])
        extra = data.get("extra_vars") or {}  # {variable: "-e #N" or "-e @FILE:LINE"}: what the -e values set
        if isinstance(extra, dict):
            locations.update({str(k): str(v) for k, v in extra.items()})
    dep = build_deployment(hostvars, groups, source=str(source), locations=locations)
    for var in PROTECTED:
        if str(locations.get(var, "")).startswith("-e "):
            dep.warnings.append(f"{var} comes from {locations[var]}, which wins over the inventory's files: this "
                                "deployment is not what the inventory alone says")
    return dep


# the settings that protect a deployment: an -e override of one is said out loud (load())
PROTECTED = ("pdstack_environment", "pdstack_image", "pdstack_model", "pdstack_router")


# ---------------------------------------------------------------- CLI pieces shared by `pdstack plan` and `preflight`


def add_inventory_args(parser: argparse.ArgumentParser) -> None:
    """-i and --vars: where the deployment's variables come from (shared by plan and preflight)."""
    parser.add_argument("-i", "--inventory", required=True, help="inventory directory, e.g. inventory/production")
    parser.add_argument("--vars", help="use these resolved variables (JSON the preflight role writes, extra vars "
                        "included) instead of reading the inventory's files")
    parser.add_argument("-e", "--extra-vars", action="append", default=[], metavar="VARS",
                        help="as ansible-playbook's -e (key=value, YAML/JSON, or @FILE; repeatable, the last wins): "
                        "read by the same strict rules, and named in messages by its position (-e #N)")


def facts_path(args: argparse.Namespace) -> str | None:
    """--facts, or none (a facts directory inside the inventory would be read by Ansible as more inventory:
    load/sources.py refuses it)."""
    return args.facts or None
