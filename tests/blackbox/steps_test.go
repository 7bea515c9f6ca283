package blackbox

// Black-box tests of step identity, occurrences, replay (§10–§13) and the
// agent's execution outcomes (§7.4–§7.8), against the real binary.
//
// The helpers of this file (prefixed cx) are shared with dispatch_test.go,
// sse_test.go and crash_test.go.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/identity"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

const (
	cxAgentID = "agent-c"
	// cxIndeterminate is the exact error of an at_most_once orphan (§12.3),
	// keys in canonical order.
	cxIndeterminate = `{"message":"outcome unknown: this may already have taken effect. Check the state before continuing.","reason":"indeterminate"}`
	// cxRefused is the stored error of an indeterminate retry refusal (§12.4).
	cxRefused = `{"reason":"prior attempt outcome unknown; retry refused","rule_id":"__indeterminate_retry"}`
	// cxQuiet is how long a negative check waits for something that must not
	// happen (a webhook, a reclaim). The kernel's workers wake at once on a
	// clock advance, so a due action shows up well within it.
	cxQuiet = 400 * time.Millisecond
)

// cxEnv is one kernel, one agent and one running execution whose first
// webhook has arrived.
type cxEnv struct {
	t     *testing.T
	k     *kt.Kernel
	a     *kt.Agent
	id    string
	wh    kt.Webhook
	lease kt.Lease
}

func cxStart(t *testing.T, opt kt.Options, agentExtra string) *cxEnv {
	t.Helper()
	k := kt.Start(t, opt)
	e := &cxEnv{t: t, k: k, a: k.NewAgent(cxAgentID, agentExtra)}
	e.id, e.wh = e.create()
	e.lease = kt.LeaseOf(e.wh)
	// The ack renews the lease when the kernel records it; waiting for it
	// keeps later clock advances measured from a known point.
	cxWaitEvent(t, k, e.id, "dispatch.acked", cxIsEvent("dispatch.acked", 1))
	return e
}

// create starts another execution of the env's agent and waits for its first
// webhook.
func (e *cxEnv) create() (string, kt.Webhook) {
	e.t.Helper()
	id := e.k.CreateExecution(e.a.ID, `{"task":"c"}`)
	wh := e.a.NextWebhook()
	if wh.ExecutionID != id || wh.DispatchAttempt != 1 {
		e.t.Fatalf("first webhook of %s: %s", id, wh.Body)
	}
	return id, wh
}

// nextWebhook waits for the next delivery and checks it is for id at attempt.
func (e *cxEnv) nextWebhook(id string, attempt int64) kt.Webhook {
	e.t.Helper()
	wh := e.a.NextWebhook()
	if wh.ExecutionID != id || wh.DispatchAttempt != attempt {
		e.t.Fatalf("want webhook of %s attempt %d, got %s", id, attempt, wh.Body)
	}
	return wh
}

func (e *cxEnv) submitIn(id string, l kt.Lease, body string) (kt.Decision, *kt.Response) {
	e.t.Helper()
	r := e.k.Must(200, e.a.Request("POST", "/v0/executions/"+id+"/steps", []byte(body), l))
	var d kt.Decision
	r.JSON(e.t, &d)
	return d, r
}

func (e *cxEnv) submit(l kt.Lease, body string) (kt.Decision, *kt.Response) {
	e.t.Helper()
	return e.submitIn(e.id, l, body)
}

// proceed submits a step that must be answered proceed and returns its id.
func (e *cxEnv) proceedIn(id string, l kt.Lease, body string) string {
	e.t.Helper()
	d, r := e.submitIn(id, l, body)
	if d.Decision != "proceed" || len(d.StepID) != 64 || d.Resources == nil {
		e.t.Fatalf("submit %s: want proceed, got %s", body, r.Body)
	}
	return d.StepID
}

func (e *cxEnv) proceed(l kt.Lease, body string) string {
	e.t.Helper()
	return e.proceedIn(e.id, l, body)
}

// outcomeIn sends a step complete or fail ("complete"/"fail") and returns the
// raw response.
func (e *cxEnv) outcomeIn(id, stepID string, l kt.Lease, route, body string) *kt.Response {
	e.t.Helper()
	return e.a.Request("POST", "/v0/executions/"+id+"/steps/"+stepID+"/"+route, []byte(body), l)
}

// record sends a step complete or fail that must be answered 200.
func (e *cxEnv) recordIn(id, stepID string, l kt.Lease, route, body string) kt.Decision {
	e.t.Helper()
	r := e.k.Must(200, e.outcomeIn(id, stepID, l, route, body))
	var d kt.Decision
	r.JSON(e.t, &d)
	return d
}

func (e *cxEnv) record(stepID string, l kt.Lease, route, body string) kt.Decision {
	e.t.Helper()
	return e.recordIn(e.id, stepID, l, route, body)
}

// agentCall sends a v1-signed agent request for execution id.
func (e *cxEnv) agentCall(id, route string, body string, l kt.Lease) *kt.Response {
	e.t.Helper()
	return e.a.Request("POST", "/v0/executions/"+id+"/"+route, []byte(body), l)
}

// cxRawEvent is an event whose payload values keep their exact bytes.
type cxRawEvent struct {
	Seq        int64                      `json:"event_seq"`
	Type       string                     `json:"type"`
	Payload    map[string]json.RawMessage `json:"payload"`
	OccurredAt string                     `json:"occurred_at"`
}

func (e *cxEnv) rawEvents(id string) []cxRawEvent {
	e.t.Helper()
	return cxEvents(e.t, e.k, id)
}

func cxEvents(t testing.TB, k *kt.Kernel, id string) []cxRawEvent {
	t.Helper()
	var all []cxRawEvent
	for {
		var page []cxRawEvent
		r := k.Must(200, k.Do("GET", fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", id, len(all)), nil, nil))
		r.JSON(t, &page)
		all = append(all, page...)
		if len(page) < 1000 {
			break
		}
	}
	for i, ev := range all {
		if ev.Seq != int64(i+1) {
			t.Fatalf("execution %s: event %d has seq %d (gap or disorder)", id, i, ev.Seq)
		}
	}
	return all
}

func cxTypes(evs []cxRawEvent) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

// str decodes a payload member that must be a JSON string.
func (ev cxRawEvent) str(key string) string {
	var s string
	if raw, ok := ev.Payload[key]; ok {
		json.Unmarshal(raw, &s)
	}
	return s
}

func (ev cxRawEvent) num(key string) int64 {
	var n int64 = -1
	if raw, ok := ev.Payload[key]; ok {
		json.Unmarshal(raw, &n)
	}
	return n
}

func (ev cxRawEvent) String() string {
	b, _ := json.Marshal(ev.Payload)
	return fmt.Sprintf("#%d %s %s", ev.Seq, ev.Type, b)
}

// waitEvent polls the log of id until an event matches.
func cxWaitEvent(t testing.TB, k *kt.Kernel, id string, what string, match func(cxRawEvent) bool) cxRawEvent {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, ev := range cxEvents(t, k, id) {
			if match(ev) {
				return ev
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("execution %s: no %s event; log: %v", id, what, cxEvents(t, k, id))
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func cxIsEvent(typ string, attempt int64) func(cxRawEvent) bool {
	return func(ev cxRawEvent) bool { return ev.Type == typ && (attempt < 0 || ev.num("attempt") == attempt) }
}

// step reads a step with its member values as raw bytes.
func cxStep(t testing.TB, k *kt.Kernel, id, stepID string) map[string]json.RawMessage {
	t.Helper()
	var m map[string]json.RawMessage
	k.Must(200, k.Do("GET", "/v0/executions/"+id+"/steps/"+stepID, nil, nil)).JSON(t, &m)
	return m
}

func cxRawString(raw json.RawMessage) string {
	var s string
	json.Unmarshal(raw, &s)
	return s
}

// cxStepID computes the step id the kernel must assign (§11), with the
// project's identity package.
func cxStepID(t testing.TB, executionID, kind, target, args string, occurrence int64) string {
	t.Helper()
	h, err := identity.ArgsHashBytes([]byte(args))
	if err != nil {
		t.Fatalf("args hash of %s: %v", args, err)
	}
	return identity.StepID(executionID, kind, target, h, occurrence)
}

func cxWithOccurrence(l kt.Lease, occ int64) kt.Lease {
	l.Occurrence = occ
	return l
}

// cxSameRaw compares a raw JSON member with the bytes it must have.
func cxSameRaw(t testing.TB, what string, got json.RawMessage, want string) {
	t.Helper()
	if !bytes.Equal(got, []byte(want)) {
		t.Fatalf("%s: got %s, want %s", what, got, want)
	}
}

func cxExpectCode(t testing.TB, r *kt.Response, status int, code string) {
	t.Helper()
	if r.Status != status || r.Code() != code {
		t.Fatalf("want %d %s, got %s", status, code, r)
	}
}

// ---------------------------------------------------------------------------

// TestStepIdentityAndOccurrences checks that the kernel names steps exactly as
// §11 says, counts identical calls of one attempt 0, 1, 2, and that a new
// claim recomputes the same ids from 0.
func TestStepIdentityAndOccurrences(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true}, "")
	l1 := e.lease
	// Whitespace and key order do not change the identity: the args are
	// hashed in canonical form.
	spellings := []string{`{"path":"/tmp"}`, `{ "path" : "/tmp" }`, "{\n\"path\":\t\"/tmp\"}"}
	var ids []string
	for i, args := range spellings {
		d, r := e.submit(l1, `{"kind":"tool_call","target":"read","args":`+args+`}`)
		want := cxStepID(t, e.id, "tool_call", "read", `{"path":"/tmp"}`, int64(i))
		if d.Decision != "proceed" || d.StepID != want {
			t.Fatalf("call %d: want proceed %s, got %s", i, want, r.Body)
		}
		if got := r.Header.Get("Rebuno-Step-Occurrence"); got != strconv.Itoa(i) {
			t.Fatalf("call %d: Rebuno-Step-Occurrence %q", i, got)
		}
		ids = append(ids, d.StepID)
	}
	// The published vector of §11.4 holds for this execution's steps.
	s0 := cxStep(t, e.k, e.id, ids[0])
	cxSameRaw(t, "args_hash", s0["args_hash"], `"ef28a75876b54cb665beeb4cb10d72f463c59d196f5ee4a08e62ac67e7247639"`)
	cxSameRaw(t, "occurrence", cxStep(t, e.k, e.id, ids[2])["occurrence"], `2`)
	cxSameRaw(t, "args verbatim", cxStep(t, e.k, e.id, ids[1])["args"], `{ "path" : "/tmp" }`)

	// Every field of the preimage matters; absent args are null.
	others := []struct{ body, kind, target, args string }{
		{`{"kind":"llm_call","target":"gpt-4o","args":{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}}`,
			"llm_call", "gpt-4o", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`},
		{`{"kind":"llm_call","args":{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}}`,
			"llm_call", "", `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}]}`},
		{`{"kind":"local","target":"fetch_page","args":{}}`, "local", "fetch_page", `{}`},
		{`{"kind":"local","target":"read","args":{"path":"/tmp"}}`, "local", "read", `{"path":"/tmp"}`},
		{`{"kind":"tool_call","target":"noargs"}`, "tool_call", "noargs", ``},
		{`{"kind":"tool_call","target":"noargs","args":null}`, "tool_call", "noargs", `null`},
	}
	occ := map[string]int64{}
	for _, c := range others {
		key := c.kind + "|" + c.target + "|" + c.args
		if c.args == "" {
			key = c.kind + "|" + c.target + "|null"
		}
		d, r := e.submit(l1, c.body)
		want := cxStepID(t, e.id, c.kind, c.target, c.args, occ[key])
		if d.Decision != "proceed" || d.StepID != want {
			t.Fatalf("%s: want proceed %s (occurrence %d), got %s", c.body, want, occ[key], r.Body)
		}
		if got := r.Header.Get("Rebuno-Step-Occurrence"); got != strconv.FormatInt(occ[key], 10) {
			t.Fatalf("%s: Rebuno-Step-Occurrence %q", c.body, got)
		}
		occ[key]++
	}

	// Occurrences 0 and 1 get outcomes; occurrence 2 stays executing.
	for i, res := range []string{`{"n": 0}`, `{"n": 1}`} {
		if d := e.record(ids[i], l1, "complete", `{"result":`+res+`}`); d.Decision != "recorded" {
			t.Fatalf("complete %d: %+v", i, d)
		}
	}

	// A new claim (lease expiry with the manual clock) starts the counters
	// again at 0: the same calls get the same ids and replay.
	e.k.AdvanceClock(121 * time.Second)
	wh2 := e.nextWebhook(e.id, 2)
	if wh2.DispatchID != e.wh.DispatchID {
		t.Fatalf("redelivery under another dispatch id: %s", wh2.Body)
	}
	cxWaitEvent(t, e.k, e.id, "dispatch.acked attempt 2", cxIsEvent("dispatch.acked", 2))
	l2 := kt.LeaseOf(wh2)
	before := len(e.rawEvents(e.id))
	for i, res := range []string{`{"n": 0}`, `{"n": 1}`} {
		d, r := e.submit(l2, `{"kind":"tool_call","target":"read","args":{"path":"/tmp"}}`)
		if d.Decision != "replay" || d.StepID != ids[i] || string(d.Result) != res {
			t.Fatalf("redelivered call %d: want replay of %s with %s, got %s", i, ids[i], res, r.Body)
		}
		if got := r.Header.Get("Rebuno-Step-Occurrence"); got != strconv.Itoa(i) {
			t.Fatalf("replay %d: Rebuno-Step-Occurrence %q", i, got)
		}
	}
	if n := len(e.rawEvents(e.id)); n != before {
		t.Fatalf("replays wrote %d events", n-before)
	}
	// The orphan (occurrence 2, safe_to_retry) runs again; occurrence 3 is new.
	if d, r := e.submit(l2, `{"kind":"tool_call","target":"read","args":{"path":"/tmp"}}`); d.Decision != "proceed" || d.StepID != ids[2] {
		t.Fatalf("orphan re-run: %s", r.Body)
	}
	d, r := e.submit(l2, `{"kind":"tool_call","target":"read","args":{"path":"/tmp"}}`)
	if d.Decision != "proceed" || d.StepID != cxStepID(t, e.id, "tool_call", "read", `{"path":"/tmp"}`, 3) ||
		r.Header.Get("Rebuno-Step-Occurrence") != "3" {
		t.Fatalf("occurrence 3: %s %v", r.Body, r.Header)
	}
	got := cxTypes(e.rawEvents(e.id)[before:])
	want := []string{"step.executing", "step.proposed", "step.allowed", "step.executing"}
	if strings.Join(got, ",") != strings.Join(want, ",") {
		t.Fatalf("events after redelivery: got %v, want %v", got, want)
	}
}

// TestStepOccurrenceHeader covers Rebuno-Step-Occurrence (§11.6): honoured,
// echoed, refused when ahead, and a same-attempt retry of an executing step
// answered proceed with no write.
func TestStepOccurrenceHeader(t *testing.T) {
	// Requests without an attempt header need the legacy-compatible mode.
	e := cxStart(t, kt.Options{Args: []string{legacyOn}}, "")
	body := `{"kind":"tool_call","target":"send","args":{"to":"x"}}`
	id0 := cxStepID(t, e.id, "tool_call", "send", `{"to":"x"}`, 0)
	id1 := cxStepID(t, e.id, "tool_call", "send", `{"to":"x"}`, 1)
	id2 := cxStepID(t, e.id, "tool_call", "send", `{"to":"x"}`, 2)

	d, r := e.submit(cxWithOccurrence(e.lease, 0), body)
	if d.Decision != "proceed" || d.StepID != id0 || r.Header.Get("Rebuno-Step-Occurrence") != "0" {
		t.Fatalf("occurrence 0: %s", r.Body)
	}
	n := len(e.rawEvents(e.id))

	// The response was "lost": the same attempt re-sends the same occurrence.
	for i := 0; i < 2; i++ {
		d, r = e.submit(cxWithOccurrence(e.lease, 0), body)
		if d.Decision != "proceed" || d.StepID != id0 || r.Header.Get("Rebuno-Step-Occurrence") != "0" {
			t.Fatalf("same-attempt retry: %s", r.Body)
		}
	}
	// Whatever the idempotency: an at_most_once step is not made indeterminate.
	amo := `{"kind":"tool_call","target":"pay","args":{"cents":5},"idempotency":"at_most_once"}`
	amoID := e.proceed(cxWithOccurrence(e.lease, 0), amo)
	n += 3
	if d, r := e.submit(cxWithOccurrence(e.lease, 0), amo); d.Decision != "proceed" || d.StepID != amoID {
		t.Fatalf("same-attempt retry of at_most_once: %s", r.Body)
	}
	if got := len(e.rawEvents(e.id)); got != n {
		t.Fatalf("same-attempt retries wrote %d events", got-n)
	}
	if s := cxStep(t, e.k, e.id, amoID); cxRawString(s["status"]) != "executing" {
		t.Fatalf("at_most_once step after retry: %s", s["status"])
	}

	// Ahead of the kernel: at most one past the highest recorded occurrence.
	r = e.a.Request("POST", "/v0/executions/"+e.id+"/steps", []byte(body), cxWithOccurrence(e.lease, 2))
	cxExpectCode(t, r, 400, "validation_error")
	r = e.a.Request("POST", "/v0/executions/"+e.id+"/steps", []byte(`{"kind":"tool_call","target":"fresh"}`), cxWithOccurrence(e.lease, 1))
	cxExpectCode(t, r, 400, "validation_error")
	if got := len(e.rawEvents(e.id)); got != n {
		t.Fatalf("refused submits wrote %d events", got-n)
	}

	// One past the highest is a new step, and the counter follows it.
	if d, r := e.submit(cxWithOccurrence(e.lease, 1), body); d.Decision != "proceed" || d.StepID != id1 ||
		r.Header.Get("Rebuno-Step-Occurrence") != "1" {
		t.Fatalf("occurrence 1: %s", r.Body)
	}
	if d, r := e.submit(e.lease, body); d.Decision != "proceed" || d.StepID != id2 ||
		r.Header.Get("Rebuno-Step-Occurrence") != "2" {
		t.Fatalf("counted submit after occurrence 1: %s", r.Body)
	}
	n += 6

	// An occurrence below the counter names the recorded step: replay.
	e.record(id0, e.lease, "complete", `{"result":"sent"}`)
	n++
	if d, r := e.submit(cxWithOccurrence(e.lease, 0), body); d.Decision != "replay" || d.StepID != id0 ||
		string(d.Result) != `"sent"` || r.Header.Get("Rebuno-Step-Occurrence") != "0" {
		t.Fatalf("replay through the header: %s", r.Body)
	}

	// Without Rebuno-Dispatch-Attempt the same-attempt rule does not apply:
	// an executing safe_to_retry step is an orphan re-run (§12.1).
	noAttempt := cxWithOccurrence(e.lease, 1)
	noAttempt.Attempt = 0
	if d, r := e.submit(noAttempt, body); d.Decision != "proceed" || d.StepID != id1 {
		t.Fatalf("re-run without attempt header: %s", r.Body)
	}
	evs := e.rawEvents(e.id)
	if len(evs) != n+1 || evs[n].Type != "step.executing" || string(evs[n].Payload["retry"]) != "true" ||
		evs[n].str("step_id") != id1 {
		t.Fatalf("want one step.executing{retry:true} of %s, got %v", id1, evs[n:])
	}
}

// TestConcurrentIdenticalSubmits: identical calls sent at once in one
// attempt get consecutive occurrences, each exactly once (§11.5), and racing
// outcomes of one step are recorded once (§13).
func TestConcurrentIdenticalSubmits(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	t.Cleanup(cxAgentClient.CloseIdleConnections)
	const n = 12
	ref := cxRef(e.k, e.a)
	body := `{"kind":"tool_call","target":"same","args":{"x":1}}`
	type answer struct {
		d   kt.Decision
		err error
	}
	answers := make(chan answer, n)
	for i := 0; i < n; i++ {
		go func() {
			d, err := cxCallDecision(ref, "POST", "/v0/executions/"+e.id+"/steps", body, e.lease)
			answers <- answer{d, err}
		}()
	}
	want := map[string]bool{}
	for i := int64(0); i < n; i++ {
		want[cxStepID(t, e.id, "tool_call", "same", `{"x":1}`, i)] = true
	}
	for i := 0; i < n; i++ {
		a := <-answers
		if a.err != nil || a.d.Decision != "proceed" || !want[a.d.StepID] {
			t.Fatalf("concurrent submit: %+v %v", a.d, a.err)
		}
		delete(want, a.d.StepID)
	}
	if len(want) != 0 {
		t.Fatalf("occurrences not handed out: %v", want)
	}

	// Racing completes and fails of one step: one is recorded, the others
	// replay the winner's outcome.
	s := cxStepID(t, e.id, "tool_call", "same", `{"x":1}`, 0)
	for i := 0; i < n; i++ {
		route, payload := "complete", fmt.Sprintf(`{"result":%d}`, i)
		if i%3 == 0 {
			route, payload = "fail", fmt.Sprintf(`{"error":%d}`, i)
		}
		go func() {
			d, err := cxCallDecision(ref, "POST", "/v0/executions/"+e.id+"/steps/"+s+"/"+route, payload, e.lease)
			answers <- answer{d, err}
		}()
	}
	recorded := 0
	var replays []kt.Decision
	for i := 0; i < n; i++ {
		a := <-answers
		switch {
		case a.err != nil:
			t.Fatalf("racing outcome: %v", a.err)
		case a.d.Decision == "recorded":
			recorded++
		case a.d.Decision == "replay":
			replays = append(replays, a.d)
		default:
			t.Fatalf("racing outcome: %+v", a.d)
		}
	}
	st := cxStep(t, e.k, e.id, s)
	stored := st["result"]
	if cxRawString(st["status"]) == "failed" {
		stored = st["error"]
	}
	if recorded != 1 || len(replays) != n-1 {
		t.Fatalf("%d recorded, %d replays", recorded, len(replays))
	}
	for _, r := range replays {
		got := r.Result
		if got == nil {
			got = r.Error
		}
		if string(got) != string(stored) {
			t.Fatalf("a replay says %s, the step holds %s", got, stored)
		}
	}
	outcomes := 0
	for _, ev := range e.rawEvents(e.id) {
		if ev.str("step_id") == s && (ev.Type == "step.succeeded" || ev.Type == "step.failed") {
			outcomes++
		}
	}
	if outcomes != 1 {
		t.Fatalf("%d outcome events for one step", outcomes)
	}
}

// TestReplayTable walks every row of §12.1 reachable without approvals, the
// indeterminate outcome (§12.3) and the retry refusal (§12.4).
func TestReplayTable(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true}, "")
	l1 := e.lease
	const (
		bodyA = `{"kind":"tool_call","target":"a","args":{"n":1}}`
		bodyB = `{"kind":"tool_call","target":"b","args":{"n":1}}`
		bodyC = `{"kind":"tool_call","target":"c","args":{"n":1}}`
		bodyD = `{"kind":"tool_call","target":"d","args":{"n":1},"idempotency":"at_most_once"}`
		bodyE = `{"kind":"tool_call","target":"e","args":{"n":1}}`
		bodyF = `{"kind":"local","target":"f","args":{}}`
		resA  = `{"z": 1, "a": [1.0, 2E3, -0], "s": "\u00e9"}`
		errB  = `{"msg": "boom",  "code": 7}`
	)
	a := e.proceed(l1, bodyA)
	if d := e.record(a, l1, "complete", `{"result": `+resA+` }`); d.Decision != "recorded" {
		t.Fatalf("complete a: %+v", d)
	}
	b := e.proceed(l1, bodyB)
	if d := e.record(b, l1, "fail", `{"error":`+errB+`}`); d.Decision != "recorded" {
		t.Fatalf("fail b: %+v", d)
	}
	c := e.proceed(l1, bodyC)
	dID := e.proceed(l1, bodyD)
	eID := e.proceed(l1, bodyE)
	f := e.proceed(l1, bodyF)
	if f != cxStepID(t, e.id, "local", "f", `{}`, 0) {
		t.Fatalf("local step id %s", f)
	}
	e.record(f, l1, "complete", `{"result":"done"}`)
	startedC := cxStep(t, e.k, e.id, c)["started_at"]

	// The agent dies; the lease lapses and attempt 2 replays the handler.
	e.k.AdvanceClock(121 * time.Second)
	l2 := kt.LeaseOf(e.nextWebhook(e.id, 2))
	cxWaitEvent(t, e.k, e.id, "dispatch.acked attempt 2", cxIsEvent("dispatch.acked", 2))
	n := len(e.rawEvents(e.id))
	expectNoWrites := func(what string) {
		t.Helper()
		if got := len(e.rawEvents(e.id)); got != n {
			t.Fatalf("%s wrote %d events", what, got-n)
		}
	}

	// succeeded → replay + the result, byte for byte.
	d, r := e.submit(l2, bodyA)
	if d.Decision != "replay" || d.StepID != a || d.Error != nil {
		t.Fatalf("succeeded: %s", r.Body)
	}
	cxSameRaw(t, "replayed result", d.Result, resA)
	// failed → replay + the error, byte for byte.
	d, r = e.submit(l2, bodyB)
	if d.Decision != "replay" || d.StepID != b || d.Result != nil {
		t.Fatalf("failed: %s", r.Body)
	}
	cxSameRaw(t, "replayed error", d.Error, errB)
	// The local kind replays like any other.
	if d, r = e.submit(l2, bodyF); d.Decision != "replay" || d.StepID != f || string(d.Result) != `"done"` {
		t.Fatalf("local: %s", r.Body)
	}
	expectNoWrites("replays")

	// executing + safe_to_retry → proceed, step.executing{retry:true}.
	if d, r = e.submit(l2, bodyC); d.Decision != "proceed" || d.StepID != c || d.Resources == nil || len(d.Resources) != 0 {
		t.Fatalf("safe_to_retry orphan: %s", r.Body)
	}
	evs := e.rawEvents(e.id)[n:]
	if len(evs) != 1 || evs[0].Type != "step.executing" || evs[0].str("step_id") != c ||
		string(evs[0].Payload["retry"]) != "true" || evs[0].str("step_type") != "tool_call" || evs[0].str("target") != "c" {
		t.Fatalf("orphan re-run events: %v", evs)
	}
	n++
	sc := cxStep(t, e.k, e.id, c)
	if cxRawString(sc["status"]) != "executing" || !bytes.Equal(sc["started_at"], startedC) {
		t.Fatalf("re-run step: status %s started_at %s (was %s)", sc["status"], sc["started_at"], startedC)
	}

	// executing + at_most_once (stored; the request says nothing) → the
	// indeterminate error, recorded as step.failed and replayed.
	d, r = e.submit(l2, `{"kind":"tool_call","target":"d","args":{"n":1}}`)
	if d.Decision != "replay" || d.StepID != dID {
		t.Fatalf("at_most_once orphan: %s", r.Body)
	}
	cxSameRaw(t, "indeterminate error", d.Error, cxIndeterminate)
	evs = e.rawEvents(e.id)[n:]
	if len(evs) != 1 || evs[0].Type != "step.failed" || evs[0].str("step_id") != dID {
		t.Fatalf("at_most_once orphan events: %v", evs)
	}
	cxSameRaw(t, "step.failed error", evs[0].Payload["error"], cxIndeterminate)
	n++
	sd := cxStep(t, e.k, e.id, dID)
	if cxRawString(sd["status"]) != "failed" || sd["completed_at"] == nil {
		t.Fatalf("indeterminate step: %v", sd)
	}
	cxSameRaw(t, "stored indeterminate error", sd["error"], cxIndeterminate)
	// Once failed, it replays the same error and writes nothing.
	if d, _ = e.submit(cxWithOccurrence(l2, 0), bodyD); d.Decision != "replay" || string(d.Error) != cxIndeterminate {
		t.Fatalf("replay of indeterminate: %+v", d)
	}
	expectNoWrites("replay of indeterminate")

	// executing, stored safe_to_retry but the request says at_most_once →
	// effective at_most_once.
	d, r = e.submit(l2, `{"kind":"tool_call","target":"e","args":{"n":1},"idempotency":"at_most_once"}`)
	if d.Decision != "replay" || d.StepID != eID {
		t.Fatalf("at_most_once by request: %s", r.Body)
	}
	cxSameRaw(t, "indeterminate error (request)", d.Error, cxIndeterminate)
	n++

	// §12.4: a new at_most_once call with the identity of an indeterminate
	// step is refused without running.
	refusedID := cxStepID(t, e.id, "tool_call", "d", `{"n":1}`, 1)
	d, r = e.submit(l2, bodyD)
	if d.Decision != "denied" || d.StepID != refusedID || d.Reason != "prior attempt outcome unknown; retry refused" ||
		d.RuleID != "__indeterminate_retry" {
		t.Fatalf("indeterminate retry: %s", r.Body)
	}
	evs = e.rawEvents(e.id)[n:]
	if strings.Join(cxTypes(evs), ",") != "step.proposed,step.denied" || evs[1].str("rule_id") != "__indeterminate_retry" {
		t.Fatalf("refusal events: %v", evs)
	}
	cxSameRaw(t, "step.denied error", evs[1].Payload["error"], cxRefused)
	n += 2
	sr := cxStep(t, e.k, e.id, refusedID)
	if cxRawString(sr["status"]) != "denied" {
		t.Fatalf("refused step: %v", sr)
	}
	cxSameRaw(t, "refused step error", sr["error"], cxRefused)
	// denied → denied with the stored reason and rule, nothing written.
	d, r = e.submit(cxWithOccurrence(l2, 1), bodyD)
	if d.Decision != "denied" || d.StepID != refusedID || d.Reason != "prior attempt outcome unknown; retry refused" ||
		d.RuleID != "__indeterminate_retry" || d.Result != nil || d.Error != nil {
		t.Fatalf("replay of a denied step: %s", r.Body)
	}
	expectNoWrites("replay of a denied step")

	// The refusal needs all of at_most_once, kind, target and args: a
	// safe_to_retry call of the same identity and an at_most_once call with
	// other args both proceed.
	if d, r = e.submit(l2, `{"kind":"tool_call","target":"e","args":{"n":1}}`); d.Decision != "proceed" ||
		d.StepID != cxStepID(t, e.id, "tool_call", "e", `{"n":1}`, 1) {
		t.Fatalf("safe_to_retry after indeterminate: %s", r.Body)
	}
	if d, r = e.submit(l2, `{"kind":"tool_call","target":"d","args":{"n":2},"idempotency":"at_most_once"}`); d.Decision != "proceed" {
		t.Fatalf("at_most_once with other args: %s", r.Body)
	}
	if d, r = e.submit(l2, `{"kind":"local","target":"d","args":{"n":1},"idempotency":"at_most_once"}`); d.Decision != "proceed" {
		t.Fatalf("at_most_once of another kind: %s", r.Body)
	}
}

// TestLocalSteps checks the local kind end to end (§12.5): its own identity,
// policy answer without a bundle, replay, failure.
func TestLocalSteps(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true}, "")
	s := e.proceed(e.lease, `{"kind":"local","target":"now"}`)
	if s != cxStepID(t, e.id, "local", "now", "", 0) || s == cxStepID(t, e.id, "tool_call", "now", "", 0) {
		t.Fatalf("local step id %s", s)
	}
	evs := e.rawEvents(e.id)
	var allowed cxRawEvent
	for _, ev := range evs {
		if ev.Type == "step.allowed" {
			allowed = ev
		}
	}
	if allowed.str("step_type") != "local" || allowed.str("target") != "now" || allowed.str("rule_id") != "permissive" {
		t.Fatalf("step.allowed of a local step without a bundle: %v", allowed)
	}
	failing := e.proceed(e.lease, `{"kind":"local","target":"parse","args":[1,2]}`)
	e.record(s, e.lease, "complete", `{"result":"2026-12-02"}`)
	e.record(failing, e.lease, "fail", `{"error":{"message":"bad","type":"ValueError"}}`)
	e.k.AdvanceClock(121 * time.Second)
	l2 := kt.LeaseOf(e.nextWebhook(e.id, 2))
	if d, r := e.submit(l2, `{"kind":"local","target":"now","args":null}`); d.Decision != "replay" || string(d.Result) != `"2026-12-02"` {
		t.Fatalf("local replay: %s", r.Body)
	}
	if d, r := e.submit(l2, `{"kind":"local","target":"parse","args":[1,2]}`); d.Decision != "replay" ||
		string(d.Error) != `{"message":"bad","type":"ValueError"}` {
		t.Fatalf("local failed replay: %s", r.Body)
	}
}

// TestStepOutcomeRules covers §13: an outcome is recorded once, a terminal
// step answers with its stored outcome whichever route is called, and a
// terminal execution answers execution_terminal.
func TestStepOutcomeRules(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	l := e.lease
	ok := e.proceed(l, `{"kind":"tool_call","target":"ok"}`)
	bad := e.proceed(l, `{"kind":"tool_call","target":"bad"}`)
	nullRes := e.proceed(l, `{"kind":"tool_call","target":"nothing"}`)
	nullErr := e.proceed(l, `{"kind":"tool_call","target":"vague"}`)
	open := e.proceed(l, `{"kind":"tool_call","target":"open"}`)
	n := len(e.rawEvents(e.id))

	if d := e.record(ok, l, "complete", `{"result":{"v": 1.50}}`); d.Decision != "recorded" || d.StepID != "" || d.Result != nil {
		t.Fatalf("complete: %+v", d)
	}
	if d := e.record(bad, l, "fail", `{"error":{"type":"E", "message":"x"}}`); d.Decision != "recorded" {
		t.Fatalf("fail: %+v", d)
	}
	e.record(nullRes, l, "complete", `{}`)
	e.record(nullErr, l, "fail", `{"error":null}`)
	evs := e.rawEvents(e.id)[n:]
	if strings.Join(cxTypes(evs), ",") != "step.succeeded,step.failed,step.succeeded,step.failed" {
		t.Fatalf("outcome events: %v", evs)
	}
	// step.succeeded does not copy the result; step.failed carries the error
	// verbatim.
	if len(evs[0].Payload) != 3 || evs[0].str("step_id") != ok || evs[0].str("step_type") != "tool_call" || evs[0].str("target") != "ok" {
		t.Fatalf("step.succeeded payload: %v", evs[0])
	}
	cxSameRaw(t, "step.failed error", evs[1].Payload["error"], `{"type":"E", "message":"x"}`)
	cxSameRaw(t, "null error", evs[3].Payload["error"], `null`)
	n += 4

	sOK := cxStep(t, e.k, e.id, ok)
	cxSameRaw(t, "stored result", sOK["result"], `{"v": 1.50}`)
	if cxRawString(sOK["status"]) != "succeeded" || sOK["completed_at"] == nil || sOK["error"] != nil {
		t.Fatalf("succeeded step: %v", sOK)
	}
	cxSameRaw(t, "absent result", cxStep(t, e.k, e.id, nullRes)["result"], `null`)
	cxSameRaw(t, "null error", cxStep(t, e.k, e.id, nullErr)["error"], `null`)

	// Terminal steps replay their stored outcome, whichever route is called;
	// the terminal fields never change.
	for _, route := range []string{"complete", "fail"} {
		body := `{"error":"again"}`
		if route == "complete" {
			body = `{"result":"again"}`
		}
		d := e.record(ok, l, route, body)
		if d.Decision != "replay" || string(d.Result) != `{"v": 1.50}` || d.Error != nil {
			t.Fatalf("%s of a succeeded step: %+v", route, d)
		}
		d = e.record(bad, l, route, body)
		if d.Decision != "replay" || string(d.Error) != `{"type":"E", "message":"x"}` || d.Result != nil {
			t.Fatalf("%s of a failed step: %+v", route, d)
		}
		if d = e.record(nullErr, l, route, body); d.Decision != "replay" || string(d.Error) != `null` {
			t.Fatalf("%s of a step failed with null: %+v", route, d)
		}
	}
	if got := len(e.rawEvents(e.id)); got != n {
		t.Fatalf("replayed outcomes wrote %d events", got-n)
	}
	cxSameRaw(t, "write-once result", cxStep(t, e.k, e.id, ok)["result"], `{"v": 1.50}`)

	// A step of another execution, or an unknown step, is 404.
	r := e.outcomeIn(e.id, strings.Repeat("ab", 32), l, "complete", `{"result":1}`)
	cxExpectCode(t, r, 404, "not_found")
	otherID, otherWH := e.create()
	r = e.outcomeIn(otherID, ok, kt.LeaseOf(otherWH), "complete", `{"result":1}`)
	cxExpectCode(t, r, 404, "not_found")

	// On a terminal execution every outcome answers execution_terminal and
	// writes nothing.
	e.k.Must(204, e.agentCall(e.id, "complete", `{"output":null}`, l))
	n = len(e.rawEvents(e.id))
	for _, s := range []string{ok, open} {
		for _, route := range []string{"complete", "fail"} {
			r := e.k.Must(200, e.outcomeIn(e.id, s, l, route, `{}`))
			if string(bytes.TrimSpace(r.Body)) != `{"decision":"execution_terminal"}` {
				t.Fatalf("%s on a terminal execution: %s", route, r.Body)
			}
		}
	}
	if got := len(e.rawEvents(e.id)); got != n {
		t.Fatalf("outcomes on a terminal execution wrote %d events", got-n)
	}
	if st := cxRawString(cxStep(t, e.k, e.id, open)["status"]); st != "cancelled" {
		t.Fatalf("open step after complete: %s", st)
	}
}

// TestExecutionCompleteAndState checks the agent's complete (§7.4): output
// verbatim, state kept for a continuation (§7.10), the clean-up of §7.8 with
// cause execution_completed, and the sticky terminal status.
func TestExecutionCompleteAndState(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true}, "")
	done := e.proceed(e.lease, `{"kind":"tool_call","target":"done"}`)
	e.record(done, e.lease, "complete", `{"result":1}`)
	open1 := e.proceed(e.lease, `{"kind":"tool_call","target":"open1"}`)
	open2 := e.proceed(e.lease, `{"kind":"local","target":"open2"}`)
	n := len(e.rawEvents(e.id))

	e.k.Must(204, e.agentCall(e.id, "complete", `{"output": {"b": 2, "a": 1.0} , "state": {"cursor": 7}}`, e.lease))
	var ex map[string]json.RawMessage
	e.k.Must(200, e.k.Do("GET", "/v0/executions/"+e.id, nil, nil)).JSON(t, &ex)
	cxSameRaw(t, "output", ex["output"], `{"b": 2, "a": 1.0}`)
	if cxRawString(ex["status"]) != "completed" || ex["state"] != nil || ex["failure_reason"] != nil {
		t.Fatalf("completed execution: %v", ex)
	}

	evs := e.rawEvents(e.id)[n:]
	if strings.Join(cxTypes(evs), ",") != "execution.completed,step.cancelled,step.cancelled" {
		t.Fatalf("terminal transaction: %v", evs)
	}
	cxSameRaw(t, "execution.completed output", evs[0].Payload["output"], `{"b": 2, "a": 1.0}`)
	if evs[0].str("status") != "completed" || evs[0].str("execution_id") != e.id {
		t.Fatalf("execution.completed: %v", evs[0])
	}
	for i, s := range []string{open1, open2} {
		ev := evs[i+1]
		if ev.str("step_id") != s || ev.OccurredAt != evs[0].OccurredAt {
			t.Fatalf("step.cancelled %d: %v", i, ev)
		}
		cxSameRaw(t, "step.cancelled error", ev.Payload["error"], `{"reason":"execution_completed"}`)
		st := cxStep(t, e.k, e.id, s)
		if cxRawString(st["status"]) != "cancelled" || st["completed_at"] == nil {
			t.Fatalf("cleaned-up step: %v", st)
		}
		cxSameRaw(t, "cancelled step error", st["error"], `{"reason":"execution_completed"}`)
	}
	if st := cxStep(t, e.k, e.id, done); cxRawString(st["status"]) != "succeeded" {
		t.Fatalf("succeeded step touched by clean-up: %v", st)
	}

	// A continuation reads the state (§7.10).
	r := e.k.Must(201, e.k.Do("POST", "/v0/executions", []byte(`{"agent_id":"agent-c","parent_execution_id":"`+e.id+`"}`), nil))
	child := r.Map(t)["id"].(string)
	e.nextWebhook(child, 1)
	var prev map[string]json.RawMessage
	e.k.Must(200, e.k.Do("GET", "/v0/executions/"+child+"/previous", nil, nil)).JSON(t, &prev)
	cxSameRaw(t, "previous state", prev["state"], `{"cursor": 7}`)
	e.k.Must(204, e.k.Do("POST", "/v0/executions/"+child+"/cancel", nil, nil))

	// Terminal is sticky; nothing is written any more.
	n = len(e.rawEvents(e.id))
	cxExpectCode(t, e.agentCall(e.id, "complete", `{"output":2}`, e.lease), 409, "execution_terminal")
	cxExpectCode(t, e.agentCall(e.id, "fail", `{"error":"late"}`, e.lease), 409, "execution_terminal")
	cxExpectCode(t, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, e.lease), 409, "execution_terminal")
	cxExpectCode(t, e.k.Do("POST", "/v0/executions/"+e.id+"/cancel", nil, nil), 409, "execution_terminal")
	for _, body := range []string{`{"kind":"tool_call","target":"new"}`, `{"kind":"tool_call","target":"open1"}`} {
		if _, r := e.submit(e.lease, body); string(bytes.TrimSpace(r.Body)) != `{"decision":"execution_terminal"}` ||
			r.Header.Get("Rebuno-Step-Occurrence") != "" {
			t.Fatalf("submit on a terminal execution: %s", r.Body)
		}
	}
	// The dispatch was retired: no lease expiry, no redelivery.
	e.k.AdvanceClock(10 * time.Minute)
	e.a.NoWebhook(cxQuiet)
	if got := len(e.rawEvents(e.id)); got != n {
		t.Fatalf("%d events after the terminal transaction: %v", got-n, e.rawEvents(e.id)[n:])
	}
}

// TestExecutionFailReason checks the agent's fail (§7.5): the reason is cut
// at 8,192 bytes on a UTF-8 boundary, an empty reason is omitted, and the
// clean-up cause is execution_failed.
func TestExecutionFailReason(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	cases := []struct{ reason, want, raw string }{
		{strings.Repeat("a", 8190) + "€tail", strings.Repeat("a", 8190), ""},
		{strings.Repeat("b", 8191) + "é", strings.Repeat("b", 8191), ""},
		{strings.Repeat("c", 8189) + "😀", strings.Repeat("c", 8189), ""},
		{strings.Repeat("d", 8192), strings.Repeat("d", 8192), ""},
		{strings.Repeat("e", 8188) + "😀x", strings.Repeat("e", 8188) + "😀", ""},
		{"agent_error: ValueError: bad input", "agent_error: ValueError: bad input", ""},
		{"", "", `{"error":""}`},
		{"", "", `{"error":null}`},
		{"", "", `{}`},
	}
	for i, c := range cases {
		id, l := e.id, e.lease
		if i > 0 {
			var wh kt.Webhook
			id, wh = e.create()
			l = kt.LeaseOf(wh)
		}
		open := e.proceedIn(id, l, `{"kind":"tool_call","target":"open"}`)
		body, _ := json.Marshal(map[string]string{"error": c.reason})
		if c.raw != "" {
			body = []byte(c.raw)
		}
		e.k.Must(204, e.agentCall(id, "fail", string(body), l))
		var ex map[string]json.RawMessage
		e.k.Must(200, e.k.Do("GET", "/v0/executions/"+id, nil, nil)).JSON(t, &ex)
		if cxRawString(ex["status"]) != "failed" || cxRawString(ex["failure_reason"]) != c.want {
			t.Fatalf("case %d: status %s, failure_reason of %d bytes, want %d", i, ex["status"], len(cxRawString(ex["failure_reason"])), len(c.want))
		}
		if c.want == "" && ex["failure_reason"] != nil {
			t.Fatalf("case %d: empty failure_reason present", i)
		}
		evs := e.rawEvents(id)
		last := evs[len(evs)-2:]
		if last[0].Type != "execution.failed" || last[0].str("reason") != c.want || last[1].Type != "step.cancelled" {
			t.Fatalf("case %d: terminal events %v", i, last)
		}
		if _, has := last[0].Payload["reason"]; c.want == "" && has {
			t.Fatalf("case %d: execution.failed carries an empty reason", i)
		}
		cxSameRaw(t, "fail clean-up", last[1].Payload["error"], `{"reason":"execution_failed"}`)
		if last[1].str("step_id") != open {
			t.Fatalf("case %d: cancelled %s", i, last[1].str("step_id"))
		}
	}
}

// TestCancelCleanup checks the client cancel (§7.6) and the terminal
// clean-up (§7.8): executing steps cancelled in recording order after the
// terminal event, in the same transaction, and no event ever after it.
func TestCancelCleanup(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true}, "")
	l := e.lease
	done := e.proceed(l, `{"kind":"tool_call","target":"done"}`)
	e.record(done, l, "complete", `{"result":1}`)
	s1 := e.proceed(l, `{"kind":"tool_call","target":"s1"}`)
	s2 := e.proceed(l, `{"kind":"tool_call","target":"s2","idempotency":"at_most_once"}`)
	failed := e.proceed(l, `{"kind":"tool_call","target":"f"}`)
	e.record(failed, l, "fail", `{"error":"x"}`)
	s3 := e.proceed(l, `{"kind":"local","target":"s3"}`)
	n := len(e.rawEvents(e.id))

	r := e.k.Must(204, e.k.Do("POST", "/v0/executions/"+e.id+"/cancel", []byte(`ignored, not JSON`), nil))
	if len(r.Body) != 0 {
		t.Fatalf("204 with a body: %q", r.Body)
	}
	ex := e.k.Execution(e.id)
	if ex["status"] != "cancelled" || ex["failure_reason"] != "client_cancelled" {
		t.Fatalf("cancelled execution: %v", ex)
	}
	evs := e.rawEvents(e.id)[n:]
	want := "execution.cancelled,step.cancelled,step.cancelled,step.cancelled"
	if strings.Join(cxTypes(evs), ",") != want || evs[0].str("reason") != "client_cancelled" || evs[0].str("status") != "cancelled" {
		t.Fatalf("cancel transaction: %v", evs)
	}
	for i, s := range []string{s1, s2, s3} {
		if evs[i+1].str("step_id") != s || evs[i+1].OccurredAt != evs[0].OccurredAt {
			t.Fatalf("step.cancelled %d: %v", i, evs[i+1])
		}
		cxSameRaw(t, "step.cancelled error", evs[i+1].Payload["error"], `{"reason":"execution_cancelled"}`)
		st := cxStep(t, e.k, e.id, s)
		if cxRawString(st["status"]) != "cancelled" || st["completed_at"] == nil {
			t.Fatalf("step %d after cancel: %v", i, st)
		}
		cxSameRaw(t, "cancelled step error", st["error"], `{"reason":"execution_cancelled"}`)
	}
	if st := cxRawString(cxStep(t, e.k, e.id, failed)["status"]); st != "failed" {
		t.Fatalf("failed step after cancel: %s", st)
	}
	// No step is left open.
	var pending []json.RawMessage
	e.k.Must(200, e.k.Do("GET", "/v0/executions/"+e.id+"/steps?status=pending", nil, nil)).JSON(t, &pending)
	if len(pending) != 0 {
		t.Fatalf("pending steps after cancel: %d", len(pending))
	}

	n = len(e.rawEvents(e.id))
	cxExpectCode(t, e.k.Do("POST", "/v0/executions/"+e.id+"/cancel", nil, nil), 409, "execution_terminal")
	if _, r := e.submit(l, `{"kind":"tool_call","target":"s1"}`); !bytes.Contains(r.Body, []byte(`"execution_terminal"`)) {
		t.Fatalf("submit after cancel: %s", r.Body)
	}
	if d := e.record(s1, l, "complete", `{"result":1}`); d.Decision != "execution_terminal" {
		t.Fatalf("complete after cancel: %+v", d)
	}
	cxExpectCode(t, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, l), 409, "execution_terminal")
	cxExpectCode(t, e.agentCall(e.id, "complete", `{}`, l), 409, "execution_terminal")
	cxExpectCode(t, e.agentCall(e.id, "fail", `{}`, l), 409, "execution_terminal")
	// The lease would have expired long ago: the retired dispatch is never
	// reclaimed or delivered.
	e.k.AdvanceClock(time.Hour)
	e.a.NoWebhook(cxQuiet)
	if got := e.rawEvents(e.id); len(got) != n {
		t.Fatalf("events after the terminal transaction: %v", got[n:])
	}
	cxExpectCode(t, e.k.Do("POST", "/v0/executions/018ff0a0-0000-7000-8000-000000000001/cancel", nil, nil), 404, "not_found")
	// The terminal check comes before the dispatch header checks (§6).
	stranger := kt.Lease{DispatchID: "018ff0a0-0000-7000-8000-0000000000ff", Attempt: 9, Occurrence: -1}
	if _, r := e.submit(stranger, `{"kind":"tool_call","target":"s1"}`); !bytes.Contains(r.Body, []byte(`"execution_terminal"`)) {
		t.Fatalf("submit naming an unknown dispatch on a terminal execution: %s", r.Body)
	}
	cxExpectCode(t, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, stranger), 409, "execution_terminal")
	if d := e.record(s1, stranger, "fail", `{}`); d.Decision != "execution_terminal" {
		t.Fatalf("fail naming an unknown dispatch on a terminal execution: %+v", d)
	}
}

// TestDeadline checks §7.7 with the manual clock: cancelled with
// deadline_exceeded within 2 s of the deadline passing, not before it.
func TestDeadline(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true, Args: []string{"--deadline-timeout", "1h"}}, `"lease_timeout_seconds":7200`)
	ex := e.k.Execution(e.id)
	created, err1 := time.Parse(time.RFC3339Nano, ex["created_at"].(string))
	deadline, err2 := time.Parse(time.RFC3339Nano, fmt.Sprint(ex["deadline_at"]))
	if err1 != nil || err2 != nil || !deadline.Equal(created.Add(time.Hour)) {
		t.Fatalf("deadline_at %v, created_at %v", ex["deadline_at"], ex["created_at"])
	}
	evs := e.rawEvents(e.id)
	if evs[0].str("deadline_at") != ex["deadline_at"] || evs[1].str("deadline_at") != ex["deadline_at"] {
		t.Fatalf("created/started events without deadline_at: %v %v (execution %v)", evs[0], evs[1], ex["deadline_at"])
	}
	open := e.proceed(e.lease, `{"kind":"tool_call","target":"slow"}`)
	// One that ends in time is left alone.
	early, earlyWH := e.create()
	e.k.Must(204, e.agentCall(early, "complete", `{"output":1}`, kt.LeaseOf(earlyWH)))
	earlyEvents := len(e.rawEvents(early))
	e.k.AdvanceClock(59 * time.Minute)
	time.Sleep(cxQuiet)
	if st := e.k.Execution(e.id)["status"]; st != "running" {
		t.Fatalf("cancelled before its deadline: %v", st)
	}
	n := len(e.rawEvents(e.id))
	e.k.AdvanceClock(61 * time.Second)
	start := time.Now()
	ex = e.k.WaitStatus(e.id, "cancelled")
	if took := time.Since(start); took > 2*time.Second {
		t.Fatalf("deadline enforced %v after it passed", took)
	}
	if ex["failure_reason"] != "deadline_exceeded" {
		t.Fatalf("deadline cancel: %v", ex)
	}
	evs = e.rawEvents(e.id)[n:]
	if strings.Join(cxTypes(evs), ",") != "execution.cancelled,step.cancelled" || evs[0].str("reason") != "deadline_exceeded" ||
		evs[1].str("step_id") != open {
		t.Fatalf("deadline events: %v", evs)
	}
	cxSameRaw(t, "deadline clean-up", evs[1].Payload["error"], `{"reason":"deadline_exceeded"}`)
	if ex := e.k.Execution(early); ex["status"] != "completed" || len(e.rawEvents(early)) != earlyEvents {
		t.Fatalf("an execution completed before its deadline was touched: %v", ex)
	}
	// An execution without a deadline setting has no deadline_at.
	k2 := kt.Start(t, kt.Options{})
	k2.NewAgent("plain", "")
	plain := k2.CreateExecution("plain", `null`)
	if _, has := k2.Execution(plain)["deadline_at"]; has {
		t.Fatalf("deadline_at without --deadline-timeout")
	}
}

// TestReplayedSubmitCannotChangeItsOccurrence: the occurrence header is bound
// to its request by its own signature. A captured submit replayed with
// another occurrence (the attack that used to start a step no agent runs),
// or with the binding stripped, is 401 and records nothing; the untouched
// replay is harmless (it names the same step).
func TestReplayedSubmitCannotChangeItsOccurrence(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	body := []byte(`{"kind":"tool_call","target":"transfer","args":{"cents":100}}`)
	path := "/v0/executions/" + e.id + "/steps"
	captured := e.a.SignedRequest("POST", path, body, cxWithOccurrence(e.lease, 0), nil)
	replay := func(mutate func(h http.Header)) *kt.Response {
		req, _ := http.NewRequest("POST", e.k.URL+path, bytes.NewReader(body))
		req.Header = captured.Header.Clone()
		mutate(req.Header)
		return hsSend(t, e.k, req)
	}
	first := replay(func(http.Header) {})
	e.k.Must(200, first)
	before := hsSnapshot(t, e.k, e.id)
	for name, mutate := range map[string]func(h http.Header){
		"another occurrence":          func(h http.Header) { h.Set("Rebuno-Step-Occurrence", "1") },
		"another occurrence, unbound": func(h http.Header) { h.Set("Rebuno-Step-Occurrence", "1"); h.Del("Rebuno-Occurrence-Signature") },
		"binding stripped":            func(h http.Header) { h.Del("Rebuno-Occurrence-Signature") },
	} {
		hsWantUnauthorized(t, name, replay(mutate))
	}
	hsUnchanged(t, e.k, e.id, before, "replayed submits with another occurrence")
	// The unchanged replay names the step it named before.
	again := replay(func(http.Header) {})
	var d1, d2 kt.Decision
	json.Unmarshal(first.Body, &d1)
	json.Unmarshal(e.k.Must(200, again).Body, &d2)
	if d2.StepID != d1.StepID {
		t.Fatalf("the unchanged replay named step %s, the original %s", d2.StepID, d1.StepID)
	}
}
