"""`@tool` and `wrap_tool`: functions whose calls are governed, recorded steps
of kind `tool_call`.

The decorated function keeps its signature, annotations and docstring, and its
`__name__` is the tool id, so frameworks that read them (LangChain's
`create_agent(tools=[...])`) see the original tool. A policy denial is caught
and returned as a string the model can read; every other outcome is the
step's (docs/protocol/sdk.md §3).
"""

from __future__ import annotations

import functools
import inspect
from typing import Any, Awaitable, Callable, Literal, Sequence, TypeVar, overload

from ._callables import call_off_loop
from ._effects import run_effect, validate_idempotency, validate_resources
from .errors import PolicyError

__all__ = ["tool", "wrap_tool", "denial_message", "Idempotency"]

Idempotency = Literal["safe_to_retry", "at_most_once"]
F = TypeVar("F", bound=Callable[..., Any])


def denial_message(tool_id: str, err: PolicyError) -> str:
    """The string a denied tool returns to its caller (usually a model)."""
    rule = f" (rule {err.rule_id})" if err.rule_id else ""
    return f"Tool '{tool_id}' was denied: {err.reason}{rule}. Do not retry this call."


def _call_args(sig: inspect.Signature, args: tuple[Any, ...], kwargs: dict[str, Any]) -> dict[str, Any]:
    """The arguments of a call by parameter name, defaults applied: the step's args."""
    bound = sig.bind(*args, **kwargs)
    bound.apply_defaults()
    out: dict[str, Any] = {}
    for i, (name, value) in enumerate(bound.arguments.items()):
        if i == 0 and name in ("self", "cls"):
            continue
        param = sig.parameters[name]
        if param.kind is inspect.Parameter.VAR_KEYWORD:
            out[name] = dict(value)  # nested under its name, as the published client records it
        elif param.kind is inspect.Parameter.VAR_POSITIONAL:
            out[name] = list(value)
        else:
            out[name] = value
    return out


def _make(fn: Callable[..., Any], tool_id: str, idempotency: str, resources: list[str]) -> Callable[..., Any]:
    sig = inspect.signature(fn)

    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        call_args = _call_args(sig, args, kwargs)

        async def body() -> Any:
            return await call_off_loop(fn, *args, **kwargs)

        try:
            return await run_effect("tool_call", tool_id, call_args, body, idempotency=idempotency,
                                    resources=resources, what=f"tool {tool_id!r}")
        except PolicyError as err:
            return denial_message(tool_id, err)

    functools.update_wrapper(wrapper, fn)
    wrapper.__name__ = tool_id
    wrapper.__qualname__ = tool_id
    wrapper.__signature__ = sig  # type: ignore[attr-defined]
    wrapper.__rebuno_tool__ = {  # type: ignore[attr-defined]
        "id": tool_id, "idempotency": idempotency, "resources": list(resources)}
    return wrapper


@overload
def tool(id: F, /) -> F: ...


@overload
def tool(id: str | None = None, /, *, idempotency: Idempotency = "safe_to_retry",
         resources: Sequence[str] | None = None) -> Callable[[F], F]: ...


def tool(id: Any = None, /, *, idempotency: Idempotency = "safe_to_retry",
         resources: Sequence[str] | None = None) -> Any:
    """Make a function a governed tool.

        @tool                                   # id = the function's name
        @tool("web_search")                     # explicit id
        @tool("send_email", idempotency="at_most_once")
        @tool("write_file", resources=["workspace"])

    The result is an `async` function with the same signature and docstring.
    Each call submits a `tool_call` step whose args are the call's arguments by
    name; on replay the recorded result is returned without running the body.
    `idempotency="at_most_once"` makes the kernel refuse to run a call again
    when an earlier run's outcome is unknown.
    """
    validate_idempotency(idempotency)
    keys = validate_resources(resources)
    if callable(id):
        fn = id
        return _make(fn, fn.__name__, idempotency, keys)
    if id is not None and (not isinstance(id, str) or not id):
        raise ValueError("a tool id must be a non-empty string")

    def decorate(fn: F) -> F:
        return _make(fn, id or fn.__name__, idempotency, keys)  # type: ignore[return-value]

    return decorate


def wrap_tool(fn: Callable[..., Any] | Callable[..., Awaitable[Any]], id: str | None = None, *,
              idempotency: Idempotency = "safe_to_retry",
              resources: Sequence[str] | None = None) -> Callable[..., Awaitable[Any]]:
    """Wrap an existing function (sync or async) as a governed tool without
    decorator syntax: `search = wrap_tool(raw_search, "web_search")`."""
    validate_idempotency(idempotency)
    keys = validate_resources(resources)
    tool_id = id or getattr(fn, "__name__", None)
    if not tool_id or not isinstance(tool_id, str):
        raise ValueError("wrap_tool needs an id for a callable without __name__")
    return _make(fn, tool_id, idempotency, keys)
