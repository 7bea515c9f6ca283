"""The one backoff of the SDK's retry loops."""

from __future__ import annotations

import random

import pytest

from rebuno._backoff import BACKOFF_MAX, BACKOFF_START, Backoff


def test_waits_double_up_to_the_ceiling_with_jitter(monkeypatch: pytest.MonkeyPatch) -> None:
    assert (BACKOFF_START, BACKOFF_MAX) == (0.1, 5.0)
    nominal = [0.1, 0.2, 0.4, 0.8, 1.6, 3.2, 5.0, 5.0]
    monkeypatch.setattr(random, "random", lambda: 1.0)  # the top of each jitter range
    b = Backoff()
    assert [round(b.next(), 6) for _ in nominal] == [round(n, 6) for n in nominal]
    monkeypatch.setattr(random, "random", lambda: 0.0)  # the bottom: half of it
    b.reset()
    assert [round(b.next(), 6) for _ in range(3)] == [0.05, 0.1, 0.2]


def test_waits_stay_within_their_jitter_range() -> None:
    b = Backoff(start=1.0, ceiling=4.0)
    for nominal in (1.0, 2.0, 4.0, 4.0, 4.0):
        wait = b.next()
        assert nominal / 2 <= wait <= nominal


def test_bad_bounds_are_refused() -> None:
    with pytest.raises(ValueError):
        Backoff(start=0)
    with pytest.raises(ValueError):
        Backoff(start=2, ceiling=1)
