package blackbox

// Black-box tests of step identity, occurrences, replay (docs/protocol/steps.md, docs/protocol/identity.md) and the
// agent's execution outcomes (docs/protocol/executions.md §5–§9), against the real binary.
//
// The helpers of this file (prefixed cx) are shared with dispatch_test.go,
// sse_test.go and crash_test.go.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/identity"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

const (
	cxAgentID = "agent-c"
	// cxIndeterminate is the exact error of an at_most_once orphan (docs/protocol/steps.md §7),
	// keys in canonical order.
	cxIndeterminate = `{"message":"outcome unknown: this may already have taken effect. Check the state before continuing.","reason":"indeterminate"}`
	// cxRefused is the stored error of an indeterminate retry refusal (docs/protocol/steps.md §8).
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

// cxStepID computes the step id the kernel must assign (docs/protocol/identity.md), with the
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
// docs/protocol/identity.md says, counts identical calls of one attempt 0, 1, 2, and that a new
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
	// The published vector of docs/protocol/identity.md §5 holds for this execution's steps.
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

// TestStepOccurrenceHeader covers Rebuno-Step-Occurrence (docs/protocol/identity.md §7): honoured,
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
	// an executing safe_to_retry step is an orphan re-run (docs/protocol/steps.md §5).
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
// attempt get consecutive occurrences, each exactly once (docs/protocol/identity.md §6), and racing
// outcomes of one step are recorded once (docs/protocol/steps.md §10).
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

// TestReplayTable walks every row of docs/protocol/steps.md §5 reachable without approvals, the
// indeterminate outcome (docs/protocol/steps.md §7) and the retry refusal (docs/protocol/steps.md §8).
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

	// docs/protocol/steps.md §8: a new at_most_once call with the identity of an indeterminate
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
