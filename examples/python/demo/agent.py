"""The agent of `make demo`: a small "research" program written with the SDK.

Search, fetch three pages, summarise. Each tool call is a `@tool` step and the
summary's timestamp is a `step()`, so when the process is killed and started
again, the kernel redelivers the execution, the handler runs from the top and
every recorded step returns its stored result instead of running again.

    export REBUNO_AGENT_SECRET=dev-secret-0123456789
    python examples/python/demo/agent.py --listen 127.0.0.1:5000
    rebuno agent add --id researcher --webhook-url http://127.0.0.1:5000/webhook
    rebuno exec create researcher '{"topic": "durable agents"}' --watch

The demo (examples/demo) starts it with `--kernel`, `--listen`, `--id` and
`--secret`, kills it with SIGKILL in the middle of the second page fetch,
starts it again, and reads the "run"/"replay" lines it logs to tell the story.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import os
import time
from typing import Any, Awaitable, TypeVar

from rebuno import Agent, execution, step, tool

T = TypeVar("T")
log = logging.getLogger("demo-agent")
DELAY = 0.4  # seconds each tool pretends to work (--step-delay)

# Only for the demo's narration: every body counts its runs here, so that the
# handler can tell a step that ran from one that replayed.
_runs = [0]


@tool
async def web_search(query: str) -> list[str]:
    """Search the web (canned results)."""
    _runs[0] += 1
    await asyncio.sleep(DELAY)
    slug = query.replace(" ", "-")
    return [f"https://example.org/{slug}/{n}" for n in ("a", "b", "c")]


@tool
async def fetch_page(url: str) -> str:
    """Fetch a page (canned contents)."""
    _runs[0] += 1
    await asyncio.sleep(DELAY)
    return f"contents of {url}"


def stamp() -> str:
    _runs[0] += 1
    return time.strftime("%H:%M:%S")


async def narrate(target: str, args: dict[str, Any], call: Awaitable[T]) -> T:
    """Awaits one step and logs whether its body ran or its result replayed."""
    before = _runs[0]
    result = await call
    how = "run    " if _runs[0] > before else "replay "
    log.info("%s:   %s %s %s", execution().execution_id[-8:], how, target, json.dumps(args))
    return result


async def research(topic: str = "durable execution") -> dict[str, Any]:
    """Search, fetch three pages, summarise."""
    ctx = execution()
    log.info("%s: attempt %s of dispatch %s", ctx.execution_id[-8:], ctx.dispatch_attempt, ctx.dispatch_id[-8:])
    hits = await narrate("web_search", {"query": topic}, web_search(topic))
    pages = [await narrate("fetch_page", {"url": url}, fetch_page(url)) for url in hits]
    # Non-determinism (the clock) goes through step(): a replay returns the
    # recorded time, so the summary is the same however often the handler runs.
    at = await narrate("summarize", {"pages": len(pages)}, step("summarize", stamp, {"pages": len(pages)}))
    return {"topic": topic, "sources": hits, "summary": f"{len(pages)} pages about {topic}, summarised at {at}"}


def main() -> None:
    global DELAY
    ap = argparse.ArgumentParser(description="The Rebuno demo agent (Python SDK).")
    ap.add_argument("--kernel", default=os.environ.get("REBUNO_URL", "http://127.0.0.1:8080"), help="kernel URL")
    ap.add_argument("--listen", default="127.0.0.1:5000", help="host:port to serve the webhook on")
    ap.add_argument("--id", default="researcher", help="agent id")
    ap.add_argument("--secret", default=os.environ.get("REBUNO_AGENT_SECRET"), help="agent secret")
    ap.add_argument("--step-delay", type=float, default=DELAY, help="seconds each tool pretends to work")
    args = ap.parse_args()
    DELAY = args.step_delay
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(message)s")
    host, _, port = args.listen.rpartition(":")
    agent = Agent(args.id, secret=args.secret, base_url=args.kernel)
    log.info("agent %s listening on http://%s/webhook", args.id, args.listen)
    agent.run(research, host=host, port=int(port), log_level="warning")


if __name__ == "__main__":
    main()
