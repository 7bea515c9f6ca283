"""An agent with a `LocalDirectory` resource, run in a child process by the
resource crash test: `python resource_agent_app.py`.

Environment: `REBUNO_URL`, `REBUNO_AGENT_SECRET`, `AGENT_ID`, `MARKERS` (a
file that driver calls and tool bodies append a line to), `REBUNO_LOCAL_RESOURCES`
(the driver's root), `RELEASE` (when set, `slow_write` returns instead of
holding until the process is killed). Prints `PORT <n>` once serving.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from rebuno import CheckpointPolicy, resource, tool
from tests.e2e.child import MarkedDirectory, mark, serve


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


if __name__ == "__main__":
    serve(process)
