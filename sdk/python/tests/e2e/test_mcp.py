"""MCP tools over stdio wrapped with `wrap_mcp_tools`: recorded as tool steps,
replayed without reaching the server, usable by LangChain's `create_agent`."""

from __future__ import annotations

import asyncio
import inspect
import sys
from pathlib import Path
from typing import Any

from mcp import ClientSession, StdioServerParameters, stdio_client

from rebuno import Agent, ToolError, execution, http_client, tool
from rebuno.mcp import wrap_mcp_tools

from .harness import HERE, KernelProcess, count, register, serve_agent
from .scripted_llm import ScriptedLLM

SECRET = "mcp-secret-0123456789"
# A bound on waits for events that normally take a second, so that a broken
# run fails instead of hanging; generous, because a loaded machine starts the
# MCP server processes slowly.
PATIENCE = 120.0


def server_params(markers: Path) -> StdioServerParameters:
    return StdioServerParameters(command=sys.executable, args=[str(HERE / "mcp_server.py")],
                                 env={"MARKERS": str(markers)})


async def test_mcp_tools_record_and_replay(kernel_proc: KernelProcess, tmp_path: Path) -> None:
    mfile = tmp_path / "mcp-calls"
    agent = Agent("mcp", secret=SECRET, base_url=kernel_proc.url)
    attempts: list[int | None] = []
    shapes: dict[str, Any] = {}
    parked = asyncio.Event()

    @tool("hold")
    async def hold() -> str:
        if execution().dispatch_attempt == 1:
            # Every MCP call before this one has its outcome recorded now.
            parked.set()
            await asyncio.Event().wait()  # superseded: the second attempt replays everything before
        return "held"

    @agent.bind
    async def process() -> dict[str, Any]:
        attempts.append(execution().dispatch_attempt)
        with open(tmp_path / "mcp-stderr", "a") as errlog:
            async with stdio_client(server_params(mfile), errlog=errlog) as (read, write):
                async with ClientSession(read, write) as session:
                    await session.initialize()
                    tools = {t.__name__: t for t in await wrap_mcp_tools(session, prefix="calc.")}
                    shapes["names"] = sorted(tools)
                    shapes["add_params"] = list(inspect.signature(tools["calc.add"]).parameters)
                    shapes["shout_doc"] = tools["calc.shout"].__doc__
                    total = await tools["calc.add"](a=2, b=3)
                    loud = await tools["calc.shout"](text="hi", times=2)
                    try:
                        await tools["calc.explode"](reason="test")
                        failure = None
                    except ToolError as e:
                        failure = e.message
        return {"total": total, "loud": loud, "failure": failure, "hold": await hold()}

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "mcp", served.url + "/webhook", SECRET)
        ex = await client.create("mcp", None)
        # Not the server's call marker: the clock must not move before the
        # first attempt has recorded the outcome of its last MCP call, or the
        # second attempt runs that call again.
        await asyncio.wait_for(parked.wait(), PATIENCE)
        await kernel_proc.advance(121)  # supersede the first attempt: the second one replays
        done = await client.wait(ex.id, timeout=PATIENCE)
        assert done.status == "completed", done
        assert attempts == [1, 2]
        assert done.output["total"] == {"result": 5}
        assert done.output["loud"] == "HI HI "
        assert done.output["failure"] == "Error executing tool explode"  # the server's is_error text
        # Each tool reached the server exactly once; the second attempt replayed them.
        assert [count(mfile, n) for n in ("add", "shout", "explode")] == [1, 1, 1]
        assert shapes == {"names": ["calc.add", "calc.explode", "calc.shout"], "add_params": ["a", "b"],
                          "shout_doc": "Upper-case a text."}
        steps = await client.steps(ex.id)
        assert [(s.target, s.status) for s in steps] == [
            ("calc.add", "succeeded"), ("calc.shout", "succeeded"), ("calc.explode", "failed"),
            ("hold", "succeeded")]
        assert steps[0].args == {"a": 2, "b": 3} and steps[1].args == {"text": "hi", "times": 2}


async def test_mcp_tools_in_a_langchain_agent(kernel_proc: KernelProcess, tmp_path: Path,
                                              llm: tuple[ScriptedLLM, str]) -> None:
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    server, url = llm
    server.tool_args["add"] = {"a": 20, "b": 22}
    mfile = tmp_path / "mcp-calls"
    agent = Agent("mcp-lc", secret=SECRET, base_url=kernel_proc.url)

    @agent.bind
    async def process(task: str) -> dict[str, Any]:
        async with stdio_client(server_params(mfile)) as (read, write):
            async with ClientSession(read, write) as session:
                await session.initialize()
                tools = await wrap_mcp_tools(session, names=["add"])
                model = ChatOpenAI(model="scripted", api_key="t", base_url=url,  # type: ignore[arg-type]
                                   http_async_client=http_client())
                graph = create_agent(model=model, tools=tools)
                result = await graph.ainvoke({"messages": [{"role": "user", "content": task}]})
        return {"answer": result["messages"][-1].content}

    async with serve_agent(agent) as served, kernel_proc.client() as client:
        await register(kernel_proc, "mcp-lc", served.url + "/webhook", SECRET)
        ex = await client.create("mcp-lc", {"task": "add 20 and 22"})
        done = await client.wait(ex.id, timeout=PATIENCE)
        assert done.status == "completed", done
        assert "42" in done.output["answer"]
        assert server.requests[0]["tools"][0]["function"]["name"] == "add"
        params = server.requests[0]["tools"][0]["function"]["parameters"]
        assert set(params["properties"]) == {"a", "b"}
        assert [(s.kind, s.target) for s in await client.steps(ex.id)] == [
            ("llm_call", "scripted"), ("tool_call", "add"), ("llm_call", "scripted")]
