"""Calling user code that may be a plain or an `async` function."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Callable

__all__ = ["is_async_callable", "call_maybe_async", "call_off_loop"]


def is_async_callable(fn: Any) -> bool:
    """Whether calling `fn` returns a coroutine: an `async def` function, or an
    object whose `__call__` is one."""
    return inspect.iscoroutinefunction(fn) or inspect.iscoroutinefunction(getattr(fn, "__call__", None))


async def call_maybe_async(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Call `fn` on the event loop; await its result when it is awaitable."""
    result = fn(*args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result


async def call_off_loop(fn: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """Await an async `fn`; run a plain one in a worker thread, so that it
    cannot stall the heartbeats, and await what it returns when that is
    awaitable. The thread inherits the execution context."""
    if is_async_callable(fn):
        return await fn(*args, **kwargs)
    result = await asyncio.to_thread(fn, *args, **kwargs)
    if inspect.isawaitable(result):
        result = await result
    return result
