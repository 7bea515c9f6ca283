// Package kernel holds every rule of the Rebuno protocol. Each exported
// method is one verb (CreateExecution, SubmitStep, CompleteStep, …): the HTTP
// layer parses a request and calls exactly one of them; background workers
// call the rest. The kernel talks to storage only through store.Store.
package kernel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/events"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/metrics"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// Config holds the settings the protocol rules depend on (docs/protocol/configuration.md §2).
type Config struct {
	DispatchMaxAttempts  int64
	DispatchTimeout      time.Duration
	DispatchLeaseTimeout time.Duration
	BackoffBase          time.Duration
	BackoffMax           time.Duration
	DeadlineTimeout      time.Duration
	ApprovalTimeout      time.Duration
	Retention            time.Duration
	CleanupInterval      time.Duration
	MaxStepsPerExecution int64
	MaxExecutionBytes    int64
	// RequireDispatchHeaders makes both dispatch headers mandatory on agent
	// writes; it follows --require-v1-signatures (docs/protocol/http.md §10).
	RequireDispatchHeaders bool
	ReplicaID              string
}

// DefaultConfig returns the defaults of docs/protocol/configuration.md §2.
func DefaultConfig() Config {
	return Config{
		DispatchMaxAttempts:  5,
		DispatchTimeout:      30 * time.Second,
		DispatchLeaseTimeout: 2 * time.Minute,
		BackoffBase:          time.Second,
		BackoffMax:           30 * time.Second,
		ApprovalTimeout:      15 * time.Minute,
		CleanupInterval:      10 * time.Minute,
		MaxStepsPerExecution: 100000,
		MaxExecutionBytes:    1 << 30,
		ReplicaID:            "local",
	}
}

// Kernel implements the protocol over a store. It is the only thing the HTTP
// layer and the dispatcher talk to: they never reach the store or the stream
// hub themselves.
type Kernel struct {
	store    store.Store
	notifier store.Notifier
	clock    clock.Clock
	cfg      Config
	hub      *events.Hub
	metrics  *metrics.Metrics
	log      *slog.Logger
	policy   Policy
	limiter  Limiter
	wake     chan struct{}

	bundles expiring[string] // agent id → policy bundle text
	secrets expiring[string] // agent id → secret
	keys    keyCache
	views   views // which executions are in-place forks (forkview.go)
}

// Options wires a kernel's collaborators.
type Options struct {
	Store   store.Store
	Clock   clock.Clock
	Config  Config
	Metrics *metrics.Metrics
	Logger  *slog.Logger
	Policy  Policy
	// Limiter holds rate-limit buckets; nil means an in-memory limiter.
	Limiter Limiter
}

// New returns a kernel.
func New(o Options) *Kernel {
	k := &Kernel{store: o.Store, notifier: o.Store.Notifier(), clock: o.Clock, cfg: o.Config, hub: events.NewHub(),
		metrics: o.Metrics, log: o.Logger, policy: o.Policy, limiter: o.Limiter, wake: make(chan struct{}, 1)}
	if k.clock == nil {
		k.clock = clock.Real{}
	}
	if k.metrics == nil {
		k.metrics = metrics.New()
	}
	if k.log == nil {
		k.log = slog.Default()
	}
	if k.policy == nil {
		k.policy = NewBundles(k.log)
	}
	if k.limiter == nil {
		k.limiter = NewMemoryLimiter()
	}
	k.notifier.Listen(k.hear)
	return k
}

// Clock returns the kernel's clock.
func (k *Kernel) Clock() clock.Clock { return k.clock }

// Config returns the kernel's configuration.
func (k *Kernel) Config() Config { return k.cfg }

// Metrics returns the kernel's metrics.
func (k *Kernel) Metrics() *metrics.Metrics { return k.metrics }

// Ready reports whether the store answers, for readiness (docs/protocol/operations.md §1).
func (k *Kernel) Ready(ctx context.Context) error { return k.store.Ping(ctx) }

// DispatchWake fires when a dispatch may have become due, on this process or
// another one sharing the store, or when delivery capacity was freed.
func (k *Kernel) DispatchWake() <-chan struct{} { return k.wake }

// WakeDispatcher asks the dispatcher to look for due work now.
func (k *Kernel) WakeDispatcher() { k.wakeDispatcher() }

func (k *Kernel) wakeDispatcher() {
	select {
	case k.wake <- struct{}{}:
	default:
	}
}

// hear routes a notification, from this process or another, to whoever
// waits for it here.
func (k *Kernel) hear(n store.Notification) {
	switch n.Topic {
	case store.TopicEvents:
		k.hub.Notify(n.Key)
	case store.TopicEnded:
		k.hub.NotifyEnd(n.Key)
	case store.TopicDispatch:
		k.wakeDispatcher()
	case store.TopicDelta:
		if d, ok := decodeDelta(n.Data); ok {
			k.hub.PublishDelta(n.Key, d)
		}
	case store.TopicResync:
		k.wakeDispatcher()
		k.hub.NotifyAll()
	}
}

// notifyDispatch tells every dispatcher sharing the store that a dispatch is
// due; run after the commit that made it so.
func (k *Kernel) notifyDispatch() { k.notifier.Notify(store.Notification{Topic: store.TopicDispatch}) }

// Caller identifies who makes a request: a bearer client (Agent == "") or an
// agent authenticated by its signature.
type Caller struct {
	Agent string
}

// DispatchHeaders are the optional dispatch headers of an agent request.
// ID == "" and Attempt == 0 mean absent.
type DispatchHeaders struct {
	ID      string
	Attempt int64
}

// errStorageLimit aborts a transaction whose writes would cross a storage
// limit; the caller then fails the execution in a transaction of its own.
var errStorageLimit = errors.New("storage limit exceeded")

// op is the state of one write transaction on one execution: it numbers the
// events, keeps the execution's bookkeeping and writes both at the end.
type op struct {
	k      *Kernel
	ctx    context.Context
	tx     store.Tx
	now    time.Time
	e      *store.Execution
	events []*store.Event
	// enforce makes finish refuse writes that cross the storage limits.
	enforce bool
}

func (k *Kernel) newOp(ctx context.Context, tx store.Tx) *op {
	// Stores keep microseconds (docs/protocol/README.md §3); truncating here makes an answer, its
	// events and a later read show one instant the same way.
	return &op{k: k, ctx: ctx, tx: tx, now: k.clock.Now().Truncate(time.Microsecond)}
}

// load reads the execution the operation is about and checks the caller may
// act on it (404, then 403).
func (o *op) load(id string, c Caller) error {
	e, err := o.tx.ExecutionHead(o.ctx, id)
	if err != nil {
		return notFoundOr(err, "execution")
	}
	if c.Agent != "" && e.AgentID != c.Agent {
		return errForbidden()
	}
	o.e = e
	return nil
}

// emit appends an event to the execution's log (written at finish).
func (o *op) emit(typ string, payload *jsonx.Object) {
	b := payload.Bytes()
	o.e.LastSeq++
	o.e.ByteCount += int64(len(b))
	o.append(&store.Event{ExecutionID: o.e.ID, Seq: o.e.LastSeq, Type: typ, Payload: b, OccurredAt: o.now})
}

// append queues an event whose seq is taken, giving it the log's mark
// before it and advancing the execution's mark past it. A payload the mark
// cannot read (only a kernel bug writes one) leaves the execution unmarked
// from then on, so that its forks copy rather than read a wrong mark.
func (o *op) append(ev *store.Event) {
	if m := o.e.Mark; m != nil {
		ev.Mark = m
		next, err := advanceMark(m, ev.Type, ev.Payload)
		if err != nil {
			o.k.log.Error("event unreadable for its mark; forks of this execution will copy",
				"execution_id", o.e.ID, "event_seq", ev.Seq, "error", err)
		}
		o.e.Mark = next
	}
	o.events = append(o.events, ev)
}

// view is the loaded execution's forkView, nil unless it is an in-place fork.
func (o *op) view() (*forkView, error) {
	return o.k.viewOf(o.ctx, o.tx, o.e)
}

// propose appends a new step's step.proposed: its first event.
func (o *op) propose(s *store.Step) {
	s.SubmittedSeq = o.e.LastSeq + 1
	o.emit(wire.EventStepProposed, stepPayload(s))
}

// finish writes the events and the execution row.
func (o *op) finish() error {
	if o.e == nil {
		return nil
	}
	if o.overLimit() {
		return errStorageLimit
	}
	if len(o.events) > 0 {
		if err := o.tx.AppendEvents(o.ctx, o.events); err != nil {
			return fmt.Errorf("append events: %w", err)
		}
		id, n := o.e.ID, o.k.notifier
		o.tx.AfterCommit(func() { n.Notify(store.Notification{Topic: store.TopicEvents, Key: id}) })
		o.events = nil
	}
	if err := o.tx.UpdateExecution(o.ctx, o.e); err != nil {
		return fmt.Errorf("update execution: %w", err)
	}
	return nil
}

// overLimit reports whether the writes so far cross a storage limit
// (docs/protocol/operations.md §2.4) that this operation enforces.
func (o *op) overLimit() bool {
	return o.enforce && (o.e.StepCount > o.k.cfg.MaxStepsPerExecution || o.e.ByteCount > o.k.cfg.MaxExecutionBytes)
}

// update runs fn in a transaction locked on executionID and finishes its op.
// When fn's writes would cross a storage limit, the execution is failed with
// storage_limit_exceeded instead and onLimit's answer is returned.
func (k *Kernel) update(ctx context.Context, executionID string, fn func(o *op) error) error {
	return k.transact(ctx, executionID, k.store.Update, fn)
}

// transact is update through the given store method (Update or TryUpdate).
func (k *Kernel) transact(ctx context.Context, executionID string, via func(context.Context, string, func(context.Context, store.Tx) error) error,
	fn func(o *op) error) error {
	err := via(ctx, executionID, func(ctx context.Context, tx store.Tx) error {
		o := k.newOp(ctx, tx)
		if err := fn(o); err != nil {
			return err
		}
		return o.finish()
	})
	if errors.Is(err, errStorageLimit) {
		if ferr := k.failForStorage(ctx, executionID); ferr != nil {
			return ferr
		}
		return errStorageLimit
	}
	return err
}

func (k *Kernel) failForStorage(ctx context.Context, executionID string) error {
	return k.update(ctx, executionID, func(o *op) error {
		if err := o.load(executionID, Caller{}); err != nil {
			return err
		}
		if wire.ExecTerminal(o.e.Status) {
			return nil
		}
		return o.terminate(wire.ExecFailed, wire.ReasonStorageLimitExceeded, wire.CauseExecutionFailed)
	})
}

// terminate moves the execution to a terminal status and performs the
// clean-up of docs/protocol/executions.md §9 in the same transaction.
func (o *op) terminate(status, reason, cause string) error {
	e := o.e
	e.Status = status
	e.FailureReason = reason
	e.UpdatedAt = o.now
	p := (&jsonx.Object{}).String("execution_id", e.ID).String("status", status)
	switch status {
	case wire.ExecCompleted:
		o.emit(wire.EventExecutionCompleted, p.Raw("output", e.Output))
	case wire.ExecFailed:
		if reason != "" {
			p.String("reason", reason)
		}
		o.emit(wire.EventExecutionFailed, p)
	case wire.ExecCancelled:
		o.emit(wire.EventExecutionCancelled, p.String("reason", reason))
	}
	errJSON := (&jsonx.Object{}).String("reason", cause).Bytes()
	if err := o.closeApprovals(cause); err != nil {
		return err
	}
	open, err := o.tx.OpenSteps(o.ctx, e.ID)
	if err != nil {
		return fmt.Errorf("read open steps: %w", err)
	}
	for _, s := range open {
		s.Status = wire.StepCancelled
		s.Error = errJSON
		s.ErrorReason = cause
		s.CompletedAt = o.now
		o.emit(wire.EventStepCancelled, stepPayload(s).Raw("error", errJSON))
		s.TerminalSeq = o.e.LastSeq
		o.stopWriting(s)
		if err := o.tx.UpdateStep(o.ctx, s); err != nil {
			return fmt.Errorf("cancel step: %w", err)
		}
	}
	if err := o.tx.RetireDispatches(o.ctx, e.ID, "", o.now); err != nil {
		return fmt.Errorf("retire dispatches: %w", err)
	}
	if err := o.tx.DeleteExecutionCounters(o.ctx, e.ID); err != nil {
		return fmt.Errorf("delete counters: %w", err)
	}
	if err := o.tx.DeleteExecutionMarks(o.ctx, e.ID); err != nil {
		return fmt.Errorf("delete rate-limit marks: %w", err)
	}
	m, n := o.k.metrics, o.k.notifier
	o.tx.AfterCommit(func() {
		m.ExecutionsCompleted.WithLabelValues(status).Inc()
		n.Notify(store.Notification{Topic: store.TopicEnded, Key: e.ID})
	})
	return nil
}

// stepPayload starts the payload every step.* event carries.
func stepPayload(s *store.Step) *jsonx.Object {
	return (&jsonx.Object{}).String("step_id", s.StepID).String("step_type", s.Kind).String("target", s.Target)
}
