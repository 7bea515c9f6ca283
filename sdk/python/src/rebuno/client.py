"""`Client`: the bearer-token API for operators, UIs and scripts.

    async with Client("http://localhost:8080") as client:
        answer = await client.run("researcher", {"prompt": "hi"})   # the output
        ex = await client.create("researcher", {"prompt": "hi"})
        async for event in client.stream_events(ex.id):
            print(event.event_seq, event.type)

Errors are typed by the envelope's code (`NotFoundError`, `ConflictError`,
...). Connection errors, timeouts and `503` are retried with backoff; a
create is retried under the same `Idempotency-Key`, so a lost answer never
creates a second execution.

Awaiting a result costs one request: the kernel holds a read with `wait=`
until the execution ends (docs/protocol/executions.md §3.1), so `wait` and
`run` never poll.
"""

from __future__ import annotations

import asyncio
import builtins
import json
import os
import time
import uuid
from typing import Any, AsyncIterator, Mapping

import httpx2

from ._backoff import Backoff
from .errors import ExecutionFailedError, ExecutionTerminalError, UnavailableError, api_error
from .types import (AgentInfo, Approval, CoveragePoint, CoverageRanges, Event, Execution, ExecutionPage, Step,
                    StreamDelta, StreamEnd)

__all__ = ["Client"]

_list = builtins.list

DEFAULT_BASE_URL = "http://localhost:8080"

# A long wait is a sequence of kernel-side waits of at most WAIT_SLICE seconds
# each, by default: the kernel holds a request for MAX_WAIT seconds at most,
# and proxies often cut idle requests at 60 s.
WAIT_SLICE = 30.0
MAX_WAIT = 60.0


class _SSE:
    """Incremental parser of `text/event-stream` lines."""

    def __init__(self) -> None:
        self.event = ""
        self.data: _list[str] = []
        self.id: str | None = None

    def feed(self, line: str) -> tuple[str, str, str | None] | None:
        if line == "":
            if not self.data and not self.event:
                return None
            out = (self.event or "message", "\n".join(self.data), self.id)
            self.event, self.data = "", []
            return out
        if line.startswith(":"):
            return None
        name, _, value = line.partition(":")
        if value.startswith(" "):
            value = value[1:]
        if name == "data":
            self.data.append(value)
        elif name == "event":
            self.event = value
        elif name == "id":
            self.id = value
        return None


class Client:
    """Async bearer client of the kernel's `/v0` API.

    `base_url` defaults to `REBUNO_URL` (else `http://localhost:8080`),
    `token` to `REBUNO_BEARER_TOKEN` (dev kernels without a token accept any).
    `wait_slice` is the longest the kernel holds one request of `wait` or
    `run`, in seconds; a longer wait is a sequence of such requests.
    """

    def __init__(self, base_url: str | None = None, *, token: str | None = None, timeout: float = 30.0,
                 retries: int = 4, transport: httpx2.AsyncBaseTransport | None = None,
                 wait_slice: float = WAIT_SLICE) -> None:
        if not 0 < wait_slice <= MAX_WAIT:
            raise ValueError(f"wait_slice must be above 0 and at most {MAX_WAIT:g} seconds")
        self.base_url = (base_url or os.environ.get("REBUNO_URL") or DEFAULT_BASE_URL).rstrip("/")
        token = token if token is not None else os.environ.get("REBUNO_BEARER_TOKEN")
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        self._retries = max(0, retries)
        self._timeout = timeout
        self._wait_slice = wait_slice
        self._http = httpx2.AsyncClient(base_url=self.base_url, headers=headers, timeout=httpx2.Timeout(timeout),
                                        transport=transport, follow_redirects=False)

    async def __aenter__(self) -> Client:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        await self._http.aclose()

    # ------------------------------------------------------------- core

    async def _request(self, method: str, path: str, *, body: Any = None, params: Mapping[str, Any] | None = None,
                       headers: Mapping[str, str] | None = None, held: float = 0.0) -> httpx2.Response:
        """Send a request, retrying transport errors and `503`; raise the typed
        error for any other non-2xx answer. `held` is how long the kernel may
        hold the request (`wait=`), added to the timeout."""
        timeout = httpx2.Timeout(self._timeout + held) if held else httpx2.USE_CLIENT_DEFAULT
        content = None if body is None else json.dumps(body, ensure_ascii=False, allow_nan=False).encode("utf-8")
        clean = {k: v for k, v in (params or {}).items() if v is not None}
        backoff = Backoff()
        for attempt in range(self._retries + 1):
            last = attempt == self._retries
            try:
                resp = await self._http.request(method, path, content=content, params=clean or None, timeout=timeout,
                                                headers={"Content-Type": "application/json", **(headers or {})})
            except httpx2.TransportError:
                if last:
                    raise
            else:
                if resp.status_code < 300:
                    return resp
                err = api_error(resp.status_code, resp.content)
                if not isinstance(err, UnavailableError) or last:
                    if attempt > 0 and isinstance(err, ExecutionTerminalError) and path.endswith("/cancel"):
                        return resp  # the first try cancelled it
                    raise err
            await asyncio.sleep(backoff.next())
        raise AssertionError("unreachable")  # pragma: no cover

    async def _json(self, method: str, path: str, **kw: Any) -> Any:
        resp = await self._request(method, path, **kw)
        return resp.json() if resp.content else None

    # ------------------------------------------------------- executions

    async def create(self, agent_id: str, input: Any = None, *, agent_version: str | None = None,
                     idempotency_key: str | None = None, parent_execution_id: str | None = None,
                     on_behalf_of: str | None = None) -> Execution:
        """Start an execution. A fresh `Idempotency-Key` is used per call (or
        the one given) and reused on retries."""
        return await self._create(agent_id, input, agent_version=agent_version, idempotency_key=idempotency_key,
                                  parent_execution_id=parent_execution_id, on_behalf_of=on_behalf_of)

    async def _create(self, agent_id: str, input: Any, *, agent_version: str | None, idempotency_key: str | None,
                      parent_execution_id: str | None, on_behalf_of: str | None, wait: float = 0.0) -> Execution:
        """Create an execution; with `wait` the kernel answers once it has
        ended or `wait` seconds have passed (create and wait)."""
        body: dict[str, Any] = {"agent_id": agent_id, "input": input}
        for name, value in (("agent_version", agent_version), ("parent_execution_id", parent_execution_id),
                            ("on_behalf_of", on_behalf_of)):
            if value is not None:
                body[name] = value
        key = idempotency_key or uuid.uuid4().hex
        return Execution.model_validate(await self._json(
            "POST", "/v0/executions", body=body, headers={"Idempotency-Key": key}, params=_wait_params(wait),
            held=wait))

    async def get(self, execution_id: str) -> Execution:
        return Execution.model_validate(await self._json("GET", f"/v0/executions/{execution_id}"))

    async def list(self, *, agent_id: str | None = None, status: str | None = None, cursor: str | None = None,
                   limit: int | None = None) -> ExecutionPage:
        """One page of executions, newest first; pass `next_cursor` back as `cursor`."""
        params = {"agent_id": agent_id, "status": status, "cursor": cursor, "limit": limit}
        return ExecutionPage.model_validate(await self._json("GET", "/v0/executions", params=params))

    async def iter_executions(self, *, agent_id: str | None = None, status: str | None = None,
                              page_size: int | None = None) -> AsyncIterator[Execution]:
        """Every matching execution, newest first, across pages."""
        cursor: str | None = None
        while True:
            page = await self.list(agent_id=agent_id, status=status, cursor=cursor, limit=page_size)
            for ex in page.executions:
                yield ex
            if not page.next_cursor:
                return
            cursor = page.next_cursor

    async def cancel(self, execution_id: str) -> None:
        await self._request("POST", f"/v0/executions/{execution_id}/cancel")

    async def wait(self, execution_id: str, *, timeout: float | None = None) -> Execution:
        """The execution once it is terminal; `TimeoutError` after `timeout`
        seconds (the execution goes on). Each request is held by the kernel
        until the execution ends, at most `wait_slice` seconds: no polling."""
        deadline = None if timeout is None else time.monotonic() + timeout
        return await self._wait_from(await self._get_waiting(execution_id, self._slice(deadline)), deadline)

    async def run(self, agent_id: str, input: Any = None, *, timeout: float | None = None,
                  agent_version: str | None = None, idempotency_key: str | None = None,
                  parent_execution_id: str | None = None, on_behalf_of: str | None = None) -> Any:
        """Run an agent to its end and return the execution's output.

        One request creates the execution and waits for it (more only when it
        runs longer than `wait_slice` seconds). Raises `ExecutionFailedError`
        when it fails or is cancelled, `TimeoutError` after `timeout` seconds
        (the execution goes on: its id is in the message). A fresh
        `Idempotency-Key` per call (or the one given) makes retries safe.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        ex = await self._create(agent_id, input, agent_version=agent_version, idempotency_key=idempotency_key,
                                parent_execution_id=parent_execution_id, on_behalf_of=on_behalf_of,
                                wait=self._slice(deadline))
        ex = await self._wait_from(ex, deadline)
        if ex.status != "completed":
            raise ExecutionFailedError(ex)
        return ex.output

    def _slice(self, deadline: float | None) -> float:
        """The next kernel-side wait: the slice, or what is left until `deadline`."""
        if deadline is None:
            return self._wait_slice
        return max(0.0, min(self._wait_slice, deadline - time.monotonic()))

    async def _get_waiting(self, execution_id: str, wait: float) -> Execution:
        return Execution.model_validate(await self._json(
            "GET", f"/v0/executions/{execution_id}", params=_wait_params(wait), held=wait))

    async def _wait_from(self, ex: Execution, deadline: float | None) -> Execution:
        """Wait on from `ex`, as last read, until it is terminal or `deadline`
        (a `time.monotonic()` instant) passes."""
        # A kernel that answers before the wait is over without an end
        # (one older than waiting reads, or one shutting down) is asked again
        # only after a pause, so that such a kernel is not asked in a loop.
        early = Backoff(ceiling=1.0)
        while not ex.terminal:
            if deadline is not None and time.monotonic() >= deadline:
                raise TimeoutError(f"execution {ex.id} is still {ex.status}")
            wait = self._slice(deadline)
            started = time.monotonic()
            ex = await self._get_waiting(ex.id, wait)
            if not ex.terminal and time.monotonic() - started < wait / 2:
                await asyncio.sleep(min(early.next(), max(0.0, wait - (time.monotonic() - started))))
            else:
                early.reset()
        return ex

    # ----------------------------------------------------------- events

    async def events(self, execution_id: str, *, after_seq: int = 0, limit: int | None = None) -> _list[Event]:
        """One page of the event log (events with `event_seq > after_seq`)."""
        data = await self._json("GET", f"/v0/executions/{execution_id}/events",
                                params={"after_seq": after_seq, "limit": limit})
        return [Event.model_validate(e) for e in data or []]

    async def all_events(self, execution_id: str, *, after_seq: int = 0) -> _list[Event]:
        """The whole log after `after_seq`, reading every page."""
        out: _list[Event] = []
        while True:
            page = await self.events(execution_id, after_seq=after_seq, limit=1000)
            out.extend(page)
            if len(page) < 1000:
                return out
            after_seq = page[-1].event_seq

    async def stream_events(self, execution_id: str, *, after_seq: int = 0,
                            reconnect: bool = True) -> AsyncIterator[Event]:
        """Tail the event log over SSE: backlog first, then live events; ends
        when the execution is terminal. A dropped connection is resumed with
        `Last-Event-ID`, losing nothing."""
        last = after_seq
        failures = 0
        backoff = Backoff()
        while True:
            try:
                async for name, data, _ in self._sse(f"/v0/executions/{execution_id}/events/stream",
                                                     {"Last-Event-ID": str(last)}):
                    failures = 0
                    backoff.reset()
                    if name == "end":
                        StreamEnd.model_validate_json(data)
                        return
                    event = Event.model_validate_json(data)
                    last = event.event_seq
                    yield event
                return  # 204: terminal and nothing after `last`
            except (httpx2.TransportError, UnavailableError):
                failures += 1
                if not reconnect or failures > self._retries:
                    raise
                await asyncio.sleep(backoff.next())

    async def stream_deltas(self, execution_id: str) -> AsyncIterator[StreamDelta]:
        """Live token deltas of the execution's running steps (docs/protocol/events.md §5). Only
        deltas posted while connected are seen; ends when the execution does."""
        async for _, data, _ in self._sse(f"/v0/executions/{execution_id}/stream", {}):
            yield StreamDelta.model_validate_json(data)

    async def _sse(self, path: str, headers: Mapping[str, str]) -> AsyncIterator[tuple[str, str, str | None]]:
        async with self._http.stream("GET", path, headers=dict(headers),
                                     timeout=httpx2.Timeout(None, connect=10.0)) as resp:
            if resp.status_code == 204:
                return
            if resp.status_code >= 300:
                raise api_error(resp.status_code, await resp.aread())
            parser = _SSE()
            async for line in resp.aiter_lines():
                frame = parser.feed(line.rstrip("\r"))
                if frame is not None:
                    yield frame

    # ------------------------------------------------------------ steps

    async def steps(self, execution_id: str, *, status: str | None = None) -> _list[Step]:
        """Steps in recording order; `status` is a step status, `terminal` or `pending`."""
        data = await self._json("GET", f"/v0/executions/{execution_id}/steps", params={"status": status})
        return [Step.model_validate(s) for s in data or []]

    async def step(self, execution_id: str, step_id: str) -> Step:
        return Step.model_validate(await self._json("GET", f"/v0/executions/{execution_id}/steps/{step_id}"))

    # ----------------------------------------------- coverage and forks

    async def fork(self, execution_id: str, *, at_seq: int) -> Execution:
        """Fork an execution at one of its events (docs/protocol/forks.md).

        The fork is a new execution of the same agent and input: the steps
        finished at `at_seq` replay, and each resource is restored from the
        checkpoint that covers the point, or the newest earlier one (see
        `restoration` on the answer). A fresh `Idempotency-Key` is sent per
        call and reused on retries, so a lost answer never forks twice.
        """
        key = uuid.uuid4().hex
        return Execution.model_validate(await self._json(
            "POST", f"/v0/executions/{execution_id}/fork", body={"at_seq": at_seq},
            headers={"Idempotency-Key": key}))

    async def coverage(self, execution_id: str, at_seq: int | None = None) -> CoveragePoint | CoverageRanges:
        """Coverage at one event (`CoveragePoint`) with `at_seq`, else the
        covered ranges of the whole log (`CoverageRanges`)."""
        if at_seq is None:
            return CoverageRanges.model_validate(await self._json("GET", f"/v0/executions/{execution_id}/coverage"))
        return CoveragePoint.model_validate(await self._json(
            "GET", f"/v0/executions/{execution_id}/coverage", params={"at_seq": at_seq}))

    async def list_forks(self, execution_id: str, *, cursor: str | None = None,
                         limit: int | None = None) -> ExecutionPage:
        """One page of the execution's direct forks, newest first; pass
        `next_cursor` back as `cursor`."""
        return ExecutionPage.model_validate(await self._json(
            "GET", f"/v0/executions/{execution_id}/forks", params={"cursor": cursor, "limit": limit}))

    # -------------------------------------------------------- approvals

    async def approvals(self, *, status: str | None = None, execution_id: str | None = None,
                        after: str | None = None, limit: int | None = None) -> _list[Approval]:
        """Approvals, oldest first; `status` defaults to `pending` on the kernel."""
        data = await self._json("GET", "/v0/approvals", params={
            "status": status, "execution_id": execution_id, "after": after, "limit": limit})
        return [Approval.model_validate(a) for a in data or []]

    async def approval(self, approval_id: str) -> Approval:
        return Approval.model_validate(await self._json("GET", f"/v0/approvals/{approval_id}"))

    async def grant(self, approval_id: str, *, decided_by: str | None = None, rationale: str | None = None) -> None:
        await self._request("POST", f"/v0/approvals/{approval_id}/grant", body=_decision(decided_by, rationale))

    async def deny(self, approval_id: str, *, decided_by: str | None = None, rationale: str | None = None) -> None:
        await self._request("POST", f"/v0/approvals/{approval_id}/deny", body=_decision(decided_by, rationale))

    # ----------------------------------------------------------- agents

    async def register_agent(self, agent_id: str, webhook_url: str, secret: str, *,
                             lease_timeout_seconds: int | None = None) -> AgentInfo:
        """Create or update an agent (its policy and metadata are kept)."""
        body: dict[str, Any] = {"id": agent_id, "webhook_url": webhook_url, "secret": secret}
        if lease_timeout_seconds is not None:
            body["lease_timeout_seconds"] = lease_timeout_seconds
        return AgentInfo.model_validate(await self._json("POST", "/v0/agents", body=body))

    async def agents(self) -> _list[AgentInfo]:
        return [AgentInfo.model_validate(a) for a in await self._json("GET", "/v0/agents") or []]

    async def agent(self, agent_id: str) -> AgentInfo:
        return AgentInfo.model_validate(await self._json("GET", f"/v0/agents/{agent_id}"))

    async def delete_agent(self, agent_id: str) -> None:
        await self._request("DELETE", f"/v0/agents/{agent_id}")

    async def set_policy(self, agent_id: str, bundle: str | None) -> None:
        """Load an agent's policy bundle (YAML); `None` or `""` removes it."""
        await self._request("POST", f"/v0/policies/{agent_id}", body={"bundle": bundle or ""})

    async def health(self) -> bool:
        """Whether the kernel answers `GET /v0/ready` with 200."""
        try:
            resp = await self._http.get("/v0/ready")
        except httpx2.TransportError:
            return False
        return resp.status_code == 200


def _wait_params(wait: float) -> dict[str, str] | None:
    """The `wait` parameter for a kernel-side wait of `wait` seconds; none for 0."""
    ms = round(wait * 1000)
    return {"wait": f"{ms}ms"} if ms > 0 else None


def _decision(decided_by: str | None, rationale: str | None) -> dict[str, Any]:
    body: dict[str, Any] = {}
    if decided_by is not None:
        body["decided_by"] = decided_by
    if rationale is not None:
        body["rationale"] = rationale
    return body
