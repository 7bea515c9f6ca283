from __future__ import annotations

import pytest

from .fakes import FakeKernel


@pytest.fixture
def kernel() -> FakeKernel:
    """The in-memory kernel of the unit tests."""
    return FakeKernel()
