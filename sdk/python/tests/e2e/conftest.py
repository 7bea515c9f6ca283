from __future__ import annotations

from pathlib import Path
from typing import AsyncIterator, Iterator

import pytest

from .harness import KernelProcess, Served
from .scripted_llm import ScriptedLLM


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if "/e2e/" in str(item.path):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def kernel_proc(tmp_path: Path) -> Iterator[KernelProcess]:
    """A fresh `rebuno dev` kernel (manual clock) for one test."""
    k = KernelProcess(tmp_path)
    k.start()
    try:
        yield k
    finally:
        k.stop()


@pytest.fixture
async def llm() -> AsyncIterator[tuple[ScriptedLLM, str]]:
    """The scripted OpenAI-compatible provider and its base URL (`…/v1`)."""
    server = ScriptedLLM(tool_args={"lookup_weather": {"city": "Paris"}})
    async with Served(server.app) as served:
        yield server, served.url + "/v1"
