from __future__ import annotations

from typing import AsyncIterator

import pytest

from .harness import Served
from .scripted_llm import ScriptedLLM


@pytest.fixture
async def llm() -> AsyncIterator[tuple[ScriptedLLM, str]]:
    """The scripted OpenAI-compatible provider and its base URL (`…/v1`)."""
    server = ScriptedLLM(tool_args={"lookup_weather": {"city": "Paris"}})
    async with Served(server.app) as served:
        yield server, served.url + "/v1"
