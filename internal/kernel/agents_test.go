package kernel

import (
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

func TestValidateAgent(t *testing.T) {
	fx := newFixture(t) // dispatch timeout 30 s
	ok := AgentSpec{ID: "a1", WebhookURL: "http://127.0.0.1:5000/webhook", Secret: "s"}
	cases := []struct {
		name  string
		edit  func(a *AgentSpec)
		field string // "" means valid
	}{
		{"valid", func(a *AgentSpec) {}, ""},
		{"https", func(a *AgentSpec) { a.WebhookURL = "https://agents.example.com/hook?x=1" }, ""},
		{"128-byte id", func(a *AgentSpec) { a.ID = strings.Repeat("a", 128) }, ""},
		{"129-byte id", func(a *AgentSpec) { a.ID = strings.Repeat("a", 129) }, "id"},
		{"id with a slash", func(a *AgentSpec) { a.ID = "a/b" }, "id"},
		{"empty id", func(a *AgentSpec) { a.ID = "" }, "id"},
		{"relative url", func(a *AgentSpec) { a.WebhookURL = "/webhook" }, "webhook_url"},
		{"ftp url", func(a *AgentSpec) { a.WebhookURL = "ftp://host/x" }, "webhook_url"},
		{"no host", func(a *AgentSpec) { a.WebhookURL = "http:///x" }, "webhook_url"},
		{"not a url", func(a *AgentSpec) { a.WebhookURL = "http://[::1" }, "webhook_url"},
		{"2,048-byte url", func(a *AgentSpec) { a.WebhookURL = "http://h/" + strings.Repeat("p", 2048-9) }, ""},
		{"2,049-byte url", func(a *AgentSpec) { a.WebhookURL = "http://h/" + strings.Repeat("p", 2049-9) }, "webhook_url"},
		{"empty secret", func(a *AgentSpec) { a.Secret = "" }, "secret"},
		{"1,024-byte secret", func(a *AgentSpec) { a.Secret = strings.Repeat("s", 1024) }, ""},
		{"1,025-byte secret", func(a *AgentSpec) { a.Secret = strings.Repeat("s", 1025) }, "secret"},
		{"lease 31 s", func(a *AgentSpec) { a.LeaseTimeoutSeconds = 31 }, ""},
		{"lease equal to the dispatch timeout", func(a *AgentSpec) { a.LeaseTimeoutSeconds = 30 }, "lease_timeout_seconds"},
		{"lease below the dispatch timeout", func(a *AgentSpec) { a.LeaseTimeoutSeconds = 1 }, "lease_timeout_seconds"},
		{"negative lease", func(a *AgentSpec) { a.LeaseTimeoutSeconds = -5 }, "lease_timeout_seconds"},
		{"lease 86,400 s", func(a *AgentSpec) { a.LeaseTimeoutSeconds = 86400 }, ""},
		{"lease 86,401 s", func(a *AgentSpec) { a.LeaseTimeoutSeconds = 86401 }, "lease_timeout_seconds"},
		{"invalid policy", func(a *AgentSpec) { a.Policy, a.SetPolicy = "rules: [", true }, "bundle"},
		{"invalid policy not applied", func(a *AgentSpec) { a.Policy = "rules: [" }, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			a := ok
			tc.edit(&a)
			err := fx.k.ValidateAgent(a)
			if tc.field == "" {
				if err != nil {
					t.Fatalf("valid spec refused: %v", err)
				}
				return
			}
			if ke := wantCode(t, err, wire.CodeValidation); ke.Field != tc.field {
				t.Fatalf("field = %q, want %q (%s)", ke.Field, tc.field, ke.Message)
			}
			if _, err := fx.k.RegisterAgent(fx.ctx, a); err == nil {
				t.Fatal("RegisterAgent accepted what ValidateAgent refused")
			}
		})
	}
	// The lease bound follows the configured dispatch timeout.
	fx2 := newFixture(t, withConfig(func(c *Config) { c.DispatchTimeout = 5 * time.Second }))
	a := ok
	a.LeaseTimeoutSeconds = 6
	if err := fx2.k.ValidateAgent(a); err != nil {
		t.Fatalf("lease 6 s over a 5 s dispatch timeout: %v", err)
	}
}

func TestRegisterAgentKeepsPolicyMetadataAndRegistration(t *testing.T) {
	fx := newFixture(t)
	first, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a1", WebhookURL: "http://h/one", Secret: "one", LeaseTimeoutSeconds: 60})
	if err != nil {
		t.Fatal(err)
	}
	if !first.RegisteredAt.Equal(t0) || !first.UpdatedAt.Equal(t0) || first.LeaseTimeoutSeconds != 60 || first.PolicyBundle != "" {
		t.Fatalf("first registration = %+v", first)
	}
	if err := fx.k.SetPolicy(fx.ctx, "a1", "default_action: allow\n"); err != nil {
		t.Fatal(err)
	}
	md := MetadataRequest{Description: "does things", InputSchema: []byte(`{"type": "object"}`), OutputSchema: []byte(`{}`)}
	if err := fx.k.SetMetadata(fx.ctx, Caller{Agent: "a1"}, "a1", md); err != nil {
		t.Fatal(err)
	}
	fx.clk.Advance(time.Hour)
	second, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a1", WebhookURL: "http://h/two", Secret: "two"})
	if err != nil {
		t.Fatal(err)
	}
	if second.WebhookURL != "http://h/two" || second.Secret != "two" || second.LeaseTimeoutSeconds != 0 {
		t.Fatalf("re-registration did not update URL, secret and lease: %+v", second)
	}
	if !second.RegisteredAt.Equal(t0) || !second.UpdatedAt.Equal(t0.Add(time.Hour)) {
		t.Fatalf("registered %v updated %v", second.RegisteredAt, second.UpdatedAt)
	}
	if second.PolicyBundle != "default_action: allow\n" || second.Description != "does things" ||
		string(second.InputSchema) != `{"type": "object"}` || string(second.OutputSchema) != `{}` {
		t.Fatalf("re-registration lost the policy or metadata: %+v", second)
	}
	if s, err := fx.k.AgentSecret(fx.ctx, "a1"); err != nil || s != "two" {
		t.Fatalf("AgentSecret = %q, %v", s, err)
	}
	if _, err := fx.k.AgentSecret(fx.ctx, "ghost"); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("AgentSecret of an unknown agent = %v, want store.ErrNotFound", err)
	}
	// A registration that sets a policy replaces it; "" removes it.
	third, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: "a1", WebhookURL: "http://h/two", Secret: "two", SetPolicy: true})
	if err != nil || third.PolicyBundle != "" {
		t.Fatalf("registration with an empty policy = %+v, %v", third, err)
	}
}

func TestListGetDeleteAgents(t *testing.T) {
	fx := newFixture(t)
	if list, err := fx.k.ListAgents(fx.ctx); err != nil || list == nil || len(list) != 0 {
		t.Fatalf("no agents = %#v, %v; want []", list, err)
	}
	for _, id := range []string{"zeta", "Alpha", "beta", "alpha"} {
		fx.agent(id)
	}
	list, _ := fx.k.ListAgents(fx.ctx)
	var ids []string
	for _, a := range list {
		ids = append(ids, a.ID)
	}
	if strings.Join(ids, ",") != "Alpha,alpha,beta,zeta" {
		t.Fatalf("agents = %v, want sorted by id", ids)
	}
	if a, err := fx.k.GetAgent(fx.ctx, "beta"); err != nil || a.ID != "beta" {
		t.Fatalf("GetAgent = %+v, %v", a, err)
	}
	_, err := fx.k.GetAgent(fx.ctx, "ghost")
	wantMessage(t, err, wire.CodeNotFound, "agent not found")

	e, _ := fx.start("beta")
	wantMessage(t, fx.k.DeleteAgent(fx.ctx, "beta"), wire.CodeConflict, "conflict: agent has executions that are not terminal")
	wantCode(t, fx.k.DeleteAgent(fx.ctx, "ghost"), wire.CodeNotFound)
	if err := fx.k.CancelExecution(fx.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	if err := fx.k.DeleteAgent(fx.ctx, "beta"); err != nil {
		t.Fatalf("delete with only terminal history: %v", err)
	}
	if _, err := fx.k.GetAgent(fx.ctx, "beta"); err == nil {
		t.Fatal("the deleted agent is still there")
	}
	// Its history stays readable.
	got, err := fx.k.GetExecution(fx.ctx, Caller{}, e.ID)
	if err != nil || got.AgentID != "beta" {
		t.Fatalf("execution of a deleted agent = %+v, %v", got, err)
	}
	if evs, err := fx.k.ListEvents(fx.ctx, Caller{}, e.ID, 0, 0); err != nil || len(evs) == 0 {
		t.Fatalf("events of a deleted agent's execution = %d, %v", len(evs), err)
	}
	// A new execution for it is refused.
	_, err = fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "beta"})
	wantCode(t, err, wire.CodeNotFound)
}

func TestProvisionIsAllOrNothing(t *testing.T) {
	fx := newFixture(t)
	fx.agent("keep")
	if err := fx.k.SetPolicy(fx.ctx, "keep", "default_action: deny\n"); err != nil {
		t.Fatal(err)
	}
	bad := []AgentSpec{
		{ID: "p1", WebhookURL: "http://h/1", Secret: "s"},
		{ID: "p2", WebhookURL: "ftp://h/2", Secret: "s"},
	}
	err := fx.k.Provision(fx.ctx, bad)
	wantCode(t, err, wire.CodeValidation)
	if !strings.Contains(err.Error(), `agent "p2"`) {
		t.Fatalf("error %q does not name the agent", err)
	}
	if _, err := fx.k.GetAgent(fx.ctx, "p1"); err == nil {
		t.Fatal("a valid agent of a refused manifest was written")
	}

	good := []AgentSpec{
		{ID: "p1", WebhookURL: "http://h/1", Secret: "s", Policy: "default_action: allow\n", SetPolicy: true},
		{ID: "keep", WebhookURL: "http://h/keep", Secret: "new"}, // names no policy: keeps the stored one
	}
	if err := fx.k.Provision(fx.ctx, good); err != nil {
		t.Fatal(err)
	}
	if a, _ := fx.k.GetAgent(fx.ctx, "p1"); a.PolicyBundle != "default_action: allow\n" {
		t.Fatalf("p1 policy = %q", a.PolicyBundle)
	}
	if a, _ := fx.k.GetAgent(fx.ctx, "keep"); a.PolicyBundle != "default_action: deny\n" || a.Secret != "new" || a.WebhookURL != "http://h/keep" {
		t.Fatalf("keep = %+v", a)
	}
}

func TestSetMetadata(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	c := Caller{Agent: "a1"}
	wantMessage(t, fx.k.SetMetadata(fx.ctx, Caller{Agent: "a2"}, "a1", MetadataRequest{}), wire.CodeForbidden, "forbidden")
	wantCode(t, fx.k.SetMetadata(fx.ctx, Caller{}, "a1", MetadataRequest{}), wire.CodeForbidden)
	wantCode(t, fx.k.SetMetadata(fx.ctx, c, "a1", MetadataRequest{Description: strings.Repeat("d", 4097)}), wire.CodeValidation)
	big := []byte(`{"x":"` + strings.Repeat("s", 256*1024) + `"}`)
	if ke := wantCode(t, fx.k.SetMetadata(fx.ctx, c, "a1", MetadataRequest{InputSchema: big}), wire.CodeValidation); ke.Field != "input_schema" {
		t.Fatalf("field = %q", ke.Field)
	}
	if ke := wantCode(t, fx.k.SetMetadata(fx.ctx, c, "a1", MetadataRequest{OutputSchema: big}), wire.CodeValidation); ke.Field != "output_schema" {
		t.Fatalf("field = %q", ke.Field)
	}
	wantCode(t, fx.k.SetMetadata(fx.ctx, Caller{Agent: "ghost"}, "ghost", MetadataRequest{}), wire.CodeNotFound)

	in := []byte(`{ "type" : "object" }`)
	if err := fx.k.SetMetadata(fx.ctx, c, "a1", MetadataRequest{Description: strings.Repeat("d", 4096), InputSchema: in}); err != nil {
		t.Fatal(err)
	}
	a, _ := fx.k.GetAgent(fx.ctx, "a1")
	if len(a.Description) != 4096 || string(a.InputSchema) != string(in) || a.OutputSchema != nil {
		t.Fatalf("agent = %q %s %s", a.Description[:5], a.InputSchema, a.OutputSchema)
	}
	// The body replaces all three.
	if err := fx.k.SetMetadata(fx.ctx, c, "a1", MetadataRequest{}); err != nil {
		t.Fatal(err)
	}
	a, _ = fx.k.GetAgent(fx.ctx, "a1")
	if a.Description != "" || len(a.InputSchema) != 0 || len(a.OutputSchema) != 0 {
		t.Fatalf("metadata not cleared: %+v", a)
	}
}
