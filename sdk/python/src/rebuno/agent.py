"""`Agent`: serves the kernel's webhook and runs the handler once per dispatch.

Dispatch (Agents page; docs/protocol/sdk.md §1):

1. read the body up to a fixed limit (`413` beyond it), verify
   `Rebuno-Signature` (`401` when missing or wrong), then parse it;
2. acknowledge at once (`200`) and run the handler in a background task;
3. cancel a handler still running for the execution when a newer webhook
   supersedes it; ignore repeats and attempts the kernel has moved past;
4. skip terminal executions;
5. fetch the input, bind it, run the handler under the execution context,
   heartbeating every `min(30 s, lease / 3)`.

Outcomes map onto the execution as the Agents page's failure table says.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import logging
import os
from dataclasses import dataclass
from typing import Any, AsyncIterator, Awaitable, Callable, TypeVar

import httpx2
import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from pydantic import BaseModel

from ._binding import Binding, BindingError, bind_handler
from ._callables import is_async_callable
from ._dispatch import DispatchKey, DispatchTracker
from ._effects import encode_result
from ._kernel import KernelClient, Lease, LeaseClock
from ._webhook import DEFAULT_LEASE_TIMEOUT, Refused, receive
from .errors import (APIError, PolicyError, RateLimited, RebunoError, Terminated, ToolError, is_signal,
                     raise_for_refusal)
from .execution import ExecutionContext, _reset, _set
from .resources import completion_captures

__all__ = ["Agent", "failure_reason", "DEFAULT_LEASE_TIMEOUT"]

log = logging.getLogger("rebuno")

H = TypeVar("H", bound=Callable[..., Awaitable[Any]])

DEFAULT_BASE_URL = "http://localhost:8080"


def heartbeat_interval(lease_timeout_seconds: float) -> float:
    """At least every `min(30 s, lease / 3)` (docs/protocol/sdk.md §1.6)."""
    return max(0.05, min(30.0, lease_timeout_seconds / 3))


def supersede_wait(lease_timeout_seconds: float) -> float:
    """How long a superseding handler waits for the old one: `min(10 s, lease / 3)`."""
    return min(10.0, lease_timeout_seconds / 3)


def failure_reason(exc: BaseException) -> str | None:
    """The execution's failure reason for an exception escaping the handler,
    or None for a control-flow signal (the kernel's state stands)."""
    if is_signal(exc):
        return None
    if isinstance(exc, PolicyError):
        return f"policy_denied: {exc.reason}"
    if isinstance(exc, RateLimited):
        return f"rate_limited: {exc.reason}"
    if isinstance(exc, ToolError):
        return f"tool_error: {exc.tool_id}: {exc.message}"
    return f"agent_error: {type(exc).__name__}: {exc}"


@dataclass
class _Run:
    ctx: ExecutionContext
    key: DispatchKey
    task: asyncio.Task[None]


class Agent:
    """A Rebuno agent: `Agent("dev-agent").run(process, port=5000)`.

    Options fall back to the environment: `secret` to `REBUNO_AGENT_SECRET`,
    `base_url` to `REBUNO_URL` (else `http://localhost:8080`).
    `kernel_timeout` bounds each agent→kernel request.
    """

    def __init__(self, agent_id: str, *, secret: str | None = None, base_url: str | None = None,
                 webhook_path: str = "/webhook", kernel_timeout: float = 35.0,
                 _kernel_transport: httpx2.AsyncBaseTransport | None = None) -> None:
        if not isinstance(agent_id, str) or not agent_id:
            raise ValueError("agent_id must be a non-empty string")
        secret = secret if secret is not None else os.environ.get("REBUNO_AGENT_SECRET")
        if not secret:
            raise ValueError("an agent secret is required: pass secret= or set REBUNO_AGENT_SECRET")
        if not webhook_path.startswith("/"):
            raise ValueError("webhook_path must start with '/'")
        if kernel_timeout <= 0:
            raise ValueError("kernel_timeout must be positive")
        self.agent_id = agent_id
        self.base_url = (base_url or os.environ.get("REBUNO_URL") or DEFAULT_BASE_URL).rstrip("/")
        self.webhook_path = webhook_path
        self.kernel_timeout = kernel_timeout
        self._secret = secret
        self._kernel = KernelClient(self.base_url, agent_id, secret, timeout=kernel_timeout,
                                    transport=_kernel_transport)
        self._tracker = DispatchTracker()
        self._running: dict[str, _Run] = {}
        self._tasks: set[asyncio.Task[None]] = set()
        self._handler: Callable[..., Awaitable[Any]] | None = None
        self._binding: Binding | None = None
        self._closing = False
        self._metadata_published = False
        self._metadata_retry: asyncio.Task[None] | None = None
        self.app: FastAPI = self._build_app()

    # ------------------------------------------------------------ public

    def bind(self, handler: H) -> H:
        """Attach the handler (an async function); returns it unchanged."""
        if not callable(handler):
            raise TypeError("the handler must be an async function")
        if not is_async_callable(handler):
            raise TypeError("the handler must be an async function (async def)")
        self._binding = bind_handler(handler)
        self._handler = handler
        return handler

    def run(self, handler: Callable[..., Awaitable[Any]], *, host: str = "127.0.0.1", port: int = 8000,
            log_level: str = "info", **uvicorn_options: Any) -> None:
        """Bind the handler and serve the webhook with uvicorn. Blocks."""
        self.bind(handler)
        uvicorn.run(self.app, host=host, port=port, log_level=log_level, **uvicorn_options)

    async def join(self) -> None:
        """Wait for every in-flight handler to finish (best-effort)."""
        while self._tasks:
            await asyncio.gather(*list(self._tasks), return_exceptions=True)

    async def close(self) -> None:
        """Cancel in-flight handlers (reporting nothing for them: their leases
        lapse and the kernel redelivers) and close the kernel client."""
        self._closing = True
        try:
            for run in list(self._running.values()):
                run.ctx.stop("closed")
                run.task.cancel()
            await self.join()
        finally:
            await self._kernel.aclose()
            self._closing = False

    @property
    def running(self) -> dict[str, tuple[str, int | None]]:
        """Execution id → (dispatch id, attempt) of each handler running now."""
        return {eid: (r.key.dispatch_id, r.key.attempt) for eid, r in self._running.items() if not r.task.done()}

    # --------------------------------------------------------------- app

    def _build_app(self) -> FastAPI:
        @contextlib.asynccontextmanager
        async def lifespan(_: FastAPI) -> AsyncIterator[None]:
            publisher = asyncio.create_task(self._publish_metadata())
            try:
                yield
            finally:
                publisher.cancel()
                await self.close()

        app = FastAPI(lifespan=lifespan, title=f"rebuno agent {self.agent_id}", docs_url=None, redoc_url=None,
                      openapi_url=None)
        app.add_api_route(self.webhook_path, self._webhook, methods=["POST"], include_in_schema=False)
        return app

    async def _publish_metadata(self) -> None:
        """Publish the handler's docstring and input schema (docs/protocol/governance.md §4.4), once per
        process. Tried at start-up and again on the first webhook, which
        proves that the agent is registered by then."""
        if self._binding is None or self._metadata_published:
            return
        try:
            await self._kernel.put_metadata(description=inspect.getdoc(self._handler),
                                            input_schema=self._binding.json_schema())
            self._metadata_published = True
        except (RebunoError, httpx2.HTTPError) as e:
            log.debug("rebuno: could not publish agent metadata: %s", e)

    async def _webhook(self, request: Request) -> JSONResponse:
        try:
            delivery = await receive(request, self._secret)
        except Refused as refused:
            return refused.response()
        if self._handler is None or self._closing:
            # Not ready: a failed delivery is retried by the kernel.
            return JSONResponse({"code": "unavailable", "message": "agent has no handler"}, status_code=503)
        eid, key = delivery.execution_id, delivery.key
        if not self._tracker.offer(eid, key):
            log.debug("rebuno: ignoring webhook %s attempt %s of %s (not newer)", key.dispatch_id, key.attempt, eid)
            return JSONResponse({"status": "ignored"})
        self._start(eid, key, delivery.lease_seconds)
        if not self._metadata_published and self._metadata_retry is None:
            self._metadata_retry = asyncio.create_task(self._publish_metadata())
        return JSONResponse({"status": "accepted"})

    # ---------------------------------------------------------- dispatch

    def _start(self, execution_id: str, key: DispatchKey, lease_seconds: float) -> None:
        previous = self._running.get(execution_id)
        lease = Lease(key.dispatch_id, key.attempt, LeaseClock(lease_seconds))
        ctx = ExecutionContext(execution_id=execution_id, agent_id=self.agent_id, dispatch_id=key.dispatch_id,
                               dispatch_attempt=key.attempt, lease_timeout_seconds=lease_seconds,
                               kernel=self._kernel, lease=lease)
        if previous is not None and not previous.task.done():
            log.info("rebuno: dispatch %s attempt %s supersedes the running handler of %s",
                     key.dispatch_id, key.attempt, execution_id)
            previous.ctx.stop("lease_superseded")
            previous.task.cancel()
        task = asyncio.get_running_loop().create_task(self._dispatch(ctx, previous))
        run = _Run(ctx, key, task)
        self._running[execution_id] = run
        self._tasks.add(task)

        def done(t: asyncio.Task[None]) -> None:
            self._tasks.discard(t)
            if self._running.get(execution_id) is run:
                del self._running[execution_id]
            self._tracker.finished(execution_id, key, lease_seconds)
            if not t.cancelled() and t.exception() is not None:
                log.error("rebuno: dispatch of %s crashed", execution_id, exc_info=t.exception())

        task.add_done_callback(done)

    async def _dispatch(self, ctx: ExecutionContext, previous: _Run | None) -> None:
        handler_task = asyncio.current_task()
        assert handler_task is not None
        beat = asyncio.create_task(self._heartbeat(ctx, handler_task))
        try:
            if previous is not None and not previous.task.done():
                await asyncio.wait({previous.task}, timeout=supersede_wait(ctx.lease_timeout_seconds))
            token = _set(ctx)
            try:
                await self._execute(ctx)
            finally:
                _reset(token)
        except Terminated as t:
            log.info("rebuno: dispatch %s of %s stopped: %s", ctx.dispatch_id, ctx.execution_id, t.reason)
        except APIError as e:
            log.error("rebuno: dispatch %s of %s: kernel refused a request: %s", ctx.dispatch_id,
                      ctx.execution_id, e)
        finally:
            try:
                # A finished step's outcome still waiting for a carrier is sent
                # alone: whatever ended the dispatch, its effect ran.
                await ctx.outbox.flush()
            finally:
                beat.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await beat

    async def _heartbeat(self, ctx: ExecutionContext, handler_task: asyncio.Task[None]) -> None:
        interval = heartbeat_interval(ctx.lease_timeout_seconds)
        loop = asyncio.get_running_loop()
        next_beat = loop.time() + interval
        while True:
            await asyncio.sleep(max(0.0, next_beat - loop.time()))
            next_beat = loop.time() + interval  # measured from the start of this beat
            try:
                await self._kernel.heartbeat(ctx.execution_id, ctx.lease)
            except Terminated as t:
                log.info("rebuno: heartbeat of %s: %s; stopping the handler", ctx.execution_id, t.reason)
                ctx.stop(t.reason)
                handler_task.cancel()
                return
            except (APIError, httpx2.HTTPError) as e:
                log.warning("rebuno: heartbeat of %s failed: %s", ctx.execution_id, e)

    async def _execute(self, ctx: ExecutionContext) -> None:
        assert self._handler is not None and self._binding is not None
        execution = await self._kernel.get_execution(ctx.execution_id, ctx.lease)
        if execution.terminal:
            log.debug("rebuno: execution %s is %s; nothing to do", ctx.execution_id, execution.status)
            return
        ctx.input = execution.input
        # Tool calls and local steps run one at a time from the start when the
        # execution already has resources (docs/protocol/sdk.md §4.5).
        ctx.resources.start(execution.resource_keys)
        try:
            kwargs = self._binding.bind(execution.input)
        except BindingError as e:
            await self._finish(ctx, reason=e.reason)
            return
        try:
            output = await self._handler(**kwargs)
        except asyncio.CancelledError:
            raise
        except Exception as exc:
            await self._handler_failed(ctx, exc)
            return
        if ctx.signal is not None:
            self._log_signal(ctx, ctx.signal)
            return
        if isinstance(output, BaseModel):
            output = output.model_dump(mode="json")
        try:
            text = encode_result(output)
        except TypeError as e:
            await self._finish(ctx, reason=f"output is not JSON-serializable: {e}")
            return
        except ValueError:
            await self._finish(ctx, reason="output is not JSON-serializable: float")
            return
        # Completion captures of uncovered resources come before `complete`.
        await completion_captures(ctx)
        if ctx.signal is not None:
            self._log_signal(ctx, ctx.signal)
            return
        await self._finish(ctx, output_json=text)

    async def _handler_failed(self, ctx: ExecutionContext, exc: Exception) -> None:
        if ctx.signal is not None:  # a swallowed or re-raised Blocked/Terminated: the kernel's state stands
            self._log_signal(ctx, ctx.signal)
            return
        err: BaseException = exc
        try:
            raise_for_refusal(exc)
        except RebunoError as refusal:
            err = refusal
        reason = failure_reason(err)
        if reason is None:
            self._log_signal(ctx, err)
            return
        if not isinstance(err, RebunoError):
            log.error("rebuno: handler of %s raised", ctx.execution_id, exc_info=err)
        await self._finish(ctx, reason=reason)

    def _log_signal(self, ctx: ExecutionContext, signal: BaseException) -> None:
        log.info("rebuno: dispatch %s of %s ends on %s: %s", ctx.dispatch_id, ctx.execution_id,
                 type(signal).__name__, signal)

    async def _finish(self, ctx: ExecutionContext, *, output_json: str | None = None,
                      reason: str | None = None) -> None:
        recorded = await ctx.finish(output_json=output_json, reason=reason)
        if not recorded:
            log.info("rebuno: execution %s was already terminal", ctx.execution_id)

