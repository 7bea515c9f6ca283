"""`Client.wait` and `Client.run` against the real kernel: a result costs one
request held by the kernel (docs/protocol/executions.md §3.1), never a polling
loop; failures and cancellations raise `ExecutionFailedError`."""

from __future__ import annotations

import asyncio
from typing import Any, AsyncIterator

import httpx2
import pytest

from rebuno import Agent, Client, ExecutionFailedError, tool

from .harness import KernelProcess, Served, register, serve_agent

SECRET = "wait-secret-0123456789"


class Recording(httpx2.AsyncBaseTransport):
    """A real transport that records every request it sends and can
    announce when the n-th one has been sent."""

    def __init__(self) -> None:
        self.inner = httpx2.AsyncHTTPTransport()
        self.requests: list[httpx2.Request] = []
        self.sent = asyncio.Condition()

    async def handle_async_request(self, request: httpx2.Request) -> httpx2.Response:
        self.requests.append(request)
        async with self.sent:
            self.sent.notify_all()
        return await self.inner.handle_async_request(request)

    async def until(self, n: int) -> None:
        async with self.sent:
            await asyncio.wait_for(self.sent.wait_for(lambda: len(self.requests) >= n), 20)

    async def aclose(self) -> None:
        await self.inner.aclose()

    def calls(self) -> list[tuple[str, str, str | None]]:
        return [(r.method, r.url.path, r.url.params.get("wait")) for r in self.requests]


def gated_agent(kernel: KernelProcess, agent_id: str) -> tuple[Agent, asyncio.Event]:
    """An agent that returns `{"doubled": 2n}`; with `gated` it first runs a
    tool that waits for the gate, with `fail` it raises."""
    agent = Agent(agent_id, secret=SECRET, base_url=kernel.url)
    gate = asyncio.Event()

    @tool("gate")
    async def wait_gate() -> str:
        await gate.wait()
        return "open"

    @agent.bind
    async def process(n: int, gated: bool = False, fail: bool = False) -> dict[str, Any]:
        if gated:
            await wait_gate()
        if fail:
            raise RuntimeError("asked to fail")
        return {"doubled": n * 2}

    return agent, gate


async def served(kernel: KernelProcess, agent: Agent) -> AsyncIterator[Served]:
    async with serve_agent(agent) as s:
        await register(kernel, agent.agent_id, s.url + "/webhook", SECRET)
        yield s


async def test_run_is_one_request(kernel_proc: KernelProcess) -> None:
    agent, gate = gated_agent(kernel_proc, "doubler")
    gate.set()
    rec = Recording()
    async for _ in served(kernel_proc, agent):
        async with Client(kernel_proc.url, transport=rec) as client:
            assert await client.run("doubler", {"n": 21}) == {"doubled": 42}
            assert rec.calls() == [("POST", "/v0/executions", "30000ms")]
            # A fixed key makes a retried run wait on the same execution.
            assert await client.run("doubler", {"n": 1}, idempotency_key="run-key") == {"doubled": 2}
            assert await client.run("doubler", {"n": 1}, idempotency_key="run-key") == {"doubled": 2}
            page = await client.list(agent_id="doubler")
            assert len(page.executions) == 2


async def test_run_raises_when_the_execution_fails_or_is_cancelled(kernel_proc: KernelProcess) -> None:
    agent, gate = gated_agent(kernel_proc, "failing")
    async for _ in served(kernel_proc, agent):
        async with kernel_proc.client() as client:
            with pytest.raises(ExecutionFailedError) as failed:
                await client.run("failing", {"n": 1, "fail": True})
            err = failed.value
            assert err.status == "failed" and err.reason and "asked to fail" in err.reason
            assert err.execution.id == err.execution_id and err.execution.status == "failed"
            assert err.execution_id in str(err)

            running = asyncio.create_task(client.run("failing", {"n": 1, "gated": True}))
            page = None
            while not page or not page.executions:  # the run's create is the only execution left running
                page = await client.list(agent_id="failing", status="running")
            await client.cancel(page.executions[0].id)
            with pytest.raises(ExecutionFailedError) as cancelled:
                await running
            assert (cancelled.value.status, cancelled.value.reason) == ("cancelled", "client_cancelled")


async def test_wait_is_held_by_the_kernel(kernel_proc: KernelProcess) -> None:
    agent, gate = gated_agent(kernel_proc, "slow")
    rec = Recording()
    async for _ in served(kernel_proc, agent):
        async with Client(kernel_proc.url, transport=rec) as client:
            ex = await client.create("slow", {"n": 5, "gated": True})
            # The wait runs out: one request, held, then TimeoutError.
            before = len(rec.requests)
            with pytest.raises(TimeoutError, match=ex.id):
                await client.wait(ex.id, timeout=0.3)
            assert rec.calls()[before:] == [("GET", f"/v0/executions/{ex.id}", "300ms")]
        # A long wait is a sequence of held requests: with 50 ms slices, the
        # gate opens once three of them have been sent.
        rec = Recording()
        async with Client(kernel_proc.url, transport=rec, wait_slice=0.05) as client:
            waiting = asyncio.create_task(client.wait(ex.id))
            await rec.until(3)
            gate.set()
            done = await asyncio.wait_for(waiting, 20)
            assert done.status == "completed" and done.output == {"doubled": 10}
            calls = rec.calls()
            assert len(calls) >= 3 and all(c == ("GET", f"/v0/executions/{ex.id}", "50ms") for c in calls)
            # A terminal execution: one request, answered at once.
            assert (await client.wait(ex.id)).output == {"doubled": 10}
            assert len(rec.requests) == len(calls) + 1


def test_wait_slice_is_bounded() -> None:
    for bad in (0, -1, 61):
        with pytest.raises(ValueError):
            Client("http://kernel.test", wait_slice=bad)


async def test_wait_pauses_for_a_kernel_that_does_not_hold() -> None:
    """A kernel without waiting reads (older than them) answers at once: the
    client asks again only after a pause, never in a tight loop."""
    calls: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(request)
        return httpx2.Response(200, json={"id": "e1", "agent_id": "a", "status": "running"})

    async with Client("http://kernel.test", transport=httpx2.MockTransport(handler)) as client:
        with pytest.raises(TimeoutError):
            await client.wait("e1", timeout=1.0)
    assert 2 <= len(calls) <= 12, f"{len(calls)} requests in one second"
