"""Carried outcomes against the real kernel (docs/protocol/steps.md §13, docs/protocol/sdk.md §7):
one request per step, a waiting outcome sent alone when no step follows,
`flush()`, `at_most_once` steps reported before they return, and a dispatch
that stops when another run recorded a step differently."""

from __future__ import annotations

import asyncio
import re
from typing import Any

import httpx2

from rebuno import Agent, Terminated, execution, tool

from .harness import KernelProcess, eventually, register, serve_agent

SECRET = "carried-secret-0123456789"


async def outcome_counts(kernel: KernelProcess) -> dict[str, float]:
    """`rebuno_step_outcomes_total` by route."""
    async with httpx2.AsyncClient() as c:
        text = (await c.get(kernel.url + "/metrics")).text
    return {m.group(1): float(m.group(2)) for m in re.finditer(r'rebuno_step_outcomes_total\{route="(\w+)"\} (\S+)', text)}


async def test_each_step_costs_one_request(kernel_proc: KernelProcess) -> None:
    agent = Agent("one-trip", secret=SECRET, base_url=kernel_proc.url)

    @tool("double")
    async def double(n: int) -> int:
        return 2 * n

    @agent.bind
    async def process(n: int) -> int:
        for _ in range(3):
            n = await double(n)
        return n

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "one-trip", served.url + "/webhook", SECRET)
        before = await outcome_counts(kernel_proc)
        ex = await client.create("one-trip", {"n": 1})
        done = await client.wait(ex.id, timeout=30)
        events = await client.all_events(ex.id)
        after = await outcome_counts(kernel_proc)
    assert (done.status, done.output) == ("completed", 8)
    # Two outcomes rode on the next submit, the last on the complete; none went alone.
    assert after["carried"] - before["carried"] == 3 and after["separate"] == before["separate"]
    # Each outcome shares its transaction with what carried it.
    for i, e in enumerate(events):
        if e.type == "step.succeeded":
            follower = events[i + 1]
            assert follower.type in ("step.proposed", "execution.completed")
            assert follower.occurred_at == e.occurred_at


async def test_an_outcome_with_no_step_after_it_goes_alone(kernel_proc: KernelProcess) -> None:
    agent = Agent("lone", secret=SECRET, base_url=kernel_proc.url)
    reached, release = asyncio.Event(), asyncio.Event()

    @tool("fetch")
    async def fetch() -> str:
        return "page"

    @agent.bind
    async def process() -> str:
        page = await fetch()
        reached.set()
        await release.wait()  # no step follows for a while
        return page

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "lone", served.url + "/webhook", SECRET)
        before = await outcome_counts(kernel_proc)
        ex = await client.create("lone", None)
        await asyncio.wait_for(reached.wait(), 20)
        # The handler is parked: the outcome was sent alone, not carried.
        steps = await eventually(lambda: _succeeded(client, ex.id), what="fetch's outcome to be recorded")
        assert [(s.target, s.result) for s in steps] == [("fetch", "page")]
        assert (await outcome_counts(kernel_proc))["separate"] == before["separate"] + 1
        release.set()
        done = await client.wait(ex.id, timeout=30)
    assert (done.status, done.output) == ("completed", "page")


async def _succeeded(client: Any, execution_id: str) -> Any:
    steps = await client.steps(execution_id)
    return steps if steps and all(s.status == "succeeded" for s in steps) else None


async def test_flush_and_at_most_once_make_outcomes_durable_before_the_code_goes_on(
        kernel_proc: KernelProcess) -> None:
    agent = Agent("durable", secret=SECRET, base_url=kernel_proc.url)
    seen: dict[str, list[tuple[str, str]]] = {}

    @tool("quote")
    async def quote() -> int:
        return 42

    @tool("charge", idempotency="at_most_once")
    async def charge(amount: int) -> str:
        return f"charged {amount}"

    @agent.bind
    async def process() -> str:
        eid = execution().execution_id
        async with kernel_proc.client() as client:
            amount = await quote()
            await execution().flush()
            seen["after flush"] = [(s.target, s.status) for s in await client.steps(eid)]
            receipt = await charge(amount)
            seen["after charge"] = [(s.target, s.status) for s in await client.steps(eid)]
        return receipt

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "durable", served.url + "/webhook", SECRET)
        ex = await client.create("durable", None)
        done = await client.wait(ex.id, timeout=30)
    assert (done.status, done.output) == ("completed", "charged 42")
    assert seen == {"after flush": [("quote", "succeeded")],
                    "after charge": [("quote", "succeeded"), ("charge", "succeeded")]}


async def test_a_step_recorded_differently_stops_the_dispatch(kernel_proc: KernelProcess) -> None:
    """Attempt 1 (agent process one) runs `pick` and is superseded while its
    body runs; attempt 2 (process two) runs `pick` again. Attempt 1's outcome
    is recorded first ("one"); attempt 2's carrier holds "two", which the log
    does not: it is refused, attempt 2 stops without starting `use("two")`,
    and attempt 3 replays "one"."""
    one = Agent("picker", secret=SECRET, base_url=kernel_proc.url)
    two = Agent("picker", secret=SECRET, base_url=kernel_proc.url)
    started = {1: asyncio.Event(), 2: asyncio.Event()}
    gates = {1: asyncio.Event(), 2: asyncio.Event()}
    stopped: list[str] = []

    @tool("pick")
    async def pick() -> str:
        attempt = execution().dispatch_attempt
        assert attempt in (1, 2), "a recorded pick must replay"
        started[attempt].set()
        await gates[attempt].wait()
        return "one" if attempt == 1 else "two"

    @tool("use")
    async def use(value: str) -> str:
        return f"used {value}"

    async def process() -> dict[str, str]:
        value = await pick()
        try:
            return {"value": value, "used": await use(value)}
        except Terminated as t:
            stopped.append(f"{execution().dispatch_attempt}:{t.reason}")
            raise

    one.bind(process)
    two.bind(process)
    async with serve_agent(one) as first, serve_agent(two) as second, kernel_proc.client() as client:
        await register(kernel_proc, "picker", first.url + "/webhook", SECRET)
        ex = await client.create("picker", None)
        await asyncio.wait_for(started[1].wait(), 20)
        await register(kernel_proc, "picker", second.url + "/webhook", SECRET)
        await kernel_proc.advance(121)  # attempt 1's lease lapses; attempt 2 goes to process two
        await asyncio.wait_for(started[2].wait(), 20)
        gates[1].set()  # the superseded attempt's outcome is recorded; its carrier's submit is refused
        recorded = await eventually(lambda: _succeeded(client, ex.id), what="attempt 1's pick to be recorded")
        assert [(s.target, s.result) for s in recorded] == [("pick", "one")]
        gates[2].set()
        await eventually(lambda: "2:outcome_conflict" in stopped, what="attempt 2 to stop")
        assert [s.target for s in await client.steps(ex.id)] == ["pick"]  # use("two") never started
        await kernel_proc.advance(121)  # attempt 3 replays pick's recorded value
        done = await client.wait(ex.id, timeout=30)
        steps = await client.steps(ex.id)
    assert stopped == ["1:lease_superseded", "2:outcome_conflict"]
    assert (done.status, done.output) == ("completed", {"value": "one", "used": "used one"})
    assert [(s.target, s.args) for s in steps] == [("pick", {}), ("use", {"value": "one"})]
