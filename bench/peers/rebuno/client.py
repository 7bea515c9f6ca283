"""The client of Rebuno's Python row: registers the agent, then starts
executions through the SDK's `Client` and awaits each one's result.

A result is awaited with `Client.run` when the SDK has it (one request);
otherwise by following the execution's event stream to its end, the
cheapest way this SDK offers (`Client.wait` polls every 100 ms).
"""

import asyncio
import os
from contextlib import aclosing

from loop import STEPS, check, serve
from rebuno import Client

AGENT_ID = os.environ["AGENT_ID"]


async def main() -> None:
    async with Client(os.environ["REBUNO_URL"]) as client:
        await client.register_agent(AGENT_ID, os.environ["AGENT_URL"], os.environ["REBUNO_AGENT_SECRET"])

        async def by_run() -> None:
            check(await client.run(AGENT_ID, {"n": STEPS}))  # type: ignore[attr-defined]

        async def by_stream() -> None:
            execution = await client.create(AGENT_ID, {"n": STEPS})
            # Closed at once when left early (stream_events is an async generator).
            async with aclosing(client.stream_events(execution.id)) as events:  # type: ignore[type-var]
                async for event in events:
                    if event.type == "execution.completed":
                        check(event.payload["output"])
                        return
                    if event.type in ("execution.failed", "execution.cancelled"):
                        break
            raise RuntimeError(f"execution {execution.id} did not complete")

        if hasattr(client, "run"):
            await serve(by_run, "Client.run")
        else:
            await serve(by_stream, "event stream")


asyncio.run(main())
