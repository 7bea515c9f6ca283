"""Exceptions raised by the SDK.

Two families:

* **Step outcomes and control flow** (raised inside a handler): `PolicyError`,
  `RateLimited`, `ToolError`, `Blocked`, `Terminated`.
* **API errors** (raised by `Client` and by agent requests the kernel refuses):
  `APIError` and one subclass per envelope code (docs/protocol/errors.md §2).

`ExecutionFailedError` is raised by `Client.run` when the execution it ran
ended without an output.

`raise_for_refusal()` turns a kernel refusal that reached a provider SDK as a
synthetic HTTP response (docs/protocol/sdk.md §3) back into one of the first family.
"""

from __future__ import annotations

import json
import re
from typing import Any, Mapping

from .types import Decision, DecisionKind, Execution

__all__ = [
    "RebunoError",
    "PolicyError",
    "RateLimited",
    "ToolError",
    "Blocked",
    "Terminated",
    "CheckpointUnavailable",
    "ExecutionFailedError",
    "APIError",
    "ValidationError",
    "UnauthorizedError",
    "ForbiddenError",
    "NotFoundError",
    "MethodNotAllowedError",
    "ConflictError",
    "ExecutionTerminalError",
    "LeaseSupersededError",
    "PayloadTooLargeError",
    "UnsupportedMediaTypeError",
    "InternalServerError",
    "UnavailableError",
    "raise_for_refusal",
    "refusal_error",
    "decision_error",
    "is_signal",
    "REFUSING_DECISIONS",
    "REFUSAL_MARKER",
]

REFUSAL_MARKER = "rebuno_refusal"
# The decisions that end a step call with an exception (`decision_error`).
REFUSING_DECISIONS = frozenset({DecisionKind.DENIED, DecisionKind.RATE_LIMITED, DecisionKind.BLOCKED,
                                DecisionKind.EXECUTION_BLOCKED, DecisionKind.EXECUTION_TERMINAL})


class RebunoError(Exception):
    """Base class of every exception the SDK raises."""


# ---------------------------------------------------------------------------
# Step outcomes and control flow


class PolicyError(RebunoError):
    """The kernel denied a step (policy rule, human denial, approval timeout,
    or an `at_most_once` retry after an indeterminate outcome)."""

    def __init__(self, reason: str, *, rule_id: str | None = None, step_id: str | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.rule_id = rule_id
        self.step_id = step_id


class RateLimited(RebunoError):
    """The kernel refused a step because a rate limit is exhausted. Nothing was
    recorded: the same call made later gets the same step id."""

    def __init__(self, reason: str, *, retry_after_ms: int | None = None, rule_id: str | None = None) -> None:
        super().__init__(reason if retry_after_ms is None else f"{reason} (retry after {retry_after_ms} ms)")
        self.reason = reason
        self.retry_after_ms = retry_after_ms
        self.rule_id = rule_id


class ToolError(RebunoError):
    """A tool, local step or LLM call failed: live (its body raised) or on
    replay (the recorded outcome is an error)."""

    def __init__(self, tool_id: str, message: str, *, error: Any = None, step_id: str | None = None) -> None:
        super().__init__(message)
        self.tool_id = tool_id
        self.message = message
        self.error = error
        self.step_id = step_id


class Blocked(RebunoError):
    """Control flow: a step awaits approval (or the execution is blocked by one).
    The dispatch unwinds; the kernel redelivers once the approval is decided."""

    def __init__(self, message: str = "execution is blocked awaiting approval", *,
                 approval_id: str | None = None, step_id: str | None = None) -> None:
        super().__init__(message)
        self.approval_id = approval_id
        self.step_id = step_id


class Terminated(RebunoError):
    """Control flow: this dispatch must stop. `reason` is `execution_terminal`
    (the execution is completed, failed or cancelled), `lease_superseded` (a
    newer attempt owns the execution), `abandoned` (the kernel was unreachable
    for a whole lease, or did not record a step outcome), `outcome_conflict`
    (another run of a step recorded a different outcome than the one this
    handler went on with; the next attempt replays it) or `closed` (the agent
    is shutting down)."""

    def __init__(self, reason: str = "execution_terminal") -> None:
        super().__init__(reason)
        self.reason = reason


class CheckpointUnavailable(RebunoError):
    """Raised by a resource driver's `create(checkpoint_ref)` when the
    checkpoint it was asked to restore is missing, expired or damaged.

    `resource()` then fails the execution at once with the reason
    `checkpoint_unavailable: resource "<key>": <message>`, marks the dispatch
    terminal and re-raises it; a fork whose checkpoint is gone ends `failed`.
    """


class ExecutionFailedError(RebunoError):
    """`Client.run` ran an execution that ended `failed` or `cancelled`.

    `execution` is the execution as it ended; `status` and `reason` (its
    `failure_reason`: the agent's text, `dispatch_exhausted`,
    `client_cancelled`, `deadline_exceeded`, ...) are copied from it.
    """

    def __init__(self, execution: Execution) -> None:
        self.execution = execution
        self.execution_id = execution.id
        self.status = execution.status
        self.reason = execution.failure_reason
        super().__init__(f"execution {execution.id} {execution.status}" + (f": {self.reason}" if self.reason else ""))


# ---------------------------------------------------------------------------
# API errors


class APIError(RebunoError):
    """A non-2xx answer from the kernel, mapped from the envelope's `code`."""

    code: str = ""
    status: int = 0  # the status the kernel answers this code with

    def __init__(self, status: int, code: str, message: str, details: Mapping[str, Any] | None = None) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code
        self.message = message
        self.details: dict[str, Any] = dict(details or {})


class ValidationError(APIError):
    code, status = "validation_error", 400


class UnauthorizedError(APIError):
    code, status = "unauthorized", 401


class ForbiddenError(APIError):
    code, status = "forbidden", 403


class NotFoundError(APIError):
    code, status = "not_found", 404


class MethodNotAllowedError(APIError):
    code, status = "method_not_allowed", 405


class ConflictError(APIError):
    code, status = "conflict", 409


class ExecutionTerminalError(APIError):
    code, status = "execution_terminal", 409


class LeaseSupersededError(APIError):
    code, status = "lease_superseded", 409


class PayloadTooLargeError(APIError):
    code, status = "payload_too_large", 413


class UnsupportedMediaTypeError(APIError):
    """A body sent without `Content-Type: application/json` (the SDK always sends it)."""

    code, status = "unsupported_media_type", 415


class InternalServerError(APIError):
    code, status = "internal_error", 500


class UnavailableError(APIError):
    code, status = "unavailable", 503


_API_ERRORS: tuple[type[APIError], ...] = (
    ValidationError, UnauthorizedError, ForbiddenError, NotFoundError, MethodNotAllowedError, ConflictError,
    ExecutionTerminalError, LeaseSupersededError, PayloadTooLargeError, UnsupportedMediaTypeError,
    InternalServerError, UnavailableError,
)
_BY_CODE = {cls.code: cls for cls in _API_ERRORS}
# Several codes share 409; `conflict` is the class of a 409 without a code.
_BY_STATUS = {cls.status: cls for cls in reversed(_API_ERRORS)}


def api_error(status: int, body: bytes) -> APIError:
    """Build the typed error for a non-2xx answer. Clients branch on `code`
    (docs/protocol/errors.md §1); the status only picks a class when the body has no code."""
    code, message, details = "", "", None
    try:
        data = json.loads(body)
    except ValueError:
        data = None
    if isinstance(data, dict):
        if isinstance(data.get("code"), str):
            code = data["code"]
        if isinstance(data.get("message"), str):
            message = data["message"]
        if isinstance(data.get("details"), dict):
            details = data["details"]
    if not message:
        message = body[:200].decode("utf-8", "replace") or f"HTTP {status}"
    cls = _BY_CODE.get(code) or _BY_STATUS.get(status, APIError)
    return cls(status, code or cls.code, message, details)


# ---------------------------------------------------------------------------
# Refusals carried through provider SDKs (docs/protocol/sdk.md §3)

_MARKER_RE = re.compile(r"rebuno_refusal: ([a-z_]+)(?: reason=(.*))?")


def refusal_message(code: str, reason: str | None) -> str:
    """The message of a synthetic refusal: `rebuno_refusal: <code>[ reason=<reason>]`."""
    return f"{REFUSAL_MARKER}: {code}" + (f" reason={reason}" if reason else "")


def _refusal_from_payload(payload: Any) -> dict[str, Any] | None:
    """Find `{"type":"rebuno_refusal","code":...}` in a parsed provider error body."""
    if not isinstance(payload, dict):
        return None
    if payload.get("type") == REFUSAL_MARKER and isinstance(payload.get("code"), str):
        return payload
    inner = payload.get("error")
    if isinstance(inner, dict):
        return _refusal_from_payload(inner)
    return None


def _refusal_from_text(text: str) -> dict[str, Any] | None:
    m = _MARKER_RE.search(text)
    if m is None:
        return None
    reason = m.group(2)
    if reason is not None:
        # The message may be embedded in a larger repr: cut at a quote.
        reason = re.split(r"['\"]", reason, maxsplit=1)[0].rstrip(" ,}")
    return {"code": m.group(1), "reason": reason}


def _find_refusal(exc: BaseException, seen: set[int]) -> dict[str, Any] | None:
    if id(exc) in seen:
        return None
    seen.add(id(exc))
    body = getattr(exc, "body", None)
    found = _refusal_from_payload(body)
    if found is None:
        response = getattr(exc, "response", None)
        headers = getattr(response, "headers", None)
        if headers is not None and hasattr(headers, "get") and headers.get("rebuno-refusal"):
            content = getattr(response, "content", b"")
            try:
                found = _refusal_from_payload(json.loads(content)) if isinstance(content, (bytes, str)) else None
            except (ValueError, TypeError):
                found = None
            if found is None:
                found = {"code": str(headers.get("rebuno-refusal"))}
    if found is None:
        for arg in getattr(exc, "args", ()):
            if isinstance(arg, str):
                found = _refusal_from_text(arg)
                if found:
                    break
    if found is None:
        try:
            found = _refusal_from_text(str(exc))
        except Exception:  # a broken __str__ must not hide the original error
            found = None
    if found is not None:
        return found
    nested: list[BaseException] = []
    if isinstance(exc, BaseExceptionGroup):
        nested.extend(exc.exceptions)
    if exc.__cause__ is not None:
        nested.append(exc.__cause__)
    if exc.__context__ is not None:
        nested.append(exc.__context__)
    for inner in nested:
        found = _find_refusal(inner, seen)
        if found is not None:
            return found
    return None


def refusal_error(code: str, *, reason: str | None = None, rule_id: str | None = None,
                  retry_after_ms: int | None = None, approval_id: str | None = None,
                  step_id: str | None = None) -> PolicyError | RateLimited | Blocked | Terminated:
    """The exception for a kernel refusal: a refusing decision, or the error
    code `lease_superseded`; any other code means the execution is terminal.
    Every decision that becomes an exception becomes it here."""
    if code == DecisionKind.DENIED:
        return PolicyError(reason or "policy_denied", rule_id=rule_id, step_id=step_id)
    if code == DecisionKind.RATE_LIMITED:
        return RateLimited(reason or "rate_limit_exceeded", retry_after_ms=retry_after_ms, rule_id=rule_id)
    if code == DecisionKind.BLOCKED:
        return Blocked("step awaits approval", approval_id=approval_id, step_id=step_id)
    if code == DecisionKind.EXECUTION_BLOCKED:
        return Blocked("execution is blocked", approval_id=approval_id, step_id=step_id)
    if code == LeaseSupersededError.code:
        return Terminated("lease_superseded")
    return Terminated("execution_terminal")


def decision_error(decision: Decision) -> PolicyError | RateLimited | Blocked | Terminated:
    """`refusal_error` of a refusing decision (see `REFUSING_DECISIONS`)."""
    return refusal_error(decision.decision, reason=decision.reason, rule_id=decision.rule_id,
                         retry_after_ms=decision.retry_after_ms, approval_id=decision.approval_id,
                         step_id=decision.step_id)


def is_signal(exc: BaseException) -> bool:
    """Whether an exception is a control-flow signal (`Blocked`, `Terminated`):
    the dispatch unwinds and the kernel's state stands; never a failure."""
    return isinstance(exc, (Blocked, Terminated))


def raise_for_refusal(exc: BaseException) -> None:
    """Re-raise a kernel refusal wrapped in a provider SDK's error as the SDK's
    own exception; return normally when `exc` carries no refusal.

    The LLM transport answers denials, approvals, rate limits and terminal or
    superseded executions with a synthetic HTTP 403/429 whose message starts
    with `rebuno_refusal` (docs/protocol/sdk.md §3). Provider clients turn it into their
    own error type; this finds the marker in the exception, its body, its
    response, or its cause/context chain. `Blocked` and `Terminated` already
    recorded on the current execution are re-raised as recorded.

        try:
            reply = await llm.ainvoke(messages)
        except Exception as e:
            raise_for_refusal(e)
            raise
    """
    if isinstance(exc, RebunoError) and not isinstance(exc, APIError):
        if isinstance(exc, (PolicyError, RateLimited, Blocked, Terminated)):
            raise exc
        return
    found = _find_refusal(exc, set())
    if found is None:
        return
    code = str(found.get("code"))
    reason = found.get("reason")
    if not isinstance(reason, str) or not reason:
        message = found.get("message")
        parsed = _refusal_from_text(message) if isinstance(message, str) else None
        reason = parsed.get("reason") if parsed else None
    rule_id = found.get("rule_id") if isinstance(found.get("rule_id"), str) else None
    retry = found.get("retry_after_ms")
    retry_after_ms = retry if isinstance(retry, int) and not isinstance(retry, bool) else None
    error = refusal_error(code, reason=reason, rule_id=rule_id, retry_after_ms=retry_after_ms)
    if is_signal(error):
        from .execution import current_context  # late import: execution imports errors

        ctx = current_context()
        if ctx is not None and ctx.signal is not None:
            raise ctx.signal from exc
    raise error from exc
