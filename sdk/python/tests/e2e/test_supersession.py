"""Supersession against the real kernel: a redelivered attempt cancels the
running handler (no finished step runs twice), repeats and stale attempts are
ignored, and an `at_most_once` orphan comes back indeterminate."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2

from rebuno import Agent, ToolError, execution, step, tool
from rebuno.signing import sign_legacy

from .harness import KernelProcess, eventually, register, serve_agent

SECRET = "supersede-secret-0123456789"


async def test_redelivery_cancels_the_running_handler(kernel_proc: KernelProcess) -> None:
    agent = Agent("sup", secret=SECRET, base_url=kernel_proc.url)
    runs = {"before": 0, "slow": 0}
    attempts: list[int | None] = []
    cancelled: list[int | None] = []
    gate = asyncio.Event()

    @tool("before")
    async def before() -> str:
        runs["before"] += 1
        return "done before"

    @tool("slow")
    async def slow() -> str:
        runs["slow"] += 1
        attempt = execution().dispatch_attempt
        if attempt == 1:
            await asyncio.Event().wait()  # stuck until superseded
        await gate.wait()
        return f"slow finished on attempt {attempt}"

    @agent.bind
    async def process() -> dict[str, Any]:
        attempts.append(execution().dispatch_attempt)
        try:
            first = await before()
            return {"before": first, "slow": await slow(), "token": await step("token", lambda: "x")}
        except asyncio.CancelledError:
            cancelled.append(execution().dispatch_attempt)
            raise

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        hook = served.url + "/webhook"
        await register(kernel_proc, "sup", hook, SECRET)
        ex = await client.create("sup", None)
        await eventually(lambda: runs["slow"] == 1, what="slow tool started")
        (dispatch_id, attempt) = agent.running[ex.id]
        assert attempt == 1
        # A repeat of the running attempt (the kernel's own bytes, re-sent) is ignored.
        body = json.dumps({"execution_id": ex.id, "dispatch_id": dispatch_id, "dispatch_attempt": 1,
                           "lease_timeout_seconds": 120}, separators=(",", ":")).encode()
        async with httpx2.AsyncClient() as http:
            r = await http.post(hook, content=body, headers={"Rebuno-Signature": sign_legacy(SECRET, body)})
            assert r.json() == {"status": "ignored"}
        assert attempts == [1]
        # The lease lapses (the kernel's clock jumps past it) and the kernel redelivers.
        await kernel_proc.advance(121)
        await eventually(lambda: attempts == [1, 2], what="second attempt")
        assert cancelled == [1]
        gate.set()
        done = await client.wait(ex.id, timeout=20)
        assert done.status == "completed"
        assert done.output == {"before": "done before", "slow": "slow finished on attempt 2", "token": "x"}
        assert runs == {"before": 1, "slow": 2}  # the finished step replayed, the orphan re-ran
        # A stale attempt arriving late is ignored too.
        async with httpx2.AsyncClient() as http:
            r = await http.post(hook, content=body, headers={"Rebuno-Signature": sign_legacy(SECRET, body)})
            assert r.json() == {"status": "ignored"}
        steps = await client.steps(ex.id)
        assert [(s.target, s.status) for s in steps] == [("before", "succeeded"), ("slow", "succeeded"),
                                                          ("token", "succeeded")]


async def test_at_most_once_orphan_is_indeterminate(kernel_proc: KernelProcess) -> None:
    agent = Agent("amo", secret=SECRET, base_url=kernel_proc.url)
    charged: list[int | None] = []
    started = asyncio.Event()

    @tool("charge_card", idempotency="at_most_once")
    async def charge_card(amount: int) -> str:
        charged.append(execution().dispatch_attempt)
        started.set()
        await asyncio.Event().wait()  # the first attempt never reports
        return "charged"

    @agent.bind
    async def process(amount: int) -> dict[str, Any]:
        try:
            return {"charged": await charge_card(amount)}
        except ToolError as e:
            # The outcome is unknown; calling again is refused by the kernel
            # (the tool returns the denial as a string).
            again = await charge_card(amount)
            return {"indeterminate": e.message, "error": e.error, "again": again}

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "amo", served.url + "/webhook", SECRET)
        ex = await client.create("amo", {"amount": 10})
        await asyncio.wait_for(started.wait(), 20)
        await kernel_proc.advance(121)
        done = await client.wait(ex.id, timeout=20)
        assert done.status == "completed", done
        assert charged == [1]  # never run a second time
        out = done.output
        assert out["indeterminate"].startswith("outcome unknown: this may already have taken effect")
        assert out["error"]["reason"] == "indeterminate"
        assert "prior attempt outcome unknown; retry refused" in out["again"]
        steps = await client.steps(ex.id)
        assert [(s.status, s.idempotency) for s in steps] == [("failed", "at_most_once"), ("denied", "at_most_once")]
        assert steps[1].error["rule_id"] == "__indeterminate_retry"
