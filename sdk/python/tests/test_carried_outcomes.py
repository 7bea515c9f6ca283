"""Carried outcomes on the wire (docs/protocol/steps.md §13): the bodies the
SDK writes match docs/protocol/vectors/carried-outcomes.json byte for byte
(the TypeScript SDK's tests read the same file)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from rebuno._kernel import Lease, LeaseClock, Outcome, finish_body
from rebuno.execution import ExecutionContext, submit_body
from rebuno.types import Decision, DecisionKind

from .vectors import load

CASES = load("carried-outcomes")["cases"]


def _outcome(o: dict[str, Any]) -> Outcome:
    return Outcome(o["step_id"], o["succeeded"], o["value"], o["captures"], o["capture_failures"])


@pytest.mark.parametrize("case", CASES, ids=[c["name"] for c in CASES])
def test_carrier_bodies_match_the_vectors(case: dict[str, Any]) -> None:
    outcome = _outcome(case["outcome"])
    if case["carrier"] == "submit":
        s = case["submit"]
        body = submit_body(s["kind"], s["target"], s["args"], s["idempotency"], s["resources"]) + outcome.carried() + "}"
    elif case["carrier"] == "complete":
        body = finish_body(output_json=case["output"], carried=outcome)
    else:
        body = finish_body(reason=case["reason"], carried=outcome)
    assert body == case["body"]


def test_an_outcome_alone_has_the_members_it_would_carry() -> None:
    o = _outcome(CASES[1]["outcome"])
    carried = o.carried()
    assert carried == ',"outcome":{"step_id":"' + o.step_id + '",' + o.members() + "}"
    assert o.members().startswith('"error":')


class _AnsweringKernel:
    """A kernel whose step outcome answers wait for `answer`."""

    def __init__(self) -> None:
        self.answer: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.sent: list[str] = []
        self.reached = asyncio.Event()

    async def step_outcome(self, execution_id: str, lease: Lease, outcome: Outcome) -> Decision:
        self.sent.append(outcome.step_id)
        self.reached.set()
        await self.answer
        return Decision(decision=DecisionKind.RECORDED)


async def test_flush_right_after_a_delivery_ends_sends_the_waiting_outcome(monkeypatch: pytest.MonkeyPatch) -> None:
    """Steps that end in the event-loop turn in which the outcome sent alone
    is answered: one finds that delivery finished and leaves its own outcome
    waiting, the next flushes. The flush must send the waiting outcome, not
    spin on the finished delivery (it once did, scheduling a timer per spin
    until the process ran out of memory)."""
    loop = asyncio.get_running_loop()
    timers = 0
    call_later = loop.call_later

    def counting(delay: float, callback: Any, *args: Any) -> asyncio.TimerHandle:
        nonlocal timers
        timers += 1
        assert timers < 100, "flush spins without letting the event loop turn"
        return call_later(delay, callback, *args)

    monkeypatch.setattr(loop, "call_later", counting)
    kernel = _AnsweringKernel()
    ctx = ExecutionContext(execution_id="e", agent_id="a", dispatch_id="d", dispatch_attempt=1,
                           lease_timeout_seconds=30, kernel=kernel,  # type: ignore[arg-type]
                           lease=Lease("d", 1, LeaseClock(30), carried_outcomes=True))
    outbox = ctx.outbox
    assert outbox.defer(Outcome("s1", True, "1"))
    first = asyncio.create_task(outbox.flush())  # s1 goes alone
    await asyncio.wait_for(kernel.reached.wait(), 5)
    assert kernel.sent == ["s1"]

    ended = asyncio.Event()

    async def step_ends(step_id: str) -> None:
        await ended.wait()
        await outbox.flush()
        outbox.defer(Outcome(step_id, True, "2"))

    async def step_ends_and_flushes() -> None:
        await ended.wait()
        await outbox.flush()

    tasks = [asyncio.create_task(step_ends("s2")), asyncio.create_task(step_ends_and_flushes())]
    await asyncio.sleep(0)
    # The answer and both steps' ends wake in one turn, the delivery first.
    kernel.answer.set_result(None)
    ended.set()
    await asyncio.wait_for(asyncio.gather(first, *tasks), 5)
    assert kernel.sent == ["s1", "s2"] and outbox.idle
