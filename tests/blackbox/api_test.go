package blackbox

// Black-box tests of the HTTP surface: the resource shapes of §2, the common
// HTTP rules of §3, executions (§7.1–7.3, §7.10), the event log read of §14.1,
// the agents admin API of §21 and health, readiness and metrics (§22). The
// helpers at the top (prefixed hs, "HTTP surface") are shared by
// badinput_test.go and auth_test.go.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- shared helpers ----

// hsRun is a running execution whose first dispatch has been delivered and
// acknowledged, so that nothing changes its log unless a request does.
type hsRun struct {
	k     *kt.Kernel
	a     *kt.Agent
	id    string
	lease kt.Lease
}

// hsStartRun creates an execution of a and waits for its webhook and for the
// dispatch.acked event that follows it.
func hsStartRun(t *testing.T, k *kt.Kernel, a *kt.Agent, input string) hsRun {
	t.Helper()
	id := k.CreateExecution(a.ID, input)
	wh := hsWebhookFor(t, a, id)
	hsWaitEvent(t, k, id, "dispatch.acked")
	return hsRun{k: k, a: a, id: id, lease: kt.LeaseOf(wh)}
}

// hsWebhookFor waits for the delivery of execution id, skipping deliveries of
// other executions.
func hsWebhookFor(t *testing.T, a *kt.Agent, id string) kt.Webhook {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		wh := a.NextWebhook()
		if wh.ExecutionID == id {
			return wh
		}
	}
	t.Fatalf("no webhook for execution %s", id)
	return kt.Webhook{}
}

// hsWaitEvent polls the log of id until it holds an event of type typ.
func hsWaitEvent(t *testing.T, k *kt.Kernel, id, typ string) {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		if kt.Contains(k.EventTypes(id), typ) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s: no %s event; log %v", id, typ, k.EventTypes(id))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// hsSnapshot captures everything a request could change about an execution
// that clients can observe: the execution, its whole log and its steps.
func hsSnapshot(t *testing.T, k *kt.Kernel, id string) string {
	t.Helper()
	e := k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil))
	ev := k.Must(200, k.Do("GET", "/v0/executions/"+id+"/events?limit=1000", nil, nil))
	st := k.Must(200, k.Do("GET", "/v0/executions/"+id+"/steps", nil, nil))
	return string(e.Body) + string(ev.Body) + string(st.Body)
}

// hsUnchanged fails when the execution differs from the snapshot.
func hsUnchanged(t *testing.T, k *kt.Kernel, id, before, what string) {
	t.Helper()
	if after := hsSnapshot(t, k, id); after != before {
		t.Fatalf("%s wrote to execution %s:\nbefore %s\nafter  %s", what, id, before, after)
	}
}

// hsExecutionIDs lists every execution id (all pages), newest first.
func hsExecutionIDs(t *testing.T, k *kt.Kernel, query string) []string {
	t.Helper()
	var ids []string
	cursor := ""
	for {
		q := "limit=200"
		if query != "" {
			q += "&" + query
		}
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		var page struct {
			Executions []struct {
				ID string `json:"id"`
			} `json:"executions"`
			NextCursor string `json:"next_cursor"`
		}
		k.Must(200, k.Do("GET", "/v0/executions?"+q, nil, nil)).JSON(t, &page)
		for _, e := range page.Executions {
			ids = append(ids, e.ID)
		}
		if page.NextCursor == "" {
			return ids
		}
		cursor = page.NextCursor
	}
}

// hsAgentsBody is the raw agents list, for "nothing written" comparisons.
func hsAgentsBody(t *testing.T, k *kt.Kernel) string {
	t.Helper()
	return string(k.Must(200, k.Do("GET", "/v0/agents", nil, nil)).Body)
}

// hsSend sends a prepared request with the kernel's client.
func hsSend(t *testing.T, k *kt.Kernel, req *http.Request) *kt.Response {
	t.Helper()
	return hsSendWith(t, k.HTTP, req)
}

// hsSendWith sends a prepared request with the given client. A body goes
// out as JSON unless the request names another type, as every client
// library sends it.
func hsSendWith(t *testing.T, client *http.Client, req *http.Request) *kt.Response {
	t.Helper()
	if req.Body != nil && req.ContentLength != 0 && req.Header.Get("Content-Type") == "" {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := client.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatalf("read %s %s: %v", req.Method, req.URL, err)
	}
	return &kt.Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// hsNoRedirect is a client that reports redirects instead of following them.
var hsNoRedirect = &http.Client{
	Timeout:       30 * time.Second,
	CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
}

// hsEnvelope is the error body of §5.1.
type hsEnvelope struct {
	Code    string         `json:"code"`
	Message string         `json:"message"`
	Details map[string]any `json:"details"`
}

// hsWantErr asserts an error answer: status, envelope code, JSON content type,
// one trailing newline and a request id. It returns the envelope.
func hsWantErr(t *testing.T, r *kt.Response, status int, code string) hsEnvelope {
	t.Helper()
	if r.Status != status {
		t.Fatalf("want %d %s, got %s", status, code, r)
	}
	hsWantJSON(t, r)
	var env hsEnvelope
	if err := json.Unmarshal(r.Body, &env); err != nil {
		t.Fatalf("error body is not the envelope: %q: %v", r.Body, err)
	}
	if env.Code != code {
		t.Fatalf("want code %q, got %s", code, r)
	}
	if env.Message == "" {
		t.Fatalf("envelope without message: %s", r.Body)
	}
	return env
}

// hsWantField asserts a 400 whose details.field names field.
func hsWantField(t *testing.T, r *kt.Response, field string) {
	t.Helper()
	env := hsWantErr(t, r, 400, "validation_error")
	if got, _ := env.Details["field"].(string); got != field {
		t.Fatalf("want details.field %q, got %s", field, r.Body)
	}
}

var hsUUIDv7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// hsWantJSON asserts the framing of §3.1 on a JSON answer.
func hsWantJSON(t *testing.T, r *kt.Response) {
	t.Helper()
	if ct := r.Header.Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("Content-Type %q on %s", ct, r)
	}
	if len(r.Body) == 0 || r.Body[len(r.Body)-1] != '\n' || bytes.HasSuffix(r.Body, []byte("\n\n")) {
		t.Fatalf("body must be one JSON value and one newline: %q", r.Body)
	}
	if !json.Valid(r.Body) {
		t.Fatalf("body is not JSON: %q", r.Body)
	}
	hsWantRequestID(t, r)
}

func hsWantRequestID(t *testing.T, r *kt.Response) {
	t.Helper()
	if ids := r.Header.Values("Rebuno-Request-Id"); len(ids) != 1 || !hsUUIDv7.MatchString(ids[0]) {
		t.Fatalf("Rebuno-Request-Id %q on %d", ids, r.Status)
	}
}

// hsSig describes how an agent request is signed.
type hsSig struct {
	ts         string // Rebuno-Timestamp; "" = now
	dispatchID string
	attempt    string
	legacy     bool   // sign the body only (sha256=)
	secret     string // "" = the agent's secret
}

// hsAgentReq builds an agent request signed as s says. Tests change its
// headers afterwards to break it.
func hsAgentReq(t *testing.T, k *kt.Kernel, a *kt.Agent, method, path string, body []byte, s hsSig) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, k.URL+path, bytes.NewReader(body))
	if err != nil {
		t.Fatal(err)
	}
	secret := s.secret
	if secret == "" {
		secret = a.Secret
	}
	req.Header.Set("Rebuno-Agent-Id", a.ID)
	if s.dispatchID != "" {
		req.Header.Set("Rebuno-Dispatch-Id", s.dispatchID)
	}
	if s.attempt != "" {
		req.Header.Set("Rebuno-Dispatch-Attempt", s.attempt)
	}
	if s.legacy {
		req.Header.Set("Rebuno-Signature", auth.SignBody([]byte(secret), body))
		return req
	}
	ts := s.ts
	if ts == "" {
		ts = strconv.FormatInt(time.Now().Unix(), 10)
	}
	req.Header.Set("Rebuno-Timestamp", ts)
	req.Header.Set("Rebuno-Signature", auth.SignV1([]byte(secret), method, req.URL.RequestURI(), ts, s.dispatchID, s.attempt, body))
	return req
}

// hsLeaseSig is the signature setup of a request made under lease.
func hsLeaseSig(l kt.Lease) hsSig {
	s := hsSig{dispatchID: l.DispatchID}
	if l.Attempt > 0 {
		s.attempt = strconv.FormatInt(l.Attempt, 10)
	}
	return s
}

// hsAgentDo sends a v1-signed agent request with the given dispatch headers
// and extra headers (added before signing).
func hsAgentDo(t *testing.T, k *kt.Kernel, a *kt.Agent, method, path string, body []byte, lease kt.Lease, extra map[string]string) *kt.Response {
	t.Helper()
	return hsSend(t, k, a.SignedRequest(method, path, body, lease, extra))
}

// hsRaw writes raw bytes to the kernel's port and reads one response. It
// does not wait for the connection to close, so a server that answers before
// reading a body is seen answering.
func hsRaw(t *testing.T, k *kt.Kernel, raw []byte) (*http.Response, []byte) {
	t.Helper()
	conn, err := net.Dial("tcp", strings.TrimPrefix(k.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := conn.Write(raw); err != nil {
		t.Fatalf("write: %v", err)
	}
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no response: %v", err)
	}
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	return resp, body
}

func hsSHA256(s string) string {
	sum := sha256.Sum256([]byte(s))
	return hex.EncodeToString(sum[:])
}

var hsTime = regexp.MustCompile(`^\d{4}-\d{2}-\d{2}T\d{2}:\d{2}:\d{2}(\.\d{0,8}[1-9])?Z$`)

// hsWantTime asserts the time format of §1.3.
func hsWantTime(t *testing.T, what string, v any) time.Time {
	t.Helper()
	s, ok := v.(string)
	if !ok || !hsTime.MatchString(s) {
		t.Fatalf("%s: %v is not an RFC 3339 UTC time without trailing zeros", what, v)
	}
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	return tm
}

// hsKeys returns the sorted keys of a JSON object.
func hsKeys(m map[string]any) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// hsRawMembers decodes an object keeping each member's raw bytes.
func hsRawMembers(t *testing.T, body []byte) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	if err := json.Unmarshal(body, &m); err != nil {
		t.Fatalf("decode %q: %v", body, err)
	}
	return m
}

// ---- §3.1: framing of every response ----

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

	// The request id is logged (§3.1).
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

// ---- §22 ----

// TestAPIHealthReadyMetrics checks the bodies of health and readiness and
// that /metrics names every series §22 requires, with closed label sets
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
	// Closed label sets are initialised at 0 (§22).
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

// ---- §2.1, §7.1, §7.2: the Execution ----

// TestAPIExecutionShape checks the Execution JSON across its life: the
// fields present, their types, the presence rules and verbatim input and
// output.
func TestAPIExecutionShape(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("shaper", "")

	// Without input, agent_version, key or on_behalf_of.
	r := k.Must(201, k.Do("POST", "/v0/executions", []byte(`{"agent_id":"shaper"}`), nil))
	hsWantJSON(t, r)
	e := r.Map(t)
	if got, want := strings.Join(hsKeys(e), ","), "agent_id,created_at,id,input,resource_keys,status,updated_at"; got != want {
		t.Fatalf("minimal execution keys %s, want %s: %s", got, want, r.Body)
	}
	id := e["id"].(string)
	if !hsUUIDv7.MatchString(id) || e["agent_id"] != "shaper" || e["status"] != "running" || e["input"] != nil {
		t.Fatalf("created execution %s", r.Body)
	}
	if rk, ok := e["resource_keys"].([]any); !ok || len(rk) != 0 {
		t.Fatalf("resource_keys must be [] : %s", r.Body)
	}
	if raw := hsRawMembers(t, r.Body); string(raw["input"]) != "null" || string(raw["resource_keys"]) != "[]" {
		t.Fatalf("input/resource_keys raw %s", r.Body)
	}
	c := hsWantTime(t, "created_at", e["created_at"])
	u := hsWantTime(t, "updated_at", e["updated_at"])
	if u.Before(c) {
		t.Fatalf("updated_at before created_at: %s", r.Body)
	}
	if got := k.Execution(id); got["status"] != "running" || got["id"] != id {
		t.Fatalf("read back %v", got)
	}

	// Every optional field set; input kept byte for byte.
	input := `{ "b" : [1.0, 1E2, -0, 12345678901234567890], "a" : "\u00e9\n" }`
	body := `{"agent_id":"shaper","input":` + input + `,"agent_version":"v-1.2","on_behalf_of":"alice@example.com","idempotency_key":"shape-key-1"}`
	r = k.Must(201, k.Do("POST", "/v0/executions", []byte(body), nil))
	full := r.Map(t)
	fid := full["id"].(string)
	if got, want := strings.Join(hsKeys(full), ","), "agent_id,agent_version,created_at,id,idempotency_key,input,on_behalf_of,resource_keys,status,updated_at"; got != want {
		t.Fatalf("full execution keys %s, want %s", got, want)
	}
	if full["agent_version"] != "v-1.2" || full["on_behalf_of"] != "alice@example.com" || full["idempotency_key"] != "shape-key-1" {
		t.Fatalf("optional fields %s", r.Body)
	}
	for _, b := range [][]byte{r.Body, k.Must(200, k.Do("GET", "/v0/executions/"+fid, nil, nil)).Body} {
		if raw := hsRawMembers(t, b); string(raw["input"]) != input {
			t.Fatalf("input not verbatim: %s", raw["input"])
		}
	}
	// The created log: execution.created carries agent_version (§14.2).
	evs := k.Events(fid)
	if len(evs) < 3 || evs[0].Type != "execution.created" || evs[1].Type != "execution.started" || evs[2].Type != "dispatch.queued" {
		t.Fatalf("create log %v", k.EventTypes(fid))
	}
	if evs[0].Payload["agent_version"] != "v-1.2" || evs[0].Payload["status"] != "pending" || evs[1].Payload["status"] != "running" {
		t.Fatalf("create payloads %+v", evs[:2])
	}
	for i, ev := range evs {
		if ev.Seq != int64(i+1) || ev.ExecutionID != fid {
			t.Fatalf("event %d: %+v", i, ev)
		}
		hsWantTime(t, "occurred_at", ev.OccurredAt)
	}

	// Completed: output present (verbatim), failure_reason absent.
	run := hsStartRunFor(t, k, a, id)
	output := `{"z": 1, "a": [true , null]}`
	k.Must(204, a.Request("POST", "/v0/executions/"+id+"/complete", []byte(`{"output":`+output+`}`), run.lease))
	r = k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil))
	raw := hsRawMembers(t, r.Body)
	if string(raw["output"]) != output || string(raw["status"]) != `"completed"` {
		t.Fatalf("completed execution %s", r.Body)
	}
	if _, ok := raw["failure_reason"]; ok {
		t.Fatalf("failure_reason on a completed execution: %s", r.Body)
	}
	done := r.Map(t)
	if hsWantTime(t, "updated_at", done["updated_at"]).Before(c) {
		t.Fatalf("updated_at not moved: %s", r.Body)
	}

	// Completed with no output: "output": null is present.
	nid := k.CreateExecution("shaper", `null`)
	nrun := hsStartRunFor(t, k, a, nid)
	k.Must(204, a.Request("POST", "/v0/executions/"+nid+"/complete", []byte(`{}`), nrun.lease))
	if raw := hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/executions/"+nid, nil, nil)).Body); string(raw["output"]) != "null" {
		t.Fatalf("completed without output: output %q", raw["output"])
	}

	// Cancelled: failure_reason, no output.
	k.Must(204, k.Do("POST", "/v0/executions/"+fid+"/cancel", nil, nil))
	r = k.Must(200, k.Do("GET", "/v0/executions/"+fid, nil, nil))
	cancelled := r.Map(t)
	if cancelled["status"] != "cancelled" || cancelled["failure_reason"] != "client_cancelled" {
		t.Fatalf("cancelled %s", r.Body)
	}
	if _, ok := cancelled["output"]; ok {
		t.Fatalf("output on a cancelled execution: %s", r.Body)
	}
	// Cancel again, cancel unknown (§7.6).
	hsWantErr(t, k.Do("POST", "/v0/executions/"+fid+"/cancel", nil, nil), 409, "execution_terminal")
	hsWantErr(t, k.Do("POST", "/v0/executions/0190a5b0-0000-7000-8000-000000000001/cancel", nil, nil), 404, "not_found")

	// Failed by the agent: failure_reason is its text; no null anywhere.
	xid := k.CreateExecution("shaper", `1`)
	xrun := hsStartRunFor(t, k, a, xid)
	k.Must(204, a.Request("POST", "/v0/executions/"+xid+"/fail", []byte(`{"error":"tool broke"}`), xrun.lease))
	for _, eid := range []string{id, nid, fid, xid} {
		b := k.Must(200, k.Do("GET", "/v0/executions/"+eid, nil, nil)).Body
		for key, v := range hsRawMembers(t, b) {
			if string(v) == "null" && key != "input" && key != "output" {
				t.Fatalf("%s is null: %s", key, b)
			}
		}
	}
	if x := k.Execution(xid); x["status"] != "failed" || x["failure_reason"] != "tool broke" {
		t.Fatalf("failed execution %v", x)
	}
}

// hsStartRunFor waits for the delivery of an execution created elsewhere.
func hsStartRunFor(t *testing.T, k *kt.Kernel, a *kt.Agent, id string) hsRun {
	t.Helper()
	wh := hsWebhookFor(t, a, id)
	hsWaitEvent(t, k, id, "dispatch.acked")
	return hsRun{k: k, a: a, id: id, lease: kt.LeaseOf(wh)}
}

// ---- §7.3 ----

type hsPage struct {
	Executions []map[string]any `json:"executions"`
	NextCursor *string          `json:"next_cursor"`
}

func hsList(t *testing.T, k *kt.Kernel, query string) (hsPage, []string) {
	t.Helper()
	r := k.Must(200, k.Do("GET", "/v0/executions?"+query, nil, nil))
	hsWantJSON(t, r)
	var p hsPage
	r.JSON(t, &p)
	if p.Executions == nil {
		t.Fatalf("executions missing or null: %s", r.Body)
	}
	var ids []string
	for _, e := range p.Executions {
		ids = append(ids, e["id"].(string))
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] >= ids[i-1] {
			t.Fatalf("list %q not newest first: %v", query, ids)
		}
	}
	return p, ids
}

// TestAPIExecutionList covers paging (default and clamped limits, next_cursor
// present if and only if more exist, keyset stability) and the filters.
func TestAPIExecutionList(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	k.NewAgent("lister", "")
	k.NewAgent("other", "")

	p, _ := hsList(t, k, "")
	if len(p.Executions) != 0 || p.NextCursor != nil {
		t.Fatalf("empty list %+v", p)
	}
	if r := k.Do("GET", "/v0/executions", nil, nil); !strings.Contains(string(r.Body), `"executions":[]`) {
		t.Fatalf("empty list must be []: %s", r.Body)
	}

	// 205 executions of lister, created concurrently in 5 streams.
	const n = 205
	created := make(chan string, n)
	errs := make(chan string, n)
	for w := 0; w < 5; w++ {
		go func() {
			for i := 0; i < n/5; i++ {
				resp, err := http.Post(k.URL+"/v0/executions", "application/json", strings.NewReader(`{"agent_id":"lister"}`))
				if err != nil {
					errs <- err.Error()
					continue
				}
				var e struct{ ID string }
				json.NewDecoder(resp.Body).Decode(&e)
				resp.Body.Close()
				if resp.StatusCode != 201 {
					errs <- resp.Status
					continue
				}
				created <- e.ID
			}
		}()
	}
	all := map[string]bool{}
	for len(all) < n {
		select {
		case id := <-created:
			all[id] = true
		case e := <-errs:
			t.Fatalf("create: %s", e)
		case <-time.After(60 * time.Second):
			t.Fatalf("only %d creates", len(all))
		}
	}
	// Three of the other agent, created after all of lister's.
	var others []string
	for i := 0; i < 3; i++ {
		others = append(others, k.CreateExecution("other", `null`))
	}

	// Default limit 50; limit=0 and an empty value are the same.
	for _, q := range []string{"", "limit=0", "limit=", "agent_id=lister"} {
		p, ids := hsList(t, k, q)
		if len(ids) != 50 || p.NextCursor == nil || *p.NextCursor != ids[49] {
			t.Fatalf("%q: %d items, next_cursor %v", q, len(ids), p.NextCursor)
		}
	}
	// Newest first: the other agent's (created last) lead the unfiltered list.
	_, ids := hsList(t, k, "limit=3")
	for i, id := range ids {
		if id != others[2-i] {
			t.Fatalf("newest first: got %v, created %v", ids, others)
		}
	}
	// Clamped to 200.
	for _, q := range []string{"limit=100000", "limit=200", "limit=9223372036854775807"} {
		p, ids := hsList(t, k, q+"&agent_id=lister")
		if len(ids) != 200 || p.NextCursor == nil {
			t.Fatalf("%q: %d items", q, len(ids))
		}
	}
	p, ids = hsList(t, k, "limit=1")
	if len(ids) != 1 || p.NextCursor == nil {
		t.Fatalf("limit=1: %+v", p)
	}

	// Keyset paging: walk lister's executions 60 at a time while new ones
	// are created; the walk sees exactly the original set.
	var walked []string
	cursor := ""
	for page := 0; ; page++ {
		q := "agent_id=lister&limit=60"
		if cursor != "" {
			q += "&cursor=" + cursor
		}
		p, ids := hsList(t, k, q)
		walked = append(walked, ids...)
		if page == 0 {
			for i := 0; i < 2; i++ {
				k.CreateExecution("lister", `"late"`)
			}
		}
		if p.NextCursor == nil {
			if len(ids) != n-60*page {
				t.Fatalf("last page has %d", len(ids))
			}
			break
		}
		if *p.NextCursor != ids[len(ids)-1] {
			t.Fatalf("next_cursor %s is not the last id %s", *p.NextCursor, ids[len(ids)-1])
		}
		cursor = *p.NextCursor
	}
	if len(walked) != n {
		t.Fatalf("walked %d executions, want %d", len(walked), n)
	}
	for _, id := range walked {
		if !all[id] {
			t.Fatalf("walk returned %s, created after the first page or never", id)
		}
		delete(all, id)
	}

	// next_cursor present if and only if more exist, at the exact edge.
	p, ids = hsList(t, k, "agent_id=other&limit=3")
	if len(ids) != 3 || p.NextCursor != nil {
		t.Fatalf("exactly limit items left: next_cursor %v", p.NextCursor)
	}
	p, ids = hsList(t, k, "agent_id=other&limit=2")
	if len(ids) != 2 || p.NextCursor == nil || *p.NextCursor != others[1] {
		t.Fatalf("agent_id=other&limit=2: %v %v", ids, p.NextCursor)
	}
	p, ids = hsList(t, k, "agent_id=other&limit=2&cursor="+strings.ToUpper(*p.NextCursor))
	if len(ids) != 1 || ids[0] != others[0] || p.NextCursor != nil {
		t.Fatalf("second page %v %v", ids, p.NextCursor)
	}

	// Filters.
	k.Must(204, k.Do("POST", "/v0/executions/"+others[1]+"/cancel", nil, nil))
	_, ids = hsList(t, k, "status=cancelled")
	if len(ids) != 1 || ids[0] != others[1] {
		t.Fatalf("status=cancelled: %v", ids)
	}
	_, ids = hsList(t, k, "status=running&agent_id=other")
	if len(ids) != 2 || ids[0] != others[2] || ids[1] != others[0] {
		t.Fatalf("status=running&agent_id=other: %v", ids)
	}
	for _, q := range []string{"status=completed", "status=blocked", "status=pending", "status=failed", "agent_id=nobody", "agent_id=" + strings.Repeat("x", 128)} {
		if _, ids := hsList(t, k, q); len(ids) != 0 {
			t.Fatalf("%s: %v", q, ids)
		}
	}
	for _, e := range p.Executions {
		if e["agent_id"] != "other" {
			t.Fatalf("agent filter leaked %v", e)
		}
	}
	// Unknown query parameters are ignored.
	if _, ids := hsList(t, k, "agent_id=other&colour=blue&page=7"); len(ids) != 3 {
		t.Fatalf("unknown parameters changed the answer: %v", ids)
	}
}

// ---- §14.1 ----

// TestAPIEventsPaging reads a log of more than 1,000 events with every
// combination of after_seq and limit.
func TestAPIEventsPaging(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("pager", "")
	run := hsStartRun(t, k, a, `null`)
	const steps = 334 // 3 events each, plus 4 from the start: 1,006 events
	for i := 0; i < steps; i++ {
		r := a.Request("POST", "/v0/executions/"+run.id+"/steps", fmt.Appendf(nil, `{"kind":"local","target":"s","args":%d}`, i), run.lease)
		k.Must(200, r)
	}
	const total = 4 + 3*steps

	read := func(q string) []kt.Event {
		t.Helper()
		r := k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/events"+q, nil, nil))
		hsWantJSON(t, r)
		var evs []kt.Event
		r.JSON(t, &evs)
		if evs == nil {
			t.Fatalf("%s: not an array: %.80s", q, r.Body)
		}
		for i := 1; i < len(evs); i++ {
			if evs[i].Seq != evs[i-1].Seq+1 {
				t.Fatalf("%s: gap or disorder at %d", q, i)
			}
		}
		return evs
	}
	cases := []struct {
		q           string
		first, size int64
	}{
		{"", 1, 100},
		{"?limit=0", 1, 100},
		{"?limit=", 1, 100},
		{"?after_seq=", 1, 100},
		{"?limit=1", 1, 1},
		{"?limit=1000", 1, 1000},
		{"?limit=100000", 1, 1000},
		{"?limit=9223372036854775807", 1, 1000},
		{"?after_seq=0&limit=5", 1, 5},
		{"?after_seq=5&limit=3", 6, 3},
		{"?after_seq=1000&limit=1000", 1001, total - 1000},
		{"?after_seq=900", 901, 100},
		{fmt.Sprintf("?after_seq=%d", total-1), total, 1},
		{fmt.Sprintf("?after_seq=%d", total), 0, 0},
		{"?after_seq=9223372036854775807", 0, 0},
		{"?after_seq=3&limit=2&unknown=1", 4, 2},
	}
	for _, c := range cases {
		evs := read(c.q)
		if int64(len(evs)) != c.size || (c.size > 0 && evs[0].Seq != c.first) {
			first := int64(-1)
			if len(evs) > 0 {
				first = evs[0].Seq
			}
			t.Errorf("%q: %d events from %d, want %d from %d", c.q, len(evs), first, c.size, c.first)
		}
	}
	if r := k.Do("GET", "/v0/executions/"+run.id+fmt.Sprintf("/events?after_seq=%d", total), nil, nil); string(r.Body) != "[]\n" {
		t.Fatalf("no events must be []: %q", r.Body)
	}
	hsWantErr(t, k.Do("GET", "/v0/executions/0190a5b0-0000-7000-8000-000000000002/events", nil, nil), 404, "not_found")
}

// ---- §7.2 steps ----

// TestAPISteps checks the steps list (recording order, every status filter,
// streaming framing) and single step reads, including a step named under
// another execution.
func TestAPISteps(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("stepper", "")
	run := hsStartRun(t, k, a, `null`)
	run2 := hsStartRun(t, k, a, `null`)
	sub := func(target, args string) string {
		d := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"`+target+`","args":`+args+`}`)
		if d.Decision != "proceed" {
			t.Fatalf("submit %s: %+v", target, d)
		}
		return d.StepID
	}
	// Recording order differs from step id order with near certainty; use
	// enough steps that the check means something.
	var order []string
	for i := 0; i < 6; i++ {
		order = append(order, sub(fmt.Sprintf("t%d", i), fmt.Sprintf(`{"i":%d}`, i)))
	}
	result := `{"rows": [1, 2.50, "x"]}`
	errVal := `{"reason" : "boom", "code": 7}`
	k.Must(200, a.Request("POST", "/v0/executions/"+run.id+"/steps/"+order[0]+"/complete", []byte(`{"result":`+result+`}`), run.lease))
	k.Must(200, a.Request("POST", "/v0/executions/"+run.id+"/steps/"+order[1]+"/fail", []byte(`{"error":`+errVal+`}`), run.lease))
	a.Complete(run.id, order[3], run.lease, `null`)
	a.Complete(run.id, order[5], run.lease, `7`)
	other := a.Submit(run2.id, run2.lease, `{"kind":"tool_call","target":"t0","args":{"i":0}}`).StepID

	list := func(q string) []map[string]any {
		t.Helper()
		r := k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps"+q, nil, nil))
		hsWantJSON(t, r)
		var steps []map[string]any
		r.JSON(t, &steps)
		if steps == nil {
			t.Fatalf("%s: not an array: %s", q, r.Body)
		}
		return steps
	}
	ids := func(steps []map[string]any) string {
		var out []string
		for _, s := range steps {
			out = append(out, s["step_id"].(string))
		}
		return strings.Join(out, ",")
	}
	pick := func(idx ...int) string {
		var out []string
		for _, i := range idx {
			out = append(out, order[i])
		}
		return strings.Join(out, ",")
	}
	filters := map[string]string{
		"":                          pick(0, 1, 2, 3, 4, 5),
		"?status=":                  pick(0, 1, 2, 3, 4, 5),
		"?status=terminal":          pick(0, 1, 3, 5),
		"?status=pending":           pick(2, 4),
		"?status=executing":         pick(2, 4),
		"?status=succeeded":         pick(0, 3, 5),
		"?status=failed":            pick(1),
		"?status=denied":            "",
		"?status=cancelled":         "",
		"?status=proposed":          "",
		"?status=allowed":           "",
		"?status=awaiting_approval": "",
		"?status=terminal&x=y":      pick(0, 1, 3, 5),
	}
	for q, want := range filters {
		if got := ids(list(q)); got != want {
			t.Errorf("steps%s:\n got %s\nwant %s", q, got, want)
		}
	}
	if r := k.Do("GET", "/v0/executions/"+run.id+"/steps?status=denied", nil, nil); string(r.Body) != "[]\n" {
		t.Fatalf("empty steps list must be []: %q", r.Body)
	}

	// Step shapes.
	steps := list("")
	for i, s := range steps {
		if s["execution_id"] != run.id || s["kind"] != "tool_call" || s["target"] != fmt.Sprintf("t%d", i) ||
			s["occurrence"] != 0.0 || s["idempotency"] != "safe_to_retry" || len(s["args_hash"].(string)) != 64 {
			t.Fatalf("step %d: %v", i, s)
		}
		if rs, ok := s["resources"].([]any); !ok || len(rs) != 0 {
			t.Fatalf("step %d resources: %v", i, s["resources"])
		}
		hsWantTime(t, "started_at", s["started_at"])
		_, hasResult := s["result"]
		_, hasError := s["error"]
		_, hasCompleted := s["completed_at"]
		switch s["status"] {
		case "succeeded":
			if !hasResult || hasError || !hasCompleted {
				t.Fatalf("succeeded step fields %v", hsKeys(s))
			}
		case "failed":
			if hasResult || !hasError || !hasCompleted {
				t.Fatalf("failed step fields %v", hsKeys(s))
			}
		case "executing":
			if hasResult || hasError || hasCompleted {
				t.Fatalf("executing step fields %v", hsKeys(s))
			}
		}
	}
	wantArgsHash := hsSHA256(`{"i":0}`)
	r := k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+order[0], nil, nil))
	hsWantJSON(t, r)
	raw := hsRawMembers(t, r.Body)
	if string(raw["result"]) != result || string(raw["args"]) != `{"i":0}` || string(raw["args_hash"]) != `"`+wantArgsHash+`"` {
		t.Fatalf("step read %s", r.Body)
	}
	raw = hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+order[1], nil, nil)).Body)
	if string(raw["error"]) != errVal {
		t.Fatalf("failed step error %s", raw["error"])
	}
	// Reads of a step under the wrong execution, and of unknown steps.
	hsWantErr(t, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+other, nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/"+run2.id+"/steps/"+order[2], nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+strings.Repeat("0", 64), nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/0190a5b0-0000-7000-8000-000000000003/steps/"+order[0], nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/0190a5b0-0000-7000-8000-000000000003/steps", nil, nil), 404, "not_found")
	k.Must(200, k.Do("GET", "/v0/executions/"+run2.id+"/steps/"+other, nil, nil))

	// After a cancel the executing steps are cancelled (§7.8) and the
	// filters follow.
	k.Must(204, k.Do("POST", "/v0/executions/"+run.id+"/cancel", nil, nil))
	if got, want := ids(list("?status=cancelled")), pick(2, 4); got != want {
		t.Fatalf("cancelled filter %s, want %s", got, want)
	}
	if got := ids(list("?status=pending")); got != "" {
		t.Fatalf("pending after cancel: %s", got)
	}
	if got, want := ids(list("?status=terminal")), pick(0, 1, 2, 3, 4, 5); got != want {
		t.Fatalf("terminal after cancel %s, want %s", got, want)
	}
	raw = hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+order[2], nil, nil)).Body)
	if string(raw["error"]) != `{"reason":"execution_cancelled"}` || raw["completed_at"] == nil {
		t.Fatalf("cancelled step %v", raw)
	}
}

// ---- §7.10 ----

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

// ---- §21 ----

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
	// Creating for the deleted agent is 404 (§7.1).
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
