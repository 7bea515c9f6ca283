"""A scripted OpenAI-compatible chat completions server for the compatibility suite.

It answers ``POST /v1/chat/completions`` from a list of scripted replies, plainly
(one ``chat.completion`` JSON object) or, when the request says ``"stream": true``,
as server-sent events (``data: {chunk}`` lines, then ``data: [DONE]``). It counts and
keeps every request, so a test can prove that a replayed LLM step did not reach the
provider again. Standard library only; it runs in a thread of the test process.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


class ScriptedLLM:
    """Serves ``replies`` in order, one per request; an extra request gets a 500.

    ``requests`` holds the decoded body of every chat completions request received,
    in arrival order, including those answered with an error.
    """

    def __init__(self, replies: list[str] | None = None, *, chunk_size: int = 4):
        self._lock = threading.Lock()
        self._replies = list(replies or [])
        self._chunk_size = chunk_size
        self.requests: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        """The base URL an OpenAI client takes (it appends ``/chat/completions``)."""
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def script(self, *replies: str) -> None:
        """Appends replies to the script."""
        with self._lock:
            self._replies.extend(replies)

    def start(self) -> "ScriptedLLM":
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def _next(self, body: dict[str, Any]) -> str | None:
        with self._lock:
            self.requests.append(body)
            if not self._replies:
                return None
            return self._replies.pop(0)

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        llm = self

        class Handler(BaseHTTPRequestHandler):
            # HTTP/1.0 semantics: one request per connection, so a streamed
            # answer ends when the connection closes and needs no chunking.
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:  # noqa: A002
                pass

            def do_POST(self) -> None:  # noqa: N802
                length = int(self.headers.get("Content-Length") or 0)
                raw = self.rfile.read(length)
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._json(404, {"error": {"message": "unknown path", "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._json(400, {"error": {"message": "bad json", "type": "invalid_request"}})
                    return
                reply = llm._next(body)
                if reply is None:
                    self._json(500, {"error": {"message": "script exhausted", "type": "server_error"}})
                    return
                model = str(body.get("model", ""))
                if body.get("stream") is True:
                    self._stream(model, reply)
                else:
                    self._json(200, _completion(model, reply, len(llm.requests)))

            def _json(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _stream(self, model: str, reply: str) -> None:
                self.send_response(200)
                self.send_header("Content-Type", "text/event-stream")
                self.send_header("Cache-Control", "no-cache")
                self.end_headers()
                ident = f"chatcmpl-scripted-{len(llm.requests)}"
                pieces = [reply[i : i + llm._chunk_size] for i in range(0, len(reply), llm._chunk_size)]
                first = True
                for piece in pieces:
                    delta: dict[str, Any] = {"content": piece}
                    if first:
                        delta["role"] = "assistant"
                        first = False
                    self._event(_chunk(ident, model, delta, None))
                self._event(_chunk(ident, model, {}, "stop"))
                self.wfile.write(b"data: [DONE]\n\n")
                self.wfile.flush()

            def _event(self, obj: Any) -> None:
                self.wfile.write(b"data: " + json.dumps(obj).encode() + b"\n\n")
                self.wfile.flush()

        return Handler


def _completion(model: str, text: str, n: int) -> dict[str, Any]:
    return {
        "id": f"chatcmpl-scripted-{n}",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": text},
                "finish_reason": "stop",
            }
        ],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(text.split()), "total_tokens": 3 + len(text.split())},
    }


def _chunk(ident: str, model: str, delta: dict[str, Any], finish: str | None) -> dict[str, Any]:
    return {
        "id": ident,
        "object": "chat.completion.chunk",
        "created": int(time.time()),
        "model": model,
        "choices": [{"index": 0, "delta": delta, "finish_reason": finish}],
    }
