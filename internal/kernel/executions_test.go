package kernel

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

func TestCreateSequence(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	created := metric(fx.k.metrics.ExecutionsCreated)
	input := `{ "topic" : "go", "n": 1.50 }`
	e, err := fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a1", Input: []byte(input)})
	if err != nil {
		t.Fatal(err)
	}
	if e.Status != wire.ExecRunning || e.AgentID != "a1" || string(e.Input) != input || !e.CreatedAt.Equal(t0) || !e.UpdatedAt.Equal(t0) {
		t.Fatalf("created execution = %+v", e)
	}
	if !e.DeadlineAt.IsZero() || e.ResourceKeys == nil || len(e.ResourceKeys) != 0 {
		t.Fatalf("deadline %v resource keys %#v", e.DeadlineAt, e.ResourceKeys)
	}
	uuidMillis(t, e.ID)
	evs := fx.events(e.ID)
	wantTypes(t, evs, wire.EventExecutionCreated, wire.EventExecutionStarted, wire.EventDispatchQueued)
	wantPayload(t, evs[0], fmt.Sprintf(`{"agent_id":"a1","execution_id":%q,"status":"pending"}`, e.ID))
	wantPayload(t, evs[1], fmt.Sprintf(`{"execution_id":%q,"status":"running"}`, e.ID))
	wantPayload(t, evs[2], fmt.Sprintf(`{"attempt":0,"dispatch_id":%q,"execution_id":%q,"status":"pending"}`, e.DispatchID, e.ID))
	var payloads int64
	for i, ev := range evs {
		if ev.Seq != int64(i+1) || !ev.OccurredAt.Equal(t0) || ev.ExecutionID != e.ID {
			t.Fatalf("event %d = %+v", i, ev)
		}
		payloads += int64(len(ev.Payload))
	}
	stored := fx.exec(e.ID)
	if stored.LastSeq != 3 || stored.StepCount != 0 || stored.ByteCount != int64(len(input))+payloads {
		t.Fatalf("bookkeeping: last seq %d, steps %d, bytes %d (want %d)", stored.LastSeq, stored.StepCount, stored.ByteCount, int64(len(input))+payloads)
	}
	d := fx.dispatch(e.DispatchID)
	if d.Status != wire.DispatchPending || d.Attempt != 0 || d.ProgressAttempt != 0 || d.MaxAttempts != 5 ||
		!d.NextAttemptAt.Equal(t0) || !d.LeaseExpiresAt.IsZero() || d.ExecutionID != e.ID {
		t.Fatalf("dispatch = %+v", d)
	}
	if uuidMillis(t, d.ID) != t0.UnixMilli() {
		t.Fatal("the dispatch id does not carry the creation time")
	}
	if got := metric(fx.k.metrics.ExecutionsCreated); got != created+1 {
		t.Fatalf("executions_created_total moved by %v", got-created)
	}
	select {
	case <-fx.k.DispatchWake():
	default:
		t.Fatal("the dispatcher was not woken after the create committed")
	}
}

func TestCreateOptionalFields(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) {
		c.DeadlineTimeout = 90 * time.Minute
		c.DispatchMaxAttempts = 3
	}))
	fx.agent("a1")
	fx.clk.Advance(1234567 * time.Microsecond)
	now := fx.clk.Now()
	e, err := fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a1", AgentVersion: "v1.2", OnBehalfOf: "alice"})
	if err != nil {
		t.Fatal(err)
	}
	if string(e.Input) != "null" || e.AgentVersion != "v1.2" || e.OnBehalfOf != "alice" || !e.DeadlineAt.Equal(now.Add(90*time.Minute)) {
		t.Fatalf("execution = %+v", e)
	}
	dl := wire.FormatTime(now.Add(90 * time.Minute))
	evs := fx.events(e.ID)
	wantPayload(t, evs[0], fmt.Sprintf(`{"agent_id":"a1","agent_version":"v1.2","deadline_at":%q,"execution_id":%q,"status":"pending"}`, dl, e.ID))
	wantPayload(t, evs[1], fmt.Sprintf(`{"deadline_at":%q,"execution_id":%q,"status":"running"}`, dl, e.ID))
	if d := fx.dispatch(e.DispatchID); d.MaxAttempts != 3 {
		t.Fatalf("max_attempts = %d, want the configured 3", d.MaxAttempts)
	}
	stored := fx.exec(e.ID)
	if stored.AgentVersion != "v1.2" || stored.OnBehalfOf != "alice" || !stored.DeadlineAt.Equal(e.DeadlineAt) || string(stored.Input) != "null" {
		t.Fatalf("stored = %+v", stored)
	}
}

func TestCreateValidation(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	fx.agent("a2")
	long := strings.Repeat("v", 257)
	for _, tc := range []struct {
		name string
		r    CreateRequest
		code string
		msg  string
	}{
		{"no agent", CreateRequest{}, wire.CodeValidation, "validation error: agent_id is required"},
		{"unknown agent", CreateRequest{AgentID: "ghost"}, wire.CodeNotFound, "agent not found"},
		{"long version", CreateRequest{AgentID: "a1", AgentVersion: long}, wire.CodeValidation, ""},
		{"long on_behalf_of", CreateRequest{AgentID: "a1", OnBehalfOf: long}, wire.CodeValidation, ""},
		{"bad key", CreateRequest{AgentID: "a1", IdempotencyKey: "has space"}, wire.CodeValidation, ""},
		{"unknown agent before key", CreateRequest{AgentID: "ghost", IdempotencyKey: "k"}, wire.CodeNotFound, ""},
		{"unknown parent", CreateRequest{AgentID: "a1", ParentExecutionID: "0190aaaa-0000-7000-8000-000000000000"}, wire.CodeNotFound, "parent execution not found"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := fx.k.CreateExecution(fx.ctx, tc.r)
			ke := wantCode(t, err, tc.code)
			if tc.msg != "" && ke.Message != tc.msg {
				t.Fatalf("message = %q, want %q", ke.Message, tc.msg)
			}
		})
	}
	if _, err := fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a1", AgentVersion: long[:256], OnBehalfOf: long[:256]}); err != nil {
		t.Fatalf("256-byte strings: %v", err)
	}
	res, _ := fx.k.ListExecutions(fx.ctx, store.ExecutionFilter{})
	if len(res.Executions) != 1 {
		t.Fatalf("%d executions exist, want only the valid one", len(res.Executions))
	}

	t.Run("parent rules", func(t *testing.T) {
		running, _ := fx.start("a1")
		_, err := fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a1", ParentExecutionID: running.ID})
		wantMessage(t, err, wire.CodeConflict, "conflict: parent execution is not completed")
		_, err = fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a2", ParentExecutionID: running.ID})
		wantCode(t, err, wire.CodeValidation)
	})
}

func TestPrevious(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.Retention = time.Hour }))
	c := Caller{Agent: "a1"}
	complete := func(output, state string) *store.Execution {
		t.Helper()
		e, del := fx.start("a1")
		r := CompleteRequest{}
		if output != "" {
			r.Output = []byte(output)
		}
		if state != "" {
			r.State = []byte(state)
		}
		if err := fx.k.CompleteExecution(fx.ctx, c, e.ID, hdr(del), r); err != nil {
			t.Fatal(err)
		}
		return e
	}
	child := func(parent string) string {
		t.Helper()
		e, err := fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a1", ParentExecutionID: strings.ToLower(parent)})
		if err != nil {
			t.Fatal(err)
		}
		if e.ParentID != parent {
			t.Fatalf("parent = %q", e.ParentID)
		}
		return e.ID
	}
	prev := func(id string) string {
		t.Helper()
		b, err := fx.k.Previous(fx.ctx, c, id)
		if err != nil {
			t.Fatal(err)
		}
		return string(b)
	}
	withState := complete(`{"out":1}`, `{ "cursor" : 42 }`)
	outputOnly := complete(`[1, 2]`, "")
	nullOutput := complete("", "")
	if got := prev(child(withState.ID)); got != `{ "cursor" : 42 }` {
		t.Fatalf("previous of a child of a parent with state = %s", got)
	}
	if got := prev(child(outputOnly.ID)); got != `[1, 2]` {
		t.Fatalf("previous of a child of a parent without state = %s", got)
	}
	if got := prev(child(nullOutput.ID)); got != `null` {
		t.Fatalf("previous of a child of a parent with null output = %s", got)
	}
	orphan := child(withState.ID)
	if got := prev(withState.ID); got != "null" {
		t.Fatalf("previous of an execution without parent = %s", got)
	}
	_, err := fx.k.Previous(fx.ctx, Caller{Agent: "other"}, orphan)
	wantCode(t, err, wire.CodeForbidden)
	_, err = fx.k.Previous(fx.ctx, c, "0190aaaa-0000-7000-8000-000000000000")
	wantCode(t, err, wire.CodeNotFound)

	// Once retention removes the parent, the child reads null.
	fx.clk.Advance(2 * time.Hour)
	fx.k.Sweep(fx.ctx)
	if _, err := fx.k.store.Read().Execution(fx.ctx, withState.ID); err == nil {
		t.Fatal("retention kept the old completed parent")
	}
	if got := prev(orphan); got != "null" {
		t.Fatalf("previous after the parent was removed = %s", got)
	}
}

func TestIdempotentCreate(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	mk := func(key, hash string) (*store.Execution, error) {
		return fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a1", IdempotencyKey: key, BodyHash: hash, Input: []byte(`{}`)})
	}
	first, err := mk("order-1", "h1")
	if err != nil {
		t.Fatal(err)
	}
	if first.IdempotencyKey != "order-1" || fx.exec(first.ID).IdempotencyKey != "order-1" {
		t.Fatal("the key is not kept on the execution")
	}
	created := metric(fx.k.metrics.ExecutionsCreated)
	seq := fx.lastSeq(first.ID)

	again, err := mk("order-1", "h1")
	if err != nil || again.ID != first.ID {
		t.Fatalf("same key and body = %v, %v; want execution %s", again, err, first.ID)
	}
	fx.noNewEvents(first.ID, seq)
	if metric(fx.k.metrics.ExecutionsCreated) != created {
		t.Fatal("a repeated create counted a new execution")
	}
	// The answer shows the execution in its current state.
	if err := fx.k.CancelExecution(fx.ctx, first.ID); err != nil {
		t.Fatal(err)
	}
	again, err = mk("order-1", "h1")
	if err != nil || again.ID != first.ID || again.Status != wire.ExecCancelled {
		t.Fatalf("repeat after cancel = %+v, %v", again, err)
	}

	_, err = mk("order-1", "h2")
	wantMessage(t, err, wire.CodeConflict, "conflict: idempotency key reused with a different body")

	// Other keys are independent.
	other, err := mk("order-2", "h2")
	if err != nil || other.ID == first.ID {
		t.Fatalf("another key = %+v, %v", other, err)
	}

	// Still remembered just before 24 h; forgotten after.
	fx.clk.Advance(24*time.Hour - time.Second)
	_, err = mk("order-1", "h2")
	wantCode(t, err, wire.CodeConflict)
	fx.k.Sweep(fx.ctx)
	if _, err := fx.k.store.Read().Idempotency(fx.ctx, RouteCreate, "", "order-1"); err != nil {
		t.Fatalf("the sweep removed a key younger than 24 h: %v", err)
	}
	fx.clk.Advance(time.Second)
	fresh, err := mk("order-1", "h2")
	if err != nil || fresh.ID == first.ID {
		t.Fatalf("key after 24 h = %+v, %v; want a new execution", fresh, err)
	}
	// The record now names the new execution.
	if again, err := mk("order-1", "h2"); err != nil || again.ID != fresh.ID {
		t.Fatalf("repeat of the renewed key = %+v, %v", again, err)
	}

	fx.clk.Advance(24*time.Hour + time.Second)
	fx.k.Sweep(fx.ctx)
	for _, key := range []string{"order-1", "order-2"} {
		if _, err := fx.k.store.Read().Idempotency(fx.ctx, RouteCreate, "", key); err == nil {
			t.Fatalf("the sweep kept the expired key %s", key)
		}
	}
}

func TestCompleteExecution(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	completed := metric(fx.k.metrics.ExecutionsCompleted.WithLabelValues(wire.ExecCompleted))
	fx.clk.Advance(time.Second)
	seq := fx.lastSeq(e.ID)
	output := `{ "answer" : [1, 2.0] }`
	err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Output: []byte(output), State: []byte(`{"s":1}`)})
	if err != nil {
		t.Fatal(err)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventExecutionCompleted)
	wantPayload(t, evs[0], fmt.Sprintf(`{"execution_id":%q,"output":%s,"status":"completed"}`, e.ID, output))
	ex := fx.exec(e.ID)
	if ex.Status != wire.ExecCompleted || string(ex.Output) != output || string(ex.State) != `{"s":1}` || ex.FailureReason != "" ||
		!ex.UpdatedAt.Equal(fx.clk.Now()) {
		t.Fatalf("execution = %+v", ex)
	}
	if got := metric(fx.k.metrics.ExecutionsCompleted.WithLabelValues(wire.ExecCompleted)); got != completed+1 {
		t.Fatalf("executions_completed_total{completed} moved by %v", got-completed)
	}
	wantCode(t, fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{}), wire.CodeExecutionTerminal)

	t.Run("null output", func(t *testing.T) {
		e, del := fx.start("a1")
		if err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{}); err != nil {
			t.Fatal(err)
		}
		ex := fx.exec(e.ID)
		if string(ex.Output) != "null" || ex.State != nil {
			t.Fatalf("output %q state %q", ex.Output, ex.State)
		}
		if got := string(fx.events(e.ID)[ex.LastSeq-1].Payload); !strings.Contains(got, `"output":null`) {
			t.Fatalf("completed payload = %s", got)
		}
	})
	t.Run("ownership", func(t *testing.T) {
		e, del := fx.start("a1")
		wantCode(t, fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a2"}, e.ID, hdr(del), CompleteRequest{}), wire.CodeForbidden)
		wantCode(t, fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, "0190aaaa-0000-7000-8000-000000000000", hdr(del), CompleteRequest{}), wire.CodeNotFound)
	})
}

func TestFailExecution(t *testing.T) {
	fx := newFixture(t)
	c := Caller{Agent: "a1"}
	t.Run("with reason", func(t *testing.T) {
		e, del := fx.start("a1")
		seq := fx.lastSeq(e.ID)
		if err := fx.k.FailExecution(fx.ctx, c, e.ID, hdr(del), FailRequest{Reason: "agent_error: ValueError: bad"}); err != nil {
			t.Fatal(err)
		}
		evs := fx.eventsAfter(e.ID, seq)
		wantTypes(t, evs, wire.EventExecutionFailed)
		wantPayload(t, evs[0], fmt.Sprintf(`{"execution_id":%q,"reason":"agent_error: ValueError: bad","status":"failed"}`, e.ID))
		if ex := fx.exec(e.ID); ex.Status != wire.ExecFailed || ex.FailureReason != "agent_error: ValueError: bad" {
			t.Fatalf("execution = %+v", ex)
		}
	})
	t.Run("without reason", func(t *testing.T) {
		e, del := fx.start("a1")
		seq := fx.lastSeq(e.ID)
		if err := fx.k.FailExecution(fx.ctx, c, e.ID, hdr(del), FailRequest{Reason: ""}); err != nil {
			t.Fatal(err)
		}
		evs := fx.eventsAfter(e.ID, seq)
		wantPayload(t, evs[0], fmt.Sprintf(`{"execution_id":%q,"status":"failed"}`, e.ID))
		if ex := fx.exec(e.ID); ex.FailureReason != "" {
			t.Fatalf("failure reason = %q", ex.FailureReason)
		}
	})
	t.Run("long reason is truncated at a character boundary", func(t *testing.T) {
		e, del := fx.start("a1")
		reason := strings.Repeat("a", 8191) + "é" + "tail" // é straddles byte 8,192
		if err := fx.k.FailExecution(fx.ctx, c, e.ID, hdr(del), FailRequest{Reason: reason}); err != nil {
			t.Fatal(err)
		}
		if ex := fx.exec(e.ID); ex.FailureReason != strings.Repeat("a", 8191) {
			t.Fatalf("failure reason has %d bytes, want 8,191", len(ex.FailureReason))
		}
		e, del = fx.start("a1")
		exact := strings.Repeat("b", 8190) + "é"
		if err := fx.k.FailExecution(fx.ctx, c, e.ID, hdr(del), FailRequest{Reason: exact + "x"}); err != nil {
			t.Fatal(err)
		}
		if ex := fx.exec(e.ID); ex.FailureReason != exact {
			t.Fatalf("failure reason has %d bytes, want the 8,192-byte prefix", len(ex.FailureReason))
		}
	})
	if got := metric(fx.k.metrics.ExecutionsCompleted.WithLabelValues(wire.ExecFailed)); got != 4 {
		t.Fatalf("executions_completed_total{failed} = %v, want 4", got)
	}
}

func TestCancelExecution(t *testing.T) {
	fx := newFixture(t)
	e, _ := fx.start("a1")
	seq := fx.lastSeq(e.ID)
	fx.clk.Advance(time.Minute)
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventExecutionCancelled)
	wantPayload(t, evs[0], fmt.Sprintf(`{"execution_id":%q,"reason":"client_cancelled","status":"cancelled"}`, e.ID))
	if ex := fx.exec(e.ID); ex.Status != wire.ExecCancelled || ex.FailureReason != wire.ReasonClientCancelled || !ex.UpdatedAt.Equal(t0.Add(time.Minute)) {
		t.Fatalf("execution = %+v", ex)
	}
	wantMessage(t, fx.k.CancelExecution(fx.ctx, e.ID), wire.CodeExecutionTerminal, "execution terminal")
	wantMessage(t, fx.k.CancelExecution(fx.ctx, "0190aaaa-0000-7000-8000-000000000000"), wire.CodeNotFound, "execution not found")
	if metric(fx.k.metrics.ExecutionsCompleted.WithLabelValues(wire.ExecCancelled)) != 1 {
		t.Fatal("executions_completed_total{cancelled} did not move")
	}
}

// TestTerminalCleanUp checks docs/protocol/executions.md §9 for every way an execution ends.
func TestTerminalCleanUp(t *testing.T) {
	type ending struct {
		name, status, reason, cause, event string
		setup                              func(*Config)
		end                                func(fx *fixture, e *store.Execution, del *Delivery)
	}
	endings := []ending{
		{"complete", wire.ExecCompleted, "", wire.CauseExecutionCompleted, wire.EventExecutionCompleted, nil,
			func(fx *fixture, e *store.Execution, del *Delivery) {
				if err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{}); err != nil {
					fx.t.Fatal(err)
				}
			}},
		{"fail", wire.ExecFailed, "gave up", wire.CauseExecutionFailed, wire.EventExecutionFailed, nil,
			func(fx *fixture, e *store.Execution, del *Delivery) {
				if err := fx.k.FailExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), FailRequest{Reason: "gave up"}); err != nil {
					fx.t.Fatal(err)
				}
			}},
		{"cancel", wire.ExecCancelled, wire.ReasonClientCancelled, wire.CauseExecutionCancelled, wire.EventExecutionCancelled, nil,
			func(fx *fixture, e *store.Execution, _ *Delivery) {
				if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
					fx.t.Fatal(err)
				}
			}},
		{"deadline", wire.ExecCancelled, wire.ReasonDeadlineExceeded, wire.CauseDeadlineExceeded, wire.EventExecutionCancelled,
			func(c *Config) { c.DeadlineTimeout = time.Hour },
			func(fx *fixture, e *store.Execution, _ *Delivery) {
				fx.clk.Advance(time.Hour)
				if err := fx.k.ExpireDeadline(fx.ctx, e.ID); err != nil {
					fx.t.Fatal(err)
				}
			}},
		{"exhaustion", wire.ExecFailed, wire.ReasonDispatchExhausted, wire.CauseExecutionFailed, wire.EventExecutionFailed,
			func(c *Config) { c.DispatchMaxAttempts = 1 },
			func(fx *fixture, e *store.Execution, del *Delivery) {
				// Attempt 1 recorded progress, so its expiry leaves one more
				// attempt; the expiry of attempt 2 spends the budget.
				for i := 0; i < 2; i++ {
					fx.clk.Advance(fx.dispatch(del.DispatchID).LeaseExpiresAt.Sub(fx.clk.Now()))
					if err := fx.k.ReclaimLease(fx.ctx, store.DispatchRef{ID: del.DispatchID, ExecutionID: e.ID}); err != nil {
						fx.t.Fatal(err)
					}
					if i == 0 {
						fx.claim(e.ID)
					}
				}
			}},
	}
	for _, end := range endings {
		t.Run(end.name, func(t *testing.T) {
			opts := []func(*Options){withPolicy(denyTarget("forbidden", "r", ""))}
			if end.setup != nil {
				opts = append(opts, withConfig(end.setup))
			}
			fx := newFixture(t, opts...)
			e, del := fx.start("a1")
			done := fx.proceed(e, del, "done", `{}`)
			fx.outcome(e, del, done, true, `1`)
			open1 := fx.proceed(e, del, "open1", `{"i":1}`)
			denied := fx.submit(e, del, wire.KindToolCall, "forbidden", `{}`).StepID
			allowed := fx.proceed(e, del, "allowed", `{}`)
			fx.mutateStep(e.ID, allowed, func(s *store.Step) { s.Status = wire.StepAllowed })
			open2 := fx.proceed(e, del, "open2", `{}`)
			if _, ok := fx.counter(del, wire.KindToolCall, "open1", `{"i":1}`); !ok {
				t.Fatal("setup: no counter before the end")
			}
			ended := metric(fx.k.metrics.ExecutionsCompleted.WithLabelValues(end.status))
			seq := fx.lastSeq(e.ID)

			end.end(fx, e, del)

			now := fx.clk.Now()
			evs := fx.eventsAfter(e.ID, seq)
			var want []string
			if end.name == "exhaustion" {
				want = append(want, wire.EventDispatchLeaseExpired, wire.EventDispatchLeaseExpired)
			}
			want = append(want, end.event, wire.EventStepCancelled, wire.EventStepCancelled, wire.EventStepCancelled)
			wantTypes(t, evs, want...)
			evs = evs[len(evs)-3:]
			errJSON := fmt.Sprintf(`{"reason":%q}`, end.cause)
			for i, id := range []string{open1, allowed, open2} {
				s := fx.step(e.ID, id)
				if s.Status != wire.StepCancelled || string(s.Error) != errJSON || !s.CompletedAt.Equal(now) || s.TerminalSeq != evs[i].Seq {
					t.Fatalf("open step %d after the end = %+v", i, s)
				}
				if got := string(payloadField(t, evs[i], "step_id").Raw); got != fmt.Sprintf("%q", id) {
					t.Fatalf("step.cancelled %d names %s, want %s (recording order)", i, got, id)
				}
				if got := string(payloadField(t, evs[i], "error").Raw); got != errJSON {
					t.Fatalf("step.cancelled error = %s, want %s", got, errJSON)
				}
			}
			if s := fx.step(e.ID, done); s.Status != wire.StepSucceeded {
				t.Fatalf("a succeeded step became %s", s.Status)
			}
			if s := fx.step(e.ID, denied); s.Status != wire.StepDenied {
				t.Fatalf("a denied step became %s", s.Status)
			}
			ex := fx.exec(e.ID)
			if ex.Status != end.status || ex.FailureReason != end.reason || !ex.UpdatedAt.Equal(now) {
				t.Fatalf("execution = %s %q updated %v", ex.Status, ex.FailureReason, ex.UpdatedAt)
			}
			if d := fx.dispatch(del.DispatchID); d.Status != wire.DispatchRetired {
				t.Fatalf("dispatch is %s, want retired", d.Status)
			}
			for _, c := range []struct{ target, args string }{{"open1", `{"i":1}`}, {"done", `{}`}, {"open2", `{}`}} {
				if end.name == "exhaustion" {
					break // the second claim already reset them
				}
				if _, ok := fx.counter(del, wire.KindToolCall, c.target, c.args); ok {
					t.Fatalf("the counter of %s survived the end", c.target)
				}
			}
			if got := metric(fx.k.metrics.ExecutionsCompleted.WithLabelValues(end.status)); got != ended+1 {
				t.Fatalf("executions_completed_total{%s} moved by %v", end.status, got-ended)
			}

			// Nothing is ever appended after the terminal transaction.
			seq = ex.LastSeq
			fx.clk.Advance(time.Hour)
			c := Caller{Agent: "a1"}
			if dec := fx.submit(e, del, wire.KindToolCall, "late", `{}`); dec.Decision != wire.DecisionExecutionTerminal {
				t.Fatalf("late submit = %+v", dec)
			}
			if dec := fx.outcome(e, del, open1, true, `1`); dec.Decision != wire.DecisionExecutionTerminal {
				t.Fatalf("late outcome = %+v", dec)
			}
			wantCode(t, fx.k.Heartbeat(fx.ctx, c, e.ID, hdr(del)), wire.CodeExecutionTerminal)
			wantCode(t, fx.k.CancelExecution(fx.ctx, e.ID), wire.CodeExecutionTerminal)
			wantCode(t, fx.k.FailExecution(fx.ctx, c, e.ID, hdr(del), FailRequest{Reason: "x"}), wire.CodeExecutionTerminal)
			if err := fx.k.RecordDelivery(fx.ctx, del, DeliveryOutcome{HTTPStatus: 500}); err != nil {
				t.Fatal(err)
			}
			if err := fx.k.ReclaimLease(fx.ctx, store.DispatchRef{ID: del.DispatchID, ExecutionID: e.ID}); err != nil {
				t.Fatal(err)
			}
			if err := fx.k.ExpireDeadline(fx.ctx, e.ID); err != nil {
				t.Fatal(err)
			}
			if del, err := fx.k.ClaimDispatch(fx.ctx, store.DispatchRef{ID: del.DispatchID, ExecutionID: e.ID}); err != nil || del != nil {
				t.Fatalf("claim after the end = %+v, %v", del, err)
			}
			fx.noNewEvents(e.ID, seq)
		})
	}
}
