"""Headers the kernel requires of SDK requests: `Content-Type: application/json`
on every request with a JSON body (the kernel answers `415` otherwise), and on
every submit a `Rebuno-Step-Occurrence` bound to that request by
`Rebuno-Occurrence-Signature`."""

from __future__ import annotations

import json

import httpx2

from rebuno import Client
from rebuno._kernel import KernelClient, Lease, LeaseClock, Outcome
from rebuno.signing import sign_occurrence

SECRET = "s3cret-agent-key"
EID = "018ff0a0-0000-7000-8000-000000000001"
DISPATCH = "018ff0a0-0000-7000-8000-0000000000d1"
STEP = "ab" * 32


def _answer(request: httpx2.Request) -> httpx2.Response:
    """A plausible success for every route the SDK calls."""
    path, method = request.url.path, request.method
    if path.endswith("/steps") and method == "POST":
        return httpx2.Response(200, json={"decision": "proceed", "step_id": STEP},
                               headers={"Rebuno-Step-Occurrence": request.headers["rebuno-step-occurrence"]})
    if path.endswith(("/complete", "/fail")) and "/steps/" in path:
        return httpx2.Response(200, json={"decision": "recorded"})
    if path.endswith("/resources"):
        return httpx2.Response(200, json={"key": "ws", "driver_id": "d"})
    if path == "/v0/agents":
        return httpx2.Response(200, json={"id": "a"})
    if path in ("/v0/executions", f"/v0/executions/{EID}/fork"):
        return httpx2.Response(201, json={"id": EID, "agent_id": "a", "status": "pending"})
    return httpx2.Response(204)


def _kernel_client(seen: list[httpx2.Request]) -> KernelClient:
    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return _answer(request)

    return KernelClient("http://kernel.test", "agent", SECRET, timeout=5, transport=httpx2.MockTransport(handler))


def _lease() -> Lease:
    return Lease(DISPATCH, 1, LeaseClock(120))


def _json_bodies(seen: list[httpx2.Request]) -> list[httpx2.Request]:
    with_body = [r for r in seen if r.content]
    for r in with_body:
        json.loads(r.content)  # every body the SDK sends is JSON
    return with_body


async def test_every_agent_request_with_a_body_is_json() -> None:
    seen: list[httpx2.Request] = []
    kc = _kernel_client(seen)
    lease = _lease()
    await kc.submit(EID, lease, b'{"kind":"local","target":"t","args":{},"idempotency":"safe_to_retry"}', 0)
    await kc.step_outcome(EID, lease, Outcome(STEP, True, "1"))
    await kc.step_outcome(EID, lease, Outcome(STEP, False, '{"message":"x"}'))
    await kc.stream_delta(EID, STEP, lease, 0, "hi")
    await kc.register_resource(EID, lease, {"key": "ws", "driver_id": "d"})
    await kc.bind_resource(EID, lease, "ws", {"path": "/w"})
    await kc.publish_checkpoints(EID, lease, captures=[{"key": "ws", "generation": 0, "checkpoint_ref": "r"}],
                                 capture_failures=[])
    await kc.heartbeat(EID, lease)
    assert await kc.finish_execution(EID, lease, output_json='{"ok":true}')
    assert await kc.finish_execution(EID, lease, reason="agent_error: boom")
    await kc.put_metadata(description="d", input_schema={"type": "object"})
    await kc.aclose()
    with_body = _json_bodies(seen)
    assert len(with_body) == len(seen) - 1  # all but the heartbeat, whose body is empty
    assert [r.headers.get("content-type") for r in with_body] == ["application/json"] * len(with_body)


async def test_every_client_request_with_a_body_is_json() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        return _answer(request)

    async with Client("http://kernel.test", transport=httpx2.MockTransport(handler)) as c:
        await c.create("a", {"x": 1})
        await c.fork(EID, at_seq=3)
        await c.grant("ap", decided_by="alice")
        await c.deny("ap", rationale="no")
        await c.register_agent("a", "http://agent.test/webhook", "secret")
        await c.set_policy("a", "rules: []")
        await c.cancel(EID)
        await c.delete_agent("a")
    with_body = _json_bodies(seen)
    assert [r.url.path for r in with_body] == [
        "/v0/executions", f"/v0/executions/{EID}/fork", "/v0/approvals/ap/grant", "/v0/approvals/ap/deny",
        "/v0/agents", "/v0/policies/a"]
    assert [r.headers.get("content-type") for r in with_body] == ["application/json"] * len(with_body)


async def test_a_submit_binds_its_occurrence_to_the_request() -> None:
    seen: list[httpx2.Request] = []
    kc = _kernel_client(seen)
    lease = _lease()
    body = b'{"kind":"local","target":"t","args":{},"idempotency":"safe_to_retry"}'
    for occurrence in (0, 7):
        await kc.submit(EID, lease, body, occurrence)
    await kc.step_outcome(EID, lease, Outcome(STEP, True, "1"))
    await kc.aclose()
    submits, outcome = seen[:2], seen[2]
    assert [r.headers["rebuno-step-occurrence"] for r in submits] == ["0", "7"]
    for r in submits:
        bound = sign_occurrence(SECRET, r.headers["rebuno-signature"], r.headers["rebuno-step-occurrence"])
        assert r.headers["rebuno-occurrence-signature"] == bound
    # A request without an occurrence carries no binding.
    assert "rebuno-step-occurrence" not in outcome.headers
    assert "rebuno-occurrence-signature" not in outcome.headers
