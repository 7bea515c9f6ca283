"""Governance (f): a tool under a rate limit. The client raises ``RateLimited`` out
of the tool call; with ``catch`` the handler records it and goes on, without it
the error escapes and the client fails the execution."""

from __future__ import annotations

from rebuno import RateLimited, tool

from agentkit import make_agent, record, serve


@tool
async def ping(n: int) -> int:
    record("tool:ping", n=n)
    return n * 10


async def handler(count: int, catch: bool = True) -> dict:
    got: list = []
    for n in range(count):
        try:
            got.append(await ping(n))
        except RateLimited as e:
            record("handler:rate_limited", n=n, reason=e.reason, error=type(e).__name__)
            if not catch:
                raise
            got.append(f"limited: {e.reason}")
    return {"got": got}


if __name__ == "__main__":
    serve(make_agent(), handler)
