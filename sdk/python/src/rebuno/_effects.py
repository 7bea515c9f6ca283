"""The step protocol shared by `@tool`, `wrap_tool`, `step()` and MCP tools:
submit, run the body on `proceed`, report its outcome (docs/protocol/steps.md §1–§4, §10, docs/protocol/sdk.md §3).

Decisions map to outcomes:

| decision            | outcome                                                    |
|---------------------|------------------------------------------------------------|
| `proceed`           | the body runs; its result is recorded and returned         |
| `replay`            | the recorded result is returned, or its error raised as `ToolError` |
| `denied`            | `PolicyError`                                               |
| `rate_limited`      | `RateLimited`                                               |
| `blocked`, `execution_blocked` | `Blocked` (sticky)                             |
| `execution_terminal`, `409 lease_superseded` | `Terminated` (sticky)            |

Results are encoded as plain JSON (insertion order kept) and the live call
returns the decoded copy, so a live run and its replays see identical values.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any, Awaitable, Callable, Sequence

from ._kernel import Outcome
from .errors import REFUSING_DECISIONS, Blocked, Terminated, ToolError
from .execution import ExecutionContext, _step, require_context
from .identity import canonical_json
from .resources import StepGuard, valid_resource_key
from .types import Decision, DecisionKind

log = logging.getLogger("rebuno")

__all__ = ["run_effect", "encode_result", "error_message", "step_error", "step_error_json", "validate_resources",
           "validate_idempotency"]

CANCELLED_ERROR = '{"message":"cancelled after start","type":"cancelled"}'


def validate_idempotency(idempotency: str) -> str:
    if idempotency not in ("safe_to_retry", "at_most_once"):
        raise ValueError(f"idempotency must be 'safe_to_retry' or 'at_most_once', not {idempotency!r}")
    return idempotency


def validate_resources(resources: Sequence[str] | None) -> list[str]:
    """Check `resources=` keys (docs/protocol/resources.md §1, docs/protocol/sdk.md §4.1): each 1–128
    characters from `A–Z a–z 0–9 . _ -`, not `.` or `..`; duplicates dropped,
    keeping the first."""
    if resources is None:
        return []
    if isinstance(resources, (str, bytes)):
        raise ValueError("resources must be a list of resource keys, not a string")
    out: list[str] = []
    for key in resources:
        if not valid_resource_key(key):
            raise ValueError(f"invalid resource key {key!r}: 1 to 128 characters from A-Z a-z 0-9 . _ -, "
                             "and neither '.' nor '..'")
        if key not in out:
            out.append(key)
    if len(out) > 32:
        raise ValueError("at most 32 resources may be declared")
    return out


def _dumps(value: Any, ensure_ascii: bool) -> str:
    return json.dumps(value, ensure_ascii=ensure_ascii, separators=(",", ":"), allow_nan=False)


def encode_result(value: Any) -> str:
    """Plain JSON text of a result; `TypeError` names the first type that
    cannot be encoded (`datetime`, ...), `ValueError` for NaN/Infinity."""
    try:
        text = _dumps(value, False)
    except TypeError:
        raise TypeError(_first_unencodable(value)) from None
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:  # lone surrogates: escape them, the kernel maps them to U+FFFD
        text = _dumps(value, True)
    return text


def _first_unencodable(value: Any) -> str:
    stack = [value]
    while stack:
        v = stack.pop(0)
        if v is None or isinstance(v, (str, int, float, bool)):
            continue
        if isinstance(v, (list, tuple)):
            stack[0:0] = list(v)
            continue
        if isinstance(v, dict):
            for k, item in v.items():
                if not isinstance(k, (str, int, float, bool)) and k is not None:
                    return type(k).__name__
                stack.append(item)
            continue
        return type(v).__name__
    return type(value).__name__


def error_message(error: Any) -> str:
    """The message of a recorded step error: its string `message`, else `reason`,
    else its JSON text (docs/protocol/sdk.md §3)."""
    if isinstance(error, dict):
        for key in ("message", "reason"):
            if isinstance(error.get(key), str):
                return str(error[key])
    return json.dumps(error, ensure_ascii=False, separators=(",", ":"))


def step_error(exc: BaseException) -> dict[str, str]:
    """The recorded error of a step whose body raised `exc`."""
    return {"message": str(exc), "type": type(exc).__name__}


def step_error_json(exc: BaseException) -> str:
    """`step_error` as the JSON text of a `fail` (ASCII, so that a lone
    surrogate in a message cannot break the UTF-8 body)."""
    return json.dumps(step_error(exc), ensure_ascii=True, separators=(",", ":"))


def decision_outcome(ctx: ExecutionContext, target: str, decision: Decision) -> Any:
    """Return or raise the outcome of a decision other than `proceed`."""
    if decision.decision == DecisionKind.REPLAY:
        if decision.has_error:
            raise ToolError(target, error_message(decision.error), error=decision.error, step_id=decision.step_id)
        return decision.result
    if decision.decision in REFUSING_DECISIONS:
        raise ctx.refused(decision)
    raise ToolError(target, f"unexpected decision {decision.decision!r} from the kernel")


async def report(ctx: ExecutionContext, target: str, step_id: str, *, succeeded: bool, value_json: str,
                 captures: tuple[list[dict[str, Any]], list[dict[str, Any]]] | None = None,
                 defer: bool = False) -> Any:
    """Record a step's outcome (with the captures taken after its body);
    return the outcome that stands (the kernel's stored one when it answers
    `replay`).

    With `defer` (a `safe_to_retry` step) the outcome may instead wait for
    the dispatch's next request to carry it (docs/protocol/steps.md §13); the value the code
    goes on with is then its own."""
    caps, failures = captures if captures is not None else ([], [])
    outcome = Outcome(step_id, succeeded, value_json, caps, failures)
    if not ctx.outbox.idle:
        await ctx.outbox.flush()  # outcomes reach the kernel in the order their steps ended
    if defer and ctx.outbox.defer(outcome):
        return None
    try:
        decision = await ctx.kernel.step_outcome(ctx.execution_id, ctx.lease, outcome)
    except Terminated as t:
        raise ctx.terminated(t) from None
    if decision.decision == DecisionKind.RECORDED:
        return None
    if decision.decision == DecisionKind.REPLAY:
        return decision
    return decision_outcome(ctx, target, decision)


async def run_effect(kind: str, target: str, args: Any, body: Callable[[], Awaitable[Any]], *,
                     idempotency: str = "safe_to_retry", resources: Sequence[str] = (),
                     what: str = "a tool") -> Any:
    """Run one governed effect (a tool call or local step) and return its
    (recorded or replayed) result.

    While the execution has resources the whole call — submit, body, due
    captures, outcome — holds the step lock, unless it is made from inside
    another running body (docs/protocol/sdk.md §4.5)."""
    ctx = require_context(what)
    async with StepGuard(ctx, resources) as guard:
        return await _run_locked(ctx, guard, kind, target, args, body, idempotency, what)


async def _run_locked(ctx: ExecutionContext, guard: StepGuard, kind: str, target: str, args: Any,
                      body: Callable[[], Awaitable[Any]], idempotency: str, what: str) -> Any:
    decision = await ctx.submit(kind, target, canonical_json(args), idempotency, list(guard.declared))
    if decision.decision != DecisionKind.PROCEED:
        return decision_outcome(ctx, target, decision)
    step_id = decision.step_id or ""
    guard.started(decision)
    label = f"{what} ({step_id[:12]})"
    # An at_most_once outcome is durable before the call returns: an
    # unreported run of such a step is never run again (docs/protocol/steps.md §6).
    defer = idempotency == "safe_to_retry"
    token = _step.set(step_id)
    try:
        with guard.body():
            value = await body()
    except asyncio.CancelledError:
        if not ctx.stopping and ctx.signal is None:
            # The body alone was cancelled and the dispatch goes on: record it,
            # with its due capture, shielded from the cancellation.
            await asyncio.shield(_report_cancelled(ctx, target, step_id, guard, label))
        raise
    except (Blocked, Terminated):
        # A nested step met a signal: leave this step executing; it re-runs
        # (or is found indeterminate) when the execution resumes.
        raise
    except Exception as exc:
        if ctx.signal is not None:
            raise ctx.signal from exc
        caps = await guard.captures(label)
        stored = await report(ctx, target, step_id, succeeded=False, value_json=step_error_json(exc), captures=caps,
                              defer=defer)
        if isinstance(stored, Decision):
            return decision_outcome(ctx, target, stored)
        raise ToolError(target, str(exc), error=step_error(exc), step_id=step_id) from exc
    finally:
        _step.reset(token)
    try:
        text = encode_result(value)
    except (TypeError, ValueError) as exc:
        unencodable = TypeError(f"result is not JSON-serializable: {exc}")
        caps = await guard.captures(label)
        await report(ctx, target, step_id, succeeded=False, value_json=step_error_json(unencodable), captures=caps)
        raise ToolError(target, str(unencodable), step_id=step_id) from exc
    caps = await guard.captures(label)
    stored = await report(ctx, target, step_id, succeeded=True, value_json=text, captures=caps, defer=defer)
    if isinstance(stored, Decision):
        return decision_outcome(ctx, target, stored)
    return json.loads(text)


async def _report_cancelled(ctx: ExecutionContext, target: str, step_id: str, guard: StepGuard,
                            label: str) -> None:
    try:
        caps = await guard.captures(label)
        await report(ctx, target, step_id, succeeded=False, value_json=CANCELLED_ERROR, captures=caps)
    except Exception as exc:  # the cancellation propagates whatever happens here
        log.warning("rebuno: could not record the cancellation of step %s (%s): %s", target, step_id, exc)

