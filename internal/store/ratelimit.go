package store

import (
	"errors"
	"math"
	"time"
)

// Rate-limit budgets (docs/protocol docs/protocol/governance.md §3) are token buckets: capacity
// maxCalls, refilled continuously at maxCalls per window. In `rebuno dev`
// the kernel keeps them in memory; in server mode they live in the shared
// store so that every replica draws on one budget, each check one atomic
// statement. Both share what follows.

// LimiterBudget is how long a check of a shared bucket may take before the
// kernel treats the limiter as failed (the rule's on_limiter_error applies).
const LimiterBudget = 250 * time.Millisecond

// ErrLimiterTimeout is a check that exceeded LimiterBudget.
var ErrLimiterTimeout = errors.New("rate limiter exceeded its time budget")

// TokenWait is how long a bucket holding tokens (< 1) takes to refill to one
// token, rounded up to the millisecond: the retry_after_ms of a refusal.
func TokenWait(tokens float64, maxCalls int64, window time.Duration) time.Duration {
	rate := float64(maxCalls) / window.Seconds()
	// Round to the clock's nanoseconds before rounding up to milliseconds, so
	// that float noise (20000.000000000004) does not add a millisecond.
	wait := time.Duration(math.Round((1 - tokens) / rate * 1e9))
	return (wait + time.Millisecond - 1).Truncate(time.Millisecond)
}
