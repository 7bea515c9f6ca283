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

// RunWorkers runs the kernel's periodic duties until ctx ends: deadlines,
// approval expiry, the idempotency-key sweep and (when on) retention.
func (k *Kernel) RunWorkers(ctx context.Context) {
	loops := []func(context.Context){k.deadlineLoop, k.sweepLoop, k.approvalLoop}
	done := make(chan struct{})
	for _, loop := range loops {
		go func() { loop(ctx); done <- struct{}{} }()
	}
	for range loops {
		<-done
	}
}

func (k *Kernel) deadlineLoop(ctx context.Context) {
	for ctx.Err() == nil {
		changed := k.clock.Changed()
		ids, err := k.store.Read().DeadlinesDue(ctx, k.clock.Now(), 100)
		if err != nil {
			k.workerError("deadline", err)
		}
		for _, id := range ids {
			if err := k.ExpireDeadline(ctx, id); err != nil {
				k.workerError("deadline", err)
			}
		}
		if len(ids) == 100 {
			continue
		}
		next, err := k.store.Read().NextDeadline(ctx)
		if err != nil {
			k.workerError("deadline", err)
		}
		clock.Wait(k.clock, next, pollInterval, changed, ctx.Done())
	}
}

// ExpireDeadline cancels an execution whose deadline has passed (§7.7).
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
		if !k.clock.Now().Before(next) {
			k.Sweep(ctx)
			next = k.clock.Now().Add(k.cfg.CleanupInterval)
		}
		clock.Wait(k.clock, next, pollInterval, nil, ctx.Done())
	}
}

// Sweep deletes expired idempotency keys and, when retention is on,
// terminal executions older than it (§7.9).
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
			if err := k.retire(ctx, id, cutoff); err != nil {
				k.workerError("retention", err)
				continue
			}
			deleted++
		}
		if len(ids) < 1000 || deleted == 0 {
			return
		}
	}
}

// retire deletes one execution, re-checking under its lock that it is still
// terminal and still old enough.
func (k *Kernel) retire(ctx context.Context, id string, cutoff time.Time) error {
	return k.store.Update(ctx, id, func(ctx context.Context, tx store.Tx) error {
		e, err := tx.ExecutionHead(ctx, id)
		if err != nil {
			return nil
		}
		if !wire.ExecTerminal(e.Status) || !e.UpdatedAt.Before(cutoff) {
			return nil
		}
		return tx.DeleteExecution(ctx, id)
	})
}

func (k *Kernel) workerError(worker string, err error) {
	k.log.Error("background worker failed", slog.String("worker", worker), slog.Any("error", err))
	k.metrics.WorkerErrors.WithLabelValues(worker).Inc()
}
