"""A scripted OpenAI-compatible server whose answer is a function of the request
alone (docs/protocol/conformance.md §3, fixture): it counts the ``tool`` messages in the
conversation and answers script entry N, a tool call or a final text. A fork's
live LLM calls therefore get the same answers as its source's did at the same
turn, whichever turn the fork starts at. Non-streaming only; standard library
only; it runs in a thread of the test process and keeps every request.
"""

from __future__ import annotations

import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# One entry per turn: ("write", path, content), ("read", path) or ("answer", text).
Entry = tuple[str, ...]

DEFAULT_SCRIPT: list[Entry] = [
    ("write", "a.txt", "1"),
    ("write", "b.txt", "2"),
    ("read", "a.txt"),
    ("write", "c.txt", "3"),
    ("write", "a.txt", "4"),
    ("write", "d.txt", "5"),
    ("read", "b.txt"),
    ("write", "e.txt", "6"),
    ("answer", "done"),
]


def tool_turns(request: dict[str, Any]) -> int:
    """How many tool results the conversation of a chat request holds."""
    return sum(1 for m in request.get("messages", []) if m.get("role") == "tool")


class ToolLLM:
    def __init__(self, script: list[Entry] | None = None):
        self.script = list(script or DEFAULT_SCRIPT)
        self._lock = threading.Lock()
        self.requests: list[dict[str, Any]] = []
        self._server = ThreadingHTTPServer(("127.0.0.1", 0), self._handler_class())
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host}:{port}/v1"

    @property
    def count(self) -> int:
        with self._lock:
            return len(self.requests)

    def since(self, n: int) -> list[dict[str, Any]]:
        """The requests received after the first ``n``."""
        with self._lock:
            return list(self.requests[n:])

    def start(self) -> ToolLLM:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._server.shutdown()
        self._server.server_close()

    def answer(self, request: dict[str, Any]) -> dict[str, Any] | None:
        n = tool_turns(request)
        if n >= len(self.script):
            return None
        entry = self.script[n]
        model = str(request.get("model", ""))
        if entry[0] == "answer":
            message: dict[str, Any] = {"role": "assistant", "content": entry[1]}
            finish = "stop"
        else:
            if entry[0] == "write":
                name, args = "write_file", {"path": entry[1], "content": entry[2]}
            else:
                name, args = "read_file", {"path": entry[1]}
            call = {"id": f"call_{n}", "type": "function", "function": {"name": name, "arguments": json.dumps(args)}}
            message = {"role": "assistant", "content": None, "tool_calls": [call]}
            finish = "tool_calls"
        return {
            "id": f"chatcmpl-tools-{n}",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": model,
            "choices": [{"index": 0, "message": message, "finish_reason": finish}],
            "usage": {"prompt_tokens": 5, "completion_tokens": 5, "total_tokens": 10},
        }

    def _handler_class(self) -> type[BaseHTTPRequestHandler]:
        llm = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: Any) -> None:
                pass

            def do_POST(self) -> None:
                raw = self.rfile.read(int(self.headers.get("Content-Length") or 0))
                if self.path.rstrip("/") != "/v1/chat/completions":
                    self._json(404, {"error": {"message": "unknown path", "type": "not_found"}})
                    return
                try:
                    body = json.loads(raw)
                except ValueError:
                    self._json(400, {"error": {"message": "bad json", "type": "invalid_request"}})
                    return
                with llm._lock:
                    llm.requests.append(body)
                reply = llm.answer(body)
                if reply is None:
                    self._json(500, {"error": {"message": "script exhausted", "type": "server_error"}})
                else:
                    self._json(200, reply)

            def _json(self, status: int, obj: Any) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

        return Handler
