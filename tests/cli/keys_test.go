package cli_test

import (
	"encoding/json"
	"strings"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestKeysAndAudit: an administrator (the bootstrap token) creates scoped
// keys; each works within its role and is refused outside it; an approval
// decided with a key is recorded under the key's name whatever --by says;
// a revoked key stops working; the audit log shows all of it.
func TestKeysAndAudit(t *testing.T) {
	const boot = "bootstrap-token-0123456789"
	k := kt.Start(t, kt.Options{Token: boot})
	a := k.NewAgent("mailer", "")
	admin := []string{"REBUNO_URL=" + k.URL, "REBUNO_BEARER_TOKEN=" + boot}
	if r := run(t, admin, "policy", "set", "mailer", writeTemp(t, "p.yaml", approvalsBundleAnyone)); r.Code != 0 {
		t.Fatal(r)
	}

	r := run(t, admin, "keys", "create", "--name", "vic", "--role", "viewer")
	viewer := strings.TrimSpace(r.Stdout)
	if r.Code != 0 || !strings.HasPrefix(viewer, "rbk_") || !strings.Contains(r.Stderr, "shown only now") {
		t.Fatalf("keys create: %s", r)
	}
	r = run(t, admin, "keys", "create", "--name", "amy", "--role", "approver", "--expires", "30d")
	approver := strings.TrimSpace(r.Stdout)
	if r.Code != 0 {
		t.Fatal(r)
	}
	for _, bad := range [][]string{
		{"keys", "create", "--name", "vic", "--role", "viewer"}, // taken
		{"keys", "create", "--name", "x", "--role", "root"},
		{"keys", "create", "--name", "x", "--role", "viewer", "--expires", "soon"},
	} {
		if r := run(t, admin, bad...); r.Code == 0 {
			t.Fatalf("%v succeeded: %s", bad, r)
		}
	}
	r = run(t, admin, "keys", "ls")
	if r.Code != 0 || !strings.Contains(r.Stdout, "vic") || !strings.Contains(r.Stdout, "approver") ||
		strings.Contains(r.Stdout, viewer) || strings.Contains(r.Stdout, approver) {
		t.Fatalf("keys ls: %s", r)
	}

	as := func(token string) []string { return []string{"REBUNO_URL=" + k.URL, "REBUNO_API_KEY=" + token} }
	if r := run(t, as(viewer), "exec", "ls"); r.Code != 0 {
		t.Fatalf("a viewer reads: %s", r)
	}
	r = run(t, as(viewer), "exec", "create", "mailer")
	if r.Code != 1 || !strings.Contains(r.Stderr, "needs the operator role") {
		t.Fatalf("a viewer creates: %s", r)
	}

	id := k.CreateExecution("mailer", `{}`)
	l := kt.LeaseOf(a.NextWebhook())
	ap := submit(t, a, id, l, `{"kind":"tool_call","target":"send_email","args":{}}`, "blocked").ApprovalID
	if r := run(t, as(viewer), "approvals", "grant", ap, "--by", "vic"); r.Code != 1 || !strings.Contains(r.Stderr, "needs the approver role") {
		t.Fatalf("a viewer grants: %s", r)
	}
	if r := run(t, as(approver), "approvals", "grant", ap, "--by", "the-boss"); r.Code != 0 {
		t.Fatalf("an approver grants: %s", r)
	}
	r = run(t, admin, "approvals", "get", ap, "--json")
	var got map[string]any
	if json.Unmarshal([]byte(r.Stdout), &got) != nil || got["decided_by"] != "amy" {
		t.Fatalf("the decision is not recorded under the key's name: %s", r)
	}

	if r := run(t, admin, "keys", "revoke", "vic"); r.Code != 0 {
		t.Fatal(r)
	}
	if r := run(t, as(viewer), "exec", "ls"); r.Code != 1 || !strings.Contains(r.Stderr, `"vic" was revoked`) {
		t.Fatalf("a revoked key reads: %s", r)
	}
	r = run(t, admin, "audit")
	for _, want := range []string{"key.created", "vic", "amy", "approval.granted", "key.revoked"} {
		if !strings.Contains(r.Stdout, want) {
			t.Fatalf("audit does not show %q: %s", want, r)
		}
	}
}

const approvalsBundleAnyone = `default_action: allow
rules:
  - id: mail-ok
    when:
      target: send_email
    then:
      decision: require_approval
`
