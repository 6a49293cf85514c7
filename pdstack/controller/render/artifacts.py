"""Every artifact the roles render from the plan, rendered here in memory and read back before any host changes
(the argv through the upstream parsers is render/readback.py's):

- each unit's ExecStart= as the roles' templates write it (`argv | map('quote') | join(' ') | replace('%', '%%')`,
  roles/serving and roles/router) split back by systemd's rules (readers.systemd_split) to the same argv, and
  every word the template writes unquoted (container, cpuset, image, the model volume) one plain word;
- each server's env file (roles/serving server.env.j2: KEY=VALUE lines, dictsort) parsed back as docker's
  --env-file reader does, to the same keys and values;
- haproxy.cfg (render/frontdoor_check.py), each host's nft script (render/firewall.py) and plan.json through their
  encoders.
Each problem names the variable the value came from and how to fix it.
"""

from __future__ import annotations

import ipaddress
import json
import math
import re
import shlex
from typing import Any

from pdstack.controller.load import tables
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.plan.planner import ROUTER_LAUNCHER, SGLANG_LAUNCHER, SIM_LAUNCHER, Plan
from pdstack.controller.render import encoders, firewall, frontdoor_check
from pdstack.controller.render.readers import parse_env_file, systemd_split


def template_exec_line(argv: list[str]) -> str:
    """What the unit templates write for `argv` (Ansible's `quote` filter is shlex.quote)."""
    return " ".join(shlex.quote(w) for w in argv).replace("%", "%%")


def _source(words: list[str], i: int, extra: dict[str, Any], owned: dict[str, str]) -> str:
    """The variable word `i` of a flag list comes from: the flag it follows, as an extra_args key or the variable
    the planner renders it from."""
    flag = next((w for w in reversed(words[:i + 1]) if w.startswith("--")), None)
    key = flag[2:].split("=", 1)[0] if flag else ""
    if not key:
        return "the launcher"
    return f"extra_args.{key}" if key in extra else owned.get(key, f"--{key}")


def _carried(word: str) -> bool:
    """The unit template's quoting, read by systemd, gives the word back."""
    try:
        return systemd_split(template_exec_line([word])) == [word]
    except ValueError:
        return False


def _exec_problems(what: str, argv: list[str], launcher_len: int, extra: dict[str, Any],
                   owned: dict[str, str]) -> list[str]:
    """The unit's ExecStart= for `argv`: each word through the ExecStart encoder, and the line the template writes
    split back by systemd's rules to the same argv."""
    words = argv[launcher_len:]
    out: list[str] = []
    for i, w in enumerate(words):
        src = _source(words, i, extra, owned)
        try:
            encoders.systemd_word(w)
        except encoders.EncodeError as e:
            out.append(f"{what}: {src}: {e}; change the value")
            continue
        if not _carried(w):
            out.append(f"{what}: {src}: {w!r} does not read back from the unit's ExecStart= as written (the unit "
                       "template quotes for a shell; systemd also expands $ and reads backslash escapes); change "
                       "the value")
    if not out and systemd_split(template_exec_line(argv)) != argv:  # pragma: no cover - words checked
        out.append(f"{what}: the unit's ExecStart= does not read back as the argv")
    return out


def _encodes(word: str) -> bool:
    try:
        encoders.systemd_word(word)
    except encoders.EncodeError:
        return False
    return True


def _plain(what: str, var: str, word: str) -> list[str]:
    """A word a template writes unquoted: it must be one plain word (no quoting needed)."""
    try:
        ok = encoders.systemd_word(word) == word and not word.startswith("-")
    except encoders.EncodeError:
        ok = False
    return [] if ok else [f"{what}: {var} {word!r} is written into the unit unquoted and must be one plain word "
                          "(letters, digits and _./:,+=@-); change it"]


def unit_problems(plan: Plan, dep: Deployment) -> list[str]:
    out = []
    launcher_len = len(SIM_LAUNCHER if plan.engine == "sim" else SGLANG_LAUNCHER)
    specs = {s["name"]: (h.name, s) for h, s in dep.servers()}
    for s in plan.servers:
        host, spec = specs[s.name]
        what = f"host_vars/{host} server {s.name}"
        out += _exec_problems(what, s.argv, launcher_len, spec["extra_args"], tables.OWNED_FLAGS)
        for var, word in (("name", s.name), ("role", s.role), ("unit", s.unit), ("container", s.container),
                          ("cpuset", s.cpuset_cpus), ("cpuset mems", s.cpuset_mems)):
            out += _plain(what, var, word)
        out += env_problems(what, s.env, spec.get("env") or {})
    r = plan.router
    out += _exec_problems("pdstack_router", r.argv, len(ROUTER_LAUNCHER), dep.router["extra_args"],
                          tables.OWNED_ROUTER_FLAGS)
    if plan.image:
        out += _plain("pdstack_image", "the image reference", plan.image)
    path = str(plan.model.get("path", ""))
    try:
        spec = encoders.docker_volume(path, path)[1]
        out += _plain("pdstack_model.path", "the model volume", spec)
    except encoders.EncodeError as e:
        out.append(f"pdstack_model.path: {e}; the server's container mounts it with --volume PATH:PATH:ro")
    return out


def env_problems(what: str, env: dict[str, str], inventory_env: dict[str, Any]) -> list[str]:
    """The env file as roles/serving writes it, read back as docker does."""
    out = []
    for k, v in env.items():
        try:
            encoders.env_line(k, v)
        except encoders.EncodeError as e:
            var = f"env.{k}" if k in inventory_env else f"{k} (the planner's)"
            out.append(f"{what}: {var}: {e}; change the value")
    if out:
        return out
    text = "".join(f"{k}={v}\n" for k, v in sorted(env.items()))  # server.env.j2: dictsort
    back = parse_env_file(text)
    if back != env:
        diff = sorted(k for k in set(back) | set(env) if back.get(k) != env.get(k))
        out.append(f"{what}: env {diff} do not read back from the env file as set; change them")
    return out


def nft_problems(plan: Plan) -> list[str]:
    """Each host's nft script through the nft encoders, and its port list read back equal to the plan's."""
    data = plan.to_dict()
    literal = []
    for a in {s.address for s in plan.servers} | {plan.router.address}:
        try:
            literal.append(str(ipaddress.ip_address(a)))
        except ValueError:
            pass  # a name: the firewall role resolves it on the host
    out = []
    for host in firewall.peer_hosts(data):
        try:
            text = firewall.nft_ruleset(data, host, sorted(literal), [])
        except encoders.EncodeError as e:
            out.append(f"host {host}: the nft script cannot carry a value: {e}")
            continue
        want = set(firewall.protected_ports(data, host))
        got = {int(p) for m in re.finditer(r"tcp dport \{ ([0-9, ]+) \}", text) for p in m.group(1).split(",")}
        if want and got != want:
            out.append(f"host {host}: the nft script protects ports {sorted(got)}, not the plan's {sorted(want)}")
    return out


def _non_finite(value: Any, path: str = "") -> str | None:
    """The path of the first number JSON cannot carry (NaN, Infinity) in `value`."""
    if isinstance(value, float) and not math.isfinite(value):
        return path or "(top)"
    items = value.items() if isinstance(value, dict) else enumerate(value) if isinstance(value, list) else ()
    return next((p for k, v in items if (p := _non_finite(v, f"{path}.{k}" if path else str(k)))), None)


def json_problems(plan: Plan) -> list[str]:
    """plan.json, which the roles read (from_json) and copy to the hosts, as strict JSON read back."""
    data = plan.to_dict()
    try:
        back = json.loads(encoders.json_text(data))
    except encoders.EncodeError:
        return [f"the plan's {_non_finite(data)} is not a JSON number (NaN or infinity): set a finite value"]
    return [] if back == data else ["the plan does not read back from JSON unchanged (a pdstack bug)"]


def artifact_problems(plan: Plan, dep: Deployment) -> list[str]:
    """Every artifact read back (make_plan runs this after readback.plan_problems)."""
    fd = plan.router.frontdoor
    out = frontdoor_check.frontdoor_problems(fd, plan.router.address, dep.environment == "production")
    out += unit_problems(plan, dep) + nft_problems(plan) + json_problems(plan)
    return out
