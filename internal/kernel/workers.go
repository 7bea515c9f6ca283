package kernel

import (
	"context"
	"log/slog"
	"time"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// pollInterval bounds how late a background worker can be after a missed
// wake-up; the spec asks for due work to be done within 1–2 s.
const pollInterval = time.Second

// RunWorkers runs the kernel's singleton duties until ctx ends: lease
// reclaim, deadlines, approval expiry, the idempotency-key sweep and (when
// on) retention. Each runs only while this process leads (store.Leading):
// with several processes on one store, one does them.
func (k *Kernel) RunWorkers(ctx context.Context) {
	loops := []func(context.Context){
		func(ctx context.Context) {
			runDuty(k, ctx, "lease_reclaim", k.store.Read().ExpiredLeases, k.ReclaimLease, k.store.Read().NextLeaseExpiry)
		},
		func(ctx context.Context) {
			runDuty(k, ctx, "deadline", k.store.Read().DeadlinesDue, k.ExpireDeadline, k.store.Read().NextDeadline)
		},
		func(ctx context.Context) {
			runDuty(k, ctx, "approval_expiry", k.store.Read().ExpiredApprovals, k.ExpireApproval, k.store.Read().NextApprovalTimeout)
		},
		k.sweepLoop,
	}
	done := make(chan struct{})
	for _, loop := range loops {
		go func() { loop(ctx); done <- struct{}{} }()
	}
	for range loops {
		<-done
	}
}

// dutyBatch is how many items a duty takes per query.
const dutyBatch = 100

// runDuty is the loop of a duty that finds its work with one indexed query:
// it handles every item that is due, each in a transaction of its own so that
// one failure never holds back the others (each is retried on the next
// round), then sleeps until the next item falls due, a clock jump, or the
// poll interval, whichever comes first.
func runDuty[T any](k *Kernel, ctx context.Context, name string,
	due func(ctx context.Context, now time.Time, limit int) ([]T, error),
	handle func(ctx context.Context, item T) error,
	next func(ctx context.Context) (time.Time, error)) {
	for ctx.Err() == nil {
		changed := k.clock.Changed()
		if !k.store.Leading() {
			clock.Wait(k.clock, time.Time{}, pollInterval, changed, ctx.Done())
			continue
		}
		items, err := due(ctx, k.clock.Now(), dutyBatch)
		if err != nil && ctx.Err() == nil {
			k.workerError(name, err)
		}
		for _, item := range items {
			if err := handle(ctx, item); err != nil && ctx.Err() == nil {
				k.workerError(name, err)
			}
		}
		if len(items) == dutyBatch {
			continue
		}
		at, err := next(ctx)
		if err != nil && ctx.Err() == nil {
			k.workerError(name, err)
		}
		clock.Wait(k.clock, at, pollInterval, changed, ctx.Done())
	}
}

// ExpireDeadline cancels an execution whose deadline has passed (docs/protocol/executions.md §8).
func (k *Kernel) ExpireDeadline(ctx context.Context, id string) error {
	return k.update(ctx, id, func(o *op) error {
		if err := o.load(id, Caller{}); err != nil {
			return err
		}
		if wire.ExecTerminal(o.e.Status) || o.e.DeadlineAt.IsZero() || o.e.DeadlineAt.After(o.now) {
			return nil
		}
		return o.terminate(wire.ExecCancelled, wire.ReasonDeadlineExceeded, wire.CauseDeadlineExceeded)
	})
}

func (k *Kernel) sweepLoop(ctx context.Context) {
	next := k.clock.Now()
	for ctx.Err() == nil {
		leading := k.store.Leading()
		if now := k.clock.Now(); leading && !now.Before(next) {
			k.Sweep(ctx)
			// The next sweep is due an interval after this one began, not
			// ended: time that passed during a long sweep (or a clock moved
			// meanwhile) must not push back the sweep that follows.
			next = now.Add(k.cfg.CleanupInterval)
		}
		// A replica that does not lead looks again at the poll interval:
		// waiting for a sweep time already past would return at once.
		wait := next
		if !leading {
			wait = time.Time{}
		}
		clock.Wait(k.clock, wait, pollInterval, nil, ctx.Done())
	}
}

// Sweep deletes expired idempotency keys and, when retention is on,
// terminal executions older than it (docs/protocol/executions.md §10).
func (k *Kernel) Sweep(ctx context.Context) {
	now := k.clock.Now()
	err := k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.DeleteIdempotencyBefore(ctx, now.Add(-IdempotencyLifetime))
	})
	if err != nil {
		k.workerError("idempotency_sweep", err)
	}
	if k.cfg.Retention <= 0 {
		return
	}
	for ctx.Err() == nil {
		cutoff := k.clock.Now().Add(-k.cfg.Retention)
		ids, err := k.store.Read().RetentionCandidates(ctx, cutoff, 1000)
		if err != nil {
			k.workerError("retention", err)
			return
		}
		deleted := 0
		for _, id := range ids {
			gone, err := k.retire(ctx, id, cutoff)
			if err != nil {
				k.workerError("retention", err)
				continue
			}
			if gone {
				deleted++
			}
		}
		// Until a pass deletes nothing: deleting an in-place fork may free
		// its source, so a chain of them retires in one run.
		if deleted == 0 {
			return
		}
	}
}

// retire deletes one execution, re-checking under its lock that it is still
// terminal and still old enough, and reports whether it did.
func (k *Kernel) retire(ctx context.Context, id string, cutoff time.Time) (bool, error) {
	gone := false
	err := k.store.Update(ctx, id, func(ctx context.Context, tx store.Tx) error {
		gone = false
		e, err := tx.ExecutionHead(ctx, id)
		if err != nil {
			return nil
		}
		if !wire.ExecTerminal(e.Status) || !e.UpdatedAt.Before(cutoff) {
			return nil
		}
		// A fork that reads this history in place keeps it; forks take the
		// source's lock, so none can start reading it after this check.
		if kept, err := tx.HasForksInPlace(ctx, id); err != nil || kept {
			return err
		}
		gone = true
		return tx.DeleteExecution(ctx, id)
	})
	return gone && err == nil, err
}

func (k *Kernel) workerError(worker string, err error) {
	k.log.Error("background worker failed", slog.String("worker", worker), slog.Any("error", err))
	k.metrics.WorkerErrors.WithLabelValues(worker).Inc()
}
