"""Extra vars (`ansible-playbook -e ...`) read by the same strict rules as the inventory's files, before Ansible
templates any of them.

Ansible reads each -e value one of three ways (ansible/utils/vars.py, load_extra_vars): `@FILE` as a YAML file
(whose strings it trusts as templates), text starting with `{` or `[` as YAML, anything else as key=value words
(ansible/parsing/splitter.py, parse_kv). A later -e wins over an earlier one, and every -e over the inventory.
pdstack reads them the same way, before the preflight role resolves any variable: a template in a value pdstack
reads (a `lookup('pipe', ...)` would run on the controller), a YAML 1.1 trap in an `@FILE` (`http: 030001`, the
octal 12289) or an explicit tag is refused naming the -e (its position and file:line), and each variable it sets
is recorded as coming from that -e, so later messages name it rather than an inventory file.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pdstack.controller.load import yamlsafe

# what pdstack reads besides its pdstack_* variables (the checks and the roles the preflight hands values to)
READ_TOO = ("ansible_host", "node_exporter_port", "dcgm_exporter_port", "prometheus_listen",
            "grafana_port")
# what the preflight computes for every later play (playbooks/preflight.yml): an -e outranks set_fact and a task's
# vars, so an -e of one of these, or of a role's private `_`/`__` variable, would stand in for what was checked
COMPUTED = ("preflight_plan", "preflight_plan_file", "preflight_vars_file", "preflight_hostside", "facts_topology")


def _where(i: int, opt: str) -> str:
    """-e #N: its position on the command line, never its text (it may hold the API key)."""
    return f"-e #{i}"


def check(raw: list[str] | tuple[str, ...]) -> tuple[list[str], dict[str, str]]:
    """(problems, {variable: where it was set}) for the -e values `raw`, in the order given (the last one wins)."""
    problems: list[str] = []
    origins: dict[str, str] = {}
    for i, opt in enumerate(raw, 1):
        if not isinstance(opt, str) or not opt:
            continue
        opt = opt.encode("utf-8", "surrogateescape").decode("utf-8", "replace")  # a plain str (Ansible tags its own)
        where = _where(i, opt)
        if opt.startswith("@"):
            path = Path(opt[1:])
            rel = f"-e @{path}"
            node = yamlsafe.read_file(path, rel, problems)
            found = yamlsafe.top_vars(node, rel, problems, READ_TOO) if node is not None else []
            for name, key, _value in found:
                origins[name] = f"{rel}:{key.start_mark.line + 1}"
        elif opt[0] in "{[":
            node = yamlsafe.parse_text(opt, where, problems)
            found = yamlsafe.top_vars(node, where, problems, READ_TOO) if node is not None else []
            for name, _key, _value in found:
                origins[name] = where
        else:
            from ansible.parsing.splitter import parse_kv

            try:
                pairs: dict[str, Any] = parse_kv(opt)
            except Exception as e:  # noqa: BLE001 - Ansible's own parser: its message is the answer
                problems.append(f"{where}: not key=value words ({e}); quote values with spaces")
                continue
            for name, value in pairs.items():
                if yamlsafe.is_pdstack_var(name, READ_TOO) and isinstance(value, str) and any(
                        o in value for o in yamlsafe.TEMPLATE_OPENERS):
                    problems.append(f"{name} ({where}): {value!r} is a Jinja template; pdstack values are never "
                                    "templated (a lookup would run code on the controller): give the value itself")
                origins[name] = where
    problems += [f"{name} ({origins[name]}): the preflight computes {name} for every later play, and an -e would "
                 "replace it unchecked; remove it" for name in COMPUTED if name in origins]
    problems += [f"{name} ({where}): a role's private variable (_ and __ names are computed inside a role); an -e "
                 "would replace it unchecked: remove it" for name, where in origins.items() if name.startswith("_")]
    return problems, {k: v for k, v in origins.items() if yamlsafe.is_pdstack_var(k, READ_TOO)}


def variable_manager(loader, inv, extra_vars: tuple[str, ...]):
    """Ansible's VariableManager for `inv`, with `extra_vars` read as ansible-playbook reads its -e values
    (ansible/utils/vars.py load_extra_vars, from the CLI arguments)."""
    from ansible import context
    from ansible.module_utils.common.collections import ImmutableDict
    from ansible.utils import vars as ansible_vars
    from ansible.vars.manager import VariableManager

    saved, memo = context.CLIARGS, getattr(ansible_vars.load_extra_vars, "extra_vars", None)
    context.CLIARGS = ImmutableDict({**dict(saved), "extra_vars": tuple(extra_vars)})
    ansible_vars.load_extra_vars.extra_vars = {}  # it memoises the first -e set it reads, process-wide
    try:
        return VariableManager(loader=loader, inventory=inv)
    finally:  # as it was (inside ansible-playbook: the run's own)
        context.CLIARGS = saved
        ansible_vars.load_extra_vars.extra_vars = memo
