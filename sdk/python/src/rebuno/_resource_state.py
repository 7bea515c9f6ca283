"""Per-dispatch resource bookkeeping (docs/protocol/sdk.md §4.3–§4.6).

Kept apart from `resources.py` so that `ExecutionContext` can own one
`ResourceState` without importing the public resource API.

* `entries`: key → the resource opened in this dispatch (handle, driver and
  the identity it was opened with);
* `generations`: the newest generation the SDK has received per key, from
  register views and from `proceed` answers (the kernel counts, docs/protocol/sdk.md §4.6);
* the **step lock**: tool calls and local steps run one at a time while the
  execution has resources (docs/protocol/sdk.md §4.5). `serialise` turns it on;
* the **body mark**: a `ContextVar` that says "this code runs inside the body
  of a tool or local step". Calls made there re-enter the lock, and their due
  captures are deferred to the outermost running body.
"""

from __future__ import annotations

import asyncio
import contextvars
from dataclasses import dataclass, field
from typing import Any, Iterable

__all__ = ["BodyMark", "OpenedResource", "ResourceState", "current_mark"]


@dataclass(eq=False)
class BodyMark:
    """The running body of one tool or local step.

    `active` is true only while that body runs; tasks the body spawns inherit
    the mark, and once the body has ended their calls take the lock normally.
    `deferred` holds keys whose capture waits for the end of this body (due
    captures of nested steps, and a baseline of a resource first opened inside
    it), in the order they were deferred.
    """

    owner: object  # the ExecutionContext the body runs in
    parent: BodyMark | None = None
    active: bool = True
    deferred: list[str] = field(default_factory=list)

    def defer(self, keys: Iterable[str]) -> None:
        for key in keys:
            if key not in self.deferred:
                self.deferred.append(key)

    def root(self) -> BodyMark | None:
        """The outermost running body that encloses this mark (itself included
        while it runs), or None when no enclosing body runs any more."""
        found: BodyMark | None = None
        mark: BodyMark | None = self
        while mark is not None:
            if mark.active:
                found = mark
            mark = mark.parent
        return found


_mark: contextvars.ContextVar[BodyMark | None] = contextvars.ContextVar("rebuno_body", default=None)


def current_mark(owner: object) -> BodyMark | None:
    """The mark of the running body this code is inside, for this context."""
    mark = _mark.get()
    if mark is None or mark.owner is not owner or mark.root() is None:
        return None
    return mark


def set_mark(mark: BodyMark | None) -> contextvars.Token[BodyMark | None]:
    return _mark.set(mark)


def reset_mark(token: contextvars.Token[BodyMark | None]) -> None:
    _mark.reset(token)


@dataclass(eq=False)
class OpenedResource:
    """A resource opened (or being opened) in this dispatch."""

    key: str
    driver: Any
    driver_id: str
    configuration: Any  # the JSON value sent
    configuration_text: str  # its canonical text, for comparisons
    coverage_reuse: bool
    every_steps: int  # the policy this dispatch registers with
    on_completion: bool
    ready: asyncio.Future[Any]
    handle: Any = None
    done: bool = False
    registered_seq: int = 0
    # The policy the kernel keeps for the key (it wins over code).
    stored_every_steps: int = 0
    stored_on_completion: bool = False
    policy_warned: bool = False


class ResourceState:
    """The resources of one dispatch attempt."""

    def __init__(self) -> None:
        self.entries: dict[str, OpenedResource] = {}
        self.generations: dict[str, int] = {}
        # Keys of the execution record read at dispatch start.
        self.initial_keys: list[str] = []
        self.serialise = False
        self._lock: asyncio.Lock | None = None

    @property
    def lock(self) -> asyncio.Lock:
        if self._lock is None:
            self._lock = asyncio.Lock()
        return self._lock

    def start(self, resource_keys: Iterable[str]) -> None:
        """Dispatch start: the lock is on from here when the execution
        already has resources (docs/protocol/sdk.md §4.5)."""
        self.initial_keys = list(resource_keys)
        if self.initial_keys:
            self.serialise = True

    def learn(self, key: str, generation: int) -> None:
        """Keep the newest generation received for `key`."""
        if generation > self.generations.get(key, -1):
            self.generations[key] = generation

    def learn_entries(self, entries: Iterable[Any]) -> None:
        for e in entries:
            self.learn(e.key, e.generation)

    def opened(self, key: str) -> OpenedResource | None:
        entry = self.entries.get(key)
        return entry if entry is not None and entry.done else None
