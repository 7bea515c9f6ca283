"""(e) The published client's bearer ``Client`` against the kernel: create (with
``input``), get, events (``after_seq``/``limit``), list and get steps, cancel, and
the error codes it branches on (docs/protocol/conformance.md §2.1 item 5). Every answer is
parsed by the client's own pydantic models, which refuse ``null`` where they expect
a string, integer or list (docs/protocol/conformance.md §2.1 item 4), so a parse failure fails the test."""

from __future__ import annotations

import asyncio
import uuid

import pytest
from rebuno import Client, NotFoundError, Terminated, ValidationError
from rebuno.types import Event, Execution, Step

from kernel_harness import parse_with_models

AGENT = "first-run"
GATED = "gated-agent"


async def _wait(client: Client, eid: str, *statuses: str, timeout: float = 30.0) -> Execution:
    deadline = asyncio.get_running_loop().time() + timeout
    while True:
        ex = await client.get(eid)
        if ex.status in statuses:
            return ex
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"execution {eid} is {ex.status}, want {statuses}")
        await asyncio.sleep(0.01)


async def test_client_reads_a_finished_run(kernel, spawn_agent):
    spawn_agent("first_run.py", AGENT)
    # The kernel runs without a bearer token: whatever api_key the client sends
    # is ignored (docs/protocol/auth.md §2).
    async with Client(base_url=kernel.url, api_key="any-token-is-ignored") as client:
        created = await client.create(AGENT, {"topic": "client"}, on_behalf_of="alice@example.com")
        assert isinstance(created, Execution)
        assert created.agent_id == AGENT
        assert created.input == {"topic": "client"}
        assert created.status == "running"
        assert created.on_behalf_of == "alice@example.com"
        assert created.parent_execution_id is None and created.forked_from is None

        ex = await _wait(client, created.id, "completed", "failed", "cancelled")
        assert ex.status == "completed", ex
        assert ex.output["ticket"] == "T-0042"
        assert ex.failure_reason == ""

        events = await client.events(created.id)
        assert all(isinstance(e, Event) for e in events)
        assert [e.event_seq for e in events] == list(range(1, len(events) + 1))
        assert events[0].type == "execution.created" and events[-1].type == "execution.completed"
        assert all(e.execution_id == created.id and e.occurred_at for e in events)

        page = await client.events(created.id, after_seq=3, limit=2)
        assert [e.event_seq for e in page] == [4, 5]
        assert [(e.type, e.payload) for e in page] == [(e.type, e.payload) for e in events[3:5]]
        tail = await client.events(created.id, after_seq=len(events) - 1)
        assert [e.type for e in tail] == ["execution.completed"]
        assert await client.events(created.id, after_seq=len(events)) == []

        steps = await client.list_steps(created.id)
        assert all(isinstance(s, Step) for s in steps)
        assert [(s.kind, s.target, s.status) for s in steps] == [
            ("tool_call", "search", "succeeded"),
            ("local", "ticket", "succeeded"),
            ("tool_call", "send_email", "succeeded"),
        ]
        assert [s.target for s in await client.list_steps(created.id, status="terminal")] == [
            "search",
            "ticket",
            "send_email",
        ]
        assert await client.list_steps(created.id, status="pending") == []
        assert [s.target for s in await client.list_steps(created.id, status="succeeded")] == [
            "search",
            "ticket",
            "send_email",
        ]

        one = await client.get_step(created.id, steps[2].step_id)
        assert one == steps[2]
        assert one.idempotency == "at_most_once" and one.result["to"] == "ops@example.com"
        assert one.args == {"to": "ops@example.com", "subject": "T-0042: client #1"}

        # Create idempotency (docs/protocol/executions.md §2): the same key and body answer the first execution.
        a = await client.create(AGENT, {"topic": "again"}, idempotency_key="compat-key-1")
        b = await client.create(AGENT, {"topic": "again"}, idempotency_key="compat-key-1")
        assert a.id == b.id and a.idempotency_key == "compat-key-1"
        await _wait(client, a.id, "completed")

        # Error codes the client maps to its exceptions.
        with pytest.raises(NotFoundError):
            await client.get(str(uuid.uuid4()))
        with pytest.raises(NotFoundError):
            await client.get_step(created.id, "0" * 64)
        with pytest.raises(NotFoundError):
            await client.create("no-such-agent", {})
        with pytest.raises(ValidationError):
            # Sessions are not offered by this kernel (docs/protocol/conformance.md §2.2).
            await client.create(AGENT, {"topic": "x"}, session="s-1")
        with pytest.raises(ValidationError):
            await client.get("not-a-uuid")

    parse_with_models(kernel, created.id)


async def test_client_cancel_stops_the_handler(kernel, spawn_agent, records, gates):
    agent = spawn_agent("gated_agent.py", GATED)
    async with Client(base_url=kernel.url) as client:
        created = await client.create(GATED, {"x": 5})
        await asyncio.to_thread(records.wait, "gate:attempt1")
        running = await client.get(created.id)
        assert running.status == "running"
        assert [s.status for s in await client.list_steps(created.id)] == ["succeeded"]

        await client.cancel(created.id)
        ex = await client.get(created.id)
        assert ex.status == "cancelled"
        assert ex.failure_reason == "client_cancelled"
        # A second cancel is refused with execution_terminal, which the client
        # raises as Terminated.
        with pytest.raises(Terminated):
            await client.cancel(created.id)

        # The handler goes on, learns from its next submit that the execution is
        # over, and stops without running the body or reporting anything.
        gates.release("attempt1")
        stopped = await asyncio.to_thread(records.wait, "handler:exit", pid=agent.pid)
        assert stopped[0]["outcome"] == "raised" and stopped[0]["error"] == "Terminated"
        assert records.count("tool:two") == 0

        events = await client.events(created.id, limit=1000)
        types = [e.type for e in events]
        assert types[-1] == "execution.cancelled"
        assert events[-1].payload["reason"] == "client_cancelled"
        assert types.count("step.proposed") == 1
        assert (await client.get(created.id)).status == "cancelled"

    parse_with_models(kernel, created.id)
