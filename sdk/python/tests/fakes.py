"""Test doubles for unit tests: a small in-memory kernel behind an
`httpx2.MockTransport`, and helpers that deliver signed webhooks to an
`Agent`'s ASGI app. End-to-end tests use the real binary instead."""

from __future__ import annotations

import asyncio
import itertools
import json
import os
import re
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Awaitable, Callable

import httpx2

from rebuno import Agent
from rebuno.identity import args_hash, canonical_text, step_id as make_step_id
from rebuno.signing import sign_legacy, sign_occurrence, sign_v1

AGENT_ID = "unit-agent"
SECRET = "unit-secret-0123456789"

_counter = itertools.count(1)


def uuid7() -> str:
    """A UUIDv7 whose ids strictly increase within the test process."""
    ms = int(time.time() * 1000) + next(_counter)
    rand = int.from_bytes(os.urandom(10), "big")
    value = (ms << 80) | (0x7 << 76) | ((rand >> 68) & 0xFFF) << 64 | (0b10 << 62) | (rand & ((1 << 62) - 1))
    return str(uuid.UUID(int=value))


@dataclass
class Recorded:
    method: str
    path: str
    query: str
    headers: httpx2.Headers
    body: bytes

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None


@dataclass
class FakeStep:
    step_id: str
    kind: str
    target: str
    args: Any
    idempotency: str
    status: str = "executing"
    result: Any = None
    error: Any = None


Responder = Callable[["FakeKernel", Recorded], "httpx2.Response | dict[str, Any] | None | Awaitable[Any]"]


@dataclass
class FakeKernel:
    """Enough of the kernel for the SDK's unit tests. It checks every v1
    signature, assigns step ids as the real kernel does (docs/protocol/identity.md), replays
    recorded steps and keeps every request for assertions. `on_submit`,
    `before` and `fail` hooks script the other answers."""

    agent_id: str = AGENT_ID
    secret: str = SECRET
    requests: list[Recorded] = field(default_factory=list)
    metadata: list[Recorded] = field(default_factory=list)
    executions: dict[str, dict[str, Any]] = field(default_factory=dict)
    steps: dict[str, FakeStep] = field(default_factory=dict)
    # Called for each submit before the default logic; a non-None answer wins.
    on_submit: Responder | None = None
    # Called for every request before routing; a non-None answer wins
    # (an exception instance is raised as a transport error).
    before: Responder | None = None
    echo_occurrence: bool = True

    def transport(self) -> httpx2.MockTransport:
        return httpx2.MockTransport(self._handle)

    def add_execution(self, input: Any = None, status: str = "running") -> str:
        eid = uuid7()
        self.executions[eid] = {"id": eid, "agent_id": self.agent_id, "status": status, "input": input,
                                "resource_keys": []}
        return eid

    # ---------------------------------------------------------- queries

    def of(self, method: str, suffix: str) -> list[Recorded]:
        return [r for r in self.requests if r.method == method and r.path.endswith(suffix)]

    def submits(self) -> list[Recorded]:
        return self.of("POST", "/steps")

    def finished(self, eid: str) -> tuple[str, Any] | None:
        ex = self.executions[eid]
        if ex["status"] == "completed":
            return ("completed", ex.get("output"))
        if ex["status"] == "failed":
            return ("failed", ex.get("failure_reason"))
        return None

    async def wait(self, cond: Callable[[], Any], timeout: float = 5.0) -> Any:
        deadline = time.monotonic() + timeout
        while True:
            value = cond()
            if value:
                return value
            if time.monotonic() > deadline:
                raise AssertionError("condition not met within %.1fs" % timeout)
            await asyncio.sleep(0.005)

    # ----------------------------------------------------------- server

    async def _handle(self, request: httpx2.Request) -> httpx2.Response:
        body = await request.aread()
        rec = Recorded(request.method, request.url.path, request.url.query.decode(), request.headers, body)
        if not self._signed(request, body):
            return _error(401, "unauthorized")
        if request.method == "PUT" and rec.path == f"/v0/agents/{self.agent_id}/metadata":
            self.metadata.append(rec)  # kept apart: it is not part of any dispatch
            return httpx2.Response(204)
        self.requests.append(rec)
        if self.before is not None:
            answer = await _maybe(self.before(self, rec))
            if isinstance(answer, BaseException):
                raise answer
            if answer is not None:
                return _as_response(answer)
        return self._route(rec)

    def _signed(self, request: httpx2.Request, body: bytes) -> bool:
        sig = request.headers.get("rebuno-signature", "")
        ts = request.headers.get("rebuno-timestamp", "")
        if request.headers.get("rebuno-agent-id") != self.agent_id or not ts.isdigit():
            return False
        if abs(int(ts) - time.time()) > 300:
            return False
        want = sign_v1(self.secret, request.method, request.url.raw_path.decode(), ts,
                       request.headers.get("rebuno-dispatch-id"), request.headers.get("rebuno-dispatch-attempt"),
                       body)
        occurrence = request.headers.get("rebuno-step-occurrence")
        if occurrence is not None and request.headers.get("rebuno-occurrence-signature") != sign_occurrence(
                self.secret, sig, occurrence):
            return False  # an occurrence not bound to this request
        return sig == want

    def _route(self, rec: Recorded) -> httpx2.Response:
        m = re.fullmatch(r"/v0/executions/([0-9a-f-]{36})(/.*)?", rec.path)
        if m is None:
            return _error(404, "not_found")
        eid, rest = m.group(1), m.group(2) or ""
        ex = self.executions.get(eid)
        if ex is None:
            return _error(404, "not_found")
        if rec.method == "GET" and rest == "":
            return httpx2.Response(200, json=ex)
        terminal = ex["status"] in ("completed", "failed", "cancelled")
        if rest == "/steps" and rec.method == "POST":
            return self._submit(ex, rec, terminal)
        sm = re.fullmatch(r"/steps/([0-9a-f]{64})/(complete|fail|stream)", rest)
        if sm:
            return self._outcome(ex, rec, sm.group(1), sm.group(2), terminal)
        if rest == "/heartbeat":
            assert rec.body == b"", "heartbeat body must be empty"
            return _error(409, "execution_terminal") if terminal else httpx2.Response(204)
        if rest in ("/complete", "/fail"):
            if terminal:
                return _error(409, "execution_terminal")
            data = rec.json()
            if rest == "/complete":
                ex["status"], ex["output"] = "completed", data.get("output")
            else:
                ex["status"], ex["failure_reason"] = "failed", data.get("error")
            return httpx2.Response(204)
        return _error(404, "not_found")

    def _submit(self, ex: dict[str, Any], rec: Recorded, terminal: bool) -> httpx2.Response:
        if terminal:
            return httpx2.Response(200, json={"decision": "execution_terminal"})
        data = rec.json()
        # Hash the args text exactly as sent, as the kernel does.
        h = args_hash(canonical_text(rec.body.split(b'"args":', 1)[1].rsplit(b',"idempotency"', 1)[0]))
        occ = int(rec.headers["rebuno-step-occurrence"])
        sid = make_step_id(ex["id"], data["kind"], data.get("target", ""), h, occ)
        headers = {"Rebuno-Step-Occurrence": str(occ)} if self.echo_occurrence else {}
        if self.on_submit is not None:
            answer = self.on_submit(self, rec)
            if answer is not None:
                if isinstance(answer, dict) and answer.get("step_id") == "auto":
                    answer = {**answer, "step_id": sid}
                resp = _as_response(answer)
                if isinstance(answer, dict) and "step_id" in answer:
                    resp.headers.update(headers)
                return resp
        existing = self.steps.get(sid)
        if existing is None:
            self.steps[sid] = FakeStep(sid, data["kind"], data.get("target", ""), data.get("args"),
                                       data.get("idempotency", "safe_to_retry"))
            return httpx2.Response(200, json={"decision": "proceed", "step_id": sid, "resources": []},
                                   headers=headers)
        if existing.status == "succeeded":
            return httpx2.Response(200, json={"decision": "replay", "step_id": sid, "result": existing.result},
                                   headers=headers)
        if existing.status == "failed":
            return httpx2.Response(200, json={"decision": "replay", "step_id": sid, "error": existing.error},
                                   headers=headers)
        return httpx2.Response(200, json={"decision": "proceed", "step_id": sid, "resources": []}, headers=headers)

    def _outcome(self, ex: dict[str, Any], rec: Recorded, sid: str, verb: str, terminal: bool) -> httpx2.Response:
        if verb == "stream":
            return httpx2.Response(204)
        if terminal:
            return httpx2.Response(200, json={"decision": "execution_terminal"})
        st = self.steps.get(sid)
        if st is None:
            return _error(404, "not_found")
        data = rec.json()
        if st.status != "executing":
            if st.status == "succeeded":
                return httpx2.Response(200, json={"decision": "replay", "result": st.result})
            return httpx2.Response(200, json={"decision": "replay", "error": st.error})
        if verb == "complete":
            st.status, st.result = "succeeded", data.get("result")
        else:
            st.status, st.error = "failed", data.get("error")
        return httpx2.Response(200, json={"decision": "recorded"})


def _error(status: int, code: str) -> httpx2.Response:
    return httpx2.Response(status, json={"code": code, "message": code.replace("_", " ")})


def _as_response(answer: Any) -> httpx2.Response:
    if isinstance(answer, httpx2.Response):
        return answer
    return httpx2.Response(200, json=answer)


async def _maybe(value: Any) -> Any:
    if asyncio.iscoroutine(value):
        return await value
    return value


def error_response(status: int, code: str) -> httpx2.Response:
    return _error(status, code)


def make_agent(kernel: FakeKernel, **kw: Any) -> Agent:
    return Agent(kernel.agent_id, secret=kernel.secret, base_url="http://kernel.test",
                 _kernel_transport=kernel.transport(), **kw)


async def deliver(agent: Agent, execution_id: str, dispatch_id: str, attempt: int | None = 1, *,
                  lease: float | None = 120, secret: str | None = None, signature: str | None = "auto",
                  body: bytes | None = None) -> httpx2.Response:
    """POST a webhook to the agent's ASGI app, signed like the kernel does."""
    if body is None:
        payload: dict[str, Any] = {"execution_id": execution_id, "dispatch_id": dispatch_id}
        if attempt is not None:
            payload["dispatch_attempt"] = attempt
        if lease is not None:
            payload["lease_timeout_seconds"] = lease
        body = json.dumps(payload, separators=(",", ":")).encode()
    headers = {"Content-Type": "application/json"}
    if signature == "auto":
        headers["Rebuno-Signature"] = sign_legacy(secret or SECRET, body)
    elif signature is not None:
        headers["Rebuno-Signature"] = signature
    async with httpx2.AsyncClient(transport=httpx2.ASGITransport(app=agent.app), base_url="http://agent.test") as c:
        return await c.post(agent.webhook_path, content=body, headers=headers)
