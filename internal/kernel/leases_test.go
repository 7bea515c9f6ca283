package kernel

// Tests of what an agent request proves about its attempt: fencing, the
// dispatch headers, lease renewal, and the stream side channel.

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/events"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// TestFencing covers the route table of docs/protocol/dispatch.md §11 for a request from an older
// attempt of the newest dispatch and from an older dispatch.
func TestFencing(t *testing.T) {
	type world struct {
		fx       *fixture
		e        *store.Execution
		old, cur DispatchHeaders
		running  string // a step started by the old attempt, still executing
		done     string // a step the old attempt completed
	}
	byAttempt := func(t *testing.T) world {
		fx := newFixture(t)
		e, del := fx.start("a1")
		running := fx.proceed(e, del, "running", `{}`)
		done := fx.proceed(e, del, "done", `{}`)
		fx.outcome(e, del, done, true, `1`)
		del2 := fx.reclaim(del)
		fx.ack(del2)
		return world{fx, e, hdr(del), hdr(del2), running, done}
	}
	byDispatch := func(t *testing.T) world {
		fx := newFixture(t)
		e, del := fx.start("a1")
		running := fx.proceed(e, del, "running", `{}`)
		done := fx.proceed(e, del, "done", `{}`)
		fx.outcome(e, del, done, true, `1`)
		fx.enqueue(e.ID)
		del2 := fx.claim(e.ID)
		fx.ack(del2)
		// Without the attempt header, the old dispatch id alone supersedes.
		return world{fx, e, DispatchHeaders{ID: del.DispatchID}, hdr(del2), running, done}
	}
	for name, build := range map[string]func(*testing.T) world{"older attempt": byAttempt, "older dispatch": byDispatch} {
		t.Run(name, func(t *testing.T) {
			w := build(t)
			fx, e := w.fx, w.e
			c := Caller{Agent: "a1"}
			fx.clk.Advance(10 * time.Second)
			curDispatch := fx.dispatch(w.cur.ID)
			superseded := metric(fx.k.metrics.DispatchSuperseded)
			seq := fx.lastSeq(e.ID)
			refusals := 0
			refused := func(err error) {
				t.Helper()
				wantMessage(t, err, wire.CodeLeaseSuperseded, "lease superseded")
				refusals++
			}

			_, err := fx.k.SubmitStep(fx.ctx, c, e.ID, w.old, req(t, wire.KindToolCall, "new", `{}`))
			refused(err)
			r := req(t, wire.KindToolCall, "running", `{}`)
			r.HasOccurrence = true
			_, err = fx.k.SubmitStep(fx.ctx, c, e.ID, w.old, r)
			refused(err)
			if _, ok := fx.counter(&Delivery{ExecutionID: e.ID, DispatchID: w.old.ID}, wire.KindToolCall, "new", `{}`); ok {
				t.Fatal("a superseded submit advanced a counter")
			}
			refused(fx.k.Heartbeat(fx.ctx, c, e.ID, w.old))
			refused(fx.k.CompleteExecution(fx.ctx, c, e.ID, w.old, CompleteRequest{Output: []byte(`1`)}))
			refused(fx.k.FailExecution(fx.ctx, c, e.ID, w.old, FailRequest{Reason: "stale"}))
			// A terminal step: the old attempt learns nothing from a replay.
			_, err = fx.k.RecordOutcome(fx.ctx, c, e.ID, w.done, w.old, OutcomeRequest{Succeeded: true})
			refused(err)
			fx.noNewEvents(e.ID, seq)
			if got := metric(fx.k.metrics.DispatchSuperseded); got != superseded+float64(refusals) {
				t.Fatalf("dispatch_superseded_total moved by %v, want %d", got-superseded, refusals)
			}
			if ex := fx.exec(e.ID); ex.Status != wire.ExecRunning {
				t.Fatalf("execution is %s after refused writes", ex.Status)
			}

			// A stream delta from the old attempt is still accepted.
			sub := fx.k.hub.SubscribeDeltas(e.ID)
			if err := fx.k.StreamDelta(fx.ctx, c, e.ID, w.running, w.old, 7, "tok"); err != nil {
				t.Fatalf("superseded delta: %v", err)
			}
			if d := <-sub.C; d != (events.Delta{StepID: w.running, Seq: 7, Data: "tok"}) {
				t.Fatalf("delta = %+v", d)
			}
			sub.Close()

			// The outcome of the effect the old attempt is still running is
			// recorded, without renewing or crediting the current attempt.
			dec, err := fx.k.RecordOutcome(fx.ctx, c, e.ID, w.running, w.old, OutcomeRequest{Succeeded: true, Value: []byte(`"ran"`)})
			if err != nil || dec.Decision != wire.DecisionRecorded {
				t.Fatalf("superseded outcome of an executing step = %+v, %v", dec, err)
			}
			wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepSucceeded)
			if st := fx.step(e.ID, w.running); st.Status != wire.StepSucceeded || string(st.Result) != `"ran"` {
				t.Fatalf("step = %+v", st)
			}
			after := fx.dispatch(w.cur.ID)
			if !after.LeaseExpiresAt.Equal(curDispatch.LeaseExpiresAt) || after.ProgressAttempt != curDispatch.ProgressAttempt {
				t.Fatalf("a superseded outcome renewed or credited the current dispatch: %+v -> %+v", curDispatch, after)
			}
			if old := fx.dispatch(w.old.ID); old.ID != w.cur.ID && old.Status != wire.DispatchRetired {
				t.Fatalf("the older dispatch is %s, want retired", old.Status)
			}

			// The current attempt is not fenced; a request naming the current
			// dispatch without an attempt is not superseded either.
			if err := fx.k.Heartbeat(fx.ctx, c, e.ID, w.cur); err != nil {
				t.Fatalf("current heartbeat: %v", err)
			}
			if err := fx.k.Heartbeat(fx.ctx, c, e.ID, DispatchHeaders{ID: w.cur.ID}); err != nil {
				t.Fatalf("current heartbeat without attempt: %v", err)
			}
			if err := fx.k.Heartbeat(fx.ctx, c, e.ID, DispatchHeaders{}); err != nil {
				t.Fatalf("heartbeat naming no dispatch: %v", err)
			}

			// execution_terminal wins over lease_superseded.
			if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
				t.Fatal(err)
			}
			dec, err = fx.k.SubmitStep(fx.ctx, c, e.ID, w.old, req(t, wire.KindToolCall, "new", `{}`))
			if err != nil || dec.Decision != wire.DecisionExecutionTerminal {
				t.Fatalf("stale submit on a terminal execution = %+v, %v", dec, err)
			}
			wantCode(t, fx.k.Heartbeat(fx.ctx, c, e.ID, w.old), wire.CodeExecutionTerminal)
			wantCode(t, fx.k.CompleteExecution(fx.ctx, c, e.ID, w.old, CompleteRequest{}), wire.CodeExecutionTerminal)
			wantCode(t, fx.k.FailExecution(fx.ctx, c, e.ID, w.old, FailRequest{Reason: ""}), wire.CodeExecutionTerminal)
			dec, err = fx.k.RecordOutcome(fx.ctx, c, e.ID, w.done, w.old, OutcomeRequest{Succeeded: true})
			if err != nil || dec.Decision != wire.DecisionExecutionTerminal {
				t.Fatalf("stale outcome on a terminal execution = %+v, %v", dec, err)
			}
		})
	}
}

func TestDispatchHeaderChecks(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.RequireDispatchHeaders = true }))
	e, del := fx.start("a1")
	_, otherDel := fx.start("a1")
	c := Caller{Agent: "a1"}
	unknown := "0190aaaa-0000-7000-8000-000000000000"
	cases := []struct {
		name  string
		h     DispatchHeaders
		msg   string
		field string
	}{
		{"both missing", DispatchHeaders{}, "validation error: missing dispatch_id", wire.HeaderDispatchID},
		{"attempt missing", DispatchHeaders{ID: del.DispatchID}, "validation error: missing dispatch attempt", wire.HeaderDispatchAttempt},
		{"id missing", DispatchHeaders{Attempt: 1}, "validation error: missing dispatch_id", wire.HeaderDispatchID},
		{"unknown id", DispatchHeaders{ID: unknown, Attempt: 1}, "validation error: unknown dispatch_id", wire.HeaderDispatchID},
		{"foreign id", DispatchHeaders{ID: otherDel.DispatchID, Attempt: 1}, "validation error: dispatch_id belongs to another execution", wire.HeaderDispatchID},
		{"attempt ahead", DispatchHeaders{ID: del.DispatchID, Attempt: 2}, "validation error: dispatch attempt is ahead of the kernel", wire.HeaderDispatchAttempt},
	}
	s := fx.proceed(e, del, "x", `{}`)
	seq := fx.lastSeq(e.ID)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			check := func(what string, err error) {
				t.Helper()
				ke := wantCode(t, err, wire.CodeValidation)
				if ke.Message != tc.msg || ke.Field != tc.field {
					t.Fatalf("%s: %q (field %q), want %q (field %q)", what, ke.Message, ke.Field, tc.msg, tc.field)
				}
			}
			check("heartbeat", fx.k.Heartbeat(fx.ctx, c, e.ID, tc.h))
			check("complete", fx.k.CompleteExecution(fx.ctx, c, e.ID, tc.h, CompleteRequest{}))
			check("fail", fx.k.FailExecution(fx.ctx, c, e.ID, tc.h, FailRequest{Reason: ""}))
			_, err := fx.k.RecordOutcome(fx.ctx, c, e.ID, s, tc.h, OutcomeRequest{Succeeded: true})
			check("outcome", err)
			check("delta", fx.k.StreamDelta(fx.ctx, c, e.ID, s, tc.h, 0, "x"))
			if tc.h.ID != "" {
				_, err := fx.k.SubmitStep(fx.ctx, c, e.ID, tc.h, req(t, wire.KindToolCall, "y", ""))
				check("submit", err)
			}
		})
	}
	fx.noNewEvents(e.ID, seq)

	// The dispatch checks come after the existence, ownership and terminal
	// checks.
	wantCode(t, fx.k.Heartbeat(fx.ctx, c, unknown, DispatchHeaders{}), wire.CodeNotFound)
	wantCode(t, fx.k.Heartbeat(fx.ctx, Caller{Agent: "zz"}, e.ID, DispatchHeaders{}), wire.CodeForbidden)
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	wantCode(t, fx.k.Heartbeat(fx.ctx, c, e.ID, DispatchHeaders{}), wire.CodeExecutionTerminal)
	wantCode(t, fx.k.CompleteExecution(fx.ctx, c, e.ID, DispatchHeaders{}, CompleteRequest{}), wire.CodeExecutionTerminal)
}

func TestLeaseRenewal(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	c := Caller{Agent: "a1"}
	lease := func() time.Time { return fx.dispatch(del.DispatchID).LeaseExpiresAt }
	want := func(what string, at time.Time) {
		t.Helper()
		if got := lease(); !got.Equal(at) {
			t.Fatalf("%s: lease expires at %v, want %v", what, got, at)
		}
	}
	want("after ack", t0.Add(2*time.Minute))

	fx.clk.Advance(999 * time.Millisecond)
	if err := fx.k.Heartbeat(fx.ctx, c, e.ID, hdr(del)); err != nil {
		t.Fatal(err)
	}
	want("heartbeat < 1 s later is skipped", t0.Add(2*time.Minute))
	fx.clk.Advance(time.Millisecond)
	if err := fx.k.Heartbeat(fx.ctx, c, e.ID, hdr(del)); err != nil {
		t.Fatal(err)
	}
	want("heartbeat 1 s later renews", t0.Add(2*time.Minute+time.Second))

	fx.clk.Advance(4 * time.Second) // t0+5s
	s := fx.proceed(e, del, "x", `{}`)
	want("submit renews", t0.Add(2*time.Minute+5*time.Second))

	fx.clk.Advance(5 * time.Second) // t0+10s
	r := req(t, wire.KindToolCall, "x", `{}`)
	r.HasOccurrence = true
	fx.submitReq(e.ID, hdr(del), r)
	want("a replayed submit renews", t0.Add(2*time.Minute+10*time.Second))

	fx.clk.Advance(5 * time.Second) // t0+15s
	fx.outcome(e, del, s, true, `1`)
	want("a recorded outcome renews", t0.Add(2*time.Minute+15*time.Second))
	if d := fx.dispatch(del.DispatchID); d.ProgressAttempt != 1 {
		t.Fatalf("progress_attempt = %d after a recorded outcome, want 1", d.ProgressAttempt)
	}

	fx.clk.Advance(5 * time.Second) // t0+20s
	fx.outcome(e, del, s, true, `1`)
	want("a replayed outcome renews nothing", t0.Add(2*time.Minute+15*time.Second))
	_, err := fx.k.SubmitStep(fx.ctx, c, e.ID, DispatchHeaders{ID: del.DispatchID, Attempt: 5}, req(t, wire.KindToolCall, "x", ""))
	wantCode(t, err, wire.CodeValidation)
	want("an error answer renews nothing", t0.Add(2*time.Minute+15*time.Second))
	if err := fx.k.StreamDelta(fx.ctx, c, e.ID, s, hdr(del), 1, "x"); err != nil {
		t.Fatal(err)
	}
	want("a stream delta renews nothing", t0.Add(2*time.Minute+15*time.Second))
	if _, err := fx.k.GetExecution(fx.ctx, c, e.ID); err != nil {
		t.Fatal(err)
	}
	if err := fx.k.Heartbeat(fx.ctx, c, e.ID, DispatchHeaders{}); err != nil {
		t.Fatal(err)
	}
	want("a heartbeat naming no dispatch renews the live one", t0.Add(2*time.Minute+20*time.Second))
}

func TestRenewalNeedsAnInFlightDispatch(t *testing.T) {
	fx := newFixture(t)
	e := func() *store.Execution { fx.agent("a1"); return fx.create("a1") }()
	del := fx.claim(e.ID)
	c := Caller{Agent: "a1"}
	if err := fx.k.RecordDelivery(fx.ctx, del, DeliveryOutcome{HTTPStatus: 500, Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	d := fx.dispatch(del.DispatchID)
	if d.Status != wire.DispatchFailed || !d.LeaseExpiresAt.IsZero() {
		t.Fatalf("dispatch after a failed delivery = %+v", d)
	}
	// The agent ran anyway: its requests are answered, nothing is renewed,
	// but a recorded outcome still counts as progress (docs/protocol/dispatch.md §7).
	fx.clk.Advance(5 * time.Second)
	if err := fx.k.Heartbeat(fx.ctx, c, e.ID, hdr(del)); err != nil {
		t.Fatalf("heartbeat with nothing to renew: %v", err)
	}
	s := fx.proceed(fx.exec(e.ID), del, "x", `{}`)
	fx.outcome(fx.exec(e.ID), del, s, true, `1`)
	d = fx.dispatch(del.DispatchID)
	if d.Status != wire.DispatchFailed || !d.LeaseExpiresAt.IsZero() || d.ProgressAttempt != 1 {
		t.Fatalf("dispatch = %+v, want failed, no lease, progress_attempt 1", d)
	}
}

func TestAgentLeaseTimeout(t *testing.T) {
	fx := newFixture(t)
	if _, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a1", WebhookURL: "http://h/x", Secret: "s", LeaseTimeoutSeconds: 300}); err != nil {
		t.Fatal(err)
	}
	e := fx.create("a1")
	del := fx.claim(e.ID)
	if del.LeaseTimeout != 300 {
		t.Fatalf("delivery lease = %d, want the agent's 300", del.LeaseTimeout)
	}
	d := fx.dispatch(del.DispatchID)
	if d.LeaseTimeout != 300 || !d.LeaseExpiresAt.Equal(t0.Add(300*time.Second)) {
		t.Fatalf("dispatch lease %d expiring %v", d.LeaseTimeout, d.LeaseExpiresAt)
	}
	// A changed agent lease applies from the next claim only.
	if _, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a1", WebhookURL: "http://h/x", Secret: "s", LeaseTimeoutSeconds: 400}); err != nil {
		t.Fatal(err)
	}
	fx.clk.Advance(10 * time.Second)
	if err := fx.k.Heartbeat(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del)); err != nil {
		t.Fatal(err)
	}
	if got := fx.dispatch(del.DispatchID).LeaseExpiresAt; !got.Equal(t0.Add(310 * time.Second)) {
		t.Fatalf("renewal used another lease: expires %v", got)
	}
	del2 := fx.reclaim(del)
	if del2.LeaseTimeout != 400 {
		t.Fatalf("next claim lease = %d, want 400", del2.LeaseTimeout)
	}
	// Back to the kernel default.
	if _, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a1", WebhookURL: "http://h/x", Secret: "s"}); err != nil {
		t.Fatal(err)
	}
	if del3 := fx.reclaim(del2); del3.LeaseTimeout != 120 {
		t.Fatalf("lease without an agent value = %d, want the default 120", del3.LeaseTimeout)
	}
}

func TestStreamDelta(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	other, _ := fx.start("a2")
	s := fx.proceed(e, del, "llm", `{}`)
	c := Caller{Agent: "a1"}
	sub := fx.k.hub.SubscribeDeltas(e.ID)
	defer sub.Close()
	seq := fx.lastSeq(e.ID)

	if err := fx.k.StreamDelta(fx.ctx, c, e.ID, s, hdr(del), 0, strings.Repeat("é", 3500)); err != nil {
		t.Fatalf("7,000 bytes: %v", err)
	}
	if d := <-sub.C; d.Seq != 0 || len(d.Data) != 7000 {
		t.Fatalf("delta = seq %d, %d bytes", d.Seq, len(d.Data))
	}
	wantCode(t, fx.k.StreamDelta(fx.ctx, c, e.ID, s, hdr(del), 1, strings.Repeat("x", 7001)), wire.CodeValidation)
	wantCode(t, fx.k.StreamDelta(fx.ctx, c, e.ID, s, hdr(del), -1, "x"), wire.CodeValidation)
	wantCode(t, fx.k.StreamDelta(fx.ctx, c, e.ID, s, hdr(del), 1, "\xff"), wire.CodeValidation)
	wantCode(t, fx.k.StreamDelta(fx.ctx, c, e.ID, strings.Repeat("a", 64), hdr(del), 1, "x"), wire.CodeNotFound)
	wantCode(t, fx.k.StreamDelta(fx.ctx, c, "0190aaaa-0000-7000-8000-000000000000", s, hdr(del), 1, "x"), wire.CodeNotFound)
	wantCode(t, fx.k.StreamDelta(fx.ctx, Caller{Agent: "a2"}, e.ID, s, DispatchHeaders{}, 1, "x"), wire.CodeForbidden)
	wantCode(t, fx.k.StreamDelta(fx.ctx, Caller{Agent: "a2"}, other.ID, s, DispatchHeaders{}, 1, "x"), wire.CodeNotFound)
	if len(sub.C) != 0 {
		t.Fatal("a refused delta was published")
	}
	fx.noNewEvents(e.ID, seq)
	// The step's state and the execution's status are not checked.
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	if err := fx.k.StreamDelta(fx.ctx, c, e.ID, s, hdr(del), 2, "late"); err != nil {
		t.Fatalf("delta on a terminal execution: %v", err)
	}
	if d := <-sub.C; d.Data != "late" {
		t.Fatalf("delta = %+v", d)
	}
}

func TestGetStepAndSteps(t *testing.T) {
	fx := newFixture(t, withPolicy(denyTarget("bad", "r", "")))
	e, del := fx.start("a1")
	other, _ := fx.start("a2")
	ids := []string{fx.proceed(e, del, "a", `{}`), fx.proceed(e, del, "b", `{}`)}
	ids = append(ids, fx.submit(e, del, wire.KindToolCall, "bad", `{}`).StepID)
	fx.outcome(e, del, ids[0], true, `1`)

	s, err := fx.k.GetStep(fx.ctx, Caller{Agent: "a1"}, e.ID, ids[1])
	if err != nil || s.StepID != ids[1] {
		t.Fatalf("GetStep = %+v, %v", s, err)
	}
	_, err = fx.k.GetStep(fx.ctx, Caller{}, other.ID, ids[1])
	wantMessage(t, err, wire.CodeNotFound, "step not found")
	_, err = fx.k.GetStep(fx.ctx, Caller{Agent: "a2"}, e.ID, ids[1])
	wantCode(t, err, wire.CodeForbidden)

	collect := func(filter string) []string {
		t.Helper()
		var got []string
		err := fx.k.EachStepPage(fx.ctx, Caller{}, e.ID, filter, func(page []*store.Step) error {
			for _, s := range page {
				got = append(got, s.StepID)
			}
			return nil
		})
		if err != nil {
			t.Fatalf("EachStepPage(%q): %v", filter, err)
		}
		return got
	}
	for filter, want := range map[string][]string{
		"":                  ids,
		"terminal":          {ids[0], ids[2]},
		"pending":           {ids[1]},
		wire.StepExecuting:  {ids[1]},
		wire.StepDenied:     {ids[2]},
		wire.StepCancelled:  nil,
		wire.StepSucceeded:  {ids[0]},
		wire.StepProposed:   nil,
		wire.StepAllowed:    nil,
		wire.StepFailed:     nil,
		"awaiting_approval": nil,
	} {
		if got := collect(filter); !slices.Equal(got, want) {
			t.Errorf("filter %q = %v, want %v", filter, got, want)
		}
	}
	err = fx.k.EachStepPage(fx.ctx, Caller{}, e.ID, "bogus", func([]*store.Step) error { return nil })
	wantCode(t, err, wire.CodeValidation)
	err = fx.k.EachStepPage(fx.ctx, Caller{Agent: "a2"}, e.ID, "", func([]*store.Step) error { return nil })
	wantCode(t, err, wire.CodeForbidden)
	err = fx.k.EachStepPage(fx.ctx, Caller{}, "0190aaaa-0000-7000-8000-000000000000", "", func([]*store.Step) error { return nil })
	wantCode(t, err, wire.CodeNotFound)
	stop := fmt.Errorf("stop")
	if err := fx.k.EachStepPage(fx.ctx, Caller{}, e.ID, "", func([]*store.Step) error { return stop }); err != stop {
		t.Fatalf("callback error = %v, want it returned", err)
	}
}
