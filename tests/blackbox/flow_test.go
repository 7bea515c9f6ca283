package blackbox

import (
	"reflect"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestFirstRun walks the happy path: create, webhook, a tool step, a local
// step, complete — and checks the exact event log it leaves.
func TestFirstRun(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("researcher", "")
	id := k.CreateExecution("researcher", `{"q": "durable agents"}`)

	wh := a.NextWebhook()
	if wh.ExecutionID != id || wh.DispatchAttempt != 1 || wh.LeaseTimeoutSeconds != 120 {
		t.Fatalf("webhook %s", wh.Body)
	}
	lease := kt.LeaseOf(wh)
	d := a.Submit(id, lease, `{"kind":"tool_call","target":"web_search","args":{"q":"durable agents"}}`)
	if d.Decision != "proceed" || len(d.StepID) != 64 || d.Resources == nil {
		t.Fatalf("submit: %+v", d)
	}
	if got := a.Complete(id, d.StepID, lease, `{"hits": 3}`); got.Decision != "recorded" {
		t.Fatalf("complete: %+v", got)
	}
	l := a.Submit(id, lease, `{"kind":"local","target":"now"}`)
	if l.Decision != "proceed" {
		t.Fatalf("local: %+v", l)
	}
	a.Complete(id, l.StepID, lease, `"2026-12-02"`)
	a.Finish(id, lease, `{"answer": 42}`)

	e := k.Execution(id)
	if e["status"] != "completed" || e["output"].(map[string]any)["answer"] != 42.0 {
		t.Fatalf("execution %v", e)
	}
	want := []string{"execution.created", "execution.started", "dispatch.queued", "dispatch.acked",
		"step.proposed", "step.allowed", "step.executing", "step.succeeded",
		"step.proposed", "step.allowed", "step.executing", "step.succeeded", "execution.completed"}
	got := k.EventTypes(id)
	// dispatch.acked may land after the first step events (docs/protocol/dispatch.md §5).
	if !sameMultiset(got, want) || got[0] != want[0] || got[len(got)-1] != "execution.completed" {
		t.Fatalf("events:\n got %v\nwant %v", got, want)
	}
	// Verbatim storage: the input comes back byte for byte.
	r := k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil))
	if !contains(string(r.Body), `"input":{"q": "durable agents"}`) {
		t.Fatalf("input not verbatim: %s", r.Body)
	}
}

func sameMultiset(a, b []string) bool {
	count := map[string]int{}
	for _, s := range a {
		count[s]++
	}
	for _, s := range b {
		count[s]--
	}
	for _, n := range count {
		if n != 0 {
			return false
		}
	}
	return true
}

func contains(s, sub string) bool { return len(s) >= len(sub) && (s == sub || indexOf(s, sub) >= 0) }

func indexOf(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if s[i:i+len(sub)] == sub {
			return i
		}
	}
	return -1
}

var _ = reflect.DeepEqual
