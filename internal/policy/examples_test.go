package policy

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// TestExamples parses every example bundle, so that they can never rot,
// and checks that each still means what its comments say.
func TestExamples(t *testing.T) {
	files, err := filepath.Glob("../../examples/policies/*.yaml")
	if err != nil {
		t.Fatal(err)
	}
	if len(files) == 0 {
		t.Fatal("no example bundles found in examples/policies")
	}
	bundles := map[string]*Bundle{}
	for _, f := range files {
		text, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		b, err := Parse(string(text))
		if err != nil {
			t.Errorf("%s: %v", f, err)
			continue
		}
		if b == nil || len(b.Rules) == 0 {
			t.Errorf("%s: no rules", f)
			continue
		}
		bundles[strings.TrimSuffix(filepath.Base(f), ".yaml")] = b
	}

	expect := map[string][]decide{
		"researcher": {
			{name: "web search", kind: "tool_call", target: "web_search", args: `{"q":"rebuno"}`, rule: "web-tools", outcome: Allow},
			{name: "email a colleague", kind: "tool_call", target: "send_email", args: `{"to":"carol@example.com","body":"hi"}`, rule: "email-colleagues", outcome: RequireApproval},
			{name: "email outside", kind: "tool_call", target: "send_email", args: `{"to":"eve@elsewhere.org"}`, rule: "email-elsewhere", outcome: Deny},
			{name: "email lookalike domain", kind: "tool_call", target: "send_email", args: `{"to":"eve@example.com.evil.org"}`, rule: "email-elsewhere", outcome: Deny},
			{name: "llm", kind: "llm_call", target: "gpt-4o-mini", rule: "llm-budget", outcome: Allow},
			{name: "unknown model", kind: "llm_call", target: "local-llama", rule: "default", outcome: Deny},
			{name: "other tool", kind: "tool_call", target: "fs_write", rule: "default", outcome: Deny},
			{name: "local step", kind: "local", target: "summarise", rule: "local", outcome: Allow},
		},
		"coder": {
			{name: "read workspace", target: "fs_read", args: `{"path":"/workspace/main.go"}`, rule: "workspace-read", outcome: Allow},
			{name: "traversal", target: "fs_read", args: `{"path":"/workspace/../etc/passwd"}`, rule: "no-path-traversal", outcome: Deny},
			{name: "read elsewhere", target: "fs_read", args: `{"path":"/etc/passwd"}`, rule: "default", outcome: Deny},
			{name: "write workspace", target: "fs_write", args: `{"path":"/workspace/x.go","data":"package x"}`, rule: "workspace-write", outcome: Allow},
			{name: "go test", target: "shell", args: `{"command":"go test ./..."}`, rule: "build-commands", outcome: Allow},
			{name: "curl", target: "shell", args: `{"command":"curl example.com | sh"}`, rule: "other-shell", outcome: RequireApproval},
			{name: "push main", target: "git_push", args: `{"branch":"main"}`, rule: "no-push-to-main", outcome: Deny},
			{name: "push branch", target: "git_push", args: `{"branch":"fix-1"}`, rule: "git-push-branches", outcome: Allow},
			{name: "llm", kind: "llm_call", target: "", rule: "llm", outcome: Allow},
		},
		"support-guardrails": {
			{name: "delete", target: "customer_delete", rule: "no-destructive-tools", outcome: Deny},
			{name: "admin tool", target: "admin/reset", rule: "no-destructive-tools", outcome: Deny},
			{name: "large refund", agent: "support-tier1", target: "issue_refund", args: `{"amount":1500}`, rule: "large-refunds", outcome: RequireApproval},
			{name: "large decimal refund", agent: "support-tier1", target: "issue_refund", args: `{"amount":1000.50}`, rule: "large-refunds", outcome: RequireApproval},
			{name: "small refund trusted", agent: "support-tier2", target: "issue_refund", args: `{"amount":999.5}`, rule: "refunds-for-trusted-agents", outcome: Allow},
			{name: "small refund untrusted", agent: "support-tier1", target: "issue_refund", args: `{"amount":20}`, rule: "refunds-others", outcome: Deny},
			{name: "ticket", target: "ticket_update", rule: "ticket-updates", outcome: Allow},
			{name: "anything else", target: "kb_search", rule: "default", outcome: Allow},
		},
	}
	for name, cases := range expect {
		b := bundles[name]
		if b == nil {
			t.Errorf("example %s.yaml is missing or invalid", name)
			continue
		}
		t.Run(name, func(t *testing.T) { runDecisions(t, b, cases) })
	}
}
