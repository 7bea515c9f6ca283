package blackbox

// Black-box tests of governance over HTTP: policy loading and validation
// (docs/protocol/governance.md §2, §4.3, docs/protocol/configuration.md §5), evaluation through submit (docs/protocol/steps.md §2–§4,
// docs/protocol/steps.md §9, docs/protocol/events.md §3), approvals (docs/protocol/executions.md §9, docs/protocol/dispatch.md §12, docs/protocol/governance.md §1) and rate limits (docs/protocol/governance.md §3, docs/protocol/configuration.md §4).
// Every test drives the real binary; time moves only through the manual test
// clock.

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"regexp"
	"strconv"
	"strings"
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

// gvStepPayload checks the members every step.* payload carries (docs/protocol/events.md §2).
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
