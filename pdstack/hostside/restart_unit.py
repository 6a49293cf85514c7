"""The forced command of the watchdog's ssh key on a serving host: restart one pdstack server unit, nothing else.

The router host's watchdog restarts a wedged server on another host with
`ssh -i /root/.ssh/pdstack_watchdog root@HOST restart pdstack-server-NAME.service`. Its key is authorized there only
as `restrict,command="/usr/bin/python3 -I /usr/local/lib/pdstack/pdstack-hostside.pyz restart-unit" ssh-ed25519
...` (the host-side artifact's `restart-unit` command): sshd runs it whatever the client asked for and puts the
request in SSH_ORIGINAL_COMMAND. It accepts exactly `restart UNIT` where UNIT is one of this host's pdstack server
units (from /etc/pdstack/plan.json, the host's part of the plan), and runs `systemctl restart UNIT`. Anything else
is refused with exit 2 and a message; no shell is involved. Standard library only (run with the host's python3 -I).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys

PLAN = "/etc/pdstack/plan.json"
SYSTEMCTL = "/bin/systemctl"
UNIT_RE = re.compile(r"^pdstack-server-[A-Za-z0-9][A-Za-z0-9_.-]*\.service$")


def allowed_units(plan_path: str = PLAN) -> set[str]:
    """The server units of this host's plan."""
    try:
        with open(plan_path) as f:
            plan = json.load(f)
    except (OSError, ValueError):
        return set()
    return {str(s.get("unit")) for s in plan.get("servers") or [] if UNIT_RE.match(str(s.get("unit", "")))}


def check(command: str, units: set[str]) -> tuple[str | None, str]:
    """(unit to restart or None, message) for an SSH_ORIGINAL_COMMAND."""
    words = command.split()
    if len(words) != 2 or words[0] != "restart":
        return None, f"refused: expected 'restart pdstack-server-NAME.service', got {command[:200]!r}"
    unit = words[1]
    if not UNIT_RE.match(unit):
        return None, f"refused: {unit[:200]!r} is not a pdstack server unit name"
    if unit not in units:
        return None, f"refused: {unit} is not a server of this host (allowed: {', '.join(sorted(units)) or 'none'})"
    return unit, f"restarting {unit}"


def main(env: dict[str, str] | None = None, plan_path: str = PLAN, systemctl: str = SYSTEMCTL) -> int:
    env = dict(os.environ) if env is None else env
    unit, msg = check(env.get("SSH_ORIGINAL_COMMAND", ""), allowed_units(plan_path))
    print(f"pdstack restart-unit: {msg}", file=sys.stderr)
    if unit is None:
        return 2
    return subprocess.run([systemctl, "restart", unit], check=False).returncode


if __name__ == "__main__":
    sys.exit(main())
