"""`python3 pdstack-hostside.pyz COMMAND ARGS...`: every host-side program behind one entry point.

The roles install the package as one zip (pdstack/controller/render/hostside.py builds it) and run each program as
a subcommand of it, with the arguments the module's own main() takes; `python3 -m pdstack.hostside COMMAND` is the
same from a checkout. Each module is imported only when its command runs.
"""

from __future__ import annotations

import importlib
import sys

# command -> (module under pdstack.hostside, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "facts": ("facts", "this host's NUMA/GPU facts as JSON (the facts.d script; the preflight's read)"),
    "probe": ("probe", "deep liveness: one streamed generation through prefill, KV transfer and decode"),
    "drain": ("drain", "the steps of a rolling restart: router worker API, front-door switch, drain waits, holds"),
    "watchdog": ("watchdog", "one watchdog step: probe, restart a wedged decode then prefill, with backoff"),
    "restart-unit": ("restart_unit", "the watchdog key's forced command: restart one server unit of this host's plan"),
    "model-fetch": ("model_fetch", "make a model directory exactly its lock: fetch, verify, repair"),
    "status-collect": ("status_collect", "what `pdstack status` reads on this host, as JSON (only reads)"),
}


def usage() -> str:
    width = max(map(len, COMMANDS))
    lines = [f"  {name:<{width}}  {help_}" for name, (_, help_) in COMMANDS.items()]
    return "usage: pdstack-hostside.pyz COMMAND [ARGS...]\n\ncommands:\n" + "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if not argv or argv[0] in ("-h", "--help"):
        sys.stdout.write(usage())
        return 0 if argv else 2
    if argv[0] not in COMMANDS:
        sys.stderr.write(f"pdstack-hostside: unknown command {argv[0]!r}\n{usage()}")
        return 2
    name, rest = argv[0], argv[1:]
    mod = importlib.import_module(f"pdstack.hostside.{COMMANDS[name][0]}")
    if name == "restart-unit":  # an ssh forced command: what it may do comes from SSH_ORIGINAL_COMMAND, not argv
        if rest:
            sys.stdout.write(f"usage: pdstack-hostside.pyz restart-unit (takes no arguments)\n{mod.__doc__}")
            return 0 if rest[0] in ("-h", "--help") else 2
        return mod.main()
    return mod.main(rest)


if __name__ == "__main__":
    sys.exit(main())
