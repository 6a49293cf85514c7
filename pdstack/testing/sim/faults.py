"""Injected faults of the TEST ENGINE: set by `--fault-*` flags at start and by POST /_sim/fault at run time."""

from __future__ import annotations

import asyncio
from dataclasses import asdict, dataclass, fields


class FaultError(ValueError):
    """A bad fault update (unknown key or wrong type); the admin endpoint answers 400 with this message."""


@dataclass
class Faults:
    # decode never emits a token (requests hang) while /health keeps answering 200
    wedge_decode: bool = False
    # extra seconds added to every prefill forward
    slow_prefill_s: float = 0.0
    # the KV transfer of every request fails -> aborted request, sglang:num_transfer_failed_reqs_total++
    fail_transfer: bool = False
    # the bootstrap handshake fails -> aborted request, sglang:num_bootstrap_failed_reqs_total++
    fail_bootstrap: bool = False
    # when set, every generation endpoint answers this HTTP status at once (e.g. 503, as an overloaded SGLang)
    reject_status: int | None = None
    # when set, /health, /health_generate and /ready answer this status (e.g. 503 while "starting")
    health_status: int | None = None
    # tool calls come out with arguments that do not match the tool's schema (JSON values cut mid-token)
    malformed_tool_args: bool = False
    # every tool call's first argument gets a wrong value of the right type (schema-valid: only exact checks see it)
    garble_tool_arg: bool = False
    # a thinking answer closes its reasoning block before the reasoning, so the parser puts it in the content
    leak_reasoning: bool = False
    # decode: the pages of a request aborted while its KV was on the way (client gone mid-prefill / mid-transfer)
    # are handed to the next request, and that request's late KV write lands on them: its answer changes
    stale_kv: bool = False
    # recall: needles whose keys differ only in digits are confused (the nearest one before the question answers),
    # like an indexer that loses the digits of look-alike keys; single needles still pass, multikey cases do not
    confuse_keys: bool = False
    # recall: a prompt whose token count is this residue mod 4 gets a wrong digit in its code (vLLM issue 55927's
    # shape: a fault only one prompt length in four shows); None: off
    residue_fault: int | None = None
    # write-only: true makes the process exit with `crash_exit_code` right after answering
    crash: bool = False
    crash_exit_code: int = 1

    def __post_init__(self) -> None:
        self._unwedged = asyncio.Event()
        self._sync_wedge()

    def _sync_wedge(self) -> None:
        if self.wedge_decode:
            self._unwedged.clear()
        else:
            self._unwedged.set()

    async def wait_unwedged(self) -> None:
        """Returns at once unless decode is wedged; then blocks until the wedge is cleared (maybe never)."""
        await self._unwedged.wait()

    def as_dict(self) -> dict:
        return asdict(self)

    def update(self, changes: dict) -> None:
        """Apply a partial update; null resets a field to its default. Validates everything before changing anything."""
        if not isinstance(changes, dict):
            raise FaultError("body must be a JSON object")
        known = {f.name: f for f in fields(self)}
        new = {}
        for key, value in changes.items():
            if key not in known:
                raise FaultError(f"unknown fault {key!r}; known: {', '.join(sorted(known))}")
            default = known[key].default
            if value is None:
                new[key] = default
                continue
            if key in ("wedge_decode", "fail_transfer", "fail_bootstrap", "crash", "malformed_tool_args",
                       "garble_tool_arg", "leak_reasoning", "stale_kv", "confuse_keys"):
                ok = isinstance(value, bool)
            elif key == "slow_prefill_s":
                ok = isinstance(value, int | float) and not isinstance(value, bool) and value >= 0
            else:  # status codes and the exit code
                ok = isinstance(value, int) and not isinstance(value, bool)
                if ok and key in ("reject_status", "health_status"):
                    ok = 100 <= value <= 599
                if ok and key == "residue_fault":
                    ok = 0 <= value <= 3
            if not ok:
                raise FaultError(f"bad value for {key}: {value!r}")
            new[key] = float(value) if key == "slow_prefill_s" else value
        for key, value in new.items():
            setattr(self, key, value)
        self._sync_wedge()
