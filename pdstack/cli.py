"""The `pdstack` command line: a thin layer over library functions.

Each subcommand lives in its own module (or shares one: `module:name` means register_name/run_name), which exposes
    register(parser: argparse.ArgumentParser) -> None   # add its arguments
    run(args: argparse.Namespace) -> int                 # do the work, return the exit code
and is imported only when that subcommand runs, so `pdstack plan` never imports the simulator.
"""

from __future__ import annotations

import argparse
import importlib
import sys

from pdstack.errors import PdstackError

# name -> (module, one-line help)
COMMANDS: dict[str, tuple[str, str]] = {
    "plan": ("pdstack.controller.pipeline:plan", "resolve an inventory + host facts into the exact per-server plan"),
    "preflight": ("pdstack.controller.pipeline:preflight",
                  "validate an inventory (and host facts) without touching a host"),
    "facts": ("pdstack.hostside.facts", "print this host's NUMA/GPU facts as JSON (what the facts.d script reports)"),
    "recall": ("pdstack.controller.gates.recall",
               "needle-in-a-haystack recall over context lengths x depths through the router"),
    "probe": ("pdstack.hostside.probe",
              "deep liveness: one streamed generation through prefill, KV transfer and decode"),
    "bench": ("pdstack.controller.gates.bench",
              "C=1 decode tokens/s, TTFT and inter-token latency, a short concurrency sweep"),
    "smoke": ("pdstack.controller.gates.smoke",
              "recall + probe + bench against a router: the deploy gate (JSON, heatmap, summary)"),
    "status": ("pdstack.controller.status.status",
               "read-only health of a deployment: units, images, router, front door, watchdog, smoke, alerts"),
    "watchdog": ("pdstack.hostside.watchdog", "probe on a timer; restart a wedged decode, then prefill, with backoff"),
    "model": ("pdstack.controller.load.modellock",
              "the model lock (every file's path, size, sha256) of a model directory or a Hugging Face repo"),
    "tune": ("pdstack.controller.tune.loop",
             "try tune.yml's candidates on a running deployment: rolling restart, recall gate, bench_serving sweep"),
    "sim": ("pdstack.testing.sim.cli", "TEST ENGINE: an SGLang-compatible PD worker simulator (never for production)"),
}


def _entry(module: str, verb: str):
    """`verb` of a subcommand: `module` exposes register/run, or `module:name` exposes register_name/run_name."""
    mod, _, name = module.partition(":")
    return getattr(importlib.import_module(mod), f"{verb}_{name}" if name else verb)


def build_parser(argv: list[str]) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pdstack", description=__doc__.splitlines()[0], allow_abbrev=False)
    sub = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, (module, help_) in COMMANDS.items():
        p = sub.add_parser(name, help=help_, description=help_, allow_abbrev=False)
        p.set_defaults(_module=module)
        # Registering needs the module; import lazily only for the chosen command.
        if name in argv:
            _entry(module, "register")(p)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = build_parser(argv).parse_args(argv)
    try:
        return _entry(args._module, "run")(args)
    except PdstackError as e:
        print(f"pdstack {args.command}: {type(e).__name__}:\n{e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
