"""Shapes the kernel returns (docs/protocol/README.md §5), as pydantic models.

Every model ignores fields it does not know (docs/protocol/README.md §4: clients MUST ignore
unknown response fields), so a newer kernel never breaks an older SDK.
Verbatim user JSON (`input`, `output`, `args`, `result`, `error`, payloads) is
typed `Any`.
"""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = [
    "Model",
    "Execution",
    "ExecutionPage",
    "Step",
    "Event",
    "Approval",
    "AgentInfo",
    "DecisionResource",
    "DecisionKind",
    "Decision",
    "Resource",
    "ResourceCoverage",
    "CoveragePoint",
    "ResourceRanges",
    "CoverageRanges",
    "StreamDelta",
    "StreamEnd",
    "ExecutionStatus",
    "StepStatus",
    "TERMINAL_EXECUTION_STATUSES",
]

ExecutionStatus = Literal["pending", "running", "blocked", "completed", "failed", "cancelled"]
StepStatus = Literal["proposed", "allowed", "denied", "awaiting_approval", "executing", "succeeded", "failed",
                     "cancelled"]
TERMINAL_EXECUTION_STATUSES = frozenset({"completed", "failed", "cancelled"})


class Model(BaseModel):
    """Base of every response model: unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore", populate_by_name=True)


class Execution(Model):
    id: str
    agent_id: str
    status: str
    input: Any = None
    output: Any = None
    agent_version: str | None = None
    failure_reason: str | None = None
    created_at: datetime | None = None
    updated_at: datetime | None = None
    deadline_at: datetime | None = None
    parent_execution_id: str | None = None
    idempotency_key: str | None = None
    on_behalf_of: str | None = None
    forked_from: str | None = None
    fork_seq: int | None = None
    restoration: dict[str, Any] | None = None
    resource_keys: list[str] = Field(default_factory=list)

    @property
    def terminal(self) -> bool:
        """Whether the status is completed, failed or cancelled."""
        return self.status in TERMINAL_EXECUTION_STATUSES


class ExecutionPage(Model):
    executions: list[Execution] = Field(default_factory=list)
    next_cursor: str | None = None


class Step(Model):
    step_id: str
    execution_id: str
    kind: str
    target: str = ""
    args_hash: str = ""
    occurrence: int = 0
    status: str
    idempotency: str = "safe_to_retry"
    args: Any = None
    result: Any = None
    error: Any = None
    resources: list[str] = Field(default_factory=list)
    started_at: datetime | None = None
    completed_at: datetime | None = None


class Event(Model):
    execution_id: str
    event_seq: int
    type: str
    payload: dict[str, Any] = Field(default_factory=dict)
    occurred_at: datetime | None = None


class Approval(Model):
    id: str
    step_id: str
    execution_id: str
    agent_id: str = ""
    kind: str = ""
    target: str = ""
    status: str
    approvers: list[str] = Field(default_factory=list)
    message: str | None = None
    timeout_at: datetime | None = None
    decided_by: str | None = None
    decided_at: datetime | None = None
    rationale: str | None = None
    created_at: datetime | None = None


class AgentInfo(Model):
    id: str
    webhook_url: str = ""
    policy_bundle: str = ""
    lease_timeout_seconds: int | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None
    output_schema: dict[str, Any] | None = None
    registered_at: datetime | None = None
    updated_at: datetime | None = None


class DecisionResource(Model):
    key: str
    generation: int = 0
    due: bool = False


class DecisionKind(StrEnum):
    """The `decision` of a submit or step outcome answer. Members are `str`s
    equal to their wire values (`DecisionKind.PROCEED == "proceed"`)."""

    PROCEED = "proceed"
    REPLAY = "replay"
    DENIED = "denied"
    RATE_LIMITED = "rate_limited"
    BLOCKED = "blocked"
    EXECUTION_BLOCKED = "execution_blocked"
    EXECUTION_TERMINAL = "execution_terminal"
    RECORDED = "recorded"


class Decision(Model):
    """The answer to submit, step complete and step fail (docs/protocol/steps.md §3)."""

    # A decision a newer kernel may add stays a plain `str` (unknown values are ignored, not refused).
    decision: Annotated[DecisionKind | str, Field(union_mode="left_to_right")]
    step_id: str | None = None
    result: Any = None
    error: Any = None
    approval_id: str | None = None
    reason: str | None = None
    rule_id: str | None = None
    retry_after_ms: int | None = None
    resources: list[DecisionResource] | None = None
    # Which of `result` / `error` the kernel actually sent (`null` is a valid result).
    has_result: bool = Field(default=False, exclude=True)
    has_error: bool = Field(default=False, exclude=True)

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> Decision:
        d = cls.model_validate(data)
        d.has_result = "result" in data
        d.has_error = "error" in data
        return d


class Resource(Model):
    """A resource of an execution: the view every register answers with
    (docs/protocol/resources.md §2). `checkpoint_ref` is the ref a fork's
    resource is restored from (`""` for the initial environment); `covered`
    is coverage at the current end of the log."""

    key: str
    driver_id: str
    configuration: Any = None
    coverage_reuse: bool = False
    every_steps: int = 0
    on_completion: bool = False
    registered_seq: int = 0
    generation: int = 0
    binding: Any = None
    checkpoint_ref: str = ""
    covered: bool = False


class ResourceCoverage(Model):
    """One resource of a coverage point: `reason` is `covered`,
    `no_checkpoint` or `step_started`; `checkpoint_ref`/`checkpoint_seq` name
    the checkpoint a fork at this point restores (None when there is none)."""

    key: str
    covered: bool
    reason: str = ""
    checkpoint_ref: str | None = None
    checkpoint_seq: int | None = None


class CoveragePoint(Model):
    """`Client.coverage(id, at_seq=N)`: coverage at one event. An empty
    `resources` list means the point is vacuously covered."""

    execution_id: str
    at_seq: int
    covered: bool
    resources: list[ResourceCoverage] = Field(default_factory=list)


class ResourceRanges(Model):
    key: str
    registered_seq: int = 0
    covered_ranges: list[tuple[int, int]] = Field(default_factory=list)


class CoverageRanges(Model):
    """`Client.coverage(id)`: the covered ranges of the whole log, inclusive;
    an open range ends at `last_event_seq`."""

    execution_id: str
    last_event_seq: int
    covered_ranges: list[tuple[int, int]] = Field(default_factory=list)
    resources: list[ResourceRanges] = Field(default_factory=list)

    def covered(self, seq: int) -> bool:
        """Whether the event `seq` is covered."""
        return any(lo <= seq <= hi for lo, hi in self.covered_ranges)


class StreamDelta(Model):
    """One live delta of a running step (docs/protocol/events.md §5)."""

    step_id: str
    seq: int
    data: str


class StreamEnd(Model):
    """The `end` frame of the event tail (docs/protocol/events.md §4)."""

    execution_id: str
    status: str
