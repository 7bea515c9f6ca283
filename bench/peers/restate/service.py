"""Restate's Python row: the service of service.ts on the Python
SDK, served by hypercorn (HTTP/2 cleartext, as restate-server expects)."""

import asyncio
import os

import hypercorn.asyncio
import hypercorn.config
import restate

bench = restate.Service("Bench")


async def noop(i: int) -> int:
    return i


@bench.handler()
async def run(ctx: restate.Context, n: int) -> int:
    for i in range(n):
        await ctx.run_typed("noop", noop, i=i)
    return n


if __name__ == "__main__":
    config = hypercorn.config.Config()
    config.bind = [f"127.0.0.1:{os.environ['PORT']}"]
    asyncio.run(hypercorn.asyncio.serve(restate.app(services=[bench]), config))
