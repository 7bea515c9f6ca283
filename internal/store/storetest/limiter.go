package storetest

import (
	"testing"
	"time"
)

// The token bucket of docs/protocol docs/protocol/governance.md §3, as every limiter must keep it: the
// kernel's in-memory one and those that keep buckets in a store.

type limiterScenario struct {
	name string
	fn   func(t *testing.T, l Limiter)
}

var limiterScenarios = []limiterScenario{
	{"NewBucketStartsFull", testBucketStartsFull},
	{"ContinuousRefill", testBucketRefill},
	{"CapacityClamp", testBucketClamp},
	{"KeysAreSeparate", testBucketKeys},
	{"ClockGoingBack", testBucketClockBack},
	{"InvalidParameters", testBucketInvalid},
}

// RunLimiter runs every limiter scenario as a subtest, each on a fresh
// limiter from open.
func RunLimiter(t *testing.T, open func(t *testing.T) Limiter) {
	t.Helper()
	for _, sc := range limiterScenarios {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, open(t)) })
	}
}

// check is one check that must succeed, with its outcome as wanted.
func check(t *testing.T, l Limiter, key string, maxCalls int64, window time.Duration, now time.Time, wantOK bool, wantRetry time.Duration) {
	t.Helper()
	ok, retry, err := l.Check(key, maxCalls, window, now)
	if err != nil {
		t.Fatalf("Check(%s at +%s): %v", key, now.Sub(base), err)
	}
	if ok != wantOK || retry != wantRetry {
		t.Fatalf("Check(%s at +%s) = %v, retry after %s; want %v, %s", key, now.Sub(base), ok, retry, wantOK, wantRetry)
	}
}

func testBucketStartsFull(t *testing.T, l Limiter) {
	for range 3 {
		check(t, l, "k", 3, time.Minute, base, true, 0)
	}
	// Empty: a token is 20 s away (3 per minute).
	check(t, l, "k", 3, time.Minute, base, false, 20*time.Second)
	check(t, l, "k", 3, time.Minute, base.Add(5*time.Second), false, 15*time.Second)
}

func testBucketRefill(t *testing.T, l Limiter) {
	check(t, l, "k", 2, time.Second, base, true, 0)
	check(t, l, "k", 2, time.Second, base, true, 0)
	// Half a token back after 250 ms; a refusal takes nothing.
	check(t, l, "k", 2, time.Second, base.Add(250*time.Millisecond), false, 250*time.Millisecond)
	check(t, l, "k", 2, time.Second, base.Add(500*time.Millisecond), true, 0)
	// A retry delay is rounded up to the millisecond.
	check(t, l, "k", 2, time.Second, base.Add(500*time.Millisecond+300*time.Microsecond), false, 500*time.Millisecond)
	// Never more than the capacity, however long the wait.
	later := base.Add(time.Hour)
	check(t, l, "k", 2, time.Second, later, true, 0)
	check(t, l, "k", 2, time.Second, later, true, 0)
	check(t, l, "k", 2, time.Second, later, false, 500*time.Millisecond)
}

// New parameters apply at once, the tokens clamped to the new capacity.
func testBucketClamp(t *testing.T, l Limiter) {
	check(t, l, "k", 10, time.Minute, base, true, 0)
	// 9 tokens left; the rule now allows 2 per minute: 2 are left, then 1.
	check(t, l, "k", 2, time.Minute, base, true, 0)
	check(t, l, "k", 2, time.Minute, base, true, 0)
	check(t, l, "k", 2, time.Minute, base, false, 30*time.Second)
}

func testBucketKeys(t *testing.T, l Limiter) {
	check(t, l, "a", 1, time.Minute, base, true, 0)
	check(t, l, "a", 1, time.Minute, base, false, time.Minute)
	check(t, l, "b", 1, time.Minute, base, true, 0)
}

// A check stamped earlier than the last one (replicas' clocks differ a
// little) refills nothing and takes nothing away.
func testBucketClockBack(t *testing.T, l Limiter) {
	check(t, l, "k", 1, time.Minute, base.Add(time.Minute), true, 0)
	check(t, l, "k", 1, time.Minute, base, false, time.Minute)
	check(t, l, "k", 1, time.Minute, base.Add(2*time.Minute), true, 0)
}

func testBucketInvalid(t *testing.T, l Limiter) {
	for _, c := range []struct {
		max    int64
		window time.Duration
	}{{0, time.Minute}, {-1, time.Minute}, {1, 0}, {1, -time.Second}} {
		if _, _, err := l.Check("k", c.max, c.window, base); err == nil {
			t.Errorf("Check with %d per %s: no error", c.max, c.window)
		}
	}
}
