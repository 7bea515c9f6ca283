package kernel

// Carried outcomes (docs/protocol/steps.md §13): a submit, execution complete
// or fail that carries an earlier step's outcome leaves the store exactly as
// the outcome's own request followed by the carrier would have, in one
// transaction when both are accepted.

import (
	"fmt"
	"testing"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

func carried(stepID string, ok bool, value string) *CarriedOutcome {
	co := &CarriedOutcome{StepID: stepID, OutcomeRequest: OutcomeRequest{Succeeded: ok}}
	if value != "" {
		co.Value = []byte(value)
	}
	return co
}

// carry submits a tool call to target carrying co, as attempt h.
func (fx *fixture) carry(e *store.Execution, h DispatchHeaders, target string, co *CarriedOutcome) (*Decision, error) {
	r := req(fx.t, wire.KindToolCall, target, `{}`)
	r.Outcome = co
	return fx.k.SubmitStep(fx.ctx, Caller{Agent: e.AgentID}, e.ID, h, r)
}

func TestCarriedOutcomeOneTransaction(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	a := fx.proceed(e, del, "a", `{}`)
	seq := fx.lastSeq(e.ID)
	separate := metric(fx.k.metrics.StepOutcomes.WithLabelValues("separate"))
	carriedCount := metric(fx.k.metrics.StepOutcomes.WithLabelValues("carried"))
	fx.clk.Advance(3 * 1e9)

	dec, err := fx.carry(e, hdr(del), "b", carried(a, true, `{"n":1}`))
	if err != nil || dec.Decision != wire.DecisionProceed || dec.StepID == "" || dec.StepID == a {
		t.Fatalf("carrying submit = %+v, %v; want proceed for a new step", dec, err)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventStepSucceeded, wire.EventStepProposed, wire.EventStepAllowed, wire.EventStepExecuting)
	wantPayload(t, evs[0], "{"+stepJSON(a, wire.KindToolCall, "a")+"}")
	for _, ev := range evs {
		if !ev.OccurredAt.Equal(evs[0].OccurredAt) {
			t.Fatalf("events of one transaction carry different times: %v and %v", ev.OccurredAt, evs[0].OccurredAt)
		}
	}
	s := fx.step(e.ID, a)
	if s.Status != wire.StepSucceeded || string(s.Result) != `{"n":1}` || !s.CompletedAt.Equal(fx.clk.Now()) {
		t.Fatalf("carried step = %s %s at %v", s.Status, s.Result, s.CompletedAt)
	}
	d := fx.dispatch(del.DispatchID)
	if d.ProgressAttempt != del.Attempt {
		t.Fatalf("progress_attempt = %d, want %d (the outcome counts as progress)", d.ProgressAttempt, del.Attempt)
	}
	if want := fx.clk.Now().Add(2 * 60 * 1e9); !d.LeaseExpiresAt.Equal(want) {
		t.Fatalf("lease expires %v, want %v", d.LeaseExpiresAt, want)
	}
	if metric(fx.k.metrics.StepOutcomes.WithLabelValues("carried")) != carriedCount+1 ||
		metric(fx.k.metrics.StepOutcomes.WithLabelValues("separate")) != separate {
		t.Fatal("step_outcomes_total did not count one carried outcome")
	}

	// A failure travels the same way, with its error in the event.
	b := dec.StepID
	dec, err = fx.carry(e, hdr(del), "c", carried(b, false, `{"message":"boom","type":"ValueError"}`))
	if err != nil || dec.Decision != wire.DecisionProceed {
		t.Fatalf("carrying a failure = %+v, %v", dec, err)
	}
	if s := fx.step(e.ID, b); s.Status != wire.StepFailed || string(s.Error) != `{"message":"boom","type":"ValueError"}` {
		t.Fatalf("failed step = %s %s", s.Status, s.Error)
	}
}

func TestCarriedOutcomeRetriedRequest(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	a := fx.proceed(e, del, "a", `{}`)
	r := req(t, wire.KindToolCall, "b", `{}`)
	r.Outcome, r.HasOccurrence = carried(a, true, `{"n": 1}`), true
	first := fx.submitReq(e.ID, hdr(del), r)
	seq := fx.lastSeq(e.ID)

	// The answer was lost and the SDK sends the same request again: the
	// outcome replays as sent (whitespace aside) and the submit is the
	// same-attempt retry, so nothing is written.
	r.Outcome = carried(a, true, `{"n":1}`)
	again := fx.submitReq(e.ID, hdr(del), r)
	if again.Decision != wire.DecisionProceed || again.StepID != first.StepID {
		t.Fatalf("retry = %+v, want proceed for %s", again, first.StepID)
	}
	fx.noNewEvents(e.ID, seq)
}

func TestCarriedOutcomeRecordedDifferently(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	a := fx.proceed(e, del, "a", `{}`)
	fx.outcome(e, del, a, true, `1`)
	seq := fx.lastSeq(e.ID)
	for _, co := range []*CarriedOutcome{carried(a, true, `2`), carried(a, false, `1`)} {
		_, err := fx.carry(e, hdr(del), "b", co)
		wantMessage(t, err, wire.CodeConflict, "conflict: the step's outcome was recorded differently")
	}
	fx.noNewEvents(e.ID, seq)
	if _, found := fx.counter(del, wire.KindToolCall, "b", `{}`); found {
		t.Fatal("a refused carrier advanced the occurrence counter")
	}
	if s := fx.step(e.ID, a); string(s.Result) != `1` {
		t.Fatalf("stored result = %s", s.Result)
	}
}

func TestCarriedOutcomeSupersededAttempt(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	a := fx.proceed(e, del, "a", `{}`)
	next := fx.reclaim(del)
	before := fx.dispatch(del.DispatchID)
	superseded := metric(fx.k.metrics.DispatchSuperseded)

	// The old attempt's effect ran: its outcome is recorded, as a separate
	// complete from a superseded attempt would be; its submit is refused.
	_, err := fx.carry(e, hdr(del), "b", carried(a, true, `"old"`))
	wantCode(t, err, wire.CodeLeaseSuperseded)
	if s := fx.step(e.ID, a); s.Status != wire.StepSucceeded || string(s.Result) != `"old"` {
		t.Fatalf("step a = %s %s, want succeeded with the old attempt's result", s.Status, s.Result)
	}
	if _, found := fx.counter(del, wire.KindToolCall, "b", `{}`); found {
		t.Fatal("the refused submit advanced a counter")
	}
	d := fx.dispatch(del.DispatchID)
	if d.ProgressAttempt != before.ProgressAttempt || !d.LeaseExpiresAt.Equal(before.LeaseExpiresAt) {
		t.Fatalf("a superseded carrier renewed or progressed the dispatch: %+v", d)
	}
	if metric(fx.k.metrics.DispatchSuperseded) != superseded+1 {
		t.Fatal("the refusal was not counted")
	}

	// Once the step is terminal, a superseded carrier writes nothing at all.
	seq := fx.lastSeq(e.ID)
	_, err = fx.carry(e, hdr(del), "b", carried(a, true, `"old"`))
	wantCode(t, err, wire.CodeLeaseSuperseded)
	fx.noNewEvents(e.ID, seq)

	// The current attempt replays a's recorded outcome.
	if dec := fx.submit(e, next, wire.KindToolCall, "a", `{}`); dec.Decision != wire.DecisionReplay || string(dec.Result) != `"old"` {
		t.Fatalf("the new attempt's submit of a = %+v", dec)
	}
}

func TestCarriedOutcomeRefusedSubmitKeepsOutcome(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	a := fx.proceed(e, del, "a", `{}`)
	r := req(t, wire.KindToolCall, "b", `{}`)
	r.Resources = []string{"nowhere"}
	r.Outcome = carried(a, true, `1`)
	_, err := fx.k.SubmitStep(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), r)
	wantMessage(t, err, wire.CodeValidation, `validation error: unknown resource key "nowhere"`)
	if s := fx.step(e.ID, a); s.Status != wire.StepSucceeded {
		t.Fatalf("step a is %s after its carrier was refused; the outcome must stand", s.Status)
	}

	c := fx.proceed(e, del, "c", `{}`)
	r = req(t, wire.KindToolCall, "d", `{}`)
	r.HasOccurrence, r.Occurrence = true, 5
	r.Outcome = carried(c, false, `"e"`)
	_, err = fx.k.SubmitStep(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), r)
	wantMessage(t, err, wire.CodeValidation, "validation error: occurrence is ahead of the kernel")
	if s := fx.step(e.ID, c); s.Status != wire.StepFailed {
		t.Fatalf("step c is %s", s.Status)
	}
}

func TestCarriedOutcomeRefusedOutcomeStopsSubmit(t *testing.T) {
	pol := policyFunc(func(_ string, f StepFacts) PolicyResult {
		if f.Target == "send" {
			return PolicyResult{Decision: PolicyRequireApproval, RuleID: "ask"}
		}
		return PolicyResult{Decision: PolicyAllow}
	})
	fx := newFixture(t, withPolicy(pol))
	e, del := fx.start("a1")
	seq := fx.lastSeq(e.ID)
	missing := fmt.Sprintf("%064d", 7)
	_, err := fx.carry(e, hdr(del), "b", carried(missing, true, `1`))
	wantMessage(t, err, wire.CodeNotFound, "step not found")
	fx.noNewEvents(e.ID, seq)

	a := fx.proceed(e, del, "a", `{}`)
	blocked := fx.submit(e, del, wire.KindToolCall, "send", `{}`)
	seq = fx.lastSeq(e.ID)
	_, err = fx.carry(e, hdr(del), "b", carried(blocked.StepID, true, `1`))
	wantMessage(t, err, wire.CodeConflict, "conflict: step is not executing")
	fx.noNewEvents(e.ID, seq)

	// An executing step of a blocked execution can still be completed; the
	// submit it rides on answers execution_blocked.
	dec, err := fx.carry(e, hdr(del), "b", carried(a, true, `1`))
	if err != nil || dec.Decision != wire.DecisionExecutionBlocked {
		t.Fatalf("carrier in a blocked execution = %+v, %v", dec, err)
	}
	if s := fx.step(e.ID, a); s.Status != wire.StepSucceeded {
		t.Fatalf("step a = %s", s.Status)
	}
}

func TestCarriedOutcomeTerminalExecution(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	a := fx.proceed(e, del, "a", `{}`)
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	seq := fx.lastSeq(e.ID)
	dec, err := fx.carry(e, hdr(del), "b", carried(a, true, `1`))
	if err != nil || dec.Decision != wire.DecisionExecutionTerminal {
		t.Fatalf("carrier after cancel = %+v, %v", dec, err)
	}
	err = fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Outcome: carried(a, true, `1`)})
	wantCode(t, err, wire.CodeExecutionTerminal)
	fx.noNewEvents(e.ID, seq)
}

func TestCarriedOutcomeStorageLimits(t *testing.T) {
	t.Run("the submit crosses the limit", func(t *testing.T) {
		fx := newFixture(t, withConfig(func(c *Config) { c.MaxStepsPerExecution = 1 }))
		e, del := fx.start("a1")
		a := fx.proceed(e, del, "a", `{}`)
		seq := fx.lastSeq(e.ID)
		dec, err := fx.carry(e, hdr(del), "b", carried(a, true, `1`))
		if err != nil || dec.Decision != wire.DecisionExecutionTerminal {
			t.Fatalf("carrier over the step limit = %+v, %v", dec, err)
		}
		// As with two requests: a's outcome first, then the failure.
		wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepSucceeded, wire.EventExecutionFailed)
		if ex := fx.exec(e.ID); ex.Status != wire.ExecFailed || ex.FailureReason != wire.ReasonStorageLimitExceeded || ex.StepCount != 1 {
			t.Fatalf("execution = %s %q with %d steps", ex.Status, ex.FailureReason, ex.StepCount)
		}
	})
	t.Run("the outcome crosses the limit", func(t *testing.T) {
		const limit = 4096
		fx := newFixture(t, withConfig(func(c *Config) { c.MaxExecutionBytes = limit }))
		e, del := fx.start("a1")
		a := fx.proceed(e, del, "a", `{}`)
		seq := fx.lastSeq(e.ID)
		big := fmt.Sprintf("%q", make([]byte, limit))
		dec, err := fx.carry(e, hdr(del), "b", carried(a, true, big))
		if err != nil || dec.Decision != wire.DecisionExecutionTerminal {
			t.Fatalf("carrier with an outcome over the byte limit = %+v, %v", dec, err)
		}
		// As a separate complete: the outcome is not recorded and the step is
		// cancelled with the execution.
		wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventExecutionFailed, wire.EventStepCancelled)
		if s := fx.step(e.ID, a); s.Status != wire.StepCancelled {
			t.Fatalf("step a = %s", s.Status)
		}
	})
}

func TestCarriedOutcomeOnExecutionEnd(t *testing.T) {
	t.Run("complete", func(t *testing.T) {
		fx := newFixture(t)
		e, del := fx.start("a1")
		a := fx.proceed(e, del, "a", `{}`)
		seq := fx.lastSeq(e.ID)
		err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Output: []byte(`"done"`), Outcome: carried(a, true, `1`)})
		if err != nil {
			t.Fatal(err)
		}
		wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepSucceeded, wire.EventExecutionCompleted)
		if s := fx.step(e.ID, a); s.Status != wire.StepSucceeded || string(s.Result) != `1` {
			t.Fatalf("step a = %s %s", s.Status, s.Result)
		}
	})
	t.Run("fail", func(t *testing.T) {
		fx := newFixture(t)
		e, del := fx.start("a1")
		a := fx.proceed(e, del, "a", `{}`)
		seq := fx.lastSeq(e.ID)
		err := fx.k.FailExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), FailRequest{Reason: "tool_error: a: boom", Outcome: carried(a, false, `{"message":"boom"}`)})
		if err != nil {
			t.Fatal(err)
		}
		wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepFailed, wire.EventExecutionFailed)
		if ex := fx.exec(e.ID); ex.FailureReason != "tool_error: a: boom" {
			t.Fatalf("failure reason %q", ex.FailureReason)
		}
	})
	t.Run("superseded", func(t *testing.T) {
		fx := newFixture(t)
		e, del := fx.start("a1")
		a := fx.proceed(e, del, "a", `{}`)
		fx.reclaim(del)
		err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Outcome: carried(a, true, `1`)})
		wantCode(t, err, wire.CodeLeaseSuperseded)
		if s := fx.step(e.ID, a); s.Status != wire.StepSucceeded {
			t.Fatalf("step a = %s; the superseded attempt's outcome must stand", s.Status)
		}
		if ex := fx.exec(e.ID); ex.Status != wire.ExecRunning {
			t.Fatalf("execution = %s", ex.Status)
		}
	})
	t.Run("recorded differently", func(t *testing.T) {
		fx := newFixture(t)
		e, del := fx.start("a1")
		a := fx.proceed(e, del, "a", `{}`)
		fx.outcome(e, del, a, true, `1`)
		err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Outcome: carried(a, true, `2`)})
		wantCode(t, err, wire.CodeConflict)
		if ex := fx.exec(e.ID); ex.Status != wire.ExecRunning {
			t.Fatalf("execution = %s", ex.Status)
		}
	})
	t.Run("the completion crosses the limit", func(t *testing.T) {
		const limit = 4096
		fx := newFixture(t, withConfig(func(c *Config) { c.MaxExecutionBytes = limit }))
		e, del := fx.start("a1")
		a := fx.proceed(e, del, "a", `{}`)
		seq := fx.lastSeq(e.ID)
		big := fmt.Sprintf("%q", make([]byte, limit))
		err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{Output: []byte(big), Outcome: carried(a, true, `1`)})
		wantCode(t, err, wire.CodeExecutionTerminal)
		wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepSucceeded, wire.EventExecutionFailed)
	})
}

func TestCarriedOutcomeCaptures(t *testing.T) {
	r := rsStart(t)
	r.register("ws", false, 1)
	dec := r.submit(wire.KindToolCall, "write", "ws")
	if dec.Decision != wire.DecisionProceed || len(dec.Resources) != 1 || !dec.Resources[0].Due {
		t.Fatalf("write = %+v, want a due capture", dec)
	}
	gen := dec.Resources[0].Generation
	seq := r.fx.lastSeq(r.id)
	co := carried(dec.StepID, true, `"ok"`)
	co.Captures = Captures{Captures: []Capture{{Key: "ws", Generation: gen, Ref: "ref-1"}}}
	next, err := r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, hdr(r.del), SubmitRequest{Kind: wire.KindToolCall, Target: "read", Outcome: co})
	if err != nil || next.Decision != wire.DecisionProceed {
		t.Fatalf("carrier = %+v, %v", next, err)
	}
	// The capture is processed after the outcome and before the next start,
	// so it is current, not stale.
	wantTypes(t, r.fx.eventsAfter(r.id, seq), wire.EventStepSucceeded, EventResourceCheckpointed,
		wire.EventStepProposed, wire.EventStepAllowed, wire.EventStepExecuting)
}
