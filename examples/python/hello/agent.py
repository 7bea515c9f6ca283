"""Hello, Rebuno: one tool call and one local step, recorded and replayed.

    export REBUNO_AGENT_SECRET=dev-secret-0123456789
    python examples/python/hello/agent.py          # serves http://127.0.0.1:5000/webhook
    rebuno agent add --id hello --webhook-url http://127.0.0.1:5000/webhook
    rebuno exec create hello '{"name": "Ada"}' --watch
"""

from __future__ import annotations

import random

from rebuno import Agent, execution, step, tool


@tool("greet")
async def greet(name: str, excited: bool = False) -> str:
    """Build a greeting for someone."""
    return f"Hello, {name}{'!' if excited else '.'}"


async def process(name: str, excited: bool = True) -> dict[str, object]:
    """Greet someone and pick a lucky number."""
    greeting = await greet(name, excited)
    # Non-determinism goes through step(): a replay returns the recorded number.
    lucky = await step("lucky_number", lambda: random.randint(1, 100))
    return {"greeting": greeting, "lucky": lucky, "execution": execution().execution_id}


if __name__ == "__main__":
    Agent("hello").run(process, port=5000)
