"""The upgrade suite's agent on THIS project's SDK (sdk/python).

published_agent.py is the same agent on the published rebuno==0.29.2: same
agent id, tool ids, step names and arguments, same handler. The two files are
kept line for line parallel; where the SDKs' APIs differ, both files say so.

The handler runs a fixed sequence of effects; ``features`` in the input adds the
optional ones. The last effect, ``slow``, waits at a gate, where the test kills
this process with SIGKILL.
"""

from __future__ import annotations

import random
import time

import rebuno
from openai import AsyncOpenAI
from rebuno import Agent, ToolError, step, tool

from common import AGENT_ID, LLM_URL, MODEL, PORT, SDK, gate, record


@tool
async def lookup(city: str, units: str = "metric") -> dict:
    record("tool:lookup", city=city)
    return {"city": city, "units": units, "temp": 21}


@tool("quote")
async def quote(amount: float, currency: str, meta: dict) -> str:
    # Non-ASCII and HTML-escaped characters, a float and an object whose keys
    # are not sorted: the canonical form of docs/protocol/identity.md §2 must make both SDKs agree.
    record("tool:quote")
    return f"{amount} {currency} {meta['a']}"


@tool(idempotency="at_most_once")
async def write_note(key: str, text: str) -> str:
    record("tool:write_note")
    return f"noted {key}: {text}"


@tool
async def flaky(city: str) -> str:
    record("tool:flaky")
    raise LookupError(f"no forecast for {city}")


@tool
async def tag(city: str, **labels: str) -> str:
    record("tool:tag")
    return city + ":" + ",".join(f"{k}={v}" for k, v in sorted(labels.items()))


@tool
async def slow(n: int) -> int:
    record("tool:slow")
    await gate("slow")
    return n * 2


def pick(seed: int) -> int:
    record("step:pick")
    return seed + random.randint(1, 1_000_000)


def stamp() -> float:
    record("step:stamp")
    return time.time()


async def handler(city: str, features: list[str]) -> dict:
    record("handler:start")
    out: dict = {"sdk": SDK}
    out["first"] = await lookup(city)
    out["again"] = await lookup(city)  # the same identity again: occurrence 1
    out["quote"] = await quote(12.5, "€", {"z": 1.0, "a": "<&> é"})
    out["note"] = await write_note("k1", "first run")
    try:
        await flaky(city)
    except ToolError as e:
        out["flaky"] = str(e)
    if "step" in features:
        # This SDK: step(name, fn, args) calls fn() with no arguments; args
        # only name the step, so the body closes over them.
        out["pick"] = await step("pick", lambda: pick(seed=7), {"seed": 7})
    if "step_noargs" in features:
        out["stamp"] = await step("stamp", stamp)
    if "tool_kwargs" in features:
        out["tag"] = await tag(city, season="winter", source="upgrade")
    if "llm" in features or "llm_stream" in features:
        async with rebuno.http_client() as http:
            llm = AsyncOpenAI(base_url=LLM_URL, api_key="sk-upgrade", http_client=http, max_retries=0)
            if "llm" in features:
                plain = await llm.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Weather in {city}?"}]
                )
                out["plain"] = plain.choices[0].message.content
                record("llm:plain:returned")
            if "llm_stream" in features:
                stream = await llm.chat.completions.create(
                    model=MODEL, messages=[{"role": "user", "content": f"Stream the weather in {city}."}], stream=True
                )
                parts = []
                async for chunk in stream:
                    if chunk.choices and chunk.choices[0].delta.content:
                        parts.append(chunk.choices[0].delta.content)
                out["streamed"] = "".join(parts)
                record("llm:stream:returned")
    out["doubled"] = await slow(21)
    return out


if __name__ == "__main__":
    Agent(AGENT_ID).run(handler, host="127.0.0.1", port=PORT)
