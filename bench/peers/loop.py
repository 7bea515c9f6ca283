"""The command loop every Python client of the peers benchmark runs.

The harness (run.py) writes `run COUNT CONCURRENCY` lines on stdin; for each,
the client runs COUNT executions with at most CONCURRENCY in flight and
answers `done`. `ready HOW` (how a result is awaited) opens the
conversation; end of input ends the client. The harness times the windows
and reads every process's CPU around them, so the client reports nothing
else.
"""

from __future__ import annotations

import asyncio
import os
import sys
from typing import Awaitable, Callable

STEPS = int(os.environ.get("STEPS", "10"))


async def serve(one: Callable[[], Awaitable[None]], how: str) -> None:
    """Answer the harness's commands, running `one()` per execution."""
    print(f"ready {how}", flush=True)
    loop = asyncio.get_running_loop()
    while line := await loop.run_in_executor(None, sys.stdin.readline):
        _, count, concurrency = line.split()
        pending = iter(range(int(count)))

        async def worker() -> None:
            for _ in pending:
                await one()

        await asyncio.gather(*(worker() for _ in range(int(concurrency))))
        print("done", flush=True)


def check(result: object) -> None:
    """Every workflow of the benchmark returns its number of steps."""
    if result != STEPS:
        raise RuntimeError(f"unexpected result {result!r}")
