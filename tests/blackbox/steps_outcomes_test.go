package blackbox

// Black-box tests of local steps, step outcomes, and how executions end:
// complete, fail, cancel and deadline.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestLocalSteps checks the local kind end to end (docs/protocol/steps.md §9): its own identity,
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

// TestStepOutcomeRules covers docs/protocol/steps.md §10: an outcome is recorded once, a terminal
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

// TestExecutionCompleteAndState checks the agent's complete (docs/protocol/executions.md §5): output
// verbatim, state kept for a continuation (docs/protocol/executions.md §11), the clean-up of docs/protocol/executions.md §9 with
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

	// A continuation reads the state (docs/protocol/executions.md §11).
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

// TestExecutionFailReason checks the agent's fail (docs/protocol/executions.md §6): the reason is cut
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

// TestCancelCleanup checks the client cancel (docs/protocol/executions.md §7) and the terminal
// clean-up (docs/protocol/executions.md §9): executing steps cancelled in recording order after the
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
	// The terminal check comes before the dispatch header checks (docs/protocol/http.md §10).
	stranger := kt.Lease{DispatchID: "018ff0a0-0000-7000-8000-0000000000ff", Attempt: 9, Occurrence: -1}
	if _, r := e.submit(stranger, `{"kind":"tool_call","target":"s1"}`); !bytes.Contains(r.Body, []byte(`"execution_terminal"`)) {
		t.Fatalf("submit naming an unknown dispatch on a terminal execution: %s", r.Body)
	}
	cxExpectCode(t, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, stranger), 409, "execution_terminal")
	if d := e.record(s1, stranger, "fail", `{}`); d.Decision != "execution_terminal" {
		t.Fatalf("fail naming an unknown dispatch on a terminal execution: %+v", d)
	}
}

// TestDeadline checks docs/protocol/executions.md §8 with the manual clock: cancelled with
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
