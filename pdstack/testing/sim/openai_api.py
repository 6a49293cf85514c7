"""The TEST ENGINE's OpenAI-compatible endpoints (/v1/completions, /v1/chat/completions), as SGLang 0.5.23's
openai/serving_completions.py and serving_chat.py shape them. A mixin of SimServer (server.py), which owns the engine,
the request parsing helpers and the SSE writer."""

from __future__ import annotations

import time
import uuid
from http import HTTPStatus

from aiohttp import web

from pdstack.testing.sim import model, parsing, toolcalls
from pdstack.testing.sim.engine import Finish, GenRequest, SimAbort, Token
from pdstack.testing.sim.http_shapes import (
    DEFAULT_COMPLETION_MAX_TOKENS,
    BadRequest,
    error_body,
)


class OpenAIRoutes:
    async def completions(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=False)

    async def chat(self, request: web.Request) -> web.StreamResponse:
        return await self._openai(request, chat=True)

    async def _openai(self, request: web.Request, chat: bool) -> web.StreamResponse:
        try:
            body = await self._body(request)
            if chat:
                messages = body.get("messages")
                if not isinstance(messages, list) or not messages:
                    raise BadRequest("messages must be a non-empty list")
                tool_choice = parsing.tool_choice(body)
                prompt = model.render_chat(messages, tools=parsing.prompt_tools(body, tool_choice),
                                           thinking=parsing.thinking_requested(body))
                chat_parsing = parsing.ChatParsing(body, self.tool_call_parser, self.reasoning_parser)
                constraint = toolcalls.constraint_of(tool_choice, body.get("parallel_tool_calls", True))
                # protocol.py to_sampling_params: max_completion_tokens or max_tokens, else None, which the
                # scheduler turns into "up to the context" (Engine.default_max_new_tokens)
                max_tokens = body.get("max_completion_tokens") or body.get("max_tokens")
                max_tokens = None if max_tokens is None else self._max_tokens(max_tokens, 0)
                if max_tokens is not None and max_tokens > self.cfg.context_length:  # serving_chat._validate_request
                    raise BadRequest(f"max_completion_tokens is too large: {max_tokens}.This model supports at most "
                                     f"{self.cfg.context_length} completion tokens.")
            else:
                prompt = body.get("prompt")
                if isinstance(prompt, list) and len(prompt) == 1 and isinstance(prompt[0], str):
                    prompt = prompt[0]
                if not isinstance(prompt, str):
                    raise BadRequest("the sim accepts `prompt` as one string")
                max_tokens = self._max_tokens(body.get("max_tokens"), DEFAULT_COMPLETION_MAX_TOKENS)
                constraint = None
            stream = bool(body.get("stream"))
            req = self._bootstrap(body, GenRequest(
                rid=body.get("rid") or uuid.uuid4().hex, prompt=prompt, max_new_tokens=max_tokens,
                stream=stream, ignore_eos=bool(body.get("ignore_eos")), tool_constraint=constraint))
        except (BadRequest, ValueError, TypeError) as e:
            return web.json_response(error_body(400, str(e), "BadRequestError"), status=400)
        model_name = body.get("model") or self.cfg.model_name
        created = int(time.time())
        oid = ("chatcmpl-" if chat else "cmpl-") + req.rid
        include_usage = bool((body.get("stream_options") or {}).get("include_usage"))

        if not stream:
            try:
                text, _ids, fin = await self._collect(req)
            except SimAbort as a:
                if a.status == HTTPStatus.BAD_REQUEST:
                    return web.json_response(error_body(400, a.message, "BadRequest"), status=400)
                return web.json_response(error_body(int(a.status), a.message), status=int(a.status))
            finish = fin.reason["type"]
            matched = fin.reason.get("matched")
            if chat:
                content, reasoning, tool_calls, finish = chat_parsing.parse(text, finish)
                if tool_calls:
                    matched = None
                choice = {"index": 0, "message": {"role": "assistant", "content": content,
                                                  "reasoning_content": reasoning, "tool_calls": tool_calls},
                          "logprobs": None, "finish_reason": finish, "matched_stop": matched}
            else:
                choice = {"index": 0, "text": text, "logprobs": None, "finish_reason": finish, "matched_stop": matched}
            return web.json_response({
                "id": oid, "object": "chat.completion" if chat else "text_completion", "created": created,
                "model": model_name, "choices": [choice], "usage": self._usage(fin)})

        resp = await self._sse_start(request)
        obj = "chat.completion.chunk" if chat else "text_completion"

        def chunk(delta_text: str | None, finish: str | None, first: bool = False, matched=None,
                  delta: dict | None = None) -> dict:
            if chat:
                delta = dict(delta or {})
                if first:
                    delta["role"] = "assistant"
                if delta_text is not None:
                    delta["content"] = delta_text
                choice = {"index": 0, "delta": delta, "logprobs": None, "finish_reason": finish}
            else:
                choice = {"index": 0, "text": delta_text or "", "logprobs": None, "finish_reason": finish}
            if finish is not None:
                choice["matched_stop"] = matched
            return {"id": oid, "object": obj, "created": created, "model": model_name, "choices": [choice]}

        try:
            if chat:
                await self._sse(resp, chunk("", None, first=True))
            async for ev in self.engine.generate(req):
                if isinstance(ev, Token) and not chat:
                    await self._sse(resp, chunk(ev.text, None))
                elif isinstance(ev, Token):
                    for d in chat_parsing.feed(ev.text):
                        await self._sse(resp, chunk(None, None, delta=d))
                else:
                    finish, matched = ev.reason["type"], ev.reason.get("matched")
                    if chat:
                        for d in chat_parsing.feed("", final=True):
                            await self._sse(resp, chunk(None, None, delta=d))
                        if chat_parsing.has_tool_calls and finish == "stop":
                            finish, matched = "tool_calls", None
                    last = chunk(None if chat else "", finish, matched=matched)
                    await self._sse(resp, last)
                    if include_usage:
                        await self._sse(resp, {"id": oid, "object": obj, "created": created, "model": model_name,
                                               "choices": [], "usage": self._usage(ev)})
        except SimAbort as a:
            await self._sse(resp, {"error": error_body(int(a.status), a.message, a.status.name)})
        await resp.write(b"data: [DONE]\n\n")
        await resp.write_eof()
        return resp

    @staticmethod
    def _usage(fin: Finish) -> dict:
        return {"prompt_tokens": fin.prompt_tokens, "completion_tokens": fin.completion_tokens,
                "total_tokens": fin.prompt_tokens + fin.completion_tokens,
                "prompt_tokens_details": {"cached_tokens": fin.cached_tokens} if fin.cached_tokens else None}
