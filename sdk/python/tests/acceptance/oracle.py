"""The acceptance suite's own coverage oracle (docs/protocol/resources.md §5.1,
docs/protocol/forks.md §2, §3), computed from the events read back. The kernel's coverage
answers are checked against it, never against themselves.

* `Oracle(events)`: coverage at any point, covered ranges, generations;
* `expected_fork(source_events, s)`: what a fork at `s` must copy, how its
  seqs map, and its restoration;
* `Workspace`: expected directory contents from the writes the log records.

What the oracle reads from a log:

* `resource.registered` — a key exists from that seq on, with its
  `coverage_reuse`;
* `step.executing` — every one is a live start (replays write no event); its
  `step_type` and `resources` decide whether it ends a key's coverage: any
  live start when `coverage_reuse` is false, only a `tool_call` or `local`
  start declaring the key when it is true. The `generations` payload is NOT
  read: that would check the kernel against itself;
* `resource.checkpointed` — `covered_seq` and the ref; a fork's copy of a
  closed checkpoint carries `invalidated_seq` (the start that closed it need
  not be in the fork's log), otherwise the closing start is found by the rule
  above;
* `resource.initialized` — a fork's starting generation for the key.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterable

from rebuno import Event, Step

TERMINAL_STEP_EVENTS = ("step.succeeded", "step.failed", "step.denied")
CLEANUP_DENIALS = {"execution_completed", "execution_failed", "execution_cancelled", "deadline_exceeded"}


@dataclass(frozen=True)
class Checkpoint:
    key: str
    covered_seq: int
    ref: str
    generation: int
    invalidated_seq: int | None  # None: still open at the end of the log
    event_seq: int


@dataclass(frozen=True)
class KeyPoint:
    covered: bool
    reason: str  # covered | no_checkpoint | step_started
    ref: str | None  # the restore ref: the newest checkpoint with covered_seq <= s
    checkpoint_seq: int | None

    def restoration(self) -> dict[str, Any]:
        out: dict[str, Any] = {"covered": self.covered}
        if self.ref is not None:
            out["checkpoint_ref"] = self.ref
            out["checkpoint_seq"] = self.checkpoint_seq
        return out


@dataclass(frozen=True)
class Point:
    covered: bool
    keys: dict[str, KeyPoint]

    def summary(self) -> tuple[bool, dict[str, tuple[bool, str | None]]]:
        """Coverage without the seqs (which a fork renumbers)."""
        return self.covered, {k: (p.covered, p.ref) for k, p in self.keys.items()}


@dataclass(frozen=True)
class Start:
    seq: int
    step_id: str
    step_type: str
    target: str
    resources: tuple[str, ...]
    retry: bool


class Oracle:
    def __init__(self, events: list[Event]) -> None:
        if not events:
            raise ValueError("an empty log")
        self.events = events
        self.last = events[-1].event_seq
        assert [e.event_seq for e in events] == list(range(1, self.last + 1)), "the log has gaps"
        self.registered: dict[str, int] = {}
        self.reuse: dict[str, bool] = {}
        self.initialized: dict[str, tuple[int, int]] = {}  # key -> (seq, generation)
        self.starts: list[Start] = []
        raw: list[tuple[Event, dict[str, Any]]] = []
        for e in events:
            p = e.payload
            if e.type == "resource.registered" and p["key"] not in self.registered:
                self.registered[p["key"]] = e.event_seq
                self.reuse[p["key"]] = bool(p.get("coverage_reuse", False))
            elif e.type == "resource.initialized":
                self.initialized[p["key"]] = (e.event_seq, int(p["generation"]))
            elif e.type == "step.executing":
                self.starts.append(Start(e.event_seq, p["step_id"], p["step_type"], p.get("target", ""),
                                         tuple(p.get("resources") or ()), bool(p.get("retry", False))))
            elif e.type == "resource.checkpointed":
                raw.append((e, p))
        self.checkpoints: dict[str, list[Checkpoint]] = {k: [] for k in self.registered}
        for e, p in raw:
            key = p["key"]
            covered = int(p["covered_seq"])
            inv = p.get("invalidated_seq")
            if inv is None:
                inv = next((s for s in self.ending(key) if s > covered), None)
            self.checkpoints.setdefault(key, []).append(
                Checkpoint(key, covered, p["checkpoint_ref"], int(p["generation"]), inv, e.event_seq))
        for rows in self.checkpoints.values():
            rows.sort(key=lambda c: c.covered_seq)

    # ------------------------------------------------------------ starts

    def ends_coverage(self, start: Start, key: str) -> bool:
        if not self.reuse.get(key, False):
            return True
        return start.step_type in ("tool_call", "local") and key in start.resources

    def ending(self, key: str) -> list[int]:
        """Seqs of the live starts that end `key`'s coverage (docs/protocol/resources.md §5.1 step 2)."""
        return [s.seq for s in self.starts if s.seq > self.registered.get(key, 0) and self.ends_coverage(s, key)]

    def generation_at(self, key: str, s: int) -> int:
        """The key's generation after event s: a fork's initial value (or 0),
        plus one per coverage-ending start after it (docs/protocol/resources.md §3)."""
        base_seq, base = self.initialized.get(key, (0, 0))
        if base_seq > s:
            base_seq, base = 0, 0
        return base + sum(1 for x in self.ending(key) if base_seq < x <= s)

    # ---------------------------------------------------------- coverage

    def key_point(self, key: str, s: int) -> KeyPoint:
        found = [c for c in self.checkpoints.get(key, []) if c.covered_seq <= s]
        if not found:
            return KeyPoint(False, "no_checkpoint", None, None)
        c = found[-1]
        covered = c.invalidated_seq is None or c.invalidated_seq > s
        return KeyPoint(covered, "covered" if covered else "step_started", c.ref, c.covered_seq)

    def point(self, s: int) -> Point:
        if not 1 <= s <= self.last:
            raise ValueError(f"seq {s} outside 1..{self.last}")
        keys = {k: self.key_point(k, s) for k, reg in self.registered.items() if reg <= s}
        return Point(all(p.covered for p in keys.values()), keys)

    def covered(self, s: int) -> bool:
        return self.point(s).covered

    def ranges(self, key: str | None = None) -> list[list[int]]:
        """Inclusive covered ranges of the whole log, or of one key from its registration."""
        out: list[list[int]] = []
        start = 1 if key is None else self.registered[key]
        for s in range(start, self.last + 1):
            ok = self.point(s).covered if key is None else self.key_point(key, s).covered
            if not ok:
                continue
            if out and out[-1][1] == s - 1:
                out[-1][1] = s
            else:
                out.append([s, s])
        return out


def assert_kernel_matches(oracle: Oracle, ranges: Any, points: dict[int, Any]) -> None:
    """Compare the kernel's ranges answer and point answers with the oracle."""
    assert ranges.last_event_seq == oracle.last
    assert [list(r) for r in ranges.covered_ranges] == oracle.ranges(), \
        (ranges.covered_ranges, oracle.ranges())
    assert {r.key: [list(x) for x in r.covered_ranges] for r in ranges.resources} == \
        {k: oracle.ranges(k) for k in oracle.registered}
    assert {r.key: r.registered_seq for r in ranges.resources} == oracle.registered
    for s, point in points.items():
        want = oracle.point(s)
        assert point.covered == want.covered, s
        got = {r.key: KeyPoint(r.covered, r.reason, r.checkpoint_ref, r.checkpoint_seq) for r in point.resources}
        assert got == want.keys, (s, got, want.keys)


# --------------------------------------------------------------------- forks


@dataclass
class ForkPlan:
    """What a fork of `source` at `s` must look like (docs/protocol/forks.md §2, §3)."""

    s: int
    kept: list[Event]  # source events copied into the fork's log, in order
    copied_steps: set[str]  # source step ids
    keys: list[str]  # copied resources, in registration order
    point: Point  # the source's coverage at s
    seq_map: dict[int, int] = field(default_factory=dict)  # source seq x <= s -> fork seq

    def map(self, x: int) -> int:
        return self.seq_map[x]

    def last_source_seq(self, p: int) -> int | None:
        """The last source seq that maps to fork position p."""
        xs = [x for x, q in self.seq_map.items() if q == p]
        return max(xs) if xs else None


def expected_fork(source: Oracle, s: int) -> ForkPlan:
    events = source.events
    terminal: dict[str, Event] = {}
    for e in events:
        if e.event_seq <= s and e.type in TERMINAL_STEP_EVENTS:
            terminal[e.payload["step_id"]] = e
    copied = set()
    for sid, e in terminal.items():
        if e.type == "step.denied" and (e.payload.get("error") or {}).get("reason") in CLEANUP_DENIALS:
            continue
        copied.add(sid)
    keys = [k for k, reg in sorted(source.registered.items(), key=lambda kv: kv[1]) if reg <= s]
    kept = []
    for e in events:
        if e.event_seq > s:
            break
        if e.type in ("resource.registered", "resource.initialized"):
            if e.payload["key"] in keys:
                kept.append(e)
        elif e.type.startswith("step.") and e.type != "step.rate_limited" and e.payload.get("step_id") in copied:
            kept.append(e)
    plan = ForkPlan(s, kept, copied, keys, source.point(s))
    kept_seqs = [e.event_seq for e in kept]
    for x in range(1, s + 1):
        before = [i for i, k in enumerate(kept_seqs) if k <= x]
        plan.seq_map[x] = 3 + before[-1] if before else 2
    return plan


def expected_checkpoint_copies(source: Oracle, plan: ForkPlan) -> list[dict[str, Any]]:
    """The fork's copied `resource.checkpointed` payloads (docs/protocol/forks.md §2, §3)."""
    out: list[dict[str, Any]] = []
    for key in plan.keys:
        by_mapped: dict[int, Checkpoint] = {}
        for c in source.checkpoints.get(key, []):
            if c.covered_seq > plan.s:
                continue
            m = plan.map(c.covered_seq)
            if m not in by_mapped or by_mapped[m].covered_seq < c.covered_seq:
                by_mapped[m] = c
        for m in sorted(by_mapped):
            c = by_mapped[m]
            p: dict[str, Any] = {"key": key, "generation": c.generation, "checkpoint_ref": c.ref, "covered_seq": m}
            if c.invalidated_seq is not None and c.invalidated_seq <= plan.s:
                p["invalidated_seq"] = plan.map(c.invalidated_seq)
            out.append(p)
    return out


def strip_step_id(payload: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in payload.items() if k != "step_id"}


def check_fork_log(source: Oracle, plan: ForkPlan, fork_events: list[Event], fork_id: str,
                   source_id: str) -> Oracle:
    """Check the fork's creation transaction against the plan, and that its
    coverage at every copied position equals the source's at the last seq
    mapping there (and at s for the rest of the transaction). Returns the
    fork's oracle."""
    types = [e.type for e in fork_events]
    n = len(plan.kept)
    assert types[:2] == ["execution.created", "execution.forked"], types[:4]
    forked = fork_events[1].payload
    assert forked["source_execution_id"] == source_id and forked["fork_seq"] == plan.s
    assert forked["restoration"] == {k: plan.point.keys[k].restoration() for k in plan.keys}
    copies = fork_events[2:2 + n]
    assert [e.type for e in copies] == [e.type for e in plan.kept], (plan.s, types)
    for mine, theirs in zip(copies, plan.kept):
        assert strip_step_id(mine.payload) == strip_step_id(theirs.payload), (plan.s, mine, theirs)
        assert mine.occurred_at == theirs.occurred_at
        if "step_id" in theirs.payload:
            assert mine.payload["step_id"] != theirs.payload["step_id"]
    rest = fork_events[2 + n:]
    inits = [e.payload for e in rest[:len(plan.keys)]]
    want_inits = []
    for k in plan.keys:
        kp = plan.point.keys[k]
        gen = source.generation_at(k, plan.s) + (0 if kp.covered else 1)
        init: dict[str, Any] = {"key": k, "generation": gen}
        if kp.ref is not None:
            init["checkpoint_ref"] = kp.ref
        want_inits.append(init)
    assert [e.type for e in rest[:len(plan.keys)]] == ["resource.initialized"] * len(plan.keys)
    assert inits == want_inits, (plan.s, inits, want_inits)
    want_ckpts = expected_checkpoint_copies(source, plan)
    after = rest[len(plan.keys):]
    got_ckpts = [e.payload for e in after[:len(want_ckpts)]]
    assert got_ckpts == want_ckpts, (plan.s, got_ckpts, want_ckpts)
    tail = after[len(want_ckpts):len(want_ckpts) + 2]
    assert [e.type for e in tail] == ["execution.started", "dispatch.queued"], (plan.s, types)
    created_end = tail[-1].event_seq

    fork = Oracle(fork_events)
    for p in range(2, created_end + 1):
        x = plan.last_source_seq(p) if p <= 2 + n else plan.s
        want = source.point(x).summary() if x is not None else (True, {})
        assert fork.point(p).summary() == want, (plan.s, p, x, fork.point(p), want)
    return fork


# ---------------------------------------------------------------- contents


@dataclass(frozen=True)
class Write:
    seq: int  # the step's step.succeeded
    path: str
    content: str
    step_id: str


def writes(events: list[Event], steps: Iterable[Step], target: str = "write_file") -> list[Write]:
    """The successful writes of a log, in the order they succeeded."""
    args = {s.step_id: s.args for s in steps if s.kind == "tool_call" and s.target == target}
    out = []
    for e in events:
        if e.type == "step.succeeded" and e.payload.get("step_id") in args:
            a = args[e.payload["step_id"]]
            out.append(Write(e.event_seq, a["path"], a["content"], e.payload["step_id"]))
    return out


def contents_at(ws: list[Write], s: int, start: dict[str, str] | None = None) -> dict[str, str]:
    """The expected workspace after event s: the writes whose step.succeeded precedes it."""
    out = dict(start or {})
    for w in ws:
        if w.seq <= s:
            out[w.path] = w.content
    return out


