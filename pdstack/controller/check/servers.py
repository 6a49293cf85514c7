"""The deployment's and each server's own settings, and what prefill and decode must agree on."""

from __future__ import annotations

import math
from collections import defaultdict
from typing import Any

from pdstack.controller.check import budgets
from pdstack.controller.check.extra_args import dests, extra_arg_problems, owned_env
from pdstack.controller.load import flags, rules
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.load.tables import (
    DSV4_MAX_CONTEXT,
    GPU_SET_FLAGS,
    KV_ENV_PER_HOST,
    KV_ENV_PREFIXES,
    KV_TRANSFER_FLAGS,
    OWNED_FLAGS,
    VALUE_LIMITS,
    server_where,
)

# Bounds on a server's env. execve(2) fails with E2BIG when argv + envp exceed ARG_MAX (`getconf ARG_MAX`: 2097152
# on Linux with the default 8 MiB stack, a quarter of RLIMIT_STACK) or one string exceeds MAX_ARG_STRLEN (32 pages,
# 131072 bytes: include/uapi/linux/binfmts.h). The image's own variables and the launch argv share that space, so
# pdstack allows a small, documented part of it: 1000 variables, 64 KiB in all (an env of settings, not data),
# which also keeps every one string well under MAX_ARG_STRLEN.
ENV_MAX_VARS = 1000
SERVED_NAME_MAX = 256
ENV_MAX_BYTES = 64 * 1024


def _image_pull_problems(img: dict[str, Any], p: list[str]) -> None:
    """pdstack_image.registry/digest: what can be checked without the manifest (the planner checks it)."""
    reg, dig = img["registry"], img["digest"]
    repo = "pdstack/sim" if img["engine"] == "sim" else "pdstack/sglang"  # what `invoke build --push` pushes
    if dig is not None:
        if reg is None:
            p.append(f"pdstack_image.digest: set only with pdstack_image.registry (the image phase pulls "
                     f"REGISTRY/{repo}@DIGEST); set registry, or remove digest")
        if msg := rules.digest_problem(dig):
            p.append(f"pdstack_image.digest: {msg}; use the digest `invoke build --push` recorded "
                     "(pushed.digest_ref in the manifest), or remove digest to take it from the manifest")
    if reg is None:
        return
    if msg := rules.registry_problem(reg):
        p.append(f"pdstack_image.registry: {msg}")
        return
    if img["tarball"] is not None:
        p.append("pdstack_image.tarball: set together with pdstack_image.registry; the image phase either pulls "
                 "from the registry or copies a tarball: remove one of them")
    ref = img["ref"]
    if ref is None or rules.image_ref_problem(ref):
        return
    if dig is not None:
        p.append("pdstack_image.digest: set together with ref; the digest is part of ref "
                 f"({reg}/{repo}@sha256:...): remove digest")
    parts = rules.split_digest_ref(ref)
    if parts is None:
        p.append(f"pdstack_image.ref: {ref!r} is not a digest reference; with pdstack_image.registry the hosts pull "
                 f"by digest: set ref to {reg}/{repo}@sha256:<digest> (pushed.digest_ref in the manifest "
                 "`invoke build --push` wrote, with the registry as the hosts reach it), or set manifest instead "
                 "of ref")
    elif parts[0] != reg:
        p.append(f"pdstack_image.ref: {ref!r} names registry {parts[0]}, but pdstack_image.registry is {reg}; "
                 f"make them agree ({reg}/{parts[1]}@{parts[2]})")


def deployment_problems(dep: Deployment, servers, p: list[str]) -> None:
    img = dep.image
    if (img["ref"] is None) == (img["manifest"] is None):
        p.append("pdstack_image: set exactly one of ref (an image reference) or manifest (build/manifest-<flavor>.json "
                 "from `invoke build`)")
    if img["ref"] is not None and (msg := rules.image_ref_problem(img["ref"])):
        p.append(f"pdstack_image.ref: {msg}")
    _image_pull_problems(img, p)
    name = dep.model["served_name"]
    if msg := rules.non_ascii(name):
        p.append(f"pdstack_model.served_name: {name[:80]!r}: {msg}: clients asking for the name as they type it "
                 f"would get 404 model_not_found; write it in ASCII (e.g. {rules.ascii_skeleton(name)[:80]!r})")
    elif len(name) > SERVED_NAME_MAX:
        p.append(f"pdstack_model.served_name: {len(name)} characters, over {SERVED_NAME_MAX}: it is one word of the "
                 "servers' argv and of every client's request; use a short name like deepseek-v4-flash")
    elif msg := rules.unit_value_problem(dep.model["served_name"]):
        p.append(f"pdstack_model.served_name: {msg}; use a name like deepseek-v4-flash")
    elif dep.model["served_name"].startswith("-"):
        p.append(f"pdstack_model.served_name: {dep.model['served_name']!r} starts with '-', so SGLang's parser "
                 "reads it as a flag (--served-model-name takes the next word) and the router's clients would ask "
                 "for a name no server has; use a name that starts with a letter or digit, like deepseek-v4-flash")
    if dep.model["family"] == "deepseek_v4" and dep.model["context_length"] > DSV4_MAX_CONTEXT:
        p.append(f"pdstack_model.context_length: {dep.model['context_length']} is beyond DeepSeek V4's "
                 f"{DSV4_MAX_CONTEXT}-token context; SGLang refuses to start with a context longer than the model's "
                 f"(SGLANG_ALLOW_OVERWRITE_LONGER_CONTEXT_LEN aside): set context_length <= {DSV4_MAX_CONTEXT}")
    roles = {s["role"] for _, _, s in servers}
    for role in ("prefill", "decode"):
        if role not in roles:
            p.append(f"pdstack_servers: no {role} server in any host_vars; a PD deployment needs at least one "
                     f"(add a server with role: {role})")
    _admission_capacity_problems(dep, servers, p)
    seen: dict[str, str] = {}
    for host, i, s in servers:
        key = s["name"].lower()  # unit and container names are case-sensitive, but file systems may not be
        if key in seen:
            p.append(f"{server_where(host, i, s)}.name: '{s['name']}' is also used on {seen[key]}; server names "
                     "must be unique (they name units, containers and files)")
        seen.setdefault(key, host)
    for name in dep.hosts:
        if not rules.HOST_NAME_RE.fullmatch(name):
            p.append(f"host {name!r} (hosts.yml): not a usable inventory host name; it names files and metric labels: "
                     "letters, digits, '.', '_' and '-', starting with a letter or digit")
    for name, h in dep.hosts.items():
        if h.numa_reserve_gb < 0:
            p.append(f"host_vars/{name} pdstack_numa_reserve_gb: {h.numa_reserve_gb:g} is negative; it is memory "
                     "kept back per NUMA node (>= 0, e.g. 32)")


def _admission_capacity_problems(dep: Deployment, servers, p: list[str]) -> None:
    """The front door lets N requests run, and the watchdog's probe is one more: decode must be able to run N + 1 at
    once, or the front door admits requests decode can only queue. Checked when every decode server caps itself
    (extra_args.max-running-requests); otherwise SGLang sizes the cap from GPU memory at start, which no inventory
    says."""
    n = dep.router["admission"]["max_concurrent_requests"]
    caps = [(host, i, s, budgets.sink_value(s["extra_args"].get("max-running-requests"), int))
            for host, i, s in servers if s["role"] == "decode"]
    if n <= 0 or not caps or not all(isinstance(c, int) and not isinstance(c, bool) and c > 0 for *_, c in caps):
        return
    total = sum(c for *_, c in caps)
    if total < n + 1:
        each = ", ".join(f"{server_where(h, i, s)} {c}" for h, i, s, c in caps)
        p.append(f"pdstack_router.admission.max_concurrent_requests: {n} (+ 1 for the watchdog's probe) is more than "
                 f"the decode servers can run at once: extra_args.max-running-requests {each} = {total}; lower "
                 f"max_concurrent_requests to {max(total - 1, 1)} (group_vars/all/router.yml) or raise the decode "
                 f"servers' max-running-requests to {n + 1} in all")


def server_problems(dep: Deployment, host: str, i: int, s: dict, p: list[str]) -> None:
    where = server_where(host, i, s)
    family = dep.model["family"]
    tp = s["tp_size"]
    if tp != len(s["gpus"]):
        p.append(f"{where}.tp_size: {tp} does not match its {len(s['gpus'])} GPUs {s['gpus']}; "
                 f"set tp_size: {len(s['gpus'])} or change gpus")
    if tp > 0 and tp & (tp - 1):
        lower = 1 << (tp.bit_length() - 1)
        heads = " (DeepSeek V4: 64 heads)" if family == "deepseek_v4" else ""
        p.append(f"{where}.tp_size: {tp} is not a power of two; tensor parallelism splits the attention heads "
                 f"evenly{heads}, so use 1, 2, 4 or 8, e.g. tp_size: {lower} with {lower} GPUs")
    if s["numa_node"] is not None and s["numa_node"] < 0:
        p.append(f"{where}.numa_node: {s['numa_node']} is not a NUMA node (ids are >= 0)")
    # numa_node (unless numa_override) is compared with the GPUs' node from the facts: topology_problems
    if s["ports"]["metrics"] not in (None, s["ports"]["http"]):
        p.append(f"{where}.ports.metrics: {s['ports']['metrics']} differs from ports.http "
                 f"{s['ports']['http']}; SGLang 0.5.23 serves /metrics on its HTTP port: remove ports.metrics")
    hc = s["hicache"]
    if hc["enabled"]:
        for k in ("host_budget_gb", "device_kv_pool_gb"):
            if hc[k] is None:
                p.append(f"{where}.hicache.{k}: required when hicache.enabled is true (the planner computes "
                         "--hicache-ratio = host_budget_gb / device_kv_pool_gb)")
        for k in ("host_budget_gb", "device_kv_pool_gb"):
            if hc[k] is not None and budgets.finite_number(hc[k]) is None:
                p.append(f"{where}.hicache.{k}: {hc[k]!r} is not a finite number of GiB; write a plain number, "
                         "e.g. 150")
        if budgets.finite_number(hc["host_budget_gb"]) and budgets.finite_number(hc["device_kv_pool_gb"]):
            budget, pool = float(hc["host_budget_gb"]), float(hc["device_kv_pool_gb"])
            ratio = math.floor(budget / pool * 1000) / 1000
            arith = (f"--hicache-ratio = host_budget_gb / device_kv_pool_gb = {budget:g} / {pool:g} = "
                     f"{budget / pool:.4f} -> {ratio:.3f} (rounded down)")
            if ratio <= 0:
                p.append(f"{where}.hicache: {arith}: a host pool of 0 GiB; raise host_budget_gb (at least "
                         f"{pool:g} for a host pool as large as the device pool) or set hicache.enabled: false")
            elif ratio < 1:
                dep.warnings.append(
                    f"{where}.hicache: {arith} < 1: the host pool ({ratio * pool:.1f} GiB) is smaller than the device "
                    f"pool ({pool:g} GiB), so HiCache holds less than the GPUs already do (SGLang 0.5.23 warns "
                    f"'L2 cache effectiveness is reduced'); raise host_budget_gb to >= {pool:g} GiB if the NUMA node "
                    "has room, or disable HiCache")
    tr = s["transfer"]
    if tr["ib_device"] is not None:
        names = tr["ib_device"].split(",")
        bad = [n for n in names if not rules.IB_NAME_RE.fullmatch(n)]
        if bad:
            p.append(f"{where}.transfer.ib_device: {tr['ib_device']!r} is not an InfiniBand device name or a "
                     "comma-separated list of them (as /sys/class/infiniband names them, e.g. mlx5_0 or "
                     "mlx5_0,mlx5_1); `ibv_devices` on the host lists them")
        if tr["backend"] in ("mooncake_tcp", "fake"):
            dep.warnings.append(f"{where}.transfer.ib_device: backend {tr['backend']} does not use InfiniBand; "
                                "ib_device is ignored")
    parser = flags.sglang_parser()
    owned = dests(parser, OWNED_FLAGS)
    refused = {d: f"--{flag} changes which or how many GPUs the server uses (pdstack runs one server on exactly "
                  "the GPUs in gpus, tp_size of them, on one host)" for d, (flag, _) in
               dests(parser, GPU_SET_FLAGS).items()}
    extra = s["extra_args"]
    problems_before = len(p)
    budgets.host_memory_flag_problems(where, extra, family, p)
    by_dest: dict[str, list[str]] = defaultdict(list)
    for key in extra:
        a = flags.action_for(parser, f"--{key}")
        if a is not None and extra[key] is not None:
            by_dest[a.dest].append(key)
    for dest, keys in by_dest.items():
        if len(keys) > 1:
            p.append(f"{where}.extra_args: {', '.join(keys)} all set {dest} (they are one SGLang setting, the last "
                     f"one would win); keep one of them")
    for key, value in extra.items():
        a = flags.action_for(parser, f"--{key}")
        v = budgets.sink_value(value, a.type if a is not None else None)  # the number SGLang will get
        if key in VALUE_LIMITS and isinstance(v, int | float) and not isinstance(v, bool):
            ok, rule = VALUE_LIMITS[key]
            if budgets.finite_number(v) is None:
                p.append(f"{where}.extra_args.{key}: {value!r} is not a finite number ({rule}); write a plain "
                         "number")
            elif not ok(v):
                p.append(f"{where}.extra_args.{key}: {value!r} is out of range: {rule} (SGLang 0.5.23 refuses it at "
                         "startup, after loading for minutes)")
        if key == "hicache-size" and family == "deepseek_v4":
            p.append(f"{where}.extra_args.hicache-size: DeepSeek V4 rejects --hicache-size (ValueError when the "
                     "memory pool is built, minutes into startup); remove it and set hicache.host_budget_gb, "
                     "from which the planner derives --hicache-ratio")
            continue
        if key in budgets.NUMA_FLAGS or key in budgets.UNCOUNTED_HOST_MEMORY or key == "hicache-size":
            continue  # refused above (budgets.host_memory_flag_problems)
        p.extend(extra_arg_problems(parser, where, key, value, owned, refused, "SGLang 0.5.23",
                                     dep.model["path"]))
    if "max-queued-requests" in extra and dep.router["admission"]["max_concurrent_requests"] < 0:
        p.append(f"{where}.extra_args.max-queued-requests: SGLang 0.5.23 ignores it on PD servers (enforced only "
                 "with --disaggregation-mode null), so this server has no admission control; set "
                 "pdstack_router.admission.max_concurrent_requests (and queue_size) and remove it here")
    elif "max-queued-requests" in extra:
        dep.warnings.append(f"{where}.extra_args.max-queued-requests does nothing on a PD server in SGLang "
                            "0.5.23; admission control is pdstack_router.admission")
    if len(p) == problems_before:
        err = flags.check_sglang(["--model-path", "/x", *flags.render_extra(extra, parser)])
        if err:
            p.append(f"{where}.extra_args: SGLang 0.5.23 rejects it: {err}; spell the flag exactly as "
                     "`python -m sglang.launch_server --help` does (no abbreviations) and give it a value it takes")
    _env_problems(where, s["env"], p)


def _env_problems(where: str, env: dict[str, Any], p: list[str]) -> None:
    """A server's env: names the env file carries, not the planner's or the image's, within the kernel's limits."""
    env_owned = owned_env()
    size = sum(len(f"{k}={v}".encode()) + 1 for k, v in env.items())  # KEY=VALUE\0 in bytes, as execve counts
    if len(env) > ENV_MAX_VARS or size > ENV_MAX_BYTES:
        p.append(f"{where}.env: {len(env)} variables, {size} bytes; at most {ENV_MAX_VARS} variables and "
                 f"{ENV_MAX_BYTES // 1024} KiB in all (the process's environment and argv share the kernel's "
                 "ARG_MAX, 2 MiB with the usual 8 MiB stack, with the image's own variables and the launch argv): "
                 "keep env to the settings you mean, put bulk configuration in a file under pdstack_model.path")
        return
    for k, v in env.items():
        path = f"{where}.env.{k}"
        if not rules.ENV_NAME_RE.fullmatch(k):
            p.append(f"{path}: {k!r} is not an environment variable name (letters, digits and '_', not starting "
                     "with a digit)")
        elif k in budgets.NUMA_ENV:
            p.append(f"{path}: {k} switches SGLang's own NUMA/CPU binding, but the plan binds the server itself "
                     f"(docker --cpuset-cpus/--cpuset-mems); remove env.{k} (numa_node with numa_override: true "
                     "pins another node)")
        elif k in env_owned and env_owned[k].startswith("the image"):
            p.append(f"{path}: {k} comes from {env_owned[k]}; an override replaces the image's value, not adds "
                     f"to it: remove env.{k}")
        elif k in env_owned:
            p.append(f"{path}: the planner sets {k} itself from {env_owned[k]}; set that instead and remove env.{k}")
        elif msg := rules.dangerous_env(k):
            p.append(f"{path}: {msg}; remove env.{k}")
        elif isinstance(v, bool):
            p.append(f"{path}: {v!r} is a YAML boolean, which would be written as {str(v)!r}; quote the value you "
                     f"mean, e.g. {k}: \"1\" or \"true\"")
        elif v is None or isinstance(v, dict | list):
            p.append(f"{path}: {type(v).__name__ if v is not None else 'null'} {v!r}; an environment variable is "
                     "one string (quote it in YAML)")
        elif msg := rules.env_value_problem(str(v)):
            p.append(f"{path}: {msg}; change the value")


def pd_agreement_problems(dep: Deployment, servers, p: list[str]) -> None:
    """Prefill and decode exchange KV pages: everything the page layout and the transfer depend on must match."""
    pd = [(host, i, s) for host, i, s in servers if s["role"] in ("prefill", "decode")]
    if len(pd) < 2:
        return
    parser = flags.sglang_parser()
    kv = dests(parser, KV_TRANSFER_FLAGS)

    def differ(label: str, fix: str, value_of) -> None:
        seen: dict[str, list[str]] = defaultdict(list)
        for host, _i, s in pd:
            seen[value_of(s)].append(f"{s['name']} ({s['role']}, {host})")
        if len(seen) > 1:
            parts = "; ".join(f"{', '.join(who)}: {v}" for v, who in seen.items())
            p.append(f"pdstack_servers: {label} differs between servers that exchange KV pages ({parts}); {fix}")

    differ("transfer.backend", "set the same transfer.backend on every prefill and decode server",
           lambda s: s["transfer"]["backend"])
    for dest, (flag, _) in kv.items():
        def value(s, dest=dest):
            for key, v in s["extra_args"].items():
                a = flags.action_for(parser, f"--{key}")
                if a is not None and a.dest == dest and v is not None and v is not False:
                    try:
                        return " ".join(flags.render_value(v, a)) if v is not True else "on"
                    except flags.Unrenderable:  # refused per server already
                        return repr(v)
            return "default"
        differ(f"--{flag} (extra_args)", f"set extra_args.{flag} to the same value on every prefill and decode "
               "server (or on none)", value)
    owned = owned_env()  # refused per server already
    names = sorted({k for _h, _i, s in pd for k in s["env"] if str(k).startswith(KV_ENV_PREFIXES) and k not in owned
                    and not any(w in str(k) for w in KV_ENV_PER_HOST)})
    for k in names:
        differ(f"env.{k}", f"set env.{k} to the same value on every prefill and decode server (or on none)",
               lambda s, k=k: repr(s["env"].get(k, "unset")) if k in s["env"] else "unset")
