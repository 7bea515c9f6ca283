package kernel

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// bundle is the policy the governance tests store on their agent.
const bundle = `default_action: allow
rules:
  - id: send-needs-ok
    priority: 1
    when:
      target: send_email
    then:
      decision: require_approval
      approval_config:
        approvers: [alice, bob]
        timeout: 5m
        message: "Allow this?"
  - id: wire-money
    priority: 2
    when:
      target: wire
    then:
      decision: require_approval
  - id: limited
    priority: 3
    when:
      target: search
    then:
      decision: allow
      rate_limit:
        max_calls: 2
        window: 1m
  - id: strict
    priority: 4
    when:
      target: "rm*"
    then:
      decision: deny
      reason: destructive
`

// governed starts an execution of an agent that carries bundle.
func governed(t *testing.T, setup ...func(o *Options)) (*fixture, *store.Execution, *Delivery) {
	t.Helper()
	fx := newFixture(t, setup...)
	fx.agent("a1")
	if err := fx.k.SetPolicy(fx.ctx, "a1", bundle); err != nil {
		t.Fatalf("set policy: %v", err)
	}
	e, del := fx.start("a1")
	return fx, e, del
}

// block submits send_email and returns the blocked decision.
func (fx *fixture) block(e *store.Execution, del *Delivery, target string) *Decision {
	fx.t.Helper()
	dec := fx.submit(e, del, wire.KindToolCall, target, `{"to":"x@example.com"}`)
	if dec.Decision != wire.DecisionBlocked || dec.ApprovalID == "" || dec.StepID == "" {
		fx.t.Fatalf("submit %s = %+v, want blocked", target, dec)
	}
	return dec
}

func (fx *fixture) approval(id string) *store.Approval {
	fx.t.Helper()
	a, err := fx.k.GetApproval(fx.ctx, id)
	if err != nil {
		fx.t.Fatalf("read approval: %v", err)
	}
	return a
}

func TestPolicyBundleDecisions(t *testing.T) {
	fx, e, del := governed(t)
	// Explicit deny with the rule's reason.
	dec := fx.submit(e, del, wire.KindToolCall, "rm_rf", `{}`)
	if dec.Decision != wire.DecisionDenied || dec.RuleID != "strict" || dec.Reason != "destructive" {
		t.Fatalf("rm_rf = %+v", dec)
	}
	// default_action allow.
	dec = fx.submit(e, del, wire.KindToolCall, "other", `{}`)
	if dec.Decision != wire.DecisionProceed {
		t.Fatalf("other = %+v", dec)
	}
	evs := fx.events(e.ID)
	if got := payloadField(t, evs[len(evs)-2], "rule_id").Str; got != wire.RuleDefault {
		t.Fatalf("step.allowed rule_id = %q, want default", got)
	}

	t.Run("default deny and local steps", func(t *testing.T) {
		if err := fx.k.SetPolicy(fx.ctx, "a1", "default_action: deny\nrules: []\n"); err != nil {
			t.Fatal(err)
		}
		dec := fx.submit(e, del, wire.KindToolCall, "anything", `{}`)
		if dec.Decision != wire.DecisionDenied || dec.RuleID != wire.RuleDefault || dec.Reason != wire.ReasonNoAllowRule {
			t.Fatalf("tool under default deny = %+v", dec)
		}
		dec = fx.submit(e, del, wire.KindLocal, "summarise", `{}`)
		if dec.Decision != wire.DecisionProceed {
			t.Fatalf("local step under default deny = %+v", dec)
		}
		evs := fx.events(e.ID)
		if got := payloadField(t, evs[len(evs)-2], "rule_id").Str; got != wire.RuleLocal {
			t.Fatalf("local step.allowed rule_id = %q", got)
		}
	})
	t.Run("no bundle is permissive", func(t *testing.T) {
		if err := fx.k.SetPolicy(fx.ctx, "a1", ""); err != nil {
			t.Fatal(err)
		}
		if a, _ := fx.k.GetAgent(fx.ctx, "a1"); a.PolicyBundle != "" {
			t.Fatalf("bundle after removal = %q", a.PolicyBundle)
		}
		fx.submit(e, del, wire.KindToolCall, "rm_rf", `{"again":1}`)
		evs := fx.events(e.ID)
		if got := payloadField(t, evs[len(evs)-2], "rule_id").Str; got != wire.RulePermissive {
			t.Fatalf("rule_id without a bundle = %q", got)
		}
	})
	t.Run("a stored bundle that no longer compiles denies", func(t *testing.T) {
		err := fx.k.store.Update(fx.ctx, "", func(ctx context.Context, tx store.Tx) error {
			return tx.SetAgentPolicy(ctx, "a1", "rules: [", fx.clk.Now())
		})
		if err != nil {
			t.Fatal(err)
		}
		// Written behind the kernel's back, as another replica would: the
		// kernel sees it once its cached copy expires.
		fx.clk.Advance(2 * time.Second)
		dec := fx.submit(e, del, wire.KindToolCall, "x", `{}`)
		if dec.Decision != wire.DecisionDenied || dec.RuleID != wire.RuleBundleError || dec.Reason != wire.ReasonPolicyBundleInvalid {
			t.Fatalf("decision under a broken bundle = %+v", dec)
		}
	})
}

func TestSetPolicyValidation(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	if err := fx.k.SetPolicy(fx.ctx, "a1", bundle); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"rules: [", "default_action: maybe\n", "rules:\n  - id: x\n    then: {decision: allow}\n    when: {targt: y}\n"} {
		err := fx.k.SetPolicy(fx.ctx, "a1", bad)
		ke := wantCode(t, err, wire.CodeValidation)
		if !strings.HasPrefix(ke.Message, "invalid policy bundle: ") || ke.Field != "bundle" {
			t.Fatalf("error for %q = %+v", bad, ke)
		}
	}
	if a, _ := fx.k.GetAgent(fx.ctx, "a1"); a.PolicyBundle != bundle {
		t.Fatal("a refused bundle replaced the stored one")
	}
	// The bundle is validated before the agent is looked up.
	wantCode(t, fx.k.SetPolicy(fx.ctx, "ghost", "rules: ["), wire.CodeValidation)
	wantMessage(t, fx.k.SetPolicy(fx.ctx, "ghost", bundle), wire.CodeNotFound, "agent not found")
	// Registration with a policy validates it too.
	_, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a2", WebhookURL: "http://h/", Secret: "s", Policy: "rules: [", SetPolicy: true})
	wantCode(t, err, wire.CodeValidation)
	if _, err := fx.k.GetAgent(fx.ctx, "a2"); err == nil {
		t.Fatal("an agent with an invalid bundle was registered")
	}
}

func TestRequireApprovalSequence(t *testing.T) {
	fx, e, del := governed(t)
	requested := metric(fx.k.metrics.PolicyDecisions.WithLabelValues(PolicyRequireApproval))
	fx.clk.Advance(time.Second)
	seq := fx.lastSeq(e.ID)
	dec := fx.block(e, del, "send_email")
	id := identity.StepID(e.ID, wire.KindToolCall, "send_email", argsHash(t, `{"to":"x@example.com"}`), 0)
	if dec.StepID != id || dec.Occurrence != 0 {
		t.Fatalf("decision = %+v", dec)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventStepProposed, wire.EventStepAwaitingApproval, wire.EventApprovalRequested, wire.EventExecutionBlocked)
	base := stepJSON(id, wire.KindToolCall, "send_email")
	wantPayload(t, evs[1], `{"rule_id":"send-needs-ok",`+base+"}")
	wantPayload(t, evs[2], fmt.Sprintf(`{"approval_id":%q,"execution_id":%q,"status":"pending","step_id":%q}`, dec.ApprovalID, e.ID, id))
	wantPayload(t, evs[3], fmt.Sprintf(`{"execution_id":%q,"status":"blocked"}`, e.ID))
	a := fx.approval(dec.ApprovalID)
	if a.Status != wire.ApprovalPending || !slices.Equal(a.Approvers, []string{"alice", "bob"}) || a.Message != "Allow this?" ||
		!a.TimeoutAt.Equal(fx.clk.Now().Add(5*time.Minute)) || a.AgentID != "a1" || a.Kind != wire.KindToolCall ||
		a.Target != "send_email" || a.StepID != id || a.ExecutionID != e.ID || !a.CreatedAt.Equal(fx.clk.Now()) {
		t.Fatalf("approval = %+v", a)
	}
	uuidMillis(t, a.ID)
	if s := fx.step(e.ID, id); s.Status != wire.StepAwaitingApproval || !s.StartedAt.IsZero() {
		t.Fatalf("step = %+v", s)
	}
	ex := fx.exec(e.ID)
	if ex.Status != wire.ExecBlocked || ex.DispatchID != del.DispatchID || !ex.UpdatedAt.Equal(fx.clk.Now()) {
		t.Fatalf("execution = %s, newest dispatch %s", ex.Status, ex.DispatchID)
	}
	if d := fx.dispatch(del.DispatchID); d.Status != wire.DispatchRetired {
		t.Errorf("the live dispatch is %s, want released (retired)", d.Status)
	}
	if metric(fx.k.metrics.PolicyDecisions.WithLabelValues(PolicyRequireApproval)) != requested+1 {
		t.Fatal("policy_decisions_total{require_approval} did not move")
	}

	// While blocked, the released dispatch is still the newest: its requests
	// get the ordinary answers, not lease_superseded.
	seq = fx.lastSeq(e.ID)
	c := Caller{Agent: "a1"}
	if dec := fx.submit(e, del, wire.KindToolCall, "other", `{}`); dec.Decision != wire.DecisionExecutionBlocked {
		t.Fatalf("new step while blocked = %+v", dec)
	}
	r := req(t, wire.KindToolCall, "send_email", `{"to":"x@example.com"}`)
	r.HasOccurrence = true
	if again := fx.submitReq(e.ID, hdr(del), r); again.Decision != wire.DecisionBlocked || again.ApprovalID != a.ID || again.StepID != id {
		t.Fatalf("replay of the awaiting step = %+v", again)
	}
	if err := fx.k.Heartbeat(fx.ctx, c, e.ID, hdr(del)); err != nil {
		t.Fatalf("heartbeat while blocked: %v", err)
	}
	_, err := fx.k.RecordOutcome(fx.ctx, c, e.ID, id, hdr(del), OutcomeRequest{Succeeded: true})
	wantMessage(t, err, wire.CodeConflict, "conflict: step is not executing")
	fx.noNewEvents(e.ID, seq)
	if refs, _ := fx.k.store.Read().DueDispatches(fx.ctx, fx.clk.Now().Add(time.Hour), 10, nil); len(refs) != 0 {
		t.Fatalf("a blocked execution has a due dispatch: %v", refs)
	}
	// The released dispatch holds no lease: waiting for the human past the
	// lease neither redelivers nor spends the attempt budget.
	fx.clk.Advance(3 * time.Minute)
	if refs, _ := fx.k.store.Read().ExpiredLeases(fx.ctx, fx.clk.Now(), 10); len(refs) != 0 {
		t.Fatalf("a blocked execution has an expiring lease: %v", refs)
	}
	if err := fx.k.ReclaimLease(fx.ctx, store.DispatchRef{ID: del.DispatchID, ExecutionID: e.ID}); err != nil {
		t.Fatal(err)
	}
	if got, err := fx.k.ClaimDispatch(fx.ctx, store.DispatchRef{ID: del.DispatchID, ExecutionID: e.ID}); err != nil || got != nil {
		t.Fatalf("claim while blocked = %+v, %v", got, err)
	}
	fx.noNewEvents(e.ID, seq)

	t.Run("grant", func(t *testing.T) {
		err := fx.k.DecideApproval(fx.ctx, a.ID, DecideRequest{Grant: true, DecidedBy: "mallory"})
		wantMessage(t, err, wire.CodeForbidden, `forbidden: "mallory" is not an approver for this approval`)
		wantCode(t, fx.k.DecideApproval(fx.ctx, a.ID, DecideRequest{Grant: true, DecidedBy: "Alice"}), wire.CodeForbidden)
		wantCode(t, fx.k.DecideApproval(fx.ctx, a.ID, DecideRequest{Grant: true}), wire.CodeForbidden)
		fx.noNewEvents(e.ID, seq)

		fx.clk.Advance(30 * time.Second)
		granted := metric(fx.k.metrics.ApprovalOutcomes.WithLabelValues(wire.ApprovalGranted))
		if err := fx.k.DecideApproval(fx.ctx, a.ID, DecideRequest{Grant: true, DecidedBy: "alice", Rationale: "ok"}); err != nil {
			t.Fatal(err)
		}
		ex := fx.exec(e.ID)
		evs := fx.eventsAfter(e.ID, seq)
		wantTypes(t, evs, wire.EventApprovalGranted, wire.EventStepAllowed, wire.EventExecutionResumed, wire.EventDispatchQueued)
		wantPayload(t, evs[0], fmt.Sprintf(`{"approval_id":%q,"decided_by":"alice","execution_id":%q,"rationale":"ok","status":"granted","step_id":%q}`, a.ID, e.ID, id))
		wantPayload(t, evs[1], fmt.Sprintf(`{"approval_id":%q,`, a.ID)+base+"}")
		wantPayload(t, evs[2], fmt.Sprintf(`{"execution_id":%q,"status":"running"}`, e.ID))
		wantPayload(t, evs[3], fmt.Sprintf(`{"attempt":0,"dispatch_id":%q,"execution_id":%q,"status":"pending"}`, ex.DispatchID, e.ID))
		if ex.Status != wire.ExecRunning || ex.DispatchID <= del.DispatchID {
			t.Fatalf("execution = %s with newest dispatch %s (was %s)", ex.Status, ex.DispatchID, del.DispatchID)
		}
		got := fx.approval(a.ID)
		if got.Status != wire.ApprovalGranted || got.DecidedBy != "alice" || got.Rationale != "ok" || !got.DecidedAt.Equal(fx.clk.Now()) {
			t.Fatalf("approval = %+v", got)
		}
		if s := fx.step(e.ID, id); s.Status != wire.StepAllowed {
			t.Fatalf("step = %s, want allowed", s.Status)
		}
		if metric(fx.k.metrics.ApprovalOutcomes.WithLabelValues(wire.ApprovalGranted)) != granted+1 {
			t.Fatal("approval_outcomes_total{granted} did not move")
		}
		wantMessage(t, fx.k.DecideApproval(fx.ctx, a.ID, DecideRequest{Grant: true, DecidedBy: "bob"}), wire.CodeConflict, "conflict: approval is not pending")
		wantCode(t, fx.k.DecideApproval(fx.ctx, a.ID, DecideRequest{DecidedBy: "bob"}), wire.CodeConflict)

		// The old dispatch is superseded now; the new one resumes the step.
		wantCode(t, fx.k.Heartbeat(fx.ctx, c, e.ID, hdr(del)), wire.CodeLeaseSuperseded)
		del2 := fx.claim(e.ID)
		seq := fx.lastSeq(e.ID)
		dec := fx.submit(e, del2, wire.KindToolCall, "send_email", `{"to":"x@example.com"}`)
		if dec.Decision != wire.DecisionProceed || dec.StepID != id {
			t.Fatalf("resumed step = %+v", dec)
		}
		wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepExecuting)
		if s := fx.step(e.ID, id); s.Status != wire.StepExecuting || !s.StartedAt.Equal(fx.clk.Now()) || s.DispatchID != del2.DispatchID {
			t.Fatalf("step = %+v", s)
		}
	})
}

func TestDenyApproval(t *testing.T) {
	for _, tc := range []struct {
		name, rationale, decidedBy, reason, extra string
	}{
		{"without rationale", "", "", "approval_denied", ""},
		{"with rationale", "too much", "carol", "too much", `"decided_by":"carol",`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx, e, del := governed(t)
			dec := fx.block(e, del, "wire")
			seq := fx.lastSeq(e.ID)
			if err := fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{DecidedBy: tc.decidedBy, Rationale: tc.rationale}); err != nil {
				t.Fatal(err)
			}
			evs := fx.eventsAfter(e.ID, seq)
			wantTypes(t, evs, wire.EventApprovalDenied, wire.EventStepDenied, wire.EventExecutionResumed, wire.EventDispatchQueued)
			rationale := ""
			if tc.rationale != "" {
				rationale = fmt.Sprintf(`"rationale":%q,`, tc.rationale)
			}
			wantPayload(t, evs[0], fmt.Sprintf(`{"approval_id":%q,`+tc.extra+`"execution_id":%q,`+rationale+`"status":"denied","step_id":%q}`, dec.ApprovalID, e.ID, dec.StepID))
			errJSON := fmt.Sprintf(`{"reason":%q}`, tc.reason)
			wantPayload(t, evs[1], `{"error":`+errJSON+","+stepJSON(dec.StepID, wire.KindToolCall, "wire")+"}")
			if s := fx.step(e.ID, dec.StepID); s.Status != wire.StepDenied || string(s.Error) != errJSON || !s.CompletedAt.Equal(fx.clk.Now()) {
				t.Fatalf("step = %+v", s)
			}
			// The resumed handler is told the stored reason; nobody is asked again.
			del2 := fx.claim(e.ID)
			again := fx.submit(e, del2, wire.KindToolCall, "wire", `{"to":"x@example.com"}`)
			if again.Decision != wire.DecisionDenied || again.Reason != tc.reason || again.StepID != dec.StepID {
				t.Fatalf("resumed submit = %+v", again)
			}
			if metric(fx.k.metrics.ApprovalOutcomes.WithLabelValues(wire.ApprovalDenied)) != 1 {
				t.Fatal("approval_outcomes_total{denied} did not move")
			}
		})
	}

	t.Run("validation and existence", func(t *testing.T) {
		fx, e, del := governed(t)
		dec := fx.block(e, del, "wire")
		wantCode(t, fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{DecidedBy: strings.Repeat("d", 257)}), wire.CodeValidation)
		wantCode(t, fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{Rationale: strings.Repeat("r", 4097)}), wire.CodeValidation)
		wantMessage(t, fx.k.DecideApproval(fx.ctx, "0190aaaa-0000-7000-8000-000000000000", DecideRequest{}), wire.CodeNotFound, "approval not found")
		_, err := fx.k.GetApproval(fx.ctx, "0190aaaa-0000-7000-8000-000000000000")
		wantCode(t, err, wire.CodeNotFound)
		if err := fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{Grant: true, DecidedBy: strings.Repeat("d", 256), Rationale: strings.Repeat("r", 4096)}); err != nil {
			t.Fatalf("limits are inclusive: %v", err)
		}
	})
}

func TestApprovalExpiry(t *testing.T) {
	fx, e, del := governed(t)
	dec := fx.block(e, del, "send_email")
	ref := store.ApprovalRef{ID: dec.ApprovalID, ExecutionID: e.ID}
	r := fx.k.store.Read()
	seq := fx.lastSeq(e.ID)

	fx.clk.Advance(5*time.Minute - time.Millisecond)
	if refs, _ := r.ExpiredApprovals(fx.ctx, fx.clk.Now(), 10); len(refs) != 0 {
		t.Fatalf("expired before the timeout: %v", refs)
	}
	if err := fx.k.ExpireApproval(fx.ctx, ref); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)
	if next, _ := r.NextApprovalTimeout(fx.ctx); !next.Equal(t0.Add(5 * time.Minute)) {
		t.Fatalf("next approval timeout = %v", next)
	}

	fx.clk.Advance(time.Millisecond)
	if refs, _ := r.ExpiredApprovals(fx.ctx, fx.clk.Now(), 10); len(refs) != 1 || refs[0] != ref {
		t.Fatalf("expired approvals = %v", refs)
	}
	if err := fx.k.ExpireApproval(fx.ctx, ref); err != nil {
		t.Fatal(err)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventApprovalExpired, wire.EventStepDenied, wire.EventExecutionResumed, wire.EventDispatchQueued)
	wantPayload(t, evs[0], fmt.Sprintf(`{"approval_id":%q,"execution_id":%q,"rationale":"timeout","status":"expired","step_id":%q}`, dec.ApprovalID, e.ID, dec.StepID))
	wantPayload(t, evs[1], `{"error":{"reason":"approval_timeout"},`+stepJSON(dec.StepID, wire.KindToolCall, "send_email")+"}")
	a := fx.approval(dec.ApprovalID)
	if a.Status != wire.ApprovalExpired || a.Rationale != wire.ReasonTimeout || !a.DecidedAt.Equal(fx.clk.Now()) || a.DecidedBy != "" {
		t.Fatalf("approval = %+v", a)
	}
	if ex := fx.exec(e.ID); ex.Status != wire.ExecRunning {
		t.Fatalf("expiry must resume, not fail: %s", ex.Status)
	}
	if metric(fx.k.metrics.ApprovalOutcomes.WithLabelValues(wire.ApprovalExpired)) != 1 {
		t.Fatal("approval_outcomes_total{expired} did not move")
	}
	// Expiring again, or an unknown approval, does nothing.
	seq = fx.lastSeq(e.ID)
	if err := fx.k.ExpireApproval(fx.ctx, ref); err != nil {
		t.Fatal(err)
	}
	if err := fx.k.ExpireApproval(fx.ctx, store.ApprovalRef{ID: "0190aaaa-0000-7000-8000-000000000000", ExecutionID: e.ID}); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)
	wantCode(t, fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{Grant: true, DecidedBy: "alice"}), wire.CodeConflict)
}

func TestApprovalDefaultTimeout(t *testing.T) {
	fx, e, del := governed(t, withConfig(func(c *Config) { c.ApprovalTimeout = 42 * time.Minute }))
	dec := fx.block(e, del, "wire") // the rule gives no approval_config
	a := fx.approval(dec.ApprovalID)
	if !a.TimeoutAt.Equal(fx.clk.Now().Add(42*time.Minute)) || a.Approvers == nil || len(a.Approvers) != 0 || a.Message != "" {
		t.Fatalf("approval = %+v, want the kernel timeout, [] approvers and no message", a)
	}
	// With no approvers anyone may decide, also with no name at all.
	if err := fx.k.DecideApproval(fx.ctx, a.ID, DecideRequest{Grant: true}); err != nil {
		t.Fatal(err)
	}
	if got := fx.approval(a.ID); got.Status != wire.ApprovalGranted || got.DecidedBy != "" {
		t.Fatalf("approval = %+v", got)
	}
}

func TestTerminalCleanUpExpiresPendingApprovals(t *testing.T) {
	for _, tc := range []struct {
		name, cause string
		end         func(fx *fixture, e *store.Execution)
	}{
		{"cancel", wire.CauseExecutionCancelled, func(fx *fixture, e *store.Execution) {
			if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
				fx.t.Fatal(err)
			}
		}},
		{"deadline", wire.CauseDeadlineExceeded, func(fx *fixture, e *store.Execution) {
			fx.clk.Advance(time.Hour)
			if err := fx.k.ExpireDeadline(fx.ctx, e.ID); err != nil {
				fx.t.Fatal(err)
			}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			fx, e, del := governed(t, withConfig(func(c *Config) { c.DeadlineTimeout = time.Hour }))
			dec := fx.block(e, del, "send_email")
			seq := fx.lastSeq(e.ID)
			tc.end(fx, e)
			evs := fx.eventsAfter(e.ID, seq)
			wantTypes(t, evs, wire.EventExecutionCancelled, wire.EventApprovalExpired, wire.EventStepDenied)
			wantPayload(t, evs[1], fmt.Sprintf(`{"approval_id":%q,"execution_id":%q,"rationale":%q,"status":"expired","step_id":%q}`, dec.ApprovalID, e.ID, tc.cause, dec.StepID))
			errJSON := fmt.Sprintf(`{"reason":%q}`, tc.cause)
			wantPayload(t, evs[2], `{"error":`+errJSON+","+stepJSON(dec.StepID, wire.KindToolCall, "send_email")+"}")
			a := fx.approval(dec.ApprovalID)
			if a.Status != wire.ApprovalExpired || a.Rationale != tc.cause || !a.DecidedAt.Equal(fx.clk.Now()) {
				t.Fatalf("approval = %+v", a)
			}
			if s := fx.step(e.ID, dec.StepID); s.Status != wire.StepDenied || string(s.Error) != errJSON {
				t.Fatalf("step = %+v", s)
			}
			if pending, _ := fx.k.store.Read().PendingApprovals(fx.ctx, e.ID); len(pending) != 0 {
				t.Fatalf("%d pending approvals remain", len(pending))
			}
			// The terminal check of a decision is behind the pending check.
			wantCode(t, fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{Grant: true, DecidedBy: "alice"}), wire.CodeConflict)
			fx.noNewEvents(e.ID, fx.exec(e.ID).LastSeq)
		})
	}
}

func TestDecideOnTerminalExecutionGuard(t *testing.T) {
	// Unreachable while docs/protocol/executions.md §9 holds; force the state to check the guard.
	fx, e, del := governed(t)
	dec := fx.block(e, del, "wire")
	fx.mutateExec(e.ID, func(x *store.Execution) { x.Status = wire.ExecCompleted })
	seq := fx.lastSeq(e.ID)
	wantCode(t, fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{Grant: true}), wire.CodeExecutionTerminal)
	fx.noNewEvents(e.ID, seq)
	if a := fx.approval(dec.ApprovalID); a.Status != wire.ApprovalPending {
		t.Fatalf("approval = %s", a.Status)
	}
}

func TestListApprovals(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	if err := fx.k.SetPolicy(fx.ctx, "a1", bundle); err != nil {
		t.Fatal(err)
	}
	var ids []string
	var execs []string
	for i := 0; i < 3; i++ {
		e, del := fx.start("a1")
		execs = append(execs, e.ID)
		ids = append(ids, fx.block(e, del, "wire").ApprovalID)
	}
	if err := fx.k.DecideApproval(fx.ctx, ids[1], DecideRequest{Grant: true}); err != nil {
		t.Fatal(err)
	}
	list := func(f store.ApprovalFilter) []string {
		t.Helper()
		got, err := fx.k.ListApprovals(fx.ctx, f)
		if err != nil {
			t.Fatalf("list %+v: %v", f, err)
		}
		if got == nil {
			t.Fatalf("list %+v returned nil, want a list", f)
		}
		var out []string
		for _, a := range got {
			out = append(out, a.ID)
		}
		return out
	}
	if got := list(store.ApprovalFilter{}); !slices.Equal(got, []string{ids[0], ids[2]}) {
		t.Fatalf("default (pending) = %v", got)
	}
	if got := list(store.ApprovalFilter{Status: wire.ApprovalGranted}); !slices.Equal(got, []string{ids[1]}) {
		t.Fatalf("granted = %v", got)
	}
	if got := list(store.ApprovalFilter{Status: wire.ApprovalDenied}); len(got) != 0 {
		t.Fatalf("denied = %v", got)
	}
	if got := list(store.ApprovalFilter{After: ids[0]}); !slices.Equal(got, []string{ids[2]}) {
		t.Fatalf("after the first = %v", got)
	}
	if got := list(store.ApprovalFilter{ExecutionID: execs[2]}); !slices.Equal(got, []string{ids[2]}) {
		t.Fatalf("by execution = %v", got)
	}
	if got := list(store.ApprovalFilter{Limit: 1}); !slices.Equal(got, []string{ids[0]}) {
		t.Fatalf("limit 1 = %v", got)
	}
	if got := list(store.ApprovalFilter{Limit: 5000}); len(got) != 2 {
		t.Fatalf("limit 5000 = %v", got)
	}
	for _, f := range []store.ApprovalFilter{{Status: "open"}, {Limit: -1}} {
		_, err := fx.k.ListApprovals(fx.ctx, f)
		wantCode(t, err, wire.CodeValidation)
	}
}

func TestRunWorkersExpireApprovals(t *testing.T) {
	fx, e, del := governed(t)
	dec := fx.block(e, del, "send_email")
	ctx, cancel := context.WithCancel(fx.ctx)
	stopped := make(chan struct{})
	go func() { fx.k.RunWorkers(ctx); close(stopped) }()
	defer func() {
		cancel()
		<-stopped
	}()
	fx.clk.Advance(5 * time.Minute)
	deadline := time.Now().Add(5 * time.Second)
	for fx.approval(dec.ApprovalID).Status != wire.ApprovalExpired {
		if time.Now().After(deadline) {
			t.Fatal("the approval worker did not expire the approval within 5 s of its timeout")
		}
		time.Sleep(5 * time.Millisecond)
	}
	if ex := fx.exec(e.ID); ex.Status != wire.ExecRunning {
		t.Fatalf("execution = %s", ex.Status)
	}
}

func TestRateLimit(t *testing.T) {
	fx, e, del := governed(t)
	fx.proceed(e, del, "search", `{"q":1}`)
	fx.proceed(e, del, "search", `{"q":2}`)
	limited := metric(fx.k.metrics.RateLimitDecisions.WithLabelValues("limited"))
	steps := fx.exec(e.ID).StepCount
	seq := fx.lastSeq(e.ID)

	dec := fx.submit(e, del, wire.KindToolCall, "search", `{"q":3}`)
	// Two calls per minute: one token refills every 30 s.
	if dec.Decision != wire.DecisionRateLimited || dec.Reason != wire.ReasonRateLimitExceeded || dec.RetryAfterMS != 30000 || dec.StepID != "" {
		t.Fatalf("third call = %+v", dec)
	}
	id := identity.StepID(e.ID, wire.KindToolCall, "search", argsHash(t, `{"q":3}`), 0)
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventStepRateLimited)
	wantPayload(t, evs[0], `{"reason":"rate_limit_exceeded","retry_after_ms":30000,"rule_id":"limited",`+stepJSON(id, wire.KindToolCall, "search")+"}")
	if _, err := fx.k.store.Read().Step(fx.ctx, e.ID, id); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused step was recorded: %v", err)
	}
	ex := fx.exec(e.ID)
	if ex.StepCount != steps {
		t.Fatalf("step count moved to %d", ex.StepCount)
	}
	if _, ok := fx.counter(del, wire.KindToolCall, "search", `{"q":3}`); ok {
		t.Fatal("a refusal advanced the counter")
	}

	// A retry within the window is refused again without a second audit
	// event; the metric counts every refusal.
	fx.clk.Advance(10 * time.Second)
	seq = fx.lastSeq(e.ID)
	dec = fx.submit(e, del, wire.KindToolCall, "search", `{"q":3}`)
	if dec.Decision != wire.DecisionRateLimited || dec.RetryAfterMS != 20000 {
		t.Fatalf("retry after 10 s = %+v", dec)
	}
	fx.noNewEvents(e.ID, seq)
	if got := metric(fx.k.metrics.RateLimitDecisions.WithLabelValues("limited")); got != limited+2 {
		t.Fatalf("rate_limit_decisions_total{limited} moved by %v, want 2", got-limited)
	}
	if at, found, _ := fx.k.store.Read().RateLimitMark(fx.ctx, e.ID, id); !found || !at.Equal(t0) {
		t.Fatalf("audit mark = %v, %v; want the first refusal's time", at, found)
	}

	// Replays are never limited.
	r := req(t, wire.KindToolCall, "search", `{"q":1}`)
	r.HasOccurrence = true
	if dec := fx.submitReq(e.ID, hdr(del), r); dec.Decision != wire.DecisionProceed {
		t.Fatalf("replay while limited = %+v", dec)
	}

	// Once a token is back, the identical retry gets the step id the audit
	// named.
	fx.clk.Advance(20 * time.Second)
	dec = fx.submit(e, del, wire.KindToolCall, "search", `{"q":3}`)
	if dec.Decision != wire.DecisionProceed || dec.StepID != id || dec.Occurrence != 0 {
		t.Fatalf("after the refill = %+v", dec)
	}

	// A refusal more than a window after the last audited one is audited
	// again.
	if dec := fx.submit(e, del, wire.KindToolCall, "search", `{"q":4}`); dec.Decision != wire.DecisionRateLimited {
		t.Fatalf("q4 = %+v", dec)
	}
	fx.clk.Advance(61 * time.Second)
	fx.proceed(e, del, "search", `{"q":5}`)
	fx.proceed(e, del, "search", `{"q":6}`)
	seq = fx.lastSeq(e.ID)
	dec = fx.submit(e, del, wire.KindToolCall, "search", `{"q":4}`)
	if dec.Decision != wire.DecisionRateLimited {
		t.Fatalf("q4 = %+v", dec)
	}
	wantTypes(t, fx.eventsAfter(e.ID, seq), wire.EventStepRateLimited)

	// The clean-up deletes the audit marks.
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	if _, found, _ := fx.k.store.Read().RateLimitMark(fx.ctx, e.ID, id); found {
		t.Fatal("an audit mark survived the terminal clean-up")
	}
}

func TestRateLimitBucketsPerExecution(t *testing.T) {
	fx, e1, d1 := governed(t)
	e2, d2 := fx.start("a1")
	for i := 0; i < 2; i++ {
		fx.proceed(e1, d1, "search", fmt.Sprintf(`{"i":%d}`, i))
	}
	if dec := fx.submit(e1, d1, wire.KindToolCall, "search", `{"i":9}`); dec.Decision != wire.DecisionRateLimited {
		t.Fatalf("e1 third call = %+v", dec)
	}
	// per_what: execution — another execution has its own bucket.
	fx.proceed(e2, d2, "search", `{"i":0}`)
}

func TestLimiterFailure(t *testing.T) {
	const failClosed = `rules:
  - id: fail-closed
    priority: 1
    when: {target: closed}
    then:
      decision: allow
      rate_limit: {max_calls: 5, window: 1m, on_limiter_error: deny}
  - id: fail-open
    priority: 2
    when: {target: open}
    then:
      decision: allow
      rate_limit: {max_calls: 5, window: 1m}
`
	for _, timeout := range []bool{false, true} {
		t.Run(fmt.Sprint("timeout=", timeout), func(t *testing.T) {
			fx := newFixture(t, func(o *Options) { o.Limiter = FaultyLimiter{Timeout: timeout} })
			fx.agent("a1")
			if err := fx.k.SetPolicy(fx.ctx, "a1", failClosed); err != nil {
				t.Fatal(err)
			}
			e, del := fx.start("a1")
			m := fx.k.metrics.RateLimitDecisions
			if dec := fx.submit(e, del, wire.KindToolCall, "open", `{}`); dec.Decision != wire.DecisionProceed {
				t.Fatalf("fail-open = %+v", dec)
			}
			if metric(m.WithLabelValues("error_allowed")) != 1 {
				t.Fatal("rate_limit_decisions_total{error_allowed} did not move")
			}
			seq := fx.lastSeq(e.ID)
			dec := fx.submit(e, del, wire.KindToolCall, "closed", `{}`)
			if dec.Decision != wire.DecisionRateLimited || dec.Reason != wire.ReasonRateLimiterUnavail || dec.RetryAfterMS != 0 {
				t.Fatalf("fail-closed = %+v", dec)
			}
			evs := fx.eventsAfter(e.ID, seq)
			wantTypes(t, evs, wire.EventStepRateLimited)
			if v := payloadField(t, evs[0], "retry_after_ms"); v != nil {
				t.Fatal("a limiter failure carries retry_after_ms")
			}
			if got := payloadField(t, evs[0], "reason").Str; got != wire.ReasonRateLimiterUnavail {
				t.Fatalf("reason = %q", got)
			}
			if metric(m.WithLabelValues("error_denied")) != 1 {
				t.Fatal("rate_limit_decisions_total{error_denied} did not move")
			}
		})
	}
}

func TestMemoryLimiter(t *testing.T) {
	l := NewMemoryLimiter()
	check := func(key string, max int64, window time.Duration, at time.Duration) (bool, time.Duration) {
		t.Helper()
		ok, retry, err := l.Check(key, max, window, t0.Add(at))
		if err != nil {
			t.Fatal(err)
		}
		return ok, retry
	}
	// A new bucket starts full; two calls per two seconds refill one token
	// per second.
	for i := 0; i < 2; i++ {
		if ok, _ := check("k", 2, 2*time.Second, 0); !ok {
			t.Fatalf("call %d of 2 refused", i)
		}
	}
	ok, retry := check("k", 2, 2*time.Second, 0)
	if ok || retry != time.Second {
		t.Fatalf("third call = %v, retry %v; want refused, 1 s", ok, retry)
	}
	// A refusal takes nothing; refill is continuous.
	if ok, retry := check("k", 2, 2*time.Second, 250*time.Millisecond); ok || retry != 750*time.Millisecond {
		t.Fatalf("after 250 ms = %v, %v", ok, retry)
	}
	if ok, _ := check("k", 2, 2*time.Second, time.Second); !ok {
		t.Fatal("a token did not refill after 1 s")
	}
	// Retry-after rounds up to whole milliseconds.
	if ok, retry := check("k", 2, 2*time.Second, time.Second+time.Nanosecond); ok || retry != time.Second {
		t.Fatalf("rounding: %v, %v", ok, retry)
	}
	if ok, retry := check("k", 2, 2*time.Second, time.Second+1500*time.Microsecond); ok || retry != 999*time.Millisecond {
		t.Fatalf("rounding up: %v, %v; want 998.5 ms rounded up to 999 ms", ok, retry)
	}
	// Other keys are independent.
	if ok, _ := check("other", 1, time.Hour, 0); !ok {
		t.Fatal("a new key was refused")
	}
	// New parameters apply at once and clamp the tokens.
	l2 := NewMemoryLimiter()
	ok2 := func(max int64, at time.Duration) bool {
		ok, _, _ := l2.Check("p", max, time.Minute, t0.Add(at))
		return ok
	}
	for i := 0; i < 2; i++ {
		ok2(10, 0)
	} // 8 tokens left of 10
	for i := 0; i < 2; i++ {
		if !ok2(2, 0) { // clamped to 2
			t.Fatalf("call %d under the new capacity refused", i)
		}
	}
	if ok2(2, 0) {
		t.Fatal("the tokens were not clamped to the new capacity")
	}
	// Invalid parameters are errors.
	for _, p := range []struct {
		max    int64
		window time.Duration
	}{{0, time.Minute}, {1, 0}, {-1, time.Second}} {
		if _, _, err := l.Check("bad", p.max, p.window, t0); err == nil {
			t.Fatalf("Check(%d, %v) accepted invalid parameters", p.max, p.window)
		}
	}
	// The clock going backwards neither refills nor breaks the bucket.
	l3 := NewMemoryLimiter()
	l3.Check("b", 1, time.Minute, t0)
	if ok, _, _ := l3.Check("b", 1, time.Minute, t0.Add(-time.Hour)); ok {
		t.Fatal("a backwards clock refilled the bucket")
	}
}

func TestMemoryLimiterForgetsIdleBuckets(t *testing.T) {
	l := NewMemoryLimiter()
	for i := 0; i < 1000; i++ {
		l.Check(fmt.Sprint("idle-", i), 1, time.Second, t0)
	}
	if l.Len() != 1000 {
		t.Fatalf("Len() = %d", l.Len())
	}
	// The periodic sweep (every 1,024 checks) drops buckets idle for longer
	// than their window.
	for i := 0; i < 24; i++ {
		l.Check("busy", 1000, time.Hour, t0.Add(time.Minute))
	}
	if n := l.Len(); n != 1 {
		t.Fatalf("Len() = %d after the sweep, want only the busy bucket", n)
	}
}

func TestBucketKey(t *testing.T) {
	for _, tc := range []struct {
		rl   policy.RateLimit
		want string
	}{
		{policy.RateLimit{PerWhat: "execution", MaxCalls: 5, Window: time.Minute}, "r:exec:e1"},
		{policy.RateLimit{MaxCalls: 5, Window: time.Minute}, "r:exec:e1"},
		{policy.RateLimit{PerWhat: "agent", MaxCalls: 5, Window: time.Minute}, "r:agent:a1"},
		{policy.RateLimit{PerWhat: "global", MaxCalls: 5, Window: 90 * time.Second}, "r:global:5:90000"},
	} {
		if got := bucketKey("r", &tc.rl, "e1", "a1"); got != tc.want {
			t.Errorf("bucketKey(%+v) = %q, want %q", tc.rl, got, tc.want)
		}
	}
}
