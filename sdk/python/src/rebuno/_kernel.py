"""The agent's signed client to the kernel (docs/protocol/auth.md §3, docs/protocol/sdk.md §1, §2).

Every request is signed with a fresh `v1` signature. Requests made for a
dispatch carry `Rebuno-Dispatch-Id` and `Rebuno-Dispatch-Attempt` (mutations
only: the kernel ignores them on reads); a submit also carries its step
occurrence, bound to the request by its own signature. Transport failures
are retried as docs/protocol/sdk.md §2 says, until a whole lease has passed since the last
renewal; then the attempt is abandoned (`Terminated("abandoned")`) without
reporting anything.

A submit, execution complete or fail may carry the outcome of an earlier
step (`carried`, docs/protocol/steps.md §13) once the kernel has advertised the extension.
"""

from __future__ import annotations

import asyncio
import enum
import json
import logging
import time
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

import httpx2

from ._backoff import Backoff
from ._transport import ConnectFailed, ConnectionPool, HttpxTransport, Transport, TransportFailed
from .errors import APIError, ExecutionTerminalError, LeaseSupersededError, Terminated, api_error
from .signing import sign_occurrence, sign_v1
from .types import Decision, DecisionKind, Execution, Resource

__all__ = ["KernelClient", "Lease", "LeaseClock", "Retry", "KernelResponse", "Outcome", "CARRIED_OUTCOME"]

# The extension token of docs/protocol/steps.md §13, advertised in Rebuno-Extensions.
CARRIED_OUTCOME = "carried-outcome"

log = logging.getLogger("rebuno")

# Retry budget of requests made outside any dispatch (metadata at start-up).
NO_LEASE_BUDGET = 10.0


class LeaseClock:
    """When the current attempt's lease was last renewed, on the monotonic clock.

    The SDK cannot see the kernel's clock; it uses the send time of the last
    request whose answer renewed the lease, which is never later than the
    kernel's renewal.
    """

    def __init__(self, lease_timeout_seconds: float) -> None:
        self.lease_timeout = float(lease_timeout_seconds)
        self.renewed_at = time.monotonic()

    def renewed(self, at: float) -> None:
        self.renewed_at = max(self.renewed_at, at)

    @property
    def deadline(self) -> float:
        return self.renewed_at + self.lease_timeout


@dataclass
class Lease:
    """What an agent request carries of its dispatch."""

    dispatch_id: str
    attempt: int | None
    clock: LeaseClock
    # Whether the kernel echoes Rebuno-Step-Occurrence (learned from the first
    # submit answer that carries a step id, docs/protocol/identity.md §7). None until known.
    occurrence_supported: bool | None = field(default=None)
    # Whether the kernel accepts carried outcomes (learned from the first
    # submit answer, docs/protocol/steps.md §13).
    carried_outcomes: bool = False


@dataclass
class Outcome:
    """A step's outcome as reported: its value as JSON text and the captures
    taken after its body (docs/protocol/sdk.md §4.6)."""

    step_id: str
    succeeded: bool
    value_json: str
    captures: list[dict[str, Any]] = field(default_factory=list)
    capture_failures: list[dict[str, Any]] = field(default_factory=list)

    def members(self) -> str:
        """The body members of a step complete or fail, without braces."""
        text = ('"result":' if self.succeeded else '"error":') + self.value_json
        if self.captures:
            text += ',"captures":' + _compact(self.captures)
        if self.capture_failures:
            text += ',"capture_failures":' + _compact(self.capture_failures)
        return text

    def carried(self) -> str:
        """`,"outcome":{…}`: the member a carrier appends to its body (docs/protocol/steps.md §13)."""
        return ',"outcome":{"step_id":"' + self.step_id + '",' + self.members() + "}"


class Retry(enum.Enum):
    NEVER = "never"
    ALWAYS = "always"
    SUBMIT = "submit"  # only when the occurrence makes a re-send safe (docs/protocol/identity.md §7)


@dataclass
class KernelResponse:
    status: int
    headers: dict[str, str]  # lower-case names
    body: bytes
    sent_at: float

    def json(self) -> Any:
        return json.loads(self.body) if self.body else None

    @property
    def ok(self) -> bool:
        return 200 <= self.status < 300


class KernelClient:
    """Signed HTTP client of one agent. One instance per `Agent`.

    `transport` replaces the connection pool with an `httpx2` transport (unit
    tests' in-memory kernels)."""

    def __init__(self, base_url: str, agent_id: str, secret: str, *, timeout: float,
                 transport: httpx2.AsyncBaseTransport | None = None) -> None:
        self.base_url = base_url.rstrip("/")
        self.agent_id = agent_id
        self._agent_header = agent_id.encode("utf-8")
        self._secret = secret
        self._base_path = urlsplit(self.base_url).path
        self._transport: Transport = (HttpxTransport(self.base_url, timeout, transport) if transport is not None
                                      else ConnectionPool(self.base_url, timeout))

    async def aclose(self) -> None:
        await self._transport.aclose()

    # ------------------------------------------------------------------ core

    def _headers(self, method: str, target: str, body: bytes, lease: Lease | None,
                 occurrence: int | None) -> list[tuple[bytes, bytes]]:
        timestamp = str(int(time.time()))
        headers = [(b"Content-Type", b"application/json"), (b"Rebuno-Agent-Id", self._agent_header),
                   (b"Rebuno-Timestamp", timestamp.encode("ascii"))]
        dispatch_id = attempt = None
        if lease is not None and method != "GET":
            dispatch_id = lease.dispatch_id
            headers.append((b"Rebuno-Dispatch-Id", dispatch_id.encode("ascii")))
            if lease.attempt is not None:
                attempt = str(lease.attempt)
                headers.append((b"Rebuno-Dispatch-Attempt", attempt.encode("ascii")))
        signature = sign_v1(self._secret, method, target, timestamp, dispatch_id, attempt, body)
        headers.append((b"Rebuno-Signature", signature.encode("ascii")))
        if occurrence is not None and dispatch_id is not None:
            value = str(occurrence)
            headers.append((b"Rebuno-Step-Occurrence", value.encode("ascii")))
            headers.append((b"Rebuno-Occurrence-Signature", sign_occurrence(self._secret, signature, value).encode("ascii")))
        return headers

    async def request(self, method: str, path: str, *, body: bytes = b"", lease: Lease | None = None,
                      occurrence: int | None = None, retry: Retry = Retry.ALWAYS) -> KernelResponse:
        """Send one signed request, retrying transport failures per docs/protocol/sdk.md §2.

        Returns every HTTP answer except `409 lease_superseded`, which raises
        `Terminated("lease_superseded")`, and `503`, which is retried.
        Raises `Terminated("abandoned")` when retrying must stop.
        """
        target = self._base_path + path
        backoff = Backoff()
        started = time.monotonic()
        while True:
            sent_at = time.monotonic()
            failure: BaseException | None = None
            connect_phase = False
            try:
                resp = await self._transport.send(method, target, self._headers(method, target, body, lease, occurrence),
                                                  body)
            except ConnectFailed as e:
                failure, connect_phase = e, True
            except TransportFailed as e:
                failure = e
            else:
                if resp.status == 409 and isinstance(api_error(409, resp.body), LeaseSupersededError):
                    raise Terminated("lease_superseded")
                if resp.status != 503:
                    return KernelResponse(resp.status, resp.headers, resp.body, sent_at)
                failure = api_error(503, resp.body)
            if retry is Retry.NEVER:
                if isinstance(failure, APIError):
                    raise failure
                raise Terminated("abandoned") from failure
            if retry is Retry.SUBMIT and not connect_phase:
                if occurrence is None or lease is None or lease.occurrence_supported is not True:
                    # The answer may have been lost after the kernel recorded the
                    # submit; re-sending without a trusted occurrence could make a
                    # second step. Abandon the attempt (docs/protocol/sdk.md §2, docs/protocol/identity.md §7).
                    log.warning("rebuno: submit answer lost (%s); abandoning the attempt", failure)
                    raise Terminated("abandoned") from failure
            deadline = lease.clock.deadline if lease is not None else started + NO_LEASE_BUDGET
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                log.warning("rebuno: kernel unreachable for a whole lease (%s); abandoning the attempt", failure)
                raise Terminated("abandoned") from failure
            wait = min(backoff.next(), remaining)  # the last try happens at the deadline
            log.info("rebuno: %s %s failed (%s); retrying in %.2fs", method, path, failure, wait)
            await asyncio.sleep(wait)

    # --------------------------------------------------------------- routes

    async def get_execution(self, execution_id: str, lease: Lease | None) -> Execution:
        resp = await self.request("GET", f"/v0/executions/{execution_id}", lease=lease)
        _check(resp)
        return Execution.model_validate(resp.json())

    async def submit(self, execution_id: str, lease: Lease, body: bytes, occurrence: int) -> Decision:
        resp = await self.request("POST", f"/v0/executions/{execution_id}/steps", body=body, lease=lease,
                                  occurrence=occurrence, retry=Retry.SUBMIT)
        _check(resp)
        decision = Decision.from_json(resp.json())
        if decision.step_id is not None and lease.occurrence_supported is None:
            lease.occurrence_supported = resp.headers.get("rebuno-step-occurrence") is not None
        if not lease.carried_outcomes:
            offered = resp.headers.get("rebuno-extensions", "")
            lease.carried_outcomes = CARRIED_OUTCOME in (token.strip() for token in offered.split(","))
        if decision.decision != DecisionKind.EXECUTION_TERMINAL:
            lease.clock.renewed(resp.sent_at)
        return decision

    async def step_outcome(self, execution_id: str, lease: Lease, outcome: Outcome) -> Decision:
        """Record a step's outcome, with the captures taken after its body
        (docs/protocol/sdk.md §4.6), which the kernel commits with it."""
        verb = "complete" if outcome.succeeded else "fail"
        body = ("{" + outcome.members() + "}").encode("utf-8")
        resp = await self.request("POST", f"/v0/executions/{execution_id}/steps/{outcome.step_id}/{verb}",
                                  body=body, lease=lease)
        _check(resp)
        decision = Decision.from_json(resp.json())
        if decision.decision == DecisionKind.RECORDED:
            lease.clock.renewed(resp.sent_at)
        return decision

    async def stream_delta(self, execution_id: str, step_id: str, lease: Lease, seq: int, data: str) -> None:
        body = json.dumps({"seq": seq, "data": data}, ensure_ascii=False, separators=(",", ":")).encode("utf-8")
        resp = await self.request("POST", f"/v0/executions/{execution_id}/steps/{step_id}/stream", body=body,
                                  lease=lease, retry=Retry.NEVER)
        _check(resp)

    async def heartbeat(self, execution_id: str, lease: Lease) -> None:
        resp = await self.request("POST", f"/v0/executions/{execution_id}/heartbeat", lease=lease)
        self._renewing(resp, lease)

    async def finish_execution(self, execution_id: str, lease: Lease, *, output_json: str | None = None,
                               reason: str | None = None, carried: Outcome | None = None) -> bool:
        """Complete (when `output_json` is given) or fail the execution,
        carrying the last step's outcome when given.

        Returns True when the kernel recorded it, False when the execution was
        already terminal (`409 execution_terminal`, also the answer to a retry
        whose first try was recorded, docs/protocol/sdk.md §2).
        """
        path = "complete" if output_json is not None else "fail"
        body = finish_body(output_json=output_json, reason=reason, carried=carried).encode("utf-8", "replace")
        resp = await self.request("POST", f"/v0/executions/{execution_id}/{path}", body=body, lease=lease)
        try:
            _check(resp)
        except ExecutionTerminalError:
            return False
        return True

    # ------------------------------------------------------ resources

    async def register_resource(self, execution_id: str, lease: Lease, registration: dict[str, Any]) -> Resource:
        """Register a resource key, or confirm an identical registration;
        returns the resource view (docs/protocol/resources.md §4). A `409
        conflict` is raised as `ConflictError`."""
        resp = await self.request("POST", f"/v0/executions/{execution_id}/resources",
                                  body=_compact(registration).encode("utf-8"), lease=lease)
        self._renewing(resp, lease)
        return Resource.model_validate(resp.json())

    async def bind_resource(self, execution_id: str, lease: Lease, key: str, binding: Any) -> None:
        """Record the binding of a resource created in this dispatch."""
        resp = await self.request("POST", f"/v0/executions/{execution_id}/resources/{key}/binding",
                                  body=_compact({"binding": binding}).encode("utf-8"), lease=lease)
        self._renewing(resp, lease)

    async def publish_checkpoints(self, execution_id: str, lease: Lease, *, captures: list[dict[str, Any]],
                                  capture_failures: list[dict[str, Any]]) -> None:
        """Publish captures taken outside a step (baselines, completion)."""
        payload: dict[str, Any] = {}
        if captures:
            payload["captures"] = captures
        if capture_failures:
            payload["capture_failures"] = capture_failures
        resp = await self.request("POST", f"/v0/executions/{execution_id}/resources/checkpoints",
                                  body=_compact(payload).encode("utf-8"), lease=lease)
        self._renewing(resp, lease)

    @staticmethod
    def _renewing(resp: KernelResponse, lease: Lease) -> None:
        """Check the answer to a request that renews the lease when it succeeds."""
        _check(resp, terminal_stops=True)
        lease.clock.renewed(resp.sent_at)

    async def put_metadata(self, *, description: str | None, input_schema: dict[str, Any] | None) -> None:
        payload: dict[str, Any] = {}
        if description:
            payload["description"] = description[:4096]
        if input_schema is not None:
            payload["input_schema"] = input_schema
        body = json.dumps(payload, separators=(",", ":")).encode("utf-8")
        resp = await self.request("PUT", f"/v0/agents/{self.agent_id}/metadata", body=body)
        _check(resp)


def finish_body(*, output_json: str | None = None, reason: str | None = None, carried: Outcome | None = None) -> str:
    """The body of an execution complete (`output_json` given) or fail, with
    the carried outcome when there is one; the member order is the one of
    docs/protocol/vectors/carried-outcomes.json."""
    if output_json is not None:
        text = '{"output":' + output_json
    else:
        text = '{"error":' + json.dumps(reason or "", ensure_ascii=False)
    return text + (carried.carried() if carried is not None else "") + "}"


def _compact(value: Any) -> str:
    """Compact JSON; ASCII-escaped, so that a lone surrogate in a driver's
    message or binding cannot break the UTF-8 body."""
    return json.dumps(value, ensure_ascii=True, separators=(",", ":"), allow_nan=False)



def _check(resp: KernelResponse, *, terminal_stops: bool = False) -> None:
    """Raise the typed error of a non-2xx answer. With `terminal_stops`, a
    `409 execution_terminal` raises `Terminated` instead: the dispatch has
    nothing left to do."""
    if resp.ok:
        return
    error = api_error(resp.status, resp.body)
    if terminal_stops and isinstance(error, ExecutionTerminalError):
        raise Terminated("execution_terminal")
    raise error
