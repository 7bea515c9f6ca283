"""An independent coverage oracle (docs/protocol/resources.md §5.1), computed only
from an execution's events as ``GET …/events`` returns them.

It never asks the kernel about coverage: the ``resource.*`` payloads carry every
seq it needs (registrations are the ``resource.registered`` events themselves,
checkpoints the ``resource.checkpointed`` events, closed copies in a fork carry
``invalidated_seq``) and the ``step.executing`` events are the live starts. The
kernel's ``GET …/coverage`` answers are then checked against it, point by point
and as ranges; the kernel is never checked against itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

AFFECTING = ("tool_call", "local")
STEP_TERMINAL = ("step.succeeded", "step.failed", "step.denied")


@dataclass
class Registration:
    key: str
    registered_seq: int
    coverage_reuse: bool
    every_steps: int
    on_completion: bool


@dataclass
class Checkpoint:
    key: str
    seq: int  # the resource.checkpointed event itself
    generation: int
    ref: str
    covered_seq: int
    # From the payload (a fork's copy of a closed checkpoint), else None.
    explicit_invalidated: int | None
    invalidated: int | None = None


@dataclass
class Start:
    seq: int
    step_id: str
    step_type: str
    declared: list[str]
    generations: dict[str, int]
    retry: bool


@dataclass
class Oracle:
    events: list[dict[str, Any]]
    last_seq: int = 0
    registrations: list[Registration] = field(default_factory=list)
    checkpoints: list[Checkpoint] = field(default_factory=list)
    starts: list[Start] = field(default_factory=list)
    initialized: dict[str, tuple[int, dict[str, Any]]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        seqs = [e["event_seq"] for e in self.events]
        assert seqs == list(range(1, len(seqs) + 1)), f"event seqs are not 1..n: {seqs}"
        self.last_seq = len(seqs)
        for e in self.events:
            t, p, seq = e["type"], e["payload"], e["event_seq"]
            if t == "resource.registered":
                self.registrations.append(
                    Registration(p["key"], seq, p["coverage_reuse"], p["every_steps"], p["on_completion"])
                )
            elif t == "resource.checkpointed":
                self.checkpoints.append(
                    Checkpoint(
                        p["key"], seq, p["generation"], p["checkpoint_ref"], p["covered_seq"], p.get("invalidated_seq")
                    )
                )
            elif t == "resource.initialized":
                self.initialized[p["key"]] = (seq, p)
            elif t == "step.executing":
                self.starts.append(
                    Start(
                        seq,
                        p["step_id"],
                        p["step_type"],
                        list(p.get("resources", [])),
                        dict(p.get("generations", {})),
                        p.get("retry") is True,
                    )
                )
        for c in self.checkpoints:
            if c.explicit_invalidated is not None:
                c.invalidated = c.explicit_invalidated
                continue
            ending = [s.seq for s in self.starts if s.seq > c.covered_seq and self.ends(s, c.key)]
            c.invalidated = min(ending) if ending else None

    # -- rules --

    def registration(self, key: str) -> Registration:
        for r in self.registrations:
            if r.key == key:
                return r
        raise KeyError(key)

    def ends(self, start: Start, key: str) -> bool:
        """Whether a live start ends the coverage of ``key`` (docs/protocol/resources.md §5.1 step 2)."""
        if not self.registration(key).coverage_reuse:
            return True
        return start.step_type in AFFECTING and key in start.declared

    def newest(self, key: str, s: int) -> Checkpoint | None:
        """The newest checkpoint of ``key`` with covered_seq ≤ s."""
        best = None
        for c in self.checkpoints:
            if c.key == key and c.covered_seq <= s and (best is None or c.covered_seq > best.covered_seq):
                best = c
        return best

    def key_covered(self, key: str, s: int) -> bool:
        c = self.newest(key, s)
        return c is not None and (c.invalidated is None or c.invalidated > s)

    def point(self, eid: str, s: int) -> dict[str, Any]:
        """The point answer the kernel must give for ``at_seq=s``."""
        resources = []
        for r in self.registrations:
            if r.registered_seq > s:
                continue
            c = self.newest(r.key, s)
            entry: dict[str, Any] = {"key": r.key}
            if c is None:
                entry.update(covered=False, reason="no_checkpoint")
            else:
                ok = c.invalidated is None or c.invalidated > s
                entry.update(
                    covered=ok,
                    reason="covered" if ok else "step_started",
                    checkpoint_ref=c.ref,
                    checkpoint_seq=c.covered_seq,
                )
            resources.append(entry)
        return {
            "execution_id": eid,
            "at_seq": s,
            "covered": all(r["covered"] for r in resources),
            "resources": resources,
        }

    def covered(self, s: int) -> bool:
        return all(self.key_covered(r.key, s) for r in self.registrations if r.registered_seq <= s)

    def ranges(self, eid: str) -> dict[str, Any]:
        """The ranges answer, built point by point (not by range arithmetic)."""
        per_key = []
        for r in self.registrations:
            per_key.append(
                {
                    "key": r.key,
                    "registered_seq": r.registered_seq,
                    "covered_ranges": _runs([s for s in range(1, self.last_seq + 1) if self.key_covered(r.key, s)]),
                }
            )
        return {
            "execution_id": eid,
            "last_event_seq": self.last_seq,
            "covered_ranges": _runs([s for s in range(1, self.last_seq + 1) if self.covered(s)]),
            "resources": per_key,
        }

    def generation(self, key: str, s: int) -> int:
        """The generation of ``key`` after event ``s``: 0, or the value a fork's
        ``resource.initialized`` set, raised by each ending start after that."""
        base_seq, base = 0, 0
        init = self.initialized.get(key)
        if init is not None and init[0] <= s:
            base_seq, base = init[0], init[1]["generation"]
        return base + sum(1 for st in self.starts if base_seq < st.seq <= s and self.ends(st, key))

    def own_starts(self) -> list[Start]:
        """Live starts of this execution: all of a root's, and a fork's after its
        creation transaction (its copies carry the source's payloads)."""
        begin = self.started_seq()
        return [s for s in self.starts if s.seq > begin]

    def started_seq(self) -> int:
        return next(e["event_seq"] for e in self.events if e["type"] == "execution.started")

    def of_type(self, t: str) -> list[dict[str, Any]]:
        return [e for e in self.events if e["type"] == t]

    def check_generations(self) -> None:
        """Each own live start raised exactly the keys it ends, to the oracle's
        generation; each own accepted capture is of the generation current then."""
        for st in self.own_starts():
            want = {r.key: self.generation(r.key, st.seq) for r in self.registrations if self.ends(st, r.key)}
            assert st.generations == want, f"step.executing at {st.seq}: generations {st.generations}, want {want}"
        begin = self.started_seq()
        for c in self.checkpoints:
            if c.seq > begin:
                assert c.generation == self.generation(c.key, c.seq), (
                    f"checkpoint at {c.seq} accepted at generation {c.generation}, "
                    f"current {self.generation(c.key, c.seq)}"
                )
                assert c.covered_seq <= c.seq and c.explicit_invalidated is None


def _runs(points: list[int]) -> list[list[int]]:
    out: list[list[int]] = []
    for p in points:
        if out and out[-1][1] == p - 1:
            out[-1][1] = p
        else:
            out.append([p, p])
    return out


# ---------------------------------------------------------------------------
# What a fork copies, from the source's events alone (docs/protocol/forks.md §2, §3)
# ---------------------------------------------------------------------------


def copied_step_ids(events: list[dict[str, Any]], s: int) -> set[str]:
    """Steps with a terminal outcome at or before s (no denials by clean-up
    happen in these tests)."""
    return {e["payload"]["step_id"] for e in events if e["event_seq"] <= s and e["type"] in STEP_TERMINAL}


def kept_events(events: list[dict[str, Any]], s: int) -> list[dict[str, Any]]:
    copied = copied_step_ids(events, s)
    out = []
    for e in events:
        if e["event_seq"] > s:
            break
        t = e["type"]
        resource = t in ("resource.registered", "resource.initialized")
        step = t.startswith("step.") and t != "step.rate_limited" and e["payload"].get("step_id") in copied
        if resource or step:
            out.append(e)
    return out


class ForkMap:
    """The seq mapping of a fork at ``s``: source seq x → fork seq, the position
    of the last kept event at or before x, or 2 when none is."""

    def __init__(self, source_events: list[dict[str, Any]], s: int):
        self.s = s
        self.kept = kept_events(source_events, s)
        kept_seqs = {e["event_seq"]: 3 + i for i, e in enumerate(self.kept)}
        self._map = [0] * (s + 1)
        pos = 2
        self._last: dict[int, int] = {}
        for x in range(1, s + 1):
            pos = kept_seqs.get(x, pos)
            self._map[x] = pos
            self._last[pos] = x

    def map(self, x: int) -> int:
        return self._map[x]

    @property
    def last_copied(self) -> int:
        return 2 + len(self.kept)

    def last_source_seq(self, p: int) -> int | None:
        """The last source seq at or before s that maps to fork position p."""
        return self._last.get(p)
