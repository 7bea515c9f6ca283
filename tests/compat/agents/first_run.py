"""(a) and (e): two decorated tools, one of them at-most-once, and a local step."""

from __future__ import annotations

from rebuno import step, tool

from agentkit import make_agent, record, serve


@tool
async def search(query: str, limit: int = 2) -> list[str]:
    record("tool:search", query=query)
    return [f"{query} #{i}" for i in range(1, limit + 1)]


@tool("send_email", idempotency="at_most_once")
async def send(to: str, subject: str) -> dict:
    record("tool:send_email", to=to)
    return {"sent": True, "to": to, "subject": subject}


def _ticket(prefix: str) -> str:
    # A synchronous body: the client runs it in a worker thread.
    record("step:ticket")
    return f"{prefix}-0042"


async def handler(topic: str) -> dict:
    hits = await search(topic)
    ticket = await step("ticket", _ticket, {"prefix": "T"})
    sent = await send("ops@example.com", f"{ticket}: {hits[0]}")
    return {"hits": hits, "ticket": ticket, "sent": sent}


if __name__ == "__main__":
    serve(make_agent(description="first run agent: search, ticket, mail"), handler)
