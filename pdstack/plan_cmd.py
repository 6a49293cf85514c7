"""`pdstack plan -i INVENTORY [--host HOST] [--json] [--facts FILE|DIR] [--out FILE]`."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from pdstack import inventory, planner
from pdstack.errors import InventoryError


def add_inventory_args(parser: argparse.ArgumentParser) -> None:
    """-i and --vars: where the deployment's variables come from (shared by plan and preflight)."""
    parser.add_argument("-i", "--inventory", required=True, help="inventory directory, e.g. inventory/production")
    parser.add_argument("--vars", help="use these resolved variables (JSON the preflight role writes, extra vars "
                        "included) instead of reading the inventory's files")


def register(parser: argparse.ArgumentParser) -> None:
    add_inventory_args(parser)
    parser.add_argument("--host", help="only this host's servers")
    parser.add_argument("--json", action="store_true", help="print JSON (for machines) instead of text")
    parser.add_argument("--facts", help="host facts: a recorded JSON file (one host's, applied to every host, or "
                        "{host: facts}) or a directory of <host>.json; the playbook passes what it gathered. "
                        "Default: <inventory>/facts if it exists")
    parser.add_argument("--out", help="also write the JSON plan to this file")
    parser.add_argument("--require-image", action="store_true",
                        help="fail when the image cannot be resolved (pdstack_image.manifest missing): the playbook "
                        "deploys, so it needs one; planning alone does not")


def facts_path(args: argparse.Namespace) -> str | None:
    if args.facts:
        return args.facts
    default = Path(args.inventory) / "facts"
    return str(default) if default.is_dir() else None


def run(args: argparse.Namespace) -> int:
    dep = inventory.load(args.inventory, resolved=args.vars)
    facts = planner.load_facts(facts_path(args), list(dep.hosts))
    plan = planner.make_plan(dep, facts, require_image=args.require_image)
    if args.host:
        if args.host not in dep.hosts:
            raise InventoryError([f"--host {args.host}: not in {args.inventory} (hosts: {', '.join(dep.hosts)})"])
        plan = plan.for_host(args.host)
    if args.out:
        Path(args.out).parent.mkdir(parents=True, exist_ok=True)
        Path(args.out).write_text(plan.to_json() + "\n")
    print(plan.to_json() if args.json else planner.render_text(plan))
    for w in plan.warnings:
        print(f"warning: {w}", file=sys.stderr)
    return 0
