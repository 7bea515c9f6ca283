package api

import (
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// The renderers write the resource shapes of docs/protocol/README.md §5. They embed user JSON
// verbatim, which is why they do not go through encoding/json.

func renderExecution(e *store.Execution) *jsonx.Object {
	o := (&jsonx.Object{}).
		String("id", e.ID).
		String("agent_id", e.AgentID).
		Raw("input", e.Input).
		String("status", e.Status).
		String("created_at", wire.FormatTime(e.CreatedAt)).
		String("updated_at", wire.FormatTime(e.UpdatedAt)).
		Strings("resource_keys", e.ResourceKeys)
	optString(o, "agent_version", e.AgentVersion)
	optString(o, "failure_reason", e.FailureReason)
	optString(o, "parent_execution_id", e.ParentID)
	optString(o, "idempotency_key", e.IdempotencyKey)
	optString(o, "on_behalf_of", e.OnBehalfOf)
	if e.Status == wire.ExecCompleted {
		o.Raw("output", e.Output)
	}
	if !e.DeadlineAt.IsZero() {
		o.String("deadline_at", wire.FormatTime(e.DeadlineAt))
	}
	if e.ForkedFrom != "" {
		o.String("forked_from", e.ForkedFrom).Int("fork_seq", e.ForkSeq)
		restoration := e.Restoration
		if len(restoration) == 0 {
			restoration = []byte("{}")
		}
		o.Raw("restoration", restoration)
	}
	return o
}

func optString(o *jsonx.Object, key, val string) {
	if val != "" {
		o.String(key, val)
	}
}

func renderStep(s *store.Step) *jsonx.Object {
	o := (&jsonx.Object{}).
		String("step_id", s.StepID).
		String("execution_id", s.ExecutionID).
		String("kind", s.Kind).
		String("target", s.Target).
		String("args_hash", s.ArgsHash).
		Int("occurrence", s.Occurrence).
		String("status", s.Status).
		String("idempotency", s.Idempotency).
		Raw("args", s.Args).
		Strings("resources", s.Resources)
	switch s.Status {
	case wire.StepSucceeded:
		o.Raw("result", s.Result)
	case wire.StepFailed, wire.StepDenied, wire.StepCancelled:
		o.Raw("error", s.Error)
	}
	if !s.StartedAt.IsZero() {
		o.String("started_at", wire.FormatTime(s.StartedAt))
	}
	if !s.CompletedAt.IsZero() {
		o.String("completed_at", wire.FormatTime(s.CompletedAt))
	}
	return o
}

func renderEvent(ev *store.Event) *jsonx.Object {
	return (&jsonx.Object{}).
		String("execution_id", ev.ExecutionID).
		Int("event_seq", ev.Seq).
		String("type", ev.Type).
		Raw("payload", ev.Payload).
		String("occurred_at", wire.FormatTime(ev.OccurredAt))
}

func renderAgent(a *store.Agent) *jsonx.Object {
	o := (&jsonx.Object{}).
		String("id", a.ID).
		String("webhook_url", wire.RedactURL(a.WebhookURL)).
		String("policy_bundle", a.PolicyBundle).
		String("registered_at", wire.FormatTime(a.RegisteredAt)).
		String("updated_at", wire.FormatTime(a.UpdatedAt))
	if a.LeaseTimeoutSeconds > 0 {
		o.Int("lease_timeout_seconds", a.LeaseTimeoutSeconds)
	}
	optString(o, "description", a.Description)
	if len(a.InputSchema) > 0 {
		o.Raw("input_schema", a.InputSchema)
	}
	if len(a.OutputSchema) > 0 {
		o.Raw("output_schema", a.OutputSchema)
	}
	return o
}

func renderDecision(d *kernel.Decision) *jsonx.Object {
	o := (&jsonx.Object{}).String("decision", d.Decision)
	optString(o, "step_id", d.StepID)
	if d.Result != nil {
		o.Raw("result", d.Result)
	}
	if d.Error != nil {
		o.Raw("error", d.Error)
	}
	optString(o, "approval_id", d.ApprovalID)
	optString(o, "reason", d.Reason)
	optString(o, "rule_id", d.RuleID)
	if d.RetryAfterMS > 0 {
		o.Int("retry_after_ms", d.RetryAfterMS)
	}
	if d.Decision == wire.DecisionProceed {
		var b []byte
		b = append(b, '[')
		for i, r := range d.Resources {
			if i > 0 {
				b = append(b, ',')
			}
			b = (&jsonx.Object{}).String("key", r.Key).Int("generation", r.Generation).Bool("due", r.Due).Append(b)
		}
		b = append(b, ']')
		o.Raw("resources", b)
	}
	return o
}

func renderApproval(a *store.Approval) *jsonx.Object {
	o := (&jsonx.Object{}).
		String("id", a.ID).
		String("step_id", a.StepID).
		String("execution_id", a.ExecutionID).
		String("agent_id", a.AgentID).
		String("kind", a.Kind).
		String("target", a.Target).
		String("status", a.Status).
		Strings("approvers", a.Approvers).
		String("timeout_at", wire.FormatTime(a.TimeoutAt)).
		String("created_at", wire.FormatTime(a.CreatedAt))
	optString(o, "message", a.Message)
	optString(o, "decided_by", a.DecidedBy)
	optString(o, "rationale", a.Rationale)
	if !a.DecidedAt.IsZero() {
		o.String("decided_at", wire.FormatTime(a.DecidedAt))
	}
	return o
}

// renderList writes a JSON array of objects.
func renderList[T any](items []T, render func(T) *jsonx.Object) []byte {
	b := []byte{'['}
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = render(it).Append(b)
	}
	return append(b, ']')
}
