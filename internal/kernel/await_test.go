package kernel

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// withoutRecheck makes a waiting read depend on its wake-up alone for the
// test's duration.
func withoutRecheck(t *testing.T) {
	old := awaitRecheck
	awaitRecheck = time.Hour
	t.Cleanup(func() { awaitRecheck = old })
}

// awaitAsync runs AwaitExecution on its own goroutine.
func (fx *fixture) awaitAsync(ctx context.Context, c Caller, id string, wait time.Duration, stop <-chan struct{}) chan awaited {
	done := make(chan awaited, 1)
	go func() {
		e, err := fx.k.AwaitExecution(ctx, c, id, wait, stop)
		done <- awaited{e, err}
	}()
	return done
}

type awaited struct {
	e   *store.Execution
	err error
}

// waitersOf waits until n waiting reads are subscribed (n executions with one).
func (fx *fixture) waitersOf(n int) {
	fx.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		if _, ends, _ := fx.k.Subscriptions(); ends == n {
			return
		}
		if time.Now().After(deadline) {
			fx.t.Fatalf("no %d waiting reads subscribed within 10s", n)
		}
		time.Sleep(time.Millisecond)
	}
}

func (fx *fixture) result(done chan awaited) awaited {
	fx.t.Helper()
	select {
	case r := <-done:
		return r
	case <-time.After(30 * time.Second):
		fx.t.Fatal("the waiting read did not return within 30s")
		return awaited{}
	}
}

func TestAwaitWokenByTheEnd(t *testing.T) {
	withoutRecheck(t)
	fx := newFixture(t)
	e, del := fx.start("a1")
	done := fx.awaitAsync(fx.ctx, Caller{}, e.ID, MaxWait, nil)
	fx.waitersOf(1)
	if err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Output: []byte(`{"answer": 42}`)}); err != nil {
		t.Fatal(err)
	}
	r := fx.result(done)
	if r.err != nil || r.e.Status != wire.ExecCompleted || string(r.e.Output) != `{"answer": 42}` {
		t.Fatalf("await = %+v, %v; want the completed execution with its output", r.e, r.err)
	}
	if _, ends, _ := fx.k.Subscriptions(); ends != 0 {
		t.Fatalf("%d end subscriptions left after the wait", ends)
	}
}

// Every way an execution ends wakes a waiting read: cancel, fail, deadline.
func TestAwaitWokenByEveryEnd(t *testing.T) {
	withoutRecheck(t)
	fx := newFixture(t, withConfig(func(c *Config) { c.DeadlineTimeout = time.Minute }))
	for _, tc := range []struct {
		name, status, reason string
		end                  func(e *store.Execution, del *Delivery) error
	}{
		{"cancel", wire.ExecCancelled, wire.ReasonClientCancelled, func(e *store.Execution, _ *Delivery) error {
			return fx.k.CancelExecution(fx.ctx, e.ID)
		}},
		{"fail", wire.ExecFailed, "boom", func(e *store.Execution, del *Delivery) error {
			return fx.k.FailExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), FailRequest{Reason: "boom"})
		}},
		{"deadline", wire.ExecCancelled, wire.ReasonDeadlineExceeded, func(e *store.Execution, _ *Delivery) error {
			fx.clk.Advance(2 * time.Minute)
			return fx.k.ExpireDeadline(fx.ctx, e.ID)
		}},
	} {
		e, del := fx.start("a1")
		done := fx.awaitAsync(fx.ctx, Caller{}, e.ID, MaxWait, nil)
		fx.waitersOf(1)
		if err := tc.end(e, del); err != nil {
			t.Fatalf("%s: %v", tc.name, err)
		}
		r := fx.result(done)
		if r.err != nil || r.e.Status != tc.status || r.e.FailureReason != tc.reason {
			t.Fatalf("%s: await = %+v, %v; want %s (%s)", tc.name, r.e, r.err, tc.status, tc.reason)
		}
	}
}

func TestAwaitAnswersAtOnce(t *testing.T) {
	withoutRecheck(t)
	fx := newFixture(t)
	e, del := fx.start("a1")
	// No wait: the execution as it is.
	got, err := fx.k.AwaitExecution(fx.ctx, Caller{}, e.ID, 0, nil)
	if err != nil || got.Status != wire.ExecRunning {
		t.Fatalf("await without a wait = %+v, %v; want it running", got, err)
	}
	if err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{}); err != nil {
		t.Fatal(err)
	}
	// Terminal already: answered however long the wait (a test that would
	// hang for MaxWait otherwise).
	got, err = fx.k.AwaitExecution(fx.ctx, Caller{}, e.ID, time.Hour, nil)
	if err != nil || got.Status != wire.ExecCompleted || string(got.Output) != "null" {
		t.Fatalf("await of a completed execution = %+v, %v", got, err)
	}
	// Unknown, and another agent's.
	wantCode(t, errOnly(fx.k.AwaitExecution(fx.ctx, Caller{}, "0190a000-0000-7000-8000-000000000000", time.Hour, nil)), wire.CodeNotFound)
	fx.agent("a2")
	wantCode(t, errOnly(fx.k.AwaitExecution(fx.ctx, Caller{Agent: "a2"}, e.ID, time.Hour, nil)), wire.CodeForbidden)
	if _, ends, _ := fx.k.Subscriptions(); ends != 0 {
		t.Fatalf("%d end subscriptions left", ends)
	}
}

func errOnly(_ *store.Execution, err error) error { return err }

// When the wait runs out, or the server stops, the answer is the execution
// as it is then.
func TestAwaitRunsOut(t *testing.T) {
	withoutRecheck(t)
	fx := newFixture(t)
	e, _ := fx.start("a1")
	r := fx.result(fx.awaitAsync(fx.ctx, Caller{}, e.ID, 20*time.Millisecond, nil))
	if r.err != nil || r.e.Status != wire.ExecRunning || r.e.ID != e.ID {
		t.Fatalf("await that ran out = %+v, %v; want the running execution", r.e, r.err)
	}
	stop := make(chan struct{})
	done := fx.awaitAsync(fx.ctx, Caller{}, e.ID, MaxWait, stop)
	fx.waitersOf(1)
	close(stop)
	if r := fx.result(done); r.err != nil || r.e.Status != wire.ExecRunning {
		t.Fatalf("await stopped = %+v, %v; want the running execution", r.e, r.err)
	}
}

// A client that goes away ends its wait at once and leaves nothing behind.
func TestAwaitClientGone(t *testing.T) {
	withoutRecheck(t)
	fx := newFixture(t)
	e, _ := fx.start("a1")
	ctx, cancel := context.WithCancel(fx.ctx)
	done := fx.awaitAsync(ctx, Caller{}, e.ID, MaxWait, nil)
	fx.waitersOf(1)
	cancel()
	if r := fx.result(done); !errors.Is(r.err, context.Canceled) || r.e != nil {
		t.Fatalf("await after the client left = %+v, %v; want context.Canceled", r.e, r.err)
	}
	fx.waitersOf(0)
}

// droppedEnds is a notifier that loses every end notification, as a broken
// connection to the other replicas would.
type droppedEnds struct{ store.Notifier }

func (d droppedEnds) Notify(n store.Notification) {
	if n.Topic != store.TopicEnded {
		d.Notifier.Notify(n)
	}
}

type lossyStore struct{ store.Store }

func (s lossyStore) Notifier() store.Notifier { return droppedEnds{s.Store.Notifier()} }

// A lost end notification only delays the answer until the next re-read.
func TestAwaitSurvivesALostNotification(t *testing.T) {
	old := awaitRecheck
	awaitRecheck = 10 * time.Millisecond
	t.Cleanup(func() { awaitRecheck = old })
	fx := newFixture(t, func(o *Options) { o.Store = lossyStore{o.Store} })
	e, del := fx.start("a1")
	done := fx.awaitAsync(fx.ctx, Caller{}, e.ID, MaxWait, nil)
	fx.waitersOf(1)
	if err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Output: []byte("7")}); err != nil {
		t.Fatal(err)
	}
	if r := fx.result(done); r.err != nil || r.e.Status != wire.ExecCompleted || string(r.e.Output) != "7" {
		t.Fatalf("await with the end notification lost = %+v, %v", r.e, r.err)
	}
}
