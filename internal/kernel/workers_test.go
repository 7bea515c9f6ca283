package kernel

// Tests of the kernel's background duties and bounds: deadlines, retention,
// listing, and storage limits.

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

func TestDeadline(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.DeadlineTimeout = time.Minute }))
	e, del := fx.start("a1")
	s := fx.proceed(e, del, "slow", `{}`)
	r := fx.k.store.Read()

	fx.clk.Advance(59 * time.Second)
	if ids, _ := r.DeadlinesDue(fx.ctx, fx.clk.Now(), 10); len(ids) != 0 {
		t.Fatalf("due before the deadline: %v", ids)
	}
	if next, _ := r.NextDeadline(fx.ctx); !next.Equal(t0.Add(time.Minute)) {
		t.Fatalf("next deadline = %v", next)
	}
	seq := fx.lastSeq(e.ID)
	if err := fx.k.ExpireDeadline(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)

	fx.clk.Advance(time.Second)
	ids, _ := r.DeadlinesDue(fx.ctx, fx.clk.Now(), 10)
	if len(ids) != 1 || ids[0] != e.ID {
		t.Fatalf("due at the deadline: %v", ids)
	}
	if err := fx.k.ExpireDeadline(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventExecutionCancelled, wire.EventStepCancelled)
	wantPayload(t, evs[0], fmt.Sprintf(`{"execution_id":%q,"reason":"deadline_exceeded","status":"cancelled"}`, e.ID))
	wantPayload(t, evs[1], `{"error":{"reason":"deadline_exceeded"},`+stepJSON(s, wire.KindToolCall, "slow")+"}")
	if ids, _ := r.DeadlinesDue(fx.ctx, fx.clk.Now(), 10); len(ids) != 0 {
		t.Fatalf("a cancelled execution is still due: %v", ids)
	}

	t.Run("no deadline configured", func(t *testing.T) {
		fx := newFixture(t)
		e, _ := fx.start("a1")
		fx.clk.Advance(1000 * time.Hour)
		if err := fx.k.ExpireDeadline(fx.ctx, e.ID); err != nil {
			t.Fatal(err)
		}
		if fx.exec(e.ID).Status != wire.ExecRunning {
			t.Fatal("an execution without deadline was cancelled")
		}
		wantCode(t, fx.k.ExpireDeadline(fx.ctx, "0190aaaa-0000-7000-8000-000000000000"), wire.CodeNotFound)
	})
}

func TestRunWorkersExpireDeadlines(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.DeadlineTimeout = time.Hour }))
	e, _ := fx.start("a1")
	ctx, cancel := context.WithCancel(fx.ctx)
	stopped := make(chan struct{})
	go func() { fx.k.RunWorkers(ctx); close(stopped) }()
	defer func() {
		cancel()
		select {
		case <-stopped:
		case <-time.After(5 * time.Second):
			t.Error("RunWorkers did not return after its context ended")
		}
	}()

	fx.clk.Advance(time.Hour)
	deadline := time.Now().Add(5 * time.Second)
	for fx.exec(e.ID).Status != wire.ExecCancelled {
		if time.Now().After(deadline) {
			t.Fatal("the deadline worker did not cancel the execution within 5 s of the clock reaching it")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ex := fx.exec(e.ID); ex.FailureReason != wire.ReasonDeadlineExceeded {
		t.Fatalf("failure reason = %q", ex.FailureReason)
	}
}

func TestRetentionSweep(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.Retention = time.Hour }))
	fx.agent("a1")
	old, err := fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a1", IdempotencyKey: "old", BodyHash: "h"})
	if err != nil {
		t.Fatal(err)
	}
	oldDel := fx.claim(old.ID)
	s := fx.proceed(old, oldDel, "x", `{}`)
	if err := fx.k.CancelExecution(fx.ctx, old.ID); err != nil {
		t.Fatal(err)
	}
	running, _ := fx.start("a1")
	fx.clk.Advance(2 * time.Hour)
	recent, _ := fx.start("a1")
	if err := fx.k.CancelExecution(fx.ctx, recent.ID); err != nil {
		t.Fatal(err)
	}

	fx.k.Sweep(fx.ctx)
	r := fx.k.store.Read()
	if _, err := r.Execution(fx.ctx, old.ID); err == nil {
		t.Fatal("an old terminal execution survived the sweep")
	}
	if evs, _ := r.Events(fx.ctx, old.ID, 0, 100); len(evs) != 0 {
		t.Fatalf("%d events of a deleted execution remain", len(evs))
	}
	if _, err := r.Step(fx.ctx, old.ID, s); err == nil {
		t.Fatal("a step of a deleted execution remains")
	}
	if _, err := r.Dispatch(fx.ctx, oldDel.DispatchID); err == nil {
		t.Fatal("a dispatch of a deleted execution remains")
	}
	if _, err := r.Idempotency(fx.ctx, RouteCreate, "", "old"); err == nil {
		t.Fatal("the idempotency key of a deleted execution remains")
	}
	if fx.exec(running.ID).Status != wire.ExecRunning {
		t.Fatal("a running execution was touched")
	}
	fx.exec(recent.ID)

	// However old, a non-terminal execution is never deleted.
	fx.clk.Advance(1000 * time.Hour)
	fx.k.Sweep(fx.ctx)
	fx.exec(running.ID)
	if _, err := r.Execution(fx.ctx, recent.ID); err == nil {
		t.Fatal("the second sweep kept a terminal execution older than the retention")
	}

	// retire re-checks under the lock: a candidate that is no longer old
	// enough, or not terminal, is kept.
	e2, _ := fx.start("a1")
	if gone, err := fx.k.retire(fx.ctx, e2.ID, fx.clk.Now().Add(time.Hour)); err != nil || gone {
		t.Fatalf("retire of a running execution: %v, %v", gone, err)
	}
	fx.exec(e2.ID)
	if err := fx.k.CancelExecution(fx.ctx, e2.ID); err != nil {
		t.Fatal(err)
	}
	if gone, err := fx.k.retire(fx.ctx, e2.ID, fx.clk.Now()); err != nil || gone {
		t.Fatalf("retire of a recent execution: %v, %v", gone, err)
	}
	fx.exec(e2.ID)
}

func TestRetentionOffKeepsEverything(t *testing.T) {
	fx := newFixture(t)
	e, _ := fx.start("a1")
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	fx.clk.Advance(10000 * time.Hour)
	fx.k.Sweep(fx.ctx)
	fx.exec(e.ID)
}

func TestListExecutions(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	fx.agent("b")
	var ids []string // creation order
	for i := 0; i < 5; i++ {
		agent := "a1"
		if i%2 == 1 {
			agent = "b"
		}
		fx.clk.Advance(time.Millisecond)
		ids = append(ids, fx.create(agent).ID)
	}
	if err := fx.k.CancelExecution(fx.ctx, ids[0]); err != nil {
		t.Fatal(err)
	}
	list := func(f store.ExecutionFilter) ([]string, string) {
		t.Helper()
		res, err := fx.k.ListExecutions(fx.ctx, f)
		if err != nil {
			t.Fatalf("list %+v: %v", f, err)
		}
		var got []string
		for _, e := range res.Executions {
			got = append(got, e.ID)
		}
		return got, res.NextCursor
	}
	eq := func(got []string, want ...string) {
		t.Helper()
		if strings.Join(got, ",") != strings.Join(want, ",") {
			t.Fatalf("got %v, want %v", got, want)
		}
	}
	got, next := list(store.ExecutionFilter{})
	eq(got, ids[4], ids[3], ids[2], ids[1], ids[0])
	if next != "" {
		t.Fatalf("next cursor %q on the only page", next)
	}
	got, next = list(store.ExecutionFilter{Limit: 2})
	eq(got, ids[4], ids[3])
	if next != ids[3] {
		t.Fatalf("next cursor = %q, want the last id of the page", next)
	}
	got, next = list(store.ExecutionFilter{Limit: 2, Cursor: next})
	eq(got, ids[2], ids[1])
	got, next = list(store.ExecutionFilter{Limit: 2, Cursor: next})
	eq(got, ids[0])
	if next != "" {
		t.Fatalf("next cursor %q on the last page", next)
	}
	// Exactly limit matching rows: no cursor.
	if _, next := list(store.ExecutionFilter{Limit: 5}); next != "" {
		t.Fatalf("next cursor %q when exactly limit rows match", next)
	}
	got, _ = list(store.ExecutionFilter{AgentID: "b"})
	eq(got, ids[3], ids[1])
	got, _ = list(store.ExecutionFilter{Status: wire.ExecCancelled})
	eq(got, ids[0])
	got, _ = list(store.ExecutionFilter{Status: wire.ExecRunning, AgentID: "a1"})
	eq(got, ids[4], ids[2])
	got, _ = list(store.ExecutionFilter{AgentID: "nobody"})
	if got != nil {
		t.Fatalf("unknown agent filter = %v", got)
	}
	res, _ := fx.k.ListExecutions(fx.ctx, store.ExecutionFilter{AgentID: "nobody"})
	if res.Executions == nil {
		t.Fatal("an empty page must be an empty list, not nil")
	}

	for _, f := range []store.ExecutionFilter{{Limit: -1}, {Status: "done"}, {AgentID: strings.Repeat("a", 129)}} {
		_, err := fx.k.ListExecutions(fx.ctx, f)
		wantCode(t, err, wire.CodeValidation)
	}
	if _, err := fx.k.ListExecutions(fx.ctx, store.ExecutionFilter{AgentID: strings.Repeat("a", 128)}); err != nil {
		t.Fatalf("a 128-byte agent filter: %v", err)
	}
}

func TestListExecutionsLimits(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	// 201 rows written in one transaction: enough to see both the default
	// page (50) and the cap (200).
	err := fx.k.store.Update(fx.ctx, "", func(ctx context.Context, tx store.Tx) error {
		for i := 0; i < 201; i++ {
			e := &store.Execution{ID: newDispatchID("", t0.Add(time.Duration(i)*time.Millisecond)), AgentID: "a1", Input: []byte("null"),
				Status: wire.ExecRunning, CreatedAt: t0, UpdatedAt: t0, ResourceKeys: []string{}}
			if err := tx.InsertExecution(ctx, e); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	for limit, want := range map[int]int{0: 50, 1: 1, 200: 200, 201: 200, 100000: 200} {
		res, err := fx.k.ListExecutions(fx.ctx, store.ExecutionFilter{Limit: limit})
		if err != nil {
			t.Fatal(err)
		}
		if len(res.Executions) != want || res.NextCursor == "" {
			t.Fatalf("limit %d: %d rows, cursor %q; want %d rows and a cursor", limit, len(res.Executions), res.NextCursor, want)
		}
	}
}

func TestListEvents(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	for i := 0; i < 35; i++ { // 4 + 35 × 3 = 109 events
		fx.proceed(e, del, fmt.Sprint("t", i), `{}`)
	}
	c := Caller{Agent: "a1"}
	evs, err := fx.k.ListEvents(fx.ctx, c, e.ID, 0, 0)
	if err != nil || len(evs) != 100 || evs[0].Seq != 1 || evs[99].Seq != 100 {
		t.Fatalf("default page: %d events, %v", len(evs), err)
	}
	evs, _ = fx.k.ListEvents(fx.ctx, c, e.ID, 100, 0)
	if len(evs) != 9 || evs[0].Seq != 101 {
		t.Fatalf("after 100: %d events", len(evs))
	}
	evs, _ = fx.k.ListEvents(fx.ctx, c, e.ID, 5, 3)
	if len(evs) != 3 || evs[0].Seq != 6 || evs[2].Seq != 8 {
		t.Fatalf("after 5 limit 3: %v", types(evs))
	}
	evs, _ = fx.k.ListEvents(fx.ctx, c, e.ID, 109, 0)
	if evs == nil || len(evs) != 0 {
		t.Fatalf("after the last event: %#v, want []", evs)
	}
	_, err = fx.k.ListEvents(fx.ctx, c, e.ID, -1, 0)
	wantCode(t, err, wire.CodeValidation)
	_, err = fx.k.ListEvents(fx.ctx, c, e.ID, 0, -1)
	wantCode(t, err, wire.CodeValidation)
	_, err = fx.k.ListEvents(fx.ctx, Caller{Agent: "a2"}, e.ID, 0, 0)
	wantCode(t, err, wire.CodeForbidden)
	_, err = fx.k.ListEvents(fx.ctx, c, "0190aaaa-0000-7000-8000-000000000000", 0, 0)
	wantCode(t, err, wire.CodeNotFound)

	// The cap of 1,000 per page.
	err = fx.k.store.Update(fx.ctx, e.ID, func(ctx context.Context, tx store.Tx) error {
		ex, err := tx.Execution(ctx, e.ID)
		if err != nil {
			return err
		}
		var extra []*store.Event
		for i := 0; i < 1000; i++ {
			ex.LastSeq++
			extra = append(extra, &store.Event{ExecutionID: e.ID, Seq: ex.LastSeq, Type: "test.filler", Payload: []byte(`{}`), OccurredAt: t0})
		}
		if err := tx.AppendEvents(ctx, extra); err != nil {
			return err
		}
		return tx.UpdateExecution(ctx, ex)
	})
	if err != nil {
		t.Fatal(err)
	}
	evs, _ = fx.k.ListEvents(fx.ctx, c, e.ID, 0, 5000)
	if len(evs) != 1000 {
		t.Fatalf("limit 5000 returned %d events, want the cap of 1,000", len(evs))
	}
}

func TestEachStepPageStreamsPagesOf1000(t *testing.T) {
	fx := newFixture(t)
	e, _ := fx.start("a1")
	err := fx.k.store.Update(fx.ctx, e.ID, func(ctx context.Context, tx store.Tx) error {
		for i := 1; i <= 1001; i++ {
			s := &store.Step{ExecutionID: e.ID, StepID: fmt.Sprintf("%064x", i), Order: int64(i), Kind: wire.KindLocal, Target: "t",
				ArgsHash: strings.Repeat("0", 64), Occurrence: int64(i), Status: wire.StepSucceeded, Idempotency: wire.SafeToRetry,
				Args: []byte("null"), Result: []byte("1"), Resources: []string{}}
			if err := tx.InsertStep(ctx, s); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	var sizes []int
	var last int64
	err = fx.k.EachStepPage(fx.ctx, Caller{}, e.ID, "terminal", func(page []*store.Step) error {
		sizes = append(sizes, len(page))
		for _, s := range page {
			if s.Order != last+1 {
				return fmt.Errorf("order %d after %d", s.Order, last)
			}
			last = s.Order
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(sizes) != 2 || sizes[0] != 1000 || sizes[1] != 1 || last != 1001 {
		t.Fatalf("pages = %v, last order %d; want [1000 1] ending at 1001", sizes, last)
	}
}

func TestStorageLimitSteps(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.MaxStepsPerExecution = 2 }))
	e, del := fx.start("a1")
	s1 := fx.proceed(e, del, "one", `{}`)
	s2 := fx.proceed(e, del, "two", `{}`)
	// Replays and outcomes are not new steps.
	r := req(t, wire.KindToolCall, "one", `{}`)
	r.HasOccurrence = true
	if dec := fx.submitReq(e.ID, hdr(del), r); dec.Decision != wire.DecisionProceed {
		t.Fatalf("replay at the limit = %+v", dec)
	}
	fx.outcome(e, del, s1, true, `1`)
	seq := fx.lastSeq(e.ID)

	dec := fx.submit(e, del, wire.KindToolCall, "three", `{}`)
	if dec.Decision != wire.DecisionExecutionTerminal || dec.StepID != "" {
		t.Fatalf("third step = %+v", dec)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventExecutionFailed, wire.EventStepCancelled)
	wantPayload(t, evs[0], fmt.Sprintf(`{"execution_id":%q,"reason":"storage_limit_exceeded","status":"failed"}`, e.ID))
	wantPayload(t, evs[1], `{"error":{"reason":"execution_failed"},`+stepJSON(s2, wire.KindToolCall, "two")+"}")
	ex := fx.exec(e.ID)
	if ex.Status != wire.ExecFailed || ex.FailureReason != wire.ReasonStorageLimitExceeded || ex.StepCount != 2 {
		t.Fatalf("execution = %s %q with %d steps", ex.Status, ex.FailureReason, ex.StepCount)
	}
	three := fx.k.EachStepPage(fx.ctx, Caller{}, e.ID, "", func(page []*store.Step) error {
		if len(page) != 2 {
			return fmt.Errorf("%d steps stored, want 2", len(page))
		}
		return nil
	})
	if three != nil {
		t.Fatal(three)
	}
	if d := fx.dispatch(del.DispatchID); d.Status != wire.DispatchRetired {
		t.Fatalf("dispatch is %s", d.Status)
	}
	if metric(fx.k.metrics.ExecutionsCompleted.WithLabelValues(wire.ExecFailed)) != 1 {
		t.Fatal("executions_completed_total{failed} did not move")
	}
	if dec := fx.submit(e, del, wire.KindToolCall, "four", `{}`); dec.Decision != wire.DecisionExecutionTerminal {
		t.Fatalf("after the limit = %+v", dec)
	}
}

func TestStorageLimitBytes(t *testing.T) {
	const limit = 4096
	setup := func(t *testing.T) (*fixture, *store.Execution, *Delivery, string) {
		fx := newFixture(t, withConfig(func(c *Config) { c.MaxExecutionBytes = limit }))
		e, del := fx.start("a1")
		s := fx.proceed(e, del, "s", `{}`)
		if b := fx.exec(e.ID).ByteCount; b > limit/2 {
			t.Fatalf("setup already uses %d bytes", b)
		}
		return fx, e, del, s
	}
	big := `"` + strings.Repeat("x", limit) + `"`
	check := func(t *testing.T, fx *fixture, e *store.Execution, seq int64) {
		t.Helper()
		evs := fx.eventsAfter(e.ID, seq)
		if len(evs) == 0 || evs[0].Type != wire.EventExecutionFailed || !strings.Contains(string(evs[0].Payload), `"reason":"storage_limit_exceeded"`) {
			t.Fatalf("events = %v", types(evs))
		}
		ex := fx.exec(e.ID)
		if ex.Status != wire.ExecFailed || ex.FailureReason != wire.ReasonStorageLimitExceeded || ex.ByteCount > limit+1024 {
			t.Fatalf("execution = %s %q, %d bytes", ex.Status, ex.FailureReason, ex.ByteCount)
		}
		for _, ev := range evs {
			if strings.Contains(string(ev.Payload), "xxxx") {
				t.Fatalf("the refused value reached the log in %s", ev.Type)
			}
		}
	}
	t.Run("step result", func(t *testing.T) {
		fx, e, del, s := setup(t)
		seq := fx.lastSeq(e.ID)
		if dec := fx.outcome(e, del, s, true, big); dec.Decision != wire.DecisionExecutionTerminal {
			t.Fatalf("decision = %+v", dec)
		}
		check(t, fx, e, seq)
		if st := fx.step(e.ID, s); st.Status != wire.StepCancelled || st.Result != nil {
			t.Fatalf("step = %s with result %q, want cancelled without the result", st.Status, st.Result)
		}
	})
	t.Run("step args", func(t *testing.T) {
		fx, e, del, _ := setup(t)
		seq := fx.lastSeq(e.ID)
		if dec := fx.submit(e, del, wire.KindToolCall, "huge", `{"a":`+big+`}`); dec.Decision != wire.DecisionExecutionTerminal {
			t.Fatalf("decision = %+v", dec)
		}
		check(t, fx, e, seq)
	})
	t.Run("step error", func(t *testing.T) {
		fx, e, del, s := setup(t)
		seq := fx.lastSeq(e.ID)
		if dec := fx.outcome(e, del, s, false, big); dec.Decision != wire.DecisionExecutionTerminal {
			t.Fatalf("decision = %+v", dec)
		}
		check(t, fx, e, seq)
	})
	t.Run("execution output", func(t *testing.T) {
		fx, e, del, _ := setup(t)
		seq := fx.lastSeq(e.ID)
		err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Output: []byte(big)})
		wantCode(t, err, wire.CodeExecutionTerminal)
		check(t, fx, e, seq)
		if ex := fx.exec(e.ID); ex.Output != nil {
			t.Fatalf("the refused output was stored: %d bytes", len(ex.Output))
		}
	})
	t.Run("execution state", func(t *testing.T) {
		fx, e, del, _ := setup(t)
		seq := fx.lastSeq(e.ID)
		err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{State: []byte(big)})
		wantCode(t, err, wire.CodeExecutionTerminal)
		check(t, fx, e, seq)
	})
	t.Run("within the limit", func(t *testing.T) {
		fx, e, del, s := setup(t)
		if dec := fx.outcome(e, del, s, true, `"`+strings.Repeat("y", 100)+`"`); dec.Decision != wire.DecisionRecorded {
			t.Fatalf("decision = %+v", dec)
		}
	})
}

// follower is a store shared with a leader elsewhere: this process never
// leads. It counts how often the workers ask.
type follower struct {
	store.Store
	asked atomic.Int64
}

func (f *follower) Leading() bool { f.asked.Add(1); return false }

// A replica that does not lead waits between its looks at leadership; it
// never spins (the sweep once waited for a time already past, at once and
// for ever, a core's worth of CPU on every replica but the leader).
func TestWorkersIdleWhenNotLeading(t *testing.T) {
	f := &follower{}
	fx := newFixture(t, func(o *Options) { f.Store = o.Store; o.Store = f })
	ctx, cancel := context.WithCancel(fx.ctx)
	stopped := make(chan struct{})
	go func() { fx.k.RunWorkers(ctx); close(stopped) }()
	// Each of the four loops looks once now and once per poll interval
	// (a second): well under 50 looks in 300 ms, where a spinning loop
	// makes millions.
	time.Sleep(300 * time.Millisecond)
	cancel()
	<-stopped
	if n := f.asked.Load(); n == 0 || n > 50 {
		t.Fatalf("the workers asked whether this replica leads %d times in 300 ms", n)
	}
}

// slowSweep holds the first retention query until gate closes, as a sweep
// on a busy database is held, and says when it has started (entered).
type slowSweep struct {
	store.Store
	entered, gate chan struct{}
	once          sync.Once
}

func (s *slowSweep) Read() store.Reader { return slowSweepReader{s.Store.Read(), s} }

type slowSweepReader struct {
	store.Reader
	s *slowSweep
}

func (r slowSweepReader) RetentionCandidates(ctx context.Context, cutoff time.Time, limit int) ([]string, error) {
	r.s.once.Do(func() {
		close(r.s.entered)
		<-r.s.gate
	})
	return r.Reader.RetentionCandidates(ctx, cutoff, limit)
}

// Time that passes during a sweep does not push back the next one: it is
// due an interval after the last began. (It was due an interval after the
// last ended, so a clock moved past the retention while a slow sweep ran
// was only seen an interval after that: a black-box test on a busy
// Postgres waited for a deletion that never came.)
func TestSweepAfterClockMovedDuringSweep(t *testing.T) {
	s := &slowSweep{entered: make(chan struct{}), gate: make(chan struct{})}
	fx := newFixture(t, withConfig(func(c *Config) { c.Retention = time.Hour; c.CleanupInterval = time.Minute }),
		func(o *Options) { s.Store = o.Store; o.Store = s })
	e, _ := fx.start("a1")
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(fx.ctx)
	stopped := make(chan struct{})
	go func() { fx.k.RunWorkers(ctx); close(stopped) }()
	defer func() { cancel(); <-stopped }()

	<-s.entered
	fx.clk.Advance(2 * time.Hour) // while the first sweep runs
	close(s.gate)
	deadline := time.Now().Add(5 * time.Second)
	for {
		if _, err := fx.k.store.Read().Execution(fx.ctx, e.ID); errors.Is(err, store.ErrNotFound) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatal("the execution, past the retention since the clock moved during a sweep, was not deleted within 5 s")
		}
		time.Sleep(5 * time.Millisecond)
	}
}
