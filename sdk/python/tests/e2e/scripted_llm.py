"""A scripted OpenAI-compatible server for the end-to-end tests.

`POST /v1/chat/completions`, plain or streamed (`"stream": true` → SSE
chunks, with a usage chunk when `stream_options.include_usage`). The answer
is a pure function of the request, so a replayed conversation asks the same
questions and would get the same answers:

* tools offered and no tool result yet → a call of the first tool, with the
  arguments configured for it in `tool_args`;
* tool results present → `"Final: "` + the tool results joined by `; `;
* otherwise → `"echo: "` + the last user message.

Every request is kept in `requests`, so tests can count provider calls.
"""

from __future__ import annotations

import json
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route


class ScriptedLLM:
    def __init__(self, tool_args: dict[str, dict[str, Any]] | None = None) -> None:
        self.requests: list[dict[str, Any]] = []
        self.tool_args = tool_args or {}
        self.app = Starlette(routes=[Route("/v1/chat/completions", self._chat, methods=["POST"])])

    # ------------------------------------------------------------ script

    def answer(self, body: dict[str, Any]) -> dict[str, Any]:
        messages = body.get("messages") or []
        tool_results = [m for m in messages if m.get("role") == "tool"]
        tools = body.get("tools") or []
        if tools and not tool_results:
            name = tools[0]["function"]["name"]
            return {"tool_call": {"id": "call_%d" % len(self.requests), "name": name,
                                  "arguments": json.dumps(self.tool_args.get(name, {}))}}
        if tool_results:
            return {"content": "Final: " + "; ".join(_text(m.get("content")) for m in tool_results)}
        users = [m for m in messages if m.get("role") == "user"]
        return {"content": "echo: " + (_text(users[-1].get("content")) if users else "")}

    # ------------------------------------------------------------- server

    async def _chat(self, request: Request) -> Response:
        body = await request.json()
        self.requests.append(body)
        reply = self.answer(body)
        model = body.get("model", "scripted")
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._chunks(model, reply, usage), media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": reply.get("content")}
        finish = "stop"
        if "tool_call" in reply:
            call = reply["tool_call"]
            message["tool_calls"] = [{"id": call["id"], "type": "function",
                                      "function": {"name": call["name"], "arguments": call["arguments"]}}]
            finish = "tool_calls"
        return JSONResponse({
            "id": "chatcmpl-%d" % len(self.requests), "object": "chat.completion", "created": 1_700_000_000,
            "model": model, "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12},
        })

    async def _chunks(self, model: str, reply: dict[str, Any], usage: bool) -> AsyncIterator[bytes]:
        cid = "chatcmpl-%d" % len(self.requests)

        def chunk(delta: dict[str, Any], finish: str | None = None) -> bytes:
            data = {"id": cid, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model,
                    "choices": [{"index": 0, "delta": delta, "finish_reason": finish}]}
            return f"data: {json.dumps(data)}\n\n".encode()

        if "tool_call" in reply:
            call = reply["tool_call"]
            yield chunk({"role": "assistant", "content": None, "tool_calls": [
                {"index": 0, "id": call["id"], "type": "function",
                 "function": {"name": call["name"], "arguments": ""}}]})
            yield chunk({"tool_calls": [{"index": 0, "function": {"arguments": call["arguments"]}}]})
            yield chunk({}, "tool_calls")
        else:
            text = reply["content"]
            yield chunk({"role": "assistant", "content": ""})
            for i in range(0, len(text), 4):
                yield chunk({"content": text[i:i + 4]})
            yield chunk({}, "stop")
        if usage:
            data = {"id": cid, "object": "chat.completion.chunk", "created": 1_700_000_000, "model": model,
                    "choices": [], "usage": {"prompt_tokens": 5, "completion_tokens": 7, "total_tokens": 12}}
            yield f"data: {json.dumps(data)}\n\n".encode()
        yield b"data: [DONE]\n\n"


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        return "".join(str(p.get("text", "")) for p in content if isinstance(p, dict))
    return str(content)
