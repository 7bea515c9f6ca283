"""Agent dispatch and the failure-outcome table, against the in-memory kernel."""

from __future__ import annotations

import asyncio
import json
from typing import Any

import httpx2
import pytest
from pydantic import BaseModel

from rebuno import (Agent, Blocked, PolicyError, RateLimited, Terminated, ToolError, execution, step, tool)
from rebuno.agent import heartbeat_interval, supersede_wait

from .fakes import FakeKernel, Recorded, deliver, error_response, make_agent, uuid7


async def run_once(agent: Agent, kernel: FakeKernel, input: Any, *, attempt: int = 1) -> tuple[str, Any]:
    eid = kernel.add_execution(input)
    resp = await deliver(agent, eid, uuid7(), attempt)
    assert resp.status_code == 200, resp.text
    await agent.join()
    result = kernel.finished(eid)
    assert result is not None, "execution did not finish"
    return result


class NumberIn(BaseModel):
    n: int


# --------------------------------------------------------------- construction


def test_constructor_options(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("REBUNO_AGENT_SECRET", raising=False)
    monkeypatch.delenv("REBUNO_URL", raising=False)
    with pytest.raises(ValueError):
        Agent("")
    with pytest.raises(ValueError):
        Agent("a")  # no secret anywhere
    a = Agent("a", secret="s")
    assert a.base_url == "http://localhost:8080" and a.webhook_path == "/webhook" and a.kernel_timeout == 35.0
    monkeypatch.setenv("REBUNO_AGENT_SECRET", "from-env")
    monkeypatch.setenv("REBUNO_URL", "http://kernel:9/")
    b = Agent("b", webhook_path="/hooks/rebuno", kernel_timeout=5)
    assert b.base_url == "http://kernel:9" and b._secret == "from-env"
    assert any(getattr(r, "path", None) == "/hooks/rebuno" for r in b.app.routes)
    with pytest.raises(ValueError):
        Agent("c", secret="s", webhook_path="no-slash")


def test_bind_requires_async() -> None:
    a = Agent("a", secret="s")
    with pytest.raises(TypeError):
        a.bind(lambda: None)  # type: ignore[arg-type,return-value]


def test_heartbeat_and_wait_bounds() -> None:
    assert heartbeat_interval(120) == 30 and heartbeat_interval(60) == 20 and heartbeat_interval(3) == 1
    assert supersede_wait(120) == 10 and supersede_wait(6) == 2


# ------------------------------------------------------------- webhook checks


async def test_signature_and_body_checks(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)

    async def process() -> None: ...

    agent.bind(process)
    eid, did = kernel.add_execution(), uuid7()
    assert (await deliver(agent, eid, did, signature=None)).status_code == 401
    assert (await deliver(agent, eid, did, secret="wrong-secret")).status_code == 401
    assert (await deliver(agent, eid, did, body=b"not json", signature=None)).status_code == 401
    assert (await deliver(agent, eid, did, body=b"not json")).status_code == 400
    bad = json.dumps({"dispatch_id": did}).encode()
    assert (await deliver(agent, eid, did, body=bad)).status_code == 400
    bad = json.dumps({"execution_id": eid}).encode()
    assert (await deliver(agent, eid, did, body=bad)).status_code == 400
    assert kernel.requests == []  # nothing ran
    # Missing attempt and lease are tolerated (older kernels send neither).
    resp = await deliver(agent, eid, did, attempt=None, lease=None)
    assert resp.status_code == 200 and resp.json() == {"status": "accepted"}
    await agent.join()
    assert kernel.finished(eid) == ("completed", None)
    await agent.close()


async def test_no_handler_answers_503(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)
    assert (await deliver(agent, kernel.add_execution(), uuid7())).status_code == 503


# ------------------------------------------------------------------ outcomes


async def test_completes_with_output_and_signs_requests(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)

    @agent.bind
    async def process(prompt: str, limit: int = 2) -> dict[str, Any]:
        ctx = execution()
        return {"echo": prompt * limit, "eid": ctx.execution_id, "input": ctx.input}

    eid = kernel.add_execution({"prompt": "ab"})
    did = uuid7()
    await deliver(agent, eid, did, 3)
    await agent.join()
    assert kernel.finished(eid) == ("completed", {"echo": "abab", "eid": eid, "input": {"prompt": "ab"}})
    get, complete = kernel.requests
    assert get.method == "GET" and "rebuno-dispatch-id" not in get.headers  # reads carry no dispatch headers
    assert complete.headers["rebuno-dispatch-id"] == did and complete.headers["rebuno-dispatch-attempt"] == "3"
    assert complete.headers["content-type"] == "application/json"
    assert complete.headers["rebuno-signature"].startswith("v1=")


async def test_terminal_execution_is_skipped(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)
    ran = []

    @agent.bind
    async def process() -> None:
        ran.append(1)

    eid = kernel.add_execution(status="cancelled")
    await deliver(agent, eid, uuid7())
    await agent.join()
    assert ran == [] and [r.method for r in kernel.requests] == ["GET"]


async def test_binding_failures_fail_before_the_handler(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)
    ran = []

    @agent.bind
    async def process(data: NumberIn) -> None:
        ran.append(data)

    assert await run_once(agent, kernel, "text") == ("failed", "input must be a JSON object")
    assert await run_once(agent, kernel, {"n": "x"}) == (
        "failed", "input validation failed: n: Input should be a valid integer, unable to parse string as an integer")
    assert ran == []


@pytest.mark.parametrize("exc,reason", [
    (PolicyError("no shell", rule_id="r1"), "policy_denied: no shell"),
    (RateLimited("rate_limit_exceeded", retry_after_ms=5), "rate_limited: rate_limit_exceeded"),
    (ToolError("search", "boom"), "tool_error: search: boom"),
    (KeyError("k"), "agent_error: KeyError: 'k'"),
])
async def test_failure_table(kernel: FakeKernel, exc: Exception, reason: str) -> None:
    agent = make_agent(kernel)

    @agent.bind
    async def process() -> None:
        raise exc

    assert await run_once(agent, kernel, None) == ("failed", reason)


async def test_custom_exception_uses_plain_class_name(kernel: FakeKernel) -> None:
    class WidgetError(Exception):
        pass

    agent = make_agent(kernel)

    @agent.bind
    async def process() -> None:
        raise WidgetError("bent")

    assert await run_once(agent, kernel, None) == ("failed", "agent_error: WidgetError: bent")


async def test_output_not_json(kernel: FakeKernel) -> None:
    import datetime

    agent = make_agent(kernel)

    @agent.bind
    async def process() -> Any:
        return {"when": [datetime.datetime(2026, 1, 1)]}

    assert await run_once(agent, kernel, None) == ("failed", "output is not JSON-serializable: datetime")


async def test_pydantic_output_is_dumped(kernel: FakeKernel) -> None:
    class Out(BaseModel):
        answer: str

    agent = make_agent(kernel)

    @agent.bind
    async def process() -> Out:
        return Out(answer="42")

    assert await run_once(agent, kernel, None) == ("completed", {"answer": "42"})


@pytest.mark.parametrize("decision", [
    {"decision": "blocked", "step_id": "auto", "approval_id": "018ff0a0-0000-7000-8000-0000000000aa"},
    {"decision": "execution_blocked"},
    {"decision": "execution_terminal"},
])
async def test_swallowed_signal_still_ends_the_dispatch(kernel: FakeKernel, decision: dict[str, Any]) -> None:
    kernel.on_submit = lambda k, r: decision
    agent = make_agent(kernel)
    seen: list[BaseException] = []

    @tool("gated")
    async def gated() -> str:
        return "ran"

    @agent.bind
    async def process() -> str:
        try:
            await gated()
        except (Blocked, Terminated) as e:  # swallowed on purpose
            seen.append(e)
        try:
            await step("later", lambda: 1)  # never submitted: the signal is sticky
        except (Blocked, Terminated) as e:
            seen.append(e)
        return "finished anyway"

    eid = kernel.add_execution()
    await deliver(agent, eid, uuid7())
    await agent.join()
    assert kernel.finished(eid) is None  # neither completed nor failed
    assert len(kernel.submits()) == 1
    assert len(seen) == 2 and seen[0] is seen[1]
    want = Terminated if decision["decision"] == "execution_terminal" else Blocked
    assert isinstance(seen[0], want)
    if decision["decision"] == "blocked":
        assert isinstance(seen[0], Blocked) and seen[0].approval_id == decision["approval_id"]


async def test_refusal_wrapped_by_provider_error_is_unwrapped(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)

    class ProviderError(Exception):
        pass

    @agent.bind
    async def process() -> None:
        try:
            raise ValueError("rebuno_refusal: denied reason=no_llm_after_hours")
        except ValueError as inner:
            raise ProviderError("the provider call failed") from inner

    assert await run_once(agent, kernel, None) == ("failed", "policy_denied: no_llm_after_hours")


async def test_lease_superseded_stops_without_reporting(kernel: FakeKernel) -> None:
    kernel.on_submit = lambda k, r: error_response(409, "lease_superseded")
    agent = make_agent(kernel)
    after = []

    @agent.bind
    async def process() -> str:
        try:
            await step("s", lambda: 1)
        except Terminated as t:
            after.append(t.reason)
        return "should not be reported"

    eid = kernel.add_execution()
    await deliver(agent, eid, uuid7())
    await agent.join()
    assert after == ["lease_superseded"]
    assert kernel.finished(eid) is None
    assert not kernel.of("POST", "/complete") and not kernel.of("POST", "/fail")


# ------------------------------------------------------------- supersession


async def test_newer_webhook_cancels_running_handler(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)
    started: list[int | None] = []
    cancelled: list[int | None] = []
    release = asyncio.Event()

    @tool("slow")
    async def slow() -> str:
        await release.wait()
        return "done"

    @agent.bind
    async def process() -> str:
        started.append(execution().dispatch_attempt)
        try:
            return await slow()
        except asyncio.CancelledError:
            cancelled.append(execution().dispatch_attempt)
            raise

    eid, did = kernel.add_execution(), uuid7()
    await deliver(agent, eid, did, 1)
    await kernel.wait(lambda: started == [1] and kernel.steps)
    # A repeat of the running attempt is ignored.
    resp = await deliver(agent, eid, did, 1)
    assert resp.json() == {"status": "ignored"}
    # A redelivery supersedes it: the old handler is cancelled, the new one runs.
    resp = await deliver(agent, eid, did, 2)
    assert resp.json() == {"status": "accepted"}
    await kernel.wait(lambda: started == [1, 2])
    assert cancelled == [1]
    # The old attempt is now ignored.
    assert (await deliver(agent, eid, did, 1)).json() == {"status": "ignored"}
    release.set()
    await agent.join()
    assert kernel.finished(eid) == ("completed", "done")
    # The cancelled body reported nothing (the dispatch itself was superseded).
    fails = kernel.of("POST", "/fail")
    assert fails == []
    assert agent.running == {}


async def test_close_cancels_without_reporting(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)
    entered = asyncio.Event()

    @agent.bind
    async def process() -> str:
        entered.set()
        await asyncio.Event().wait()
        return "never"

    eid = kernel.add_execution()
    await deliver(agent, eid, uuid7())
    await entered.wait()
    await agent.close()
    assert kernel.finished(eid) is None
    assert [r.method for r in kernel.requests] == ["GET"]


# --------------------------------------------------------------- heartbeats


async def test_heartbeats_and_stop_on_superseded(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)
    beats: list[Recorded] = []

    def before(k: FakeKernel, r: Recorded) -> Any:
        if r.path.endswith("/heartbeat"):
            beats.append(r)
            if len(beats) >= 3:
                return error_response(409, "lease_superseded")
        return None

    kernel.before = before
    cancelled = asyncio.Event()

    @agent.bind
    async def process() -> None:
        try:
            await asyncio.Event().wait()
        except asyncio.CancelledError:
            cancelled.set()
            raise

    eid, did = kernel.add_execution(), uuid7()
    await deliver(agent, eid, did, 4, lease=0.3)  # heartbeat every 0.1 s
    await asyncio.wait_for(cancelled.wait(), 5)
    await agent.join()
    assert len(beats) == 3
    assert all(b.body == b"" and b.headers["rebuno-dispatch-id"] == did and
               b.headers["rebuno-dispatch-attempt"] == "4" for b in beats)
    assert kernel.finished(eid) is None


# ------------------------------------------------------------------ retries


async def test_transport_failures_are_retried(kernel: FakeKernel) -> None:
    failures = {"complete": 2, "step": 1}

    def before(k: FakeKernel, r: Recorded) -> Any:
        if r.path.endswith("/complete") and "/steps/" not in r.path and failures["complete"]:
            failures["complete"] -= 1
            return httpx2.ConnectError("kernel restarting")
        if "/steps/" in r.path and r.path.endswith("/complete") and failures["step"]:
            failures["step"] -= 1
            return error_response(503, "unavailable")
        return None

    kernel.before = before
    agent = make_agent(kernel)

    @agent.bind
    async def process() -> int:
        return int(await step("n", lambda: 7))

    assert await run_once(agent, kernel, None) == ("completed", 7)
    step_completes = [r for r in kernel.requests if "/steps/" in r.path and r.path.endswith("/complete")]
    assert len(step_completes) == 2
    # Each try is signed afresh over the same body.
    assert step_completes[0].body == step_completes[1].body
    assert len(kernel.of("POST", "/complete")) == 5  # 2 step tries + 3 execution tries


async def test_lost_submit_is_resent_with_the_same_occurrence(kernel: FakeKernel) -> None:
    lost = [True]

    def before(k: FakeKernel, r: Recorded) -> Any:
        if r.path.endswith("/steps") and r.method == "POST" and len(k.submits()) == 2 and lost[0]:
            lost[0] = False
            return httpx2.ReadTimeout("answer lost")
        return None

    kernel.before = before
    agent = make_agent(kernel)

    @agent.bind
    async def process() -> list[int]:
        a = await step("n", lambda: 1)
        b = await step("n", lambda: 2)
        return [a, b]

    assert await run_once(agent, kernel, None) == ("completed", [1, 2])
    occ = [r.headers["rebuno-step-occurrence"] for r in kernel.submits()]
    assert occ == ["0", "1", "1"]


async def test_lost_submit_abandons_when_occurrences_are_not_honoured(kernel: FakeKernel) -> None:
    kernel.echo_occurrence = False  # a kernel that ignores Rebuno-Step-Occurrence (docs/protocol/conformance.md §2.4)

    def before(k: FakeKernel, r: Recorded) -> Any:
        if r.path.endswith("/steps") and len(k.submits()) == 2:
            return httpx2.ReadTimeout("answer lost")
        return None

    kernel.before = before
    agent = make_agent(kernel)

    @agent.bind
    async def process() -> list[int]:
        return [await step("n", lambda: 1), await step("n", lambda: 2)]

    eid = kernel.add_execution()
    await deliver(agent, eid, uuid7())
    await agent.join()
    assert len(kernel.submits()) == 2  # never re-sent
    assert kernel.finished(eid) is None  # abandoned: the lease lapses


async def test_kernel_down_for_a_whole_lease_abandons(kernel: FakeKernel) -> None:
    down = asyncio.Event()

    def before(k: FakeKernel, r: Recorded) -> Any:
        # The kernel goes away once the handler has its input: heartbeats fail too.
        return httpx2.ConnectError("down") if down.is_set() else None

    kernel.before = before
    agent = make_agent(kernel)

    @agent.bind
    async def process() -> str:
        down.set()
        return "x"

    eid = kernel.add_execution()
    started = asyncio.get_running_loop().time()
    await deliver(agent, eid, uuid7(), lease=0.6)
    await asyncio.wait_for(agent.join(), 5)
    elapsed = asyncio.get_running_loop().time() - started
    tries = kernel.of("POST", "/complete")
    assert len(tries) >= 3, len(tries)  # 0.1 s, 0.2 s, ... backoff until the lease is gone
    assert 0.5 <= elapsed < 2.0, elapsed  # abandoned about one lease after the last renewal
    assert kernel.finished(eid) is None


async def test_other_4xx_is_not_retried(kernel: FakeKernel) -> None:
    kernel.before = lambda k, r: error_response(400, "validation_error") if r.path.endswith("/steps") else None
    agent = make_agent(kernel)

    @agent.bind
    async def process() -> Any:
        return await step("s", lambda: 1)

    eid = kernel.add_execution()
    await deliver(agent, eid, uuid7())
    await agent.join()
    assert len(kernel.submits()) == 1
    assert kernel.finished(eid) == ("failed", "agent_error: ValidationError: 400 validation_error: validation error")



async def test_metadata_is_published_once(kernel: FakeKernel) -> None:
    agent = make_agent(kernel)

    @agent.bind
    async def process(prompt: str, limit: int = 3) -> None:
        """Answer a prompt."""

    await deliver(agent, kernel.add_execution({"prompt": "x"}), uuid7())
    await deliver(agent, kernel.add_execution({"prompt": "y"}), uuid7())
    await agent.join()
    await kernel.wait(lambda: kernel.metadata)
    (meta,) = kernel.metadata
    body = meta.json()
    assert body["description"] == "Answer a prompt."
    assert set(body["input_schema"]["properties"]) == {"prompt", "limit"}
    assert body["input_schema"]["required"] == ["prompt"]
    assert "rebuno-dispatch-id" not in meta.headers
