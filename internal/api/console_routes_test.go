package api

import (
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

// The routes the web console adds: sign-in and sign-out, execution
// summaries and their stream, an agent's last delivery, policy explain.

// sessionCookie returns the session cookie a sign-in answer sets.
func sessionCookie(t *testing.T, rec *httptest.ResponseRecorder) *http.Cookie {
	t.Helper()
	for _, c := range rec.Result().Cookies() {
		if c.Name == SessionCookie {
			return c
		}
	}
	t.Fatalf("no %s cookie in %v", SessionCookie, rec.Header().Values("Set-Cookie"))
	return nil
}

func withCookie(c *http.Cookie) http.Header { return hdr("Cookie", SessionCookie+"="+c.Value) }

func TestSignInAndOut(t *testing.T) {
	v := newEnv(t, withToken)
	key := v.keyed("vic", wire.RoleViewer)
	rec := v.do(req{method: "POST", target: "/v0/session", header: withKey(key)})
	body := jsonOf(t, rec, 200)
	if body.Get("name").Str != "vic" || body.Get("role").Str != wire.RoleViewer || body.Get("expires_at") == nil {
		t.Fatalf("sign-in answer %s", body.Raw)
	}
	c := sessionCookie(t, rec)
	if !c.HttpOnly || c.SameSite != http.SameSiteStrictMode || c.Path != "/v0" || c.Secure || c.MaxAge <= 0 ||
		c.Value == "" || strings.Contains(c.Value, key) {
		t.Fatalf("cookie %+v", c)
	}
	who := jsonOf(t, v.do(req{method: "GET", target: "/v0/whoami", header: withCookie(c)}), 200)
	if who.Get("name").Str != "vic" || who.Get("role").Str != wire.RoleViewer {
		t.Fatalf("whoami with the cookie %s", who.Raw)
	}
	// Behind a TLS proxy the cookie is Secure.
	rec = v.do(req{method: "POST", target: "/v0/session", header: http.Header{"Authorization": {"Bearer " + key}, "X-Forwarded-Proto": {"https"}}})
	if !sessionCookie(t, rec).Secure {
		t.Fatal("a sign-in over HTTPS set a cookie without Secure")
	}

	// Only an API key signs in; a bad one is refused saying why.
	errorOf(t, v.do(req{method: "POST", target: "/v0/session"}), 401, wire.CodeUnauthorized)
	errorOf(t, v.do(req{method: "POST", target: "/v0/session", bearer: true}), 400, wire.CodeValidation)
	e := errorOf(t, v.do(req{method: "POST", target: "/v0/session", header: withKey(key[:len(key)-1])}), 401, wire.CodeUnauthorized)
	if !strings.Contains(e.Get("message").Str, "malformed") {
		t.Fatalf("a truncated key: %s", e.Raw)
	}
	// A session cannot renew itself: sign-in needs the key.
	errorOf(t, v.do(req{method: "POST", target: "/v0/session", header: withCookie(c)}), 401, wire.CodeUnauthorized)

	// Signing out ends the session and clears the cookie, twice alike.
	for range 2 {
		rec = v.do(req{method: "DELETE", target: "/v0/session", header: withCookie(c)})
		if rec.Code != 204 || sessionCookie(t, rec).MaxAge >= 0 {
			t.Fatalf("sign-out: %d %v", rec.Code, rec.Header().Values("Set-Cookie"))
		}
	}
	errorOf(t, v.do(req{method: "GET", target: "/v0/whoami", header: withCookie(c)}), 401, wire.CodeUnauthorized)
}

// A session has its key's role, and a change from another origin is refused
// even with the cookie: the kernel's origin check stands in for a CSRF token.
func TestSessionRoleAndOrigin(t *testing.T) {
	v := newEnv(t, withToken)
	const bundle = "rules:\n  - id: ask\n    when: {target: pay}\n    then: {decision: require_approval}\n"
	if _, err := v.k.RegisterAgent(v.ctx, kernel.AgentSpec{ID: "a1", WebhookURL: "http://127.0.0.1:9/a1", Secret: secret, Policy: bundle, SetPolicy: true}); err != nil {
		t.Fatal(err)
	}
	e, del := v.start("a1")
	dec := jsonOf(t, v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/steps", body: `{"kind":"tool_call","target":"pay"}`,
		agent: "a1", header: dispatchHeader(del)}), 200)
	grant := "/v0/approvals/" + dec.Get("approval_id").Str + "/grant"

	viewer := sessionCookie(t, v.do(req{method: "POST", target: "/v0/session", header: withKey(v.keyed("vic", wire.RoleViewer))}))
	forbidden := errorOf(t, v.do(req{method: "POST", target: grant, body: `{}`, header: withCookie(viewer)}), 403, wire.CodeForbidden)
	if forbidden.Get("details").Get("role_needed").Str != wire.RoleApprover {
		t.Fatalf("403 %s", forbidden.Raw)
	}

	approver := sessionCookie(t, v.do(req{method: "POST", target: "/v0/session", header: withKey(v.keyed("amy", wire.RoleApprover))}))
	cross := withCookie(approver)
	cross.Set("Origin", "http://evil.example")
	errorOf(t, v.do(req{method: "POST", target: grant, body: `{}`, header: cross}), 403, wire.CodeForbidden)
	if a := jsonOf(t, v.do(req{method: "GET", target: "/v0/approvals/" + dec.Get("approval_id").Str, bearer: true}), 200); a.Get("status").Str != wire.ApprovalPending {
		t.Fatalf("refused requests changed the approval: %s", a.Raw)
	}
	same := withCookie(approver)
	same.Set("Origin", "http://localhost:8080")
	if rec := v.do(req{method: "POST", target: grant, body: `{"decided_by":"someone"}`, header: same}); rec.Code != 204 {
		t.Fatalf("a same-origin grant: %d %s", rec.Code, rec.Body)
	}
	if a := jsonOf(t, v.do(req{method: "GET", target: "/v0/approvals/" + dec.Get("approval_id").Str, bearer: true}), 200); a.Get("decided_by").Str != "amy" {
		t.Fatalf("decided_by = %s, want the session's key", a.Raw)
	}
	// Signing in from another origin is refused too (no login CSRF).
	cross = withKey(v.keyed("eve", wire.RoleViewer))
	cross.Set("Origin", "http://evil.example")
	errorOf(t, v.do(req{method: "POST", target: "/v0/session", header: cross}), 403, wire.CodeForbidden)
}

func TestExecutionSummaries(t *testing.T) {
	v := newEnv(t)
	e, del := v.start("a1")
	v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/steps", body: `{"kind":"tool_call","target":"t"}`, agent: "a1", header: dispatchHeader(del)})
	other, _ := v.start("b1")
	page := jsonOf(t, v.do(req{method: "GET", target: "/v0/execution-summaries?limit=1"}), 200)
	rows := page.Get("executions").Elems
	if len(rows) != 1 || rows[0].Get("id").Str != other.ID || page.Get("next_cursor").Str != other.ID {
		t.Fatalf("first page %s", page.Raw)
	}
	page = jsonOf(t, v.do(req{method: "GET", target: "/v0/execution-summaries?agent_id=a1"}), 200)
	row := page.Get("executions").Elems[0]
	if got, want := strings.Join(hsKeysOf(row), ","), "agent_id,created_at,id,last_event_seq,status,step_count,updated_at"; got != want {
		t.Fatalf("summary keys %s, want %s", got, want)
	}
	if row.Get("id").Str != e.ID || string(row.Get("step_count").Raw) != "1" || string(row.Get("last_event_seq").Raw) != "6" || page.Get("next_cursor") != nil {
		t.Fatalf("summary %s", row.Raw)
	}
	if page := jsonOf(t, v.do(req{method: "GET", target: "/v0/execution-summaries?status=completed"}), 200); len(page.Get("executions").Elems) != 0 {
		t.Fatalf("status filter %s", page.Raw)
	}
	for _, q := range []string{"status=done", "cursor=x", "limit=-1"} {
		errorOf(t, v.do(req{method: "GET", target: "/v0/execution-summaries?" + q}), 400, wire.CodeValidation)
	}
}

// The stream sends a frame at once, then one after changes, never more
// often than summaryInterval.
func TestExecutionSummaryStream(t *testing.T) {
	v := newEnv(t)
	srv := httptest.NewServer(v.s)
	t.Cleanup(srv.Close)
	v.agent("a1")
	s, resp := openStream(t, srv, "/v0/execution-summaries/stream", nil)
	if s == nil {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if f := s.next(t); f.data != "{}" {
		t.Fatalf("first frame %+v", f)
	}
	if _, err := v.k.CreateExecution(v.ctx, kernel.CreateRequest{AgentID: "a1"}); err != nil {
		t.Fatal(err)
	}
	if f := s.next(t); f.data != "{}" {
		t.Fatalf("frame after a create %+v", f)
	}
}

func TestLastDeliveryRoute(t *testing.T) {
	v := newEnv(t)
	v.agent("quiet")
	if b := jsonOf(t, v.do(req{method: "GET", target: "/v0/agents/quiet/last-delivery"}), 200); string(b.Raw) != `{"agent_id":"quiet"}` {
		t.Fatalf("no delivery: %s", b.Raw)
	}
	e, del := v.start("a1")
	if err := v.k.RecordDelivery(v.ctx, del, kernel.DeliveryOutcome{HTTPStatus: 503, Error: "webhook answered 503 Service Unavailable"}); err != nil {
		t.Fatal(err)
	}
	d := jsonOf(t, v.do(req{method: "GET", target: "/v0/agents/a1/last-delivery"}), 200).Get("delivery")
	if d.Get("execution_id").Str != e.ID || d.Get("type").Str != wire.EventDispatchFailed || d.Get("status").Str != "failed" ||
		string(d.Get("http_status").Raw) != "503" || string(d.Get("attempt").Raw) != "1" || d.Get("at") == nil ||
		d.Get("error").Str != "webhook answered 503 Service Unavailable" {
		t.Fatalf("delivery %s", d.Raw)
	}
	errorOf(t, v.do(req{method: "GET", target: "/v0/agents/nobody/last-delivery"}), 404, wire.CodeNotFound)
	errorOf(t, v.do(req{method: "GET", target: "/v0/agents/bad%20id/last-delivery"}), 400, wire.CodeValidation)
}

func TestExplainRoute(t *testing.T) {
	v := newEnv(t, withToken)
	const bundle = "default_action: deny\nrules:\n  - id: mail\n    priority: 5\n    when: {target: send_email, arguments: {to: {regex: \"@example[.]org$\"}}}\n    then: {decision: allow}\n"
	if _, err := v.k.RegisterAgent(v.ctx, kernel.AgentSpec{ID: "a1", WebhookURL: "http://127.0.0.1:9/a1", Secret: secret, Policy: bundle, SetPolicy: true}); err != nil {
		t.Fatal(err)
	}
	viewer := withKey(v.keyed("vic", wire.RoleViewer))
	r := jsonOf(t, v.do(req{method: "POST", target: "/v0/agents/a1/explain", body: `{"kind":"tool_call","target":"send_email","args":{"to":"bob@example.org"}}`, header: viewer}), 200)
	// The shape of `rebuno policy explain --json`, keys in canonical order.
	if want := `{"decision":"allow","line":3,"not_tried":0,"priority":5,"reason":"","rule_id":"mail",` +
		`"trace":[{"line":3,"matched":true,"priority":5,"rule_id":"mail"}]}`; string(r.Raw) != want {
		t.Fatalf("explain %s\nwant    %s", r.Raw, want)
	}
	r = jsonOf(t, v.do(req{method: "POST", target: "/v0/agents/a1/explain", body: `{"kind":"tool_call","target":"send_email","args":{"to":"eve@elsewhere.org"}}`, header: viewer}), 200)
	if r.Get("decision").Str != "deny" || r.Get("rule_id").Str != wire.RuleDefault || r.Get("trace").Elems[0].Get("failed").Str == "" {
		t.Fatalf("explain %s", r.Raw)
	}
	for _, c := range []struct {
		target, body string
		status       int
		code         string
	}{
		{"/v0/agents/a1/explain", `{"target":"x"}`, 400, wire.CodeValidation},
		{"/v0/agents/a1/explain", `{"kind":"shell"}`, 400, wire.CodeValidation},
		{"/v0/agents/a1/explain", `{"kind":"tool_call","extra":1}`, 400, wire.CodeValidation},
		{"/v0/agents/nobody/explain", `{"kind":"tool_call"}`, 404, wire.CodeNotFound},
	} {
		errorOf(t, v.do(req{method: "POST", target: c.target, body: c.body, header: viewer}), c.status, c.code)
	}
	plain := withKey(v.keyed("otto", wire.RoleViewer))
	plain.Set("Content-Type", "text/plain")
	errorOf(t, v.do(req{method: "POST", target: "/v0/agents/a1/explain", body: `{"kind":"tool_call"}`, header: plain}), 415, wire.CodeUnsupportedMedia)
}

// hsKeysOf lists an object's keys, sorted.
func hsKeysOf(v *jsonx.Value) []string {
	var keys []string
	for _, m := range v.Members {
		keys = append(keys, m.Key)
	}
	slices.Sort(keys)
	return keys
}
