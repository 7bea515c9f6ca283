"""Scenario 3's agent, run in a child process so that the test can SIGKILL it:
the seed's LangChain agent with a `LocalDirectory` that records its driver
calls, and a `write_file` that holds after writing `slow.txt`.

    python crash_agent.py

Environment: `REBUNO_URL`, `REBUNO_AGENT_SECRET`, `AGENT_ID`, `LLM_MODEL`,
`OPENAI_BASE_URL`, `OPENAI_API_KEY`, `REBUNO_LOCAL_RESOURCES`, `MARKERS` (a
file each driver call and tool body appends a line to) and `RELEASE_FILE`
(the slow write holds until it exists, for at most 60 s). Prints `PORT <n>`
once serving.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from langchain.agents import create_agent
from langchain_openai import ChatOpenAI

from rebuno import CheckpointPolicy, http_client, resource, tool
from tests.e2e.child import MarkedDirectory, mark, serve

RELEASE_FILE = os.environ["RELEASE_FILE"]


async def process(task: str) -> dict[str, Any]:
    workspace = await resource("workspace", driver=MarkedDirectory(coverage_reuse=True),
                               checkpoints=CheckpointPolicy(every_steps=1))

    @tool("write_file", resources=["workspace"])
    async def write_file(path: str, content: str) -> str:
        """Write a file in the workspace."""
        await workspace.files.write(path, content)
        mark(f"write:{path}")
        if path == "slow.txt":
            loop = asyncio.get_running_loop()
            deadline = loop.time() + 60
            while not os.path.exists(RELEASE_FILE) and loop.time() < deadline:
                await asyncio.sleep(0.02)
        return f"wrote {path}"

    @tool("read_file")
    async def read_file(path: str) -> str:
        """Read a file from the workspace."""
        mark(f"read:{path}")
        return str(await workspace.files.read(path))

    model = ChatOpenAI(model=os.environ["LLM_MODEL"], http_async_client=http_client())
    graph = create_agent(model=model, tools=[read_file, write_file])
    result = await graph.ainvoke({"messages": [{"role": "user", "content": task}]})
    return {"answer": result["messages"][-1].content}


if __name__ == "__main__":
    serve(process)
