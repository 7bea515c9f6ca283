"""(c) A run the test kills with SIGKILL in the middle: a default tool, an
at-most-once tool, a plain and a streamed LLM call, then a tool whose body waits
at a gate until the test releases it (the first process is killed there): the
safe-to-retry ``slow``, or with ``mode="charge"`` the at-most-once ``charge``."""

from __future__ import annotations

import os

import rebuno
from openai import AsyncOpenAI
from rebuno import ToolError, tool

from agentkit import gate, make_agent, record, serve

MODEL = "scripted-model-2"


@tool
async def lookup(key: str) -> dict:
    record("tool:lookup")
    return {"key": key, "value": 17}


@tool(idempotency="at_most_once")
async def write(key: str, value: int) -> str:
    record("tool:write")
    return f"wrote {key}={value}"


@tool
async def slow(n: int) -> int:
    record("tool:slow")
    await gate("slow")
    return n * 2


@tool(idempotency="at_most_once")
async def charge(cents: int) -> str:
    record("tool:charge")
    await gate("charge")
    return f"charged {cents}"


async def handler(key: str, mode: str = "slow") -> dict:
    found = await lookup(key)
    wrote = await write(key, found["value"])
    async with rebuno.http_client() as http:
        llm = AsyncOpenAI(base_url=os.environ["COMPAT_LLM_URL"], api_key="sk-compat", http_client=http, max_retries=0)
        plain = await llm.chat.completions.create(model=MODEL, messages=[{"role": "user", "content": wrote}])
        text = plain.choices[0].message.content
        parts = []
        stream = await llm.chat.completions.create(
            model=MODEL, messages=[{"role": "user", "content": text}], stream=True
        )
        async for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                parts.append(chunk.choices[0].delta.content)
    out = {"wrote": wrote, "plain": text, "streamed": "".join(parts)}
    if mode == "charge":
        try:
            out["charged"] = await charge(found["value"])
        except ToolError as e:
            # An at-most-once body whose outcome was lost is not run again: the
            # kernel replays it as the indeterminate error (docs/protocol/steps.md §7).
            out["charge_error"] = str(e)
    else:
        out["doubled"] = await slow(found["value"])
    return out


if __name__ == "__main__":
    serve(make_agent(), handler)
