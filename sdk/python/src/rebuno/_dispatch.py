"""Webhook ordering and supersession (docs/protocol/sdk.md §1.4).

Per execution the agent keeps the newest (`dispatch_id`, `dispatch_attempt`)
it has seen, while its handler runs and for 2 × `lease_timeout_seconds` after
it ends, in an LRU of at most 10,000 executions. A webhook is run only when it
is newer: a greater dispatch id (UUIDv7 ids of one execution increase), or the
same id with a greater attempt. Everything else — a repeat of the running
attempt, or an attempt the kernel has moved past — is acknowledged and ignored.
"""

from __future__ import annotations

import time
import uuid
from collections import OrderedDict
from dataclasses import dataclass
from typing import Callable

__all__ = ["DispatchKey", "DispatchTracker", "is_newer", "MAX_TRACKED"]

MAX_TRACKED = 10_000


@dataclass(frozen=True)
class DispatchKey:
    dispatch_id: str
    attempt: int | None  # None when the kernel did not send it

    @property
    def uuid(self) -> uuid.UUID:
        return uuid.UUID(self.dispatch_id)


def is_newer(new: DispatchKey, seen: DispatchKey) -> bool | None:
    """Whether `new` supersedes `seen`; None when it cannot be told (an
    attempt number is missing for the same dispatch id)."""
    if new.uuid != seen.uuid:
        return new.uuid > seen.uuid
    if new.attempt is None or seen.attempt is None:
        return None
    return new.attempt > seen.attempt


@dataclass
class _Entry:
    key: DispatchKey
    running: bool
    expires_at: float


class DispatchTracker:
    """The newest dispatch seen per execution."""

    def __init__(self, max_entries: int = MAX_TRACKED, clock: Callable[[], float] = time.monotonic) -> None:
        self._max = max_entries
        self._clock = clock
        self._entries: OrderedDict[str, _Entry] = OrderedDict()

    def __len__(self) -> int:
        return len(self._entries)

    def newest(self, execution_id: str) -> DispatchKey | None:
        entry = self._live(execution_id)
        return entry.key if entry else None

    def _live(self, execution_id: str) -> _Entry | None:
        entry = self._entries.get(execution_id)
        if entry is None:
            return None
        if not entry.running and entry.expires_at <= self._clock():
            del self._entries[execution_id]
            return None
        return entry

    def offer(self, execution_id: str, key: DispatchKey) -> bool:
        """Record `key` and return True when it should run; False to ignore it."""
        entry = self._live(execution_id)
        if entry is not None:
            newer = is_newer(key, entry.key)
            if newer is None:
                newer = not entry.running  # unknown order: a finished handler may run again (replays are safe)
            if not newer:
                self._entries.move_to_end(execution_id)
                return False
        self._entries[execution_id] = _Entry(key, True, float("inf"))
        self._entries.move_to_end(execution_id)
        self._evict()
        return True

    def finished(self, execution_id: str, key: DispatchKey, lease_timeout_seconds: float) -> None:
        """The handler of `key` ended: keep the entry for 2 × lease, then forget it."""
        entry = self._entries.get(execution_id)
        if entry is not None and entry.key == key:
            entry.running = False
            entry.expires_at = self._clock() + 2 * lease_timeout_seconds

    def _evict(self) -> None:
        while len(self._entries) > self._max:
            # Prefer forgetting finished executions, oldest first.
            victim = next((k for k, e in self._entries.items() if not e.running), None)
            if victim is None:
                victim = next(iter(self._entries))
            del self._entries[victim]
