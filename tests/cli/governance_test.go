package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// The operator side of governance: `rebuno policy check|explain|test|set|
// get|rm`, `rebuno approvals ls|get|grant|deny`, approvals in the timeline
// of `exec watch` / `exec events`, and the same verbs in the REPL — all
// against the real binary.

const examples = "../../examples/policies/"

// invalidBundle has eight problems, on seven different lines.
const invalidBundle = `default_action: maybe
rules:
  - id: a
    priority: 1
    when:
      targt: "x"
    then:
      decision: allow
  - id: a
    priority: 1
    then:
      decision: deny
      rate_limit: {max_calls: 0, window: 1m}
  - id: c
    when:
      arguments:
        path: {}
    then: {decision: nope}
`

// writeTemp writes text to a file named name in a fresh directory.
func writeTemp(t *testing.T, name, text string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(p, []byte(text), 0o644); err != nil {
		t.Fatal(err)
	}
	return p
}

// local runs a command that needs no kernel; REBUNO_URL points at a closed
// port so that any attempt to reach one would show as exit 3.
func local(t *testing.T, want int, args ...string) result {
	t.Helper()
	r := run(t, []string{"REBUNO_URL=" + closedURL(t)}, args...)
	if r.Code != want {
		t.Fatalf("rebuno %s: want exit %d, got %s", strings.Join(args, " "), want, r)
	}
	return r
}

func TestPolicyCheck(t *testing.T) {
	for _, f := range []string{"coder.yaml", "researcher.yaml", "support-guardrails.yaml"} {
		r := local(t, 0, "policy", "check", examples+f)
		if r.Stdout != "ok\n" || r.Stderr != "" {
			t.Fatalf("%s: %s", f, r)
		}
	}

	bad := writeTemp(t, "bundle.yaml", invalidBundle)
	r := local(t, 1, "policy", "check", bad)
	golden(t, "policy-check-invalid", strings.ReplaceAll(r.String(), bad, "bundle.yaml"))
	// Every problem, in line order, each naming its line and key path.
	lines := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(lines) != 8 {
		t.Fatalf("want 8 problems, got %d:\n%s", len(lines), r.Stdout)
	}
	prev := 0
	for _, l := range lines {
		m := regexp.MustCompile(`^` + regexp.QuoteMeta(bad) + `:(\d+): (\S+): .+$`).FindStringSubmatch(l)
		if m == nil {
			t.Fatalf("problem line without FILE:LINE: path: %q", l)
		}
		n, _ := strconv.Atoi(m[1])
		if n < prev {
			t.Fatalf("problems out of line order:\n%s", r.Stdout)
		}
		prev = n
	}
	if !strings.Contains(r.Stdout, ":6: rules[0].when.targt: unknown key") {
		t.Fatalf("the misspelt key is not named with its line:\n%s", r.Stdout)
	}

	// --json: the same problems, machine-readable; still exit 1.
	r = local(t, 1, "policy", "check", bad, "--json")
	var out struct {
		Valid  bool `json:"valid"`
		Errors []struct {
			Line    int    `json:"line"`
			Path    string `json:"path"`
			Problem string `json:"problem"`
		} `json:"errors"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &out); err != nil {
		t.Fatalf("--json: %v\n%s", err, r)
	}
	if out.Valid || len(out.Errors) != 8 || out.Errors[0].Line != 1 || out.Errors[0].Path != "default_action" {
		t.Fatalf("--json: %+v", out)
	}
	r = local(t, 0, "policy", "check", examples+"coder.yaml", "--json")
	var ok struct {
		Valid         bool   `json:"valid"`
		Rules         int    `json:"rules"`
		DefaultAction string `json:"default_action"`
	}
	if json.Unmarshal([]byte(r.Stdout), &ok) != nil || !ok.Valid || ok.Rules != 8 || ok.DefaultAction != "deny" {
		t.Fatalf("--json valid: %s", r)
	}

	// Standard input; a missing file and a missing argument are usage
	// errors.
	if r := runIn(t, "rules: [{id: x, then: {decision: alow}}]\n", nil, "policy", "check", "-"); r.Code != 1 ||
		!strings.Contains(r.Stdout, "<stdin>:1: rules[0].then.decision:") {
		t.Fatalf("stdin: %s", r)
	}
	if r := local(t, 2, "policy", "check", filepath.Join(t.TempDir(), "nope.yaml")); !strings.Contains(r.Stderr, "no such file") {
		t.Fatalf("missing file: %s", r)
	}
	local(t, 2, "policy", "check")
}

func TestPolicyExplain(t *testing.T) {
	// A match after two rules that do not match, each with the first
	// condition it failed.
	r := local(t, 0, "policy", "explain", examples+"researcher.yaml", "--kind", "tool_call", "--target", "send_email",
		"--args", `{"to":"eve@elsewhere.org","body":"hi"}`, "--agent", "researcher")
	golden(t, "policy-explain", r.String())

	r = local(t, 0, "policy", "explain", examples+"researcher.yaml", "--kind", "tool_call", "--target", "send_email",
		"--args", `{"to":"eve@elsewhere.org"}`, "--json")
	var ex struct {
		Decision string `json:"decision"`
		RuleID   string `json:"rule_id"`
		Reason   string `json:"reason"`
		Priority int    `json:"priority"`
		Trace    []struct {
			RuleID  string `json:"rule_id"`
			Matched bool   `json:"matched"`
			Failed  string `json:"failed"`
		} `json:"trace"`
		NotTried int `json:"not_tried"`
	}
	if err := json.Unmarshal([]byte(r.Stdout), &ex); err != nil {
		t.Fatal(err)
	}
	if ex.Decision != "deny" || ex.RuleID != "email-elsewhere" || ex.Priority != 30 || len(ex.Trace) != 3 || ex.NotTried != 1 ||
		ex.Trace[0].Matched || !strings.Contains(ex.Trace[0].Failed, `"web_*"`) ||
		!strings.Contains(ex.Trace[1].Failed, `argument "to"`) || !ex.Trace[2].Matched {
		t.Fatalf("%+v", ex)
	}

	// require_approval shows the approval settings; numbers are compared
	// as their literal text.
	r = local(t, 0, "policy", "explain", examples+"support-guardrails.yaml", "--kind", "tool_call", "--target", "issue_refund",
		"--args", `{"amount":1500.0}`)
	for _, want := range []string{"decision    require_approval", "rule        large-refunds (priority 20, line 22)",
		"approval    approvers support-lead; timeout 4h", "(3 later rules not tried)"} {
		if !strings.Contains(r.Stdout, want) {
			t.Fatalf("missing %q:\n%s", want, r.Stdout)
		}
	}
	// agent_ids conditions match only with --agent.
	noAgent := local(t, 0, "policy", "explain", examples+"support-guardrails.yaml", "--kind", "tool_call", "--target", "issue_refund",
		"--args", `{"amount":20}`)
	withAgent := local(t, 0, "policy", "explain", examples+"support-guardrails.yaml", "--kind", "tool_call", "--target", "issue_refund",
		"--args", `{"amount":20}`, "--agent", "support-tier2")
	if !strings.Contains(noAgent.Stdout, "rule        refunds-others") || !strings.Contains(noAgent.Stdout, "(give --agent)") ||
		!strings.Contains(withAgent.Stdout, "rule        refunds-for-trusted-agents") {
		t.Fatalf("agent:\n%s\n%s", noAgent.Stdout, withAgent.Stdout)
	}
	// Defaults: no rule matched.
	r = local(t, 0, "policy", "explain", examples+"researcher.yaml", "--kind", "tool_call", "--target", "shell")
	if !strings.Contains(r.Stdout, "rule        default (no rule matched; default_action deny)") ||
		!strings.Contains(r.Stdout, "reason      no explicit allow rule matched") {
		t.Fatalf("default:\n%s", r.Stdout)
	}
	r = local(t, 0, "policy", "explain", examples+"researcher.yaml", "--kind", "local", "--target", "summarize")
	if !strings.Contains(r.Stdout, "decision    allow") || !strings.Contains(r.Stdout, "rule        local (no rule matched;") {
		t.Fatalf("local:\n%s", r.Stdout)
	}

	// Usage errors (exit 2) and an invalid bundle (exit 1, problems on
	// stderr).
	local(t, 2, "policy", "explain", examples+"researcher.yaml", "--target", "x")
	local(t, 2, "policy", "explain", examples+"researcher.yaml", "--kind", "tool", "--target", "x")
	local(t, 2, "policy", "explain", examples+"researcher.yaml", "--kind", "local")
	if r := local(t, 2, "policy", "explain", examples+"researcher.yaml", "--kind", "local", "--target", "x", "--args", "{nope"); !strings.Contains(r.Stderr, "invalid --args") {
		t.Fatalf("%s", r)
	}
	bad := writeTemp(t, "bad.yaml", invalidBundle)
	if r := local(t, 1, "policy", "explain", bad, "--kind", "local", "--target", "x"); r.Stdout != "" ||
		!strings.Contains(r.Stderr, bad+":6: rules[0].when.targt: unknown key") || !strings.Contains(r.Stderr, "(8 problems)") {
		t.Fatalf("%s", r)
	}
}

const mailReviewBundle = `default_action: allow
rules:
  - id: no-fetch
    priority: 1
    when: {target: web_fetch}
    then: {decision: deny, reason: "fetching is off"}
  - id: mail-review
    priority: 2
    when: {target: send_email}
    then:
      decision: require_approval
      approval_config: {approvers: [alice]}
`

// submit submits a step and checks the decision.
func submit(t *testing.T, a *kt.Agent, id string, lease kt.Lease, body, want string) kt.Decision {
	t.Helper()
	d := a.Submit(id, lease, body)
	if d.Decision != want {
		t.Fatalf("%s: want %s, got %+v", body, want, d)
	}
	return d
}

func agentBundle(t *testing.T, k *kt.Kernel, id string) string {
	t.Helper()
	var ag struct {
		PolicyBundle string `json:"policy_bundle"`
	}
	k.Must(200, k.Do("GET", "/v0/agents/"+id, nil, nil)).JSON(t, &ag)
	return ag.PolicyBundle
}

func TestPolicySetGetRm(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	k.NewAgent("researcher", "")
	file := examples + "researcher.yaml"
	text, _ := os.ReadFile(file)

	r := cli(t, k, 0, "policy", "set", "researcher", file)
	if r.Stdout != "policy set for researcher (4 rules, default_action deny)\n" {
		t.Fatalf("%s", r)
	}
	if got := agentBundle(t, k, "researcher"); got != string(text) {
		t.Fatalf("stored bundle differs:\n%s", got)
	}
	// get prints the stored text byte for byte.
	if r := cli(t, k, 0, "policy", "get", "researcher"); r.Stdout != string(text) || r.Stderr != "" {
		t.Fatalf("get: %s", r)
	}
	r = cli(t, k, 0, "policy", "get", "researcher", "--json")
	var got struct {
		AgentID      string `json:"agent_id"`
		PolicyBundle string `json:"policy_bundle"`
	}
	if json.Unmarshal([]byte(r.Stdout), &got) != nil || got.AgentID != "researcher" || got.PolicyBundle != string(text) {
		t.Fatalf("get --json: %s", r)
	}

	// An invalid bundle: every problem, exit 1, nothing stored.
	bad := writeTemp(t, "bad.yaml", invalidBundle)
	if r := cli(t, k, 1, "policy", "set", "researcher", bad); !strings.Contains(r.Stderr, "rules[1].id: duplicate id") {
		t.Fatalf("%s", r)
	}
	if agentBundle(t, k, "researcher") != string(text) {
		t.Fatal("an invalid bundle changed the stored one")
	}
	// Unknown agent: the kernel's 404 with a hint.
	r = cli(t, k, 1, "policy", "set", "ghost", file)
	if !strings.HasPrefix(r.Stderr, "error: not_found: ") || !strings.Contains(r.Stderr, "hint: no agent \"ghost\" is registered") {
		t.Fatalf("%s", r)
	}
	cli(t, k, 1, "policy", "get", "ghost")
	// An empty file is not a way to remove a policy.
	if r := cli(t, k, 2, "policy", "set", "researcher", writeTemp(t, "empty.yaml", "")); !strings.Contains(r.Stderr, "policy rm researcher") {
		t.Fatalf("%s", r)
	}
	cli(t, k, 2, "policy", "set", "researcher")

	// rm removes it; get then prints nothing and says so on stderr.
	if r := cli(t, k, 0, "policy", "rm", "researcher"); r.Stdout != "policy removed for researcher\n" {
		t.Fatalf("%s", r)
	}
	if agentBundle(t, k, "researcher") != "" {
		t.Fatal("policy not removed")
	}
	if r := cli(t, k, 0, "policy", "get", "researcher"); r.Stdout != "" || !strings.Contains(r.Stderr, "has no policy") {
		t.Fatalf("%s", r)
	}
	// set --json prints the agent as the kernel returns it.
	r = cli(t, k, 0, "policy", "set", "researcher", file, "--json")
	var ag map[string]any
	if json.Unmarshal([]byte(r.Stdout), &ag) != nil || ag["id"] != "researcher" || ag["policy_bundle"] != string(text) {
		t.Fatalf("set --json: %s", r)
	}
}

// TestPolicyTest records steps under no policy and under a first bundle,
// then tests researcher.yaml as a candidate: six of nine decisions flip.
func TestPolicyTest(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("researcher", "")

	// Execution 1, no policy: everything is allowed (rule permissive).
	e1 := k.CreateExecution("researcher", `{}`)
	l1 := kt.LeaseOf(a.NextWebhook())
	submit(t, a, e1, l1, `{"kind":"tool_call","target":"web_search","args":{"q":"rebuno"}}`, "proceed")
	submit(t, a, e1, l1, `{"kind":"tool_call","target":"send_email","args":{"to":"bob@example.com"}}`, "proceed")
	submit(t, a, e1, l1, `{"kind":"tool_call","target":"send_email","args":{"to":"eve@elsewhere.org"}}`, "proceed")
	submit(t, a, e1, l1, `{"kind":"tool_call","target":"file_delete","args":{"path":"/srv/x"}}`, "proceed")
	submit(t, a, e1, l1, `{"kind":"llm_call","target":"gpt-4o","args":{"messages":[]}}`, "proceed")
	submit(t, a, e1, l1, `{"kind":"local","target":"summarize"}`, "proceed")
	a.Finish(e1, l1, `{}`)

	// Execution 2, under a first bundle: a denial, a default allow, and a
	// step held for approval and then granted.
	cli(t, k, 0, "policy", "set", "researcher", writeTemp(t, "v1.yaml", mailReviewBundle))
	e2 := k.CreateExecution("researcher", `{}`)
	l2 := kt.LeaseOf(a.NextWebhook())
	submit(t, a, e2, l2, `{"kind":"tool_call","target":"web_fetch","args":{"url":"https://example.org"}}`, "denied")
	submit(t, a, e2, l2, `{"kind":"tool_call","target":"file_delete","args":{"path":"/srv/y"}}`, "proceed")
	d := submit(t, a, e2, l2, `{"kind":"tool_call","target":"send_email","args":{"to":"eve@elsewhere.org"}}`, "blocked")
	k.Must(204, k.Do("POST", "/v0/approvals/"+d.ApprovalID+"/grant", []byte(`{"decided_by":"alice"}`), nil))
	l2b := kt.LeaseOf(a.NextWebhook())
	submit(t, a, e2, l2b, `{"kind":"tool_call","target":"web_fetch","args":{"url":"https://example.org"}}`, "denied")
	submit(t, a, e2, l2b, `{"kind":"tool_call","target":"file_delete","args":{"path":"/srv/y"}}`, "proceed")
	submit(t, a, e2, l2b, `{"kind":"tool_call","target":"send_email","args":{"to":"eve@elsewhere.org"}}`, "proceed")
	a.Finish(e2, l2b, `{}`)

	before := agentBundle(t, k, "researcher")
	names := []string{e1, "<exec-1>", e1[28:], "<e1>", e2, "<exec-2>", e2[28:], "<e2>"}
	r := cli(t, k, 0, "policy", "test", examples+"researcher.yaml", "--agent", "researcher")
	golden(t, "policy-test", normalize(strings.ReplaceAll(r.String(), examples, ""), names...))
	if agentBundle(t, k, "researcher") != before {
		t.Fatal("policy test changed the stored bundle")
	}

	r = cli(t, k, 0, "policy", "test", examples+"researcher.yaml", "--agent", "researcher", "--json")
	var rep struct {
		Executions, Steps, Changed, Unchanged, Skipped int
		RuleChanged                                    int `json:"rule_changed"`
		Transitions                                    []struct {
			From, To string
			Count    int
		}
		Changes []struct {
			ExecutionID string `json:"execution_id"`
			Index       int
			StepID      string `json:"step_id"`
			Kind        string
			Target      string
			Args        json.RawMessage
			Old, New    struct {
				Decision string
				RuleID   string `json:"rule_id"`
			}
		}
	}
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil {
		t.Fatalf("%v: %s", err, r)
	}
	if rep.Executions != 2 || rep.Steps != 9 || rep.Changed != 6 || rep.Unchanged != 3 || rep.RuleChanged != 3 || rep.Skipped != 0 {
		t.Fatalf("counts: %+v", rep)
	}
	if len(rep.Transitions) != 4 || rep.Transitions[0].From != "allow" || rep.Transitions[0].To != "deny" || rep.Transitions[0].Count != 3 {
		t.Fatalf("transitions: %+v", rep.Transitions)
	}
	// The newest execution comes first; the approved step counts as
	// require_approval, its decision when it was new.
	c := rep.Changes[0]
	if c.ExecutionID != e2 || c.Index != 1 || c.Target != "web_fetch" || c.Old.Decision != "deny" || c.Old.RuleID != "no-fetch" ||
		c.New.Decision != "allow" || c.New.RuleID != "web-tools" || len(c.StepID) != 64 || string(c.Args) != `{"url":"https://example.org"}` {
		t.Fatalf("first change: %+v", c)
	}
	c = rep.Changes[2]
	if c.Target != "send_email" || c.Old.Decision != "require_approval" || c.Old.RuleID != "mail-review" || c.New.Decision != "deny" {
		t.Fatalf("approved step: %+v", c)
	}

	// --last 1 reads only the newest execution.
	r = cli(t, k, 0, "policy", "test", examples+"researcher.yaml", "--agent", "researcher", "--last", "1", "--json")
	if err := json.Unmarshal([]byte(r.Stdout), &rep); err != nil || rep.Executions != 1 || rep.Steps != 3 || rep.Changed != 3 {
		t.Fatalf("--last 1: %+v %s", rep, r)
	}
	// The bundle in force decides nothing differently.
	r = cli(t, k, 0, "policy", "test", writeTemp(t, "same.yaml", mailReviewBundle), "--agent", "researcher", "--last", "1")
	if !strings.HasPrefix(r.Stdout, "No decision would change: 3 steps in 1 execution of agent researcher.") {
		t.Fatalf("%s", r)
	}
	if r := cli(t, k, 0, "policy", "test", examples+"researcher.yaml", "--agent", "nobody"); r.Stdout != "No executions of agent nobody to test against.\n" {
		t.Fatalf("%s", r)
	}
	cli(t, k, 2, "policy", "test", examples+"researcher.yaml")
	cli(t, k, 2, "policy", "test", examples+"researcher.yaml", "--agent", "researcher", "--last", "0")
	cli(t, k, 1, "policy", "test", writeTemp(t, "bad.yaml", invalidBundle), "--agent", "researcher")
	if r := run(t, []string{"REBUNO_URL=" + closedURL(t)}, "policy", "test", examples+"researcher.yaml", "--agent", "researcher"); r.Code != 3 {
		t.Fatalf("unreachable kernel: %s", r)
	}
}

const approvalsBundle = `rules:
  - id: mail
    priority: 1
    when: {target: send_email}
    then:
      decision: require_approval
      reason: "email is reviewed"
      approval_config: {approvers: [alice], timeout: 5m, message: "send it?"}
  - id: deploy
    priority: 2
    when: {target: deploy}
    then:
      decision: require_approval
      approval_config: {timeout: 2m}
  - id: llm
    priority: 3
    when: {step_kind: llm_call}
    then:
      decision: allow
      rate_limit: {max_calls: 1, window: 1m}
  - id: rest
    priority: 4
    then: {decision: allow}
`

func TestApprovalsCommands(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("mailer", "")
	cli(t, k, 0, "policy", "set", "mailer", writeTemp(t, "p.yaml", approvalsBundle))

	if r := cli(t, k, 0, "approvals", "ls"); r.Stdout != "" {
		t.Fatalf("no approvals yet: %s", r)
	}
	e1 := k.CreateExecution("mailer", `{}`)
	l1 := kt.LeaseOf(a.NextWebhook())
	ap1 := submit(t, a, e1, l1, `{"kind":"tool_call","target":"send_email","args":{"to":"bob@example.com","subject":"hi"}}`, "blocked").ApprovalID
	short1 := ap1[28:]
	names := []string{ap1, "<approval-1>", short1, "<a1>", e1, "<exec-1>", e1[28:], "<e1>"}

	r := cli(t, k, 0, "approvals", "ls")
	golden(t, "approvals-ls", normalize(r.String(), names...))
	r = cli(t, k, 0, "approvals", "get", short1)
	golden(t, "approvals-get", normalize(r.String(), names...))
	r = cli(t, k, 0, "approvals", "ls", "--json")
	var list []map[string]any
	if json.Unmarshal([]byte(r.Stdout), &list) != nil || len(list) != 1 || list[0]["id"] != ap1 || list[0]["message"] != "send it?" {
		t.Fatalf("ls --json: %s", r)
	}

	// The approvers check: bob may not decide; the kernel's 403 and who may.
	r = run(t, []string{"REBUNO_URL=" + k.URL, "REBUNO_USER=bob"}, "approvals", "grant", short1)
	if r.Code != 1 || !strings.HasPrefix(r.Stderr, `error: forbidden: forbidden: "bob" is not an approver for this approval`) ||
		!strings.Contains(r.Stderr, `hint: only alice may decide this approval and you decided as "bob"`) {
		t.Fatalf("403: %s", r)
	}
	if e := k.Execution(e1); e["status"] != "blocked" {
		t.Fatalf("a refused grant changed the execution: %v", e)
	}
	// --by wins over $REBUNO_USER; the decision is recorded under it.
	r = run(t, []string{"REBUNO_URL=" + k.URL, "REBUNO_USER=bob"}, "approvals", "grant", short1, "--by", "alice", "--rationale", "recipient checked")
	if r.Code != 0 || r.Stdout != "granted "+ap1+"\n" {
		t.Fatalf("grant: %s", r)
	}
	var got map[string]any
	k.Must(200, k.Do("GET", "/v0/approvals/"+ap1, nil, nil)).JSON(t, &got)
	if got["status"] != "granted" || got["decided_by"] != "alice" || got["rationale"] != "recipient checked" {
		t.Fatalf("approval: %v", got)
	}
	// A decided approval: 409, with what happened to it.
	r = run(t, []string{"REBUNO_URL=" + k.URL, "REBUNO_USER=alice"}, "approvals", "deny", ap1)
	if r.Code != 1 || !strings.HasPrefix(r.Stderr, "error: conflict: conflict: approval is not pending\n") ||
		!strings.Contains(r.Stderr, "hint: the approval was already granted by alice at ") {
		t.Fatalf("409: %s", r)
	}
	if r := cli(t, k, 0, "approvals", "ls"); r.Stdout != "" {
		t.Fatalf("nothing pending: %s", r)
	}
	r = cli(t, k, 0, "approvals", "ls", "--status", "granted")
	if !strings.HasPrefix(r.Stdout, short1+"\tgranted\t"+e1[28:]+"\tmailer\ttool_call send_email\talice\talice\t") {
		t.Fatalf("ls granted: %s", r)
	}
	l1b := kt.LeaseOf(a.NextWebhook())
	submit(t, a, e1, l1b, `{"kind":"tool_call","target":"send_email","args":{"to":"bob@example.com","subject":"hi"}}`, "proceed")

	// A rule without approvers: anyone decides; --by defaults to $USER when
	// $REBUNO_USER is unset. A denial's rationale is the step's reason.
	e2 := k.CreateExecution("mailer", `{}`)
	l2 := kt.LeaseOf(a.NextWebhook())
	ap2 := submit(t, a, e2, l2, `{"kind":"tool_call","target":"deploy","args":{"env":"prod"}}`, "blocked").ApprovalID
	r = cli(t, k, 0, "approvals", "ls", "--execution", e2[28:], "--json")
	if json.Unmarshal([]byte(r.Stdout), &list) != nil || len(list) != 1 || list[0]["id"] != ap2 {
		t.Fatalf("--execution: %s", r)
	}
	if r := cli(t, k, 0, "approvals", "ls", "--execution", e1); r.Stdout != "" {
		t.Fatalf("--execution of another: %s", r)
	}
	r = run(t, []string{"REBUNO_URL=" + k.URL, "USER=carol"}, "approvals", "deny", ap2[24:], "--rationale", "not on a friday", "--json")
	if r.Code != 0 || json.Unmarshal([]byte(r.Stdout), &got) != nil || got["status"] != "denied" || got["decided_by"] != "carol" {
		t.Fatalf("deny: %s", r)
	}
	l2b := kt.LeaseOf(a.NextWebhook())
	if d := submit(t, a, e2, l2b, `{"kind":"tool_call","target":"deploy","args":{"env":"prod"}}`, "denied"); d.Reason != "not on a friday" {
		t.Fatalf("denied step: %+v", d)
	}

	// Expiry: the timeout passes on the manual clock; a late grant gets 409
	// and is told why.
	e3 := k.CreateExecution("mailer", `{}`)
	l3 := kt.LeaseOf(a.NextWebhook())
	ap3 := submit(t, a, e3, l3, `{"kind":"tool_call","target":"deploy","args":{"env":"staging"}}`, "blocked").ApprovalID
	k.AdvanceClock(3 * time.Minute)
	waitEvent(t, k, e3, "approval.expired", 1)
	r = run(t, []string{"REBUNO_URL=" + k.URL, "USER=carol"}, "approvals", "grant", ap3)
	if r.Code != 1 || !strings.Contains(r.Stderr, "hint: the approval expired (it timed out) at ") {
		t.Fatalf("late grant: %s", r)
	}
	r = cli(t, k, 0, "approvals", "ls", "--status", "all")
	rows := strings.Split(strings.TrimSpace(r.Stdout), "\n")
	if len(rows) != 3 || !strings.HasPrefix(rows[0], short1+"\tgranted\t") || !strings.HasPrefix(rows[1], ap2[28:]+"\tdenied\t") ||
		!strings.HasPrefix(rows[2], ap3[28:]+"\texpired\t") || !strings.Contains(rows[1], "\tanyone\tcarol\t") {
		t.Fatalf("ls --status all:\n%s", r.Stdout)
	}

	// Ids and usage.
	if r := cli(t, k, 1, "approvals", "get", "abcdef"); !strings.Contains(r.Stderr, `error: not_found: no approval id ends with "abcdef"`) {
		t.Fatalf("%s", r)
	}
	cli(t, k, 2, "approvals", "get", "xyz")
	cli(t, k, 2, "approvals", "get")
	cli(t, k, 2, "approvals", "ls", "--status", "maybe")
	if r := cli(t, k, 1, "approvals", "get", "01900000-0000-7000-8000-000000000000"); !strings.Contains(r.Stderr, "error: not_found:") {
		t.Fatalf("%s", r)
	}
	cli(t, k, 2, "approvals", "frobnicate")
}

// TestApprovalTimeline: `exec watch` shows an approval as it is requested
// (with who may decide it and the command to do so) and as it is decided;
// `exec events` prints the whole story afterwards, including an expiry and
// a rate-limited step.
func TestApprovalTimeline(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("mailer", "")
	cli(t, k, 0, "policy", "set", "mailer", writeTemp(t, "p.yaml", approvalsBundle))
	id := strings.TrimSpace(cli(t, k, 0, "exec", "create", "mailer").Stdout)
	w := startWatch(t, []string{"REBUNO_URL=" + k.URL}, "exec", "watch", id)

	wh := a.NextWebhook()
	waitEvent(t, k, id, "dispatch.acked", 1)
	l1 := kt.LeaseOf(wh)
	ap1 := submit(t, a, id, l1, `{"kind":"tool_call","target":"send_email","args":{"to":"bob@example.com"}}`, "blocked").ApprovalID
	s1 := ap1[28:]
	watchFor(t, w, "the pending approval", func() bool {
		return w.has(regexp.MustCompile(`approval\.requested\s+approval `+s1+`  approvers alice  timeout 5m  "send it\?"`)) &&
			w.has(regexp.MustCompile(`execution\.blocked\s+waiting for approval `+s1+`  decide: rebuno approvals grant\|deny `+s1+`$`))
	})
	k.AdvanceClock(90 * time.Second)
	cli(t, k, 0, "approvals", "grant", s1, "--by", "alice", "--rationale", "ok")
	watchFor(t, w, "the grant", func() bool {
		return w.has(regexp.MustCompile(`approval\.granted\s+approval `+s1+`  by alice  "ok"  after 1m30s`)) &&
			w.has(regexp.MustCompile(`step\.allowed\s+tool_call send_email  approved  approval `+s1))
	})

	wh = a.NextWebhook()
	waitEvent(t, k, id, "dispatch.acked", 2)
	l2 := kt.LeaseOf(wh)
	s := submit(t, a, id, l2, `{"kind":"tool_call","target":"send_email","args":{"to":"bob@example.com"}}`, "proceed")
	a.Complete(id, s.StepID, l2, `{"sent":true}`)
	s = submit(t, a, id, l2, `{"kind":"llm_call","target":"gpt","args":{"n":1}}`, "proceed")
	a.Complete(id, s.StepID, l2, `"hello"`)
	if d := a.Submit(id, l2, `{"kind":"llm_call","target":"gpt","args":{"n":2}}`); d.Decision != "rate_limited" {
		t.Fatalf("%+v", d)
	}
	ap2 := submit(t, a, id, l2, `{"kind":"tool_call","target":"deploy","args":{"env":"prod"}}`, "blocked").ApprovalID
	k.AdvanceClock(3 * time.Minute)
	waitEvent(t, k, id, "approval.expired", 1)
	wh = a.NextWebhook()
	waitEvent(t, k, id, "dispatch.acked", 3)
	l3 := kt.LeaseOf(wh)
	if d := submit(t, a, id, l3, `{"kind":"tool_call","target":"deploy","args":{"env":"prod"}}`, "denied"); d.Reason != "approval_timeout" {
		t.Fatalf("%+v", d)
	}
	a.Finish(id, l3, `{"done":true}`)
	if code := w.wait(t); code != 0 {
		t.Fatalf("watch: exit %d\n%s", code, w.errText())
	}
	if !w.has(regexp.MustCompile(`approval\.expired\s+approval ` + ap2[28:] + `  timed out  after 3m00s$`)) {
		t.Fatalf("the watch did not show the expiry:\n%s", strings.Join(w.lines, "\n"))
	}

	names := []string{id, "<exec-id>", id[28:], "<exec>", s1, "<a1>", ap2[28:], "<a2>"}
	r := cli(t, k, 0, "exec", "events", id)
	golden(t, "approval-events", normalize(r.Stdout, names...))
	// Once decided, the blocked line no longer suggests a command.
	if strings.Contains(r.Stdout, "decide:") {
		t.Fatalf("decided approvals still show a hint:\n%s", r.Stdout)
	}
}

// watchFor waits until cond holds of the watch's output.
func watchFor(t *testing.T, w *watcher, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			w.mu.Lock()
			out := strings.Join(w.lines, "\n")
			w.mu.Unlock()
			t.Fatalf("the watch does not show %s; it shows:\n%s\nstderr:\n%s", what, out, w.errText())
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// replAgent is a minimal agent for the REPL test: a webhook receiver and
// v1-signed step submits.
type replAgent struct {
	id, secret, base string
	hooks            chan kt.Webhook
	srv              *httptest.Server
}

func newREPLAgent(t *testing.T, id string) *replAgent {
	ra := &replAgent{id: id, secret: "0123456789abcdef", hooks: make(chan kt.Webhook, 16)}
	ra.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var wh kt.Webhook
		json.Unmarshal(b, &wh)
		w.WriteHeader(200)
		ra.hooks <- wh
	}))
	t.Cleanup(ra.srv.Close)
	return ra
}

func (ra *replAgent) next(t *testing.T) kt.Webhook {
	t.Helper()
	select {
	case wh := <-ra.hooks:
		return wh
	case <-time.After(20 * time.Second):
		t.Fatal("no webhook")
	}
	return kt.Webhook{}
}

func (ra *replAgent) submit(t *testing.T, wh kt.Webhook, body string) map[string]any {
	t.Helper()
	path := "/v0/executions/" + wh.ExecutionID + "/steps"
	req, _ := http.NewRequest("POST", ra.base+path, bytes.NewReader([]byte(body)))
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	attempt := strconv.FormatInt(wh.DispatchAttempt, 10)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Rebuno-Agent-Id", ra.id)
	req.Header.Set("Rebuno-Timestamp", ts)
	req.Header.Set("Rebuno-Dispatch-Id", wh.DispatchID)
	req.Header.Set("Rebuno-Dispatch-Attempt", attempt)
	req.Header.Set("Rebuno-Signature", auth.SignV1([]byte(ra.secret), "POST", path, ts, wh.DispatchID, attempt, []byte(body)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var m map[string]any
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 || json.Unmarshal(b, &m) != nil {
		t.Fatalf("submit: %d %s", resp.StatusCode, b)
	}
	return m
}

// TestREPLGovernance: the REPL has the same verbs — policy set, explain and
// get, approvals ls (with tab completion of the pending id) and grant.
func TestREPLGovernance(t *testing.T) {
	home := t.TempDir()
	tm, base := startREPL(t, home)
	ra := newREPLAgent(t, "mailer")
	ra.base = base
	bundle := filepath.Join(home, "p.yaml")
	if err := os.WriteFile(bundle, []byte(approvalsBundle), 0o644); err != nil {
		t.Fatal(err)
	}

	tm.send("agent add --id mailer --webhook-url " + ra.srv.URL + "/webhook --secret " + ra.secret + "\r")
	tm.expect("Registered agent mailer")
	tm.send("policy set mailer " + bundle + "\r")
	tm.expect("Loaded policy for agent mailer: 4 rules, default_action deny")
	tm.send("policy explain " + bundle + " --kind tool_call --target send_email\r")
	tm.expect("rule        mail (priority 1, line 2)")
	tm.expect("approvers alice; timeout 5m; message \"send it?\"")
	tm.send("policy check " + bundle + "\r")
	tm.expect("✔ ok: " + bundle + " (4 rules, default_action deny)")
	tm.send("exec create mailer\r")
	tm.expect("Created execution")
	tm.expect("rebuno> ")

	wh := ra.next(t)
	d := ra.submit(t, wh, `{"kind":"tool_call","target":"send_email","args":{"to":"bob@example.com"}}`)
	apID, _ := d["approval_id"].(string)
	if d["decision"] != "blocked" || apID == "" {
		t.Fatalf("%v", d)
	}
	tm.send("approvals ls\r")
	tm.expect("APPROVERS")
	tm.expect(apID[28:])
	tm.expect("decide: approvals grant <id> --by NAME")
	tm.expect("rebuno> ")
	// Tab completes the pending approval's short id.
	tm.send("approvals grant \t")
	tm.expect("approvals grant " + apID[28:])
	tm.send(" --by bob\r")
	tm.expect(`error: forbidden: forbidden: "bob" is not an approver for this approval`)
	tm.expect("hint: only alice may decide")
	tm.send("approval grant " + apID[28:] + " --by alice\r")
	tm.expect("Granted approval " + apID[28:] + ": tool_call send_email of execution " + wh.ExecutionID[28:] + " as alice")
	tm.expect("the execution resumes: exec watch " + wh.ExecutionID[28:])
	var ap map[string]any
	getJSON(t, base+"/v0/approvals/"+apID, &ap)
	if ap["status"] != "granted" || ap["decided_by"] != "alice" {
		t.Fatalf("%v", ap)
	}
	tm.send("policies rm mailer\r")
	tm.expect("Removed the policy of agent mailer")
	tm.send("quit\r")
	if code := tm.wait(); code != 0 {
		t.Fatalf("quit: exit %d\n%s", code, tm.output())
	}
}
