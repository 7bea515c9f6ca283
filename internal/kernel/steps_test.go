package kernel

import (
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

const indeterminateJSON = `{"message":"outcome unknown: this may already have taken effect. Check the state before continuing.","reason":"indeterminate"}`

func stepJSON(stepID, kind, target string) string {
	return fmt.Sprintf(`"step_id":%q,"step_type":%q,"target":%q`, stepID, kind, target)
}

func TestSubmitAllowSequence(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	before := e.LastSeq
	replayMiss := metric(fx.k.metrics.ReplayTotal.WithLabelValues("false"))
	toolSteps := metric(fx.k.metrics.StepsSubmitted.WithLabelValues(wire.KindToolCall))
	allowDecisions := metric(fx.k.metrics.PolicyDecisions.WithLabelValues(PolicyAllow))

	fx.clk.Advance(1500 * time.Millisecond)
	args := `{ "path" : "/tmp" }`
	dec := fx.submit(e, del, wire.KindToolCall, "read", args)
	wantID := identity.StepID(e.ID, wire.KindToolCall, "read", argsHash(t, args), 0)
	if dec.Decision != wire.DecisionProceed || dec.StepID != wantID || dec.Occurrence != 0 {
		t.Fatalf("decision = %+v, want proceed for %s at occurrence 0", dec, wantID)
	}
	if dec.Resources == nil || len(dec.Resources) != 0 {
		t.Fatalf("proceed resources = %#v, want an empty, non-nil list", dec.Resources)
	}
	evs := fx.eventsAfter(e.ID, before)
	wantTypes(t, evs, wire.EventStepProposed, wire.EventStepAllowed, wire.EventStepExecuting)
	base := stepJSON(wantID, wire.KindToolCall, "read")
	wantPayload(t, evs[0], "{"+base+"}")
	wantPayload(t, evs[1], `{"rule_id":"permissive",`+base+"}")
	wantPayload(t, evs[2], "{"+base+"}")
	for i, ev := range evs {
		if ev.Seq != before+int64(i)+1 || !ev.OccurredAt.Equal(fx.clk.Now()) {
			t.Fatalf("event %d: seq %d at %v; want seq %d at %v", i, ev.Seq, ev.OccurredAt, before+int64(i)+1, fx.clk.Now())
		}
	}

	s := fx.step(e.ID, wantID)
	if s.Status != wire.StepExecuting || string(s.Args) != args || s.ArgsHash != argsHash(t, args) || s.Occurrence != 0 ||
		s.Idempotency != wire.SafeToRetry || s.Kind != wire.KindToolCall || s.Target != "read" || s.Order != 1 {
		t.Fatalf("stored step = %+v", s)
	}
	if !s.StartedAt.Equal(fx.clk.Now()) || !s.CompletedAt.IsZero() || s.DispatchID != del.DispatchID || s.Attempt != 1 {
		t.Fatalf("step started %v completed %v by %s/%d", s.StartedAt, s.CompletedAt, s.DispatchID, s.Attempt)
	}
	if s.Resources == nil || len(s.Resources) != 0 {
		t.Fatalf("step resources = %#v, want []", s.Resources)
	}
	ex := fx.exec(e.ID)
	if ex.StepCount != 1 || ex.StepOrder != 1 || ex.LastSeq != before+3 {
		t.Fatalf("execution bookkeeping: steps %d order %d last seq %d", ex.StepCount, ex.StepOrder, ex.LastSeq)
	}
	var payloadBytes int64
	for _, ev := range evs {
		payloadBytes += int64(len(ev.Payload))
	}
	if want := e.ByteCount + int64(len(args)) + payloadBytes; ex.ByteCount != want {
		t.Fatalf("byte count = %d, want %d (before + args + event payloads)", ex.ByteCount, want)
	}
	if got := metric(fx.k.metrics.ReplayTotal.WithLabelValues("false")); got != replayMiss+1 {
		t.Fatalf("replay_total{hit=false} moved by %v, want 1", got-replayMiss)
	}
	if got := metric(fx.k.metrics.StepsSubmitted.WithLabelValues(wire.KindToolCall)); got != toolSteps+1 {
		t.Fatalf("steps_submitted_total{kind=tool_call} moved by %v, want 1", got-toolSteps)
	}
	if got := metric(fx.k.metrics.PolicyDecisions.WithLabelValues(PolicyAllow)); got != allowDecisions+1 {
		t.Fatalf("policy_decisions_total{allow} moved by %v, want 1", got-allowDecisions)
	}
}

func TestSubmitAbsentArgsAndKinds(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	for _, kind := range []string{wire.KindToolCall, wire.KindLLMCall, wire.KindLocal} {
		dec := fx.submitReq(e.ID, hdr(del), SubmitRequest{Kind: kind})
		if dec.Decision != wire.DecisionProceed {
			t.Fatalf("%s without args: %+v", kind, dec)
		}
		s := fx.step(e.ID, dec.StepID)
		if string(s.Args) != "null" || s.ArgsHash != "74234e98afe7498fb5daf1f36ac2d78acc339464f950703b8c019892f982b90b" || s.Target != "" {
			t.Fatalf("%s step stores args %s hash %s target %q", kind, s.Args, s.ArgsHash, s.Target)
		}
		if want := identity.StepID(e.ID, kind, "", s.ArgsHash, 0); dec.StepID != want {
			t.Fatalf("%s step id = %s, want %s", kind, dec.StepID, want)
		}
	}
	m := fx.k.metrics.StepsSubmitted
	if metric(m.WithLabelValues(wire.KindLLMCall)) != 1 || metric(m.WithLabelValues(wire.KindLocal)) != 1 {
		t.Fatal("steps_submitted_total does not count by kind")
	}
}

func TestSubmitDenySequence(t *testing.T) {
	var seen []StepFacts
	pol := policyFunc(func(bundle string, f StepFacts) PolicyResult {
		seen = append(seen, f)
		switch f.Target {
		case "rm":
			return PolicyResult{Decision: PolicyDeny, RuleID: "no-rm", Reason: "destructive"}
		case "quiet":
			return PolicyResult{Decision: PolicyDeny, RuleID: "silent"}
		}
		return PolicyResult{Decision: PolicyAllow, RuleID: "ok"}
	})
	fx := newFixture(t, withPolicy(pol))
	e, del := fx.start("a1")
	denies := metric(fx.k.metrics.PolicyDecisions.WithLabelValues(PolicyDeny))

	before := fx.lastSeq(e.ID)
	args := `{"path":"/"}`
	dec := fx.submit(e, del, wire.KindToolCall, "rm", args)
	id := identity.StepID(e.ID, wire.KindToolCall, "rm", argsHash(t, args), 0)
	if dec.Decision != wire.DecisionDenied || dec.StepID != id || dec.Reason != "destructive" || dec.RuleID != "no-rm" {
		t.Fatalf("decision = %+v", dec)
	}
	if len(seen) != 1 || seen[0].AgentID != "a1" || seen[0].Kind != wire.KindToolCall || seen[0].Target != "rm" || string(seen[0].Args.Raw) != args {
		t.Fatalf("policy saw %+v", seen)
	}
	evs := fx.eventsAfter(e.ID, before)
	wantTypes(t, evs, wire.EventStepProposed, wire.EventStepDenied)
	base := stepJSON(id, wire.KindToolCall, "rm")
	errJSON := `{"reason":"destructive","rule_id":"no-rm"}`
	wantPayload(t, evs[0], "{"+base+"}")
	wantPayload(t, evs[1], `{"error":`+errJSON+`,"rule_id":"no-rm",`+base+"}")
	s := fx.step(e.ID, id)
	if s.Status != wire.StepDenied || string(s.Error) != errJSON || !s.StartedAt.IsZero() || !s.CompletedAt.Equal(fx.clk.Now()) || s.TerminalSeq != before+2 {
		t.Fatalf("denied step = %+v", s)
	}

	// A rule without a reason denies with policy_denied.
	dec = fx.submit(e, del, wire.KindToolCall, "quiet", "")
	if dec.Decision != wire.DecisionDenied || dec.Reason != wire.ReasonPolicyDenied || dec.RuleID != "silent" {
		t.Fatalf("decision = %+v", dec)
	}
	if got := string(fx.step(e.ID, dec.StepID).Error); got != `{"reason":"policy_denied","rule_id":"silent"}` {
		t.Fatalf("stored error = %s", got)
	}
	if got := metric(fx.k.metrics.PolicyDecisions.WithLabelValues(PolicyDeny)); got != denies+2 {
		t.Fatalf("policy_decisions_total{deny} moved by %v, want 2", got-denies)
	}

	// A recorded decision is never re-evaluated: a later attempt replays it
	// without asking the policy.
	evaluations := len(seen)
	del2 := fx.reclaim(del)
	dec = fx.submit(e, del2, wire.KindToolCall, "rm", args)
	if dec.Decision != wire.DecisionDenied || dec.StepID != id || dec.Reason != "destructive" || dec.RuleID != "no-rm" {
		t.Fatalf("replayed denial = %+v", dec)
	}
	if len(seen) != evaluations {
		t.Fatal("the policy was evaluated for a recorded step")
	}
}

func TestSubmitUnknownPolicyDecisionIsAnError(t *testing.T) {
	fx := newFixture(t, withPolicy(policyFunc(func(string, StepFacts) PolicyResult {
		return PolicyResult{Decision: "maybe"}
	})))
	e, del := fx.start("a1")
	before := fx.lastSeq(e.ID)
	_, err := fx.k.SubmitStep(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), req(t, wire.KindToolCall, "x", ""))
	if err == nil {
		t.Fatal("an unknown policy decision was accepted")
	}
	fx.noNewEvents(e.ID, before)
	if fx.exec(e.ID).StepCount != 0 {
		t.Fatal("a step was recorded despite the error")
	}
}

// TestReplayTable walks docs/protocol/steps.md §5 row by row.
func TestReplayTable(t *testing.T) {
	type setup struct {
		fx   *fixture
		e    *store.Execution
		del  *Delivery
		step string
	}
	// prepare records one safe_to_retry step "op" {"n":1} at attempt 1.
	prepare := func(t *testing.T, idem string, pol Policy) setup {
		opts := []func(*Options){}
		if pol != nil {
			opts = append(opts, withPolicy(pol))
		}
		fx := newFixture(t, opts...)
		e, del := fx.start("a1")
		r := req(t, wire.KindToolCall, "op", `{"n":1}`)
		r.Idempotency = idem
		dec := fx.submitReq(e.ID, hdr(del), r)
		return setup{fx, e, del, dec.StepID}
	}
	// again submits the step again with occurrence 0 asserted, as a retry or
	// a later attempt does.
	again := func(s setup, del *Delivery, idem string) *Decision {
		r := req(s.fx.t, wire.KindToolCall, "op", `{"n":1}`)
		r.Idempotency = idem
		r.Occurrence, r.HasOccurrence = 0, true
		return s.fx.submitReq(s.e.ID, hdr(del), r)
	}

	t.Run("succeeded: replay with the result, no writes", func(t *testing.T) {
		s := prepare(t, "", nil)
		s.fx.outcome(s.e, s.del, s.step, true, `{"b": 2, "a": [1.0, 1e2]}`)
		seq := s.fx.lastSeq(s.e.ID)
		hits := metric(s.fx.k.metrics.ReplayTotal.WithLabelValues("true"))
		dec := again(s, s.del, "")
		if dec.Decision != wire.DecisionReplay || dec.StepID != s.step || string(dec.Result) != `{"b": 2, "a": [1.0, 1e2]}` || dec.Error != nil {
			t.Fatalf("decision = %+v (result %s)", dec, dec.Result)
		}
		s.fx.noNewEvents(s.e.ID, seq)
		if metric(s.fx.k.metrics.ReplayTotal.WithLabelValues("true")) != hits+1 {
			t.Fatal("replay_total{hit=true} did not move")
		}
	})
	t.Run("succeeded with null result", func(t *testing.T) {
		s := prepare(t, "", nil)
		s.fx.outcome(s.e, s.del, s.step, true, "")
		dec := again(s, s.del, "")
		if dec.Decision != wire.DecisionReplay || string(dec.Result) != "null" {
			t.Fatalf("decision = %+v (result %q)", dec, dec.Result)
		}
	})
	t.Run("failed: replay with the error", func(t *testing.T) {
		s := prepare(t, "", nil)
		s.fx.outcome(s.e, s.del, s.step, false, `{"message":"boom", "type":"IOError"}`)
		seq := s.fx.lastSeq(s.e.ID)
		dec := again(s, s.del, "")
		if dec.Decision != wire.DecisionReplay || string(dec.Error) != `{"message":"boom", "type":"IOError"}` || dec.Result != nil {
			t.Fatalf("decision = %+v (error %s)", dec, dec.Error)
		}
		s.fx.noNewEvents(s.e.ID, seq)
	})
	t.Run("cancelled: replay with the stored reason", func(t *testing.T) {
		s := prepare(t, "", nil)
		s.fx.mutateStep(s.e.ID, s.step, func(st *store.Step) {
			st.Status, st.Error, st.CompletedAt = wire.StepCancelled, []byte(`{"reason":"execution_cancelled"}`), t0
		})
		seq := s.fx.lastSeq(s.e.ID)
		dec := again(s, s.del, "")
		if dec.Decision != wire.DecisionReplay || string(dec.Error) != `{"reason":"execution_cancelled"}` {
			t.Fatalf("decision = %+v (error %s)", dec, dec.Error)
		}
		s.fx.noNewEvents(s.e.ID, seq)
	})
	t.Run("denied: reason and rule id from the stored error", func(t *testing.T) {
		s := prepare(t, "", denyTarget("op", "r-7", "nope"))
		seq := s.fx.lastSeq(s.e.ID)
		dec := again(s, s.del, "")
		if dec.Decision != wire.DecisionDenied || dec.StepID != s.step || dec.Reason != "nope" || dec.RuleID != "r-7" {
			t.Fatalf("decision = %+v", dec)
		}
		s.fx.noNewEvents(s.e.ID, seq)
	})
	t.Run("denied without a stored reason: policy_denied", func(t *testing.T) {
		s := prepare(t, "", denyTarget("op", "r-7", "nope"))
		s.fx.mutateStep(s.e.ID, s.step, func(st *store.Step) { st.Error = []byte(`{"x":1}`) })
		dec := again(s, s.del, "")
		if dec.Decision != wire.DecisionDenied || dec.Reason != wire.ReasonPolicyDenied || dec.RuleID != "" {
			t.Fatalf("decision = %+v", dec)
		}
	})
	for _, status := range []string{wire.StepAllowed, wire.StepProposed} {
		t.Run(status+": started by this attempt", func(t *testing.T) {
			s := prepare(t, wire.AtMostOnce, nil)
			s.fx.mutateStep(s.e.ID, s.step, func(st *store.Step) { st.Status, st.StartedAt = status, time.Time{} })
			del2 := s.fx.reclaim(s.del)
			seq := s.fx.lastSeq(s.e.ID)
			// at_most_once does not matter: the body never ran.
			dec := again(s, del2, wire.AtMostOnce)
			if dec.Decision != wire.DecisionProceed || dec.StepID != s.step || dec.Resources == nil {
				t.Fatalf("decision = %+v", dec)
			}
			evs := s.fx.eventsAfter(s.e.ID, seq)
			wantTypes(t, evs, wire.EventStepExecuting)
			wantPayload(t, evs[0], "{"+stepJSON(s.step, wire.KindToolCall, "op")+"}")
			st := s.fx.step(s.e.ID, s.step)
			if st.Status != wire.StepExecuting || !st.StartedAt.Equal(s.fx.clk.Now()) || st.DispatchID != del2.DispatchID || st.Attempt != 2 {
				t.Fatalf("step = %+v", st)
			}
		})
	}
	t.Run("allowed keeps an earlier started_at", func(t *testing.T) {
		s := prepare(t, "", nil)
		s.fx.mutateStep(s.e.ID, s.step, func(st *store.Step) { st.Status = wire.StepAllowed })
		s.fx.clk.Advance(time.Minute)
		dec := again(s, s.del, "")
		if dec.Decision != wire.DecisionProceed {
			t.Fatalf("decision = %+v", dec)
		}
		if st := s.fx.step(s.e.ID, s.step); !st.StartedAt.Equal(t0) {
			t.Fatalf("started_at = %v, want the original %v", st.StartedAt, t0)
		}
	})
	orphanAtMostOnce := func(t *testing.T, storedIdem, requestIdem string) {
		s := prepare(t, storedIdem, nil)
		del2 := s.fx.reclaim(s.del)
		seq := s.fx.lastSeq(s.e.ID)
		r := req(t, wire.KindToolCall, "op", `{"n":1}`)
		r.Idempotency = requestIdem
		dec := s.fx.submitReq(s.e.ID, hdr(del2), r)
		if dec.Decision != wire.DecisionReplay || dec.StepID != s.step || string(dec.Error) != indeterminateJSON {
			t.Fatalf("decision = %+v (error %s)", dec, dec.Error)
		}
		evs := s.fx.eventsAfter(s.e.ID, seq)
		wantTypes(t, evs, wire.EventStepFailed)
		wantPayload(t, evs[0], `{"error":`+indeterminateJSON+","+stepJSON(s.step, wire.KindToolCall, "op")+"}")
		st := s.fx.step(s.e.ID, s.step)
		if st.Status != wire.StepFailed || string(st.Error) != indeterminateJSON || st.ErrorReason != wire.ReasonIndeterminate ||
			!st.CompletedAt.Equal(s.fx.clk.Now()) || st.TerminalSeq != seq+1 {
			t.Fatalf("step = %+v", st)
		}
		// Its outcome is now fixed: a late report from the first attempt
		// replays instead of overwriting it.
		dec = s.fx.outcome(s.e, del2, s.step, true, `"late"`)
		if dec.Decision != wire.DecisionReplay || string(dec.Error) != indeterminateJSON {
			t.Fatalf("late outcome = %+v", dec)
		}
	}
	t.Run("executing, stored at_most_once: indeterminate", func(t *testing.T) {
		orphanAtMostOnce(t, wire.AtMostOnce, "")
	})
	t.Run("executing, requested at_most_once: indeterminate", func(t *testing.T) {
		orphanAtMostOnce(t, wire.SafeToRetry, wire.AtMostOnce)
	})
	t.Run("executing, safe_to_retry: re-run with retry:true", func(t *testing.T) {
		s := prepare(t, "", nil)
		del2 := s.fx.reclaim(s.del)
		seq := s.fx.lastSeq(s.e.ID)
		dec := s.fx.submit(s.e, del2, wire.KindToolCall, "op", `{"n":1}`)
		if dec.Decision != wire.DecisionProceed || dec.StepID != s.step || dec.Resources == nil {
			t.Fatalf("decision = %+v", dec)
		}
		evs := s.fx.eventsAfter(s.e.ID, seq)
		wantTypes(t, evs, wire.EventStepExecuting)
		wantPayload(t, evs[0], `{"retry":true,`+stepJSON(s.step, wire.KindToolCall, "op")+"}")
		st := s.fx.step(s.e.ID, s.step)
		if st.Status != wire.StepExecuting || !st.StartedAt.Equal(t0) || st.DispatchID != del2.DispatchID || st.Attempt != 2 {
			t.Fatalf("step = %+v (started_at must be kept)", st)
		}
	})
	t.Run("same-attempt retry with occurrence: proceed, no writes", func(t *testing.T) {
		s := prepare(t, wire.AtMostOnce, nil)
		seq := s.fx.lastSeq(s.e.ID)
		dec := again(s, s.del, wire.AtMostOnce)
		if dec.Decision != wire.DecisionProceed || dec.StepID != s.step || dec.Occurrence != 0 {
			t.Fatalf("decision = %+v", dec)
		}
		s.fx.noNewEvents(s.e.ID, seq)
		if st := s.fx.step(s.e.ID, s.step); st.Status != wire.StepExecuting {
			t.Fatalf("step is %s", st.Status)
		}
	})
	t.Run("occurrence without attempt header is not a same-attempt retry", func(t *testing.T) {
		s := prepare(t, "", nil)
		seq := s.fx.lastSeq(s.e.ID)
		r := req(t, wire.KindToolCall, "op", `{"n":1}`)
		r.HasOccurrence = true
		dec := s.fx.submitReq(s.e.ID, DispatchHeaders{ID: s.del.DispatchID}, r)
		if dec.Decision != wire.DecisionProceed {
			t.Fatalf("decision = %+v", dec)
		}
		wantTypes(t, s.fx.eventsAfter(s.e.ID, seq), wire.EventStepExecuting)
		if v := payloadField(t, s.fx.eventsAfter(s.e.ID, seq)[0], "retry"); v == nil || !v.Bool {
			t.Fatal("the re-run lacks retry:true")
		}
	})
}

func TestIndeterminateRetryRefusal(t *testing.T) {
	calls := 0
	fx := newFixture(t, withPolicy(policyFunc(func(string, StepFacts) PolicyResult {
		calls++
		return PolicyResult{Decision: PolicyAllow, RuleID: "ok"}
	})))
	e, del := fx.start("a1")
	r := req(t, wire.KindToolCall, "charge", `{"cents":100}`)
	r.Idempotency = wire.AtMostOnce
	first := fx.submitReq(e.ID, hdr(del), r)
	del2 := fx.reclaim(del)
	if dec := fx.submitReq(e.ID, hdr(del2), r); dec.Decision != wire.DecisionReplay || dec.StepID != first.StepID {
		t.Fatalf("orphan answer = %+v", dec)
	}
	evaluated := calls

	// The next at_most_once call with the same identity is a new step
	// (occurrence 1) and is refused without asking the policy.
	seq := fx.lastSeq(e.ID)
	dec := fx.submitReq(e.ID, hdr(del2), r)
	id := identity.StepID(e.ID, wire.KindToolCall, "charge", argsHash(t, `{"cents":100}`), 1)
	const errJSON = `{"reason":"prior attempt outcome unknown; retry refused","rule_id":"__indeterminate_retry"}`
	if dec.Decision != wire.DecisionDenied || dec.StepID != id || dec.Reason != wire.ReasonIndeterminateRefused ||
		dec.RuleID != wire.RuleIndeterminateRetry || dec.Occurrence != 1 {
		t.Fatalf("decision = %+v", dec)
	}
	if calls != evaluated {
		t.Fatal("the policy was evaluated for an indeterminate retry")
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventStepProposed, wire.EventStepDenied)
	base := stepJSON(id, wire.KindToolCall, "charge")
	wantPayload(t, evs[1], `{"error":`+errJSON+`,"rule_id":"__indeterminate_retry",`+base+"}")
	if s := fx.step(e.ID, id); s.Status != wire.StepDenied || string(s.Error) != errJSON || s.Idempotency != wire.AtMostOnce {
		t.Fatalf("step = %+v", s)
	}

	// A safe_to_retry call of the same identity is not refused.
	dec = fx.submit(e, del2, wire.KindToolCall, "charge", `{"cents":100}`)
	if dec.Decision != wire.DecisionProceed || calls != evaluated+1 {
		t.Fatalf("safe_to_retry call = %+v (policy calls %d)", dec, calls-evaluated)
	}
	// Nor is an at_most_once call with other args.
	r2 := req(t, wire.KindToolCall, "charge", `{"cents":200}`)
	r2.Idempotency = wire.AtMostOnce
	if dec := fx.submitReq(e.ID, hdr(del2), r2); dec.Decision != wire.DecisionProceed {
		t.Fatalf("at_most_once with other args = %+v", dec)
	}
}

func TestOccurrenceCounting(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	args := `{"q":"x"}`
	h := argsHash(t, args)
	for occ := int64(0); occ < 3; occ++ {
		dec := fx.submit(e, del, wire.KindToolCall, "search", args)
		if want := identity.StepID(e.ID, wire.KindToolCall, "search", h, occ); dec.StepID != want || dec.Occurrence != occ {
			t.Fatalf("call %d: step %s occurrence %d, want %s at %d", occ, dec.StepID, dec.Occurrence, want, occ)
		}
	}
	if v, ok := fx.counter(del, wire.KindToolCall, "search", args); !ok || v != 2 {
		t.Fatalf("counter = %d, %v; want 2", v, ok)
	}
	// Another identity has its own counter; kind and target are part of it.
	for _, c := range []struct{ kind, target, args string }{
		{wire.KindToolCall, "search", `{"q":"y"}`},
		{wire.KindLocal, "search", args},
		{wire.KindToolCall, "fetch", args},
	} {
		if dec := fx.submit(e, del, c.kind, c.target, c.args); dec.Occurrence != 0 {
			t.Fatalf("%+v got occurrence %d, want 0", c, dec.Occurrence)
		}
	}

	t.Run("occurrence header", func(t *testing.T) {
		r := req(t, wire.KindToolCall, "search", args)
		r.HasOccurrence = true
		// Up to one past the highest recorded occurrence (2) is accepted.
		r.Occurrence = 4
		_, err := fx.k.SubmitStep(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), r)
		ke := wantCode(t, err, wire.CodeValidation)
		if ke.Message != "validation error: occurrence is ahead of the kernel" || ke.Field != wire.HeaderStepOccurrence {
			t.Fatalf("error = %+v", ke)
		}
		r.Occurrence = 3
		dec := fx.submitReq(e.ID, hdr(del), r)
		if dec.Decision != wire.DecisionProceed || dec.Occurrence != 3 {
			t.Fatalf("occurrence 3 = %+v", dec)
		}
		// Asserting an old occurrence replays it and leaves the counter at
		// its maximum.
		r.Occurrence = 1
		if dec := fx.submitReq(e.ID, hdr(del), r); dec.Occurrence != 1 || dec.Decision != wire.DecisionProceed {
			t.Fatalf("occurrence 1 = %+v", dec)
		}
		if v, _ := fx.counter(del, wire.KindToolCall, "search", args); v != 3 {
			t.Fatalf("counter = %d after asserting an older occurrence, want 3", v)
		}
		if dec := fx.submit(e, del, wire.KindToolCall, "search", args); dec.Occurrence != 4 {
			t.Fatalf("next call got occurrence %d, want 4", dec.Occurrence)
		}
		// With nothing recorded only 0 is accepted.
		r = req(t, wire.KindToolCall, "fresh", "")
		r.HasOccurrence, r.Occurrence = true, 1
		_, err = fx.k.SubmitStep(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), r)
		wantCode(t, err, wire.CodeValidation)
	})

	t.Run("a new attempt starts from occurrence 0", func(t *testing.T) {
		del2 := fx.reclaim(del)
		if _, ok := fx.counter(del, wire.KindToolCall, "search", args); ok {
			t.Fatal("the claim kept the dispatch's counters")
		}
		dec := fx.submit(e, del2, wire.KindToolCall, "search", args)
		if dec.Occurrence != 0 || dec.StepID != identity.StepID(e.ID, wire.KindToolCall, "search", h, 0) {
			t.Fatalf("first call of attempt 2 = %+v", dec)
		}
		// Occurrences 0 to 4 are recorded, but this attempt has handed out
		// only 0: a named occurrence may be its next (1), never one further,
		// so a replayed request cannot start a step the agent skipped to.
		r := req(t, wire.KindToolCall, "search", args)
		r.HasOccurrence, r.Occurrence = true, 2
		_, err := fx.k.SubmitStep(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del2), r)
		if ke := wantCode(t, err, wire.CodeValidation); ke.Field != wire.HeaderStepOccurrence {
			t.Fatalf("occurrence 2 after handing out 0: %+v", ke)
		}
		r.Occurrence = 1
		if dec := fx.submitReq(e.ID, hdr(del2), r); dec.Occurrence != 1 || dec.StepID != identity.StepID(e.ID, wire.KindToolCall, "search", h, 1) {
			t.Fatalf("occurrence 1 after handing out 0 = %+v", dec)
		}
	})

	t.Run("a newer dispatch deletes the old counters and starts from 0", func(t *testing.T) {
		newer := fx.enqueue(e.ID)
		if _, ok := fx.counter(del, wire.KindToolCall, "search", args); ok {
			t.Fatal("counters of the retired dispatch survive")
		}
		del3 := fx.claim(e.ID)
		if del3.DispatchID != newer || del3.Attempt != 1 {
			t.Fatalf("claimed %s/%d, want %s/1", del3.DispatchID, del3.Attempt, newer)
		}
		if dec := fx.submit(e, del3, wire.KindToolCall, "search", args); dec.Occurrence != 0 {
			t.Fatalf("first call of the new dispatch got occurrence %d", dec.Occurrence)
		}
	})
}

func TestConcurrentIdenticalSubmitsGetConsecutiveOccurrences(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	const n = 12
	var mu sync.Mutex
	var occs []int64
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			dec, err := fx.k.SubmitStep(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), req(t, wire.KindToolCall, "same", `{}`))
			if err != nil {
				t.Error(err)
				return
			}
			mu.Lock()
			occs = append(occs, dec.Occurrence)
			mu.Unlock()
		}()
	}
	wg.Wait()
	slices.Sort(occs)
	for i, o := range occs {
		if o != int64(i) {
			t.Fatalf("occurrences = %v, want 0…%d each once", occs, n-1)
		}
	}
	if ex := fx.exec(e.ID); ex.StepCount != n {
		t.Fatalf("step count = %d, want %d", ex.StepCount, n)
	}
}

func TestSubmitChecksInOrder(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	other, otherDel := fx.start("a2")
	r := req(t, wire.KindToolCall, "x", "")
	call := func(c Caller, id string, h DispatchHeaders, r SubmitRequest) error {
		_, err := fx.k.SubmitStep(fx.ctx, c, id, h, r)
		return err
	}
	seq := fx.lastSeq(e.ID)

	wantMessage(t, call(Caller{Agent: "a1"}, e.ID, DispatchHeaders{}, r), wire.CodeValidation, "validation error: missing dispatch_id")
	wantCode(t, call(Caller{Agent: "a1"}, e.ID, hdr(del), SubmitRequest{Kind: "shell"}), wire.CodeValidation)
	wantCode(t, call(Caller{Agent: "a1"}, "0190aaaa-0000-7000-8000-000000000000", hdr(del), r), wire.CodeNotFound)
	wantMessage(t, call(Caller{Agent: "a2"}, e.ID, hdr(del), r), wire.CodeForbidden, "forbidden")
	wantMessage(t, call(Caller{Agent: "a1"}, e.ID, DispatchHeaders{ID: "0190aaaa-0000-7000-8000-000000000000"}, r), wire.CodeValidation,
		"validation error: unknown dispatch_id")
	wantMessage(t, call(Caller{Agent: "a1"}, e.ID, hdr(otherDel), r), wire.CodeValidation,
		"validation error: dispatch_id belongs to another execution")
	wantMessage(t, call(Caller{Agent: "a1"}, e.ID, DispatchHeaders{ID: del.DispatchID, Attempt: 2}, r), wire.CodeValidation,
		"validation error: dispatch attempt is ahead of the kernel")
	r2 := r
	r2.Resources = []string{"workspace"}
	wantMessage(t, call(Caller{Agent: "a1"}, e.ID, hdr(del), r2), wire.CodeValidation, `validation error: unknown resource key "workspace"`)
	fx.noNewEvents(e.ID, seq)
	if _, ok := fx.counter(del, wire.KindToolCall, "x", ""); ok {
		t.Fatal("a refused submit advanced the counter")
	}
	// A bearer caller (no agent) is not scoped.
	if err := call(Caller{}, e.ID, hdr(del), r); err != nil {
		t.Fatalf("unscoped caller: %v", err)
	}
	wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepProposed, wire.EventStepAllowed, wire.EventStepExecuting)
	if len(fx.eventsAfter(other.ID, 0)) != int(other.LastSeq) {
		t.Fatal("another execution's log changed")
	}
	// Terminal comes before the dispatch checks.
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	dec, err := fx.k.SubmitStep(fx.ctx, Caller{Agent: "a1"}, e.ID, DispatchHeaders{ID: "0190aaaa-0000-7000-8000-000000000000", Attempt: 9}, r)
	if err != nil || dec.Decision != wire.DecisionExecutionTerminal || dec.StepID != "" {
		t.Fatalf("submit on a terminal execution = %+v, %v", dec, err)
	}
}

func TestExecutionBlockedRefusesNewStepsOnly(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	id := fx.proceed(e, del, "before", `{}`)
	fx.mutateExec(e.ID, func(x *store.Execution) { x.Status = wire.ExecBlocked })
	seq := fx.lastSeq(e.ID)

	dec := fx.submit(e, del, wire.KindToolCall, "new", `{}`)
	if dec.Decision != wire.DecisionExecutionBlocked || dec.StepID != "" {
		t.Fatalf("new step while blocked = %+v", dec)
	}
	if _, ok := fx.counter(del, wire.KindToolCall, "new", `{}`); ok {
		t.Fatal("execution_blocked advanced the counter")
	}
	// An executing step started before the block can still be completed.
	if dec := fx.outcome(e, del, id, true, `1`); dec.Decision != wire.DecisionRecorded {
		t.Fatalf("completing a step of a blocked execution = %+v", dec)
	}
	r := req(t, wire.KindToolCall, "before", `{}`)
	r.HasOccurrence = true
	if dec := fx.submitReq(e.ID, hdr(del), r); dec.Decision != wire.DecisionReplay {
		t.Fatalf("replay while blocked = %+v", dec)
	}
	wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepSucceeded)
	// Complete and fail of a blocked execution are conflicts.
	err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), CompleteRequest{})
	wantMessage(t, err, wire.CodeConflict, "conflict: execution is blocked awaiting approval")
	err = fx.k.FailExecution(fx.ctx, Caller{Agent: "a1"}, e.ID, hdr(del), FailRequest{Reason: "x"})
	wantMessage(t, err, wire.CodeConflict, "conflict: execution is blocked awaiting approval")
}

func TestRecordOutcome(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	s1 := fx.proceed(e, del, "one", `{}`)
	s2 := fx.proceed(e, del, "two", `{}`)
	seq := fx.lastSeq(e.ID)
	fx.clk.Advance(3 * time.Second)

	dec := fx.outcome(e, del, s1, true, `{"rows": [1, 2]}`)
	if dec.Decision != wire.DecisionRecorded || dec.StepID != "" || dec.Result != nil {
		t.Fatalf("complete = %+v", dec)
	}
	dec = fx.outcome(e, del, s2, false, `"disk full"`)
	if dec.Decision != wire.DecisionRecorded {
		t.Fatalf("fail = %+v", dec)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventStepSucceeded, wire.EventStepFailed)
	wantPayload(t, evs[0], "{"+stepJSON(s1, wire.KindToolCall, "one")+"}")
	wantPayload(t, evs[1], `{"error":"disk full",`+stepJSON(s2, wire.KindToolCall, "two")+"}")
	st1, st2 := fx.step(e.ID, s1), fx.step(e.ID, s2)
	if st1.Status != wire.StepSucceeded || string(st1.Result) != `{"rows": [1, 2]}` || !st1.CompletedAt.Equal(fx.clk.Now()) || st1.TerminalSeq != seq+1 {
		t.Fatalf("succeeded step = %+v", st1)
	}
	if st2.Status != wire.StepFailed || string(st2.Error) != `"disk full"` || st2.ErrorReason != "" || st2.TerminalSeq != seq+2 {
		t.Fatalf("failed step = %+v", st2)
	}

	t.Run("terminal steps replay whichever route is called", func(t *testing.T) {
		seq := fx.lastSeq(e.ID)
		for _, ok := range []bool{true, false} {
			if dec := fx.outcome(e, del, s1, ok, `"other"`); dec.Decision != wire.DecisionReplay || string(dec.Result) != `{"rows": [1, 2]}` || dec.Error != nil {
				t.Fatalf("outcome(%v) on a succeeded step = %+v", ok, dec)
			}
			if dec := fx.outcome(e, del, s2, ok, `"other"`); dec.Decision != wire.DecisionReplay || string(dec.Error) != `"disk full"` || dec.Result != nil {
				t.Fatalf("outcome(%v) on a failed step = %+v", ok, dec)
			}
		}
		fx.noNewEvents(e.ID, seq)
	})
	t.Run("null outcomes are stored as null", func(t *testing.T) {
		s3 := fx.proceed(e, del, "three", `{}`)
		fx.outcome(e, del, s3, false, "")
		if st := fx.step(e.ID, s3); string(st.Error) != "null" {
			t.Fatalf("error = %q, want null", st.Error)
		}
	})
	t.Run("error reason is extracted for the indeterminate lookup", func(t *testing.T) {
		s4 := fx.proceed(e, del, "four", `{}`)
		fx.outcome(e, del, s4, false, `{"reason":"indeterminate","message":"x"}`)
		if st := fx.step(e.ID, s4); st.ErrorReason != wire.ReasonIndeterminate {
			t.Fatalf("error reason = %q", st.ErrorReason)
		}
	})
	t.Run("a step that has not started is a conflict", func(t *testing.T) {
		s5 := fx.proceed(e, del, "five", `{}`)
		for _, status := range []string{wire.StepAllowed, wire.StepProposed, wire.StepAwaitingApproval} {
			fx.mutateStep(e.ID, s5, func(st *store.Step) { st.Status = status })
			seq := fx.lastSeq(e.ID)
			_, err := fx.k.RecordOutcome(fx.ctx, Caller{Agent: "a1"}, e.ID, s5, hdr(del), OutcomeRequest{Succeeded: true})
			wantMessage(t, err, wire.CodeConflict, "conflict: step is not executing")
			fx.noNewEvents(e.ID, seq)
		}
	})
	t.Run("existence and ownership", func(t *testing.T) {
		other, _ := fx.start("a2")
		_, err := fx.k.RecordOutcome(fx.ctx, Caller{Agent: "a1"}, e.ID, strings.Repeat("0", 64), hdr(del), OutcomeRequest{Succeeded: true})
		wantMessage(t, err, wire.CodeNotFound, "step not found")
		// A step of another execution is not found in this one.
		_, err = fx.k.RecordOutcome(fx.ctx, Caller{Agent: "a2"}, other.ID, s1, DispatchHeaders{}, OutcomeRequest{Succeeded: true})
		wantCode(t, err, wire.CodeNotFound)
		_, err = fx.k.RecordOutcome(fx.ctx, Caller{Agent: "a2"}, e.ID, s1, hdr(del), OutcomeRequest{Succeeded: true})
		wantCode(t, err, wire.CodeForbidden)
		_, err = fx.k.RecordOutcome(fx.ctx, Caller{Agent: "a1"}, "0190aaaa-0000-7000-8000-000000000000", s1, hdr(del), OutcomeRequest{Succeeded: true})
		wantMessage(t, err, wire.CodeNotFound, "execution not found")
	})
	t.Run("terminal execution answers execution_terminal", func(t *testing.T) {
		s6 := fx.proceed(e, del, "six", `{}`)
		if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
			t.Fatal(err)
		}
		seq := fx.lastSeq(e.ID)
		dec := fx.outcome(e, del, s6, true, `1`)
		if dec.Decision != wire.DecisionExecutionTerminal {
			t.Fatalf("outcome on a terminal execution = %+v", dec)
		}
		fx.noNewEvents(e.ID, seq)
		if st := fx.step(e.ID, s6); st.Status != wire.StepCancelled {
			t.Fatalf("step is %s, want cancelled by the clean-up", st.Status)
		}
	})
}
