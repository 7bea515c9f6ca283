"""(f) Governance with the published client, unchanged (docs/protocol/conformance.md §2.1): a tool
held for approval (the handler unwinds as blocked; a grant re-dispatches and the
tool body runs exactly once), an approval denied by a human, a policy denial (the
decorated tool hands the refusal string back to the handler), LLM calls refused
through the client's http_client() transport (denied: 403, metered: 429; the
provider is never called for them), and a rate-limited tool step (the client's
``RateLimited`` reaches the handler, or fails the execution).

Approvals are listed, read, granted and denied with the client's own bearer
``Client``, whose pydantic models parse every answer."""

from __future__ import annotations

from typing import Any

import pytest
from rebuno import Client, ForbiddenError
from rebuno.types import Approval

from kernel_harness import parse_with_models, step_id, wait_until

TOOLS = "governed-tools"
LLM = "governed-llm"
QUOTA = "governed-quota"

TOOLS_BUNDLE = """\
default_action: allow
rules:
  - id: transfers-need-ok
    when: {target: transfer}
    then:
      decision: require_approval
      approval_config: {approvers: [alice], timeout: 10m, message: "Move the money?"}
  - id: no-wipes
    priority: 1
    when: {target: wipe}
    then: {decision: deny, reason: "wiping accounts is not allowed"}
"""

LLM_BUNDLE = """\
default_action: allow
rules:
  - id: no-forbidden-models
    when: {step_kind: llm_call, target: "forbidden-*"}
    then: {decision: deny, reason: "model not approved"}
  - id: metered
    priority: 1
    when: {step_kind: llm_call, target: metered-model}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1h}
"""

QUOTA_BUNDLE = """\
rules:
  - id: ping-quota
    when: {target: ping}
    then:
      decision: allow
      rate_limit: {max_calls: 2, window: 1h}
"""


def _load_policy(kernel, agent_id: str, bundle: str) -> None:
    r = kernel.request("POST", f"/v0/policies/{agent_id}", json={"bundle": bundle})
    assert r.status_code == 204, r.text
    assert kernel.get_json(f"/v0/agents/{agent_id}")["policy_bundle"] == bundle


def _events_of(kernel, eid: str, *types: str) -> list[dict[str, Any]]:
    return [e for e in kernel.events(eid) if e["type"] in types]


def _no_event_after_terminal(types: list[str]) -> None:
    terminal = [
        i for i, t in enumerate(types) if t in ("execution.completed", "execution.failed", "execution.cancelled")
    ]
    assert len(terminal) == 1 and terminal[0] == len(types) - 1, types


async def _blocked_on_transfer(kernel, records, client: Client, eid: str) -> Approval:
    """Waits until the handler unwound as blocked, and checks what that left."""
    kernel.wait_status(eid, "blocked")
    exit_ = records.wait("handler:exit")[0]
    assert exit_["outcome"] == "raised" and exit_["error"] == "Blocked", exit_
    assert records.count("tool:lookup") == 1
    assert records.count("tool:transfer") == 0
    pending = [a for a in await client.list_approvals() if a.execution_id == eid]
    assert len(pending) == 1, pending
    ap = await client.get_approval(pending[0].id)
    assert isinstance(ap, Approval)
    assert ap.status == "pending" and ap.message == "Move the money?" and ap.decided_by == ""
    steps = kernel.steps(eid)
    assert [(s["target"], s["status"]) for s in steps] == [("lookup", "succeeded"), ("transfer", "awaiting_approval")]
    assert ap.step_id == steps[1]["step_id"]
    assert steps[1]["idempotency"] == "at_most_once"
    # The handler stopped without reporting an outcome: nothing but the block.
    types = kernel.event_types(eid)
    assert types[-1] == "execution.blocked"
    assert "execution.failed" not in types and "execution.completed" not in types
    return ap


async def test_tool_held_for_approval_then_granted(kernel, spawn_agent, records):
    spawn_agent("governed_tools.py", TOOLS)
    _load_policy(kernel, TOOLS, TOOLS_BUNDLE)
    async with Client(base_url=kernel.url) as client:
        eid = (await client.create(TOOLS, {"account": "acc-1", "amount": 5})).id
        ap = await _blocked_on_transfer(kernel, records, client, eid)

        # Not an approver: the client raises its ForbiddenError and nothing moves.
        with pytest.raises(ForbiddenError) as refused:
            await client.grant_approval(ap.id, decided_by="mallory")
        assert refused.value.code == "forbidden" and refused.value.status_code == 403
        assert (await client.get_approval(ap.id)).status == "pending"

        await client.grant_approval(ap.id, decided_by="alice", rationale="fine by me")
        ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
        assert ex["status"] == "completed", ex
        assert ex["output"] == {"balance": 120, "transfer": {"transferred": 5, "to": "acc-1"}}

        granted = await client.get_approval(ap.id)
        assert (granted.status, granted.decided_by, granted.rationale) == ("granted", "alice", "fine by me")
        assert await client.list_approvals() == []
        assert [a.id for a in await client.list_approvals(status="granted")] == [ap.id]

    # The grant re-dispatched the handler: `lookup` replayed, `transfer` ran
    # exactly once, in the second handler run.
    assert records.count("handler:start") == 2
    assert records.count("tool:lookup") == 1
    runs = records.of("tool:transfer")
    assert len(runs) == 1 and runs[0]["amount"] == 5
    assert records.of("handler:transfer_returned")[0]["value"] == {"transferred": 5, "to": "acc-1"}
    assert [r["outcome"] for r in records.of("handler:exit")] == ["raised", "returned"]

    steps = kernel.steps(eid)
    assert [(s["target"], s["status"]) for s in steps] == [("lookup", "succeeded"), ("transfer", "succeeded")]
    assert steps[1]["step_id"] == step_id(eid, "tool_call", "transfer", {"account": "acc-1", "amount": 5})

    events = kernel.events(eid)
    types = [e["type"] for e in events]
    assert types.count("dispatch.queued") == 2
    blocked_at = types.index("step.awaiting_approval")
    assert types[blocked_at - 1 : blocked_at + 3] == [
        "step.proposed",
        "step.awaiting_approval",
        "approval.requested",
        "execution.blocked",
    ]
    g = types.index("approval.granted")
    assert types[g : g + 4] == ["approval.granted", "step.allowed", "execution.resumed", "dispatch.queued"]
    assert events[g]["payload"]["decided_by"] == "alice"
    assert events[g + 1]["payload"]["approval_id"] == ap.id
    # The resumed step starts once (one step.executing for `transfer`).
    transfer_events = [
        e["type"] for e in events if e["type"].startswith("step.") and e["payload"]["step_id"] == ap.step_id
    ]
    assert transfer_events == [
        "step.proposed",
        "step.awaiting_approval",
        "step.allowed",
        "step.executing",
        "step.succeeded",
    ]
    _no_event_after_terminal(types)
    parse_with_models(kernel, eid)


async def test_tool_approval_denied_by_a_human(kernel, spawn_agent, records):
    spawn_agent("governed_tools.py", TOOLS)
    _load_policy(kernel, TOOLS, TOOLS_BUNDLE)
    async with Client(base_url=kernel.url) as client:
        eid = (await client.create(TOOLS, {"account": "acc-2", "amount": 7})).id
        ap = await _blocked_on_transfer(kernel, records, client, eid)
        await client.deny_approval(ap.id, decided_by="alice", rationale="not this week")
        ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
        denied = await client.get_approval(ap.id)
        assert (denied.status, denied.rationale) == ("denied", "not this week")

    # On the re-dispatch the denied tool returns the client's refusal string to
    # the handler, carrying the approver's rationale as the reason; the body
    # never ran.
    refusal = "transfer not allowed. reason: [policy_denied] not this week (HTTP 403)"
    assert ex["status"] == "completed", ex
    assert ex["output"] == {"balance": 120, "transfer": refusal}
    assert records.of("handler:transfer_returned")[0]["value"] == refusal
    assert records.count("tool:transfer") == 0
    assert records.count("tool:lookup") == 1
    step = kernel.steps(eid)[1]
    assert (step["target"], step["status"], step["error"]) == ("transfer", "denied", {"reason": "not this week"})
    d = _events_of(kernel, eid, "approval.denied", "step.denied")
    assert [e["type"] for e in d] == ["approval.denied", "step.denied"]
    assert d[0]["payload"]["rationale"] == "not this week"
    parse_with_models(kernel, eid)


def test_policy_denial_reaches_the_handler(kernel, spawn_agent, records):
    spawn_agent("governed_tools.py", TOOLS)
    _load_policy(kernel, TOOLS, TOOLS_BUNDLE)
    eid = kernel.create_execution(TOOLS, {"account": "acc-3", "wipe_too": True})["id"]
    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")

    refusal = "wipe not allowed. reason: [policy_denied] wiping accounts is not allowed (HTTP 403)"
    assert ex["status"] == "completed", ex
    assert ex["output"] == {"balance": 120, "wipe": refusal}
    assert records.of("handler:wipe_returned")[0]["value"] == refusal
    assert records.count("tool:wipe") == 0
    assert records.count("handler:start") == 1

    wipe = kernel.steps(eid)[1]
    assert wipe["status"] == "denied"
    assert wipe["error"] == {"reason": "wiping accounts is not allowed", "rule_id": "no-wipes"}
    assert wipe["step_id"] == step_id(eid, "tool_call", "wipe", {"account": "acc-3"})
    denied = _events_of(kernel, eid, "step.denied")
    assert len(denied) == 1 and denied[0]["payload"]["rule_id"] == "no-wipes"
    assert denied[0]["payload"]["error"] == wipe["error"]
    types = kernel.event_types(eid)
    i = types.index("step.denied")
    assert types[i - 1 : i + 1] == ["step.proposed", "step.denied"]
    parse_with_models(kernel, eid)


def test_llm_calls_refused_through_http_client(kernel, spawn_agent, records, llm):
    llm.script("The allowed answer.", "The metered answer.")
    spawn_agent("governed_llm.py", LLM, env={"COMPAT_LLM_URL": llm.url})
    _load_policy(kernel, LLM, LLM_BUNDLE)
    eid = kernel.create_execution(LLM, {"question": "may I?"})["id"]
    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    assert ex["status"] == "completed", ex
    out = ex["output"]

    # Denied: the transport answered a synthetic 403 that the openai client
    # raised, the handler caught it, and raise_for_refusal gives the client's
    # PolicyError with the rule's reason back.
    assert out["forbidden"] == {
        "error": "PermissionDeniedError",
        "status": 403,
        "body": {"type": "rebuno_refusal", "message": "rebuno_refusal: denied reason=model not approved"},
        "as": "PolicyError",
        "reason": "model not approved",
    }
    assert out["allowed"] == "The allowed answer."
    # Metered: one call per hour; the second is a synthetic 429.
    assert out["metered"][0] == "The metered answer."
    assert out["metered"][1] == {
        "error": "RateLimitError",
        "status": 429,
        "body": {"type": "rebuno_refusal", "message": "rebuno_refusal: rate_limited reason=rate_limit_exceeded"},
        "as": "RateLimited",
        "reason": "rate_limit_exceeded",
    }
    assert [r["model"] for r in records.of("llm:refused")] == ["forbidden-model", "metered-model"]

    # The provider saw only the two admitted calls.
    assert [r["model"] for r in llm.requests] == ["scripted-model-1", "metered-model"]

    steps = kernel.steps(eid)
    assert [(s["kind"], s["target"], s["status"]) for s in steps] == [
        ("llm_call", "forbidden-model", "denied"),
        ("llm_call", "scripted-model-1", "succeeded"),
        ("llm_call", "metered-model", "succeeded"),
    ]
    assert steps[0]["error"] == {"reason": "model not approved", "rule_id": "no-forbidden-models"}
    limited = _events_of(kernel, eid, "step.rate_limited")
    assert len(limited) == 1
    p = limited[0]["payload"]
    assert (p["step_type"], p["target"], p["rule_id"], p["reason"]) == (
        "llm_call",
        "metered-model",
        "metered",
        "rate_limit_exceeded",
    )
    assert p["retry_after_ms"] == 3_600_000  # the manual clock stood still
    # The refused metered call recorded no step: its id is not among the steps.
    assert p["step_id"] not in {s["step_id"] for s in steps}
    parse_with_models(kernel, eid)


def test_uncaught_llm_denial_fails_the_execution(kernel, spawn_agent, records, llm):
    spawn_agent("governed_llm.py", LLM, env={"COMPAT_LLM_URL": llm.url})
    _load_policy(kernel, LLM, LLM_BUNDLE)
    eid = kernel.create_execution(LLM, {"question": "may I?", "catch": False})["id"]
    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    # The client applies raise_for_refusal to the escaping provider error and
    # reports the denial with its policy_denied prefix.
    assert ex["status"] == "failed", ex
    assert ex["failure_reason"] == "policy_denied: model not approved"
    assert records.of("handler:exit")[0]["error"] == "PermissionDeniedError"
    assert llm.count == 0
    assert [(s["target"], s["status"]) for s in kernel.steps(eid)] == [("forbidden-model", "denied")]
    failed = _events_of(kernel, eid, "execution.failed")
    assert failed[0]["payload"]["reason"] == "policy_denied: model not approved"
    _no_event_after_terminal(kernel.event_types(eid))


def test_rate_limited_step_reaches_the_handler(kernel, spawn_agent, records):
    spawn_agent("governed_quota.py", QUOTA)
    _load_policy(kernel, QUOTA, QUOTA_BUNDLE)
    eid = kernel.create_execution(QUOTA, {"count": 3})["id"]
    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    assert ex["status"] == "completed", ex
    assert ex["output"] == {"got": [0, 10, "limited: rate_limit_exceeded"]}
    limited = records.of("handler:rate_limited")
    assert len(limited) == 1 and limited[0]["n"] == 2
    assert (limited[0]["reason"], limited[0]["error"]) == ("rate_limit_exceeded", "RateLimited")
    assert [r["n"] for r in records.of("tool:ping")] == [0, 1]

    steps = kernel.steps(eid)
    assert [(s["target"], s["args"], s["status"]) for s in steps] == [
        ("ping", {"n": 0}, "succeeded"),
        ("ping", {"n": 1}, "succeeded"),
    ]
    audit = _events_of(kernel, eid, "step.rate_limited")
    assert len(audit) == 1
    p = audit[0]["payload"]
    assert p["step_id"] == step_id(eid, "tool_call", "ping", {"n": 2})
    assert (p["rule_id"], p["reason"], p["retry_after_ms"]) == ("ping-quota", "rate_limit_exceeded", 1_800_000)
    parse_with_models(kernel, eid)


def test_uncaught_rate_limit_fails_the_execution(kernel, spawn_agent, records):
    spawn_agent("governed_quota.py", QUOTA)
    _load_policy(kernel, QUOTA, QUOTA_BUNDLE)
    eid = kernel.create_execution(QUOTA, {"count": 3, "catch": False})["id"]
    ex = kernel.wait_status(eid, "completed", "failed", "cancelled")
    # 0.29.2's failure_reason() for RateLimited is the kernel's reason itself.
    assert ex["status"] == "failed", ex
    assert ex["failure_reason"] == "rate_limit_exceeded"
    wait_until(lambda: records.of("handler:exit"), what="handler exit")
    assert records.of("handler:exit")[0]["error"] == "RateLimited"
    assert records.count("tool:ping") == 2
    types = kernel.event_types(eid)
    assert types.count("step.rate_limited") == 1
    assert types[-2:] == ["step.rate_limited", "execution.failed"]
    parse_with_models(kernel, eid)
