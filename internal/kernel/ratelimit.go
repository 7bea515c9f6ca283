package kernel

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/store"
)

// Limiter answers rate-limit checks (docs/protocol/governance.md §3). Check takes one token from the
// bucket named key when one is available; otherwise it takes nothing and
// reports how long until one is.
type Limiter interface {
	Check(key string, maxCalls int64, window time.Duration, now time.Time) (ok bool, retryAfter time.Duration, err error)
}

// ErrLimiterTimeout is the limiter exceeding its 250 ms budget. The store
// defines it, so that a limiter kept in the store returns the same error.
var ErrLimiterTimeout = store.ErrLimiterTimeout

// bucketKey names the bucket of a rule for a step (docs/protocol/governance.md §3): per execution, per
// agent, or global — keyed by the rule's parameters so that one agent's
// bundle cannot change the budget another agent's rule sees.
func bucketKey(ruleID string, rl *policy.RateLimit, executionID, agentID string) string {
	switch rl.PerWhat {
	case "agent":
		return ruleID + ":agent:" + agentID
	case "global":
		return ruleID + ":global:" + strconv.FormatInt(rl.MaxCalls, 10) + ":" + strconv.FormatInt(rl.Window.Milliseconds(), 10)
	}
	return ruleID + ":exec:" + executionID
}

// MemoryLimiter keeps token buckets in process memory: the limiter of
// `rebuno dev`, where buckets refill on restart.
type MemoryLimiter struct {
	mu      sync.Mutex
	buckets map[string]*bucket
	checks  int
}

type bucket struct {
	tokens   float64
	last     time.Time
	capacity float64
	window   time.Duration
}

// NewMemoryLimiter returns an empty in-memory limiter.
func NewMemoryLimiter() *MemoryLimiter { return &MemoryLimiter{buckets: map[string]*bucket{}} }

// Check implements Limiter with a continuous-refill token bucket: capacity
// maxCalls, refilled at maxCalls per window, starting full.
func (l *MemoryLimiter) Check(key string, maxCalls int64, window time.Duration, now time.Time) (bool, time.Duration, error) {
	if maxCalls < 1 || window <= 0 {
		return false, 0, fmt.Errorf("invalid rate limit %d per %s", maxCalls, window)
	}
	l.mu.Lock()
	defer l.mu.Unlock()
	l.checks++
	if l.checks%1024 == 0 {
		l.sweep(now)
	}
	capacity := float64(maxCalls)
	rate := capacity / window.Seconds()
	b := l.buckets[key]
	if b == nil {
		b = &bucket{tokens: capacity, last: now}
		l.buckets[key] = b
	}
	if elapsed := now.Sub(b.last).Seconds(); elapsed > 0 {
		b.tokens += elapsed * rate
	}
	// Changed parameters apply at once; the tokens are clamped to the new
	// capacity.
	b.tokens = math.Min(b.tokens, capacity)
	b.capacity, b.window = capacity, window
	if now.After(b.last) {
		b.last = now
	}
	if b.tokens >= 1 {
		b.tokens--
		return true, 0, nil
	}
	return false, store.TokenWait(b.tokens, maxCalls, window), nil
}

// sweep drops buckets untouched for longer than their window: they would be
// full again, so dropping them changes no answer and keeps memory bounded.
func (l *MemoryLimiter) sweep(now time.Time) {
	for key, b := range l.buckets {
		if now.Sub(b.last) > b.window {
			delete(l.buckets, key)
		}
	}
}

// Len reports how many buckets are held (for tests of the memory bound).
func (l *MemoryLimiter) Len() int {
	l.mu.Lock()
	defer l.mu.Unlock()
	return len(l.buckets)
}

// FaultyLimiter fails every check, for the test-only setting
// REBUNO_TEST_LIMITER_FAULT (docs/protocol/configuration.md §4). A "timeout" fault reports the budget as
// exceeded at once rather than stalling the writer for 250 ms: the kernel's
// answer is the same either way.
type FaultyLimiter struct{ Timeout bool }

// Check implements Limiter.
func (f FaultyLimiter) Check(string, int64, time.Duration, time.Time) (bool, time.Duration, error) {
	if f.Timeout {
		return false, 0, ErrLimiterTimeout
	}
	return false, 0, errors.New("rate limiter fault injected for tests")
}
