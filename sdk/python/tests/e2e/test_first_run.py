"""A first run against the real kernel: webhook, tools, local steps, output,
the event log, and the agent's webhook checks."""

from __future__ import annotations

import json
from typing import Any

import httpx2

from rebuno import Agent, execution, step, tool
from rebuno.signing import sign_legacy

from .harness import KernelProcess, eventually, register, serve_agent

SECRET = "first-run-secret-0123456789"


@tool("web_search")
async def web_search(query: str, limit: int = 2) -> list[str]:
    """Search the web."""
    return [f"{query} result {i}" for i in range(limit)]


async def test_first_run(kernel_proc: KernelProcess) -> None:
    agent = Agent("first", secret=SECRET, base_url=kernel_proc.url)
    seen: dict[str, Any] = {}

    @agent.bind
    async def process(prompt: str, limit: int = 2) -> dict[str, Any]:
        ctx = execution()
        seen.update(eid=ctx.execution_id, attempt=ctx.dispatch_attempt, lease=ctx.lease_timeout_seconds)
        hits = await web_search(prompt, limit)
        token = await step("token", lambda: "t-123")
        return {"hits": hits, "token": token}

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "first", served.url + "/webhook", SECRET, lease_timeout_seconds=60)
        ex = await client.create("first", {"prompt": "rebuno", "limit": 3})
        done = await client.wait(ex.id, timeout=20)
        assert done.status == "completed", done
        assert done.output == {"hits": ["rebuno result 0", "rebuno result 1", "rebuno result 2"],
                               "token": "t-123"}
        assert seen == {"eid": ex.id, "attempt": 1, "lease": 60.0}
        steps = await client.steps(ex.id)
        assert [(s.kind, s.target, s.status, s.occurrence) for s in steps] == [
            ("tool_call", "web_search", "succeeded", 0), ("local", "token", "succeeded", 0)]
        assert steps[0].args == {"limit": 3, "query": "rebuno"}
        assert steps[0].result == ["rebuno result 0", "rebuno result 1", "rebuno result 2"]
        assert steps[1].args == {} and steps[1].result == "t-123"
        types = [e.type for e in await client.all_events(ex.id)]
        assert types[:3] == ["execution.created", "execution.started", "dispatch.queued"]
        assert types.count("step.succeeded") == 2 and types[-1] == "execution.completed"
        # The agent published its input schema at start-up.
        info = await client.agent("first")
        assert info.input_schema is not None and set(info.input_schema["properties"]) == {"prompt", "limit"}


async def test_missing_input_fails_before_the_handler(kernel_proc: KernelProcess) -> None:
    agent = Agent("strict", secret=SECRET, base_url=kernel_proc.url)
    ran = []

    @agent.bind
    async def process(prompt: str) -> str:
        ran.append(prompt)
        return prompt

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "strict", served.url + "/webhook", SECRET)
        ex = await client.create("strict", {"other": 1})
        done = await client.wait(ex.id, timeout=20)
        assert (done.status, done.failure_reason) == ("failed", "input validation failed: prompt: Field required")
        ex = await client.create("strict", ["not", "an", "object"])
        done = await client.wait(ex.id, timeout=20)
        assert (done.status, done.failure_reason) == ("failed", "input must be a JSON object")
        assert ran == []


async def test_webhook_signature_is_checked(kernel_proc: KernelProcess) -> None:
    agent = Agent("sig", secret=SECRET, base_url=kernel_proc.url)

    @agent.bind
    async def process() -> str:
        return "ok"

    async with serve_agent(agent) as served, httpx2.AsyncClient() as http:
        body = json.dumps({"execution_id": "018ff0a0-0000-7000-8000-000000000001",
                           "dispatch_id": "018ff0a0-0000-7000-8000-000000000002", "dispatch_attempt": 1,
                           "lease_timeout_seconds": 120}, separators=(",", ":")).encode()
        r = await http.post(served.url + "/webhook", content=body)
        assert r.status_code == 401
        r = await http.post(served.url + "/webhook", content=body,
                            headers={"Rebuno-Signature": sign_legacy("wrong", body)})
        assert r.status_code == 401
        # A correctly signed webhook for an unknown execution is acknowledged; the
        # handler's fetch then finds nothing and runs nothing.
        r = await http.post(served.url + "/webhook", content=body,
                            headers={"Rebuno-Signature": sign_legacy(SECRET, body)})
        assert r.status_code == 200
        await eventually(lambda: not agent.running, what="dispatch end")
