package blackbox

// Black-box tests of the HTTP surface: the resource shapes of docs/protocol/README.md §5, the common
// HTTP rules of docs/protocol/http.md, executions (docs/protocol/executions.md §2–§4, §11), the event log read of docs/protocol/events.md §1,
// the agents admin API of docs/protocol/governance.md §4 and health, readiness and metrics (docs/protocol/operations.md §1). The
// helpers at the top (prefixed hs, "HTTP surface") are shared by
// badinput_test.go and auth_test.go.

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
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

// hsEnvelope is the error body of docs/protocol/errors.md §1.
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

// hsWantJSON asserts the framing of docs/protocol/http.md §1 on a JSON answer.
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

// hsWantTime asserts the time format of docs/protocol/README.md §3.
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
