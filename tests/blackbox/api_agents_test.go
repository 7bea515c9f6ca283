package blackbox

import (
	"strconv"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- docs/protocol/executions.md §11 ----

// TestAPIPrevious checks GET …/previous: the parent's state, else its
// output, verbatim; null without a parent; dual auth.
func TestAPIPrevious(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("chainer", "")
	b := k.NewAgent("stranger", "")

	previous := func(id string) string {
		t.Helper()
		r := k.Must(200, k.Do("GET", "/v0/executions/"+id+"/previous", nil, nil))
		hsWantJSON(t, r)
		return strings.TrimSuffix(string(r.Body), "\n")
	}
	child := func(parent string) string {
		t.Helper()
		r := k.Must(201, k.Do("POST", "/v0/executions", []byte(`{"agent_id":"chainer","parent_execution_id":"`+parent+`"}`), nil))
		e := r.Map(t)
		if e["parent_execution_id"] != parent {
			t.Fatalf("parent_execution_id not shown: %s", r.Body)
		}
		return e["id"].(string)
	}

	p1 := hsStartRun(t, k, a, `null`)
	if got := previous(p1.id); got != `{"state":null}` {
		t.Fatalf("no parent: %s", got)
	}
	state := `{ "cursor" : [1, 2.0], "note": "\u00e9" }`
	k.Must(204, a.Request("POST", "/v0/executions/"+p1.id+"/complete", []byte(`{"output":{"o":1},"state":`+state+`}`), p1.lease))
	c1 := child(p1.id)
	if got := previous(c1); got != `{"state":`+state+`}` {
		t.Fatalf("state of parent: %s", got)
	}
	// The state is not part of the Execution.
	if strings.Contains(string(k.Do("GET", "/v0/executions/"+p1.id, nil, nil).Body), "cursor") {
		t.Fatalf("state leaked into the execution")
	}

	p2 := hsStartRun(t, k, a, `null`)
	output := `[ "out" , 2 ]`
	k.Must(204, a.Request("POST", "/v0/executions/"+p2.id+"/complete", []byte(`{"output":`+output+`,"state":null}`), p2.lease))
	c2 := child(p2.id)
	if got := previous(c2); got != `{"state":`+output+`}` {
		t.Fatalf("output of parent: %s", got)
	}

	p3 := hsStartRun(t, k, a, `null`)
	k.Must(204, a.Request("POST", "/v0/executions/"+p3.id+"/complete", []byte(`{}`), p3.lease))
	if got := previous(child(p3.id)); got != `{"state":null}` {
		t.Fatalf("parent without output or state: %s", got)
	}

	// Dual auth: the owner reads it, another agent is refused, unknown is 404.
	r := hsAgentDo(t, k, a, "GET", "/v0/executions/"+c1+"/previous", nil, kt.Lease{Occurrence: -1}, nil)
	if r.Status != 200 || strings.TrimSuffix(string(r.Body), "\n") != `{"state":`+state+`}` {
		t.Fatalf("agent previous: %s", r)
	}
	hsWantErr(t, hsAgentDo(t, k, b, "GET", "/v0/executions/"+c1+"/previous", nil, kt.Lease{Occurrence: -1}, nil), 403, "forbidden")
	hsWantErr(t, k.Do("GET", "/v0/executions/0190a5b0-0000-7000-8000-000000000004/previous", nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/nope/previous", nil, nil), 400, "validation_error")
}

// ---- docs/protocol/governance.md §4 ----

// TestAPIAgentsAdmin covers register (create and update), list, read,
// delete, policy load and metadata as the Agent shows them, and that the
// secret never leaves the kernel.
func TestAPIAgentsAdmin(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{ManualClock: true})
	var answers []string
	do := func(method, path, body string) *kt.Response {
		t.Helper()
		var b []byte
		if body != "" {
			b = []byte(body)
		}
		r := k.Do(method, path, b, nil)
		answers = append(answers, string(r.Body))
		return r
	}
	if r := do("GET", "/v0/agents", ""); r.Status != 200 || string(r.Body) != "[]\n" {
		t.Fatalf("empty agents list: %s", r)
	}

	secret1, secret2 := "first-secret-value-0001", "second-secret-value-0002"
	r := do("POST", "/v0/agents", `{"id":"zeta","webhook_url":"http://127.0.0.1:9/hook","secret":"`+secret1+`"}`)
	k.Must(201, r)
	hsWantJSON(t, r)
	created := r.Map(t)
	if got, want := strings.Join(hsKeys(created), ","), "id,policy_bundle,registered_at,updated_at,webhook_url"; got != want {
		t.Fatalf("agent keys %s, want %s: %s", got, want, r.Body)
	}
	if created["id"] != "zeta" || created["webhook_url"] != "http://127.0.0.1:9/hook" || created["policy_bundle"] != "" {
		t.Fatalf("agent %s", r.Body)
	}
	reg := hsWantTime(t, "registered_at", created["registered_at"])
	hsWantTime(t, "updated_at", created["updated_at"])

	// Update: 201 again, registered_at kept, updated_at moves, lease shown.
	k.AdvanceClock(90 * time.Second)
	r = k.Must(201, do("POST", "/v0/agents", `{"id":"zeta","webhook_url":"https://agents.example.com/zeta","secret":"`+secret2+`","lease_timeout_seconds":45}`))
	updated := r.Map(t)
	if updated["registered_at"] != created["registered_at"] {
		t.Fatalf("registered_at changed: %v -> %v", created["registered_at"], updated["registered_at"])
	}
	if up := hsWantTime(t, "updated_at", updated["updated_at"]); up.Sub(reg) < 90*time.Second {
		t.Fatalf("updated_at %v not moved by the update (registered %v)", up, reg)
	}
	if updated["webhook_url"] != "https://agents.example.com/zeta" || updated["lease_timeout_seconds"] != 45.0 {
		t.Fatalf("update not applied: %s", r.Body)
	}
	if got := k.Must(200, do("GET", "/v0/agents/zeta", "")).Map(t); got["lease_timeout_seconds"] != 45.0 || got["registered_at"] != created["registered_at"] {
		t.Fatalf("read after update %v", got)
	}

	// Policy load: stored, shown, kept by re-registration, removed by "".
	bundle := "default_action: allow\nrules: []\n"
	k.Must(204, do("POST", "/v0/policies/zeta", `{"bundle":`+strconv.Quote(bundle)+`}`))
	if got := k.Must(200, do("GET", "/v0/agents/zeta", "")).Map(t); got["policy_bundle"] != bundle {
		t.Fatalf("policy_bundle %q", got["policy_bundle"])
	}
	k.Must(201, do("POST", "/v0/agents", `{"id":"zeta","webhook_url":"https://agents.example.com/zeta","secret":"`+secret2+`"}`))
	got := k.Must(200, do("GET", "/v0/agents/zeta", "")).Map(t)
	if got["policy_bundle"] != bundle {
		t.Fatalf("re-registration dropped the policy: %v", got)
	}
	if _, ok := got["lease_timeout_seconds"]; ok {
		t.Fatalf("lease_timeout_seconds kept after a registration without it: %v", got)
	}
	hsWantErr(t, do("POST", "/v0/policies/nobody", `{"bundle":`+strconv.Quote(bundle)+`}`), 404, "not_found")
	hsWantErr(t, do("POST", "/v0/policies/bad%20id", `{}`), 400, "validation_error")
	k.Must(204, do("POST", "/v0/policies/zeta", `{"bundle":""}`))
	if got := k.Must(200, do("GET", "/v0/agents/zeta", "")).Map(t); got["policy_bundle"] != "" {
		t.Fatalf("policy not removed: %v", got)
	}
	k.Must(204, do("POST", "/v0/policies/zeta", `{"bundle":`+strconv.Quote(bundle)+`}`))
	k.Must(204, do("POST", "/v0/policies/zeta", `{}`))
	if got := k.Must(200, do("GET", "/v0/agents/zeta", "")).Map(t); got["policy_bundle"] != "" {
		t.Fatalf("absent bundle did not remove the policy: %v", got)
	}

	// Metadata (HMAC) is shown on the agent and kept by re-registration.
	live := k.NewAgent("alpha", "")
	schema := `{"type" : "object", "properties": {"q": {"type": "string"}}}`
	meta := `{"description":"Finds things.","input_schema":` + schema + `,"output_schema":{"type":"array"}}`
	k.Must(204, live.Request("PUT", "/v0/agents/alpha/metadata", []byte(meta), kt.Lease{Occurrence: -1}))
	live.Register("")
	r = k.Must(200, do("GET", "/v0/agents/alpha", ""))
	raw := hsRawMembers(t, r.Body)
	if string(raw["description"]) != `"Finds things."` || string(raw["input_schema"]) != schema || string(raw["output_schema"]) != `{"type":"array"}` {
		t.Fatalf("metadata on the agent: %s", r.Body)
	}
	// The body replaces all three: absent fields clear.
	k.Must(204, live.Request("PUT", "/v0/agents/alpha/metadata", []byte(`{"description":"Only this."}`), kt.Lease{Occurrence: -1}))
	m := k.Must(200, do("GET", "/v0/agents/alpha", "")).Map(t)
	if _, ok := m["input_schema"]; ok || m["description"] != "Only this." {
		t.Fatalf("metadata not replaced: %v", m)
	}
	k.Must(204, live.Request("PUT", "/v0/agents/alpha/metadata", []byte(`{"description":null}`), kt.Lease{Occurrence: -1}))
	if m := k.Must(200, do("GET", "/v0/agents/alpha", "")).Map(t); m["description"] != nil {
		t.Fatalf("description not cleared: %v", m)
	}

	// List sorted by id (byte order).
	k.Must(201, do("POST", "/v0/agents", `{"id":"Beta","webhook_url":"http://127.0.0.1:9/b","secret":"s"}`))
	k.Must(201, do("POST", "/v0/agents", `{"id":"1x","webhook_url":"http://127.0.0.1:9/1","secret":"s"}`))
	var agents []map[string]any
	lr := k.Must(200, do("GET", "/v0/agents", ""))
	hsWantJSON(t, lr)
	lr.JSON(t, &agents)
	var names []string
	for _, ag := range agents {
		names = append(names, ag["id"].(string))
	}
	if strings.Join(names, ",") != "1x,Beta,alpha,zeta" {
		t.Fatalf("agents list order %v", names)
	}
	hsWantErr(t, do("GET", "/v0/agents/nobody", ""), 404, "not_found")

	// Delete: 409 while an execution is live, 204 after, 404 again; the
	// history stays readable.
	id := k.CreateExecution("alpha", `{"keep":"me"}`)
	env := hsWantErr(t, do("DELETE", "/v0/agents/alpha", ""), 409, "conflict")
	if !strings.HasPrefix(env.Message, "conflict: ") {
		t.Fatalf("conflict message %q", env.Message)
	}
	k.Must(200, do("GET", "/v0/agents/alpha", ""))
	k.Must(204, do("POST", "/v0/executions/"+id+"/cancel", ""))
	r = k.Must(204, do("DELETE", "/v0/agents/alpha", ""))
	if len(r.Body) != 0 {
		t.Fatalf("204 with body %q", r.Body)
	}
	hsWantErr(t, do("GET", "/v0/agents/alpha", ""), 404, "not_found")
	hsWantErr(t, do("DELETE", "/v0/agents/alpha", ""), 404, "not_found")
	if e := k.Execution(id); e["agent_id"] != "alpha" || e["status"] != "cancelled" {
		t.Fatalf("history after delete: %v", e)
	}
	if types := k.EventTypes(id); types[0] != "execution.created" || !kt.Contains(types, "execution.cancelled") {
		t.Fatalf("log after delete: %v", types)
	}
	if ids := hsExecutionIDs(t, k, "agent_id=alpha"); len(ids) != 1 || ids[0] != id {
		t.Fatalf("list by deleted agent: %v", ids)
	}
	// Creating for the deleted agent is 404 (docs/protocol/executions.md §2).
	env = hsWantErr(t, do("POST", "/v0/executions", `{"agent_id":"alpha"}`), 404, "not_found")
	if env.Message != "agent not found" {
		t.Fatalf("message %q", env.Message)
	}

	// The secret is never echoed, logged or exported.
	answers = append(answers, string(k.Do("GET", "/metrics", nil, nil).Body), k.Stderr())
	for _, s := range []string{secret1, secret2, live.Secret} {
		for _, ans := range answers {
			if strings.Contains(ans, s) {
				t.Fatalf("secret %q appears in %.200s", s, ans)
			}
		}
	}
	for _, ans := range answers {
		if strings.Contains(ans, `"secret"`) {
			t.Fatalf("a response has a secret field: %.200s", ans)
		}
	}
}
