"""(d) and (e): a tool, then a gate named after the dispatch attempt
(``attempt1``, ``attempt2``, …) at which the handler waits until the test releases
it, then a second tool. The test decides when each attempt may go on."""

from __future__ import annotations

from rebuno import execution, tool

from agentkit import gate, make_agent, record, serve


@tool
async def one(x: int) -> int:
    record("tool:one")
    return x + 1


@tool
async def two(x: int) -> int:
    record("tool:two")
    return x * 10


async def handler(x: int) -> dict:
    a = await one(x)
    await gate(f"attempt{execution().dispatch_attempt}")
    b = await two(a)
    return {"one": a, "two": b}


if __name__ == "__main__":
    serve(make_agent(), handler)
