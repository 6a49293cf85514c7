"""Hosts that silently do not match: a group naming a host nobody defined (a typo), two names one host, no address.

Ansible accepts all of them: a name under `router:` that is a typo of gpu01 becomes a new, unreachable host; hosts
gpu01 and GPU01 are two hosts to Ansible but one to DNS and to a case-insensitive file system.
"""

from __future__ import annotations

import difflib
from typing import Any

from pdstack.controller.load import rules

SKIP_GROUPS = ("all", "ungrouped")
# the groups pdstack reads (load/inventory.py); a look-alike of one is pointed at it
KNOWN_GROUPS = ["router", "monitoring", "gpu"]


def host_problems(hostvars: dict[str, dict[str, Any]], groups: dict[str, Any], environment: Any) -> list[str]:
    problems: list[str] = []
    names = list(hostvars)
    by_case: dict[str, list[str]] = {}
    for n in names:
        by_case.setdefault(n.lower(), []).append(n)
    for same in by_case.values():
        if len(same) > 1:
            problems.append(f"hosts {' and '.join(same)} (hosts.yml): names that differ only by case are one host to "
                            "DNS and to the controller's files; spell the host one way everywhere in hosts.yml")
    for kind, name in [("host", n) for n in names] + [("group", g) for g in groups if isinstance(g, str)]:
        if msg := rules.non_ascii(name):
            hint = difflib.get_close_matches(rules.ascii_skeleton(name), KNOWN_GROUPS if kind == "group" else names,
                                             n=1, cutoff=0.8)
            problems.append(f"{kind} {name!r} (hosts.yml): {msg}; inventory names are ASCII"
                            + (f": did you mean {hint[0]!r}?" if hint else ": rename it"))
    for n, hv in hostvars.items():
        member = sorted(g for g, m in groups.items() if g not in SKIP_GROUPS and isinstance(m, list) and n in m)
        addressed = bool(hv.get("pdstack_address") or hv.get("ansible_host"))
        if not addressed and not hv.get("pdstack_servers") and len(member) <= 1:
            others = [h for h in names if h != n]
            hint = difflib.get_close_matches(n, others, n=1, cutoff=0.5)
            where = f"group '{member[0]}'" if member else "hosts.yml"
            problems.append(f"{where} names host {n!r}, which has no address (ansible_host, pdstack_address), no "
                            f"servers and no other group: " + (f"a typo of {hint[0]!r}? " if hint else "")
                            + f"fix the name in hosts.yml (hosts: {', '.join(sorted(others)) or 'none'}) or give "
                            "the host an ansible_host")
        elif not addressed and environment == "production":
            problems.append(f"host {n} (hosts.yml): no address; set ansible_host for it in hosts.yml (or "
                            f"pdstack_address in host_vars/{n}/): a production deploy does not reach hosts by their "
                            "inventory name")
    return problems
