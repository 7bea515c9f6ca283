"""The scripted OpenAI-compatible server of docs/protocol/conformance.md §3.

Its next action is a function of the request alone: it counts the tool
results in the conversation (`role: "tool"` messages on the chat completions
wire, `function_call_output` items on the responses wire) and answers with
script entry N+1. A replayed conversation therefore asks the same question
and gets the same answer, and a fork's live calls are deterministic.

Endpoints (non-streaming, and streaming on chat completions):

* `POST /v1/chat/completions` — LangChain's `ChatOpenAI`, plain `openai`;
* `POST /v1/responses` — the AI SDK's `openai(model)`.

Every request is logged in `requests` as `Request(path, n, body)`, where `n`
is the number of tool results it carried (so the entry it got is `n + 1`).
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass
from typing import Any, AsyncIterator

from starlette.applications import Starlette
from starlette.requests import Request as HTTPRequest
from starlette.responses import JSONResponse, Response, StreamingResponse
from starlette.routing import Route

# (action, path, content): ("write", p, c), ("read", p, None), ("answer", text, None).
Entry = tuple[str, str, str | None]

DEFAULT_SCRIPT: list[Entry] = [
    ("write", "a.txt", "1"),
    ("write", "b.txt", "2"),
    ("read", "a.txt", None),
    ("write", "c.txt", "3"),
    ("write", "a.txt", "4"),
    ("write", "d.txt", "5"),
    ("read", "b.txt", None),
    ("write", "e.txt", "6"),
    ("answer", "done", None),
]


def writes_of(script: list[Entry]) -> list[tuple[str, str]]:
    return [(p, c) for kind, p, c in script if kind == "write" and c is not None]


@dataclass
class Request:
    path: str
    n: int  # tool results in the conversation: the answer was entry n + 1
    body: dict[str, Any]
    started: float = 0.0  # time.monotonic() when it arrived
    ended: float = 0.0  # ... and when its answer was ready


class ScriptServer:
    def __init__(self, script: list[Entry] | None = None) -> None:
        self.script = list(script or DEFAULT_SCRIPT)
        self.requests: list[Request] = []
        self.url = ""  # set by whoever serves it
        self.delay = 0.0  # seconds each answer takes
        self.app = Starlette(routes=[
            Route("/v1/chat/completions", self._chat, methods=["POST"]),
            Route("/v1/responses", self._responses, methods=["POST"]),
        ])

    # ------------------------------------------------------------- script

    def entry(self, n: int) -> Entry:
        """Entry n + 1 (the last one, an answer, past the end)."""
        return self.script[min(n, len(self.script) - 1)]

    @staticmethod
    def _call(entry: Entry) -> tuple[str, str]:
        kind, path, content = entry
        if kind == "write":
            return "write_file", json.dumps({"path": path, "content": content})
        return "read_file", json.dumps({"path": path})

    def counts(self, path: str = "/v1/chat/completions") -> list[int]:
        """The `n` of every logged request to `path`, in arrival order."""
        return [r.n for r in self.requests if r.path == path]

    async def _wait(self, req: Request) -> None:
        if self.delay:
            await asyncio.sleep(self.delay)
        req.ended = time.monotonic()

    # ------------------------------------------------ chat completions wire

    async def _chat(self, request: HTTPRequest) -> Response:
        body = await request.json()
        n = sum(1 for m in body.get("messages") or [] if isinstance(m, dict) and m.get("role") == "tool")
        req = Request("/v1/chat/completions", n, body, time.monotonic())
        self.requests.append(req)
        await self._wait(req)
        kind, text, _ = entry = self.entry(n)
        model = body.get("model", "scripted")
        call_id = f"call_{n + 1}"
        if body.get("stream"):
            usage = bool((body.get("stream_options") or {}).get("include_usage"))
            return StreamingResponse(self._chunks(n, model, entry, call_id, usage), media_type="text/event-stream")
        message: dict[str, Any] = {"role": "assistant", "content": text if kind == "answer" else None}
        finish = "stop"
        if kind != "answer":
            name, arguments = self._call(entry)
            message["tool_calls"] = [{"id": call_id, "type": "function",
                                      "function": {"name": name, "arguments": arguments}}]
            finish = "tool_calls"
        return JSONResponse({
            "id": f"chatcmpl-{n + 1}", "object": "chat.completion", "created": 1_700_000_000, "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15},
        })

    async def _chunks(self, n: int, model: str, entry: Entry, call_id: str, usage: bool) -> AsyncIterator[bytes]:
        def frame(choices: list[dict[str, Any]], **extra: Any) -> bytes:
            data = {"id": f"chatcmpl-{n + 1}", "object": "chat.completion.chunk", "created": 1_700_000_000,
                    "model": model, "choices": choices, **extra}
            return f"data: {json.dumps(data)}\n\n".encode()

        kind, text, _ = entry
        if kind == "answer":
            yield frame([{"index": 0, "delta": {"role": "assistant", "content": ""}, "finish_reason": None}])
            for i in range(0, len(text), 3):
                yield frame([{"index": 0, "delta": {"content": text[i:i + 3]}, "finish_reason": None}])
            yield frame([{"index": 0, "delta": {}, "finish_reason": "stop"}])
        else:
            name, arguments = self._call(entry)
            yield frame([{"index": 0, "delta": {"role": "assistant", "content": None, "tool_calls": [
                {"index": 0, "id": call_id, "type": "function", "function": {"name": name, "arguments": ""}}]},
                "finish_reason": None}])
            yield frame([{"index": 0, "delta": {"tool_calls": [{"index": 0, "function": {"arguments": arguments}}]},
                          "finish_reason": None}])
            yield frame([{"index": 0, "delta": {}, "finish_reason": "tool_calls"}])
        if usage:
            yield frame([], usage={"prompt_tokens": 10, "completion_tokens": 5, "total_tokens": 15})
        yield b"data: [DONE]\n\n"

    # ------------------------------------------------------ responses wire

    async def _responses(self, request: HTTPRequest) -> Response:
        body = await request.json()
        items = body.get("input")
        n = sum(1 for i in items if isinstance(i, dict) and i.get("type") == "function_call_output") \
            if isinstance(items, list) else 0
        req = Request("/v1/responses", n, body, time.monotonic())
        self.requests.append(req)
        await self._wait(req)
        kind, text, _ = entry = self.entry(n)
        if kind == "answer":
            output: list[dict[str, Any]] = [{
                "type": "message", "id": f"msg_{n + 1}", "status": "completed", "role": "assistant",
                "content": [{"type": "output_text", "text": text, "annotations": []}]}]
        else:
            name, arguments = self._call(entry)
            output = [{"type": "function_call", "id": f"fc_{n + 1}", "call_id": f"call_{n + 1}", "name": name,
                       "arguments": arguments, "status": "completed"}]
        return JSONResponse({
            "id": f"resp_{n + 1}", "object": "response", "created_at": 1_700_000_000, "status": "completed",
            "model": body.get("model", "scripted"), "output": output,
            "usage": {"input_tokens": 10, "output_tokens": 5, "total_tokens": 15},
        })
