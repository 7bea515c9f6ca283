package kernel

import (
	"errors"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/wire"
)

// The verbs the console reads with: an agent's last delivery and a policy
// explanation.

func TestLastDelivery(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	fx.agent("quiet")
	if d, err := fx.k.LastDelivery(fx.ctx, "quiet"); err != nil || d != nil {
		t.Fatalf("an agent without deliveries: %+v, %v", d, err)
	}
	var kerr *Error
	if _, err := fx.k.LastDelivery(fx.ctx, "nobody"); !errors.As(err, &kerr) || kerr.Code != wire.CodeNotFound {
		t.Fatalf("unknown agent: %v", err)
	}

	first := fx.create("a1")
	fx.ack(fx.claim(first.ID))
	d, err := fx.k.LastDelivery(fx.ctx, "a1")
	if err != nil || d == nil || d.ExecutionID != first.ID || d.Type != wire.EventDispatchAcked || d.Status != "acked" || d.Attempt != 1 {
		t.Fatalf("after an ack: %+v, %v", d, err)
	}

	// A newer failure in another execution is the last one, with what the
	// event says of it; an execution still queued has none and is passed.
	fx.clk.Advance(time.Second)
	second := fx.create("a1")
	if err := fx.k.RecordDelivery(fx.ctx, fx.claim(second.ID), DeliveryOutcome{HTTPStatus: 502, Error: "webhook answered 502 Bad Gateway"}); err != nil {
		t.Fatal(err)
	}
	fx.clk.Advance(time.Second)
	fx.create("a1")
	d, err = fx.k.LastDelivery(fx.ctx, "a1")
	if err != nil || d == nil || d.ExecutionID != second.ID || d.Type != wire.EventDispatchFailed || d.HTTPStatus != 502 ||
		d.Error != "webhook answered 502 Bad Gateway" || !d.At.Equal(t0.Add(time.Second)) {
		t.Fatalf("after a failure: %+v, %v", d, err)
	}

	// An older execution delivered again later wins over newer ones.
	fx.clk.Advance(time.Second)
	fx.ack(fx.claim(second.ID))
	if d, _ = fx.k.LastDelivery(fx.ctx, "a1"); d.ExecutionID != second.ID || d.Type != wire.EventDispatchAcked || d.Attempt != 2 {
		t.Fatalf("after a retried delivery: %+v", d)
	}
}

func TestExplainPolicy(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	args, _ := jsonx.Parse([]byte(`{"to":"eve@elsewhere.org"}`), wire.MaxNesting)

	r, err := fx.k.ExplainPolicy(fx.ctx, StepFacts{AgentID: "a1", Kind: "tool_call", Target: "send_email", Args: args})
	if err != nil || r.Decision != policy.Allow || r.RuleID != wire.RulePermissive || len(r.Trace) != 0 {
		t.Fatalf("no bundle: %+v, %v", r, err)
	}

	bundle := `rules:
  - id: read-only
    priority: 1
    when: {target: read_file}
    then: {decision: allow}
  - id: outside-mail
    priority: 2
    when:
      target: send_email
    then:
      decision: require_approval
      approval_config: {approvers: [alice]}
default_action: deny
`
	if err := fx.k.SetPolicy(fx.ctx, "a1", bundle); err != nil {
		t.Fatal(err)
	}
	r, err = fx.k.ExplainPolicy(fx.ctx, StepFacts{AgentID: "a1", Kind: "tool_call", Target: "send_email", Args: args})
	if err != nil || r.Decision != policy.RequireApproval || r.RuleID != "outside-mail" || r.Line != 6 ||
		len(r.Trace) != 2 || r.Trace[0].Matched || r.Trace[0].Failed == "" || !r.Trace[1].Matched ||
		r.Approval == nil || len(r.Approval.Approvers) != 1 || r.Approval.Approvers[0] != "alice" {
		t.Fatalf("the approval rule: %+v, %v", r, err)
	}
	r, _ = fx.k.ExplainPolicy(fx.ctx, StepFacts{AgentID: "a1", Kind: "tool_call", Target: "rm"})
	if r.Decision != policy.Deny || r.RuleID != wire.RuleDefault || len(r.Trace) != 2 {
		t.Fatalf("the default: %+v", r)
	}

	var kerr *Error
	if _, err := fx.k.ExplainPolicy(fx.ctx, StepFacts{AgentID: "a1", Kind: "shell", Target: "x"}); !errors.As(err, &kerr) || kerr.Code != wire.CodeValidation {
		t.Fatalf("a bad kind: %v", err)
	}
	if _, err := fx.k.ExplainPolicy(fx.ctx, StepFacts{AgentID: "nobody", Kind: "tool_call"}); !errors.As(err, &kerr) || kerr.Code != wire.CodeNotFound {
		t.Fatalf("unknown agent: %v", err)
	}
}

// Every execution's log growth wakes a subscription to all of them.
func TestSubscribeExecutions(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	all := fx.k.SubscribeExecutions()
	defer all.Close()
	fx.create("a1")
	select {
	case <-all.C:
	default:
		t.Fatal("a create did not wake the subscription to every execution")
	}
}
