"""LLM calls as governed steps: `http_client()` and `RebunoTransport`.

    from openai import AsyncOpenAI
    client = AsyncOpenAI(http_client=rebuno.http_client())
    model = ChatOpenAI(model=..., http_async_client=rebuno.http_client())

Every request through the client is an `llm_call` step:

* **target** is the request's `model` (empty when it has none); **args** is
  the JSON body exactly as sent. docs/protocol/steps.md §1 suggests leaving out volatile
  fields such as the streaming flag, but the published client records the
  whole body, and keeping its identity lets an execution it began continue
  here; so a streamed and a plain call of the same request are two steps;
* on `proceed` the request goes to the provider and the whole response is
  recorded as `{"status", "headers": {"content-type"}, "body": <text>}` (the
  published client's record, so either SDK replays the other's); on `replay`
  the recorded response is returned without touching the provider;
* streamed responses (`text/event-stream`) are passed through as they arrive,
  teed to the kernel's live side channel (docs/protocol/events.md §5), and recorded whole
  when the stream ends;
* kernel refusals never raise here: they come back as synthetic `403`/`429`
  responses carrying the `rebuno_refusal` marker (docs/protocol/sdk.md §3), which provider
  clients do not retry and `raise_for_refusal()` turns back into `PolicyError`,
  `RateLimited`, `Blocked` or `Terminated`.
"""

from __future__ import annotations

import asyncio
import codecs
import json
import logging
import time
from typing import Any, AsyncIterator

import httpx2

from ._effects import error_message, report, step_error_json
from .errors import Blocked, Terminated, ToolError, refusal_message
from .execution import ExecutionContext, require_context
from .identity import canonical_value, parse_json
from .types import Decision, DecisionKind

__all__ = ["RebunoTransport", "http_client", "llm_step_args", "refusal_response", "DELTA_MAX_BYTES"]

log = logging.getLogger("rebuno")

DELTA_MAX_BYTES = 7000
DELTA_INTERVAL = 0.05
_DROP_HEADERS = ("content-encoding", "content-length", "transfer-encoding")


def llm_step_args(request: httpx2.Request, body: bytes) -> tuple[str, Any]:
    """(target, parsed args) of an LLM request: the model and the whole JSON
    body, exactly as sent (the same identity the published client records,
    so histories it began replay here); non-JSON requests are described by
    method, path and body text."""
    parsed: Any
    try:
        parsed = parse_json(body) if body.strip() else None
    except ValueError:
        parsed = None
    if isinstance(parsed, dict):
        target = parsed.get("model") if isinstance(parsed.get("model"), str) else ""
        return str(target), parsed
    return "", {
        "method": request.method,
        "path": request.url.raw_path.decode("ascii"),
        "body": body.decode("utf-8", "replace"),
    }


def refusal_response(request: httpx2.Request, code: str, *, reason: str | None = None,
                     rule_id: str | None = None, retry_after_ms: int | None = None) -> httpx2.Response:
    """The synthetic response for a kernel refusal (docs/protocol/sdk.md §3)."""
    status = 429 if code == DecisionKind.RATE_LIMITED else 403
    payload = {"error": {
        "type": "rebuno_refusal", "code": code, "message": refusal_message(code, reason),
        "rule_id": rule_id, "retry_after_ms": retry_after_ms,
    }}
    headers = {"content-type": "application/json", "x-should-retry": "false", "Rebuno-Refusal": code}
    if retry_after_ms is not None:
        headers["retry-after-ms"] = str(retry_after_ms)
    return httpx2.Response(status, headers=headers, content=json.dumps(payload).encode("utf-8"), request=request)


def _record(status: int, headers: httpx2.Headers, content: bytes) -> dict[str, Any]:
    """The step result of a provider response: status, content type and body
    text — the record shape the published client writes, so that either SDK
    replays the other's calls."""
    return {
        "status": status,
        "headers": {"content-type": headers.get("content-type", "application/json")},
        "body": content.decode("utf-8", "replace"),
    }


def _replayed(request: httpx2.Request, result: Any) -> httpx2.Response:
    if not isinstance(result, dict) or not isinstance(result.get("status"), int):
        raise ToolError("llm_call", "the recorded LLM response has an unknown shape", error=result)
    raw_headers = result.get("headers")
    headers: dict[str, Any] = raw_headers if isinstance(raw_headers, dict) else {"content-type": "application/json"}
    body = result.get("body", "")
    content = body.encode("utf-8") if isinstance(body, str) else json.dumps(body).encode("utf-8")
    resp = httpx2.Response(result["status"], headers={str(k): str(v) for k, v in headers.items()},
                           content=content, request=request)
    resp.extensions["rebuno_replayed"] = True
    return resp


def _split_utf8(text: str, limit: int = DELTA_MAX_BYTES) -> list[str]:
    """Split text so that each piece is at most `limit` bytes of UTF-8."""
    out: list[str] = []
    data = text.encode("utf-8", "replace")
    while data:
        cut = min(limit, len(data))
        while cut < len(data) and (data[cut] & 0xC0) == 0x80:  # not at a character boundary
            cut -= 1
        out.append(data[:cut].decode("utf-8", "replace"))
        data = data[cut:]
    return out


class _DeltaSender:
    """Posts live deltas of one step, at most every 50 ms, one request at a time."""

    def __init__(self, ctx: ExecutionContext, step_id: str) -> None:
        self._ctx = ctx
        self._step_id = step_id
        self._pending: list[str] = []
        self._seq = 0
        self._last = 0.0
        self._task: asyncio.Task[None] | None = None

    def add(self, text: str) -> None:
        if text:
            self._pending.append(text)
        if self._pending and time.monotonic() - self._last >= DELTA_INTERVAL and \
                (self._task is None or self._task.done()):
            self._flush()

    def _flush(self) -> None:
        data, self._pending = "".join(self._pending), []
        self._last = time.monotonic()
        self._task = asyncio.create_task(self._post(data))

    async def _post(self, data: str) -> None:
        for piece in _split_utf8(data):
            seq, self._seq = self._seq, self._seq + 1
            try:
                await self._ctx.kernel.stream_delta(self._ctx.execution_id, self._step_id, self._ctx.lease, seq,
                                                    piece)
            except Exception as e:  # deltas are ephemeral: never fail the call for them
                log.debug("rebuno: stream delta of %s dropped: %s", self._step_id, e)

    async def close(self) -> None:
        if self._task is not None:
            await asyncio.wait({self._task}, timeout=2)
        if self._pending:
            self._flush()
            assert self._task is not None
            await asyncio.wait({self._task}, timeout=2)


class _TeeStream(httpx2.AsyncByteStream):
    """Passes a streamed provider response through, posting live deltas, and
    records the whole response when it ends (drained if closed early)."""

    def __init__(self, ctx: ExecutionContext, step_id: str, request: httpx2.Request,
                 upstream: httpx2.Response) -> None:
        self._ctx = ctx
        self._step_id = step_id
        self._request = request
        self._upstream = upstream
        self._chunks: list[bytes] = []
        self._it = upstream.aiter_bytes()
        self._decoder = codecs.getincrementaldecoder("utf-8")("replace")
        self._deltas = _DeltaSender(ctx, step_id)
        self._done = False

    async def __aiter__(self) -> AsyncIterator[bytes]:
        try:
            async for chunk in self._it:
                self._take(chunk)
                yield chunk
        except Exception as exc:
            await self._finish(exc)
            raise
        await self._finish(None)

    def _take(self, chunk: bytes) -> None:
        self._chunks.append(chunk)
        self._deltas.add(self._decoder.decode(chunk))

    async def aclose(self) -> None:
        if not self._done and not self._ctx.stopping:
            try:
                async for chunk in self._it:  # record the whole response, not the part read
                    self._take(chunk)
                await self._finish(None)
            except Exception as exc:
                await self._finish(exc)
        await self._upstream.aclose()

    async def _finish(self, exc: BaseException | None) -> None:
        if self._done:
            return
        self._done = True
        self._deltas.add(self._decoder.decode(b"", final=True))
        await self._deltas.close()
        if self._ctx.stopping:
            return
        if exc is not None:
            value, succeeded = step_error_json(exc), False
        else:
            rec = _record(self._upstream.status_code, self._upstream.headers, b"".join(self._chunks))
            value, succeeded = json.dumps(rec, ensure_ascii=False, separators=(",", ":")), True
        try:
            await report(self._ctx, "llm_call", self._step_id, succeeded=succeeded, value_json=value, defer=True)
        except Exception as e:  # the caller already has the response; the signal is sticky on the context
            log.warning("rebuno: could not record streamed LLM call %s: %s", self._step_id, e)


class RebunoTransport(httpx2.AsyncBaseTransport):
    """An `httpx2` transport that makes every request an `llm_call` step.

    Wraps `transport` (default: `httpx2.AsyncHTTPTransport()`), which reaches
    the provider on `proceed`. Use it inside an `httpx2.AsyncClient`
    (`http_client()` builds one).
    """

    def __init__(self, transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self._inner = transport if transport is not None else httpx2.AsyncHTTPTransport()

    async def aclose(self) -> None:
        await self._inner.aclose()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        ctx = require_context("http_client()")
        body = await request.aread()
        target, args = llm_step_args(request, body)
        try:
            decision = await ctx.submit("llm_call", target, canonical_value(args), "safe_to_retry", [])
        except Blocked:
            return refusal_response(request, "blocked")
        except Terminated as t:
            return refusal_response(request, t.reason if t.reason == "lease_superseded" else "execution_terminal")
        return await self._decided(ctx, request, decision)

    async def _decided(self, ctx: ExecutionContext, request: httpx2.Request, decision: Decision) -> httpx2.Response:
        d = decision.decision
        if d == DecisionKind.REPLAY:
            if decision.has_error:
                raise ToolError("llm_call", error_message(decision.error), error=decision.error,
                                step_id=decision.step_id)
            return _replayed(request, decision.result)
        if d != DecisionKind.PROCEED or decision.step_id is None:
            return refusal_response(request, d, reason=decision.reason, rule_id=decision.rule_id,
                                    retry_after_ms=decision.retry_after_ms)
        return await self._live(ctx, request, decision.step_id)

    async def _live(self, ctx: ExecutionContext, request: httpx2.Request, step_id: str) -> httpx2.Response:
        try:
            upstream = await self._inner.handle_async_request(request)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            if not ctx.stopping:
                await _report_quietly(ctx, step_id, exc)
            raise
        headers = [(k, v) for k, v in upstream.headers.multi_items() if k.lower() not in _DROP_HEADERS]
        if upstream.headers.get("content-type", "").startswith("text/event-stream"):
            return httpx2.Response(upstream.status_code, headers=headers,
                                   stream=_TeeStream(ctx, step_id, request, upstream), request=request,
                                   extensions=dict(upstream.extensions))
        try:
            content = await upstream.aread()
        except Exception as exc:
            await upstream.aclose()
            if not ctx.stopping:
                await _report_quietly(ctx, step_id, exc)
            raise
        await upstream.aclose()
        rec = _record(upstream.status_code, upstream.headers, content)
        stored = await report(ctx, "llm_call", step_id, succeeded=True,
                              value_json=json.dumps(rec, ensure_ascii=False, separators=(",", ":")), defer=True)
        if isinstance(stored, Decision):  # recorded by an earlier try: the stored outcome stands
            return await self._decided(ctx, request, stored)
        # Built from the record, so that the live response and every replay are identical.
        return _replayed(request, rec)


async def _report_quietly(ctx: ExecutionContext, step_id: str, exc: BaseException) -> None:
    try:
        await report(ctx, "llm_call", step_id, succeeded=False, value_json=step_error_json(exc))
    except Exception as e:
        log.warning("rebuno: could not record the failed LLM call %s: %s", step_id, e)


def http_client(*, transport: httpx2.AsyncBaseTransport | None = None,
                timeout: httpx2.Timeout | float | None = None, **client_options: Any) -> httpx2.AsyncClient:
    """An `httpx2.AsyncClient` whose requests are recorded LLM steps.

    Pass it to provider SDKs: `AsyncOpenAI(http_client=http_client())`,
    `ChatOpenAI(http_async_client=http_client())`. `transport` is the
    transport that reaches the provider (default `httpx2.AsyncHTTPTransport()`).
    """
    return httpx2.AsyncClient(
        transport=RebunoTransport(transport),
        timeout=timeout if timeout is not None else httpx2.Timeout(600.0, connect=10.0),
        **client_options,
    )
