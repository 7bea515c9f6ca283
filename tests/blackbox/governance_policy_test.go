package blackbox

import (
	"bytes"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---------------------------------------------------------------------------
// 1. Policy load (docs/protocol/governance.md §2.3, §4.3)
// ---------------------------------------------------------------------------

var gvBundleMessage = regexp.MustCompile(`^invalid policy bundle: line ([1-9][0-9]*): (.*)$`)

func TestGovPolicyLoad(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	gvRegister(t, k, "loader")
	before := gvAgentJSON(t, k, "loader")
	if string(before["policy_bundle"]) != `""` {
		t.Fatalf("new agent policy_bundle %s", before["policy_bundle"])
	}

	good := "default_action: deny\nrules:\n  - id: search   # comment kept verbatim\n    when: {target: \"web_*\"}\n    then: {decision: allow}\n"
	gvMustPolicy(t, k, "loader", good)
	after := gvAgentJSON(t, k, "loader")
	if got := gvAgentBundle(t, k, "loader"); got != good {
		t.Fatalf("stored bundle %q, want %q", got, good)
	}
	// The agent's other fields are untouched (docs/protocol/governance.md §4.3).
	for _, f := range []string{"id", "webhook_url", "registered_at"} {
		if string(after[f]) != string(before[f]) {
			t.Fatalf("%s changed: %s -> %s", f, before[f], after[f])
		}
	}

	// Invalid bundles: 400 with `invalid policy bundle: line N: path: problem`
	// and the previous bundle kept.
	invalid := []struct {
		name, bundle string
		line         int
		path         string // "" for problems of the document itself
		problem      string // a substring of the problem
	}{
		{"unknown key", "default_action: deny\nrules:\n  - id: a\n    when: {targt: x}\n    then: {decision: allow}\n", 4, "rules[0].when.targt", "unknown key"},
		{"unknown top key", "default_action: deny\nrulez: []\n", 2, "rulez", "unknown key"},
		{"unknown then key", "rules:\n  - id: a\n    then: {decision: allow, reasn: x}\n", 3, "rules[0].then.reasn", "unknown key"},
		{"bad default_action", "default_action: maybe\n", 1, "default_action", "maybe"},
		{"rules not a list", "rules: {a: 1}\n", 1, "rules", ""},
		{"missing id", "rules:\n  - then: {decision: allow}\n", 2, "rules[0].id", "required"},
		{"reserved id", "rules:\n  - id: default\n    then: {decision: allow}\n", 2, "rules[0].id", "reserved"},
		{"kernel id prefix", "rules:\n  - id: __mine\n    then: {decision: allow}\n", 2, "rules[0].id", "__"},
		{"duplicate id", "rules:\n  - id: a\n    priority: 1\n    then: {decision: allow}\n  - id: a\n    priority: 2\n    then: {decision: deny}\n", 5, "rules[1].id", "duplicate"},
		{"duplicate implicit priority", "rules:\n  - id: a\n    then: {decision: allow}\n  - id: b\n    then: {decision: deny}\n", 4, "rules[1].priority", "duplicate priority 0"},
		{"bad glob", "rules:\n  - id: a\n    when: {target: \"[a-\"}\n    then: {decision: allow}\n", 3, "rules[0].when.target", "glob"},
		{"empty targets", "rules:\n  - id: a\n    when: {targets: []}\n    then: {decision: allow}\n", 3, "rules[0].when.targets", "empty"},
		{"bad step_kind", "rules:\n  - id: a\n    when: {step_kind: shell}\n    then: {decision: allow}\n", 3, "rules[0].when.step_kind", "shell"},
		{"empty predicate", "rules:\n  - id: a\n    when: {arguments: {path: {}}}\n    then: {decision: allow}\n", 3, "rules[0].when.arguments.path", "constraint"},
		{"bad regex", "rules:\n  - id: a\n    when: {arguments: {path: {regex: \"(\"}}}\n    then: {decision: allow}\n", 3, "rules[0].when.arguments.path.regex", "RE2"},
		{"missing decision", "rules:\n  - id: a\n    then: {reason: x}\n", 3, "rules[0].then.decision", "required"},
		{"bad decision", "rules:\n  - id: a\n    then: {decision: maybe}\n", 3, "rules[0].then.decision", "maybe"},
		{"approval on allow", "rules:\n  - id: a\n    then: {decision: allow, approval_config: {approvers: [x]}}\n", 3, "rules[0].then.approval_config", "require_approval"},
		{"approval timeout too short", "rules:\n  - id: a\n    then: {decision: require_approval, approval_config: {timeout: 500ms}}\n", 3, "rules[0].then.approval_config.timeout", "500ms"},
		{"rate limit on deny", "rules:\n  - id: a\n    then: {decision: deny, rate_limit: {max_calls: 1, window: 1m}}\n", 3, "rules[0].then.rate_limit", "deny"},
		{"zero max_calls", "rules:\n  - id: a\n    then: {decision: allow, rate_limit: {max_calls: 0, window: 1m}}\n", 3, "rules[0].then.rate_limit.max_calls", ""},
		{"bad per_what", "rules:\n  - id: a\n    then: {decision: allow, rate_limit: {max_calls: 1, window: 1m, per_what: tenant}}\n", 3, "rules[0].then.rate_limit.per_what", "tenant"},
		{"bad on_limiter_error", "rules:\n  - id: a\n    then: {decision: allow, rate_limit: {max_calls: 1, window: 1m, on_limiter_error: maybe}}\n", 3, "rules[0].then.rate_limit.on_limiter_error", "maybe"},
		{"invalid YAML", "rules:\n  - id: a\n    then: {decision: allow\n", 0, "", "invalid YAML"},
		{"whitespace only", "  \n\n", 1, "", "empty"},
		{"top level list", "- a\n- b\n", 1, "", "mapping"},
		{"two documents", "default_action: allow\n---\ndefault_action: deny\n", 2, "", "more than one YAML document"},
		{"duplicate key", "default_action: allow\ndefault_action: deny\n", 2, "default_action", "duplicate"},
	}
	for _, c := range invalid {
		r := gvSetPolicy(t, k, "loader", c.bundle)
		if r.Status != 400 || r.Code() != "validation_error" {
			t.Fatalf("%s: got %s, want 400 validation_error", c.name, r)
		}
		var env struct {
			Message string
			Details map[string]string
		}
		r.JSON(t, &env)
		mm := gvBundleMessage.FindStringSubmatch(env.Message)
		if mm == nil {
			t.Fatalf("%s: message %q is not `invalid policy bundle: line N: …`", c.name, env.Message)
		}
		// line 0: the YAML parser decides where a syntax error is found.
		if c.line > 0 && mm[1] != strconv.Itoa(c.line) {
			t.Fatalf("%s: message %q, want line %d", c.name, env.Message, c.line)
		}
		problem := mm[2]
		if c.path != "" {
			if !strings.HasPrefix(problem, c.path+": ") {
				t.Fatalf("%s: message %q, want path %q", c.name, env.Message, c.path)
			}
			problem = problem[len(c.path)+2:]
		}
		if problem == "" || !strings.Contains(problem, c.problem) {
			t.Fatalf("%s: message %q, want a problem containing %q", c.name, env.Message, c.problem)
		}
		if env.Details["field"] != "bundle" {
			t.Fatalf("%s: details %v", c.name, env.Details)
		}
		if got := gvAgentBundle(t, k, "loader"); got != good {
			t.Fatalf("%s: previous bundle not kept: %q", c.name, got)
		}
	}

	// Order: the bundle is validated before the agent is looked up.
	gvExpectError(t, "unknown agent, valid bundle", gvSetPolicy(t, k, "nobody", good), 404, "not_found", "")
	gvExpectError(t, "unknown agent, invalid bundle", gvSetPolicy(t, k, "nobody", "rulez: []\n"), 400, "validation_error", "")
	gvExpectError(t, "bad agent id", gvSetPolicy(t, k, "bad!id", good), 400, "validation_error", "")
	for name, body := range map[string]string{
		"unknown field": `{"bundle":"default_action: allow\n","extra":1}`,
		"not a string":  `{"bundle":5}`,
		"empty body":    ``,
		"not an object": `["default_action: allow"]`,
	} {
		gvExpectError(t, name, k.Do("POST", "/v0/policies/loader", []byte(body), nil), 400, "validation_error", "")
		if got := gvAgentBundle(t, k, "loader"); got != good {
			t.Fatalf("%s: bundle changed to %q", name, got)
		}
	}
	gvExpectError(t, "GET is not a route method", k.Do("GET", "/v0/policies/loader", nil, nil), 405, "method_not_allowed", "")

	// "", null and absence each remove the policy.
	for _, body := range []string{`{"bundle":""}`, `{"bundle":null}`, `{}`} {
		gvMustPolicy(t, k, "loader", good)
		k.Must(204, k.Do("POST", "/v0/policies/loader", []byte(body), nil))
		if got := string(gvAgentJSON(t, k, "loader")["policy_bundle"]); got != `""` {
			t.Fatalf("%s: policy_bundle %s after removal", body, got)
		}
	}
}

// ---------------------------------------------------------------------------
// 1b. Provisioning manifest (docs/protocol/configuration.md §5)
// ---------------------------------------------------------------------------

func TestGovManifestPolicies(t *testing.T) {
	dir := t.TempDir()
	fileBundle := "default_action: deny\nrules:\n  - id: from-file\n    when: {target: \"web_*\"}\n    then: {decision: allow, reason: \"file says so\"}\n"
	if err := os.MkdirAll(filepath.Join(dir, "policies"), 0o755); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "policies", "researcher.yaml"), []byte(fileBundle), 0o644); err != nil {
		t.Fatal(err)
	}
	manifest := `agents:
  - id: researcher
    webhook_url: http://127.0.0.1:9/placeholder
    secret: ${GV_RESEARCHER_SECRET}
    policy_file: policies/researcher.yaml
  - id: writer
    webhook_url: http://127.0.0.1:9/placeholder
    secret: writer-secret-0123456789
    policy: |
      default_action: allow
`
	mpath := filepath.Join(dir, "rebuno.yaml")
	if err := os.WriteFile(mpath, []byte(manifest), 0o644); err != nil {
		t.Fatal(err)
	}
	k := kt.Start(t, kt.Options{Args: []string{"--config", mpath}, Env: []string{"GV_RESEARCHER_SECRET=from-env-0123456789"}})
	if !strings.Contains(k.Stderr(), "provisioned agents: 2") {
		t.Fatalf("banner:\n%s", k.Stderr())
	}
	if got := gvAgentBundle(t, k, "researcher"); got != fileBundle {
		t.Fatalf("policy_file bundle %q", got)
	}
	if got := gvAgentBundle(t, k, "writer"); got != "default_action: allow\n" {
		t.Fatalf("inline bundle %q", got)
	}

	// Re-registering over the API keeps the provisioned policy (docs/protocol/governance.md §4.1); the
	// bundle then governs the agent's steps.
	a := k.NewAgent("researcher", "")
	if got := gvAgentBundle(t, k, "researcher"); got != fileBundle {
		t.Fatalf("register changed the policy: %q", got)
	}
	id := k.CreateExecution("researcher", `{}`)
	_, l := gvDeliver(t, k, a, id)
	_, m := gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"web_search","args":{}}`)
	gvCheck(t, "file allow", m, gvWant{decision: "proceed"})
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"rm","args":{}}`)
	gvCheck(t, "file default deny", m, gvWant{"denied", "no explicit allow rule matched", "default"})
	k.Stop()

	// A manifest with a bad bundle stops the boot with exit 2 and writes
	// nothing: not even the valid agents before it.
	db := filepath.Join(t.TempDir(), "rebuno.db")
	k2 := kt.Start(t, kt.Options{DB: db})
	keep := "default_action: deny\n"
	gvRegister(t, k2, "keep")
	gvMustPolicy(t, k2, "keep", keep)
	k2.Stop()

	badFile := filepath.Join(dir, "bad.yaml")
	if err := os.WriteFile(badFile, []byte("rules:\n  - id: x\n    when: {targt: y}\n    then: {decision: allow}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	bad := map[string]struct{ manifest, want string }{
		"inline": {`agents:
  - id: keep
    webhook_url: http://127.0.0.1:9/a
    secret: keep-secret-0123456789
    policy: "default_action: allow"
  - id: fresh
    webhook_url: http://127.0.0.1:9/b
    secret: fresh-secret-0123456789
    policy: |
      default_action: deny
      rules:
        - id: r
          then: {decision: allow, rate_limit: {max_calls: 1, window: 1m, per_what: tenant}}
`, `invalid policy bundle: line 4: rules[0].then.rate_limit.per_what`},
		"policy_file": {`agents:
  - id: keep
    webhook_url: http://127.0.0.1:9/a
    secret: keep-secret-0123456789
    policy: ""
  - id: fresh
    webhook_url: http://127.0.0.1:9/b
    secret: fresh-secret-0123456789
    policy_file: ` + badFile + `
`, `invalid policy bundle: line 3: rules[0].when.targt: unknown key`},
	}
	for name, c := range bad {
		mp := filepath.Join(dir, "bad-"+strings.ReplaceAll(name, "_", "-")+".yaml")
		if err := os.WriteFile(mp, []byte(c.manifest), 0o644); err != nil {
			t.Fatal(err)
		}
		code, stderr := gvRunToExit(t, "dev", "--db", db, "--listen-addr", "127.0.0.1:0", "--no-repl", "--config", mp)
		if code != 2 {
			t.Fatalf("%s: exit %d, want 2:\n%s", name, code, stderr)
		}
		if !strings.Contains(stderr, c.want) || !strings.Contains(stderr, "fresh") {
			t.Fatalf("%s: stderr does not name the problem %q:\n%s", name, c.want, stderr)
		}
	}
	k3 := kt.Start(t, kt.Options{DB: db})
	var agents []map[string]any
	k3.Must(200, k3.Do("GET", "/v0/agents", nil, nil)).JSON(t, &agents)
	if len(agents) != 1 || agents[0]["id"] != "keep" || agents[0]["policy_bundle"] != keep ||
		agents[0]["webhook_url"] != "http://127.0.0.1:9/never" {
		t.Fatalf("a failed boot wrote to the store: %v", agents)
	}
}

// gvRunToExit runs the kernel binary and returns its exit code and stderr.
func gvRunToExit(t *testing.T, args ...string) (int, string) {
	t.Helper()
	cmd := exec.Command(kt.Binary(t), args...)
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	done := make(chan error, 1)
	go func() { done <- cmd.Wait() }()
	select {
	case err := <-done:
		if err == nil {
			return 0, stderr.String()
		}
		if ee, ok := err.(*exec.ExitError); ok {
			return ee.ExitCode(), stderr.String()
		}
		t.Fatalf("wait: %v", err)
	case <-time.After(30 * time.Second):
		cmd.Process.Kill()
		<-done
		t.Fatalf("kernel did not exit:\n%s", stderr.String())
	}
	return -1, ""
}
