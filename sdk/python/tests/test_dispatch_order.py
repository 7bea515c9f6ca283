"""Webhook ordering (docs/protocol/sdk.md §1.4): which deliveries run and which are ignored."""

from __future__ import annotations

from rebuno._dispatch import DispatchKey, DispatchTracker, is_newer

from .fakes import uuid7

EXEC = "018ff0a0-0000-7000-8000-000000000001"


def test_is_newer() -> None:
    a, b = uuid7(), uuid7()
    assert is_newer(DispatchKey(b, 1), DispatchKey(a, 5)) is True
    assert is_newer(DispatchKey(a, 5), DispatchKey(b, 1)) is False
    assert is_newer(DispatchKey(a, 2), DispatchKey(a, 1)) is True
    assert is_newer(DispatchKey(a, 1), DispatchKey(a, 1)) is False
    assert is_newer(DispatchKey(a, 1), DispatchKey(a, 2)) is False
    assert is_newer(DispatchKey(a, None), DispatchKey(a, 1)) is None
    # Ids compare as UUIDs, whatever their case.
    assert is_newer(DispatchKey(b.upper(), 1), DispatchKey(a, 1)) is True


def test_tracker_runs_only_newer() -> None:
    now = [0.0]
    t = DispatchTracker(clock=lambda: now[0])
    d1, d2 = uuid7(), uuid7()
    assert t.offer(EXEC, DispatchKey(d1, 1))
    assert not t.offer(EXEC, DispatchKey(d1, 1))  # repeat of the running attempt
    assert t.offer(EXEC, DispatchKey(d1, 2))  # redelivery supersedes
    assert not t.offer(EXEC, DispatchKey(d1, 1))  # the kernel moved past it
    assert t.offer(EXEC, DispatchKey(d2, 1))  # newer dispatch
    assert not t.offer(EXEC, DispatchKey(d1, 9))  # older dispatch, any attempt
    t.finished(EXEC, DispatchKey(d2, 1), lease_timeout_seconds=10)
    now[0] = 19.0
    assert not t.offer(EXEC, DispatchKey(d2, 1))  # still remembered within 2 × lease
    t.finished(EXEC, DispatchKey(d2, 1), lease_timeout_seconds=10)
    now[0] = 40.0
    assert t.newest(EXEC) is None  # forgotten after 2 × lease
    assert t.offer(EXEC, DispatchKey(d1, 1))


def test_unknown_attempt_runs_only_when_idle() -> None:
    t = DispatchTracker()
    d = uuid7()
    assert t.offer(EXEC, DispatchKey(d, None))
    assert not t.offer(EXEC, DispatchKey(d, None))  # running: a repeat
    t.finished(EXEC, DispatchKey(d, None), 120)
    assert t.offer(EXEC, DispatchKey(d, None))  # finished: a redelivery replays safely


def test_lru_bound_prefers_finished() -> None:
    t = DispatchTracker(max_entries=3)
    keys = {f"e{i}": DispatchKey(uuid7(), 1) for i in range(4)}
    for eid in ("e0", "e1", "e2"):
        assert t.offer(eid, keys[eid])
    t.finished("e1", keys["e1"], 120)
    assert t.offer("e3", keys["e3"])
    assert len(t) == 3
    assert t.newest("e1") is None  # the finished one was evicted, not the running ones
    assert t.newest("e0") == keys["e0"]
