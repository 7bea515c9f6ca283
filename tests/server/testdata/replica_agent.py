"""The agent of the replica crash tests (tests/server), on this project's
Python SDK, run by the SDK's virtualenv with the SDK folder on PYTHONPATH:

    python replica_agent.py

Each execution runs `steps` tool calls and then one `at_most_once` call.
With `workspace`, it first registers a LocalDirectory resource captured after
every step, and every other call writes a file in it (a step whose outcome
carries a capture). Every body appends `<tool> <execution id> <step id>
<attempt>` to the `MARKERS` file before it returns, which is how the tests
count body runs.

Environment: `REBUNO_URL` (the load balancer), `REBUNO_AGENT_SECRET`,
`AGENT_ID`, `MARKERS`, `REBUNO_LOCAL_RESOURCES`, `STEP_PAUSE` (seconds each
body takes). Prints `PORT <n>` once serving.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from rebuno import CheckpointPolicy, execution, resource, tool
from rebuno.drivers import LocalDirectory
from tests.e2e.child import mark, serve

PAUSE = float(os.environ.get("STEP_PAUSE", "0.02"))


def ran(tool_id: str) -> None:
    ctx = execution()
    mark(f"{tool_id} {ctx.execution_id} {ctx.step_id} {ctx.dispatch_attempt}")


@tool("work")
async def work(n: int, i: int) -> dict[str, int]:
    """A step with no side effect but its time."""
    await asyncio.sleep(PAUSE)
    ran("work")
    return {"n": n, "i": i}


@tool("charge", idempotency="at_most_once")
async def charge(n: int) -> str:
    """A step that must never run twice."""
    await asyncio.sleep(PAUSE)
    ran("charge")
    return f"receipt-{n}"


async def process(n: int, steps: int, workspace: bool = False) -> dict[str, Any]:
    results: list[Any] = []
    if workspace:
        ws = await resource("workspace", driver=LocalDirectory(), checkpoints=CheckpointPolicy(every_steps=1))

        @tool("write", resources=["workspace"])
        async def write(n: int, i: int) -> str:
            """A step that changes the workspace, captured after it."""
            await ws.files.write(f"step-{i}.txt", f"{n}:{i}")
            await asyncio.sleep(PAUSE)
            ran("write")
            return f"wrote step-{i}.txt"

    for i in range(steps):
        if workspace and i % 2 == 0:
            results.append(await write(n, i))
        else:
            results.append(await work(n, i))
    return {"n": n, "results": results, "receipt": await charge(n)}


if __name__ == "__main__":
    serve(process)
