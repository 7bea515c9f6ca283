package clock

import (
	"testing"
	"time"
)

// blockedFor is how long a test watches a Wait that must not return yet.
// It bounds a negative check only; every positive check waits on an event.
const blockedFor = 30 * time.Millisecond

var start = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

func TestRealClock(t *testing.T) {
	var c Clock = Real{}
	now := c.Now()
	if now.Location() != time.UTC {
		t.Fatalf("Real.Now() is in %v, want UTC", now.Location())
	}
	if d := time.Since(now); d < 0 || d > time.Minute {
		t.Fatalf("Real.Now() is %v away from the wall clock", d)
	}
	if c.Changed() != nil {
		t.Fatal("Real.Changed() must be nil: the real clock never jumps")
	}
}

func TestManualNowAndAdvance(t *testing.T) {
	zone := time.FixedZone("UTC+3", 3*3600)
	m := NewManual(start.In(zone))
	if got := m.Now(); !got.Equal(start) || got.Location() != time.UTC {
		t.Fatalf("Now() = %v, want %v in UTC", got, start)
	}
	if got := m.Now(); !got.Equal(m.Now()) {
		t.Fatal("a manual clock moved by itself")
	}
	ch := m.Changed()
	if ch == nil {
		t.Fatal("Manual.Changed() is nil")
	}
	if m.Changed() != ch {
		t.Fatal("Changed() returned a new channel without a jump")
	}
	select {
	case <-ch:
		t.Fatal("Changed() is closed before any Advance")
	default:
	}

	got := m.Advance(90 * time.Second)
	if want := start.Add(90 * time.Second); !got.Equal(want) || !m.Now().Equal(want) {
		t.Fatalf("Advance returned %v and Now() is %v, want %v", got, m.Now(), want)
	}
	select {
	case <-ch:
	default:
		t.Fatal("Advance did not close the Changed channel")
	}
	next := m.Changed()
	if next == ch {
		t.Fatal("Advance did not replace the Changed channel")
	}
	select {
	case <-next:
		t.Fatal("the replacement Changed channel is already closed")
	default:
	}
	m.Advance(time.Millisecond)
	select {
	case <-next:
	default:
		t.Fatal("the second Advance did not close the replacement channel")
	}
	if want := start.Add(90*time.Second + time.Millisecond); !m.Now().Equal(want) {
		t.Fatalf("Now() = %v, want %v", m.Now(), want)
	}
}

// waitAsync runs Wait on its own goroutine and returns a channel closed when
// it returns.
func waitAsync(c Clock, t time.Time, poll time.Duration, wake, stop <-chan struct{}) <-chan struct{} {
	done := make(chan struct{})
	go func() {
		Wait(c, t, poll, wake, stop)
		close(done)
	}()
	return done
}

func mustBlock(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
		t.Fatalf("Wait returned before %s", what)
	case <-time.After(blockedFor):
	}
}

func mustReturn(t *testing.T, done <-chan struct{}, what string) {
	t.Helper()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatalf("Wait did not return after %s", what)
	}
}

func TestWaitReturnsAtTime(t *testing.T) {
	c := Real{}
	begin := time.Now()
	Wait(c, c.Now().Add(40*time.Millisecond), time.Minute, nil, nil)
	if d := time.Since(begin); d < 35*time.Millisecond || d > 5*time.Second {
		t.Fatalf("Wait until now+40ms took %v", d)
	}
}

func TestWaitPastTimeReturnsAtOnce(t *testing.T) {
	m := NewManual(start)
	done := waitAsync(m, start.Add(-time.Second), time.Hour, nil, nil)
	mustReturn(t, done, "a time already passed")
	done = waitAsync(m, start, time.Hour, nil, nil)
	mustReturn(t, done, "a time equal to now")
}

func TestWaitReturnsOnWake(t *testing.T) {
	m := NewManual(start)
	wake := make(chan struct{}, 1)
	done := waitAsync(m, start.Add(time.Hour), time.Hour, wake, nil)
	mustBlock(t, done, "the wake-up")
	wake <- struct{}{}
	mustReturn(t, done, "a wake-up")
}

func TestWaitReturnsOnStop(t *testing.T) {
	m := NewManual(start)
	stop := make(chan struct{})
	done := waitAsync(m, time.Time{}, time.Hour, nil, stop)
	mustBlock(t, done, "stop")
	close(stop)
	mustReturn(t, done, "stop was closed")
}

func TestWaitReturnsOnClockJump(t *testing.T) {
	m := NewManual(start)
	// The target is an hour of manual time away; only the jump can end the
	// wait within the test's patience.
	done := waitAsync(m, start.Add(time.Hour), time.Hour, nil, nil)
	mustBlock(t, done, "the clock moved")
	m.Advance(time.Hour)
	mustReturn(t, done, "Advance")
}

func TestWaitReturnsOnSmallJump(t *testing.T) {
	// Any jump wakes the waiter, even one that does not reach the target:
	// callers re-check their queues after every return.
	m := NewManual(start)
	done := waitAsync(m, time.Time{}, time.Hour, nil, nil)
	mustBlock(t, done, "the clock moved")
	m.Advance(time.Nanosecond)
	mustReturn(t, done, "a one-nanosecond Advance")
}

func TestWaitBoundedByPoll(t *testing.T) {
	for _, tc := range []struct {
		name   string
		target time.Time
	}{
		{"no target", time.Time{}},
		{"target beyond poll", start.Add(24 * time.Hour)},
	} {
		t.Run(tc.name, func(t *testing.T) {
			m := NewManual(start)
			begin := time.Now()
			Wait(m, tc.target, 40*time.Millisecond, nil, nil)
			if d := time.Since(begin); d < 35*time.Millisecond || d > 5*time.Second {
				t.Fatalf("Wait with a 40ms poll took %v", d)
			}
		})
	}
}

func TestWaitWithRealClockIgnoresNilChannels(t *testing.T) {
	// Real.Changed() is nil; selecting on it must not fire.
	begin := time.Now()
	Wait(Real{}, time.Time{}, 20*time.Millisecond, nil, nil)
	if d := time.Since(begin); d < 15*time.Millisecond {
		t.Fatalf("Wait returned after %v, before its poll interval", d)
	}
}
