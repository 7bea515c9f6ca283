"""Step outcomes that travel with the next request (docs/protocol/steps.md §13, docs/protocol/sdk.md §7).

Once the kernel has advertised `carried-outcome`, the outcome of a
`safe_to_retry` step is not sent on its own: the call returns at once and the
outcome waits here, to be carried by the dispatch's next submit or by the
execution's complete or fail. One request per step instead of two, and at c1
one durable commit instead of two. At most one outcome waits at a time, and
outcomes reach the kernel in the order their steps ended (a step that ends
while another's outcome waits sends that one alone first), so a nested
step's outcome precedes its outer step's and a capture is never sent while
an earlier writer's outcome is still out. The waiting outcome is sent alone
when no carrier comes within `FLUSH_DELAY`, before any resource request, when
the handler calls `execution().flush()`, and when the dispatch ends.

Crash semantics are the protocol's: an outcome that was never recorded leaves
its step `executing`, and the next attempt runs it again, which a
`safe_to_retry` step allows. `at_most_once` steps always report synchronously.

The kernel answers a carrier only when the outcome stands as sent. When it
does not (another run of the step recorded a different outcome first), the
code has gone on with a value the log does not hold, so the dispatch stops
without reporting anything more (`Terminated("outcome_conflict")`) and the
next attempt replays the recorded value.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
from typing import TYPE_CHECKING, AsyncIterator

from ._kernel import Outcome
from .errors import APIError, Terminated
from .types import DecisionKind

if TYPE_CHECKING:
    from .execution import ExecutionContext

__all__ = ["Outbox", "FLUSH_DELAY"]

log = logging.getLogger("rebuno")

# How long an outcome may wait for a carrier before it is sent alone.
FLUSH_DELAY = 0.005


class Outbox:
    """The outcome of one dispatch waiting for a carrier."""

    def __init__(self, ctx: ExecutionContext) -> None:
        self._ctx = ctx
        self._pending: Outcome | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._alone: asyncio.Task[None] | None = None
        # Outcomes on their way inside a carrier, until its answer.
        self._carried: set[asyncio.Future[None]] = set()

    @property
    def idle(self) -> bool:
        """No outcome waits or is on its way."""
        return self._pending is None and self._alone is None and not self._carried

    def defer(self, outcome: Outcome) -> bool:
        """Keep `outcome` for the next carrier; False when it must be reported
        now (the kernel does not offer the extension, the dispatch is
        stopping, or another outcome already waits)."""
        ctx = self._ctx
        if self._pending is not None or not ctx.lease.carried_outcomes or ctx.stopping or ctx.signal is not None:
            return False
        self._pending = outcome
        self._timer = asyncio.get_running_loop().call_later(FLUSH_DELAY, self._send_pending)
        return True

    @contextlib.asynccontextmanager
    async def carrying(self) -> AsyncIterator[Outcome | None]:
        """For a carrier: the waiting outcome, None when there is none.

        An outcome already on its way alone is awaited first, so that the
        kernel records it before the carrier. When the carrier is refused
        with an error answer (`409 lease_superseded` aside, which stops the
        dispatch anyway), the outcome is sent alone before the error
        propagates: that records it, or finds it recorded (the kernel keeps a
        carried outcome when it refuses only the carrier's own part), or
        stops the dispatch, whose signal is then raised instead.
        """
        if self._alone is not None:
            await asyncio.shield(self._alone)
        outcome = self._pending
        if outcome is None:
            yield None
            return
        self._pending = None
        if self._timer is not None:
            self._timer.cancel()
            self._timer = None
        answered: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._carried.add(answered)
        try:
            yield outcome
        except APIError:
            await self._deliver(outcome)
            self._ctx.check()
            raise
        finally:
            self._carried.discard(answered)
            answered.set_result(None)

    async def flush(self) -> None:
        """Return once every outcome reported so far has been answered by the
        kernel: the waiting one is sent alone, carriers on their way are
        awaited."""
        while True:
            if self._alone is not None:
                await asyncio.shield(self._alone)
            if self._carried:
                await asyncio.shield(asyncio.gather(*self._carried))
            if self._pending is None:
                return
            self._send_pending()

    def _send_pending(self) -> None:
        self._timer = None
        if self._pending is None:
            return
        loop = asyncio.get_running_loop()
        if self._alone is not None:  # one delivery at a time, in the order the steps ended
            self._timer = loop.call_later(FLUSH_DELAY, self._send_pending)
            return
        outcome, self._pending = self._pending, None
        self._alone = loop.create_task(self._deliver_alone(outcome))

    async def _deliver_alone(self, outcome: Outcome) -> None:
        """`_deliver` as the task `_alone`, which it clears before it ends.

        Cleared inside the task, not by a done callback: a done callback runs
        an event-loop turn later, and awaiting a finished task does not
        yield, so `flush` would find the same finished task again and again
        without the loop ever turning (an endless loop that schedules a timer
        per turn: a 24 GB test process under load)."""
        try:
            await self._deliver(outcome)
        finally:
            if self._alone is asyncio.current_task():
                self._alone = None

    async def _deliver(self, outcome: Outcome) -> None:
        """Send `outcome` through its own route (docs/protocol/steps.md §10). Any answer but
        `recorded` or a replay of the same value stops the dispatch: the code
        went on with a value the log may not hold. Never raises."""
        ctx = self._ctx
        try:
            decision = await ctx.kernel.step_outcome(ctx.execution_id, ctx.lease, outcome)
        except Terminated as t:
            ctx.terminated(t)
            return
        except APIError as e:
            log.warning("rebuno: the outcome of step %s was not recorded (%s); stopping the dispatch",
                        outcome.step_id, e)
            ctx.stop("abandoned")
            return
        except Exception as e:  # a background delivery must not raise
            log.error("rebuno: could not deliver the outcome of step %s", outcome.step_id, exc_info=e)
            ctx.stop("abandoned")
            return
        if decision.decision == DecisionKind.RECORDED:
            return
        if decision.decision == DecisionKind.EXECUTION_TERMINAL:
            ctx.record_signal(Terminated("execution_terminal"))
            return
        stored = decision.result if outcome.succeeded else decision.error
        kept = decision.has_result if outcome.succeeded else decision.has_error
        if decision.decision == DecisionKind.REPLAY and kept and stored == json.loads(outcome.value_json):
            return
        log.warning("rebuno: step %s was recorded with another outcome than the one this handler went on with; "
                    "stopping the dispatch so that the next attempt replays it", outcome.step_id)
        ctx.stop("outcome_conflict")
