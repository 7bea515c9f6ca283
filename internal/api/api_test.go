package api

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/google/uuid"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

var (
	t0    = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
)

const (
	secret = "agent-secret-0123456789"
	token  = "s3cret-Token"
)

// env is an HTTP server over a real kernel, SQLite store and manual clock.
type env struct {
	t   *testing.T
	s   *Server
	k   *kernel.Kernel
	clk *clock.Manual
	ctx context.Context
}

func newEnv(t *testing.T, setup ...func(o *Options)) *env {
	t.Helper()
	st, err := sqlite.Open(sqlite.Options{Path: filepath.Join(t.TempDir(), "k.db"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(t0)
	k := kernel.New(kernel.Options{Store: st, Clock: clk, Config: kernel.DefaultConfig(), Logger: quiet})
	o := Options{MaxBodyBytes: 10 << 20, MaxStreams: 100, MaxWaits: 100, Logger: quiet}
	for _, f := range setup {
		f(&o)
	}
	return &env{t: t, s: New(k, o), k: k, clk: clk, ctx: context.Background()}
}

func withToken(o *Options) { o.BearerToken = token }

// req is one request to send.
type req struct {
	method, target, body string
	header               http.Header
	// agent signs the request with v1 as this agent (secret is the shared
	// test secret unless key is set).
	agent string
	key   string
	// legacy signs with the body-only form instead.
	legacy bool
	bearer bool
}

func (v *env) do(r req) *httptest.ResponseRecorder {
	v.t.Helper()
	var body io.Reader = strings.NewReader(r.body)
	hr := httptest.NewRequest(r.method, r.target, body)
	// As a client on the same machine sends it: to localhost, JSON as JSON.
	hr.Host = "localhost:8080"
	if r.body != "" {
		hr.Header.Set("Content-Type", "application/json")
	}
	for name, vals := range r.header {
		hr.Header.Del(name)
		for _, val := range vals {
			hr.Header.Add(name, val)
		}
	}
	if hosts := r.header.Values("Host"); len(hosts) > 0 {
		hr.Host = hosts[0]
	}
	if r.bearer {
		hr.Header.Set("Authorization", "Bearer "+token)
	}
	if r.agent != "" {
		key := secret
		if r.key != "" {
			key = r.key
		}
		hr.Header.Set(wire.HeaderAgentID, r.agent)
		if r.legacy {
			hr.Header.Set(wire.HeaderSignature, auth.SignBody([]byte(key), []byte(r.body)))
		} else {
			ts := strconv.FormatInt(time.Now().Unix(), 10)
			hr.Header.Set(wire.HeaderTimestamp, ts)
			sig := auth.SignV1([]byte(key), r.method, hr.RequestURI, ts,
				hr.Header.Get(wire.HeaderDispatchID), hr.Header.Get(wire.HeaderDispatchAttempt), []byte(r.body))
			hr.Header.Set(wire.HeaderSignature, sig)
			if occ := hr.Header.Get(wire.HeaderStepOccurrence); occ != "" {
				hr.Header.Set(wire.HeaderOccurrenceSignature, auth.SignOccurrence([]byte(key), sig, occ))
			}
		}
	}
	rec := httptest.NewRecorder()
	v.s.ServeHTTP(rec, hr)
	return rec
}

// errorOf checks a JSON error envelope and returns its parsed body.
func errorOf(t *testing.T, rec *httptest.ResponseRecorder, status int, code string) *jsonx.Value {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body.String())
	}
	body := rec.Body.Bytes()
	if len(body) == 0 || body[len(body)-1] != '\n' {
		t.Fatalf("body %q does not end with one newline", body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("Content-Type = %q", ct)
	}
	v, err := jsonx.Parse(body, 128)
	if err != nil {
		t.Fatalf("error body is not JSON: %v (%s)", err, body)
	}
	if got := v.Get("code"); got == nil || got.Str != code {
		t.Fatalf("code = %s, want %s (body %s)", got.Raw, code, body)
	}
	if v.Get("message") == nil || v.Get("message").Kind != jsonx.KindString {
		t.Fatalf("no message in %s", body)
	}
	for _, m := range v.Members {
		if m.Key != "code" && m.Key != "message" && m.Key != "details" {
			t.Fatalf("unexpected member %q in %s", m.Key, body)
		}
	}
	return v
}

func jsonOf(t *testing.T, rec *httptest.ResponseRecorder, status int) *jsonx.Value {
	t.Helper()
	if rec.Code != status {
		t.Fatalf("status = %d, want %d; body %s", rec.Code, status, rec.Body.String())
	}
	body := rec.Body.Bytes()
	if len(body) == 0 || body[len(body)-1] != '\n' || (len(body) > 1 && body[len(body)-2] == '\n') {
		t.Fatalf("body %q is not one JSON value followed by a single newline", body)
	}
	if ct := rec.Header().Get("Content-Type"); ct != "application/json; charset=utf-8" {
		t.Fatalf("Content-Type = %q", ct)
	}
	v, err := jsonx.Parse(body, 128)
	if err != nil {
		t.Fatalf("body is not JSON: %v (%s)", err, body)
	}
	return v
}

func field(v *jsonx.Value, path ...string) *jsonx.Value {
	for _, p := range path {
		v = v.Get(p)
	}
	return v
}

// agent registers an agent directly through the kernel.
func (v *env) agent(id string) {
	v.t.Helper()
	if _, err := v.k.RegisterAgent(v.ctx, kernel.AgentSpec{ID: id, WebhookURL: "http://127.0.0.1:9/" + id, Secret: secret}); err != nil {
		v.t.Fatal(err)
	}
}

// start creates an execution of agent and claims its dispatch.
func (v *env) start(agent string) (*store.Execution, *kernel.Delivery) {
	v.t.Helper()
	if _, err := v.k.GetAgent(v.ctx, agent); err != nil {
		v.agent(agent)
	}
	e, err := v.k.CreateExecution(v.ctx, kernel.CreateRequest{AgentID: agent})
	if err != nil {
		v.t.Fatal(err)
	}
	del, err := v.k.ClaimDispatch(v.ctx, store.DispatchRef{ID: e.DispatchID, ExecutionID: e.ID})
	if err != nil || del == nil {
		v.t.Fatalf("claim: %+v, %v", del, err)
	}
	return e, del
}

func dispatchHeader(del *kernel.Delivery) http.Header {
	return http.Header{wire.HeaderDispatchID: {del.DispatchID}, wire.HeaderDispatchAttempt: {strconv.FormatInt(del.Attempt, 10)}}
}

func TestEveryResponseCarriesARequestID(t *testing.T) {
	v := newEnv(t)
	seen := map[string]bool{}
	for _, r := range []req{
		{method: "GET", target: "/v0/health"},
		{method: "GET", target: "/nope"},
		{method: "DELETE", target: "/v0/health"},
		{method: "GET", target: "/v0/executions/abc"},
	} {
		rec := v.do(r)
		id := rec.Header().Get(wire.HeaderRequestID)
		u, err := uuid.Parse(id)
		if err != nil || u.Version() != 7 || id != strings.ToLower(id) {
			t.Fatalf("%s %s: Rebuno-Request-Id %q is not a lowercase UUIDv7", r.method, r.target, id)
		}
		if seen[id] {
			t.Fatalf("request id %s repeated", id)
		}
		seen[id] = true
	}
}

func TestRouterMatch(t *testing.T) {
	var rt router
	h := func(*call) error { return nil }
	rt.add(&route{method: "GET", pattern: "/v0/executions/{id}", handle: h})
	rt.add(&route{method: "POST", pattern: "/v0/executions/{id}/steps", handle: h})
	rt.add(&route{method: "GET", pattern: "/v0/executions/{id}/steps", handle: h})
	rt.add(&route{method: "GET", pattern: "/v0/executions/{id}/steps/{step_id}", handle: h})
	rt.add(&route{method: "PUT", pattern: "/v0/x", handle: h})
	rt.add(&route{method: "DELETE", pattern: "/v0/x", handle: h})
	rt.add(&route{method: "DELETE", pattern: "/v0/{y}", handle: h})

	r, params, allowed := rt.match("GET", "/v0/executions/abc/steps/def")
	if r == nil || r.pattern != "/v0/executions/{id}/steps/{step_id}" || params["id"] != "abc" || params["step_id"] != "def" || allowed != nil {
		t.Fatalf("match = %+v %v %v", r, params, allowed)
	}
	if r, params, _ := rt.match("POST", "/v0/executions/E/steps"); r == nil || r.method != "POST" || params["id"] != "E" {
		t.Fatalf("POST steps = %+v %v", r, params)
	}
	for _, path := range []string{"/v0/executions/abc/", "/v0/executions/", "/v0/executions//steps", "/v0/executions/abc/steps/def/", "v0/x", "", "/v0/executions/a/b"} {
		if r, _, allowed := rt.match("GET", path); r != nil || len(allowed) != 0 {
			t.Errorf("%q matched %+v (allowed %v)", path, r, allowed)
		}
	}
	if r, _, allowed := rt.match("PATCH", "/v0/executions/abc/steps"); r != nil || strings.Join(allowed, ",") != "GET,POST" {
		t.Fatalf("PATCH = %+v, allowed %v; want sorted GET,POST", r, allowed)
	}
	// Two patterns matching one path both contribute; duplicates collapse.
	_, _, allowed = rt.match("GET", "/v0/x")
	if got := allowHeader(allowed); got != "DELETE, PUT" {
		t.Fatalf("Allow = %q, want %q", got, "DELETE, PUT")
	}
	if got := allowHeader([]string{"DELETE", "DELETE", "GET", "POST", "POST"}); got != "DELETE, GET, POST" {
		t.Fatalf("allowHeader = %q", got)
	}
}

func TestUnknownRoutesAndMethods(t *testing.T) {
	v := newEnv(t)
	id := "0190aaaa-0000-7000-8000-000000000000"
	for _, target := range []string{"/v0/executions/", "/v0/nope", "/v0/executions/" + id + "/suspend", "/v0/health/", "/", "/v1/executions", "/v0//health", "/v0/executions/" + id + "/steps/"} {
		for _, method := range []string{"GET", "POST"} {
			rec := v.do(req{method: method, target: target})
			body := errorOf(t, rec, 404, wire.CodeNotFound)
			if got := body.Get("message").Str; got != "route not found" {
				t.Fatalf("%s %s: message %q", method, target, got)
			}
			if rec.Header().Get("Location") != "" {
				t.Fatalf("%s %s redirected", method, target)
			}
		}
	}
	for _, tc := range []struct{ method, target, allow string }{
		{"DELETE", "/v0/executions", "GET, POST"},
		{"PUT", "/v0/agents/a1", "DELETE, GET"},
		{"GET", "/v0/agents/a1/metadata", "PUT"},
		{"POST", "/v0/health", "GET"},
		{"GET", "/v0/executions/" + id + "/cancel", "POST"},
		{"PATCH", "/v0/executions/" + id + "/steps", "GET, POST"},
		{"POST", "/v0/approvals/" + id, "GET"},
		{"HEAD", "/metrics", "GET"},
	} {
		rec := v.do(req{method: tc.method, target: tc.target})
		errorOf(t, rec, 405, wire.CodeMethodNotAllowed)
		if got := rec.Header().Get("Allow"); got != tc.allow {
			t.Fatalf("%s %s: Allow = %q, want %q", tc.method, tc.target, got, tc.allow)
		}
	}
}

// TestOrderOfChecks walks docs/protocol/http.md §8: route and method, body size, authentication,
// syntax, existence and ownership, state.
func TestOrderOfChecks(t *testing.T) {
	v := newEnv(t, withToken, func(o *Options) { o.MaxBodyBytes = 65536 })
	e, del := v.start("a1")
	v.agent("a2")
	big := `{"agent_id":"` + strings.Repeat("x", 70000) + `"}`
	unknown := "0190aaaa-0000-7000-8000-000000000000"

	// 405 before 413 before 401.
	errorOf(t, v.do(req{method: "PUT", target: "/v0/executions", body: big}), 405, wire.CodeMethodNotAllowed)
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions", body: big}), 413, wire.CodePayloadTooLarge)
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/steps", body: big}), 413, wire.CodePayloadTooLarge)
	// 401 before 400.
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions", body: "{not json"}), 401, wire.CodeUnauthorized)
	errorOf(t, v.do(req{method: "GET", target: "/v0/executions/not-a-uuid"}), 401, wire.CodeUnauthorized)
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/not-a-uuid/steps", body: "{"}), 401, wire.CodeUnauthorized)
	// 400 before 404.
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions", body: "{not json", bearer: true}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "GET", target: "/v0/executions/not-a-uuid", bearer: true}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/not-a-uuid/steps", body: `{"kind":"tool_call"}`, agent: "a1", header: dispatchHeader(del)}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/" + unknown + "/steps", body: `{"kind":"shell"}`, agent: "a1", header: dispatchHeader(del)}), 400, wire.CodeValidation)
	// 404, then 403.
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions", body: `{"agent_id":"ghost"}`, bearer: true}), 404, wire.CodeNotFound)
	errorOf(t, v.do(req{method: "GET", target: "/v0/executions/" + unknown, bearer: true}), 404, wire.CodeNotFound)
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/" + unknown + "/steps", body: `{"kind":"tool_call"}`, agent: "a2", header: dispatchHeader(del)}), 404, wire.CodeNotFound)
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/steps", body: `{"kind":"tool_call"}`, agent: "a2", header: dispatchHeader(del)}), 403, wire.CodeForbidden)
	// State last.
	if err := v.k.CancelExecution(v.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/cancel", bearer: true}), 409, wire.CodeExecutionTerminal)
	// A body streamed past the limit without a Content-Length is 413 too.
	hr := httptest.NewRequest("POST", "/v0/executions", io.MultiReader(strings.NewReader(big)))
	hr.Host = "localhost:8080"
	hr.ContentLength = -1
	hr.Header.Set("Authorization", "Bearer "+token)
	rec := httptest.NewRecorder()
	v.s.ServeHTTP(rec, hr)
	errorOf(t, rec, 413, wire.CodePayloadTooLarge)
	// A declared Content-Length over the limit is refused without reading.
	probe := &readProbe{}
	hr = httptest.NewRequest("POST", "/v0/executions", probe)
	hr.Host = "localhost:8080"
	hr.ContentLength = 1 << 30
	rec = httptest.NewRecorder()
	v.s.ServeHTTP(rec, hr)
	errorOf(t, rec, 413, wire.CodePayloadTooLarge)
	if probe.reads != 0 {
		t.Fatalf("the body was read %d times despite its Content-Length", probe.reads)
	}
	// Exactly at the limit is read.
	exact := `{"agent_id":"` + strings.Repeat("x", 65536-15) + `"}`
	if len(exact) != 65536 {
		t.Fatalf("setup: %d bytes", len(exact))
	}
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions", body: exact, bearer: true}), 404, wire.CodeNotFound)
}

func TestBearerAuthentication(t *testing.T) {
	v := newEnv(t, withToken)
	v.agent("a1")
	list := func(h http.Header) int { return v.do(req{method: "GET", target: "/v0/agents", header: h}).Code }
	for name, h := range map[string]http.Header{
		"missing":          nil,
		"wrong token":      {"Authorization": {"Bearer nope"}},
		"wrong case token": {"Authorization": {"Bearer " + strings.ToLower(token)}},
		"no scheme":        {"Authorization": {token}},
		"two spaces":       {"Authorization": {"Bearer  " + token}},
		"basic":            {"Authorization": {"Basic " + token}},
		"repeated":         {"Authorization": {"Bearer " + token, "Bearer " + token}},
		"hmac headers":     {wire.HeaderAgentID: {"a1"}, wire.HeaderSignature: {"v1=" + strings.Repeat("0", 64)}},
	} {
		if code := list(h); code != 401 {
			t.Errorf("%s: status %d, want 401", name, code)
		}
	}
	for _, scheme := range []string{"Bearer", "bearer", "BEARER"} {
		if code := list(http.Header{"Authorization": {scheme + " " + token}}); code != 200 {
			t.Errorf("scheme %q: status %d", scheme, code)
		}
	}
	rec := v.do(req{method: "GET", target: "/v0/agents"})
	if got := errorOf(t, rec, 401, wire.CodeUnauthorized).Get("message").Str; got != "unauthorized" {
		t.Fatalf("message = %q", got)
	}
	// Without a configured token bearer routes are open and ignore the header.
	open := newEnv(t)
	if code := open.do(req{method: "GET", target: "/v0/agents", header: http.Header{"Authorization": {"Bearer whatever"}}}).Code; code != 200 {
		t.Fatalf("open kernel answered %d", code)
	}
	// Health, readiness and metrics need nothing.
	for _, target := range []string{"/v0/health", "/v0/ready", "/metrics"} {
		if code := v.do(req{method: "GET", target: target}).Code; code != 200 {
			t.Errorf("%s: %d", target, code)
		}
	}
}

func TestHMACAndDualAuthentication(t *testing.T) {
	v := newEnv(t, withToken)
	e, del := v.start("a1")
	v.agent("a2")
	get := "/v0/executions/" + e.ID
	// Dual: bearer, or HMAC scoped to the agent.
	jsonOf(t, v.do(req{method: "GET", target: get, bearer: true}), 200)
	jsonOf(t, v.do(req{method: "GET", target: get, agent: "a1"}), 200)
	errorOf(t, v.do(req{method: "GET", target: get, agent: "a2"}), 403, wire.CodeForbidden)
	errorOf(t, v.do(req{method: "GET", target: get}), 401, wire.CodeUnauthorized)
	// An agent header alone selects HMAC, which then fails.
	errorOf(t, v.do(req{method: "GET", target: get, bearer: true, header: http.Header{wire.HeaderAgentID: {"a1"}}}), 401, wire.CodeUnauthorized)
	// A timestamp alone does not.
	jsonOf(t, v.do(req{method: "GET", target: get, bearer: true, header: http.Header{wire.HeaderTimestamp: {"1"}}}), 200)

	hb := "/v0/executions/" + e.ID + "/heartbeat"
	for name, r := range map[string]req{
		"bearer on an hmac route": {method: "POST", target: hb, bearer: true, header: dispatchHeader(del)},
		"wrong secret":            {method: "POST", target: hb, agent: "a1", key: "other", header: dispatchHeader(del)},
		"unknown agent":           {method: "POST", target: hb, agent: "ghost", header: dispatchHeader(del)},
		"malformed agent id":      {method: "POST", target: hb, agent: "-bad", header: dispatchHeader(del)},
	} {
		t.Run(name, func(t *testing.T) { errorOf(t, v.do(r), 401, wire.CodeUnauthorized) })
	}
	if rec := v.do(req{method: "POST", target: hb, agent: "a1", header: dispatchHeader(del)}); rec.Code != 204 || rec.Body.Len() != 0 {
		t.Fatalf("signed heartbeat = %d %q", rec.Code, rec.Body.String())
	}
	// Legacy signatures: accepted unless v1 is required.
	if rec := v.do(req{method: "POST", target: hb, agent: "a1", legacy: true}); rec.Code != 204 {
		t.Fatalf("legacy heartbeat = %d", rec.Code)
	}
	strict := newEnv(t, func(o *Options) { o.RequireV1 = true })
	e2, _ := strict.start("a1")
	errorOf(t, strict.do(req{method: "POST", target: "/v0/executions/" + e2.ID + "/heartbeat", agent: "a1", legacy: true}), 401, wire.CodeUnauthorized)
	// HMAC is required even with no bearer token configured.
	open := newEnv(t)
	e3, _ := open.start("a1")
	errorOf(t, open.do(req{method: "POST", target: "/v0/executions/" + e3.ID + "/heartbeat"}), 401, wire.CodeUnauthorized)
	// Metadata is for oneself only.
	errorOf(t, v.do(req{method: "PUT", target: "/v0/agents/a1/metadata", body: `{}`, agent: "a2"}), 403, wire.CodeForbidden)
	if rec := v.do(req{method: "PUT", target: "/v0/agents/a1/metadata", body: `{"description":"d"}`, agent: "a1"}); rec.Code != 204 {
		t.Fatalf("metadata = %d %s", rec.Code, rec.Body.String())
	}
}

func TestErrorEnvelope(t *testing.T) {
	v := newEnv(t)
	write := func(err error) *httptest.ResponseRecorder {
		rec := httptest.NewRecorder()
		c := &call{s: v.s, w: rec, r: httptest.NewRequest("GET", "/x", nil), requestID: "0190aaaa-0000-7000-8000-00000000abcd"}
		c.writeError(err)
		return rec
	}

	rec := write(fmt.Errorf("insert step: disk I/O error at /var/lib/secret.db"))
	if got := rec.Body.String(); got != `{"code":"internal_error","details":{"request_id":"0190aaaa-0000-7000-8000-00000000abcd"},"message":"internal error"}`+"\n" {
		t.Fatalf("500 body = %s", got)
	}
	if rec.Code != 500 {
		t.Fatalf("status = %d", rec.Code)
	}
	for _, err := range []error{fmt.Errorf("read: %w", store.ErrUnavailable), context.DeadlineExceeded, fmt.Errorf("x: %w", context.DeadlineExceeded)} {
		rec := write(err)
		body := errorOf(t, rec, 503, wire.CodeUnavailable)
		if rec.Header().Get("Retry-After") != "1" || body.Get("details") != nil {
			t.Fatalf("503: Retry-After %q body %s", rec.Header().Get("Retry-After"), rec.Body.String())
		}
	}
	rec = write(&kernel.Error{Code: wire.CodeUnavailable, Message: "unavailable: stream connection limit reached"})
	if errorOf(t, rec, 503, wire.CodeUnavailable); rec.Header().Get("Retry-After") != "1" {
		t.Fatal("a kernel 503 lacks Retry-After")
	}
	rec = write(kernel.Validation("limit", "limit must not be negative"))
	if got := rec.Body.String(); got != `{"code":"validation_error","details":{"field":"limit"},"message":"validation error: limit must not be negative"}`+"\n" {
		t.Fatalf("400 body = %s", got)
	}
	rec = write(&kernel.Error{Code: wire.CodeConflict, Message: "conflict: x"})
	if got := rec.Body.String(); got != `{"code":"conflict","message":"conflict: x"}`+"\n" || rec.Code != 409 || rec.Header().Get("Retry-After") != "" {
		t.Fatalf("409 = %d %s", rec.Code, got)
	}
	rec = write(&kernel.Error{Code: "brand_new_code", Message: "?"})
	if rec.Code != 500 {
		t.Fatalf("an unmapped code answered %d", rec.Code)
	}
	rec = write(&kernel.Error{Code: wire.CodeConflict, Message: "c", Details: map[string]any{"stored": "a", "raw": []byte(`{"x":1}`), "ignored": 5}})
	if got := rec.Body.String(); got != `{"code":"conflict","details":{"raw":{"x":1},"stored":"a"},"message":"c"}`+"\n" {
		t.Fatalf("details = %s", got)
	}
	for code, status := range map[string]int{wire.CodeValidation: 400, wire.CodeUnauthorized: 401, wire.CodeForbidden: 403,
		wire.CodeNotFound: 404, wire.CodeMethodNotAllowed: 405, wire.CodeConflict: 409, wire.CodeExecutionTerminal: 409,
		wire.CodeLeaseSuperseded: 409, wire.CodePayloadTooLarge: 413, wire.CodeInternal: 500, wire.CodeUnavailable: 503} {
		if rec := write(&kernel.Error{Code: code, Message: "m"}); rec.Code != status {
			t.Errorf("%s answered %d, want %d", code, rec.Code, status)
		}
	}
}

func TestPanicIsAnInternalError(t *testing.T) {
	v := newEnv(t)
	v.s.routes.add(&route{method: "GET", pattern: "/v0/test/panic", handle: func(*call) error { panic("secret detail") }})
	rec := v.do(req{method: "GET", target: "/v0/test/panic"})
	body := errorOf(t, rec, 500, wire.CodeInternal)
	if got := field(body, "details", "request_id").Str; got != rec.Header().Get(wire.HeaderRequestID) || got == "" {
		t.Fatalf("details.request_id = %q, header %q", got, rec.Header().Get(wire.HeaderRequestID))
	}
	if strings.Contains(rec.Body.String(), "secret detail") {
		t.Fatal("the panic text reached the client")
	}
	// A handler that returns a plain error is a 500 too.
	v.s.routes.add(&route{method: "GET", pattern: "/v0/test/error", handle: func(*call) error { return errors.New("sql: no such table") }})
	rec = v.do(req{method: "GET", target: "/v0/test/error"})
	errorOf(t, rec, 500, wire.CodeInternal)
	if strings.Contains(rec.Body.String(), "sql") {
		t.Fatal("internal error text reached the client")
	}
}

func TestRegistrationRotatesTheSecretAtOnce(t *testing.T) {
	v := newEnv(t)
	e, _ := v.start("a1")
	get := "/v0/executions/" + e.ID
	jsonOf(t, v.do(req{method: "GET", target: get, agent: "a1"}), 200) // caches the secret
	rec := v.do(req{method: "POST", target: "/v0/agents", body: `{"id":"a1","webhook_url":"http://h/","secret":"rotated-secret"}`})
	jsonOf(t, rec, 201)
	errorOf(t, v.do(req{method: "GET", target: get, agent: "a1"}), 401, wire.CodeUnauthorized)
	jsonOf(t, v.do(req{method: "GET", target: get, agent: "a1", key: "rotated-secret"}), 200)
	// Deleting the agent forgets it too.
	if err := v.k.CancelExecution(v.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	if rec := v.do(req{method: "DELETE", target: "/v0/agents/a1"}); rec.Code != 204 {
		t.Fatalf("delete = %d %s", rec.Code, rec.Body.String())
	}
	errorOf(t, v.do(req{method: "GET", target: get, agent: "a1", key: "rotated-secret"}), 401, wire.CodeUnauthorized)
}

// readProbe is a request body that counts how often it is read.
type readProbe struct{ reads int }

func (p *readProbe) Read(b []byte) (int, error) {
	p.reads++
	return 0, io.EOF
}
