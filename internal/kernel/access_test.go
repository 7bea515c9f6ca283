package kernel

import (
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/wire"
)

func TestAPIKeyLifecycle(t *testing.T) {
	fx := newFixture(t)
	key, token, err := fx.k.CreateAPIKey(fx.ctx, Admin, CreateKeyRequest{Name: "ops-alice", Role: wire.RoleApprover, ExpiresIn: time.Hour})
	if err != nil {
		t.Fatal(err)
	}
	if key.Hash != auth.KeyHash(token) || strings.Contains(key.Hash, token) || !key.ExpiresAt.Equal(fx.clk.Now().Add(time.Hour)) ||
		key.CreatedBy != "bootstrap" {
		t.Fatalf("stored key %+v for token %s", key, token)
	}
	p, err := fx.k.AuthenticateKey(fx.ctx, token)
	if err != nil || p != (Principal{Name: "ops-alice", Role: wire.RoleApprover, Key: true}) {
		t.Fatalf("AuthenticateKey = %+v, %v", p, err)
	}

	// Bad requests change nothing.
	for _, r := range []CreateKeyRequest{
		{Name: "", Role: wire.RoleViewer},
		{Name: "has space", Role: wire.RoleViewer},
		{Name: "x", Role: "superuser"},
		{Name: "x", Role: wire.RoleViewer, ExpiresIn: -time.Second},
	} {
		_, _, err := fx.k.CreateAPIKey(fx.ctx, Admin, r)
		wantCode(t, err, wire.CodeValidation)
	}
	_, _, err = fx.k.CreateAPIKey(fx.ctx, p, CreateKeyRequest{Name: "ops-alice", Role: wire.RoleViewer})
	wantCode(t, err, wire.CodeConflict)
	if keys, _ := fx.k.ListAPIKeys(fx.ctx); len(keys) != 1 {
		t.Fatalf("keys after refused creates: %+v", keys)
	}

	// Tokens that are not this deployment's keys.
	other, _ := auth.NewAPIKey("aaaaaaaaaaaaaaaa")
	for name, c := range map[string]struct{ token, want string }{
		"truncated":          {token[:len(token)-3], "malformed"},
		"another deployment": {other, "another deployment"},
		"unknown":            {mustKey(t, fx), "unknown"},
	} {
		_, err := fx.k.AuthenticateKey(fx.ctx, c.token)
		if ke := wantCode(t, err, wire.CodeUnauthorized); !strings.Contains(ke.Message, c.want) {
			t.Errorf("%s: message %q does not say %q", name, ke.Message, c.want)
		}
	}

	// A session stands for its key: it ends when the key is revoked.
	session, _, err := fx.k.CreateSession(fx.ctx, p)
	if err != nil {
		t.Fatal(err)
	}
	if sp, err := fx.k.SessionPrincipal(fx.ctx, session); err != nil || sp != p {
		t.Fatalf("SessionPrincipal = %+v, %v", sp, err)
	}
	if err := fx.k.RevokeAPIKey(fx.ctx, Admin, "ops-alice"); err != nil {
		t.Fatal(err)
	}
	_, err = fx.k.AuthenticateKey(fx.ctx, token)
	wantMessage(t, err, wire.CodeUnauthorized, `unauthorized: API key "ops-alice" was revoked`)
	_, err = fx.k.SessionPrincipal(fx.ctx, session)
	wantCode(t, err, wire.CodeUnauthorized)
	wantCode(t, fx.k.RevokeAPIKey(fx.ctx, Admin, "ops-alice"), wire.CodeConflict)
	wantCode(t, fx.k.RevokeAPIKey(fx.ctx, Admin, "nobody"), wire.CodeNotFound)

	// Expiry on the kernel's clock.
	_, short, err := fx.k.CreateAPIKey(fx.ctx, Admin, CreateKeyRequest{Name: "short", Role: wire.RoleViewer, ExpiresIn: time.Minute})
	if err != nil {
		t.Fatal(err)
	}
	if _, err := fx.k.AuthenticateKey(fx.ctx, short); err != nil {
		t.Fatal(err)
	}
	fx.clk.Advance(time.Minute)
	_, err = fx.k.AuthenticateKey(fx.ctx, short)
	wantMessage(t, err, wire.CodeUnauthorized, `unauthorized: API key "short" expired`)

	log, err := fx.k.AuditLog(fx.ctx, 0, 0)
	if err != nil {
		t.Fatal(err)
	}
	var got []string
	for _, e := range log {
		got = append(got, e.Actor+" "+e.Action+" "+e.Subject)
	}
	if want := "bootstrap key.created ops-alice,bootstrap key.revoked ops-alice,bootstrap key.created short"; strings.Join(got, ",") != want {
		t.Fatalf("audit log %q, want %q", strings.Join(got, ","), want)
	}
}

func mustKey(t *testing.T, fx *fixture) string {
	t.Helper()
	dep, err := fx.k.deployment(fx.ctx)
	if err != nil {
		t.Fatal(err)
	}
	k, _ := auth.NewAPIKey(dep)
	return k
}

// An approval decided with a scoped key records the key's name, whatever the
// request claims; the approvers rule applies to that name.
func TestDecisionIdentityFromKey(t *testing.T) {
	fx, e, del := governed(t)
	dec := fx.block(e, del, "send_email")
	mallory := Principal{Name: "mallory", Role: wire.RoleApprover, Key: true}
	err := fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{Grant: true, DecidedBy: "alice", By: mallory})
	wantMessage(t, err, wire.CodeForbidden, `forbidden: "mallory" is not an approver for this approval`)
	alice := Principal{Name: "alice", Role: wire.RoleApprover, Key: true}
	if err := fx.k.DecideApproval(fx.ctx, dec.ApprovalID, DecideRequest{Grant: true, DecidedBy: "bob", By: alice}); err != nil {
		t.Fatal(err)
	}
	if a := fx.approval(dec.ApprovalID); a.DecidedBy != "alice" {
		t.Fatalf("decided_by = %q, want the key's name", a.DecidedBy)
	}
	log, _ := fx.k.AuditLog(fx.ctx, 0, 0)
	if len(log) != 1 || log[0].Actor != "alice" || log[0].Action != AuditApprovalGranted || log[0].Subject != dec.ApprovalID ||
		!strings.Contains(string(log[0].Detail), `"decided_by":"alice"`) {
		t.Fatalf("audit log %+v", log)
	}
}
