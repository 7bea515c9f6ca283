// Package clock gives the kernel one source of time. Release builds use the
// real clock; test builds (tag rebuno_test) can swap in a manual clock that
// moves only when a test advances it, so timeouts are tested without sleeping.
package clock

import (
	"sync"
	"time"
)

// Clock tells the time and announces jumps.
type Clock interface {
	Now() time.Time
	// Changed returns a channel that is closed the next time the clock jumps.
	// The real clock never jumps and returns nil (a nil channel never fires).
	Changed() <-chan struct{}
}

// Real is the wall clock, in UTC.
type Real struct{}

func (Real) Now() time.Time           { return time.Now().UTC() }
func (Real) Changed() <-chan struct{} { return nil }

// Manual starts at a given time and moves only through Advance.
type Manual struct {
	mu      sync.Mutex
	now     time.Time
	changed chan struct{}
}

// NewManual returns a manual clock reading start.
func NewManual(start time.Time) *Manual {
	return &Manual{now: start.UTC(), changed: make(chan struct{})}
}

func (m *Manual) Now() time.Time {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.now
}

func (m *Manual) Changed() <-chan struct{} {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.changed
}

// Advance moves the clock forward by d and wakes everyone waiting on Changed.
func (m *Manual) Advance(d time.Duration) time.Time {
	m.mu.Lock()
	m.now = m.now.Add(d)
	now := m.now
	close(m.changed)
	m.changed = make(chan struct{})
	m.mu.Unlock()
	return now
}

// Wait blocks until t is reached on c, wake fires, or stop is closed. It
// returns at most after poll so that workers re-check their queues even when
// a wake-up was missed.
func Wait(c Clock, t time.Time, poll time.Duration, wake <-chan struct{}, stop <-chan struct{}) {
	d := poll
	if !t.IsZero() {
		if until := t.Sub(c.Now()); until < d {
			d = until
		}
	}
	if d <= 0 {
		return
	}
	timer := time.NewTimer(d)
	defer timer.Stop()
	select {
	case <-timer.C:
	case <-wake:
	case <-c.Changed():
	case <-stop:
	}
}
