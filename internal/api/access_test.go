package api

import (
	"net/http"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

// keyed creates a key of role with the bootstrap token and returns its token.
func (v *env) keyed(name, role string) string {
	v.t.Helper()
	rec := v.do(req{method: "POST", target: "/v0/keys", body: `{"name":"` + name + `","role":"` + role + `"}`, bearer: true})
	return jsonOf(v.t, rec, 201).Get("token").Str
}

func withKey(token string) http.Header { return hdr("Authorization", "Bearer "+token) }

// Each role may do its own and the lesser roles' work, and a request outside
// its role is 403 naming the role needed, with nothing written.
func TestRoles(t *testing.T) {
	v := newEnv(t, withToken)
	v.agent("a1")
	viewer, approver, operator, admin := v.keyed("vic", wire.RoleViewer), v.keyed("amy", wire.RoleApprover),
		v.keyed("otto", wire.RoleOperator), v.keyed("ada", wire.RoleAdmin)
	create := req{method: "POST", target: "/v0/executions", body: `{"agent_id":"a1"}`}
	as := func(r req, token string) req { r.header = withKey(token); return r }

	e := errorOf(t, v.do(as(create, viewer)), 403, wire.CodeForbidden)
	if e.Get("details").Get("role_needed").Str != wire.RoleOperator || e.Get("details").Get("role").Str != wire.RoleViewer {
		t.Fatalf("403 details: %s", e.Get("details").Raw)
	}
	errorOf(t, v.do(as(create, approver)), 403, wire.CodeForbidden)
	id := jsonOf(t, v.do(as(create, operator)), 201).Get("id").Str
	jsonOf(t, v.do(as(create, admin)), 201)
	for _, token := range []string{viewer, approver, operator, admin} {
		jsonOf(t, v.do(as(req{method: "GET", target: "/v0/executions/" + id}, token)), 200)
		jsonOf(t, v.do(as(req{method: "GET", target: "/v0/executions"}, token)), 200)
	}
	register := req{method: "POST", target: "/v0/agents", body: `{"id":"a2","webhook_url":"http://h/","secret":"` + secret + `"}`}
	cancel := req{method: "POST", target: "/v0/executions/" + id + "/cancel"}
	for _, token := range []string{viewer, approver, operator} {
		errorOf(t, v.do(as(register, token)), 403, wire.CodeForbidden)
		errorOf(t, v.do(as(req{method: "GET", target: "/v0/keys"}, token)), 403, wire.CodeForbidden)
	}
	errorOf(t, v.do(as(cancel, viewer)), 403, wire.CodeForbidden)
	errorOf(t, v.do(as(cancel, approver)), 403, wire.CodeForbidden)
	if rec := v.do(as(cancel, operator)); rec.Code != 204 {
		t.Fatalf("an operator's cancel: %d %s", rec.Code, rec.Body)
	}
	jsonOf(t, v.do(as(register, admin)), 201)
	if rec := v.do(as(req{method: "GET", target: "/v0/whoami"}, approver)); !strings.Contains(rec.Body.String(), `"name":"amy"`) ||
		!strings.Contains(rec.Body.String(), `"role":"approver"`) {
		t.Fatalf("whoami = %s", rec.Body)
	}
	// The bootstrap token stays an administrator without a name.
	if rec := v.do(req{method: "GET", target: "/v0/whoami", bearer: true}); !strings.Contains(rec.Body.String(), `"role":"admin"`) ||
		strings.Contains(rec.Body.String(), `"name"`) {
		t.Fatalf("whoami with the bootstrap token = %s", rec.Body)
	}
}

func TestKeyRoutes(t *testing.T) {
	v := newEnv(t, withToken)
	rec := v.do(req{method: "POST", target: "/v0/keys", body: `{"name":"ci","role":"operator","expires_in_seconds":3600}`, bearer: true})
	k := jsonOf(t, rec, 201)
	token := k.Get("token").Str
	if !strings.HasPrefix(token, "rbk_") || k.Get("expires_at") == nil || k.Get("created_by").Str != "bootstrap" {
		t.Fatalf("created key %s", rec.Body)
	}
	for _, c := range []struct {
		body   string
		status int
		code   string
	}{
		{`{"name":"ci","role":"viewer"}`, 409, wire.CodeConflict},
		{`{"name":"x","role":"root"}`, 400, wire.CodeValidation},
		{`{"name":"bad name","role":"viewer"}`, 400, wire.CodeValidation},
		{`{"name":"x","role":"viewer","expires_in_seconds":-1}`, 400, wire.CodeValidation},
		{`{"name":"x","role":"viewer","token":"mine"}`, 400, wire.CodeValidation},
	} {
		errorOf(t, v.do(req{method: "POST", target: "/v0/keys", body: c.body, bearer: true}), c.status, c.code)
	}
	list := v.do(req{method: "GET", target: "/v0/keys", bearer: true}).Body.String()
	if strings.Count(list, `"name"`) != 1 || strings.Contains(list, token) || strings.Contains(list, `"token"`) {
		t.Fatalf("key list %s", list)
	}
	// Malformed, truncated and foreign tokens are refused, saying why.
	for token, why := range map[string]string{
		token[:len(token)-2]: "malformed",
		"rbk_" + strings.Repeat("a", 16) + "_" + token[len("rbk_")+17:]: "",
	} {
		e := errorOf(t, v.do(req{method: "GET", target: "/v0/executions", header: withKey(token)}), 401, wire.CodeUnauthorized)
		if !strings.Contains(e.Get("message").Str, why) {
			t.Fatalf("refusal %q does not say %q", e.Get("message").Str, why)
		}
	}
	jsonOf(t, v.do(req{method: "GET", target: "/v0/executions", header: withKey(token)}), 200)
	if rec := v.do(req{method: "DELETE", target: "/v0/keys/ci", bearer: true}); rec.Code != 204 {
		t.Fatalf("revoke: %d %s", rec.Code, rec.Body)
	}
	e := errorOf(t, v.do(req{method: "GET", target: "/v0/executions", header: withKey(token)}), 401, wire.CodeUnauthorized)
	if !strings.Contains(e.Get("message").Str, "revoked") {
		t.Fatalf("revoked key refusal: %s", e.Get("message").Str)
	}
	errorOf(t, v.do(req{method: "DELETE", target: "/v0/keys/ci", bearer: true}), 409, wire.CodeConflict)
	errorOf(t, v.do(req{method: "DELETE", target: "/v0/keys/nobody", bearer: true}), 404, wire.CodeNotFound)
	audit := v.do(req{method: "GET", target: "/v0/audit", bearer: true}).Body.String()
	if !strings.Contains(audit, `"action":"key.created"`) || !strings.Contains(audit, `"action":"key.revoked"`) {
		t.Fatalf("audit %s", audit)
	}
}

// The decider is the key, whatever the body claims.
func TestDecisionByKey(t *testing.T) {
	v := newEnv(t, withToken)
	if _, err := v.k.RegisterAgent(v.ctx, kernel.AgentSpec{ID: "a1", WebhookURL: "http://127.0.0.1:9/a1", Secret: secret,
		Policy: "default_action: allow\nrules:\n  - id: ask\n    when: {target: send}\n    then: {decision: require_approval}\n", SetPolicy: true}); err != nil {
		t.Fatal(err)
	}
	e, del := v.start("a1")
	rec := v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/steps", body: `{"kind":"tool_call","target":"send"}`,
		agent: "a1", header: dispatchHeader(del)})
	approval := jsonOf(t, rec, 200).Get("approval_id").Str
	token := v.keyed("amy", wire.RoleApprover)
	if rec := v.do(req{method: "POST", target: "/v0/approvals/" + approval + "/grant", body: `{"decided_by":"somebody-else"}`,
		header: withKey(token)}); rec.Code != 204 {
		t.Fatalf("grant: %d %s", rec.Code, rec.Body)
	}
	got := jsonOf(t, v.do(req{method: "GET", target: "/v0/approvals/" + approval, bearer: true}), 200)
	if got.Get("decided_by").Str != "amy" {
		t.Fatalf("decided_by = %q, want the key's name", got.Get("decided_by").Str)
	}
}
