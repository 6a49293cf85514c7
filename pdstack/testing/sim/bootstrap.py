"""The TEST ENGINE's PD handover: a bootstrap server on the prefill sim, and the decode sim's client for it.

It stands in for SGLang's bootstrap server (--disaggregation-bootstrap-port) plus the KV transfer engine, as a
small HTTP exchange over real TCP:

  decode -> POST /sim/handshake/{room}        prefill learns decode is ready for that room (the "bootstrap")
  decode -> GET  /sim/kv/{room}?wait=S        long-poll until prefill has "sent the KV" (or failed)
                                              -> {"status": "ready", "payload": {...}} | {"status": "failed", ...}
                                                 | {"status": "pending"} when S ran out
  any    -> GET  /health                      200 "OK"

The router sends the same request to prefill and decode at once, so either side may reach a room first; a room
is created by whichever arrives first and forgotten `ROOM_TTL_S` after it was created.
"""

from __future__ import annotations

import asyncio
import time
from dataclasses import dataclass, field

import aiohttp
from aiohttp import web

ROOM_TTL_S = 600.0


class BootstrapFailed(Exception):
    """The handshake with the prefill's bootstrap server failed (decode side)."""


class TransferFailed(Exception):
    """The KV never arrived or prefill reported a failure (decode side)."""


@dataclass
class Room:
    room: int
    created: float = field(default_factory=time.monotonic)
    handshake: asyncio.Event = field(default_factory=asyncio.Event)
    done: asyncio.Event = field(default_factory=asyncio.Event)
    status: str = "pending"  # pending | ready | failed
    payload: dict | None = None
    message: str = ""

    def succeed(self, payload: dict) -> None:
        self.status, self.payload = "ready", payload
        self.done.set()

    def fail(self, message: str) -> None:
        if self.status == "pending":
            self.status, self.message = "failed", message
        self.done.set()


class RoomRegistry:
    """Prefill-side state of every bootstrap room."""

    def __init__(self) -> None:
        self.rooms: dict[int, Room] = {}

    def get(self, room: int) -> Room:
        self._gc()
        r = self.rooms.get(room)
        if r is None:
            r = self.rooms[room] = Room(room)
        return r

    def _gc(self) -> None:
        cutoff = time.monotonic() - ROOM_TTL_S
        for k in [k for k, r in self.rooms.items() if r.created < cutoff]:
            del self.rooms[k]


def make_bootstrap_app(registry: RoomRegistry, fail_bootstrap: callable) -> web.Application:
    """The prefill sim's bootstrap server. `fail_bootstrap()` says whether the bootstrap fault is injected now."""

    async def handshake(request: web.Request) -> web.Response:
        room = _room(request)
        if fail_bootstrap():
            registry.get(room).fail("bootstrap refused (sim fault fail_bootstrap)")
            return web.json_response({"error": "bootstrap refused (sim fault fail_bootstrap)"}, status=503)
        r = registry.get(room)
        r.handshake.set()
        return web.json_response({"ok": True, "room": room})

    async def kv(request: web.Request) -> web.Response:
        room = _room(request)
        try:
            wait = min(60.0, max(0.0, float(request.query.get("wait", "10"))))
        except ValueError:
            raise web.HTTPBadRequest(text="wait must be a number") from None
        r = registry.get(room)
        try:
            await asyncio.wait_for(r.done.wait(), wait)
        except TimeoutError:
            return web.json_response({"status": "pending"})
        if r.status == "ready":
            return web.json_response({"status": "ready", "payload": r.payload})
        return web.json_response({"status": "failed", "message": r.message})

    async def health(request: web.Request) -> web.Response:
        return web.Response(text="OK")

    app = web.Application()
    app.router.add_post("/sim/handshake/{room}", handshake)
    app.router.add_get("/sim/kv/{room}", kv)
    app.router.add_get("/health", health)
    return app


def _room(request: web.Request) -> int:
    try:
        return int(request.match_info["room"])
    except ValueError:
        raise web.HTTPBadRequest(text="room must be an integer") from None


class BootstrapClient:
    """Decode side: handshake with the prefill's bootstrap server, then wait for the KV of one room."""

    def __init__(self, session: aiohttp.ClientSession):
        self.session = session

    @staticmethod
    def _base(host: str, port: int) -> str:
        host = f"[{host}]" if ":" in host and not host.startswith("[") else host
        return f"http://{host}:{port}"

    async def handshake(self, host: str, port: int, room: int, timeout_s: float) -> None:
        url = f"{self._base(host, port)}/sim/handshake/{room}"
        try:
            async with self.session.post(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as resp:
                if resp.status != 200:
                    raise BootstrapFailed(f"bootstrap server {host}:{port} answered {resp.status}: {await resp.text()}")
        except (aiohttp.ClientError, TimeoutError, OSError) as e:
            raise BootstrapFailed(f"cannot reach bootstrap server {host}:{port}: {e!r}") from e

    async def wait_kv(self, host: str, port: int, room: int, timeout_s: float) -> dict:
        deadline = time.monotonic() + timeout_s
        url = f"{self._base(host, port)}/sim/kv/{room}"
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TransferFailed(f"KV for bootstrap_room={room} did not arrive within {timeout_s:g}s")
            wait = min(5.0, left)
            try:
                async with self.session.get(url, params={"wait": f"{wait:.3f}"},
                                            timeout=aiohttp.ClientTimeout(total=wait + 5)) as resp:
                    if resp.status != 200:
                        raise TransferFailed(f"bootstrap server answered {resp.status}: {await resp.text()}")
                    body = await resp.json()
            except (aiohttp.ClientError, TimeoutError, OSError) as e:
                raise TransferFailed(f"lost the prefill's bootstrap server {host}:{port}: {e!r}") from e
            if body.get("status") == "ready":
                return body.get("payload") or {}
            if body.get("status") == "failed":
                raise TransferFailed(body.get("message") or "prefill reported a failed transfer")
