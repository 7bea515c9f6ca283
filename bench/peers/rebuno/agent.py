"""Rebuno's side of the peers benchmark, Python: an agent whose executions run
STEPS no-op tool steps, each recorded by the kernel like any tool call."""

import os

from rebuno import Agent, tool


@tool("noop")
async def noop(i: int) -> int:
    return i


async def workflow(n: int) -> int:
    for i in range(n):
        await noop(i)
    return n


if __name__ == "__main__":
    Agent(os.environ["AGENT_ID"]).run(workflow, host="127.0.0.1", port=int(os.environ["PORT"]), log_level="warning")
