"""A LangChain agent with tools: every LLM call and tool call is a recorded step.

    pip install 'rebuno' langchain langchain-openai
    export REBUNO_AGENT_SECRET=dev-secret-0123456789
    export LLM_MODEL=gpt-4o-mini OPENAI_API_KEY=...   # or OPENAI_BASE_URL for a compatible server
    python examples/python/langchain_tools/agent.py
    rebuno agent add --id weather --webhook-url http://127.0.0.1:5000/webhook
    rebuno exec create weather '{"task": "Should I take an umbrella in Paris?"}' --watch

Kill the agent while it runs and start it again: the kernel redelivers, the
calls already made replay from the log, and the model is not asked twice.
"""

from __future__ import annotations

import os

from langchain.agents import create_agent
from langchain_openai import ChatOpenAI

from rebuno import Agent, http_client, tool

FORECASTS = {"paris": "light rain, 14°C", "madrid": "sunny, 24°C", "oslo": "snow, -3°C"}


@tool("get_forecast")
async def get_forecast(city: str) -> str:
    """Get today's weather forecast for a city."""
    return FORECASTS.get(city.strip().lower(), "no forecast available")


@tool("convert_temperature")
async def convert_temperature(celsius: float) -> str:
    """Convert a temperature from Celsius to Fahrenheit."""
    return f"{celsius * 9 / 5 + 32:.1f}°F"


async def process(task: str) -> dict[str, str]:
    """Answer a weather question with tools."""
    model = ChatOpenAI(model=os.environ["LLM_MODEL"], http_async_client=http_client())
    graph = create_agent(model=model, tools=[get_forecast, convert_temperature])
    result = await graph.ainvoke({"messages": [{"role": "user", "content": task}]})
    return {"answer": str(result["messages"][-1].content)}


if __name__ == "__main__":
    Agent("weather").run(process, port=5000)
