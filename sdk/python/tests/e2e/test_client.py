"""The bearer `Client` against the real kernel: executions, paging, cancel,
events (paged and the SSE tail), steps, agents, typed errors; and the agent's
transport retries across a kernel restart."""

from __future__ import annotations

import asyncio
import logging
import re

import httpx2
import pytest

from rebuno import (Agent, Client, ExecutionTerminalError, NotFoundError, StreamDelta, ValidationError,
                    http_client, tool)

from .harness import KernelProcess, eventually, register, serve_agent
from .scripted_llm import ScriptedLLM

SECRET = "client-secret-0123456789"
UNKNOWN = "018ff0a0-0000-7000-8000-000000000001"


async def test_executions_paging_cancel_and_errors(kernel_proc: KernelProcess) -> None:
    async with kernel_proc.client() as client:
        # An agent whose webhook nobody serves: executions stay running.
        await client.register_agent("idle", "http://127.0.0.1:9/webhook", SECRET, lease_timeout_seconds=300)
        agents = await client.agents()
        assert [a.id for a in agents] == ["idle"] and agents[0].lease_timeout_seconds == 300
        assert "secret" not in agents[0].model_dump()
        created = [await client.create("idle", {"i": i}, on_behalf_of="tester") for i in range(5)]
        assert all(e.status == "running" and e.on_behalf_of == "tester" for e in created)
        # Same idempotency key: the first execution, not a second one.
        again = await client.create("idle", {"i": 0}, idempotency_key="key-1")
        same = await client.create("idle", {"i": 0}, idempotency_key="key-1")
        assert same.id == again.id and same.idempotency_key == "key-1"
        page = await client.list(agent_id="idle", limit=4)
        assert len(page.executions) == 4 and page.next_cursor is not None
        rest = await client.list(agent_id="idle", limit=4, cursor=page.next_cursor)
        assert len(rest.executions) == 2 and rest.next_cursor is None
        ids = [e.id async for e in client.iter_executions(agent_id="idle", page_size=2)]
        assert ids == [e.id for e in page.executions + rest.executions]
        assert ids == sorted(ids, reverse=True)
        got = await client.get(created[2].id)
        assert got.input == {"i": 2} and got.resource_keys == []
        await client.cancel(created[2].id)
        got = await client.get(created[2].id)
        assert (got.status, got.failure_reason, got.terminal) == ("cancelled", "client_cancelled", True)
        with pytest.raises(ExecutionTerminalError) as e:
            await client.cancel(created[2].id)
        assert e.value.status == 409 and e.value.code == "execution_terminal"
        with pytest.raises(NotFoundError):
            await client.get(UNKNOWN)
        with pytest.raises(NotFoundError):
            await client.create("nobody", None)
        with pytest.raises(ValidationError) as v:
            await client.get("not-a-uuid")
        assert v.value.status == 400
        with pytest.raises(ValidationError):
            await client.list(status="sleeping")
        # Events: paged and complete.
        events = await client.events(created[2].id, limit=2)
        assert [e.event_seq for e in events] == [1, 2]
        all_events = await client.all_events(created[2].id)
        assert all_events[-1].type == "execution.cancelled"
        assert [e.event_seq for e in all_events] == list(range(1, len(all_events) + 1))
        # The SSE tail of a terminal execution replays the backlog and ends.
        tailed = [e async for e in client.stream_events(created[2].id)]
        assert [e.event_seq for e in tailed] == [e.event_seq for e in all_events]
        assert [e async for e in client.stream_events(created[2].id, after_seq=all_events[-1].event_seq)] == []
        assert await client.health()


async def test_event_tail_follows_a_live_execution(kernel_proc: KernelProcess) -> None:
    agent = Agent("tailed", secret=SECRET, base_url=kernel_proc.url)
    gate = asyncio.Event()

    @tool("wait_for_gate")
    async def wait_for_gate() -> str:
        await gate.wait()
        return "open"

    @agent.bind
    async def process() -> str:
        return str(await wait_for_gate())

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "tailed", served.url + "/webhook", SECRET)
        ex = await client.create("tailed", None)
        seen: list[str] = []

        async def tail() -> None:
            async for e in client.stream_events(ex.id):
                seen.append(e.type)
                if e.type == "step.executing":
                    gate.set()  # release the tool once the tail has seen it start

        await asyncio.wait_for(tail(), 20)
        assert seen[0] == "execution.created" and seen[-1] == "execution.completed"
        assert "step.succeeded" in seen
        steps = await client.steps(ex.id, status="terminal")
        assert len(steps) == 1 and (await client.step(ex.id, steps[0].step_id)).result == "open"
        with pytest.raises(NotFoundError):
            await client.step(ex.id, "0" * 64)


async def test_live_deltas_of_a_streamed_llm_call(kernel_proc: KernelProcess, llm: tuple[ScriptedLLM, str]) -> None:
    import openai

    server, url = llm
    agent = Agent("streamer", secret=SECRET, base_url=kernel_proc.url)
    listening, all_seen = asyncio.Event(), asyncio.Event()

    @agent.bind
    async def process(prompt: str) -> str:
        await listening.wait()
        client = openai.AsyncOpenAI(api_key="t", base_url=url, http_client=http_client())
        stream = await client.chat.completions.create(model="m", stream=True,
                                                      messages=[{"role": "user", "content": prompt}])
        text = "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])
        # Stay running until the consumer has every delta: the kernel closes the
        # delta stream when the execution ends.
        await asyncio.wait_for(all_seen.wait(), 20)
        return text

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "streamer", served.url + "/webhook", SECRET)
        ex = await client.create("streamer", {"prompt": "a fairly long prompt to stream back"})
        deltas: list[StreamDelta] = []

        async def consume() -> None:
            async for d in client.stream_deltas(ex.id):
                deltas.append(d)
                if "".join(x.data for x in sorted(deltas, key=lambda x: x.seq)).endswith("data: [DONE]\n\n"):
                    all_seen.set()

        consumer = asyncio.create_task(consume())
        # The delta stream keeps no backlog: start the LLM call once the kernel counts the consumer.
        await eventually(lambda: _delta_streams(kernel_proc), what="delta consumer connected")
        listening.set()
        done = await client.wait(ex.id, timeout=20)
        await asyncio.wait_for(consumer, 20)  # the kernel closes the stream when the execution ends
        assert done.output == "echo: a fairly long prompt to stream back"
        (llm_step,) = await client.steps(ex.id)
        assert deltas, "no live delta arrived"
        assert {d.step_id for d in deltas} == {llm_step.step_id}
        text = "".join(d.data for d in sorted(deltas, key=lambda d: d.seq))
        assert text == llm_step.result["body"]


async def test_step_complete_survives_a_kernel_restart(kernel_proc: KernelProcess,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger="rebuno")
    agent = Agent("restart", secret=SECRET, base_url=kernel_proc.url, kernel_timeout=5)
    entered, gate = asyncio.Event(), asyncio.Event()
    runs: list[int] = []

    @tool("long_job")
    async def long_job() -> str:
        runs.append(1)
        entered.set()
        await gate.wait()
        return "job done"

    @agent.bind
    async def process() -> str:
        return str(await long_job())

    async with serve_agent(agent) as served:
        await register(kernel_proc, "restart", served.url + "/webhook", SECRET)
        async with kernel_proc.client() as client:
            ex = await client.create("restart", None)
        await asyncio.wait_for(entered.wait(), 20)
        kernel_proc.stop()  # the kernel goes away while the tool runs
        gate.set()  # the step complete now fails to connect and is retried
        await eventually(lambda: any("/complete failed" in r.getMessage() for r in caplog.records),
                         what="a failed try of the step complete")
        kernel_proc.start()  # same database, same port
        async with kernel_proc.client() as client:
            done = await client.wait(ex.id, timeout=30)
            assert (done.status, done.output) == ("completed", "job done")
            assert runs == [1]
            (s,) = await client.steps(ex.id)
            assert (s.status, s.result) == ("succeeded", "job done")


async def test_agents_admin(kernel_proc: KernelProcess) -> None:
    async with kernel_proc.client() as client:
        info = await client.register_agent("adm", "http://127.0.0.1:9/webhook", SECRET)
        assert info.id == "adm" and info.lease_timeout_seconds is None and info.policy_bundle == ""
        await client.set_policy("adm", "default_action: deny\n")
        assert (await client.agent("adm")).policy_bundle == "default_action: deny\n"
        with pytest.raises(ValidationError):
            await client.set_policy("adm", "default_action: maybe\n")
        await client.set_policy("adm", None)
        assert (await client.agent("adm")).policy_bundle == ""
        await client.delete_agent("adm")
        with pytest.raises(NotFoundError):
            await client.agent("adm")


async def test_client_retries_a_create_under_one_key() -> None:
    calls: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        calls.append(request)
        if len(calls) == 1:
            raise httpx2.ReadTimeout("answer lost")
        if len(calls) == 2:
            return httpx2.Response(503, json={"code": "unavailable", "message": "draining"})
        return httpx2.Response(201, json={"id": UNKNOWN, "agent_id": "a", "status": "running", "extra": 1})

    async with Client("http://kernel.test", transport=httpx2.MockTransport(handler)) as client:
        ex = await client.create("a", {"x": 1})
    assert ex.id == UNKNOWN
    keys = {r.headers["idempotency-key"] for r in calls}
    assert len(calls) == 3 and len(keys) == 1



async def _delta_streams(kernel: KernelProcess) -> bool:
    async with httpx2.AsyncClient() as http:
        text = (await http.get(kernel.url + "/metrics")).text
    m = re.search(r'^rebuno_stream_connections\{kind="deltas"\} (\S+)$', text, re.M)
    return m is not None and float(m.group(1)) >= 1
