"""The TEST ENGINE's scheduler: admission, queues, the timing model, and the PD prefill/decode flows.

Timing model (documented in README.md):
  * prefill: one forward at a time; it takes (prompt_tokens - cached_tokens) / prefill_tokens_per_s seconds,
    plus the slow_prefill_s fault. The first output token comes out of the prefill (as in SGLang).
  * decode: every running request advances one token per step; a step takes
    (1 / decode_tokens_per_s) * (1 + decode_batch_penalty * (decoding_requests - 1)) seconds, kept on absolute
    deadlines: a busy machine's event-loop lag (the test suite runs two workers on two cores) does not slow the
    modelled rate, it is caught up, by at most CATCH_UP_S of steps at once (so a wedge does not end in a burst).
  * PD: prefill waits for decode's handshake (bootstrap queue), prefills, then "sends the KV", which takes
    prompt_tokens * kv_bytes_per_token / kv_transfer_gb_per_s; decode waits for it (transfer queue), then decodes.
  * at most max_running_requests run at once; the rest wait (sglang:num_queue_reqs).
  * the SGLang flags a tuning candidate changes scale these rates (speed.py, SimConfig.speed).
Aborts raise `SimAbort`, whose status/message follow SGLang 0.5.23's `prepare_abort` / `_abort_on_queued_limit`.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import logging
import time
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from http import HTTPStatus

from pdstack.testing.sim import model, stale_pages, toolcalls
from pdstack.testing.sim.bootstrap import BootstrapClient, BootstrapFailed, RoomRegistry, TransferFailed
from pdstack.testing.sim.config import Role, SimConfig
from pdstack.testing.sim.faults import Faults
from pdstack.testing.sim.metrics import SimMetrics
from pdstack.testing.sim.vocab import EOS_ID

log = logging.getLogger("pdstack.testing.sim")

PAGE_TOKENS = 64  # prefix-cache page, as SGLang's page size for this model
CATCH_UP_S = 0.25  # decode: at most this much lag behind the step deadlines is made up


class SimAbort(Exception):
    """A request ends aborted; `finish_reason` is what SGLang's FINISH_ABORT.to_json() gives."""

    def __init__(self, status: int, message: str):
        super().__init__(message)
        self.status = HTTPStatus(status)
        self.message = message

    @property
    def finish_reason(self) -> dict:
        return {"type": "abort", "message": self.message, "status_code": int(self.status), "err_type": None}


@dataclass
class GenRequest:
    rid: str
    prompt: str
    max_new_tokens: int | None  # None (chat without max_tokens): up to the context, as SGLang's scheduler computes it
    stream: bool = False
    ignore_eos: bool = False
    bootstrap_host: str | None = None
    bootstrap_port: int | None = None
    bootstrap_room: int | None = None
    tool_constraint: toolcalls.Constraint | None = None  # what SGLang's tool-call grammar forces (tool_choice)
    created: float = field(default_factory=time.monotonic)


@dataclass
class Token:
    text: str
    token_id: int


@dataclass
class Finish:
    reason: dict  # SGLang meta_info.finish_reason: {"type": "stop", "matched": id} | {"type": "length", "length": n}
    prompt_tokens: int
    completion_tokens: int
    cached_tokens: int
    e2e_latency: float


class PrefixCache:
    """A page-granular prefix cache (chained page hashes, LRU), enough for cache_hit_rate and cached_tokens."""

    def __init__(self, capacity_tokens: int):
        self.capacity_pages = max(1, capacity_tokens // PAGE_TOKENS)
        self.pages: OrderedDict[bytes, None] = OrderedDict()

    @staticmethod
    def _keys(token_ids: list[int]) -> list[bytes]:
        keys, h = [], hashlib.sha256()
        for i in range(0, len(token_ids) - len(token_ids) % PAGE_TOKENS, PAGE_TOKENS):
            h.update(repr(token_ids[i : i + PAGE_TOKENS]).encode())
            keys.append(h.copy().digest())
        return keys

    def match_and_insert(self, token_ids: list[int]) -> int:
        keys = self._keys(token_ids)
        hit = 0
        for k in keys:
            if k not in self.pages:
                break
            hit += 1
        for k in keys:
            self.pages[k] = None
            self.pages.move_to_end(k)
        while len(self.pages) > self.capacity_pages:
            self.pages.popitem(last=False)
        return hit * PAGE_TOKENS

    @property
    def tokens(self) -> int:
        return len(self.pages) * PAGE_TOKENS

    def clear(self) -> None:
        self.pages.clear()


class Engine:
    def __init__(self, cfg: SimConfig, metrics: SimMetrics, faults: Faults):
        self.cfg = cfg
        self.metrics = metrics
        self.faults = faults
        self.rooms = RoomRegistry() if cfg.role is Role.PREFILL else None
        self.client: BootstrapClient | None = None  # set by the server once its aiohttp session exists (decode)
        self.prefill_lock = asyncio.Lock()  # one prefill forward at a time
        self._prefill_owner: asyncio.Task | None = None
        self.slots = asyncio.Semaphore(cfg.max_running_requests)
        self.waiting = 0
        self.running = 0
        self.decoding = 0
        self.bootstrap_queue = 0
        self.inflight_queue = 0
        self.prealloc_queue = 0
        self.transfer_queue = 0
        hicache_tokens = 0
        if cfg.enable_hierarchical_cache:
            hicache_tokens = int(cfg.max_total_tokens * (cfg.hicache_ratio or 2.0))
        self.hicache_total_tokens = hicache_tokens
        self.cache = PrefixCache(cfg.max_total_tokens + hicache_tokens)
        self._hit_window: deque[tuple[int, int]] = deque(maxlen=200)  # (cached, prompt) of recent requests
        self._late_writes = stale_pages.LateWrites(PAGE_TOKENS)  # requests aborted on decode, their KV on the way
        self._sync_gauges()

    # ---------------------------------------------------------------- bookkeeping
    def _sync_gauges(self) -> None:
        m = self.metrics
        m.num_queue_reqs.set(self.waiting)
        m.num_running_reqs.set(self.running)
        m.num_prefill_bootstrap_queue_reqs.set(self.bootstrap_queue)
        m.num_prefill_inflight_queue_reqs.set(self.inflight_queue)
        m.num_decode_prealloc_queue_reqs.set(self.prealloc_queue)
        m.num_decode_transfer_queue_reqs.set(self.transfer_queue)
        if m.hicache_host_total_tokens is not None:
            m.hicache_host_total_tokens.set(self.hicache_total_tokens)
            m.hicache_host_used_tokens.set(min(self.hicache_total_tokens, self.cache.tokens))
        m.refresh()

    @contextlib.contextmanager
    def _count(self, attr: str):
        setattr(self, attr, getattr(self, attr) + 1)
        self._sync_gauges()
        try:
            yield
        finally:
            setattr(self, attr, getattr(self, attr) - 1)
            self._sync_gauges()

    @contextlib.asynccontextmanager
    async def _running(self, tokens: int, prefill: bool):
        """Wait in the queue (sglang:num_queue_reqs) for a running slot and, when this request still needs a prefill,
        for the prefill forward (the lock is then held on entry; `_forward_prefill` releases it). Then hold the slot
        and `tokens` of KV for the body."""
        with self._count("waiting"):
            await self.slots.acquire()
            if prefill:
                try:
                    await self.prefill_lock.acquire()
                except BaseException:
                    self.slots.release()
                    raise
        self.running += 1
        self.metrics.add_used_tokens(tokens)
        self._sync_gauges()
        try:
            yield
        finally:
            if prefill and self.prefill_lock.locked() and self._prefill_owner is asyncio.current_task():
                self._release_prefill()
            self.running -= 1
            self.metrics.add_used_tokens(-tokens)
            self.slots.release()
            self._sync_gauges()

    def flush_cache(self) -> bool:
        if self.running or self.waiting:
            return False
        self.cache.clear()
        self._sync_gauges()
        return True

    def load(self) -> int:
        return self.running + self.waiting

    # ---------------------------------------------------------------- request flow
    def _abort(self, status: int, message: str) -> SimAbort:
        self.metrics.num_aborted_requests.inc()
        log.warning("abort (%d): %s", status, message)
        return SimAbort(status, message)

    async def generate(self, req: GenRequest) -> AsyncIterator[Token | Finish]:
        """Run one request; yields Token events then one Finish. Raises SimAbort for an aborted request."""
        cfg = self.cfg
        prompt_ids = model.tokenize(req.prompt)
        n_prompt = len(prompt_ids)
        if n_prompt >= cfg.context_length:  # tokenizer_manager._validate_one_request, before the total check
            raise self._abort(400, f"The input ({n_prompt} tokens) is longer than the model's context length "
                                   f"({cfg.context_length} tokens).")
        if req.max_new_tokens is None:
            req.max_new_tokens = self.default_max_new_tokens(n_prompt)
        elif n_prompt + req.max_new_tokens > cfg.context_length:
            raise self._abort(
                400,
                f"Requested token count exceeds the model's maximum context length of {cfg.context_length} tokens. "
                f"You requested a total of {n_prompt + req.max_new_tokens} tokens: {n_prompt} tokens from the input "
                f"messages and {req.max_new_tokens} tokens for the completion. Please reduce the number of tokens in "
                "the input messages or the completion to fit within the limit.",
            )
        pieces, finish_type = self._pieces(req, req.prompt)
        if cfg.role is Role.MONO:
            if cfg.max_queued_requests is not None and self.waiting + 1 > cfg.max_queued_requests:
                raise self._abort(503, "The request queue is full.")
            flow = self._mono(req, prompt_ids, pieces)
        elif cfg.role is Role.PREFILL:
            self._require_bootstrap(req)
            flow = self._prefill(req, prompt_ids, pieces)
        else:
            self._require_bootstrap(req)
            flow = self._decode(req, prompt_ids, pieces)
        emitted, cached = 0, 0
        try:
            async for ev in flow:
                if isinstance(ev, int):  # the flow reports its cached-token count first
                    cached = ev
                    continue
                emitted += 1
                yield ev
        except asyncio.CancelledError:
            self.metrics.num_aborted_requests.inc()
            log.info("request %s cancelled (client went away)", req.rid)
            raise
        e2e = time.monotonic() - req.created
        if cfg.role is Role.PREFILL:
            reason = {"type": "length", "length": emitted}
        elif finish_type == "stop":
            reason = {"type": "stop", "matched": EOS_ID}
        else:
            reason = {"type": "length", "length": emitted}
        self.metrics.request_finished(req.stream, n_prompt, emitted, e2e)
        yield Finish(reason, n_prompt, emitted, cached, e2e)

    def default_max_new_tokens(self, n_prompt: int) -> int:
        """max_new_tokens of a request that sets none, as SGLang 0.5.23's Scheduler.init_req_max_new_tokens: 1 << 30
        clipped to max_req_len - input_len - 1 (max_req_len = min(context_len, max_total_tokens) - 1, tp_worker.py),
        then to the empty pool (allocator/base.py max_new_tokens_for_memory: capacity - paged input - a page - 1)."""
        cfg = self.cfg
        n = min(1 << 30, min(cfg.context_length, cfg.max_total_tokens) - 1 - n_prompt - 1)
        paged = -(-n_prompt // PAGE_TOKENS) * PAGE_TOKENS
        return max(0, min(n, cfg.max_total_tokens - paged - PAGE_TOKENS - 1))

    def _pieces(self, req: GenRequest, kv_prompt: str) -> tuple[list[str], str]:
        """What the model emits for `kv_prompt` (the prompt the KV holds: the request's own, unless stale)."""
        ans = model.answer(kv_prompt, self.cfg.recall_horizon, malformed_tool_args=self.faults.malformed_tool_args,
                           leak_reasoning=self.faults.leak_reasoning, constraint=req.tool_constraint,
                           garble_tool_arg=self.faults.garble_tool_arg, confuse_keys=self.faults.confuse_keys,
                           residue_fault=self.faults.residue_fault, wrong_answers=self.cfg.speed.wrong_answers)
        return model.output_pieces(kv_prompt, ans, req.max_new_tokens, ignore_eos=req.ignore_eos)

    def _require_bootstrap(self, req: GenRequest) -> None:
        if req.bootstrap_room is None or req.bootstrap_host is None:
            raise self._abort(
                400,
                f"This is a {self.cfg.role.value} server (disaggregation-mode {self.cfg.role.disaggregation_mode}): "
                "requests need bootstrap_host, bootstrap_port and bootstrap_room; send them through the router.",
            )

    def _prefix(self, prompt_ids: list[int]) -> int:
        cached = self.cache.match_and_insert(prompt_ids)
        self.metrics.cached_tokens.inc(cached)
        self._hit_window.append((cached, len(prompt_ids)))
        total = sum(p for _, p in self._hit_window)
        self.metrics.cache_hit_rate.set(sum(c for c, _ in self._hit_window) / total if total else 0.0)
        return cached

    async def _forward_prefill(self, prompt_ids: list[int]) -> int:
        """The prefill forward; called with the prefill lock held (see `_running`), releases it."""
        self._prefill_owner = asyncio.current_task()
        try:
            cached = self._prefix(prompt_ids)
            rate = self.cfg.prefill_tokens_per_s * self.cfg.speed.prefill_factor
            seconds = (len(prompt_ids) - cached) / rate + self.faults.slow_prefill_s
            await asyncio.sleep(seconds)
        finally:
            self._release_prefill()
        return cached

    def _release_prefill(self) -> None:
        self._prefill_owner = None
        if self.prefill_lock.locked():
            self.prefill_lock.release()

    async def _decode_tokens(self, req: GenRequest, pieces: list[str]):
        """Emit pieces on the decode timing model; honours the wedge fault before every token."""
        with self._count("decoding"):
            last, grown, due = None, 0, time.monotonic()
            try:
                for i, piece in enumerate(pieces):
                    await self.faults.wait_unwedged()
                    if i > 0:
                        slowdown = 1 + self.cfg.decode_batch_penalty * max(0, self.decoding - 1)
                        rate = self.cfg.speed.decode_tps(self.cfg.decode_tokens_per_s, self.decoding)
                        due = max(due + slowdown / rate, time.monotonic() - CATCH_UP_S)
                        await asyncio.sleep(max(0.0, due - time.monotonic()))
                        await self.faults.wait_unwedged()
                    now = time.monotonic()
                    if last is None:
                        self.metrics.first_token(req.stream, now - req.created)
                    else:
                        self.metrics.inter_token_latency.observe(now - last)
                    last = now
                    self.metrics.tokens_generated(req.stream)
                    self.metrics.add_used_tokens(1)
                    grown += 1
                    yield Token(piece, model.piece_id(piece))
            finally:
                self.metrics.add_used_tokens(-grown)

    async def _mono(self, req: GenRequest, prompt_ids: list[int], pieces: list[str]):
        async with self._running(len(prompt_ids), prefill=True):
            cached = await self._forward_prefill(prompt_ids)
            yield cached
            async for tok in self._decode_tokens(req, pieces):
                yield tok

    # ---- PD prefill
    async def _prefill(self, req: GenRequest, prompt_ids: list[int], pieces: list[str]):
        room = self.rooms.get(req.bootstrap_room)
        rid_room = f"rank=0 req.rid={req.rid!r} req.bootstrap_room={req.bootstrap_room}"
        with self._count("bootstrap_queue"):
            if self.faults.fail_bootstrap:
                room.fail("bootstrap failed (pdstack sim fault fail_bootstrap)")
            else:
                handshake = asyncio.ensure_future(room.handshake.wait())
                done = asyncio.ensure_future(room.done.wait())
                try:
                    await asyncio.wait({handshake, done}, timeout=self.cfg.bootstrap_timeout_s,
                                       return_when=asyncio.FIRST_COMPLETED)
                finally:
                    handshake.cancel()
                    done.cancel()
            if not room.handshake.is_set():
                room.fail(room.message or f"decode did not bootstrap within {self.cfg.bootstrap_timeout_s:g}s")
                self.metrics.num_bootstrap_failed_reqs.inc()
                raise self._abort(500, f"Prefill bootstrap failed for request {rid_room} with exception "
                                       f"KVTransferError(bootstrap_room={req.bootstrap_room}): {room.message}")
        async with self._running(len(prompt_ids), prefill=True):
            cached = await self._forward_prefill(prompt_ids)
            yield cached
            with self._count("inflight_queue"):
                if self.faults.fail_transfer:
                    room.fail("KV transfer failed (pdstack sim fault fail_transfer)")
                    self.metrics.num_transfer_failed_reqs.inc()
                    raise self._abort(500, f"Prefill transfer failed for request {rid_room} with exception "
                                           f"KVTransferError(bootstrap_room={req.bootstrap_room}): {room.message}")
                seconds = len(prompt_ids) * self.cfg.kv_bytes_per_token / (self.cfg.kv_transfer_gb_per_s * 1e9)
                t0 = time.monotonic()
                await asyncio.sleep(seconds)
                room.succeed({"prompt_digest": _digest(req.prompt), "prompt_tokens": len(prompt_ids),
                              "first_piece": pieces[0] if pieces else None, "sent_at": time.time()})
                self.metrics.kv_transfer_latency_ms.observe((time.monotonic() - t0) * 1000)
            if pieces:  # the prefill server's own answer is the first token only
                self.metrics.first_token(req.stream, time.monotonic() - req.created)
                self.metrics.tokens_generated(req.stream)
                yield Token(pieces[0], model.piece_id(pieces[0]))

    # ---- PD decode
    async def _decode(self, req: GenRequest, prompt_ids: list[int], pieces: list[str]):
        try:
            async for ev in self._decode_flow(req, prompt_ids, pieces):
                yield ev
        except asyncio.CancelledError:  # the client went away: its pages go back to the pool, unscrubbed
            self._late_writes.aborted(req.prompt, len(prompt_ids) / self.cfg.prefill_tokens_per_s)
            raise

    def _stale_overlay(self, prompt: str) -> str | None:
        """The stale_kv fault (stale_pages.py): the prompt text the KV of `prompt` holds; None: untouched."""
        return self._late_writes.overlay(prompt) if self.faults.stale_kv else None

    async def _decode_flow(self, req: GenRequest, prompt_ids: list[int], pieces: list[str]):
        host, port, room = req.bootstrap_host, req.bootstrap_port, req.bootstrap_room
        rid_room = f"rank=0 decode_req.req.rid={req.rid!r} decode_req.req.bootstrap_room={room}"
        with self._count("prealloc_queue"):
            try:
                if self.faults.fail_bootstrap:
                    raise BootstrapFailed("handshake failed (pdstack sim fault fail_bootstrap)")
                if port is None:
                    raise BootstrapFailed("no bootstrap_port in the request (router given `--prefill URL none`?)")
                await self.client.handshake(host, int(port), room, self.cfg.bootstrap_timeout_s)
            except BootstrapFailed as e:
                self.metrics.num_bootstrap_failed_reqs.inc()
                raise self._abort(500, f"Decode handshake failed for request {rid_room} with exception "
                                       f"KVTransferError(bootstrap_room={room}): {e}") from None
        with self._count("transfer_queue"):
            try:
                if self.faults.fail_transfer:
                    raise TransferFailed("KV transfer failed (pdstack sim fault fail_transfer)")
                payload = await self.client.wait_kv(host, int(port), room, self.cfg.bootstrap_timeout_s)
            except TransferFailed as e:
                self.metrics.num_transfer_failed_reqs.inc()
                raise self._abort(500, f"Decode transfer failed for request {rid_room} with exception "
                                       f"KVTransferError(bootstrap_room={room}): {e}") from None
            if payload.get("prompt_digest") != _digest(req.prompt):
                self.metrics.num_transfer_failed_reqs.inc()
                raise self._abort(500, "KV checksum mismatch")
            sent_at = payload.get("sent_at")
            if isinstance(sent_at, int | float):
                self.metrics.kv_transfer_latency_ms.observe(max(0.0, time.time() - sent_at) * 1000)
            stale = self._stale_overlay(req.prompt)
            if stale is not None:
                pieces[:] = self._pieces(req, stale)[0]
        async with self._running(len(prompt_ids), prefill=False):
            yield self._prefix(prompt_ids)
            async for tok in self._decode_tokens(req, pieces):
                yield tok


def _digest(text: str) -> str:
    return hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()
