"""Agents run in a child process by the crash tests: `python agent_app.py SCENARIO`.

Environment: `REBUNO_URL`, `REBUNO_AGENT_SECRET`, `AGENT_ID`, `MARKERS` (a
file each effect body appends its name to, so tests count real executions),
`RELEASE` (when set, the blocking tool returns instead of waiting for the
SIGKILL), `LLM_URL` (the scripted provider), `STREAM` (`1` for streamed LLM
calls). Prints `PORT <n>` once serving.
"""

from __future__ import annotations

import asyncio
import os
import random
import signal
import sys
from typing import Any

import rebuno
from rebuno import http_client, step, tool
from tests.e2e.child import mark, serve


@tool("count_a")
async def count_a(label: str) -> str:
    """Record that the body ran."""
    mark("a")
    return f"a:{label}"


@tool("block_until_killed")
async def block_until_killed() -> str:
    """Wait until the test kills this process (or return when released)."""
    mark("c-start")
    if os.environ.get("RELEASE"):
        return "released"
    await asyncio.Event().wait()
    return "unreachable"


def random_b() -> float:
    mark("b")
    return random.random()


async def crash(n: int) -> dict[str, Any]:
    a = await count_a(str(n))
    b = await step("pick_b", random_b)
    c = await block_until_killed()
    return {"a": a, "b": b, "c": c}


async def llm_crash(prompt: str) -> dict[str, Any]:
    from openai import AsyncOpenAI

    client = AsyncOpenAI(api_key="test", base_url=os.environ["LLM_URL"], http_client=http_client(),
                         max_retries=0)
    plain = await client.chat.completions.create(model="scripted-1",
                                                 messages=[{"role": "user", "content": prompt}])
    stream = await client.chat.completions.create(model="scripted-1", stream=True,
                                                  messages=[{"role": "user", "content": prompt + "!"}])
    parts = []
    async for chunk in stream:
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    mark("llm-done")
    c = await block_until_killed()
    return {"plain": plain.choices[0].message.content, "streamed": "".join(parts), "c": c}


@tool("lookup_weather")
async def lookup_weather(city: str) -> str:
    """Look up the weather of a city."""
    mark("weather")
    return f"sunny in {city}"


async def langchain_crash(task: str) -> dict[str, Any]:
    from langchain.agents import create_agent
    from langchain_openai import ChatOpenAI

    model = ChatOpenAI(model="scripted-lc", api_key="test", base_url=os.environ["LLM_URL"],  # type: ignore[arg-type]
                       http_async_client=http_client(), streaming=os.environ.get("STREAM") == "1", max_retries=0)
    graph = create_agent(model=model, tools=[lookup_weather])
    result = await graph.ainvoke({"messages": [{"role": "user", "content": task}]})
    mark("graph-done")
    c = await block_until_killed()
    return {"answer": result["messages"][-1].content, "c": c}


def _marking_tool(name: str, idempotency: str = "safe_to_retry") -> Any:
    async def body(n: int) -> str:
        mark(name)
        return f"{name}:{n}"

    body.__doc__ = f"Record that {name} ran."
    return tool(name, idempotency=idempotency)(body)  # type: ignore[call-overload]


safe_a = _marking_tool("safe_a")
once_b = _marking_tool("once_b", "at_most_once")
safe_c = _marking_tool("safe_c")
safe_d = _marking_tool("safe_d")


def _kill_after(name: str) -> None:
    """kill -9 right after the step `name` returned, when `KILL_AFTER` names
    it: synchronously, so that no timer or carrier runs in between."""
    if os.environ.get("KILL_AFTER") == name and not os.environ.get("RELEASE"):
        mark("killing")
        os.kill(os.getpid(), signal.SIGKILL)


async def pending_outcome(n: int) -> dict[str, Any]:
    """kill -9 while a finished step's outcome may wait for its carrier
    (docs/protocol/steps.md §13): safe_a's outcome travels with once_b's
    submit, once_b (at_most_once) reports before it returns, safe_c's
    outcome waits for safe_d's submit."""
    a = await safe_a(n)
    b = await once_b(n)
    _kill_after("once_b")
    c = await safe_c(n)
    _kill_after("safe_c")
    d = await safe_d(n)
    return {"a": a, "b": b, "c": c, "d": d}


SCENARIOS = {"crash": crash, "llm_crash": llm_crash, "langchain_crash": langchain_crash,
             "pending_outcome": pending_outcome}


if __name__ == "__main__":
    assert rebuno.__file__ is not None
    serve(SCENARIOS[sys.argv[1]])
