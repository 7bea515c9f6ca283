"""The client of Rebuno's Python row: registers the agent, then runs each
execution with the SDK's `Client.run`, one request that creates the
execution and answers with its output once it ends.
"""

import asyncio
import os

from loop import STEPS, check, serve
from rebuno import Client

AGENT_ID = os.environ["AGENT_ID"]


async def main() -> None:
    async with Client(os.environ["REBUNO_URL"]) as client:
        await client.register_agent(AGENT_ID, os.environ["AGENT_URL"], os.environ["REBUNO_AGENT_SECRET"])

        async def one() -> None:
            check(await client.run(AGENT_ID, {"n": STEPS}))

        await serve(one, "Client.run")


asyncio.run(main())
