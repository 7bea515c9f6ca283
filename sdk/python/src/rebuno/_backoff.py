"""The wait between two tries of a retried request: exponential backoff with jitter.

Every retry loop of the SDK (the agent's signed requests, `Client`'s
requests and its event tail) waits with a `Backoff`.
"""

from __future__ import annotations

import random

__all__ = ["Backoff", "BACKOFF_START", "BACKOFF_MAX"]

BACKOFF_START = 0.1
BACKOFF_MAX = 5.0


class Backoff:
    """The waits of one retry loop: the nominal wait starts at `start` and
    doubles after each one up to `ceiling`; each wait is drawn between half
    the nominal wait and all of it, so that clients that failed together do
    not all retry together."""

    def __init__(self, start: float = BACKOFF_START, ceiling: float = BACKOFF_MAX) -> None:
        if not 0 < start <= ceiling:
            raise ValueError("backoff needs 0 < start <= ceiling")
        self._start = start
        self._ceiling = ceiling
        self._nominal = start

    def next(self) -> float:
        """The next wait, in seconds."""
        wait = self._nominal * (0.5 + random.random() / 2)
        self._nominal = min(self._ceiling, self._nominal * 2)
        return wait

    def reset(self) -> None:
        """Start again from the shortest wait (after a success)."""
        self._nominal = self._start
