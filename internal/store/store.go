// Package store defines what the kernel needs from durable storage, in the
// kernel's own terms (executions, steps, events, dispatches), never in SQL.
// Every backend (SQLite today, Postgres later) implements Store and must pass
// the conformance suite in store/storetest unchanged.
package store

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned by single-row reads when the row does not exist.
var ErrNotFound = errors.New("not found")

// ErrUnavailable wraps failures of the store itself (disk, connection,
// timeout); the HTTP layer maps it to 503 so that clients retry.
var ErrUnavailable = errors.New("store unavailable")

// ErrLocked is returned by TryUpdate when another transaction holds the
// execution's lock.
var ErrLocked = errors.New("execution locked by another transaction")

// ErrExists is returned by an insert whose key is taken.
var ErrExists = errors.New("already exists")

// Store is a durable backend.
type Store interface {
	// Update runs fn in one write transaction. Everything fn writes commits
	// together, durably, before Update returns nil; if fn returns an error
	// nothing it wrote is kept. lockExecutionID names the execution whose
	// operations must be serialised (docs/protocol/operations.md §2.2); "" when the operation creates one
	// or touches none. Backends may group the transactions of concurrent
	// callers into one physical commit.
	Update(ctx context.Context, lockExecutionID string, fn func(ctx context.Context, tx Tx) error) error

	// TryUpdate is Update that gives up at once with ErrLocked, writing
	// nothing, when another transaction holds the lock of lockExecutionID
	// (FOR UPDATE SKIP LOCKED on Postgres). Replicas racing for the same
	// work, a dispatch claim for instance, use it so that the losers move on
	// to other work instead of queueing behind the winner. A backend that
	// serialises all writers never returns ErrLocked.
	TryUpdate(ctx context.Context, lockExecutionID string, fn func(ctx context.Context, tx Tx) error) error

	// Read returns a reader outside any write transaction. Each call it makes
	// is its own short read.
	Read() Reader

	// Ping answers a trivial query, for readiness.
	Ping(ctx context.Context) error

	// Notifier carries signals to every kernel process sharing this store
	// (notify.go).
	Notifier() Notifier

	// Leading reports whether this process should run the singleton duties
	// (lease reclaim, deadlines, approval expiry, retention) right now. A
	// backend used by one process at a time always leads; a shared one elects
	// one leader among its processes. Every duty re-checks its rows under the
	// execution's lock, so a moment with two leaders (a leader that has lost
	// its database session and does not know it yet) is wasteful, never wrong.
	Leading() bool

	Close() error
}

// Reader is the read side, available both inside a write transaction (Tx) and
// outside one (Store.Read).
type Reader interface {
	Execution(ctx context.Context, id string) (*Execution, error)
	// ExecutionHead reads an execution without its input, output and state:
	// what operations on it need. In a write transaction it takes the
	// execution's lock where the backend needs one.
	ExecutionHead(ctx context.Context, id string) (*Execution, error)
	ListExecutions(ctx context.Context, f ExecutionFilter) ([]*Execution, error)
	// Events returns events with seq > afterSeq in ascending order.
	Events(ctx context.Context, executionID string, afterSeq int64, limit int) ([]*Event, error)

	Step(ctx context.Context, executionID, stepID string) (*Step, error)
	// Steps returns steps in recording order with order > afterOrder, keeping
	// only the given statuses (all when empty).
	Steps(ctx context.Context, executionID string, statuses []string, afterOrder int64, limit int) ([]*Step, error)
	// FinishedStepHeads pages the steps that succeeded, failed or were
	// denied by seq upTo, in recording order after afterOrder, with what a
	// fork's copy keeps: no args, result or error (copies share the bodies,
	// so reading them would only cost time and memory), and no dispatch,
	// attempt or start details (a copy was never started in the fork).
	FinishedStepHeads(ctx context.Context, executionID string, upTo, afterOrder int64, limit int) ([]*Step, error)
	// OpenSteps returns the steps in status allowed or executing, in
	// recording order.
	OpenSteps(ctx context.Context, executionID string) ([]*Step, error)
	// HasIndeterminate reports a failed step of this identity whose error
	// reason is "indeterminate" (docs/protocol/steps.md §8).
	HasIndeterminate(ctx context.Context, executionID, kind, target, argsHash string) (bool, error)

	// What a fork that reads its source in place needs (docs/architecture.md,
	// "Forks"). EventRun is the run of the execution's log that holds seq,
	// with the mark stored with it; ErrNotFound when no run holds seq (past
	// the log, or in the legacy events table).
	EventRun(ctx context.Context, executionID string, seq int64) (*EventRun, error)
	// StepByOrder is the step recorded at order, with its SubmittedSeq.
	StepByOrder(ctx context.Context, executionID string, order int64) (*Step, error)
	// StepsByID returns the steps among ids that exist, without their args,
	// result, error and start details, in no particular order.
	StepsByID(ctx context.Context, executionID string, ids []string) ([]*Step, error)
	// StepsByIdentity returns every occurrence of an identity, in occurrence
	// order.
	StepsByIdentity(ctx context.Context, executionID, kind, target, argsHash string) ([]*Step, error)
	// HasForksInPlace reports whether a fork reads the execution's history
	// in place, which retention must then keep.
	HasForksInPlace(ctx context.Context, executionID string) (bool, error)

	Dispatch(ctx context.Context, id string) (*Dispatch, error)
	// Counter is how many times a step identity has been consumed by one
	// dispatch of an execution (docs/protocol/identity.md §6).
	Counter(ctx context.Context, executionID, dispatchID, kind, target, argsHash string) (consumed int64, found bool, err error)
	// Occurrences is Counter and the highest occurrence recorded for the
	// identity, in one query: what a submit that names its occurrence
	// checks.
	Occurrences(ctx context.Context, executionID, dispatchID, kind, target, argsHash string) (Occurrences, error)

	Agent(ctx context.Context, id string) (*Agent, error)
	ListAgents(ctx context.Context) ([]*Agent, error)
	AgentHasLiveExecutions(ctx context.Context, agentID string) (bool, error)

	Idempotency(ctx context.Context, route, scope, key string) (*IdempotencyRecord, error)

	Approval(ctx context.Context, id string) (*Approval, error)
	// PendingApprovalForStep finds the pending approval a step awaits.
	PendingApprovalForStep(ctx context.Context, executionID, stepID string) (*Approval, error)
	// PendingApprovals lists an execution's pending approvals by id.
	PendingApprovals(ctx context.Context, executionID string) ([]*Approval, error)
	// ListApprovals lists approvals in ascending id order.
	ListApprovals(ctx context.Context, f ApprovalFilter) ([]*Approval, error)
	// ExpiredApprovals returns pending approvals whose timeout has passed.
	ExpiredApprovals(ctx context.Context, now time.Time, limit int) ([]ApprovalRef, error)
	// NextApprovalTimeout is the earliest timeout of a pending approval; zero
	// when there is none.
	NextApprovalTimeout(ctx context.Context) (time.Time, error)
	// RateLimitMark is the time of the last audited rate-limit refusal of a
	// step id (docs/protocol/governance.md §3).
	RateLimitMark(ctx context.Context, executionID, stepID string) (at time.Time, found bool, err error)

	// Resources lists an execution's resources in registration order.
	Resources(ctx context.Context, executionID string) ([]*Resource, error)
	Resource(ctx context.Context, executionID, key string) (*Resource, error)
	// Checkpoints lists an execution's checkpoint rows by key, then
	// covered_seq.
	Checkpoints(ctx context.Context, executionID string) ([]*Checkpoint, error)
	// CheckpointAt is the newest checkpoint of key with covered_seq <= seq.
	CheckpointAt(ctx context.Context, executionID, key string, seq int64) (*Checkpoint, error)
	// CheckpointRange lists key's checkpoint rows with after < covered_seq
	// <= upTo, by covered_seq.
	CheckpointRange(ctx context.Context, executionID, key string, after, upTo int64) ([]*Checkpoint, error)
	// CountCheckpoints counts key's checkpoint rows with covered_seq <= upTo
	// without reading them: an in-place fork sizes the rows it reads from
	// its source by it.
	CountCheckpoints(ctx context.Context, executionID, key string, upTo int64) (CheckpointCount, error)
	// CopyRefs lists the steps whose bodies the execution's copied steps
	// share (execution id, step id), for retention.
	CopyRefs(ctx context.Context, executionID string) ([][2]string, error)

	// Scheduling queries used by the background workers.
	// DueDispatches lists due dispatches oldest first, with their agents,
	// leaving out the dispatches of the agents in skipAgents (those the
	// caller cannot deliver to now).
	DueDispatches(ctx context.Context, now time.Time, limit int, skipAgents []string) ([]DispatchRef, error)
	ExpiredLeases(ctx context.Context, now time.Time, limit int) ([]DispatchRef, error)
	// NextDue is the earliest next_attempt_at of a pending or failed
	// dispatch, leaving out those of skipAgents; zero when there is none.
	NextDue(ctx context.Context, skipAgents []string) (time.Time, error)
	// NextLeaseExpiry is the earliest lease expiry of an in-flight
	// dispatch; zero when there is none.
	NextLeaseExpiry(ctx context.Context) (time.Time, error)
	QueueDepth(ctx context.Context, now time.Time) (int64, error)
	DeadlinesDue(ctx context.Context, now time.Time, limit int) ([]string, error)
	NextDeadline(ctx context.Context) (time.Time, error)
	RetentionCandidates(ctx context.Context, updatedBefore time.Time, limit int) ([]string, error)

	// Access (keys.go).
	APIKey(ctx context.Context, name string) (*APIKey, error)
	// APIKeyByHash finds a key by the hash of its token, revoked and expired
	// keys included.
	APIKeyByHash(ctx context.Context, hash string) (*APIKey, error)
	// ListAPIKeys lists every key, revoked ones included, by name.
	ListAPIKeys(ctx context.Context) ([]*APIKey, error)
	// AuditLog returns entries with seq > afterSeq, oldest first.
	AuditLog(ctx context.Context, afterSeq int64, limit int) ([]*AuditEntry, error)
	Session(ctx context.Context, hash string) (*Session, error)
	// Setting reads a deployment-wide value; ErrNotFound when unset.
	Setting(ctx context.Context, name string) (string, error)
}

// Tx is one write transaction. Methods write exactly what they are given; the
// rules of the protocol live in the kernel.
type Tx interface {
	Reader

	InsertExecution(ctx context.Context, e *Execution) error
	// UpdateExecution writes the mutable fields of e except output and state.
	UpdateExecution(ctx context.Context, e *Execution) error
	// SetExecutionResult stores what an execution completed with.
	SetExecutionResult(ctx context.Context, id string, output, state []byte) error
	DeleteExecution(ctx context.Context, id string) error
	AppendEvents(ctx context.Context, events []*Event) error

	InsertStep(ctx context.Context, s *Step) error
	InsertSteps(ctx context.Context, steps []*Step) error
	UpdateStep(ctx context.Context, s *Step) error

	InsertDispatch(ctx context.Context, d *Dispatch) error
	UpdateDispatch(ctx context.Context, d *Dispatch) error
	// RetireDispatches retires every non-retired dispatch of the execution
	// except keepID.
	RetireDispatches(ctx context.Context, executionID, keepID string, now time.Time) error

	// RaiseCounter records that a dispatch has handed out occurrences up to
	// consumed of a step identity: the counter becomes consumed, unless it
	// is already at or above it.
	RaiseCounter(ctx context.Context, executionID, dispatchID, kind, target, argsHash string, consumed int64) error
	DeleteDispatchCounters(ctx context.Context, executionID, dispatchID string) error
	DeleteExecutionCounters(ctx context.Context, executionID string) error

	UpsertAgent(ctx context.Context, a *Agent) error
	// UpdateAgentMetadata replaces description and schemas; ErrNotFound when
	// the agent does not exist.
	UpdateAgentMetadata(ctx context.Context, id, description string, inputSchema, outputSchema []byte, now time.Time) error
	SetAgentPolicy(ctx context.Context, id, bundle string, now time.Time) error
	DeleteAgent(ctx context.Context, id string) error

	InsertIdempotency(ctx context.Context, r *IdempotencyRecord) error
	InsertApproval(ctx context.Context, a *Approval) error
	// UpdateApproval writes the decision fields of a.
	UpdateApproval(ctx context.Context, a *Approval) error
	SetRateLimitMark(ctx context.Context, executionID, stepID string, at time.Time) error
	DeleteExecutionMarks(ctx context.Context, executionID string) error

	InsertResource(ctx context.Context, r *Resource) error
	// UpdateResource writes generation, binding and the start counter.
	UpdateResource(ctx context.Context, r *Resource) error
	InsertCheckpoint(ctx context.Context, c *Checkpoint) error
	// InvalidateCheckpoints closes the open checkpoints of key at seq,
	// whose kept count (Checkpoint.InvalidatedKept) is kept.
	InvalidateCheckpoints(ctx context.Context, executionID, key string, seq, kept int64) error
	DeleteIdempotencyBefore(ctx context.Context, before time.Time) error

	// InsertAPIKey stores a new key; ErrExists when its name is taken.
	InsertAPIKey(ctx context.Context, k *APIKey) error
	// UpdateAPIKey writes a key's revocation and last use.
	UpdateAPIKey(ctx context.Context, k *APIKey) error
	// AppendAudit adds an entry; the store numbers it.
	AppendAudit(ctx context.Context, e *AuditEntry) error
	InsertSession(ctx context.Context, s *Session) error
	DeleteSession(ctx context.Context, hash string) error
	DeleteSessionsBefore(ctx context.Context, before time.Time) error
	// InsertSettingIfAbsent sets a deployment-wide value unless it is set.
	InsertSettingIfAbsent(ctx context.Context, name, value string) error

	// AfterCommit registers f to run once the transaction is durable. It is
	// not run when the transaction rolls back.
	AfterCommit(f func())
}

// Execution is the stored execution row.
type Execution struct {
	ID             string
	AgentID        string
	AgentVersion   string
	Input          []byte // verbatim JSON, "null" when absent
	Status         string
	Output         []byte // verbatim JSON; meaningful when completed
	State          []byte // verbatim JSON; nil when none
	FailureReason  string
	CreatedAt      time.Time
	UpdatedAt      time.Time
	DeadlineAt     time.Time // zero when none
	ParentID       string
	IdempotencyKey string
	OnBehalfOf     string
	ForkedFrom     string
	ForkSeq        int64
	Restoration    []byte // verbatim JSON object on forks, nil otherwise
	ResourceKeys   []string
	// A fork that reads its source in place: its log's positions 3 to
	// ForkKept+2 and its steps' orders 1 to ForkSteps are the source's, read
	// through the kernel's resolver; ForkExcluded (kept beside the input,
	// read with it) lists what of the source up to ForkSeq it leaves out,
	// in the kernel's encoding.
	ForkInPlace  bool
	ForkKept     int64
	ForkSteps    int64
	ForkExcluded []byte

	// Bookkeeping kept on the row so that no operation scans history.
	// Writing lists the tool and local steps that were started and may
	// still be executing (a capture reads them to find writers at work,
	// docs/protocol/resources.md §3): every start adds its step, every end
	// removes it, and a reader keeps only those still executing.
	Writing    []string
	DispatchID string // newest dispatch
	LastSeq    int64  // last event_seq
	StepOrder  int64  // last step recording order (copies included)
	StepCount  int64  // steps recorded by the execution itself (docs/protocol/operations.md §2.4)
	ByteCount  int64  // bytes stored by the execution itself (docs/protocol/operations.md §2.4)
	// Mark is the log's mark after its last event; nil on an execution
	// recorded before marks existed, whose runs carry none.
	Mark *Mark
}

// Mark is what a fork needs to know of a log at a seq without a pass over
// it: counts of the events before that seq. The kernel keeps the running
// mark on the execution row and gives each appended event the mark before
// it; the store keeps the mark of each run's first event.
type Mark struct {
	Kept        int64  // keepable events (docs/protocol/forks.md §3)
	Closed      int64  // steps closed in a way a fork copies (docs/protocol/forks.md §2)
	Generations []byte // JSON object: resource key → generation; nil before any resource
}

// EventRun is one run of an execution's log as stored: its events and the
// mark before the first one (nil when it was written without one).
type EventRun struct {
	FirstSeq int64
	LastSeq  int64
	Mark     *Mark
	Events   []*Event
}

// ExecutionFilter selects executions for ListExecutions: newest first, ids
// strictly below Cursor when set.
type ExecutionFilter struct {
	AgentID    string
	ForkedFrom string
	Status     string
	Cursor     string
	Limit      int
}

// Event is one entry of an execution's log.
type Event struct {
	ExecutionID string
	Seq         int64
	Type        string
	Payload     []byte // JSON object
	OccurredAt  time.Time
	// Mark is the log's mark before this event, set by the kernel on the
	// events it appends; a run stores its first event's.
	Mark *Mark
}

// Step is the stored step row.
type Step struct {
	ExecutionID string
	StepID      string
	Order       int64 // recording order within the execution
	Kind        string
	Target      string
	ArgsHash    string
	Occurrence  int64
	Status      string
	Idempotency string
	Args        []byte // verbatim JSON
	Result      []byte // verbatim JSON; meaningful when succeeded
	Error       []byte // verbatim JSON; meaningful when failed, denied or cancelled
	ErrorReason string // error.reason when the error is an object with a string reason
	Resources   []string
	StartedAt   time.Time
	CompletedAt time.Time
	DispatchID  string // dispatch and attempt that last started (or recorded) it
	Attempt     int64
	TerminalSeq int64
	// StartInfo is the resources entries of the step's latest live start
	// (JSON), answered again to a same-attempt retry (docs/protocol/identity.md §7).
	StartInfo []byte
	// BodyExecutionID and BodyStepID name the step whose args, result and
	// error a fork's copy shares; empty on steps that own their bodies.
	BodyExecutionID string
	BodyStepID      string
	// SubmittedSeq is the seq of the step's first event; 0 on steps recorded
	// before it was kept. Read only by StepByOrder.
	SubmittedSeq int64
}

// Resource is external state an execution registered
// (docs/protocol/resources.md §2).
type Resource struct {
	ExecutionID           string
	Key                   string
	Position              int64 // registration order
	DriverID              string
	Configuration         []byte // canonical JSON; nil when none
	CoverageReuse         bool
	EverySteps            int64
	OnCompletion          bool
	RegisteredSeq         int64
	Generation            int64
	Binding               []byte // nil until bound
	CheckpointRef         string // the restore ref of a fork's copy, else ""
	StartsSinceCheckpoint int64
}

// Checkpoint is an accepted capture of a resource.
//
// CoveredKept and InvalidatedKept are the execution's mark's Kept after the
// event at CoveredSeq and at InvalidatedSeq: the keepable events up to it
// (docs/protocol/forks.md §3), so that a fork reading the execution in place
// maps those seqs to its own numbering without reading the log. 0 is
// unknown: a row written before they were kept, or by an execution without
// marks. The true value is never 0: a checkpoint follows a keepable event
// of its resource (its resource.registered, or in a fork the copy of it or
// the fork's resource.initialized).
type Checkpoint struct {
	ExecutionID     string
	Key             string
	CoveredSeq      int64
	Generation      int64
	CheckpointRef   string
	InvalidatedSeq  int64 // 0 while open
	CoveredKept     int64 // 0 when unknown
	InvalidatedKept int64 // 0 when unknown or open
}

// Occurrences is what a submit naming its occurrence reads of its identity
// (Reader.Occurrences).
type Occurrences struct {
	Consumed   int64 // the dispatch's counter (Reader.Counter)
	HasCounter bool
	Highest    int64 // the highest occurrence recorded for the identity
	HasHighest bool
}

// CheckpointCount counts checkpoint rows (Reader.CountCheckpoints).
type CheckpointCount struct {
	Rows int64
	// KeptCounts is how many distinct CoveredKept the rows have.
	KeptCounts int64
	// Unmarked is how many rows lack a kept count: CoveredKept, or
	// InvalidatedKept of a closed row, is 0.
	Unmarked int64
}

// Dispatch is the stored dispatch row (docs/protocol/dispatch.md §1).
type Dispatch struct {
	ID              string
	ExecutionID     string
	Status          string
	Attempt         int64
	MaxAttempts     int64
	ProgressAttempt int64
	LeaseTimeout    int64 // whole seconds, fixed at each claim
	NextAttemptAt   time.Time
	LeaseExpiresAt  time.Time
	ClaimedBy       string
	CreatedAt       time.Time
	UpdatedAt       time.Time
}

// DispatchRef names a dispatch found by a scheduling query. AgentID is set
// by DueDispatches only.
type DispatchRef struct {
	ID          string
	ExecutionID string
	AgentID     string
}

// Agent is the stored agent row. Secret never leaves the kernel.
type Agent struct {
	ID                  string
	WebhookURL          string
	Secret              string
	PolicyBundle        string
	LeaseTimeoutSeconds int64 // 0 when the agent registered none
	Description         string
	InputSchema         []byte
	OutputSchema        []byte
	RegisteredAt        time.Time
	UpdatedAt           time.Time
}

// IdempotencyRecord remembers which execution a keyed create or fork made.
type IdempotencyRecord struct {
	Route       string
	Scope       string // "" for create; the source execution id for fork
	Key         string
	BodyHash    string
	ExecutionID string
	CreatedAt   time.Time
}

// Approval is a human decision a step waits for (docs/protocol/governance.md §1.1).
type Approval struct {
	ID          string
	ExecutionID string
	StepID      string
	AgentID     string
	Kind        string
	Target      string
	Status      string
	Approvers   []string
	Message     string
	TimeoutAt   time.Time
	DecidedBy   string
	DecidedAt   time.Time
	Rationale   string
	CreatedAt   time.Time
}

// ApprovalFilter selects approvals for ListApprovals.
type ApprovalFilter struct {
	Status      string
	ExecutionID string
	After       string // ids strictly greater
	Limit       int
}

// ApprovalRef names an approval found by a scheduling query.
type ApprovalRef struct {
	ID          string
	ExecutionID string
}
