"""Agent-side plumbing shared by the agent scripts of the compatibility suite.

Each script builds a ``rebuno.Agent`` (the published 0.29.2 client, unchanged) and
serves it with ``Agent.run``. The environment comes from the test
(kernel_harness.AgentProcess): ``REBUNO_URL`` and ``REBUNO_AGENT_SECRET`` (read by
the client itself), ``COMPAT_AGENT_ID``, ``COMPAT_PORT``, ``COMPAT_RECORD`` (the
file body runs are appended to), ``COMPAT_GATES`` (the folder of gate release
files) and, for LLM agents, ``COMPAT_LLM_URL``.
"""

from __future__ import annotations

import asyncio
import functools
import json
import logging
import os
from collections.abc import Callable
from typing import Any

from rebuno import Agent, execution

logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")

RECORD = os.environ["COMPAT_RECORD"]
GATES = os.environ["COMPAT_GATES"]


def _attempt() -> int | None:
    try:
        return execution().dispatch_attempt
    except RuntimeError:
        return None


def record(event: str, **fields: Any) -> None:
    """Appends one line for the test to count. A single O_APPEND write per line
    keeps lines of concurrent writers (and processes) whole."""
    line = {"event": event, "pid": os.getpid(), "attempt": _attempt(), **fields}
    data = (json.dumps(line) + "\n").encode()
    fd = os.open(RECORD, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, data)
    finally:
        os.close(fd)


async def gate(name: str) -> None:
    """Records that the handler reached gate ``name`` and waits until the test
    creates the release file of that name."""
    record(f"gate:{name}")
    path = os.path.join(GATES, name)
    while not os.path.exists(path):
        await asyncio.sleep(0.01)
    record(f"pass:{name}")


def traced(handler: Callable[..., Any]) -> Callable[..., Any]:
    """Wraps a handler so that its start and its end (returned, raised, or
    cancelled) are recorded. The signature is kept, so the client binds the
    input exactly as it would for the bare handler."""

    @functools.wraps(handler)
    async def wrapper(*args: Any, **kwargs: Any) -> Any:
        record("handler:start")
        try:
            out = await handler(*args, **kwargs)
        except asyncio.CancelledError:
            record("handler:exit", outcome="cancelled")
            raise
        except BaseException as e:
            record("handler:exit", outcome="raised", error=type(e).__name__)
            raise
        record("handler:exit", outcome="returned")
        return out

    return wrapper


def make_agent(**kwargs: Any) -> Agent:
    return Agent(os.environ["COMPAT_AGENT_ID"], **kwargs)


def serve(agent: Agent, handler: Callable[..., Any]) -> None:
    agent.run(traced(handler), host="127.0.0.1", port=int(os.environ["COMPAT_PORT"]))
