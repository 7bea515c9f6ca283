package api

import (
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// keys parses a rendered object and returns its member names in order.
func keys(t *testing.T, o *jsonx.Object) ([]string, *jsonx.Value) {
	t.Helper()
	b := o.Bytes()
	v, err := jsonx.Parse(b, 128)
	if err != nil {
		t.Fatalf("rendered JSON does not parse: %v (%s)", err, b)
	}
	var out []string
	for _, m := range v.Members {
		out = append(out, m.Key)
	}
	return out, v
}

func wantKeys(t *testing.T, got []string, want ...string) {
	t.Helper()
	slices.Sort(want)
	if !slices.Equal(got, want) {
		t.Fatalf("keys = %v, want %v", got, want)
	}
}

func TestRenderExecution(t *testing.T) {
	base := store.Execution{ID: "e1", AgentID: "a", Input: []byte(`{ "q" : [1, 2.50] }`), Status: wire.ExecRunning,
		CreatedAt: t0, UpdatedAt: t0.Add(1500 * time.Millisecond)}
	got, v := keys(t, renderExecution(&base))
	wantKeys(t, got, "id", "agent_id", "input", "status", "created_at", "updated_at", "resource_keys")
	if string(v.Get("input").Raw) != `{ "q" : [1, 2.50] }` {
		t.Fatalf("input = %s, want the stored bytes", v.Get("input").Raw)
	}
	if string(v.Get("resource_keys").Raw) != "[]" || v.Get("updated_at").Str != "2026-12-02T09:00:01.5Z" || v.Get("created_at").Str != "2026-12-02T09:00:00Z" {
		t.Fatalf("rendered %s", renderExecution(&base).Bytes())
	}

	full := base
	full.Status = wire.ExecCompleted
	full.Output = []byte(`[ 1 ]`)
	full.AgentVersion, full.FailureReason, full.ParentID, full.IdempotencyKey, full.OnBehalfOf = "v1", "r", "p1", "k1", "alice"
	full.DeadlineAt = t0.Add(time.Hour)
	full.ResourceKeys = []string{"workspace", "db"}
	full.ForkedFrom, full.ForkSeq = "src", 23
	got, v = keys(t, renderExecution(&full))
	wantKeys(t, got, "id", "agent_id", "input", "status", "created_at", "updated_at", "resource_keys", "output", "agent_version",
		"failure_reason", "parent_execution_id", "idempotency_key", "on_behalf_of", "deadline_at", "forked_from", "fork_seq", "restoration")
	if string(v.Get("output").Raw) != `[ 1 ]` || string(v.Get("restoration").Raw) != "{}" || string(v.Get("fork_seq").Raw) != "23" ||
		string(v.Get("resource_keys").Raw) != `["workspace","db"]` {
		t.Fatalf("rendered %s", renderExecution(&full).Bytes())
	}

	// Output only on completed executions; null output shown as null.
	failed := full
	failed.Status = wire.ExecFailed
	if got, _ := keys(t, renderExecution(&failed)); slices.Contains(got, "output") {
		t.Fatal("output on a failed execution")
	}
	done := base
	done.Status = wire.ExecCompleted
	done.Output = nil
	if _, v := keys(t, renderExecution(&done)); v.Get("output") == nil || v.Get("output").Kind != jsonx.KindNull {
		t.Fatal("a completed execution with null output must show output: null")
	}
	fork := base
	fork.ForkedFrom, fork.Restoration = "src", []byte(`{"workspace":{"covered":true}}`)
	if _, v := keys(t, renderExecution(&fork)); string(v.Get("restoration").Raw) != `{"workspace":{"covered":true}}` || string(v.Get("fork_seq").Raw) != "0" {
		t.Fatalf("fork = %s", renderExecution(&fork).Bytes())
	}
}

func TestRenderStep(t *testing.T) {
	s := store.Step{ExecutionID: "e", StepID: "s", Kind: wire.KindToolCall, Target: "t", ArgsHash: "h", Occurrence: 2,
		Status: wire.StepExecuting, Idempotency: wire.AtMostOnce, Args: []byte(`{"b": 1, "a": 2}`), StartedAt: t0,
		Result: []byte(`"stale"`), Error: []byte(`"stale"`)}
	got, v := keys(t, renderStep(&s))
	wantKeys(t, got, "step_id", "execution_id", "kind", "target", "args_hash", "occurrence", "status", "idempotency", "args", "resources", "started_at")
	if string(v.Get("args").Raw) != `{"b": 1, "a": 2}` || string(v.Get("occurrence").Raw) != "2" || string(v.Get("resources").Raw) != "[]" {
		t.Fatalf("rendered %s", renderStep(&s).Bytes())
	}
	for status, extra := range map[string]string{
		wire.StepSucceeded: "result", wire.StepFailed: "error", wire.StepDenied: "error", wire.StepCancelled: "error",
		wire.StepAwaitingApproval: "", wire.StepAllowed: "", wire.StepProposed: "",
	} {
		x := s
		x.Status = status
		x.CompletedAt = t0.Add(time.Second)
		x.StartedAt = time.Time{}
		got, v := keys(t, renderStep(&x))
		want := []string{"step_id", "execution_id", "kind", "target", "args_hash", "occurrence", "status", "idempotency", "args", "resources", "completed_at"}
		if extra != "" {
			want = append(want, extra)
			if string(v.Get(extra).Raw) != `"stale"` {
				t.Fatalf("%s: %s = %s", status, extra, v.Get(extra).Raw)
			}
		}
		wantKeys(t, got, want...)
	}
	x := s
	x.Status, x.Result = wire.StepSucceeded, nil
	if _, v := keys(t, renderStep(&x)); v.Get("result") == nil || v.Get("result").Kind != jsonx.KindNull {
		t.Fatal("a succeeded step with no result must show result: null")
	}
	x.Resources = []string{"w"}
	if _, v := keys(t, renderStep(&x)); string(v.Get("resources").Raw) != `["w"]` {
		t.Fatal("resources")
	}
}

func TestRenderEvent(t *testing.T) {
	ev := store.Event{ExecutionID: "e", Seq: 7, Type: wire.EventStepSucceeded, Payload: []byte(`{"step_id":"s"}`), OccurredAt: t0.Add(123456 * time.Microsecond)}
	if got := string(renderEvent(&ev).Bytes()); got != `{"event_seq":7,"execution_id":"e","occurred_at":"2026-12-02T09:00:00.123456Z","payload":{"step_id":"s"},"type":"step.succeeded"}` {
		t.Fatalf("event = %s", got)
	}
}

func TestRenderAgent(t *testing.T) {
	a := store.Agent{ID: "a", WebhookURL: "http://h/", Secret: "must-not-leak", RegisteredAt: t0, UpdatedAt: t0}
	b := string(renderAgent(&a).Bytes())
	if b != `{"id":"a","policy_bundle":"","registered_at":"2026-12-02T09:00:00Z","updated_at":"2026-12-02T09:00:00Z","webhook_url":"http://h/"}` {
		t.Fatalf("agent = %s", b)
	}
	a.LeaseTimeoutSeconds, a.Description, a.InputSchema, a.OutputSchema, a.PolicyBundle = 300, "d", []byte(`{ "type": "object" }`), []byte(`{}`), "rules: []\n"
	got, v := keys(t, renderAgent(&a))
	wantKeys(t, got, "id", "webhook_url", "policy_bundle", "registered_at", "updated_at", "lease_timeout_seconds", "description", "input_schema", "output_schema")
	if string(v.Get("input_schema").Raw) != `{ "type": "object" }` || v.Get("policy_bundle").Str != "rules: []\n" {
		t.Fatalf("agent = %s", renderAgent(&a).Bytes())
	}
	if strings.Contains(string(renderAgent(&a).Bytes()), "must-not-leak") {
		t.Fatal("the secret was rendered")
	}
}

func TestRenderDecision(t *testing.T) {
	for _, tc := range []struct {
		d    kernel.Decision
		want string
	}{
		{kernel.Decision{Decision: wire.DecisionProceed, StepID: "s"}, `{"decision":"proceed","resources":[],"step_id":"s"}`},
		{kernel.Decision{Decision: wire.DecisionProceed, StepID: "s", Resources: []kernel.ResourceEntry{{Key: "w", Generation: 4, Due: true}, {Key: "x"}}},
			`{"decision":"proceed","resources":[{"due":true,"generation":4,"key":"w"},{"due":false,"generation":0,"key":"x"}],"step_id":"s"}`},
		{kernel.Decision{Decision: wire.DecisionReplay, StepID: "s", Result: []byte(`{ "a" : 1 }`)}, `{"decision":"replay","result":{ "a" : 1 },"step_id":"s"}`},
		{kernel.Decision{Decision: wire.DecisionReplay, StepID: "s", Result: []byte("null")}, `{"decision":"replay","result":null,"step_id":"s"}`},
		{kernel.Decision{Decision: wire.DecisionReplay, Error: []byte(`"x"`)}, `{"decision":"replay","error":"x"}`},
		{kernel.Decision{Decision: wire.DecisionDenied, StepID: "s", Reason: "r", RuleID: "id"}, `{"decision":"denied","reason":"r","rule_id":"id","step_id":"s"}`},
		{kernel.Decision{Decision: wire.DecisionBlocked, StepID: "s", ApprovalID: "ap"}, `{"approval_id":"ap","decision":"blocked","step_id":"s"}`},
		{kernel.Decision{Decision: wire.DecisionRateLimited, Reason: "rate_limit_exceeded", RetryAfterMS: 1500}, `{"decision":"rate_limited","reason":"rate_limit_exceeded","retry_after_ms":1500}`},
		{kernel.Decision{Decision: wire.DecisionRateLimited, Reason: "rate_limiter_unavailable"}, `{"decision":"rate_limited","reason":"rate_limiter_unavailable"}`},
		{kernel.Decision{Decision: wire.DecisionExecutionTerminal, Resources: []kernel.ResourceEntry{}}, `{"decision":"execution_terminal"}`},
		{kernel.Decision{Decision: wire.DecisionExecutionBlocked}, `{"decision":"execution_blocked"}`},
		{kernel.Decision{Decision: wire.DecisionRecorded}, `{"decision":"recorded"}`},
	} {
		if got := string(renderDecision(&tc.d).Bytes()); got != tc.want {
			t.Errorf("decision %+v = %s, want %s", tc.d, got, tc.want)
		}
	}
}

func TestRenderApproval(t *testing.T) {
	a := store.Approval{ID: "ap", StepID: "s", ExecutionID: "e", AgentID: "a", Kind: wire.KindToolCall, Target: "t",
		Status: wire.ApprovalPending, TimeoutAt: t0.Add(time.Minute), CreatedAt: t0}
	got, v := keys(t, renderApproval(&a))
	wantKeys(t, got, "id", "step_id", "execution_id", "agent_id", "kind", "target", "status", "approvers", "timeout_at", "created_at")
	if string(v.Get("approvers").Raw) != "[]" {
		t.Fatal("approvers must be [] when none")
	}
	a.Approvers, a.Message, a.DecidedBy, a.Rationale, a.DecidedAt, a.Status = []string{"alice"}, "m", "alice", "ok", t0.Add(time.Second), wire.ApprovalGranted
	got, v = keys(t, renderApproval(&a))
	wantKeys(t, got, "id", "step_id", "execution_id", "agent_id", "kind", "target", "status", "approvers", "timeout_at", "created_at",
		"message", "decided_by", "rationale", "decided_at")
	if string(v.Get("approvers").Raw) != `["alice"]` || v.Get("decided_at").Str != "2026-12-02T09:00:01Z" {
		t.Fatalf("approval = %s", renderApproval(&a).Bytes())
	}
}

func TestRenderList(t *testing.T) {
	if got := string(renderList([]*store.Event(nil), renderEvent)); got != "[]" {
		t.Fatalf("empty list = %s", got)
	}
	evs := []*store.Event{{ExecutionID: "e", Seq: 1, Type: "a", Payload: []byte("{}"), OccurredAt: t0}, {ExecutionID: "e", Seq: 2, Type: "b", Payload: []byte("{}"), OccurredAt: t0}}
	got := string(renderList(evs, renderEvent))
	if !strings.HasPrefix(got, `[{"event_seq":1,`) || !strings.Contains(got, `},{"event_seq":2,`) || !strings.HasSuffix(got, "}]") {
		t.Fatalf("list = %s", got)
	}
}
