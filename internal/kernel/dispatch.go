package kernel

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// enqueueDispatch creates the execution's newest dispatch and retires the
// others (docs/protocol/dispatch.md §2). The dispatcher is woken once the transaction commits.
func (o *op) enqueueDispatch() error {
	d := &store.Dispatch{
		ID: newDispatchID(o.e.DispatchID, o.now), ExecutionID: o.e.ID, Status: wire.DispatchPending,
		MaxAttempts: o.k.cfg.DispatchMaxAttempts, NextAttemptAt: o.now, CreatedAt: o.now, UpdatedAt: o.now,
	}
	if err := o.tx.InsertDispatch(o.ctx, d); err != nil {
		return fmt.Errorf("insert dispatch: %w", err)
	}
	if err := o.tx.RetireDispatches(o.ctx, o.e.ID, d.ID, o.now); err != nil {
		return fmt.Errorf("retire dispatches: %w", err)
	}
	if o.e.DispatchID != "" {
		// The retired dispatches' occurrence counters can never be used again (docs/protocol/identity.md §6).
		if err := o.tx.DeleteExecutionCounters(o.ctx, o.e.ID); err != nil {
			return fmt.Errorf("delete counters: %w", err)
		}
	}
	o.e.DispatchID = d.ID
	o.emit(wire.EventDispatchQueued, dispatchPayload(d, wire.DispatchPending, 0))
	o.tx.AfterCommit(o.k.notifyDispatch)
	return nil
}

func dispatchPayload(d *store.Dispatch, status string, attempt int64) *jsonx.Object {
	return (&jsonx.Object{}).String("dispatch_id", d.ID).String("execution_id", d.ExecutionID).
		String("status", status).Int("attempt", attempt)
}

// checkDispatch validates the dispatch headers of an agent write (docs/protocol/http.md §10) and
// returns the named dispatch (nil when the request names none).
func (o *op) checkDispatch(h DispatchHeaders) (*store.Dispatch, error) {
	return validateDispatch(o.ctx, o.tx, o.e, h, o.k.cfg.RequireDispatchHeaders)
}

func validateDispatch(ctx context.Context, r store.Reader, e *store.Execution, h DispatchHeaders, requireBoth bool) (*store.Dispatch, error) {
	if requireBoth && (h.ID == "" || h.Attempt == 0) {
		if h.ID == "" {
			return nil, MissingDispatchID()
		}
		return nil, validation(wire.HeaderDispatchAttempt, "missing dispatch attempt")
	}
	if h.ID == "" {
		return nil, nil
	}
	d, err := r.Dispatch(ctx, h.ID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, &Error{Code: wire.CodeValidation, Field: wire.HeaderDispatchID, Message: "validation error: unknown dispatch_id"}
	}
	if err != nil {
		return nil, fmt.Errorf("read dispatch: %w", err)
	}
	if d.ExecutionID != e.ID {
		return nil, &Error{Code: wire.CodeValidation, Field: wire.HeaderDispatchID,
			Message: "validation error: dispatch_id belongs to another execution"}
	}
	if h.Attempt > d.Attempt {
		return nil, &Error{Code: wire.CodeValidation, Field: wire.HeaderDispatchAttempt,
			Message: "validation error: dispatch attempt is ahead of the kernel"}
	}
	return d, nil
}

// superseded reports whether a request acts for an attempt that is no longer
// current (docs/protocol/dispatch.md §11). A request naming no dispatch is never superseded.
func (o *op) superseded(d *store.Dispatch, h DispatchHeaders) bool {
	if d == nil {
		return false
	}
	return d.ID != o.e.DispatchID || (h.Attempt > 0 && h.Attempt < d.Attempt)
}

// admit runs the checks every state-changing agent request shares once its
// execution is loaded, in the protocol's order: a terminal execution
// (errTerminal), the dispatch headers (400), fencing. It returns the named
// dispatch and whether the request is superseded; refusing a superseded
// request is the route's call, because the outcome of a step still
// executing is recorded whoever reports it (docs/protocol/dispatch.md §11).
func (o *op) admit(h DispatchHeaders) (*store.Dispatch, bool, error) {
	if wire.ExecTerminal(o.e.Status) {
		return nil, false, errTerminal()
	}
	d, err := o.checkDispatch(h)
	if err != nil {
		return nil, false, err
	}
	return d, o.superseded(d, h), nil
}

// agentWrite is the preamble of every agent write but the step outcome:
// load the execution (404, 403), admit the request, refuse it when
// superseded. It returns the named dispatch.
func (o *op) agentWrite(id string, c Caller, h DispatchHeaders) (*store.Dispatch, error) {
	if err := o.load(id, c); err != nil {
		return nil, err
	}
	d, superseded, err := o.admit(h)
	if err != nil {
		return nil, err
	}
	if superseded {
		return nil, o.k.refuseSuperseded()
	}
	return d, nil
}

func (k *Kernel) refuseSuperseded() error {
	k.metrics.DispatchSuperseded.Inc()
	return errSuperseded()
}

// liveDispatch returns the dispatch a request renews (docs/protocol/dispatch.md §8): the named one,
// or the execution's newest when the request names none; nil when it is not
// in flight at the request's attempt.
func (o *op) liveDispatch(d *store.Dispatch, h DispatchHeaders) (*store.Dispatch, error) {
	if d == nil {
		if o.e.DispatchID == "" {
			return nil, nil
		}
		var err error
		if d, err = o.tx.Dispatch(o.ctx, o.e.DispatchID); err != nil {
			return nil, notFoundOr(err, "dispatch")
		}
	}
	if d.ID != o.e.DispatchID || d.Status != wire.DispatchInFlight || (h.Attempt > 0 && h.Attempt != d.Attempt) {
		return nil, nil
	}
	return d, nil
}

// renew extends the lease of the requesting attempt (docs/protocol/dispatch.md §8). A renewal that
// would move the expiry by less than a second is skipped to save a write.
func (o *op) renew(d *store.Dispatch, h DispatchHeaders) error {
	live, err := o.liveDispatch(d, h)
	if err != nil || live == nil {
		return err
	}
	expires := o.now.Add(time.Duration(live.LeaseTimeout) * time.Second)
	if live.LeaseExpiresAt.After(expires.Add(-time.Second)) {
		return nil
	}
	live.LeaseExpiresAt = expires
	live.UpdatedAt = o.now
	return o.tx.UpdateDispatch(o.ctx, live)
}

// progress renews the lease and records that the current attempt recorded a
// step outcome, which resets the attempt budget (docs/protocol/dispatch.md §7).
func (o *op) progress(d *store.Dispatch, h DispatchHeaders) error {
	if d == nil && o.e.DispatchID != "" {
		var err error
		if d, err = o.tx.Dispatch(o.ctx, o.e.DispatchID); err != nil {
			return notFoundOr(err, "dispatch")
		}
	}
	if d == nil || d.ID != o.e.DispatchID || (h.Attempt > 0 && h.Attempt != d.Attempt) {
		return nil
	}
	// The progress counts whatever the dispatch's status (a failed delivery
	// whose agent ran anyway); only the renewal needs it in flight (docs/protocol/dispatch.md §8).
	changed := d.ProgressAttempt != d.Attempt
	d.ProgressAttempt = d.Attempt
	expires := o.now.Add(time.Duration(d.LeaseTimeout) * time.Second)
	if d.Status == wire.DispatchInFlight && !d.LeaseExpiresAt.After(expires.Add(-time.Second)) {
		d.LeaseExpiresAt = expires
		changed = true
	}
	if !changed {
		return nil
	}
	d.UpdatedAt = o.now
	return o.tx.UpdateDispatch(o.ctx, d)
}

// Delivery is a claimed attempt, ready to be sent.
type Delivery struct {
	DispatchID   string
	ExecutionID  string
	AgentID      string
	WebhookURL   string
	Secret       string
	Attempt      int64
	LeaseTimeout int64
	DueAt        time.Time
}

// ClaimDispatch claims a due dispatch for delivery (docs/protocol/dispatch.md §3). It returns nil when
// the dispatch is no longer due (claimed, retired or rescheduled meanwhile),
// and store.ErrLocked when another transaction holds the execution, which
// may be another process claiming it: the caller tries again shortly rather
// than waiting in line.
func (k *Kernel) ClaimDispatch(ctx context.Context, ref store.DispatchRef) (*Delivery, error) {
	var del *Delivery
	err := k.transact(ctx, ref.ExecutionID, k.store.TryUpdate, func(o *op) error {
		del = nil
		d, err := o.tx.Dispatch(o.ctx, ref.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read dispatch: %w", err)
		}
		if (d.Status != wire.DispatchPending && d.Status != wire.DispatchFailed) || d.NextAttemptAt.After(o.now) {
			return nil
		}
		if err := o.load(d.ExecutionID, Caller{}); err != nil {
			return err
		}
		if d.ID != o.e.DispatchID || wire.ExecTerminal(o.e.Status) {
			return nil
		}
		agent, err := o.tx.Agent(o.ctx, o.e.AgentID)
		if err != nil {
			return notFoundOr(err, "agent")
		}
		lease := int64(k.cfg.DispatchLeaseTimeout / time.Second)
		if agent.LeaseTimeoutSeconds > 0 {
			lease = agent.LeaseTimeoutSeconds
		}
		due := d.NextAttemptAt
		d.Attempt++
		d.Status = wire.DispatchInFlight
		d.ClaimedBy = k.cfg.ReplicaID
		d.LeaseTimeout = lease
		d.LeaseExpiresAt = o.now.Add(time.Duration(lease) * time.Second)
		d.UpdatedAt = o.now
		if err := o.tx.UpdateDispatch(o.ctx, d); err != nil {
			return fmt.Errorf("claim dispatch: %w", err)
		}
		if err := o.tx.DeleteDispatchCounters(o.ctx, d.ExecutionID, d.ID); err != nil {
			return fmt.Errorf("reset counters: %w", err)
		}
		del = &Delivery{DispatchID: d.ID, ExecutionID: d.ExecutionID, AgentID: agent.ID, WebhookURL: agent.WebhookURL,
			Secret: agent.Secret, Attempt: d.Attempt, LeaseTimeout: lease, DueAt: due}
		return nil
	})
	return del, err
}

// DeliveryOutcome is what the webhook call produced.
type DeliveryOutcome struct {
	Acked      bool
	HTTPStatus int    // 0 when no response arrived
	Error      string // short description of a failure
	RetryAfter time.Duration
}

// RecordDelivery records the outcome of an attempt (docs/protocol/dispatch.md §5). An outcome for an
// attempt that is no longer current is discarded.
func (k *Kernel) RecordDelivery(ctx context.Context, del *Delivery, out DeliveryOutcome) error {
	return k.update(ctx, del.ExecutionID, func(o *op) error {
		d, err := o.tx.Dispatch(o.ctx, del.DispatchID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read dispatch: %w", err)
		}
		if d.Status != wire.DispatchInFlight || d.Attempt != del.Attempt {
			return nil
		}
		if err := o.load(d.ExecutionID, Caller{}); err != nil {
			return err
		}
		if d.ID != o.e.DispatchID || wire.ExecTerminal(o.e.Status) {
			return nil
		}
		d.UpdatedAt = o.now
		if out.Acked {
			o.emit(wire.EventDispatchAcked, dispatchPayload(d, "acked", d.Attempt))
			d.LeaseExpiresAt = o.now.Add(time.Duration(d.LeaseTimeout) * time.Second)
			m := k.metrics
			o.tx.AfterCommit(func() { m.DispatchOutcomes.WithLabelValues("success").Inc() })
			return o.tx.UpdateDispatch(o.ctx, d)
		}
		p := dispatchPayload(d, wire.DispatchFailed, d.Attempt)
		if out.HTTPStatus != 0 {
			p.Int("http_status", int64(out.HTTPStatus))
		}
		if out.Error != "" {
			p.String("error", TruncateUTF8(out.Error, 256))
		}
		o.emit(wire.EventDispatchFailed, p)
		m := k.metrics
		if d.Attempt-d.ProgressAttempt >= d.MaxAttempts {
			o.tx.AfterCommit(func() { m.DispatchOutcomes.WithLabelValues("exhausted").Inc() })
			return o.exhaust(d)
		}
		o.tx.AfterCommit(func() { m.DispatchOutcomes.WithLabelValues("rejected").Inc() })
		delay := k.retryDelay(d.Attempt - d.ProgressAttempt)
		if out.RetryAfter > 0 && (out.HTTPStatus == 429 || out.HTTPStatus == 503) {
			delay = max(delay, min(out.RetryAfter, 60*time.Second))
		}
		d.Status = wire.DispatchFailed
		d.NextAttemptAt = o.now.Add(delay)
		d.LeaseExpiresAt = time.Time{}
		o.tx.AfterCommit(k.notifyDispatch)
		return o.tx.UpdateDispatch(o.ctx, d)
	})
}

// retryDelay is delay(n) of docs/protocol/dispatch.md §6: exponential from the base, capped, plus up
// to a quarter of jitter.
func (k *Kernel) retryDelay(n int64) time.Duration {
	d := k.cfg.BackoffBase
	for i := int64(1); i < n && d < k.cfg.BackoffMax; i++ {
		d *= 2
	}
	d = min(d, k.cfg.BackoffMax)
	if q := int64(d / 4); q > 0 {
		d += time.Duration(rand.Int64N(q))
	}
	return d
}

// exhaust fails the execution whose dispatch spent its budget (docs/protocol/dispatch.md §7).
func (o *op) exhaust(d *store.Dispatch) error {
	d.Status = wire.DispatchRetired
	if err := o.tx.UpdateDispatch(o.ctx, d); err != nil {
		return fmt.Errorf("retire dispatch: %w", err)
	}
	return o.terminate(wire.ExecFailed, wire.ReasonDispatchExhausted, wire.CauseExecutionFailed)
}

// ReclaimLease reclaims an in-flight dispatch whose lease has expired (docs/protocol/dispatch.md §10):
// it is redelivered at once under the same id, or the execution fails when
// the attempt budget is spent.
func (k *Kernel) ReclaimLease(ctx context.Context, ref store.DispatchRef) error {
	return k.update(ctx, ref.ExecutionID, func(o *op) error {
		d, err := o.tx.Dispatch(o.ctx, ref.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read dispatch: %w", err)
		}
		if d.Status != wire.DispatchInFlight || d.LeaseExpiresAt.After(o.now) {
			return nil
		}
		if err := o.load(d.ExecutionID, Caller{}); err != nil {
			return err
		}
		d.UpdatedAt = o.now
		m := k.metrics
		o.tx.AfterCommit(func() { m.DispatchesReclaimed.Inc() })
		if d.Attempt-d.ProgressAttempt >= d.MaxAttempts {
			o.emit(wire.EventDispatchLeaseExpired, dispatchPayload(d, "exhausted", d.Attempt))
			o.tx.AfterCommit(func() { m.DispatchOutcomes.WithLabelValues("exhausted").Inc() })
			return o.exhaust(d)
		}
		o.emit(wire.EventDispatchLeaseExpired, dispatchPayload(d, wire.DispatchPending, d.Attempt))
		d.Status = wire.DispatchPending
		d.NextAttemptAt = o.now
		d.LeaseExpiresAt = time.Time{}
		o.tx.AfterCommit(k.notifyDispatch)
		return o.tx.UpdateDispatch(o.ctx, d)
	})
}

// DueDispatches lists the dispatches due now, oldest first, leaving out
// those of skipAgents: the dispatcher's view of claimable work (docs/protocol/dispatch.md §3).
func (k *Kernel) DueDispatches(ctx context.Context, limit int, skipAgents []string) ([]store.DispatchRef, error) {
	return k.store.Read().DueDispatches(ctx, k.clock.Now(), limit, skipAgents)
}

// NextDue is when the next pending or failed dispatch of an agent not in
// skipAgents falls due; zero when none is scheduled.
func (k *Kernel) NextDue(ctx context.Context, skipAgents []string) (time.Time, error) {
	return k.store.Read().NextDue(ctx, skipAgents)
}

// QueueDepth counts due, undelivered dispatches (the queue_depth gauge).
func (k *Kernel) QueueDepth(ctx context.Context) (int64, error) {
	return k.store.Read().QueueDepth(ctx, k.clock.Now())
}
