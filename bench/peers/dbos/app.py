"""DBOS's Python row: a workflow of STEPS no-op steps, run in this process
(DBOS is a library: the client is the application) on a SQLite system
database, DBOS's default."""

import asyncio
import os

from dbos import DBOS
from loop import STEPS, check, serve

DBOS(config={"name": "bench", "system_database_url": f"sqlite:///{os.environ['DATABASE']}", "log_level": "WARNING"})


@DBOS.step()
async def noop(i: int) -> int:
    return i


@DBOS.workflow()
async def workflow(n: int) -> int:
    for i in range(n):
        await noop(i)
    return n


async def main() -> None:
    DBOS.launch()

    async def one() -> None:
        check(await workflow(STEPS))

    await serve(one, "in process")


asyncio.run(main())
