"""`pdstack preflight -i INVENTORY [--facts FILE|DIR]`: validate without printing the plan.

Without facts only the static checks run (typos, TP vs GPUs, ports, flags, admission); with facts the topology
checks run too (GPU count, NUMA nodes, HiCache budget per node). Exit 0 when clean, 2 with every problem listed.
"""

from __future__ import annotations

import argparse

from pdstack import inventory, planner, preflight
from pdstack.errors import InventoryError
from pdstack.plan_cmd import add_inventory_args, facts_path


def register(parser: argparse.ArgumentParser) -> None:
    add_inventory_args(parser)
    parser.add_argument("--facts", help="host facts (see `pdstack plan --help`); without them only static checks run")
    parser.add_argument("--static", action="store_true", help="only the static checks, even if facts exist")


def run(args: argparse.Namespace) -> int:
    dep = inventory.load(args.inventory, resolved=args.vars)
    path = None if args.static else facts_path(args)
    if path is None:
        problems = preflight.static_problems(dep)
        if problems:
            raise InventoryError(problems)
        print(f"preflight: {args.inventory}: static checks passed (no host facts given: topology not checked)")
    else:
        planner.make_plan(dep, planner.load_facts(path, list(dep.hosts)))
        print(f"preflight: {args.inventory}: all checks passed against the facts in {path}")
    for w in dep.warnings:
        print(f"warning: {w}")
    return 0
