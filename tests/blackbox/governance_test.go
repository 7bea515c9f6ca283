package blackbox

// Black-box tests of governance over HTTP: policy loading and validation
// (PROTOCOL.md §19, §21.3, §25), evaluation through submit (§10.2–§10.4,
// §12.5, §14.3), approvals (§7.8, §9.6, §18) and rate limits (§20, §24.4).
// Every test drives the real binary; time moves only through the manual test
// clock.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---------------------------------------------------------------------------
// helpers (all prefixed gv: the package is shared with other files)
// ---------------------------------------------------------------------------

var gvUUIDv7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// gvHTTP is used from goroutines, where the harness's Fatal-on-error client
// must not be.
var gvHTTP = &http.Client{Timeout: 30 * time.Second}

// gvSetPolicy loads a bundle through POST /v0/policies/{agent_id}.
func gvSetPolicy(t *testing.T, k *kt.Kernel, agentID, bundle string) *kt.Response {
	t.Helper()
	body, err := json.Marshal(map[string]string{"bundle": bundle})
	if err != nil {
		t.Fatal(err)
	}
	return k.Do("POST", "/v0/policies/"+agentID, body, nil)
}

func gvMustPolicy(t *testing.T, k *kt.Kernel, agentID, bundle string) {
	t.Helper()
	k.Must(204, gvSetPolicy(t, k, agentID, bundle))
}

// gvAgentJSON reads an agent as raw members.
func gvAgentJSON(t *testing.T, k *kt.Kernel, id string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	k.Must(200, k.Do("GET", "/v0/agents/"+id, nil, nil)).JSON(t, &m)
	return m
}

func gvAgentBundle(t *testing.T, k *kt.Kernel, id string) string {
	t.Helper()
	var s string
	if err := json.Unmarshal(gvAgentJSON(t, k, id)["policy_bundle"], &s); err != nil {
		t.Fatalf("policy_bundle of %s: %v", id, err)
	}
	return s
}

// gvRegister registers an agent that never receives a webhook.
func gvRegister(t *testing.T, k *kt.Kernel, id string) {
	t.Helper()
	body := fmt.Sprintf(`{"id":%q,"webhook_url":"http://127.0.0.1:9/never","secret":"secret-%s-0123456789"}`, id, id)
	k.Must(201, k.Do("POST", "/v0/agents", []byte(body), nil))
}

// gvDeliver waits for the next webhook of execution id (deliveries of other
// executions are dropped) and for its dispatch.acked, so that later event
// checks never see the ack interleaved.
func gvDeliver(t *testing.T, k *kt.Kernel, a *kt.Agent, id string) (kt.Webhook, kt.Lease) {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case wh := <-a.Webhooks:
			if wh.ExecutionID != id {
				continue
			}
			gvWaitEvent(t, k, id, 30*time.Second, func(e kt.Event) bool {
				return e.Type == "dispatch.acked" && e.Payload["dispatch_id"] == wh.DispatchID &&
					e.Payload["attempt"] == float64(wh.DispatchAttempt)
			})
			return wh, kt.LeaseOf(wh)
		case <-deadline:
			t.Fatalf("agent %s: no webhook for %s within 30s", a.ID, id)
		}
	}
}

// gvWaitEvent polls the log until an event matches, within d.
func gvWaitEvent(t *testing.T, k *kt.Kernel, id string, d time.Duration, match func(kt.Event) bool) kt.Event {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		for _, e := range k.Events(id) {
			if match(e) {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no matching event in %s within %s; log: %s", id, d, kt.Join(k.EventTypes(id)))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// gvLastSeq is the execution's last event_seq.
func gvLastSeq(t *testing.T, k *kt.Kernel, id string) int64 {
	t.Helper()
	evs := k.Events(id)
	if len(evs) == 0 {
		return 0
	}
	return evs[len(evs)-1].Seq
}

// gvSince returns the events after seq.
func gvSince(t *testing.T, k *kt.Kernel, id string, seq int64) []kt.Event {
	t.Helper()
	var out []kt.Event
	k.Must(200, k.Do("GET", fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", id, seq), nil, nil)).JSON(t, &out)
	return out
}

func gvTypes(evs []kt.Event) []string {
	out := []string{}
	for _, e := range evs {
		out = append(out, e.Type)
	}
	return out
}

func gvSameList(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

// gvExpectTypes fails unless evs have exactly the types want, in order.
func gvExpectTypes(t *testing.T, what string, evs []kt.Event, want ...string) {
	t.Helper()
	if got := gvTypes(evs); !gvSameList(got, want) {
		t.Fatalf("%s: events\n got %v\nwant %v", what, got, want)
	}
}

// gvStepPayload checks the members every step.* payload carries (§14.2).
func gvStepPayload(t *testing.T, e kt.Event, stepID, kind, target string) {
	t.Helper()
	if e.Payload["step_id"] != stepID || e.Payload["step_type"] != kind || e.Payload["target"] != target {
		t.Fatalf("%s payload %v, want step %s %s %s", e.Type, e.Payload, stepID, kind, target)
	}
}

// gvPayloadKeys fails unless the payload has exactly these keys.
func gvPayloadKeys(t *testing.T, e kt.Event, keys ...string) {
	t.Helper()
	got := make([]string, 0, len(e.Payload))
	for key := range e.Payload {
		got = append(got, key)
	}
	if len(got) != len(keys) {
		t.Fatalf("%s payload %v, want exactly keys %v", e.Type, e.Payload, keys)
	}
	for _, key := range keys {
		if _, ok := e.Payload[key]; !ok {
			t.Fatalf("%s payload %v lacks %q", e.Type, e.Payload, key)
		}
	}
}

// gvRawPayload returns one payload member as raw bytes.
func gvRawPayload(t *testing.T, k *kt.Kernel, id string, seq int64, key string) string {
	t.Helper()
	var evs []struct {
		Payload map[string]json.RawMessage `json:"payload"`
	}
	k.Must(200, k.Do("GET", fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1", id, seq-1), nil, nil)).JSON(t, &evs)
	if len(evs) != 1 {
		t.Fatalf("event %d of %s not found", seq, id)
	}
	return string(evs[0].Payload[key])
}

// gvSubmit submits a step and returns the response with its decoded members.
func gvSubmit(t *testing.T, a *kt.Agent, id string, l kt.Lease, body string) (*kt.Response, map[string]json.RawMessage) {
	t.Helper()
	r := a.Request("POST", "/v0/executions/"+id+"/steps", []byte(body), l)
	if r.Status != 200 {
		t.Fatalf("submit %s: %s", body, r)
	}
	var m map[string]json.RawMessage
	r.JSON(t, &m)
	return r, m
}

func gvStr(t *testing.T, m map[string]json.RawMessage, key string) string {
	t.Helper()
	raw, ok := m[key]
	if !ok {
		return ""
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("%s is not a string: %s", key, raw)
	}
	return s
}

// gvJSON renders decoded members for failure messages.
func gvJSON(m map[string]json.RawMessage) string {
	b, _ := json.Marshal(m)
	return string(b)
}

func gvKeys(m map[string]json.RawMessage) []string {
	var out []string
	for key := range m {
		out = append(out, key)
	}
	return out
}

// gvExactKeys fails unless the decision has exactly these members.
func gvExactKeys(t *testing.T, what string, m map[string]json.RawMessage, keys ...string) {
	t.Helper()
	if len(m) != len(keys) {
		t.Fatalf("%s: members %v, want %v (%s)", what, gvKeys(m), keys, gvJSON(m))
	}
	for _, key := range keys {
		if _, ok := m[key]; !ok {
			t.Fatalf("%s: members %v, want %v (%s)", what, gvKeys(m), keys, gvJSON(m))
		}
	}
}

// gvDecision checks a submit answer: decision, and for denied/blocked the
// reason and rule id.
type gvWant struct {
	decision, reason, ruleID string
}

func gvCheck(t *testing.T, what string, m map[string]json.RawMessage, w gvWant) {
	t.Helper()
	if got := gvStr(t, m, "decision"); got != w.decision {
		t.Fatalf("%s: decision %q, want %q (%s)", what, got, w.decision, gvJSON(m))
	}
	switch w.decision {
	case "proceed":
		gvExactKeys(t, what, m, "decision", "step_id", "resources")
		if string(m["resources"]) != "[]" {
			t.Fatalf("%s: resources %s", what, m["resources"])
		}
	case "denied":
		if gvStr(t, m, "reason") != w.reason {
			t.Fatalf("%s: reason %q, want %q", what, gvStr(t, m, "reason"), w.reason)
		}
		if w.ruleID == "" {
			gvExactKeys(t, what, m, "decision", "step_id", "reason")
		} else {
			gvExactKeys(t, what, m, "decision", "step_id", "reason", "rule_id")
			if gvStr(t, m, "rule_id") != w.ruleID {
				t.Fatalf("%s: rule_id %q, want %q", what, gvStr(t, m, "rule_id"), w.ruleID)
			}
		}
	case "blocked":
		gvExactKeys(t, what, m, "decision", "step_id", "approval_id")
		if !gvUUIDv7.MatchString(gvStr(t, m, "approval_id")) {
			t.Fatalf("%s: approval_id %s", what, m["approval_id"])
		}
	case "execution_blocked":
		gvExactKeys(t, what, m, "decision")
	}
	if sid, ok := m["step_id"]; ok && len(gvStr(t, m, "step_id")) != 64 {
		t.Fatalf("%s: step_id %s", what, sid)
	}
}

// gvStep reads a step as raw members.
func gvStep(t *testing.T, k *kt.Kernel, id, stepID string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	k.Must(200, k.Do("GET", "/v0/executions/"+id+"/steps/"+stepID, nil, nil)).JSON(t, &m)
	return m
}

func gvStepCount(t *testing.T, k *kt.Kernel, id string) int {
	t.Helper()
	var steps []map[string]any
	k.Must(200, k.Do("GET", "/v0/executions/"+id+"/steps", nil, nil)).JSON(t, &steps)
	return len(steps)
}

// gvApproval reads an approval as raw members.
func gvApproval(t *testing.T, k *kt.Kernel, id string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	k.Must(200, k.Do("GET", "/v0/approvals/"+id, nil, nil)).JSON(t, &m)
	return m
}

func gvDecide(k *kt.Kernel, approvalID, verb, body string) *kt.Response {
	return k.Do("POST", "/v0/approvals/"+approvalID+"/"+verb, []byte(body), nil)
}

// gvListApprovals lists approval ids for a query string.
func gvListApprovals(t *testing.T, k *kt.Kernel, query string) []string {
	t.Helper()
	var list []struct {
		ID string `json:"id"`
	}
	r := k.Must(200, k.Do("GET", "/v0/approvals"+query, nil, nil))
	if strings.TrimSpace(string(r.Body)) == "null" {
		t.Fatalf("approvals%s: null instead of []", query)
	}
	r.JSON(t, &list)
	out := []string{}
	for _, a := range list {
		out = append(out, a.ID)
	}
	return out
}

// gvExpectError checks an error answer's status, code and (when given) exact
// message.
func gvExpectError(t *testing.T, what string, r *kt.Response, status int, code, message string) {
	t.Helper()
	if r.Status != status || r.Code() != code {
		t.Fatalf("%s: got %s, want %d %s", what, r, status, code)
	}
	if message != "" {
		var env struct{ Message string }
		r.JSON(t, &env)
		if env.Message != message {
			t.Fatalf("%s: message %q, want %q", what, env.Message, message)
		}
	}
}

// gvMetric sums the samples of a metric whose labels include labels.
func gvMetric(t *testing.T, k *kt.Kernel, name string, labels map[string]string) float64 {
	t.Helper()
	r := k.Must(200, k.Do("GET", "/metrics", nil, nil))
	total := 0.0
	sc := bufio.NewScanner(bytes.NewReader(r.Body))
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "#") || !strings.HasPrefix(line, name) {
			continue
		}
		rest := line[len(name):]
		var lbls string
		switch {
		case strings.HasPrefix(rest, "{"):
			end := strings.Index(rest, "}")
			lbls, rest = rest[1:end], rest[end+1:]
		case strings.HasPrefix(rest, " "):
		default:
			continue // another metric with this prefix
		}
		ok := true
		for lk, lv := range labels {
			if !strings.Contains(","+lbls+",", fmt.Sprintf(",%s=%q,", lk, lv)) {
				ok = false
			}
		}
		if !ok {
			continue
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(rest), 64)
		if err != nil {
			t.Fatalf("metric line %q: %v", line, err)
		}
		total += f
	}
	return total
}

// gvWaitMetric polls a metric until it equals want (metrics are counted
// after the commit).
func gvWaitMetric(t *testing.T, k *kt.Kernel, name string, labels map[string]string, want float64) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for {
		got := gvMetric(t, k, name, labels)
		if got == want {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("metric %s%v = %v, want %v", name, labels, got, want)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func gvTime(t *testing.T, raw json.RawMessage) time.Time {
	t.Helper()
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		t.Fatalf("time %s: %v", raw, err)
	}
	tm, err := time.Parse(time.RFC3339Nano, s)
	if err != nil {
		t.Fatalf("time %q: %v", s, err)
	}
	return tm
}

func gvWithOccurrence(l kt.Lease, n int64) kt.Lease {
	l.Occurrence = n
	return l
}

// ---------------------------------------------------------------------------
// 1. Policy load (§19.3, §21.3)
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
	// The agent's other fields are untouched (§21.3).
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
// 1b. Provisioning manifest (§25)
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

	// Re-registering over the API keeps the provisioned policy (§21.1); the
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

// ---------------------------------------------------------------------------
// 2. Evaluation through submit (§10.2–§10.4, §12.5, §19.4)
// ---------------------------------------------------------------------------

const gvEvalBundle = `default_action: deny
rules:
  - id: search-ok
    priority: 10
    when: {target: "web_*", step_kind: tool_call}
    then: {decision: allow, reason: "searching is fine"}
  - id: no-shell
    priority: 20
    when: {targets: ["shell", "exec_*"]}
    then: {decision: deny, reason: "no shell access"}
  - id: bare-deny
    priority: 30
    when: {target: drop_table}
    then: {decision: deny}
  - id: srv-only
    priority: 40
    when:
      target: read_file
      arguments:
        path: {regex: "^/srv/"}
    then: {decision: allow}
  - id: no-forbidden-local
    priority: 50
    when: {step_kind: local, target: "forbidden_*"}
    then: {decision: deny, reason: "not this local step"}
  - id: for-other-agent
    priority: 5
    when: {agent_id: somebody-else}
    then: {decision: allow}
`

func TestGovPolicyEvaluation(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("judged", "")
	gvMustPolicy(t, k, "judged", gvEvalBundle)
	id := k.CreateExecution("judged", `{}`)
	_, l := gvDeliver(t, k, a, id)

	type stepCase struct {
		name, kind, target, args string
		want                     gvWant
		allowRule                string // rule_id of step.allowed for proceed
	}
	cases := []stepCase{
		{"allow rule", "tool_call", "web_search", `{"q":1}`, gvWant{decision: "proceed"}, "search-ok"},
		{"deny with reason", "tool_call", "shell", `{"cmd":"ls"}`, gvWant{"denied", "no shell access", "no-shell"}, ""},
		{"deny by targets glob", "tool_call", "exec_python", `{}`, gvWant{"denied", "no shell access", "no-shell"}, ""},
		{"deny without reason", "tool_call", "drop_table", `{"t":"users"}`, gvWant{"denied", "policy_denied", "bare-deny"}, ""},
		{"argument predicate matches", "tool_call", "read_file", `{"path":"/srv/data"}`, gvWant{decision: "proceed"}, "srv-only"},
		{"argument predicate fails", "tool_call", "read_file", `{"path":"/etc/passwd"}`, gvWant{"denied", "no explicit allow rule matched", "default"}, ""},
		{"args not an object", "tool_call", "read_file", `["/srv/data"]`, gvWant{"denied", "no explicit allow rule matched", "default"}, ""},
		{"step_kind excludes", "llm_call", "web_model", `{"messages":[]}`, gvWant{"denied", "no explicit allow rule matched", "default"}, ""},
		{"local unmatched under default deny", "local", "now", `null`, gvWant{decision: "proceed"}, "local"},
		{"explicit rule on local", "local", "forbidden_clock", `{}`, gvWant{"denied", "not this local step", "no-forbidden-local"}, ""},
	}
	stepIDs := map[string]string{}
	for _, c := range cases {
		seq := gvLastSeq(t, k, id)
		body := fmt.Sprintf(`{"kind":%q,"target":%q,"args":%s}`, c.kind, c.target, c.args)
		r, m := gvSubmit(t, a, id, l, body)
		gvCheck(t, c.name, m, c.want)
		sid := gvStr(t, m, "step_id")
		stepIDs[c.name] = sid
		if r.Header.Get("Rebuno-Step-Occurrence") != "0" {
			t.Fatalf("%s: occurrence header %q", c.name, r.Header.Get("Rebuno-Step-Occurrence"))
		}
		evs := gvSince(t, k, id, seq)
		st := gvStep(t, k, id, sid)
		if c.want.decision == "proceed" {
			gvExpectTypes(t, c.name, evs, "step.proposed", "step.allowed", "step.executing")
			gvPayloadKeys(t, evs[0], "step_id", "step_type", "target")
			gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "rule_id")
			if evs[1].Payload["rule_id"] != c.allowRule {
				t.Fatalf("%s: step.allowed %v", c.name, evs[1].Payload)
			}
			gvPayloadKeys(t, evs[2], "step_id", "step_type", "target")
			if string(st["status"]) != `"executing"` || st["started_at"] == nil || st["error"] != nil {
				t.Fatalf("%s: step %s", c.name, gvJSON(st))
			}
		} else {
			gvExpectTypes(t, c.name, evs, "step.proposed", "step.denied")
			gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "rule_id", "error")
			wantErr := fmt.Sprintf(`{"reason":%q,"rule_id":%q}`, c.want.reason, c.want.ruleID)
			if got := gvRawPayload(t, k, id, evs[1].Seq, "error"); got != wantErr {
				t.Fatalf("%s: step.denied error %s, want %s", c.name, got, wantErr)
			}
			if evs[1].Payload["rule_id"] != c.want.ruleID {
				t.Fatalf("%s: step.denied rule_id %v", c.name, evs[1].Payload)
			}
			if string(st["status"]) != `"denied"` || string(st["error"]) != wantErr || st["completed_at"] == nil || st["started_at"] != nil {
				t.Fatalf("%s: step %s", c.name, gvJSON(st))
			}
		}
		for _, e := range evs {
			gvStepPayload(t, e, sid, c.kind, c.target)
		}
	}
	gvWaitMetric(t, k, "rebuno_policy_decisions_total", map[string]string{"decision": "deny"}, 7)
	gvWaitMetric(t, k, "rebuno_policy_decisions_total", map[string]string{"decision": "allow"}, 3)

	// A recorded decision is never re-evaluated (§10.2): flip the bundle,
	// then replay the same step ids (occurrence 0) and submit new ones.
	a.Complete(id, stepIDs["allow rule"], l, `{"hits":1}`)
	flipped := "default_action: allow\nrules:\n  - id: flip\n    when: {target: \"web_*\"}\n    then: {decision: deny, reason: flipped}\n"
	gvMustPolicy(t, k, "judged", flipped)
	seq := gvLastSeq(t, k, id)
	l0 := gvWithOccurrence(l, 0)
	_, m := gvSubmit(t, a, id, l0, `{"kind":"tool_call","target":"web_search","args":{"q":1}}`)
	if gvStr(t, m, "decision") != "replay" || string(m["result"]) != `{"hits":1}` || gvStr(t, m, "step_id") != stepIDs["allow rule"] {
		t.Fatalf("allowed step replay under a denying bundle: %s", gvJSON(m))
	}
	_, m = gvSubmit(t, a, id, l0, `{"kind":"tool_call","target":"shell","args":{"cmd":"ls"}}`)
	gvCheck(t, "denied replay under an allowing bundle", m, gvWant{"denied", "no shell access", "no-shell"})
	if gvStr(t, m, "step_id") != stepIDs["deny with reason"] {
		t.Fatalf("denied replay names another step: %s", gvJSON(m))
	}
	_, m = gvSubmit(t, a, id, l0, `{"kind":"tool_call","target":"drop_table","args":{"t":"users"}}`)
	gvCheck(t, "bare denied replay", m, gvWant{"denied", "policy_denied", "bare-deny"})
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("replays wrote events: %v", gvTypes(evs))
	}
	// New steps (the next occurrence) see the new bundle at once.
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"web_search","args":{"q":1}}`)
	gvCheck(t, "new step, flipped bundle", m, gvWant{"denied", "flipped", "flip"})
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"shell","args":{"cmd":"ls"}}`)
	gvCheck(t, "new step, default allow", m, gvWant{decision: "proceed"})
	evs := gvSince(t, k, id, seq)
	if len(evs) != 5 || evs[4].Type != "step.executing" || evs[3].Payload["rule_id"] != "default" {
		t.Fatalf("events after the flip: %v", evs)
	}

	// Removing the bundle: every step is allowed as "permissive".
	gvMustPolicy(t, k, "judged", "")
	seq = gvLastSeq(t, k, id)
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"drop_table","args":{"t":"orders"}}`)
	gvCheck(t, "no bundle", m, gvWant{decision: "proceed"})
	evs = gvSince(t, k, id, seq)
	if len(evs) != 3 || evs[1].Type != "step.allowed" || evs[1].Payload["rule_id"] != "permissive" {
		t.Fatalf("permissive events: %v", evs)
	}
}

// ---------------------------------------------------------------------------
// 3. Approvals (§10.4, §18, §9.6)
// ---------------------------------------------------------------------------

const gvApprovalBundle = `default_action: allow
rules:
  - id: mail-needs-ok
    when: {target: send_email}
    then:
      decision: require_approval
      approval_config:
        approvers: [alice, bob]
        timeout: 5m
        message: "Send this mail?"
  - id: pay-needs-ok
    priority: 1
    when: {target: pay}
    then: {decision: require_approval}
`

// gvBlock submits a gated step and checks the blocked answer and the four
// events of §14.3; it returns the step id and the approval id.
func gvBlock(t *testing.T, k *kt.Kernel, a *kt.Agent, id string, l kt.Lease, target, args, ruleID string) (string, string) {
	t.Helper()
	seq := gvLastSeq(t, k, id)
	r, m := gvSubmit(t, a, id, l, fmt.Sprintf(`{"kind":"tool_call","target":%q,"args":%s}`, target, args))
	gvCheck(t, "gated submit", m, gvWant{decision: "blocked"})
	if r.Header.Get("Rebuno-Step-Occurrence") == "" {
		t.Fatalf("blocked answer without occurrence header")
	}
	sid, aid := gvStr(t, m, "step_id"), gvStr(t, m, "approval_id")
	evs := gvSince(t, k, id, seq)
	gvExpectTypes(t, "require_approval", evs, "step.proposed", "step.awaiting_approval", "approval.requested", "execution.blocked")
	gvStepPayload(t, evs[0], sid, "tool_call", target)
	gvStepPayload(t, evs[1], sid, "tool_call", target)
	gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "rule_id")
	if evs[1].Payload["rule_id"] != ruleID {
		t.Fatalf("step.awaiting_approval %v", evs[1].Payload)
	}
	gvPayloadKeys(t, evs[2], "approval_id", "step_id", "execution_id", "status")
	if evs[2].Payload["approval_id"] != aid || evs[2].Payload["step_id"] != sid || evs[2].Payload["execution_id"] != id || evs[2].Payload["status"] != "pending" {
		t.Fatalf("approval.requested %v", evs[2].Payload)
	}
	gvPayloadKeys(t, evs[3], "execution_id", "status")
	if evs[3].Payload["execution_id"] != id || evs[3].Payload["status"] != "blocked" {
		t.Fatalf("execution.blocked %v", evs[3].Payload)
	}
	if st := k.Execution(id)["status"]; st != "blocked" {
		t.Fatalf("execution %v after require_approval", st)
	}
	if st := gvStep(t, k, id, sid); string(st["status"]) != `"awaiting_approval"` || st["error"] != nil || st["started_at"] != nil {
		t.Fatalf("gated step %s", gvJSON(st))
	}
	return sid, aid
}

// gvResolved checks the four events of a grant, deny or expiry (§14.3) after
// seq and returns the new dispatch id.
func gvResolved(t *testing.T, k *kt.Kernel, id string, seq int64, first string, sid, aid, target string) (string, []kt.Event) {
	t.Helper()
	evs := gvSince(t, k, id, seq)
	if len(evs) < 4 {
		t.Fatalf("after the decision: %v", gvTypes(evs))
	}
	second := "step.denied"
	if first == "approval.granted" {
		second = "step.allowed"
	}
	gvExpectTypes(t, "decision", evs[:4], first, second, "execution.resumed", "dispatch.queued")
	for _, e := range evs[4:] {
		if e.Type != "dispatch.acked" {
			t.Fatalf("unexpected event after the decision: %v", gvTypes(evs))
		}
	}
	if evs[0].Payload["approval_id"] != aid || evs[0].Payload["step_id"] != sid || evs[0].Payload["execution_id"] != id {
		t.Fatalf("%s %v", first, evs[0].Payload)
	}
	gvStepPayload(t, evs[1], sid, "tool_call", target)
	if first == "approval.granted" {
		gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "approval_id")
		if evs[1].Payload["approval_id"] != aid {
			t.Fatalf("step.allowed %v", evs[1].Payload)
		}
	} else {
		gvPayloadKeys(t, evs[1], "step_id", "step_type", "target", "error")
	}
	if evs[2].Payload["execution_id"] != id || evs[2].Payload["status"] != "running" {
		t.Fatalf("execution.resumed %v", evs[2].Payload)
	}
	gvPayloadKeys(t, evs[3], "dispatch_id", "execution_id", "status", "attempt")
	d, _ := evs[3].Payload["dispatch_id"].(string)
	if !gvUUIDv7.MatchString(d) || evs[3].Payload["status"] != "pending" || evs[3].Payload["attempt"] != 0.0 {
		t.Fatalf("dispatch.queued %v", evs[3].Payload)
	}
	return d, evs
}

func TestGovApprovalGrant(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)
	id := k.CreateExecution("gate", `{}`)
	wh1, l1 := gvDeliver(t, k, a, id)

	_, m := gvSubmit(t, a, id, l1, `{"kind":"tool_call","target":"web_search","args":{"q":"x"}}`)
	gvCheck(t, "before the gate", m, gvWant{decision: "proceed"})
	s1 := gvStr(t, m, "step_id")
	s2, aid := gvBlock(t, k, a, id, l1, "send_email", `{"to":"x@example.com"}`, "mail-needs-ok")

	ap := gvApproval(t, k, aid)
	want := map[string]string{"id": `"` + aid + `"`, "step_id": `"` + s2 + `"`, "execution_id": `"` + id + `"`, "agent_id": `"gate"`,
		"kind": `"tool_call"`, "target": `"send_email"`, "status": `"pending"`, "approvers": `["alice","bob"]`, "message": `"Send this mail?"`}
	for key, v := range want {
		if string(ap[key]) != v {
			t.Fatalf("approval %s = %s, want %s", key, ap[key], v)
		}
	}
	for _, absent := range []string{"decided_by", "decided_at", "rationale"} {
		if _, ok := ap[absent]; ok {
			t.Fatalf("pending approval has %s: %s", absent, ap[absent])
		}
	}
	if d := gvTime(t, ap["timeout_at"]).Sub(gvTime(t, ap["created_at"])); d != 5*time.Minute {
		t.Fatalf("timeout_at - created_at = %s", d)
	}

	// While blocked (§9.6, §10.3, §13, §7.4): the released dispatch gets the
	// answers of a blocked execution and writes nothing.
	seq := gvLastSeq(t, k, id)
	r, m := gvSubmit(t, a, id, l1, `{"kind":"tool_call","target":"web_fetch","args":{}}`)
	gvCheck(t, "new step while blocked", m, gvWant{decision: "execution_blocked"})
	if r.Header.Get("Rebuno-Step-Occurrence") != "" {
		t.Fatalf("execution_blocked carries an occurrence header")
	}
	_, m = gvSubmit(t, a, id, gvWithOccurrence(l1, 0), `{"kind":"tool_call","target":"send_email","args":{"to":"x@example.com"}}`)
	gvCheck(t, "gated step again", m, gvWant{decision: "blocked"})
	if gvStr(t, m, "approval_id") != aid || gvStr(t, m, "step_id") != s2 {
		t.Fatalf("replay of the gated step: %s", gvJSON(m))
	}
	k.Must(204, a.Request("POST", "/v0/executions/"+id+"/heartbeat", nil, l1))
	gvExpectError(t, "complete of the gated step",
		a.Request("POST", "/v0/executions/"+id+"/steps/"+s2+"/complete", []byte(`{"result":1}`), l1), 409, "conflict", "conflict: step is not executing")
	gvExpectError(t, "execution complete while blocked",
		a.Request("POST", "/v0/executions/"+id+"/complete", []byte(`{"output":1}`), l1), 409, "conflict", "conflict: execution is blocked awaiting approval")
	gvExpectError(t, "execution fail while blocked",
		a.Request("POST", "/v0/executions/"+id+"/fail", []byte(`{"error":"x"}`), l1), 409, "conflict", "conflict: execution is blocked awaiting approval")
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("blocked answers wrote events: %v", gvTypes(evs))
	}
	// A step started before the block can still be completed.
	if d := a.Complete(id, s1, l1, `{"hits":2}`); d.Decision != "recorded" {
		t.Fatalf("complete while blocked: %+v", d)
	}
	gvExpectTypes(t, "complete while blocked", gvSince(t, k, id, seq), "step.succeeded")

	// The released dispatch is never redelivered, even long after its lease.
	seq = gvLastSeq(t, k, id)
	k.AdvanceClock(130 * time.Second)
	a.NoWebhook(1500 * time.Millisecond)
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("released dispatch: %v", gvTypes(evs))
	}

	// Approvers check (§18.3): exact, case-sensitive membership.
	for by, body := range map[string]string{"mallory": `{"decided_by":"mallory"}`, "Alice": `{"decided_by":"Alice"}`, "": `{}`} {
		for _, verb := range []string{"grant", "deny"} {
			gvExpectError(t, verb+" by "+by, gvDecide(k, aid, verb, body), 403, "forbidden",
				fmt.Sprintf("forbidden: %q is not an approver for this approval", by))
		}
	}
	if got := gvListApprovals(t, k, ""); len(got) != 1 || got[0] != aid {
		t.Fatalf("pending approvals %v", got)
	}
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("refused decisions wrote events: %v", gvTypes(evs))
	}

	// Grant.
	k.Must(204, gvDecide(k, aid, "grant", `{"decided_by":"alice","rationale":"looks fine"}`))
	d2, evs := gvResolved(t, k, id, seq, "approval.granted", s2, aid, "send_email")
	gvPayloadKeys(t, evs[0], "approval_id", "step_id", "execution_id", "status", "decided_by", "rationale")
	if evs[0].Payload["status"] != "granted" || evs[0].Payload["decided_by"] != "alice" || evs[0].Payload["rationale"] != "looks fine" {
		t.Fatalf("approval.granted %v", evs[0].Payload)
	}
	if d2 <= wh1.DispatchID {
		t.Fatalf("new dispatch %s not after %s", d2, wh1.DispatchID)
	}
	ap = gvApproval(t, k, aid)
	if string(ap["status"]) != `"granted"` || string(ap["decided_by"]) != `"alice"` || string(ap["rationale"]) != `"looks fine"` || ap["decided_at"] == nil {
		t.Fatalf("granted approval %s", gvJSON(ap))
	}
	if st := gvStep(t, k, id, s2); string(st["status"]) != `"allowed"` {
		t.Fatalf("granted step %s", st["status"])
	}
	if st := k.Execution(id)["status"]; st != "running" {
		t.Fatalf("execution %v after grant", st)
	}
	gvExpectError(t, "grant twice", gvDecide(k, aid, "grant", `{"decided_by":"bob"}`), 409, "conflict", "conflict: approval is not pending")
	gvExpectError(t, "deny after grant", gvDecide(k, aid, "deny", `{"decided_by":"bob"}`), 409, "conflict", "conflict: approval is not pending")
	if got := gvListApprovals(t, k, ""); len(got) != 0 {
		t.Fatalf("pending approvals after grant %v", got)
	}

	// The new dispatch arrives; the old attempt is superseded.
	wh2, l2 := gvDeliver(t, k, a, id)
	if wh2.DispatchID != d2 || wh2.DispatchAttempt != 1 {
		t.Fatalf("webhook after grant: %s", wh2.Body)
	}
	seq = gvLastSeq(t, k, id)
	gvExpectError(t, "old submit", a.Request("POST", "/v0/executions/"+id+"/steps", []byte(`{"kind":"tool_call","target":"web_search","args":{"q":"y"}}`), l1), 409, "lease_superseded", "lease superseded")
	gvExpectError(t, "old heartbeat", a.Request("POST", "/v0/executions/"+id+"/heartbeat", nil, l1), 409, "lease_superseded", "")
	gvExpectError(t, "old complete", a.Request("POST", "/v0/executions/"+id+"/complete", []byte(`{"output":1}`), l1), 409, "lease_superseded", "")
	gvExpectError(t, "old replay of the gated step", a.Request("POST", "/v0/executions/"+id+"/steps", []byte(`{"kind":"tool_call","target":"send_email","args":{"to":"x@example.com"}}`), gvWithOccurrence(l1, 0)), 409, "lease_superseded", "")
	if evs := gvSince(t, k, id, seq); len(evs) != 0 {
		t.Fatalf("superseded requests wrote events: %v", gvTypes(evs))
	}

	// The handler replays: the first step replays, the gated one proceeds
	// exactly once.
	_, m = gvSubmit(t, a, id, l2, `{"kind":"tool_call","target":"web_search","args":{"q":"x"}}`)
	if gvStr(t, m, "decision") != "replay" || string(m["result"]) != `{"hits":2}` {
		t.Fatalf("replay after grant: %s", gvJSON(m))
	}
	_, m = gvSubmit(t, a, id, l2, `{"kind":"tool_call","target":"send_email","args":{"to":"x@example.com"}}`)
	gvCheck(t, "approved step", m, gvWant{decision: "proceed"})
	if gvStr(t, m, "step_id") != s2 {
		t.Fatalf("approved step id %s", gvJSON(m))
	}
	evs = gvSince(t, k, id, seq)
	gvExpectTypes(t, "resumed approved step", evs, "step.executing")
	gvStepPayload(t, evs[0], s2, "tool_call", "send_email")
	a.Complete(id, s2, l2, `{"sent":true}`)
	_, m = gvSubmit(t, a, id, gvWithOccurrence(l2, 0), `{"kind":"tool_call","target":"send_email","args":{"to":"x@example.com"}}`)
	if gvStr(t, m, "decision") != "replay" || string(m["result"]) != `{"sent":true}` {
		t.Fatalf("approved step after completion: %s", gvJSON(m))
	}
	a.Finish(id, l2, `"done"`)
	if e := k.Execution(id); e["status"] != "completed" {
		t.Fatalf("execution %v", e)
	}
	if n := strings.Count(kt.Join(k.EventTypes(id)), "approval."); n != 2 {
		t.Fatalf("approval events: %v", k.EventTypes(id))
	}
	gvWaitMetric(t, k, "rebuno_approval_outcomes_total", map[string]string{"outcome": "granted"}, 1)
}

func TestGovApprovalDeny(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--approval-timeout", "30s"}})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)

	// A rule without approval_config: anyone decides, the kernel's timeout.
	id := k.CreateExecution("gate", `{}`)
	_, l := gvDeliver(t, k, a, id)
	sid, aid := gvBlock(t, k, a, id, l, "pay", `{"amount":5}`, "pay-needs-ok")
	ap := gvApproval(t, k, aid)
	if string(ap["approvers"]) != `[]` || ap["message"] != nil {
		t.Fatalf("approval without config: %s", gvJSON(ap))
	}
	if d := gvTime(t, ap["timeout_at"]).Sub(gvTime(t, ap["created_at"])); d != 30*time.Second {
		t.Fatalf("default approval timeout %s", d)
	}
	seq := gvLastSeq(t, k, id)
	k.Must(204, gvDecide(k, aid, "deny", `{}`))
	_, evs := gvResolved(t, k, id, seq, "approval.denied", sid, aid, "pay")
	gvPayloadKeys(t, evs[0], "approval_id", "step_id", "execution_id", "status")
	if evs[0].Payload["status"] != "denied" {
		t.Fatalf("approval.denied %v", evs[0].Payload)
	}
	if got := gvRawPayload(t, k, id, evs[1].Seq, "error"); got != `{"reason":"approval_denied"}` {
		t.Fatalf("step.denied error %s", got)
	}
	st := gvStep(t, k, id, sid)
	if string(st["status"]) != `"denied"` || string(st["error"]) != `{"reason":"approval_denied"}` || st["completed_at"] == nil {
		t.Fatalf("denied step %s", gvJSON(st))
	}
	ap = gvApproval(t, k, aid)
	if string(ap["status"]) != `"denied"` || ap["decided_at"] == nil || ap["decided_by"] != nil || ap["rationale"] != nil {
		t.Fatalf("denied approval %s", gvJSON(ap))
	}
	gvExpectError(t, "grant after deny", gvDecide(k, aid, "grant", `{}`), 409, "conflict", "")
	_, l2 := gvDeliver(t, k, a, id)
	_, m := gvSubmit(t, a, id, l2, `{"kind":"tool_call","target":"pay","args":{"amount":5}}`)
	gvCheck(t, "replay of a denied approval", m, gvWant{"denied", "approval_denied", ""})
	a.Finish(id, l2, `null`)

	// With approvers and a rationale, the rationale is the reason.
	id2 := k.CreateExecution("gate", `{}`)
	_, l = gvDeliver(t, k, a, id2)
	sid, aid = gvBlock(t, k, a, id2, l, "send_email", `{"to":"y"}`, "mail-needs-ok")
	seq = gvLastSeq(t, k, id2)
	k.Must(204, gvDecide(k, aid, "deny", `{"decided_by":"bob","rationale":"not today"}`))
	_, evs = gvResolved(t, k, id2, seq, "approval.denied", sid, aid, "send_email")
	if evs[0].Payload["decided_by"] != "bob" || evs[0].Payload["rationale"] != "not today" {
		t.Fatalf("approval.denied %v", evs[0].Payload)
	}
	if got := gvRawPayload(t, k, id2, evs[1].Seq, "error"); got != `{"reason":"not today"}` {
		t.Fatalf("step.denied error %s", got)
	}
	_, l2 = gvDeliver(t, k, a, id2)
	_, m = gvSubmit(t, a, id2, l2, `{"kind":"tool_call","target":"send_email","args":{"to":"y"}}`)
	gvCheck(t, "replay of a denied mail", m, gvWant{"denied", "not today", ""})
	// The handler goes on after the denial: a new step is evaluated again.
	_, m = gvSubmit(t, a, id2, l2, `{"kind":"tool_call","target":"web_search","args":{}}`)
	gvCheck(t, "after denial", m, gvWant{decision: "proceed"})
	gvWaitMetric(t, k, "rebuno_approval_outcomes_total", map[string]string{"outcome": "denied"}, 2)

	// Bad input on the decision routes.
	gvExpectError(t, "unknown approval", gvDecide(k, "01900000-0000-7000-8000-000000000000", "grant", `{}`), 404, "not_found", "")
	gvExpectError(t, "get unknown approval", k.Do("GET", "/v0/approvals/01900000-0000-7000-8000-000000000000", nil, nil), 404, "not_found", "")
	gvExpectError(t, "bad approval id", gvDecide(k, "not-a-uuid", "grant", `{}`), 400, "validation_error", "")
	gvExpectError(t, "unknown field", gvDecide(k, aid, "deny", `{"decided_by":"bob","why":"x"}`), 400, "validation_error", "")
	gvExpectError(t, "long decided_by", gvDecide(k, aid, "deny", fmt.Sprintf(`{"decided_by":%q}`, strings.Repeat("b", 257))), 400, "validation_error", "")
	gvExpectError(t, "long rationale", gvDecide(k, aid, "deny", fmt.Sprintf(`{"rationale":%q}`, strings.Repeat("r", 4097))), 400, "validation_error", "")
	gvExpectError(t, "empty body", gvDecide(k, aid, "deny", ``), 400, "validation_error", "")
}

func TestGovApprovalExpiry(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--approval-timeout", "45s"}})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)
	id := k.CreateExecution("gate", `{}`)
	_, l := gvDeliver(t, k, a, id)
	sid, aid := gvBlock(t, k, a, id, l, "pay", `{"amount":7}`, "pay-needs-ok")

	k.AdvanceClock(44 * time.Second)
	if ap := gvApproval(t, k, aid); string(ap["status"]) != `"pending"` {
		t.Fatalf("approval expired early: %s", gvJSON(ap))
	}
	seq := gvLastSeq(t, k, id)
	start := time.Now()
	k.AdvanceClock(2 * time.Second)
	gvWaitEvent(t, k, id, 2*time.Second, func(e kt.Event) bool { return e.Type == "approval.expired" })
	if el := time.Since(start); el > 2*time.Second {
		t.Fatalf("expiry took %s", el)
	}
	_, evs := gvResolved(t, k, id, seq, "approval.expired", sid, aid, "pay")
	gvPayloadKeys(t, evs[0], "approval_id", "step_id", "execution_id", "status", "rationale")
	if evs[0].Payload["status"] != "expired" || evs[0].Payload["rationale"] != "timeout" {
		t.Fatalf("approval.expired %v", evs[0].Payload)
	}
	if got := gvRawPayload(t, k, id, evs[1].Seq, "error"); got != `{"reason":"approval_timeout"}` {
		t.Fatalf("step.denied error %s", got)
	}
	ap := gvApproval(t, k, aid)
	if string(ap["status"]) != `"expired"` || string(ap["rationale"]) != `"timeout"` || ap["decided_at"] == nil || ap["decided_by"] != nil {
		t.Fatalf("expired approval %s", gvJSON(ap))
	}
	if e := k.Execution(id); e["status"] != "running" {
		t.Fatalf("expiry must resume, not fail: %v", e)
	}
	gvExpectError(t, "grant after expiry", gvDecide(k, aid, "grant", `{}`), 409, "conflict", "conflict: approval is not pending")
	_, l2 := gvDeliver(t, k, a, id)
	_, m := gvSubmit(t, a, id, l2, `{"kind":"tool_call","target":"pay","args":{"amount":7}}`)
	gvCheck(t, "replay of an expired approval", m, gvWant{"denied", "approval_timeout", ""})
	if got := gvListApprovals(t, k, "?status=expired"); len(got) != 1 || got[0] != aid {
		t.Fatalf("expired approvals %v", got)
	}
	gvWaitMetric(t, k, "rebuno_approval_outcomes_total", map[string]string{"outcome": "expired"}, 1)
}

func TestGovApprovalList(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)
	var ids, execs []string
	for i := 0; i < 4; i++ {
		id := k.CreateExecution("gate", `{}`)
		_, l := gvDeliver(t, k, a, id)
		_, aid := gvBlock(t, k, a, id, l, "pay", fmt.Sprintf(`{"n":%d}`, i), "pay-needs-ok")
		ids, execs = append(ids, aid), append(execs, id)
	}
	for i := 1; i < len(ids); i++ {
		if ids[i] <= ids[i-1] {
			t.Fatalf("approval ids not increasing: %v", ids)
		}
	}
	k.Must(204, gvDecide(k, ids[1], "grant", `{}`))
	k.Must(204, gvDecide(k, ids[2], "deny", `{}`))

	check := func(query string, want ...string) {
		t.Helper()
		if want == nil {
			want = []string{}
		}
		if got := gvListApprovals(t, k, query); !gvSameList(got, want) {
			t.Fatalf("approvals%s = %v, want %v", query, got, want)
		}
	}
	check("", ids[0], ids[3])
	check("?status=pending", ids[0], ids[3])
	check("?status=granted", ids[1])
	check("?status=denied", ids[2])
	check("?status=expired")
	check("?execution_id="+execs[3], ids[3])
	check("?execution_id="+strings.ToUpper(execs[3]), ids[3])
	check("?status=granted&execution_id=" + execs[0])
	check("?after="+ids[0], ids[3])
	check("?after=" + ids[3])
	check("?limit=1", ids[0])
	check("?limit=0", ids[0], ids[3])
	check("?limit=5000", ids[0], ids[3])
	for _, q := range []string{"?status=open", "?limit=-1", "?limit=x", "?execution_id=nope", "?after=123", "?status=pending&status=granted"} {
		gvExpectError(t, q, k.Do("GET", "/v0/approvals"+q, nil, nil), 400, "validation_error", "")
	}
	// GET returns any status; the body shape is the Approval of §2.5.
	ap := gvApproval(t, k, ids[2])
	if string(ap["status"]) != `"denied"` || string(ap["approvers"]) != "[]" {
		t.Fatalf("approval %s", gvJSON(ap))
	}
	gvExpectError(t, "bad id", k.Do("GET", "/v0/approvals/xyz", nil, nil), 400, "validation_error", "")
	if ap := gvApproval(t, k, strings.ToUpper(ids[0])); string(ap["id"]) != `"`+ids[0]+`"` {
		t.Fatalf("uppercase id lookup: %s", gvJSON(ap))
	}
}

func TestGovApprovalCancelAndDeadline(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--deadline-timeout", "2m"}})
	a := k.NewAgent("gate", "")
	gvMustPolicy(t, k, "gate", gvApprovalBundle)

	// Cancel: §7.8 expires the pending approval, denies its step and cancels
	// the step still executing, after the terminal event.
	id := k.CreateExecution("gate", `{}`)
	_, l := gvDeliver(t, k, a, id)
	_, m := gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"web_search","args":{}}`)
	open := gvStr(t, m, "step_id")
	sid, aid := gvBlock(t, k, a, id, l, "send_email", `{"to":"z"}`, "mail-needs-ok")
	seq := gvLastSeq(t, k, id)
	k.Must(204, k.Do("POST", "/v0/executions/"+id+"/cancel", nil, nil))
	evs := gvSince(t, k, id, seq)
	gvExpectTypes(t, "cancel while blocked", evs, "execution.cancelled", "approval.expired", "step.denied", "step.cancelled")
	if evs[1].Payload["rationale"] != "execution_cancelled" || evs[1].Payload["approval_id"] != aid {
		t.Fatalf("approval.expired %v", evs[1].Payload)
	}
	gvStepPayload(t, evs[2], sid, "tool_call", "send_email")
	if got := gvRawPayload(t, k, id, evs[2].Seq, "error"); got != `{"reason":"execution_cancelled"}` {
		t.Fatalf("step.denied error %s", got)
	}
	gvStepPayload(t, evs[3], open, "tool_call", "web_search")
	ap := gvApproval(t, k, aid)
	if string(ap["status"]) != `"expired"` || string(ap["rationale"]) != `"execution_cancelled"` {
		t.Fatalf("approval after cancel %s", gvJSON(ap))
	}
	gvExpectError(t, "grant after cancel", gvDecide(k, aid, "grant", `{"decided_by":"alice"}`), 409, "conflict", "")
	gvExpectError(t, "deny after cancel", gvDecide(k, aid, "deny", `{"decided_by":"alice"}`), 409, "conflict", "")
	_, m = gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"web_search","args":{"n":2}}`)
	if gvStr(t, m, "decision") != "execution_terminal" {
		t.Fatalf("submit after cancel %s", gvJSON(m))
	}
	if n := len(gvSince(t, k, id, seq)); n != 4 {
		t.Fatalf("events appended after the terminal transaction: %v", k.EventTypes(id))
	}

	// Deadline: the same clean-up with cause deadline_exceeded.
	id = k.CreateExecution("gate", `{}`)
	_, l = gvDeliver(t, k, a, id)
	sid, aid = gvBlock(t, k, a, id, l, "send_email", `{"to":"w"}`, "mail-needs-ok")
	k.AdvanceClock(time.Minute) // neither the 2m deadline nor the approval's 5m
	seq = gvLastSeq(t, k, id)
	k.AdvanceClock(61 * time.Second)
	e := gvWaitEvent(t, k, id, 5*time.Second, func(e kt.Event) bool { return e.Type == "execution.cancelled" })
	if e.Payload["reason"] != "deadline_exceeded" {
		t.Fatalf("execution.cancelled %v", e.Payload)
	}
	evs = gvSince(t, k, id, seq)
	gvExpectTypes(t, "deadline while blocked", evs, "execution.cancelled", "approval.expired", "step.denied")
	if evs[1].Payload["rationale"] != "deadline_exceeded" {
		t.Fatalf("approval.expired %v", evs[1].Payload)
	}
	if got := gvRawPayload(t, k, id, evs[2].Seq, "error"); got != `{"reason":"deadline_exceeded"}` {
		t.Fatalf("step.denied error %s", got)
	}
	gvStepPayload(t, evs[2], sid, "tool_call", "send_email")
	if ap := gvApproval(t, k, aid); string(ap["rationale"]) != `"deadline_exceeded"` {
		t.Fatalf("approval after deadline %s", gvJSON(ap))
	}
}

// TestGovApprovalRaces fires grant, deny, (every other round) cancel and a
// clock advance past the approval's timeout at the same moment: exactly one
// decides the approval, the others are refused with 409, and the log holds
// exactly one decision.
func TestGovApprovalRaces(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	// A day-long lease: the clock jumps of the races never reclaim a dispatch.
	a := k.NewAgent("racer", `"lease_timeout_seconds":86400`)
	gvMustPolicy(t, k, "racer", "rules:\n  - id: hold\n    when: {target: hold}\n    then:\n      decision: require_approval\n      approval_config: {timeout: 1m}\n")
	wins := map[string]int{}
	const rounds = 24
	for round := 0; round < rounds; round++ {
		id := k.CreateExecution("racer", fmt.Sprintf(`{"round":%d}`, round))
		_, l := gvDeliver(t, k, a, id)
		_, aid := gvBlock(t, k, a, id, l, "hold", `{}`, "hold")
		withCancel := round%2 == 0

		type answer struct {
			status int
			body   []byte
		}
		answers := map[string]answer{}
		var mu sync.Mutex
		var wg sync.WaitGroup
		startGun := make(chan struct{})
		fire := func(name, path, body string) {
			wg.Add(1)
			go func() {
				defer wg.Done()
				<-startGun
				resp, err := gvHTTP.Post(k.URL+path, "application/json", strings.NewReader(body))
				if err != nil {
					mu.Lock()
					answers[name] = answer{status: -1, body: []byte(err.Error())}
					mu.Unlock()
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				mu.Lock()
				answers[name] = answer{resp.StatusCode, b}
				mu.Unlock()
			}()
		}
		fire("grant", "/v0/approvals/"+aid+"/grant", `{"decided_by":"g"}`)
		fire("deny", "/v0/approvals/"+aid+"/deny", `{"decided_by":"d","rationale":"raced"}`)
		fire("clock", "/v0/test/clock", `{"advance":"61s"}`)
		if withCancel {
			fire("cancel", "/v0/executions/"+id+"/cancel", ``)
		}
		close(startGun)
		wg.Wait()

		if answers["clock"].status != 200 {
			t.Fatalf("round %d: clock %d %s", round, answers["clock"].status, answers["clock"].body)
		}
		if withCancel && answers["cancel"].status != 204 {
			t.Fatalf("round %d: cancel %d %s", round, answers["cancel"].status, answers["cancel"].body)
		}
		winners := 0
		for _, verb := range []string{"grant", "deny"} {
			ans := answers[verb]
			switch ans.status {
			case 204:
				winners++
			case 409:
				var env struct{ Code string }
				json.Unmarshal(ans.body, &env)
				if env.Code != "conflict" && env.Code != "execution_terminal" {
					t.Fatalf("round %d: %s refused with %s", round, verb, ans.body)
				}
			default:
				t.Fatalf("round %d: %s answered %d %s", round, verb, ans.status, ans.body)
			}
		}
		if winners > 1 {
			t.Fatalf("round %d: grant and deny both won", round)
		}
		// Without a human winner the expiry (or the cancel) decides; expiry
		// runs in the background, within 2 s.
		var ap map[string]json.RawMessage
		deadline := time.Now().Add(3 * time.Second)
		for {
			ap = gvApproval(t, k, aid)
			if string(ap["status"]) != `"pending"` {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("round %d: approval still pending (answers %v)", round, answers)
			}
			time.Sleep(5 * time.Millisecond)
		}
		status := strings.Trim(string(ap["status"]), `"`)
		switch {
		case answers["grant"].status == 204 && status != "granted",
			answers["deny"].status == 204 && status != "denied",
			winners == 0 && status != "expired":
			t.Fatalf("round %d: approval %s but answers grant=%d deny=%d", round, status, answers["grant"].status, answers["deny"].status)
		}
		winner := status
		if status == "expired" {
			winner = "expired:" + strings.Trim(string(ap["rationale"]), `"`)
			if r := string(ap["rationale"]); r != `"timeout"` && !(withCancel && r == `"execution_cancelled"`) {
				t.Fatalf("round %d: expired with rationale %s", round, r)
			}
		}
		wins[winner]++

		// Exactly one decision in the log; the log ends with the clean-up
		// when the execution was cancelled.
		evs := k.Events(id)
		decisions := 0
		for _, e := range evs {
			switch e.Type {
			case "approval.granted", "approval.denied", "approval.expired":
				decisions++
				if e.Payload["approval_id"] != aid || e.Payload["status"] != status {
					t.Fatalf("round %d: %s %v, approval is %s", round, e.Type, e.Payload, status)
				}
			}
		}
		if decisions != 1 {
			t.Fatalf("round %d: %d decisions in %v", round, decisions, gvTypes(evs))
		}
		if withCancel {
			for i, e := range evs {
				if e.Type != "execution.cancelled" {
					continue
				}
				for _, after := range evs[i+1:] {
					switch after.Type {
					case "approval.expired", "step.denied", "step.cancelled":
					default:
						t.Fatalf("round %d: %s after the terminal event: %v", round, after.Type, gvTypes(evs))
					}
				}
			}
			if e := k.Execution(id); e["status"] != "cancelled" {
				t.Fatalf("round %d: execution %v", round, e["status"])
			}
		}
	}
	t.Logf("winners over %d rounds: %v", rounds, wins)
}

// ---------------------------------------------------------------------------
// 4. Rate limits (§20)
// ---------------------------------------------------------------------------

func gvRateLimited(t *testing.T, what string, m map[string]json.RawMessage, reason string, retryAfter int64) {
	t.Helper()
	if gvStr(t, m, "decision") != "rate_limited" || gvStr(t, m, "reason") != reason {
		t.Fatalf("%s: %s, want rate_limited %s", what, gvJSON(m), reason)
	}
	if retryAfter == 0 {
		gvExactKeys(t, what, m, "decision", "reason")
		return
	}
	gvExactKeys(t, what, m, "decision", "reason", "retry_after_ms")
	if string(m["retry_after_ms"]) != strconv.FormatInt(retryAfter, 10) {
		t.Fatalf("%s: retry_after_ms %s, want %d", what, m["retry_after_ms"], retryAfter)
	}
}

// gvLimitedEvent checks the one step.rate_limited event of evs.
func gvLimitedEvent(t *testing.T, what string, evs []kt.Event, ruleID, reason string, retryAfter int64) string {
	t.Helper()
	gvExpectTypes(t, what, evs, "step.rate_limited")
	e := evs[0]
	if retryAfter > 0 {
		gvPayloadKeys(t, e, "step_id", "step_type", "target", "rule_id", "reason", "retry_after_ms")
		if e.Payload["retry_after_ms"] != float64(retryAfter) {
			t.Fatalf("%s: %v", what, e.Payload)
		}
	} else {
		gvPayloadKeys(t, e, "step_id", "step_type", "target", "rule_id", "reason")
	}
	if e.Payload["rule_id"] != ruleID || e.Payload["reason"] != reason {
		t.Fatalf("%s: %v", what, e.Payload)
	}
	sid, _ := e.Payload["step_id"].(string)
	if len(sid) != 64 {
		t.Fatalf("%s: step_id %v", what, e.Payload)
	}
	return sid
}

func TestGovRateLimitExecutionScope(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("limited", "")
	gvMustPolicy(t, k, "limited", "default_action: allow\nrules:\n  - id: search-quota\n    when: {target: search}\n    then:\n      decision: allow\n      rate_limit: {max_calls: 2, window: 1m}\n")
	idA := k.CreateExecution("limited", `{}`)
	_, lA := gvDeliver(t, k, a, idA)
	for i := 1; i <= 2; i++ {
		_, m := gvSubmit(t, a, idA, lA, fmt.Sprintf(`{"kind":"tool_call","target":"search","args":{"q":%d}}`, i))
		gvCheck(t, "within quota", m, gvWant{decision: "proceed"})
	}
	third := `{"kind":"tool_call","target":"search","args":{"q":3}}`
	seq := gvLastSeq(t, k, idA)
	r, m := gvSubmit(t, a, idA, lA, third)
	gvRateLimited(t, "over quota", m, "rate_limit_exceeded", 30000)
	if r.Header.Get("Rebuno-Step-Occurrence") != "" {
		t.Fatalf("rate_limited carries an occurrence header")
	}
	limitedID := gvLimitedEvent(t, "first refusal", gvSince(t, k, idA, seq), "search-quota", "rate_limit_exceeded", 30000)
	gvExpectError(t, "refused step recorded", k.Do("GET", "/v0/executions/"+idA+"/steps/"+limitedID, nil, nil), 404, "not_found", "")
	if n := gvStepCount(t, k, idA); n != 2 {
		t.Fatalf("%d steps recorded", n)
	}
	// An unrelated step is not limited.
	_, m = gvSubmit(t, a, idA, lA, `{"kind":"tool_call","target":"fetch","args":{}}`)
	gvCheck(t, "other rule", m, gvWant{decision: "proceed"})

	// Retries: same answer, refilled continuously, audited once per window.
	seq = gvLastSeq(t, k, idA)
	_, m = gvSubmit(t, a, idA, lA, third)
	gvRateLimited(t, "immediate retry", m, "rate_limit_exceeded", 30000)
	k.AdvanceClock(10 * time.Second)
	_, m = gvSubmit(t, a, idA, lA, third)
	gvRateLimited(t, "retry after 10s", m, "rate_limit_exceeded", 20000)
	if evs := gvSince(t, k, idA, seq); len(evs) != 0 {
		t.Fatalf("retries within the window were audited again: %v", gvTypes(evs))
	}

	// Another execution has its own bucket.
	idB := k.CreateExecution("limited", `{}`)
	_, lB := gvDeliver(t, k, a, idB)
	for i := 1; i <= 2; i++ {
		_, m = gvSubmit(t, a, idB, lB, fmt.Sprintf(`{"kind":"tool_call","target":"search","args":{"q":%d}}`, i))
		gvCheck(t, "second execution", m, gvWant{decision: "proceed"})
	}

	// After the refill the identical retry names the same step (the counter
	// never advanced).
	k.AdvanceClock(21 * time.Second)
	r, m = gvSubmit(t, a, idA, lA, third)
	gvCheck(t, "after refill", m, gvWant{decision: "proceed"})
	if gvStr(t, m, "step_id") != limitedID || r.Header.Get("Rebuno-Step-Occurrence") != "0" {
		t.Fatalf("retry after refill: step %s occurrence %q, refused step was %s", gvStr(t, m, "step_id"), r.Header.Get("Rebuno-Step-Occurrence"), limitedID)
	}
	evs := gvSince(t, k, idA, seq)
	gvExpectTypes(t, "admitted retry", evs, "step.proposed", "step.allowed", "step.executing")
	if evs[1].Payload["rule_id"] != "search-quota" {
		t.Fatalf("step.allowed %v", evs[1].Payload)
	}
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "limited"}, 3)
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "error_allowed"}, 0)
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "error_denied"}, 0)
}

func TestGovRateLimitRefillAndAudit(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("metered", `"lease_timeout_seconds":86400`)
	gvMustPolicy(t, k, "metered", `default_action: allow
rules:
  - id: fast
    when: {target: fast}
    then: {decision: allow, rate_limit: {max_calls: 3, window: 1s}}
  - id: slow
    priority: 1
    when: {target: slow}
    then: {decision: allow, rate_limit: {max_calls: 1, window: 1m}}
`)
	id := k.CreateExecution("metered", `{}`)
	_, l := gvDeliver(t, k, a, id)
	sub := func(target string, n int) map[string]json.RawMessage {
		_, m := gvSubmit(t, a, id, l, fmt.Sprintf(`{"kind":"tool_call","target":%q,"args":{"n":%d}}`, target, n))
		return m
	}

	// retry_after_ms is the whole milliseconds until one token, rounded up:
	// 3 per second → 333.3 ms → 334.
	for n := 1; n <= 3; n++ {
		gvCheck(t, "fast", sub("fast", n), gvWant{decision: "proceed"})
	}
	gvRateLimited(t, "fast empty", sub("fast", 4), "rate_limit_exceeded", 334)
	k.AdvanceClock(100 * time.Millisecond) // 0.3 tokens → 233.3 ms
	gvRateLimited(t, "fast 0.3", sub("fast", 4), "rate_limit_exceeded", 234)
	k.AdvanceClock(233 * time.Millisecond) // 0.999 tokens → 0.33 ms
	gvRateLimited(t, "fast 0.999", sub("fast", 4), "rate_limit_exceeded", 1)
	k.AdvanceClock(time.Millisecond)
	gvCheck(t, "fast refilled", sub("fast", 4), gvWant{decision: "proceed"})
	gvRateLimited(t, "fast empty again", sub("fast", 5), "rate_limit_exceeded", 333)
	// A bucket never holds more than its capacity.
	k.AdvanceClock(time.Hour)
	for n := 5; n <= 7; n++ {
		gvCheck(t, "fast after an hour", sub("fast", n), gvWant{decision: "proceed"})
	}
	gvRateLimited(t, "capacity", sub("fast", 8), "rate_limit_exceeded", 334)

	// The audit event is written at most once per step id per window.
	gvCheck(t, "slow first", sub("slow", 1), gvWant{decision: "proceed"})
	seq := gvLastSeq(t, k, id)
	gvRateLimited(t, "slow refused", sub("slow", 2), "rate_limit_exceeded", 60000)
	k.AdvanceClock(30 * time.Second)
	gvRateLimited(t, "slow refused at 30s", sub("slow", 2), "rate_limit_exceeded", 30000)
	k.AdvanceClock(31 * time.Second) // 1.0166 tokens, clamped to the capacity 1
	gvCheck(t, "another slow call takes the refilled token", sub("slow", 3), gvWant{decision: "proceed"})
	// 61 s after the first audit: audited again.
	gvRateLimited(t, "slow refused at 61s", sub("slow", 2), "rate_limit_exceeded", 60000)
	gvRateLimited(t, "slow refused at 61s again", sub("slow", 2), "rate_limit_exceeded", 60000)
	var audits []kt.Event
	for _, e := range gvSince(t, k, id, seq) {
		if e.Type == "step.rate_limited" {
			audits = append(audits, e)
		}
	}
	if len(audits) != 2 || audits[0].Payload["step_id"] != audits[1].Payload["step_id"] ||
		audits[0].Payload["retry_after_ms"] != 60000.0 || audits[1].Payload["retry_after_ms"] != 60000.0 {
		t.Fatalf("audits of the refused slow call: %v", audits)
	}
	// fast: 4 refusals before the hour, 1 after; slow: 4.
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "limited"}, 9)
}

func TestGovRateLimitScopes(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	bundle := func(ruleID, perWhat string, maxCalls int) string {
		return fmt.Sprintf("default_action: allow\nrules:\n  - id: %s\n    when: {target: call}\n    then:\n      decision: allow\n      rate_limit: {max_calls: %d, window: 1h, per_what: %s}\n", ruleID, maxCalls, perWhat)
	}
	agents := map[string]*kt.Agent{}
	for name, b := range map[string]string{
		"per-agent-1": bundle("quota", "agent", 1),
		"per-agent-2": bundle("quota", "agent", 1),
		"global-1":    bundle("shared", "global", 1),
		"global-2":    bundle("shared", "global", 1),
		"global-3":    bundle("shared", "global", 2), // same id, other parameters
		"global-4":    bundle("other", "global", 1),  // other id, same parameters
	} {
		agents[name] = k.NewAgent(name, "")
		gvMustPolicy(t, k, name, b)
	}
	call := func(agent string) map[string]json.RawMessage {
		t.Helper()
		a := agents[agent]
		id := k.CreateExecution(agent, `{}`)
		_, l := gvDeliver(t, k, a, id)
		_, m := gvSubmit(t, a, id, l, `{"kind":"tool_call","target":"call","args":{}}`)
		return m
	}
	// per_what agent: the executions of one agent share a bucket, another
	// agent with the same rule id has its own.
	gvCheck(t, "agent bucket, first execution", call("per-agent-1"), gvWant{decision: "proceed"})
	gvRateLimited(t, "agent bucket, second execution", call("per-agent-1"), "rate_limit_exceeded", 3600000)
	gvCheck(t, "another agent", call("per-agent-2"), gvWant{decision: "proceed"})
	// per_what global: shared by rules with this id and these parameters, in
	// any agent's bundle.
	gvCheck(t, "global first", call("global-1"), gvWant{decision: "proceed"})
	gvRateLimited(t, "global, other agent same rule", call("global-2"), "rate_limit_exceeded", 3600000)
	gvCheck(t, "global, other parameters", call("global-3"), gvWant{decision: "proceed"})
	gvCheck(t, "global, other rule id", call("global-4"), gvWant{decision: "proceed"})
	gvRateLimited(t, "global, first agent again", call("global-1"), "rate_limit_exceeded", 3600000)
	gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "limited"}, 3)
}

// TestGovRateLimitParameterChange: an execution rule with new parameters
// keeps its bucket, clamped to the new capacity; a global rule with new
// parameters uses a new bucket (§20).
func TestGovRateLimitParameterChange(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("tuned", "")
	rules := func(execMax, globalMax int) string {
		return fmt.Sprintf(`rules:
  - id: q
    when: {target: qcall}
    then: {decision: allow, rate_limit: {max_calls: %d, window: 1h}}
  - id: g
    priority: 1
    when: {target: gcall}
    then: {decision: allow, rate_limit: {max_calls: %d, window: 1h, per_what: global}}
`, execMax, globalMax)
	}
	gvMustPolicy(t, k, "tuned", rules(5, 1))
	id := k.CreateExecution("tuned", `{}`)
	_, l := gvDeliver(t, k, a, id)
	sub := func(target string, n int) map[string]json.RawMessage {
		_, m := gvSubmit(t, a, id, l, fmt.Sprintf(`{"kind":"tool_call","target":%q,"args":{"n":%d}}`, target, n))
		return m
	}
	gvCheck(t, "q with 5", sub("qcall", 1), gvWant{decision: "proceed"}) // 4 tokens left
	gvCheck(t, "g with 1", sub("gcall", 1), gvWant{decision: "proceed"})
	gvRateLimited(t, "g spent", sub("gcall", 2), "rate_limit_exceeded", 3600000)

	gvMustPolicy(t, k, "tuned", rules(2, 2))
	// 4 tokens clamped to the new capacity 2.
	gvCheck(t, "q clamped 1", sub("qcall", 2), gvWant{decision: "proceed"})
	gvCheck(t, "q clamped 2", sub("qcall", 3), gvWant{decision: "proceed"})
	gvRateLimited(t, "q spent", sub("qcall", 4), "rate_limit_exceeded", 1800000)
	// The global rule's new parameters name a new, full bucket.
	gvCheck(t, "g with 2, new bucket", sub("gcall", 2), gvWant{decision: "proceed"})
	gvCheck(t, "g with 2, second token", sub("gcall", 3), gvWant{decision: "proceed"})
	gvRateLimited(t, "g with 2 spent", sub("gcall", 4), "rate_limit_exceeded", 1800000)
}

func TestGovRateLimitOnApprovalRule(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("gated-quota", "")
	gvMustPolicy(t, k, "gated-quota", "rules:\n  - id: wire\n    when: {target: wire}\n    then:\n      decision: require_approval\n      rate_limit: {max_calls: 1, window: 1h, per_what: agent}\n")
	id1 := k.CreateExecution("gated-quota", `{}`)
	_, l1 := gvDeliver(t, k, a, id1)
	sid, aid := gvBlock(t, k, a, id1, l1, "wire", `{"amount":1}`, "wire")
	id2 := k.CreateExecution("gated-quota", `{}`)
	_, l2 := gvDeliver(t, k, a, id2)
	seq := gvLastSeq(t, k, id2)
	_, m := gvSubmit(t, a, id2, l2, `{"kind":"tool_call","target":"wire","args":{"amount":1}}`)
	gvRateLimited(t, "second approval request", m, "rate_limit_exceeded", 3600000)
	gvLimitedEvent(t, "second approval request", gvSince(t, k, id2, seq), "wire", "rate_limit_exceeded", 3600000)
	if e := k.Execution(id2); e["status"] != "running" {
		t.Fatalf("a refused approval request blocked the execution: %v", e["status"])
	}
	if got := gvListApprovals(t, k, ""); len(got) != 1 || got[0] != aid {
		t.Fatalf("approvals %v", got)
	}
	// The approved step resumes without consulting the limiter again.
	k.Must(204, gvDecide(k, aid, "grant", `{}`))
	_, l1 = gvDeliver(t, k, a, id1)
	_, m = gvSubmit(t, a, id1, l1, `{"kind":"tool_call","target":"wire","args":{"amount":1}}`)
	gvCheck(t, "approved after the quota is spent", m, gvWant{decision: "proceed"})
	if gvStr(t, m, "step_id") != sid {
		t.Fatalf("resumed step %s", gvJSON(m))
	}
}

func TestGovLimiterFault(t *testing.T) {
	bundle := `default_action: deny
rules:
  - id: open
    when: {target: "open_*"}
    then: {decision: allow, rate_limit: {max_calls: 100, window: 1m}}
  - id: open-explicit
    priority: 1
    when: {target: "explicit_*"}
    then: {decision: allow, rate_limit: {max_calls: 100, window: 1m, on_limiter_error: allow}}
  - id: closed
    priority: 2
    when: {target: "closed_*"}
    then: {decision: allow, rate_limit: {max_calls: 100, window: 1m, on_limiter_error: deny}}
  - id: closed-gate
    priority: 3
    when: {target: "gate_*"}
    then: {decision: require_approval, rate_limit: {max_calls: 100, window: 1m, on_limiter_error: deny}}
  - id: free
    priority: 4
    when: {target: free}
    then: {decision: allow}
`
	for _, fault := range []string{"error", "timeout"} {
		t.Run(fault, func(t *testing.T) {
			k := kt.Start(t, kt.Options{ManualClock: true, Env: []string{"REBUNO_TEST_LIMITER_FAULT=" + fault}})
			if !strings.Contains(k.Stderr(), "REBUNO_TEST_LIMITER_FAULT="+fault) {
				t.Fatalf("banner does not show the test setting:\n%s", k.Stderr())
			}
			a := k.NewAgent("faulty", "")
			gvMustPolicy(t, k, "faulty", bundle)
			id := k.CreateExecution("faulty", `{}`)
			_, l := gvDeliver(t, k, a, id)
			sub := func(target string) map[string]json.RawMessage {
				_, m := gvSubmit(t, a, id, l, fmt.Sprintf(`{"kind":"tool_call","target":%q,"args":{}}`, target))
				return m
			}
			// Fail-open (the default and explicit allow): admitted, and the
			// step is recorded as any other.
			for _, target := range []string{"open_a", "explicit_a"} {
				seq := gvLastSeq(t, k, id)
				gvCheck(t, target, sub(target), gvWant{decision: "proceed"})
				gvExpectTypes(t, target, gvSince(t, k, id, seq), "step.proposed", "step.allowed", "step.executing")
			}
			// Fail-closed: rate_limited, rate_limiter_unavailable, no
			// retry_after_ms; audited once per window; nothing recorded.
			seq := gvLastSeq(t, k, id)
			gvRateLimited(t, "closed", sub("closed_a"), "rate_limiter_unavailable", 0)
			gvLimitedEvent(t, "closed", gvSince(t, k, id, seq), "closed", "rate_limiter_unavailable", 0)
			seq = gvLastSeq(t, k, id)
			gvRateLimited(t, "closed again", sub("closed_a"), "rate_limiter_unavailable", 0)
			if evs := gvSince(t, k, id, seq); len(evs) != 0 {
				t.Fatalf("second refusal audited: %v", gvTypes(evs))
			}
			gvRateLimited(t, "approval rule", sub("gate_a"), "rate_limiter_unavailable", 0)
			if e := k.Execution(id); e["status"] != "running" {
				t.Fatalf("fail-closed approval rule blocked the execution: %v", e["status"])
			}
			gvCheck(t, "rule without a limit", sub("free"), gvWant{decision: "proceed"})
			if n := gvStepCount(t, k, id); n != 3 {
				t.Fatalf("%d steps recorded, want 3", n)
			}
			gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "error_allowed"}, 2)
			gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "error_denied"}, 3)
			gvWaitMetric(t, k, "rebuno_rate_limit_decisions_total", map[string]string{"outcome": "limited"}, 0)
		})
	}
}
