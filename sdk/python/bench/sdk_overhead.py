"""The SDK's own overhead per step (issue 10, "Performance").

Starts a kernel (`--kernel`, default `$REBUNO_BIN`, else `bin/rebuno` of the
repository), serves an agent over loopback, and runs one execution whose
handler makes N no-op `@tool` calls, then N raw steps through the same signed
HTTP client without the SDK's step machinery: one submit per step, carrying
the previous step's outcome (docs/protocol/steps.md §13), as the SDK's own steps do. Prints
per-step p50/p99 of both and the difference, the SDK's own cost.

    sdk/python/.venv/bin/python sdk/python/bench/sdk_overhead.py -n 500
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent))

from rebuno import Agent, execution, tool  # noqa: E402
from rebuno._kernel import Outcome  # noqa: E402
from rebuno.identity import canonical_json  # noqa: E402
from common import pct, use_kernel  # noqa: E402
from tests.e2e.harness import KernelProcess, Served, register  # noqa: E402

SECRET = "bench-secret-0123456789"


@tool("noop")
async def noop(i: int) -> int:
    return i


async def run(n: int, workdir: Path) -> dict[str, Any]:
    kernel = KernelProcess(workdir, manual_clock=False)
    kernel.start()
    sdk: list[float] = []
    raw: list[float] = []
    try:
        agent = Agent("bench", secret=SECRET, base_url=kernel.url)

        @agent.bind
        async def process(n: int) -> int:
            for i in range(n):
                t0 = time.perf_counter()
                await noop(i)
                sdk.append(time.perf_counter() - t0)
            ctx = execution()
            await ctx.flush()
            previous: Outcome | None = None
            for i in range(n):
                t0 = time.perf_counter()
                body = ('{"kind":"tool_call","target":"raw","args":' + canonical_json({"i": i})
                        + ',"idempotency":"safe_to_retry","resources":[]'
                        + (previous.carried() if previous is not None else "") + "}").encode()
                d = await ctx.kernel.submit(ctx.execution_id, ctx.lease, body, 0)
                assert d.decision == "proceed" and d.step_id
                previous = Outcome(d.step_id, True, str(i))
                raw.append(time.perf_counter() - t0)
            if previous is not None:
                await ctx.kernel.step_outcome(ctx.execution_id, ctx.lease, previous)
            return n

        async with Served(agent.app) as served, kernel.client() as client:
            await register(kernel, "bench", served.url + "/webhook", SECRET)
            ex = await client.create("bench", {"n": n})
            done = await client.wait(ex.id, timeout=600)
            assert done.status == "completed", done
    finally:
        kernel.stop()
    ms = 1000.0
    return {
        "steps": n,
        "sdk_p50_ms": pct(sdk, 50) * ms, "sdk_p99_ms": pct(sdk, 99) * ms,
        "raw_p50_ms": pct(raw, 50) * ms, "raw_p99_ms": pct(raw, 99) * ms,
        "overhead_p50_ms": (pct(sdk, 50) - pct(raw, 50)) * ms,
        "sdk_mean_ms": statistics.fmean(sdk) * ms, "raw_mean_ms": statistics.fmean(raw) * ms,
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-n", type=int, default=500, help="tool steps (and raw steps) to time")
    ap.add_argument("--kernel", default=None, help="kernel binary (default $REBUNO_BIN or bin/rebuno)")
    ap.add_argument("--json", action="store_true", help="print JSON instead of a table")
    args = ap.parse_args()
    use_kernel(args.kernel)
    with tempfile.TemporaryDirectory(prefix="rebuno-sdk-bench-") as tmp:
        result = asyncio.run(run(args.n, Path(tmp)))
    if args.json:
        print(json.dumps(result))
        return
    print(f"SDK overhead, {result['steps']} no-op tool steps over loopback (one submit per step, carrying the "
          "previous outcome)")
    print(f"  @tool step       p50 {result['sdk_p50_ms']:7.3f} ms   p99 {result['sdk_p99_ms']:7.3f} ms")
    print(f"  raw step         p50 {result['raw_p50_ms']:7.3f} ms   p99 {result['raw_p99_ms']:7.3f} ms")
    print(f"  SDK's own cost   p50 {result['overhead_p50_ms']:7.3f} ms")


if __name__ == "__main__":
    main()
