"""Typed API errors, the Client's requests, SSE parsing, and the MCP wrapper shapes."""

from __future__ import annotations

import inspect
import json
from typing import Any

import httpx2
import pytest
from mcp.types import CallToolResult, TextContent, Tool

from rebuno import (APIError, Blocked, Client, ConflictError, Decision, DecisionKind, ExecutionTerminalError,
                    LeaseSupersededError, NotFoundError, PolicyError, RateLimited, Terminated, UnavailableError,
                    UnsupportedMediaTypeError, ValidationError)
from rebuno.client import _SSE
from rebuno.errors import REFUSING_DECISIONS, api_error, decision_error, refusal_error
from rebuno.mcp import McpToolError, mcp_result_value, wrap_mcp_tool

EID = "018ff0a0-0000-7000-8000-000000000001"


def test_api_error_mapping() -> None:
    e = api_error(409, b'{"code":"execution_terminal","message":"execution terminal"}')
    assert isinstance(e, ExecutionTerminalError) and (e.status, e.code, e.message) == (
        409, "execution_terminal", "execution terminal")
    assert isinstance(api_error(409, b'{"code":"conflict","message":"x"}'), ConflictError)
    assert isinstance(api_error(409, b'{"code":"lease_superseded","message":"x"}'), LeaseSupersededError)
    e = api_error(400, b'{"code":"validation_error","message":"bad","details":{"field":"agent_id"}}')
    assert isinstance(e, ValidationError) and e.details == {"field": "agent_id"}
    # The code decides, not the status; without a code the status picks the class.
    assert isinstance(api_error(400, b'{"code":"not_found","message":"x"}'), NotFoundError)
    e = api_error(503, b"<html>bad gateway</html>")
    assert isinstance(e, UnavailableError) and e.code == "unavailable" and "bad gateway" in e.message
    e = api_error(418, b"")
    assert type(e) is APIError and e.message == "HTTP 418"
    e = api_error(415, b'{"code":"unsupported_media_type","message":"body must be application/json"}')
    assert isinstance(e, UnsupportedMediaTypeError) and e.status == 415
    assert isinstance(api_error(415, b""), UnsupportedMediaTypeError)
    assert type(api_error(409, b"")) is ConflictError  # a 409 without a code


async def test_client_requests() -> None:
    seen: list[httpx2.Request] = []

    def handler(request: httpx2.Request) -> httpx2.Response:
        seen.append(request)
        path = request.url.path
        if path == "/v0/executions" and request.method == "GET":
            return httpx2.Response(200, json={"executions": [], "future_field": 1})
        if path.endswith("/grant"):
            return httpx2.Response(204)
        if path == "/v0/approvals":
            return httpx2.Response(200, json=[{"id": "a1", "step_id": "s" * 64, "execution_id": EID,
                                               "status": "pending", "approvers": [], "unknown": {"x": 1}}])
        if path.endswith("/cancel"):
            return httpx2.Response(409, json={"code": "execution_terminal", "message": "execution terminal"})
        return httpx2.Response(404, json={"code": "not_found", "message": "not found"})

    async with Client("http://kernel.test/", token="tok", transport=httpx2.MockTransport(handler)) as c:
        page = await c.list(agent_id="a b", limit=5)
        assert page.executions == [] and page.next_cursor is None
        await c.grant("a1", decided_by="alice")
        (ap,) = await c.approvals(execution_id=EID)
        assert ap.approvers == [] and ap.status == "pending"
        with pytest.raises(ExecutionTerminalError):
            await c.cancel(EID)
        with pytest.raises(NotFoundError):
            await c.agent("nobody")
    assert all(r.headers["authorization"] == "Bearer tok" for r in seen)
    assert seen[0].url.params["agent_id"] == "a b" and seen[0].url.params["limit"] == "5"
    assert "cursor" not in seen[0].url.params
    assert json.loads(seen[1].content) == {"decided_by": "alice"}
    assert seen[2].url.params["execution_id"] == EID


def test_decision_values_are_a_str_enum() -> None:
    d = Decision.from_json({"decision": "proceed", "step_id": "s"})
    assert d.decision is DecisionKind.PROCEED and d.decision == "proceed"
    assert d.model_dump(mode="json")["decision"] == "proceed"  # the wire value, unchanged
    assert json.dumps({"d": d.decision}) == '{"d": "proceed"}'
    assert {k.value for k in DecisionKind} == {"proceed", "replay", "denied", "rate_limited", "blocked",
                                              "execution_blocked", "execution_terminal", "recorded"}
    # A decision a newer kernel adds is kept as text rather than refused.
    assert Decision.from_json({"decision": "pondering"}).decision == "pondering"


def test_refusals_map_to_exceptions_in_one_place() -> None:
    denied = decision_error(Decision.from_json({"decision": "denied", "step_id": "s", "reason": "no", "rule_id": "r"}))
    assert isinstance(denied, PolicyError) and (denied.reason, denied.rule_id, denied.step_id) == ("no", "r", "s")
    limited = decision_error(Decision.from_json({"decision": "rate_limited", "retry_after_ms": 5}))
    assert isinstance(limited, RateLimited) and (limited.reason, limited.retry_after_ms) == ("rate_limit_exceeded", 5)
    blocked = decision_error(Decision.from_json({"decision": "blocked", "step_id": "s", "approval_id": "a"}))
    assert isinstance(blocked, Blocked) and (blocked.approval_id, blocked.step_id) == ("a", "s")
    assert isinstance(decision_error(Decision.from_json({"decision": "execution_blocked"})), Blocked)
    terminal = decision_error(Decision.from_json({"decision": "execution_terminal"}))
    assert isinstance(terminal, Terminated) and terminal.reason == "execution_terminal"
    superseded = refusal_error("lease_superseded")
    assert isinstance(superseded, Terminated) and superseded.reason == "lease_superseded"
    assert REFUSING_DECISIONS == {DecisionKind.DENIED, DecisionKind.RATE_LIMITED, DecisionKind.BLOCKED,
                                  DecisionKind.EXECUTION_BLOCKED, DecisionKind.EXECUTION_TERMINAL}


def test_sse_parser() -> None:
    p = _SSE()
    frames = [p.feed(line) for line in [": keep-alive", "", "id: 3", "data: {\"a\":", "data: 1}", "",
                                        "event: end", "data: {}", ""]]
    got = [f for f in frames if f is not None]
    assert got == [("message", '{"a":\n1}', "3"), ("end", "{}", "3")]


def test_mcp_result_values() -> None:
    text = CallToolResult(content=[TextContent(type="text", text="a"), TextContent(type="text", text="b")])
    assert mcp_result_value(text) == "a\n\nb"
    structured = CallToolResult(content=[TextContent(type="text", text="5")], structured_content={"result": 5})
    assert mcp_result_value(structured) == {"result": 5}
    with pytest.raises(McpToolError, match="bad input"):
        mcp_result_value(CallToolResult(content=[TextContent(type="text", text="bad input")], is_error=True))


def test_mcp_wrapper_signature() -> None:
    t = Tool(name="search", description="Search things.", input_schema={
        "type": "object", "required": ["query"],
        "properties": {"limit": {"type": "integer", "default": 5}, "query": {"type": "string"},
                       "bad-name": {"type": "string"}}})
    fn = wrap_mcp_tool(object(), t, id="web.search")  # type: ignore[arg-type]
    assert fn.__name__ == "web.search" and fn.__doc__ == "Search things."
    params = inspect.signature(fn).parameters
    assert list(params) == ["query", "limit"]
    assert params["query"].default is inspect.Parameter.empty and params["limit"].default == 5
    assert params["query"].annotation is str
    info: dict[str, Any] = fn.__rebuno_tool__  # type: ignore[attr-defined]
    assert info["mcp_tool"] == "search" and info["idempotency"] == "safe_to_retry"
