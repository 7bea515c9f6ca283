"""`step()`: record a piece of local non-determinism (kind `local`).

    started = await step("now", time.time)
    token = await step("new_token", lambda: secrets.token_hex(16))
    page = await step("fetch_page", lambda: fetch(url), {"url": url})

The first run calls `fn` and records its result; every replay returns the
recorded result without calling it. `args` is part of the step's identity
(no args are recorded as `{}`, as the published client records them), so
calls that should record separately need different names or args. A local step that no policy rule matches is always allowed
(docs/protocol/steps.md §9); an explicit rule can still deny it, which raises
`PolicyError` here (unlike `@tool`, which returns a string).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, Literal, Sequence, TypeVar

from ._callables import call_maybe_async
from ._effects import run_effect, validate_idempotency, validate_resources

__all__ = ["step"]

T = TypeVar("T")


async def step(name: str, fn: Callable[[], T] | Callable[[], Awaitable[T]], args: Any = None,
               idempotency: Literal["safe_to_retry", "at_most_once"] = "safe_to_retry", *,
               resources: Sequence[str] | None = None) -> T:
    """Run `fn()` once per execution and replay its result afterwards.

    `fn` takes no arguments and may be sync or async; its result must be JSON.
    Raises `ToolError` when `fn` raised (live or on replay), `PolicyError`
    when denied, `RateLimited` when rate limited.
    """
    if not isinstance(name, str) or not name:
        raise ValueError("a step name must be a non-empty string")
    validate_idempotency(idempotency)
    keys = validate_resources(resources)

    async def body() -> Any:
        return await call_maybe_async(fn)

    result: T = await run_effect("local", name, {} if args is None else args, body, idempotency=idempotency, resources=keys,
                                 what=f"step {name!r}")
    return result
