"""Policy decisions end to end: approvals (blocked → grant → resume; deny →
the tool returns the denial), policy denials, rate limits, and refusals of LLM
calls through the official `openai` client."""

from __future__ import annotations

from typing import Any

import openai
import pytest

from rebuno import (Agent, ConflictError, ForbiddenError, PolicyError, RateLimited, http_client, raise_for_refusal,
                    step, tool)

from .harness import KernelProcess, eventually, register, serve_agent
from .scripted_llm import ScriptedLLM

SECRET = "governance-secret-0123456789"

APPROVAL_BUNDLE = """
default_action: allow
rules:
  - id: mail-needs-approval
    priority: 1
    when: {target: send_email}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 10m, message: "send this mail?"}
  - id: no-shell
    priority: 2
    when: {target: "shell*"}
    then: {decision: deny, reason: "no shell access"}
  - id: local-budget
    priority: 3
    when: {step_kind: local}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1m}
  - id: no-llm
    priority: 4
    when: {step_kind: llm_call}
    then: {decision: deny, reason: "llm budget spent"}
"""


def mail_agent(kernel: KernelProcess, sent: list[str]) -> Agent:
    agent = Agent("mailer", secret=SECRET, base_url=kernel.url)

    @tool("send_email")
    async def send_email(to: str, text: str) -> str:
        """Send an email."""
        sent.append(to)
        return f"sent to {to}"

    @agent.bind
    async def process(to: str) -> dict[str, Any]:
        return {"result": await send_email(to, "hello")}

    return agent


@pytest.mark.parametrize("decide", ["grant", "deny"])
async def test_approval(kernel_proc: KernelProcess, decide: str) -> None:
    sent: list[str] = []
    agent = mail_agent(kernel_proc, sent)
    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "mailer", served.url + "/webhook", SECRET)
        await client.set_policy("mailer", APPROVAL_BUNDLE)
        ex = await client.create("mailer", {"to": "ops@example.com"})
        await eventually(lambda: _status(client, ex.id, "blocked"), what="blocked")
        await eventually(lambda: not agent.running, what="first dispatch to end")
        (approval,) = await client.approvals(execution_id=ex.id)
        assert (approval.status, approval.target, approval.approvers, approval.message) == (
            "pending", "send_email", ["alice"], "send this mail?")
        assert (await client.approval(approval.id)).id == approval.id
        assert sent == []
        with pytest.raises(ForbiddenError):
            await client.grant(approval.id, decided_by="mallory")
        if decide == "grant":
            await client.grant(approval.id, decided_by="alice", rationale="fine")
        else:
            await client.deny(approval.id, decided_by="alice", rationale="not today")
        with pytest.raises(ConflictError):
            await client.deny(approval.id, decided_by="alice")
        done = await client.wait(ex.id, timeout=20)
        assert done.status == "completed", done
        decided = await client.approval(approval.id)
        assert decided.status == ("granted" if decide == "grant" else "denied") and decided.decided_by == "alice"
        if decide == "grant":
            assert done.output == {"result": "sent to ops@example.com"} and sent == ["ops@example.com"]
        else:
            assert sent == []
            assert "denied" in done.output["result"] and "not today" in done.output["result"]
        types = [e.type for e in await client.all_events(ex.id)]
        assert types.count("dispatch.queued") == 2 and "execution.blocked" in types


async def test_policy_denial(kernel_proc: KernelProcess) -> None:
    agent = Agent("denied", secret=SECRET, base_url=kernel_proc.url)
    ran: list[str] = []

    @tool("shell")
    async def shell(cmd: str) -> str:
        ran.append(cmd)
        return "ran"

    @agent.bind
    async def process(escape: bool) -> dict[str, Any]:
        answer = await shell("rm -rf /")  # denied: the tool returns a string
        if escape:
            await step("boom", lambda: 1, resources=None)  # allowed (local budget: first call)
            await step("boom2", lambda: 2)  # rate limited: escapes the handler
        return {"answer": answer}

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "denied", served.url + "/webhook", SECRET)
        await client.set_policy("denied", APPROVAL_BUNDLE)
        ex = await client.create("denied", {"escape": False})
        done = await client.wait(ex.id, timeout=20)
        assert done.status == "completed" and ran == []
        assert "no shell access" in done.output["answer"] and "no-shell" in done.output["answer"]
        ex = await client.create("denied", {"escape": True})
        done = await client.wait(ex.id, timeout=20)
        assert (done.status, done.failure_reason) == ("failed", "rate_limited: rate_limit_exceeded")
        events = await client.all_events(ex.id)
        limited = [e for e in events if e.type == "step.rate_limited"]
        assert len(limited) == 1 and limited[0].payload["target"] == "boom2"


async def test_rate_limit_can_be_handled(kernel_proc: KernelProcess) -> None:
    agent = Agent("limited", secret=SECRET, base_url=kernel_proc.url)

    @agent.bind
    async def process() -> dict[str, Any]:
        first = await step("one", lambda: 1)
        try:
            await step("two", lambda: 2)
        except RateLimited as e:
            return {"first": first, "retry_after_ms": e.retry_after_ms, "reason": e.reason}
        return {"first": first}

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "limited", served.url + "/webhook", SECRET)
        await client.set_policy("limited", APPROVAL_BUNDLE)
        ex = await client.create("limited", None)
        done = await client.wait(ex.id, timeout=20)
        assert done.output["first"] == 1 and done.output["reason"] == "rate_limit_exceeded"
        assert 0 < done.output["retry_after_ms"] <= 60_000
        assert [s.target for s in await client.steps(ex.id)] == ["one"]  # nothing recorded for the refusal


async def test_llm_denial_through_openai(kernel_proc: KernelProcess, llm: tuple[ScriptedLLM, str]) -> None:
    server, url = llm
    agent = Agent("llm-denied", secret=SECRET, base_url=kernel_proc.url)
    caught: list[BaseException] = []

    @agent.bind
    async def process(swallow: bool) -> dict[str, Any]:
        client = openai.AsyncOpenAI(api_key="test", base_url=url, http_client=http_client())
        try:
            await client.chat.completions.create(model="m", messages=[{"role": "user", "content": "hi"}])
        except openai.PermissionDeniedError as e:
            if not swallow:
                raise  # the Agent unwraps the refusal itself
            try:
                raise_for_refusal(e)
            except PolicyError as p:
                caught.append(p)
                return {"denied": p.reason, "rule": p.rule_id}
        return {}

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "llm-denied", served.url + "/webhook", SECRET)
        await client.set_policy("llm-denied", APPROVAL_BUNDLE)
        ex = await client.create("llm-denied", {"swallow": True})
        done = await client.wait(ex.id, timeout=20)
        assert done.output == {"denied": "llm budget spent", "rule": "no-llm"}
        ex = await client.create("llm-denied", {"swallow": False})
        done = await client.wait(ex.id, timeout=20)
        assert (done.status, done.failure_reason) == ("failed", "policy_denied: llm budget spent")
        assert server.requests == []  # the provider was never asked; openai did not retry
        submits = [s for s in await client.steps(ex.id)]
        assert [(s.kind, s.status) for s in submits] == [("llm_call", "denied")]


async def _status(client: Any, eid: str, status: str) -> bool:
    return bool((await client.get(eid)).status == status)
