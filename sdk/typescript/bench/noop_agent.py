"""The benchmark's Python agent: the same workload as noop-agent.ts, on the Python SDK."""

import os
from typing import Any

from rebuno import Agent, tool


@tool("noop")
async def noop(i: int) -> int:
    return i


async def process(n: int) -> dict[str, Any]:
    for i in range(n):
        await noop(i)
    return {"n": n}


if __name__ == "__main__":
    print(f"PORT {os.environ['PORT']}", flush=True)
    Agent(os.environ["AGENT_ID"]).run(process, host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
