package blackbox

import (
	"io"
	"net/http"
	"regexp"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- docs/protocol/http.md §1: framing of every response ----

// TestAPIResponseFraming checks Rebuno-Request-Id, the JSON content type and
// the single trailing newline on answers of every kind, success and error.
func TestAPIResponseFraming(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("framer", "")
	run := hsStartRun(t, k, a, `{"x":1}`)

	seen := map[string]bool{}
	check := func(what string, r *kt.Response, status int) {
		t.Helper()
		if r.Status != status {
			t.Fatalf("%s: want %d, got %s", what, status, r)
		}
		hsWantRequestID(t, r)
		id := r.Header.Get("Rebuno-Request-Id")
		if seen[id] {
			t.Fatalf("%s: request id %s reused", what, id)
		}
		seen[id] = true
		if status == 204 {
			if len(r.Body) != 0 {
				t.Fatalf("%s: 204 with a body %q", what, r.Body)
			}
			return
		}
		if what != "metrics" {
			hsWantJSON(t, r)
		}
	}
	check("health", k.Do("GET", "/v0/health", nil, nil), 200)
	check("ready", k.Do("GET", "/v0/ready", nil, nil), 200)
	check("metrics", k.Do("GET", "/metrics", nil, nil), 200)
	check("create", k.Do("POST", "/v0/executions", []byte(`{"agent_id":"framer"}`), nil), 201)
	check("get", k.Do("GET", "/v0/executions/"+run.id, nil, nil), 200)
	check("list", k.Do("GET", "/v0/executions", nil, nil), 200)
	check("events", k.Do("GET", "/v0/executions/"+run.id+"/events", nil, nil), 200)
	check("steps (empty)", k.Do("GET", "/v0/executions/"+run.id+"/steps", nil, nil), 200)
	d := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"t"}`)
	check("steps", k.Do("GET", "/v0/executions/"+run.id+"/steps", nil, nil), 200)
	check("step", k.Do("GET", "/v0/executions/"+run.id+"/steps/"+d.StepID, nil, nil), 200)
	check("submit", hsAgentDo(t, k, a, "POST", "/v0/executions/"+run.id+"/steps", []byte(`{"kind":"tool_call","target":"u"}`), run.lease, nil), 200)
	check("heartbeat", hsAgentDo(t, k, a, "POST", "/v0/executions/"+run.id+"/heartbeat", nil, run.lease, nil), 204)
	check("agents", k.Do("GET", "/v0/agents", nil, nil), 200)
	check("previous", k.Do("GET", "/v0/executions/"+run.id+"/previous", nil, nil), 200)
	check("400", k.Do("GET", "/v0/executions/abc", nil, nil), 400)
	check("401", k.Do("POST", "/v0/executions/"+run.id+"/heartbeat", nil, nil), 401)
	check("404 route", k.Do("GET", "/v0/nothing", nil, nil), 404)
	check("404 object", k.Do("GET", "/v0/agents/nobody", nil, nil), 404)
	check("405", k.Do("DELETE", "/v0/executions", nil, nil), 405)
	check("cancel", k.Do("POST", "/v0/executions/"+run.id+"/cancel", nil, nil), 204)
	check("409", k.Do("POST", "/v0/executions/"+run.id+"/cancel", nil, nil), 409)
	check("delete 404", k.Do("DELETE", "/v0/agents/nobody", nil, nil), 404)

	// The request id is logged (docs/protocol/http.md §1).
	last := k.Do("GET", "/v0/agents/nobody", nil, nil)
	rid := last.Header.Get("Rebuno-Request-Id")
	deadline := time.Now().Add(5 * time.Second)
	for !strings.Contains(k.Stderr(), rid) {
		if time.Now().After(deadline) {
			t.Fatalf("request id %s not in the kernel log", rid)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ---- docs/protocol/operations.md §1 ----

// TestAPIHealthReadyMetrics checks the bodies of health and readiness and
// that /metrics names every series docs/protocol/operations.md §1 requires, with closed label sets
// initialised and the route label holding the pattern, never the raw path.
func TestAPIHealthReadyMetrics(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{Token: "metrics-token"})
	for path, want := range map[string]string{"/v0/health": `{"status":"ok"}` + "\n", "/v0/ready": `{"status":"ready"}` + "\n"} {
		// No authentication on these routes, even with a token configured.
		r, err := http.Get(k.URL + path)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(r.Body)
		r.Body.Close()
		if r.StatusCode != 200 || string(b) != want || r.Header.Get("Content-Type") != "application/json; charset=utf-8" {
			t.Fatalf("%s: %d %q %q", path, r.StatusCode, r.Header.Get("Content-Type"), b)
		}
	}

	id := "0190a5b0-0000-7000-8000-00000000abcd"
	k.Must(404, k.Do("GET", "/v0/executions/"+id, nil, nil))

	resp, err := http.Get(k.URL + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	body, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || !strings.HasPrefix(resp.Header.Get("Content-Type"), "text/plain") {
		t.Fatalf("metrics: %d %q", resp.StatusCode, resp.Header.Get("Content-Type"))
	}
	text := string(body)
	required := []string{
		"replay_total", "dispatch_outcomes_total", "dispatch_latency_seconds", "dispatches_reclaimed_total",
		"dispatch_superseded_total", "queue_depth", "policy_latency_seconds", "policy_decisions_total",
		"approval_outcomes_total", "approval_wait_seconds", "steps_submitted_total", "executions_created_total",
		"executions_completed_total", "worker_errors_total", "rate_limit_decisions_total", "http_requests_total",
		"http_request_duration_seconds", "stream_connections", "store_commit_batch_size", "store_commit_seconds",
	}
	for _, name := range required {
		if !regexp.MustCompile(`(?m)^# TYPE rebuno_` + name + ` `).MatchString(text) {
			t.Errorf("metrics: no series rebuno_%s", name)
		}
	}
	// Closed label sets are initialised at 0 (docs/protocol/operations.md §1).
	for _, series := range []string{
		`rebuno_dispatch_outcomes_total{outcome="success"}`, `rebuno_dispatch_outcomes_total{outcome="rejected"}`,
		`rebuno_dispatch_outcomes_total{outcome="exhausted"}`,
		`rebuno_approval_outcomes_total{outcome="granted"}`, `rebuno_approval_outcomes_total{outcome="denied"}`,
		`rebuno_approval_outcomes_total{outcome="expired"}`,
		`rebuno_rate_limit_decisions_total{outcome="limited"}`, `rebuno_rate_limit_decisions_total{outcome="error_allowed"}`,
		`rebuno_rate_limit_decisions_total{outcome="error_denied"}`,
		`rebuno_stream_connections{kind="events"}`, `rebuno_stream_connections{kind="deltas"}`,
	} {
		if !strings.Contains(text, series+" ") {
			t.Errorf("metrics: %s is not initialised", series)
		}
	}
	// Go and process collectors.
	for _, name := range []string{"go_goroutines", "process_start_time_seconds"} {
		if !strings.Contains(text, "\n"+name+" ") {
			t.Errorf("metrics: no %s", name)
		}
	}
	// The route label is the pattern: the 404 above is counted under it and
	// the raw id appears nowhere.
	if !strings.Contains(text, `rebuno_http_requests_total{route="GET /v0/executions/{id}",status="404"} 1`) {
		t.Errorf("metrics: the 404 read is not counted under its route pattern")
	}
	if strings.Contains(text, id) {
		t.Errorf("metrics: raw path parameter %s in a label", id)
	}
	if t.Failed() {
		t.Logf("metrics:\n%s", text)
	}
}
