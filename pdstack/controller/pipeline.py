"""The controller's pipeline, one way down: load -> check -> plan -> render (read back) -> gates.

    load/    the inventory read safely, typed, defaults filled (and recorded host facts)
    check/   every check that can refuse an inventory before any host is touched (static, then against the facts)
    plan/    the planner: a checked deployment -> the exact per-server plan (pure: it checks nothing itself)
    render/  the artifacts made from the plan (argv, haproxy.cfg, nftables, monitoring) and their read-back
    gates/   after the deploy: recall, probe, bench, tools and churn through the router

A stage imports only from the stages above it (tests/test_layout.py holds it). `make_plan` runs the first four;
the `pdstack plan` and `pdstack preflight` subcommands are at the end.
"""

from __future__ import annotations

import argparse
import contextlib
import sys
from pathlib import Path

from pdstack.controller.check import preflight
from pdstack.controller.load import flags, inventory
from pdstack.controller.load.facts import load_facts
from pdstack.controller.load.inventory import Deployment
from pdstack.controller.plan import planner
from pdstack.controller.plan import text as plan_text
from pdstack.controller.plan.planner import Plan
from pdstack.controller.render import artifacts, readback
from pdstack.errors import InventoryError

__all__ = ["make_plan"]


def make_plan(dep: Deployment, facts: dict[str, dict], require_image: bool = False, deploy: bool | None = None
              ) -> Plan:
    """Check (static + topology), plan, read every rendered artifact back. Raises InventoryError listing every problem.
    `deploy` (default: `require_image`, as the preflight role plans): the plan is about to be deployed, so
    placeholder addresses are errors, not warnings."""
    with _unrenderable(dep):
        problems = preflight.static_problems(dep, deploy=require_image if deploy is None else deploy)
        problems += preflight.topology_problems(dep, facts)
        if problems:
            raise InventoryError(_located(problems, dep))
        plan = planner.build_plan(dep, facts, require_image=require_image)
    # every artifact the roles render, rendered in memory and read back: argv, units, env files, haproxy.cfg, nft
    problems = readback.plan_problems(plan, dep) + artifacts.artifact_problems(plan, dep)
    if problems:
        raise InventoryError(_located(problems, dep))
    return plan


def _located(problems: list[str], dep: Deployment) -> list[str]:
    """Each problem with the file and line its variable is set at, where the inventory's files say (load/files.py)."""
    return [inventory.located(p, dep.locations) for p in problems]


@contextlib.contextmanager
def _unrenderable(dep: Deployment):
    """An extra_args value the argv encoder refuses (load/flags.py) while a check renders it: an InventoryError
    naming where the key is set, not a traceback."""
    try:
        yield
    except flags.Unrenderable as e:
        where = [f"host_vars/{h.name} server {s['name']}" for h, s in dep.servers() if e.key in s["extra_args"]]
        where += ["pdstack_router"] * (e.key in (dep.router.get("extra_args") or {}))
        raise InventoryError([f"{' and '.join(where) or 'pdstack_servers / pdstack_router'}: {e}"]) from None


# ---------------------------------------------------------------------------------------- `pdstack plan`


def register_plan(parser: argparse.ArgumentParser) -> None:
    inventory.add_inventory_args(parser)
    parser.add_argument("--host", help="only this host's servers")
    parser.add_argument("--json", action="store_true", help="print JSON (for machines) instead of text")
    parser.add_argument("--facts", help="host facts: a recorded JSON file (one host's, applied to every host, or "
                        "{host: facts}) or a directory of <host>.json; the playbook passes what it gathered "
                        "(build/state/<inventory name>/facts after a deploy)")
    parser.add_argument("--out", help="also write the JSON plan to this file")
    parser.add_argument("--require-image", action="store_true",
                        help="fail when the image cannot be resolved (pdstack_image.manifest missing): the playbook "
                        "deploys, so it needs one; planning alone does not")


def run_plan(args: argparse.Namespace) -> int:
    dep = inventory.load(args.inventory, resolved=args.vars, extra_vars=tuple(args.extra_vars))
    facts = load_facts(inventory.facts_path(args), list(dep.hosts))
    plan = make_plan(dep, facts, require_image=args.require_image).validate()
    if args.host:
        if args.host not in dep.hosts:
            raise InventoryError([f"--host {args.host}: not in {args.inventory} (hosts: {', '.join(dep.hosts)})"])
        plan = plan.for_host(args.host)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(plan.to_json() + "\n")
    print(plan.to_json() if args.json else plan_text.render_text(plan))
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0


# ------------------------------------------------------------------------------------ `pdstack preflight`


def register_preflight(parser: argparse.ArgumentParser) -> None:
    inventory.add_inventory_args(parser)
    parser.add_argument("--facts", help="host facts (see `pdstack plan --help`); without them only static checks run")
    parser.add_argument("--static", action="store_true", help="only the static checks, even if facts exist")
    parser.add_argument("--files", action="store_true",
                        help="only read the inventory's files strictly (duplicate keys, templates, YAML 1.1 traps, a "
                        "variable in two files) and check nothing else: the preflight role runs this before Ansible "
                        "templates any variable, so no lookup in a pdstack value ever runs")


def run_preflight(args: argparse.Namespace) -> int:
    if args.files:
        inventory.check_files(args.inventory)
        print(f"preflight: {args.inventory}: every file read strictly (no templates, duplicate keys or YAML 1.1 traps)")
        return 0
    dep = inventory.load(args.inventory, resolved=args.vars, extra_vars=tuple(args.extra_vars))
    path = None if args.static else inventory.facts_path(args)
    if path is None:
        with _unrenderable(dep):
            problems = preflight.static_problems(dep, deploy=True)
        if problems:
            raise InventoryError(_located(problems, dep))
        print(f"preflight: {args.inventory}: static checks passed (no host facts given: topology not checked)")
    else:
        make_plan(dep, load_facts(path, list(dep.hosts)), deploy=True)
        print(f"preflight: {args.inventory}: all checks passed against the facts in {path}")
    for w in dep.warnings:
        print(f"warning: {w}")
    return 0
