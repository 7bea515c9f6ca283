"""What the agent scripts run in child processes share (`agent_app.py`,
`resource_agent_app.py`, `acceptance/crash_agent.py`): the marker file the
tests count effects in, a `LocalDirectory` that marks its driver calls, and
serving the agent on a free port."""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any, Awaitable, Callable

import uvicorn

from rebuno import Agent
from rebuno.drivers import LocalDirectory, LocalDirectoryHandle


def mark(line: str) -> None:
    """Append a line to the file named by `MARKERS`, durably: the process may
    be killed right after."""
    with open(os.environ["MARKERS"], "a") as f:
        f.write(line + "\n")
        f.flush()
        os.fsync(f.fileno())


class MarkedDirectory(LocalDirectory):
    """`LocalDirectory` that marks which driver methods ran (`create`, `open`)."""

    async def create(self, checkpoint_ref: str | None = None) -> tuple[LocalDirectoryHandle, dict[str, str]]:
        mark("create")
        return await super().create(checkpoint_ref)

    async def open(self, binding: Any) -> LocalDirectoryHandle:
        mark("open")
        return await super().open(binding)


def serve(process: Callable[..., Awaitable[Any]]) -> None:
    """Serve `process` as the agent `$AGENT_ID` on a free port of 127.0.0.1;
    print `PORT <n>` once serving. Blocks."""
    asyncio.run(_serve(process))


async def _serve(process: Callable[..., Awaitable[Any]]) -> None:
    agent = Agent(os.environ["AGENT_ID"])
    agent.bind(process)
    server = uvicorn.Server(uvicorn.Config(agent.app, host="127.0.0.1", port=0, log_level="warning"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    serving = asyncio.create_task(server.serve())
    while not server.started:
        if serving.done():
            serving.result()
            return
        await asyncio.sleep(0.01)
    print("PORT", server.servers[0].sockets[0].getsockname()[1], flush=True)
    await serving
