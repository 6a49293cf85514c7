"""Read every rendered artifact back before any host changes, and compare it with what the plan meant.

Each server's argv goes through SGLang 0.5.23's own parser and the router's through sglang-router 0.3.2's; the
settings that come out must be exactly the planner's intent: every setting the planner renders has the planner's
value (an extra_args entry or a list item cannot move it: argparse's last-wins is not allowed to beat ownership),
and every other setting that differs from its default comes from the one extra_args entry that names it.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from pdstack.controller.load import flags
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.plan import planner
from pdstack.controller.plan.planner import Plan


def _namespace(parser, argv: list[str]) -> dict[str, Any] | str:
    try:
        return vars(parser.parse_args(argv))
    except flags.Rejected as e:
        return str(e)


def argv_problems(parser, what: str, owned_argv: list[str], extra: dict[str, Any], full_argv: list[str],
                  base: list[str]) -> list[str]:
    """Problems of one rendered argv: `owned_argv` is what the planner itself renders (extra_args left out),
    `extra` the inventory's extra_args (key -> value), `full_argv` the whole flag list as planned. `base`: flags the
    parser needs to accept a lone extra flag (e.g. --model-path /x)."""
    full = _namespace(parser, full_argv)
    if isinstance(full, str):
        return [f"{what}: the rendered argv is refused: {full}"]
    owned = _namespace(parser, owned_argv)
    if isinstance(owned, str):  # pragma: no cover - the planner rendered something its own parser refuses: a bug
        return [f"{what}: the planner's own flags are refused ({owned}): a pdstack bug"]
    default = _namespace(parser, base)
    assert isinstance(default, dict)
    owned_dests = flags.dests_set(parser, owned_argv)
    explained: dict[str, str] = {}
    out = []
    for key, value in extra.items():
        words = flags.render_extra({key: value}, parser)
        alone = _namespace(parser, [*base, *words])
        if isinstance(alone, str):
            out.append(f"{what}: extra_args.{key}: {alone}")
            continue
        named = flags.dests_set(parser, words)
        for dest in named:
            if dest in owned_dests:
                out.append(f"{what}: extra_args.{key}: the planner renders {owned_dests[dest]} itself; set the "
                           f"pdstack inventory variable it comes from and remove extra_args.{key}")
        for dest in {d for d, v in alone.items() if v != default.get(d)} - set(named):
            out.append(f"{what}: extra_args.{key}: its value also sets {dest} (= {alone[dest]!r}): a list item or "
                       "value that reads as a flag; write each flag as its own extra_args key")
        for dest in named:
            explained[dest] = key
    for dest, v in full.items():
        if dest in owned_dests and v != owned[dest] and dest not in explained:
            out.append(f"{what}: {owned_dests[dest]} reads back as {v!r}, not the planner's {owned[dest]!r}; "
                       "something in extra_args overrides it: remove it")
        elif dest not in owned_dests and dest not in explained and v != default.get(dest):
            out.append(f"{what}: the rendered argv sets {dest} = {v!r}, which neither the planner nor an extra_args "
                       "key names (a value that reads as a flag smuggled it in)")
    return out


def server_settings_problems(plan: Plan) -> list[str]:
    """Each server's argv, read by SGLang's parser, listens where the plan says and is the role it says."""
    out = []
    for s in plan.servers:
        try:
            ns = vars(flags.sglang_parser().parse_args(s.flags))
        except flags.Rejected as e:
            out.append(f"server {s.name}: SGLang's parser refuses the rendered argv: {e}")
            continue
        want = {"host": "0.0.0.0", "port": s.ports["http"], "disaggregation_mode": s.role}
        if s.role == "prefill":
            want["disaggregation_bootstrap_port"] = s.ports["bootstrap"]
        for dest, v in want.items():
            if ns.get(dest) != v:
                out.append(f"server {s.name}: the argv reads back {dest} = {ns.get(dest)!r}, not the plan's {v!r}: "
                           "a value in extra_args reads as a flag; write each flag as its own extra_args key")
    return out


def router_settings_problems(plan: Plan) -> list[str]:
    """The router's argv, read by sglang-router's parser, names exactly the plan's workers, host and ports."""
    r = plan.router
    try:
        ns = vars(flags.router_parser().parse_args(r.flags))
    except flags.Rejected as e:
        return [f"pdstack_router: the router's parser refuses the rendered argv: {e}"]
    got_p = [tuple(map(str, x)) for x in ns.get("prefill") or []]
    got_d = [tuple(map(str, x)) for x in ns.get("decode") or []]
    want_p = [(w["url"], str(w["bootstrap_port"])) for w in r.prefill]
    want_d = [(w["url"],) for w in r.decode]
    out = []
    for what, got, want in (("prefill", got_p, want_p), ("decode", got_d, want_d)):
        if sorted(got) != sorted(want):
            extra = sorted(set(got) - set(want))
            out.append(f"pdstack_router: the router's argv reads back {what} workers {got}, not the plan's {want}"
                       + (f" ({extra} outside the inventory: a value in pdstack_router.extra_args reads as a flag)"
                          if extra else ""))
    for dest, v in (("host", "127.0.0.1"), ("port", r.internal_port), ("prometheus_port", r.prometheus_port),
                    ("worker_urls", [])):
        if ns.get(dest) != v:
            out.append(f"pdstack_router: the router's argv reads back {dest} = {ns.get(dest)!r}, not the plan's "
                       f"{v!r}: a value in pdstack_router.extra_args reads as a flag")
    return out


def plan_problems(plan: Plan, dep: Deployment) -> list[str]:
    """Every rendered argv of the plan read back through its upstream parser."""
    out = []
    sp = flags.sglang_parser()
    specs = {s["name"]: s for _h, s in dep.servers()}
    for s in plan.servers:
        spec = specs[s.name]
        owned = planner.server_flags(dep, {**spec, "extra_args": {}}, s.hicache)
        out += argv_problems(sp, f"server {s.name} (SGLang 0.5.23 reads its argv back)", owned, spec["extra_args"],
                             s.flags, ["--model-path", "/x"])
    rp = flags.router_parser()
    bare = dataclasses.replace(dep, router={**dep.router, "extra_args": {}})
    owned = planner.router_flags(bare, plan.servers)[0]
    out += argv_problems(rp, "pdstack_router (sglang-router 0.3.2 reads its argv back)", owned,
                         dep.router["extra_args"], plan.router.flags,
                         ["--pd-disaggregation", "--prefill", "http://x:1", "--decode", "http://y:1"])
    # and what matters most, compared directly: no worker, host or port but the plan's
    return out + argv_size_problems(plan) + server_settings_problems(plan) + router_settings_problems(plan)


# Linux: execve refuses one argument or environment string over MAX_ARG_STRLEN (32 pages, 131072 bytes with the NUL;
# include/uapi/linux/binfmts.h), and all of them together beyond ARG_MAX (a quarter of the stack limit: 2 MiB with
# the usual 8 MiB). The whole argv gets half of that, the other half is the environment's (check/servers.py's bound).
MAX_ARG_STRLEN = 131072
MAX_ARGV_BYTES = 1 << 20


def argv_size_problems(plan: Plan) -> list[str]:
    """Every argv the plan renders fits what execve takes: each word, and all of them together."""
    out = []
    for what, argv in [(f"server {s.name}", s.flags) for s in plan.servers] + [("pdstack_router", plan.router.flags)]:
        for i, word in enumerate(argv):
            n = len(str(word).encode()) + 1
            if n > MAX_ARG_STRLEN:
                flag = next((w for w in reversed(argv[:i]) if str(w).startswith("--")), "the argv")
                out.append(f"{what}: the word after {flag} is {n - 1} bytes, over Linux's {MAX_ARG_STRLEN - 1} per "
                           "argument (MAX_ARG_STRLEN): the server could not start; shorten the inventory value "
                           "behind it")
        total = sum(len(str(w).encode()) + 1 for w in argv)
        if total > MAX_ARGV_BYTES:
            out.append(f"{what}: its argv is {total} bytes, over the {MAX_ARGV_BYTES} pdstack allows (half of "
                       "Linux's ARG_MAX, the rest is the environment's); shorten extra_args")
    return out
