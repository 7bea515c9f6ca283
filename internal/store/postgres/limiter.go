package postgres

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5/pgxpool"

	"github.com/rebuno/rebuno/internal/store"
)

// Limiter keeps the rate-limit buckets of docs/protocol docs/protocol/governance.md §3 in the shared
// rate_buckets table, so that every replica draws on one budget. Each check
// is one statement that refills the bucket, takes a token when there is one
// and says whether it did, atomically under the row's lock; a check that
// takes longer than store.LimiterBudget fails with store.ErrLimiterTimeout.
// It runs on the store's side pool: a check happens while its operation's
// transaction holds a pooled connection, and must never wait for another.
type Limiter struct {
	pool   *pgxpool.Pool
	log    *slog.Logger
	checks atomic.Int64
	// pruning is set while a prune runs; pruned is the time (Unix µs) of
	// the check that last started one.
	pruning atomic.Bool
	pruned  atomic.Int64
}

// pruneEvery is how many checks, or how much time by the checks' clock,
// pass between two prunes of untouched buckets.
const (
	pruneEvery       = 1024
	pruneEveryPeriod = time.Minute
)

// takeToken refills the bucket by the time since its last check (never
// backwards: replicas' clocks may disagree a little), clamps it to the
// capacity (the rule's parameters may have changed), and takes a token if
// one is there. A new bucket starts full, less the token taken.
const takeToken = `INSERT INTO rate_buckets AS b (bucket_key, tokens, admitted, touched_at, window_us)
 VALUES ($1, $2 - 1, true, $3, $4)
 ON CONFLICT (bucket_key) DO UPDATE SET (tokens, admitted, touched_at, window_us) = (
  SELECT CASE WHEN r.t >= 1 THEN r.t - 1 ELSE r.t END, r.t >= 1, GREATEST(b.touched_at, $3), $4
  FROM (SELECT LEAST($2, b.tokens + GREATEST(0, $3 - b.touched_at) / 1e6::float8 * ($2 / ($4 / 1e6::float8))) AS t) r)
 RETURNING admitted, tokens`

// Check implements the kernel's Limiter.
func (l *Limiter) Check(key string, maxCalls int64, window time.Duration, now time.Time) (bool, time.Duration, error) {
	if maxCalls < 1 || window <= 0 {
		return false, 0, fmt.Errorf("invalid rate limit %d per %s", maxCalls, window)
	}
	ctx, cancel := context.WithTimeout(context.Background(), store.LimiterBudget)
	defer cancel()
	var admitted bool
	var tokens float64
	err := l.pool.QueryRow(ctx, takeToken, key, float64(maxCalls), now.UnixMicro(), window.Microseconds()).Scan(&admitted, &tokens)
	if err != nil {
		if errors.Is(ctx.Err(), context.DeadlineExceeded) {
			return false, 0, fmt.Errorf("%w: %w", store.ErrLimiterTimeout, err)
		}
		return false, 0, classify(err)
	}
	l.maybePrune(now)
	if admitted {
		return true, 0, nil
	}
	return false, store.TokenWait(tokens, maxCalls, window), nil
}

// maybePrune starts a prune, off the request path, every pruneEvery checks
// or pruneEveryPeriod, whichever comes first.
func (l *Limiter) maybePrune(now time.Time) {
	n := l.checks.Add(1)
	last := l.pruned.Load()
	if n%pruneEvery != 0 && now.UnixMicro()-last < pruneEveryPeriod.Microseconds() {
		return
	}
	if !l.pruning.CompareAndSwap(false, true) {
		return
	}
	l.pruned.Store(now.UnixMicro())
	go func() {
		defer l.pruning.Store(false)
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		if _, err := l.Prune(ctx, now); err != nil && l.log != nil {
			l.log.Warn("could not prune rate-limit buckets", slog.Any("error", err))
		}
	}()
}

// Prune deletes the buckets untouched for longer than their window at now:
// such a bucket is full again, so deleting it changes no answer, and the
// table stays as small as the budgets in use. It returns how many went.
func (l *Limiter) Prune(ctx context.Context, now time.Time) (int64, error) {
	tag, err := l.pool.Exec(ctx, `DELETE FROM rate_buckets WHERE touched_at + window_us < $1`, now.UnixMicro())
	if err != nil {
		return 0, classify(err)
	}
	return tag.RowsAffected(), nil
}
