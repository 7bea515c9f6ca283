"""The ambient execution context of a running handler, and `execution()`.

`Agent` creates one `ExecutionContext` per dispatch attempt and runs the
handler under it (a `ContextVar`, so tasks the handler spawns inherit it).
`@tool`, `step()` and `http_client()` find it there and submit their steps
through it. It also keeps:

* the **sticky signal**: the first `Blocked` or `Terminated` any step met. A
  handler that swallows it still ends its dispatch correctly, because `Agent`
  reads it here; every later step re-raises it without contacting the kernel;
* the **occurrence counters** of this attempt (docs/protocol/identity.md §6, §7): calls
  with the same identity are submitted one at a time, in the order they
  started, each with the occurrence the SDK expects;
* the **outbox**: a step outcome waiting to travel with the next submit or
  with the execution's end (docs/protocol/steps.md §13, `_outbox.py`).
"""

from __future__ import annotations

import asyncio
import contextvars
import json
from typing import Any

from ._kernel import KernelClient, Lease
from ._outbox import Outbox
from ._resource_state import ResourceState
from .errors import Blocked, RebunoError, Terminated, decision_error
from .identity import args_hash
from .types import Decision, DecisionKind

__all__ = ["ExecutionContext", "execution", "current_context", "require_context"]

_current: contextvars.ContextVar[ExecutionContext | None] = contextvars.ContextVar("rebuno_execution", default=None)
# The step whose body is running (set by the effect protocol around each body).
_step: contextvars.ContextVar[str | None] = contextvars.ContextVar("rebuno_step", default=None)

_Identity = tuple[str, str, str]
# Decisions a submit raises itself: they stop the whole dispatch, not one call.
_SIGNAL_DECISIONS = frozenset({DecisionKind.BLOCKED, DecisionKind.EXECUTION_BLOCKED, DecisionKind.EXECUTION_TERMINAL})


class ExecutionContext:
    """One dispatch attempt of one execution, as seen by the handler."""

    def __init__(self, *, execution_id: str, agent_id: str, dispatch_id: str, dispatch_attempt: int | None,
                 lease_timeout_seconds: float, kernel: KernelClient, lease: Lease) -> None:
        self.execution_id = execution_id
        self.agent_id = agent_id
        self.dispatch_id = dispatch_id
        self.dispatch_attempt = dispatch_attempt
        self.lease_timeout_seconds = lease_timeout_seconds
        self.input: Any = None
        self.kernel = kernel
        self.lease = lease
        self.signal: Blocked | Terminated | None = None
        # Set when the dispatch itself is being stopped (superseded, closed,
        # terminal): a cancelled body then reports no outcome (docs/protocol/sdk.md §1.8).
        self.stopping = False
        self._counters: dict[_Identity, int] = {}
        self._tails: dict[_Identity, asyncio.Future[None]] = {}
        # Resources opened in this dispatch, generations and the step lock.
        self.resources = ResourceState()
        self.outbox = Outbox(self)

    @property
    def step_id(self) -> str | None:
        """The id of the step whose body is running here (a tool, local step or
        MCP tool body), else None. Stable across attempts: pass it to providers
        as an idempotency key (docs/protocol/steps.md §6)."""
        return _step.get()

    # ------------------------------------------------------------ signals

    def record_signal(self, exc: Blocked | Terminated) -> Blocked | Terminated:
        """Remember a control-flow signal; the first one wins, except that
        `Terminated` replaces `Blocked` (a terminal execution is never resumed)."""
        if self.signal is None or (isinstance(exc, Terminated) and isinstance(self.signal, Blocked)):
            self.signal = exc
        return self.signal

    def check(self) -> None:
        """Raise the sticky signal, if any."""
        if self.signal is not None:
            raise self.signal

    def terminated(self, t: Terminated) -> Blocked | Terminated:
        """Record a `Terminated` met by a request; superseded and abandoned
        attempts also stop reporting outcomes."""
        if t.reason in ("lease_superseded", "abandoned"):
            self.stopping = True
        return self.record_signal(t)

    def stop(self, reason: str) -> None:
        """Mark the dispatch as stopping (no outcome is reported from now on)."""
        self.stopping = True
        self.record_signal(Terminated(reason))

    async def flush(self) -> None:
        """Wait until the kernel has recorded the outcome of every step this
        dispatch has finished.

        A `safe_to_retry` step's outcome is sent with the next step or the
        execution's end, or alone within a few milliseconds, so a step call
        can return before its outcome is durable (docs/protocol/steps.md §13). Call this before
        handing a step's result to the outside world other than through
        another step. Raises `Terminated` when an outcome could not be
        recorded: the dispatch then stops, and the next attempt runs the step
        again or replays what was recorded.
        """
        await self.outbox.flush()
        self.check()

    # ------------------------------------------------------------- submit

    def next_occurrence(self, kind: str, target: str, hash_hex: str) -> int:
        return self._counters.get((kind, target, hash_hex), 0)

    async def submit(self, kind: str, target: str, canonical_args: str, idempotency: str,
                     resources: list[str]) -> Decision:
        """Submit a step and return its decision.

        `blocked`, `execution_blocked` and `execution_terminal` are recorded as
        the sticky signal and raised; every other decision is returned.
        """
        self.check()
        key = (kind, target, args_hash(canonical_args))
        loop = asyncio.get_running_loop()
        prev = self._tails.get(key)
        mine: asyncio.Future[None] = loop.create_future()
        self._tails[key] = mine
        try:
            if prev is not None and not prev.done():
                await asyncio.shield(prev)
            self.check()
            occurrence = self._counters.get(key, 0)
            try:
                async with self.outbox.carrying() as carried:
                    body = (submit_body(kind, target, canonical_args, idempotency, resources)
                            + (carried.carried() if carried is not None else "") + "}").encode("utf-8")
                    decision = await self.kernel.submit(self.execution_id, self.lease, body, occurrence)
            except Terminated as t:
                raise self.terminated(t) from None
            if decision.step_id is not None:
                self._counters[key] = max(self._counters.get(key, 0), occurrence + 1)
            if decision.resources:
                # Every start answers with the generations it raised (docs/protocol/sdk.md §4.6).
                self.resources.learn_entries(decision.resources)
        finally:
            self._release(key, prev, mine)
        if decision.decision in _SIGNAL_DECISIONS:
            raise self.refused(decision)
        return decision

    async def finish(self, *, output_json: str | None = None, reason: str | None = None) -> bool:
        """Complete (with `output_json`) or fail the execution, carrying the
        waiting step outcome. Returns False when the execution was already
        terminal."""
        async with self.outbox.carrying() as carried:
            return await self.kernel.finish_execution(self.execution_id, self.lease, output_json=output_json,
                                                      reason=reason, carried=carried)

    def refused(self, decision: Decision) -> RebunoError:
        """The exception for a refusing decision; `Blocked` and `Terminated`
        are recorded as the sticky signal first."""
        error = decision_error(decision)
        return self.record_signal(error) if isinstance(error, (Blocked, Terminated)) else error

    def _release(self, key: _Identity, prev: asyncio.Future[None] | None, mine: asyncio.Future[None]) -> None:
        def done(_: object = None) -> None:
            if not mine.done():
                mine.set_result(None)
            if self._tails.get(key) is mine:
                del self._tails[key]

        if prev is not None and not prev.done():
            # Cancelled while waiting: the next call must still wait for prev.
            prev.add_done_callback(done)
        else:
            done()


def submit_body(kind: str, target: str, canonical_args: str, idempotency: str, resources: list[str]) -> str:
    """A submit body (docs/protocol/steps.md §1) without its closing brace, so that a carried
    outcome can follow; the member order is the one of docs/protocol/vectors/carried-outcomes.json."""
    return ('{"kind":' + json.dumps(kind) + ',"target":' + json.dumps(target, ensure_ascii=False)
            + ',"args":' + canonical_args + ',"idempotency":' + json.dumps(idempotency)
            + ',"resources":' + json.dumps(resources))


def current_context() -> ExecutionContext | None:
    """The context of the running handler, or None outside one."""
    return _current.get()


def require_context(what: str) -> ExecutionContext:
    ctx = _current.get()
    if ctx is None:
        raise RuntimeError(f"{what} must be called inside a Rebuno handler (no active execution)")
    return ctx


def execution() -> ExecutionContext:
    """The current execution: `execution_id`, `agent_id`, `dispatch_id`,
    `dispatch_attempt`, `lease_timeout_seconds` and `input`.

    Raises `RuntimeError` outside a handler.
    """
    return require_context("execution()")


def _set(ctx: ExecutionContext | None) -> contextvars.Token[ExecutionContext | None]:
    return _current.set(ctx)


def _reset(token: contextvars.Token[ExecutionContext | None]) -> None:
    _current.reset(token)

