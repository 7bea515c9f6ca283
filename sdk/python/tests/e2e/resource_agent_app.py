"""An agent with a `LocalDirectory` resource, run in a child process by the
resource crash test: `python resource_agent_app.py`.

Environment: `REBUNO_URL`, `REBUNO_AGENT_SECRET`, `AGENT_ID`, `MARKERS` (a
file that driver calls and tool bodies append a line to), `REBUNO_LOCAL_RESOURCES`
(the driver's root), `RELEASE` (when set, `slow_write` returns instead of
holding until the process is killed). Prints `PORT <n>` once serving.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any

import uvicorn

from rebuno import Agent, CheckpointPolicy, resource, tool
from rebuno.drivers import LocalDirectory
from rebuno.drivers.local_directory import LocalDirectoryHandle

MARKERS = os.environ["MARKERS"]


def mark(name: str) -> None:
    with open(MARKERS, "a") as f:
        f.write(name + "\n")
        f.flush()
        os.fsync(f.fileno())


class MarkedDirectory(LocalDirectory):
    """`LocalDirectory` that records which driver methods ran."""

    async def create(self, checkpoint_ref: str | None = None) -> tuple[LocalDirectoryHandle, dict[str, str]]:
        mark("create")
        return await super().create(checkpoint_ref)

    async def open(self, binding: Any) -> LocalDirectoryHandle:
        mark("open")
        return await super().open(binding)


async def process(task: str) -> dict[str, Any]:
    workspace = await resource("workspace", driver=MarkedDirectory(), checkpoints=CheckpointPolicy(every_steps=1))

    @tool("write_file", resources=["workspace"])
    async def write_file(path: str, content: str) -> str:
        """Write a file in the workspace."""
        await workspace.files.write(path, content)
        mark(f"write:{path}")
        return f"wrote {path}"

    @tool("slow_write", resources=["workspace"])
    async def slow_write(path: str, content: str) -> str:
        """Write a file, then hold until the test kills this process."""
        await workspace.files.write(path, content)
        mark(f"slow:{path}")
        if not os.environ.get("RELEASE"):
            await asyncio.Event().wait()
        return f"wrote {path} slowly"

    results = [await write_file("a.txt", "1"), await slow_write("slow.txt", "2"), await write_file("c.txt", "3")]
    return {"task": task, "results": results}


async def main() -> None:
    agent = Agent(os.environ["AGENT_ID"])
    agent.bind(process)
    server = uvicorn.Server(uvicorn.Config(agent.app, host="127.0.0.1", port=0, log_level="warning"))
    server.capture_signals = contextlib.nullcontext  # type: ignore[method-assign,assignment]
    task = asyncio.create_task(server.serve())
    while not server.started:
        if task.done():
            task.result()
            return
        await asyncio.sleep(0.01)
    print("PORT", server.servers[0].sockets[0].getsockname()[1], flush=True)
    await task


if __name__ == "__main__":
    asyncio.run(main())
