import os

from langchain.agents import create_agent
from langchain_openai import ChatOpenAI
from rebuno import Agent, CheckpointPolicy, http_client, resource, tool
from workspace_resource import E2BResource


async def process(task: str) -> dict:
    workspace = await resource(
        "workspace",
        driver=E2BResource(timeout=600),
        checkpoints=CheckpointPolicy(every_steps=5),
    )

    @tool("write_file", resources=["workspace"])
    async def write_file(path: str, content: str) -> str:
        """Write a file in the workspace."""
        await workspace.files.write(path, content)
        return f"wrote {path}"

    @tool("read_file")
    async def read_file(path: str) -> str:
        """Read a file from the workspace."""
        return await workspace.files.read(path)

    model = ChatOpenAI(
        model=os.environ["LLM_MODEL"], http_async_client=http_client(),
    )
    graph = create_agent(model=model, tools=[read_file, write_file])
    result = await graph.ainvoke({"messages": [{"role": "user", "content": task}]})
    return {"answer": result["messages"][-1].content}


if __name__ == "__main__":
    Agent("coder").run(process, port=5000)
