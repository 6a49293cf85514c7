"""The TEST ENGINE's HTTP API: the subset of SGLang 0.5.23's endpoints that sglang-router 0.3.2 and pdstack use.

Response and error shapes follow SGLang's source (sglang/srt/entrypoints/http_server.py and openai/serving_*.py):
  * non-stream abort:  HTTP <status>, {"object": "error", "message": ..., "type": "<status>", "param": null,
                       "code": <status>}
  * stream abort, /generate:  a 200 SSE stream whose chunk carries meta_info.finish_reason =
                       {"type": "abort", "message": ..., "status_code": <status>, "err_type": null}, then [DONE]
  * stream abort, OpenAI:  a 200 SSE stream with `data: {"error": {"object": "error", "message": ...,
                       "type": "<HTTPStatus name>", "param": null, "code": <status>}}`, then [DONE]
Admin endpoints of the simulator itself live under /_sim/.
"""

from __future__ import annotations

import asyncio
import json
import logging
import os
import time
import uuid
from http import HTTPStatus

import aiohttp
from aiohttp import web

from pdstack.testing.sim import SGLANG_COMPAT_VERSION, SIM_VERSION, TEST_ENGINE_LABEL, parsing
from pdstack.testing.sim.bootstrap import BootstrapClient, make_bootstrap_app
from pdstack.testing.sim.config import Role, SimConfig
from pdstack.testing.sim.engine import Engine, Finish, GenRequest, SimAbort, Token
from pdstack.testing.sim.faults import FaultError, Faults
from pdstack.testing.sim.http_shapes import (
    DEFAULT_MAX_NEW_TOKENS,
    SHUTDOWN_GRACE_S,
    SSE_HEADERS,
    BadRequest,
    error_body,
)
from pdstack.testing.sim.metrics import CONTENT_TYPE, SimMetrics
from pdstack.testing.sim.openai_api import OpenAIRoutes
from pdstack.testing.sim.vocab import VOCAB

log = logging.getLogger("pdstack.testing.sim")

class SimServer(OpenAIRoutes):
    """Owns the engine, metrics and faults of one sim process, and builds its aiohttp applications."""

    def __init__(self, cfg: SimConfig, faults: Faults | None = None):
        self.cfg = cfg
        self.faults = faults or Faults()
        self.metrics = SimMetrics(cfg)
        self.engine = Engine(cfg, self.metrics, self.faults)
        self.started = time.monotonic()
        self.started_wall = time.time()  # /_sim/state: tells a restarted process from the one before
        self.received = 0  # generation requests that reached this process (/_sim/state)
        self.session: aiohttp.ClientSession | None = None
        self._runners: list[web.AppRunner] = []

    # ------------------------------------------------------------------ lifecycle
    def app(self) -> web.Application:
        app = web.Application(client_max_size=512 * 1024 * 1024)
        r = app.router
        for path in ("/health", "/health_generate", "/ready"):
            r.add_get(path, self.health)
        r.add_get("/server_info", self.server_info)
        r.add_get("/get_server_info", self.server_info)
        r.add_get("/model_info", self.model_info)
        r.add_get("/get_model_info", self.model_info)
        r.add_get("/v1/models", self.models)
        r.add_route("*", "/flush_cache", self.flush_cache)
        r.add_get("/metrics", self.metrics_endpoint)
        r.add_post("/generate", self._rejecting(self.generate))
        r.add_put("/generate", self._rejecting(self.generate))
        r.add_post("/v1/completions", self._rejecting(self.completions))
        r.add_post("/v1/chat/completions", self._rejecting(self.chat))
        r.add_get("/_sim/fault", self.get_fault)
        r.add_post("/_sim/fault", self.post_fault)
        r.add_get("/_sim/state", self.state)
        return app

    @property
    def tool_call_parser(self) -> str | None:
        return self.cfg.server_args.get("tool_call_parser")

    @property
    def reasoning_parser(self) -> str | None:
        return self.cfg.server_args.get("reasoning_parser")

    async def start(self) -> None:
        if self.tool_call_parser or self.reasoning_parser:
            parsing.classes()  # SGLang's parser classes: import them (seconds) before serving, not on a request
        self.session = aiohttp.ClientSession()
        self.engine.client = BootstrapClient(self.session)
        try:
            await self._serve(self.app(), self.cfg.port)
            if self.cfg.role is Role.PREFILL:
                await self._serve(make_bootstrap_app(self.engine.rooms, lambda: self.faults.fail_bootstrap),
                                  self.cfg.bootstrap_port)
        except BaseException:
            await self.stop()
            raise
        boot = f", bootstrap port {self.cfg.bootstrap_port}" if self.cfg.role is Role.PREFILL else ""
        log.info("%s: role=%s serving on http://%s:%d%s", TEST_ENGINE_LABEL, self.cfg.role.value,
                 self.cfg.host, self.cfg.port, boot)

    async def _serve(self, app: web.Application, port: int) -> None:
        # In-flight requests (a wedged decode's never end) get SHUTDOWN_GRACE_S on SIGTERM, not aiohttp's 60 s.
        runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=SHUTDOWN_GRACE_S)
        await runner.setup()
        self._runners.append(runner)
        await web.TCPSite(runner, self.cfg.host, port).start()

    async def stop(self) -> None:
        for runner in reversed(self._runners):
            await runner.cleanup()
        if self.session is not None:
            await self.session.close()

    # ------------------------------------------------------------------ info endpoints
    def _health_status(self) -> int:
        if self.faults.health_status is not None:
            return self.faults.health_status
        if time.monotonic() - self.started < self.cfg.startup_delay_s:
            return 503
        return 200

    async def health(self, request: web.Request) -> web.Response:
        return web.Response(status=self._health_status())

    def _info_common(self) -> dict:
        return {
            "test_engine": True,
            "engine": TEST_ENGINE_LABEL,
            "sim_version": SIM_VERSION,
            "sglang_compat_version": SGLANG_COMPAT_VERSION,
        }

    async def server_info(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        info = {
            **cfg.server_args,
            "model_path": cfg.tokenizer_dir,
            "tokenizer_path": cfg.tokenizer_dir,
            "served_model_name": cfg.model_name,
            "requested_model_path": cfg.model_path,
            "host": cfg.host,
            "port": cfg.port,
            "disaggregation_mode": cfg.role.disaggregation_mode,
            "disaggregation_bootstrap_port": cfg.bootstrap_port,
            "context_length": cfg.context_length,
            "max_queued_requests": cfg.max_queued_requests,
            "max_running_requests": cfg.max_running_requests,
            "max_total_num_tokens": cfg.max_total_tokens,
            "enable_metrics": cfg.enable_metrics,
            "tp_size": cfg.server_args.get("tp_size", 1),
            "dp_size": cfg.server_args.get("dp_size", 1),
            "launch_command": cfg.launch_argv,
            "internal_states": [{
                "last_gen_throughput": self.metrics.gen_throughput._value.get(),
                "load": self.engine.load(),
                "num_running_reqs": self.engine.running,
                "num_queue_reqs": self.engine.waiting,
            }],
            "version": SGLANG_COMPAT_VERSION,
            "frontend": "pdstack-sim",
            **self._info_common(),
        }
        return web.json_response(info)

    async def model_info(self, request: web.Request) -> web.Response:
        cfg = self.cfg
        return web.json_response({
            "model_path": cfg.tokenizer_dir,
            "served_model_name": cfg.model_name,
            "tokenizer_path": cfg.tokenizer_dir,
            "is_generation": True,
            "preferred_sampling_params": None,
            "weight_version": "default",
            "load_format": "dummy",
            "reasoning_parser": self.reasoning_parser,
            "tool_call_parser": self.tool_call_parser,
            "disaggregation_mode": cfg.role.disaggregation_mode,
            "has_image_understanding": False,
            "has_audio_understanding": False,
            "model_type": "pdstack_sim",
            "architectures": ["PdstackSimTestEngine"],
            "requested_model_path": cfg.model_path,
            **self._info_common(),
        })

    async def models(self, request: web.Request) -> web.Response:
        name = self.cfg.model_name
        return web.json_response({"object": "list", "data": [{
            "id": name, "object": "model", "created": int(time.time()), "owned_by": "sglang", "root": name,
            "parent": None, "max_model_len": self.cfg.context_length, "test_engine": True}]})

    async def flush_cache(self, request: web.Request) -> web.Response:
        if self.engine.flush_cache():
            return web.Response(text="Cache flushed.\nPlease check backend logs for more details. (When there are "
                                     "running or waiting requests, the operation will not be performed.)\n")
        return web.Response(status=400, text="Flush cache failed: there are running or waiting requests.\n")

    async def metrics_endpoint(self, request: web.Request) -> web.Response:
        if not self.cfg.enable_metrics:  # as SGLang: /metrics exists only with --enable-metrics
            raise web.HTTPNotFound(text="metrics are disabled; start the sim with --enable-metrics")
        self.engine._sync_gauges()
        return web.Response(body=self.metrics.render(), headers={"Content-Type": CONTENT_TYPE})

    # ------------------------------------------------------------------ admin
    async def get_fault(self, request: web.Request) -> web.Response:
        return web.json_response(self.faults.as_dict())

    async def post_fault(self, request: web.Request) -> web.Response:
        try:
            body = await request.json()
            self.faults.update(body)
        except (json.JSONDecodeError, FaultError) as e:
            return web.json_response({"error": str(e)}, status=400)
        log.warning("faults now %s", self.faults.as_dict())
        if self.faults.crash:
            code = self.faults.crash_exit_code
            log.error("crashing on request (sim fault crash), exit code %d", code)
            asyncio.get_running_loop().call_later(0.05, os._exit, code)
        return web.json_response(self.faults.as_dict())

    async def state(self, request: web.Request) -> web.Response:
        e = self.engine
        return web.json_response({
            "role": self.cfg.role.value, "waiting": e.waiting, "running": e.running, "decoding": e.decoding,
            "bootstrap_queue": e.bootstrap_queue, "inflight_queue": e.inflight_queue,
            "prealloc_queue": e.prealloc_queue, "transfer_queue": e.transfer_queue,
            "rooms": len(e.rooms.rooms) if e.rooms is not None else None, "cached_tokens": e.cache.tokens,
            "received": self.received, "started_at": self.started_wall,
            **self._info_common()})

    # ------------------------------------------------------------------ generation
    def _rejecting(self, handler):
        """The reject_status fault: answer at the HTTP level (stream or not), before any engine work."""

        async def wrapped(request: web.Request) -> web.StreamResponse:
            self.received += 1
            status = self.faults.reject_status
            if status is None:
                return await handler(request)
            self.metrics.num_aborted_requests.inc()
            msg = f"Service unavailable (pdstack sim fault reject_status={status})"
            log.warning("rejecting %s with %d (fault reject_status)", request.path, status)
            return web.json_response(error_body(status, msg), status=status)

        return wrapped

    async def _body(self, request: web.Request) -> dict:
        try:
            body = await request.json()
        except json.JSONDecodeError as e:
            raise BadRequest(f"Request body must be JSON: {e}") from None
        if not isinstance(body, dict):
            raise BadRequest("Request body must be a JSON object.")
        return body

    @staticmethod
    def _bootstrap(body: dict, req: GenRequest) -> GenRequest:
        req.bootstrap_host = body.get("bootstrap_host")
        port = body.get("bootstrap_port")
        req.bootstrap_port = int(port) if port is not None else None
        room = body.get("bootstrap_room")
        req.bootstrap_room = int(room) if room is not None else None
        return req

    @staticmethod
    def _max_tokens(value, default: int) -> int:
        if value is None:
            return default
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise BadRequest(f"max tokens must be a non-negative integer, got {value!r}")
        return value

    async def generate(self, request: web.Request) -> web.StreamResponse:
        try:
            body = await self._body(request)
            text = body.get("text")
            if text is None and body.get("input_ids") is not None:
                ids = body["input_ids"]
                if not isinstance(ids, list) or not all(isinstance(i, int) for i in ids):
                    raise BadRequest("the sim accepts input_ids only as one flat list of ints")
                inv = {v: k for k, v in VOCAB.items()}
                text = " ".join(inv.get(i, "<unk>") for i in ids)
            if not isinstance(text, str):
                raise BadRequest("the sim accepts `text` as one string (no batches)")
            sp = body.get("sampling_params") or {}
            req = self._bootstrap(body, GenRequest(
                rid=str(body.get("rid") or uuid.uuid4().hex), prompt=text,
                max_new_tokens=self._max_tokens(sp.get("max_new_tokens"), DEFAULT_MAX_NEW_TOKENS),
                stream=bool(body.get("stream")), ignore_eos=bool(sp.get("ignore_eos"))))
        except (BadRequest, ValueError, TypeError) as e:
            return web.json_response({"error": {"message": str(e)}}, status=400)

        if req.stream:
            resp = await self._sse_start(request)
            text_so_far, ids = "", []
            try:
                async for ev in self.engine.generate(req):
                    if isinstance(ev, Token):
                        text_so_far += ev.text
                        ids.append(ev.token_id)
                        chunk = {"text": text_so_far, "output_ids": list(ids),
                                 "meta_info": {"id": req.rid, "finish_reason": None, "completion_tokens": len(ids)}}
                    else:
                        chunk = {"text": text_so_far, "output_ids": list(ids),
                                 "meta_info": self._meta(req, ev)}
                    await self._sse(resp, chunk)
            except SimAbort as a:
                await self._sse(resp, {"text": text_so_far, "output_ids": list(ids), "meta_info": {
                    "id": req.rid, "finish_reason": a.finish_reason, "completion_tokens": len(ids),
                    "e2e_latency": time.monotonic() - req.created}})
            await resp.write(b"data: [DONE]\n\n")
            await resp.write_eof()
            return resp
        try:
            text_out, ids, fin = await self._collect(req)
        except SimAbort as a:
            return self._abort_response(a)
        return web.json_response({"text": text_out, "output_ids": ids, "meta_info": self._meta(req, fin)})

    @staticmethod
    def _meta(req: GenRequest, fin: Finish) -> dict:
        return {"id": req.rid, "finish_reason": fin.reason, "prompt_tokens": fin.prompt_tokens,
                "completion_tokens": fin.completion_tokens, "cached_tokens": fin.cached_tokens,
                "e2e_latency": fin.e2e_latency, "weight_version": "default", "test_engine": True}

    async def _collect(self, req: GenRequest) -> tuple[str, list[int], Finish]:
        text, ids, fin = "", [], None
        async for ev in self.engine.generate(req):
            if isinstance(ev, Token):
                text += ev.text
                ids.append(ev.token_id)
            else:
                fin = ev
        return text, ids, fin

    @staticmethod
    def _abort_response(a: SimAbort) -> web.Response:
        if a.status == HTTPStatus.BAD_REQUEST:  # SGLang raises ValueError for 400 aborts
            return web.json_response({"error": {"message": a.message}}, status=400)
        return web.json_response(error_body(int(a.status), a.message), status=int(a.status))

    async def _sse_start(self, request: web.Request) -> web.StreamResponse:
        resp = web.StreamResponse(status=200, headers=SSE_HEADERS)
        await resp.prepare(request)  # SGLang's StreamingResponse sends 200 + headers before the first chunk
        return resp

    @staticmethod
    async def _sse(resp: web.StreamResponse, obj: dict) -> None:
        await resp.write(b"data: " + json.dumps(obj, separators=(",", ":")).encode() + b"\n\n")


async def serve(cfg: SimConfig, faults: Faults | None = None, crash_after_s: float | None = None,
                stop: asyncio.Event | None = None) -> None:
    """Run one sim process until `stop` is set (or forever)."""
    server = SimServer(cfg, faults)
    await server.start()
    if crash_after_s is not None:
        def _crash() -> None:
            log.error("crashing after %gs (sim flag --fault-crash-after-s)", crash_after_s)
            os._exit(server.faults.crash_exit_code)
        asyncio.get_running_loop().call_later(crash_after_s, _crash)
    try:
        await (stop or asyncio.Event()).wait()
    finally:
        await server.stop()
