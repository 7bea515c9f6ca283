from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest

from .e2e.harness import KernelProcess
from .fakes import FakeKernel


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if {"e2e", "acceptance"} & set(item.path.parts):
            item.add_marker(pytest.mark.e2e)


@pytest.fixture
def kernel() -> FakeKernel:
    """The in-memory kernel of the unit tests."""
    return FakeKernel()


@pytest.fixture
def kernel_proc(tmp_path: Path) -> Iterator[KernelProcess]:
    """A fresh `rebuno dev` kernel (manual clock) for one test."""
    k = KernelProcess(tmp_path)
    k.start()
    try:
        yield k
    finally:
        k.stop()
