package blackbox

// Black-box tests of durability across kill -9 (docs/protocol/operations.md §2.1), retention (docs/protocol/executions.md §10)
// and storage limits (docs/protocol/operations.md §2.4).

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// cxAgentClient has a transport of its own; tests that use it close its idle
// connections before their kernel stops (see cxStreamClient).
var cxAgentClient = &http.Client{Timeout: 15 * time.Second, Transport: &http.Transport{}}

// cxAgentRef is what an agent goroutine needs to sign requests, copied on
// the test goroutine: the harness rewrites the kernel's fields on a restart,
// so goroutines must not read them.
type cxAgentRef struct{ base, id, secret string }

func cxRef(k *kt.Kernel, a *kt.Agent) cxAgentRef { return cxAgentRef{k.URL, a.ID, a.Secret} }

// cxCall sends a v1-signed agent request (docs/protocol/auth.md §3). Unlike the harness's
// helpers it may be called from any goroutine: failures are returned, never
// fatal.
func cxCall(a cxAgentRef, method, path, body string, l kt.Lease) (int, []byte, error) {
	req, err := http.NewRequest(method, a.base+path, strings.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	attempt := ""
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Rebuno-Agent-Id", a.id)
	req.Header.Set("Rebuno-Timestamp", ts)
	if l.DispatchID != "" {
		req.Header.Set("Rebuno-Dispatch-Id", l.DispatchID)
		if l.Occurrence >= 0 {
			req.Header.Set("Rebuno-Step-Occurrence", strconv.FormatInt(l.Occurrence, 10))
		}
	}
	if l.Attempt > 0 {
		attempt = strconv.FormatInt(l.Attempt, 10)
		req.Header.Set("Rebuno-Dispatch-Attempt", attempt)
	}
	sig := auth.SignV1([]byte(a.secret), method, req.URL.RequestURI(), ts, l.DispatchID, attempt, []byte(body))
	req.Header.Set("Rebuno-Signature", sig)
	if occ := req.Header.Get("Rebuno-Step-Occurrence"); occ != "" {
		req.Header.Set("Rebuno-Occurrence-Signature", auth.SignOccurrence([]byte(a.secret), sig, occ))
	}
	resp, err := cxAgentClient.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	out, err := io.ReadAll(resp.Body)
	return resp.StatusCode, out, err
}

// cxHTTPError is a non-200 answer.
type cxHTTPError struct {
	Status int
	Body   []byte
}

func (e *cxHTTPError) Error() string { return fmt.Sprintf("%d %s", e.Status, e.Body) }

func (e *cxHTTPError) superseded() bool {
	return e.Status == 409 && strings.Contains(string(e.Body), `"lease_superseded"`)
}

func cxCallDecision(a cxAgentRef, method, path, body string, l kt.Lease) (kt.Decision, error) {
	var d kt.Decision
	status, out, err := cxCall(a, method, path, body, l)
	if err != nil {
		return d, err
	}
	if status != 200 {
		return d, &cxHTTPError{Status: status, Body: out}
	}
	return d, json.Unmarshal(out, &d)
}

// cxWorkload is a crowd of agent handlers that remember, in the test's
// memory, every answer the kernel gave them.
type cxWorkload struct {
	t     *testing.T
	a     *kt.Agent
	ref   cxAgentRef
	steps int
	// carried: each outcome travels with the next submit, the last with the
	// execution complete (docs/protocol/steps.md §13); a 200 to the carrier acknowledges it.
	carried bool

	mu     sync.Mutex
	newest map[string]int64  // execution → newest attempt seen
	runs   map[string]int    // step → times its body ran (proceed)
	known  map[string]string // step → its recorded result
	// unanswered: step → the result carried by an execution complete that
	// the kill cut before its answer. If that complete was committed, the
	// execution ended with it and no later attempt replays the step to say so.
	unanswered      map[string]string
	acked           map[string]bool // step → a complete was answered recorded
	ackedBeforeKill map[string]bool
	killed          bool
	acks            int
	milestone       int
	reached         chan struct{}
	violations      []string
	finished        map[string]bool
	wg              sync.WaitGroup
}

func (w *cxWorkload) violate(format string, args ...any) {
	w.mu.Lock()
	w.violations = append(w.violations, fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

// route starts a handler for every webhook newer than the last one of its
// execution, as an SDK does (docs/protocol/sdk.md §1).
func (w *cxWorkload) route(stop <-chan struct{}) {
	for {
		select {
		case wh := <-w.a.Webhooks:
			w.mu.Lock()
			fresh := wh.DispatchAttempt > w.newest[wh.ExecutionID]
			if fresh {
				w.newest[wh.ExecutionID] = wh.DispatchAttempt
			}
			w.mu.Unlock()
			if fresh {
				w.wg.Add(1)
				go func() {
					defer w.wg.Done()
					w.handle(wh)
				}()
			}
		case <-stop:
			return
		}
	}
}

// abandon classifies an error that stops a handler: the kernel is gone or
// the attempt was superseded. Anything else is a violation.
func (w *cxWorkload) abandon(what string, err error) {
	var he *cxHTTPError
	if errors.As(err, &he) && !he.superseded() {
		w.violate("%s: %v", what, err)
	}
}

func (w *cxWorkload) handle(wh kt.Webhook) {
	l := kt.LeaseOf(wh)
	base := "/v0/executions/" + wh.ExecutionID
	var pending *cxOutcome // the outcome the next request carries
	for i := 0; i < w.steps; i++ {
		body := fmt.Sprintf(`{"kind":"tool_call","target":"work","args":{"i":%d}%s}`, i, pending.member())
		d, err := cxCallDecision(w.ref, "POST", base+"/steps", body, l)
		if err != nil {
			w.abandon("submit", err)
			return
		}
		if pending != nil && d.Decision != "execution_terminal" {
			w.ack(pending.step, pending.result)
		}
		pending = nil
		switch d.Decision {
		case "proceed":
			w.mu.Lock()
			if w.acked[d.StepID] {
				w.violations = append(w.violations, fmt.Sprintf("step %s proceeded after its outcome was acknowledged", d.StepID))
			}
			w.runs[d.StepID]++
			w.mu.Unlock()
			result := fmt.Sprintf(`{"i":%d,"attempt":%d}`, i, wh.DispatchAttempt)
			if w.carried {
				pending = &cxOutcome{step: d.StepID, result: result}
				continue
			}
			c, err := cxCallDecision(w.ref, "POST", base+"/steps/"+d.StepID+"/complete", `{"result":`+result+`}`, l)
			if err != nil {
				w.abandon("complete", err)
				return
			}
			switch c.Decision {
			case "recorded":
				w.ack(d.StepID, result)
			case "replay":
				w.learn(d.StepID, string(c.Result))
			case "execution_terminal":
				return
			default:
				w.violate("complete of %s answered %+v", d.StepID, c)
			}
		case "replay":
			w.learn(d.StepID, string(d.Result))
		case "execution_terminal":
			return
		default:
			w.violate("submit %s answered %+v", body, d)
			return
		}
	}
	status, out, err := cxCall(w.ref, "POST", base+"/complete", `{"output":{"done":true}`+pending.member()+`}`, l)
	switch {
	case err != nil:
		if pending != nil {
			w.mu.Lock()
			w.unanswered[pending.step] = pending.result
			w.mu.Unlock()
		}
	case status == 204 || status == 409 && strings.Contains(string(out), `"execution_terminal"`):
		if status == 204 && pending != nil {
			w.ack(pending.step, pending.result)
		}
		w.mu.Lock()
		w.finished[wh.ExecutionID] = true
		w.mu.Unlock()
	default:
		w.abandon("execution complete", &cxHTTPError{Status: status, Body: out})
	}
}

// cxOutcome is a step outcome waiting for its carrier.
type cxOutcome struct{ step, result string }

// member is the carrier's outcome member, "" when nothing waits.
func (o *cxOutcome) member() string {
	if o == nil {
		return ""
	}
	return `,"outcome":{"step_id":"` + o.step + `","result":` + o.result + `}`
}

func (w *cxWorkload) ack(step, result string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if prev, ok := w.known[step]; ok && prev != result {
		w.violations = append(w.violations, fmt.Sprintf("step %s recorded %s, earlier answers said %s", step, result, prev))
	}
	w.known[step] = result
	w.acked[step] = true
	if !w.killed {
		w.ackedBeforeKill[step] = true
	}
	w.acks++
	if w.acks == w.milestone {
		close(w.reached)
	}
}

func (w *cxWorkload) learn(step, result string) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if prev, ok := w.known[step]; ok && prev != result {
		w.violations = append(w.violations, fmt.Sprintf("step %s replayed %s, its recorded result was %s", step, result, prev))
	}
	w.known[step] = result
}

// TestCrashConcurrentWorkload kills the kernel with SIGKILL in the middle of
// a concurrent workload and checks, after a restart on the same database,
// that every acknowledged outcome survived and replays, that no acknowledged
// step runs again, and that every execution completes with a gap-free log.
func TestCrashConcurrentWorkload(t *testing.T) { crashWorkload(t, false) }

// TestCrashConcurrentWorkloadCarried is the same with every outcome carried
// by the next request: the kill falls between batches of an outcome and the
// next step's start, and an acknowledged carrier lost neither.
func TestCrashConcurrentWorkloadCarried(t *testing.T) { crashWorkload(t, true) }

func crashWorkload(t *testing.T, carried bool) {
	const executions, steps = 16, 10
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--dispatch-max-attempts", "50"}})
	t.Cleanup(cxAgentClient.CloseIdleConnections)
	w := &cxWorkload{t: t, a: k.NewAgent("crash-agent", `"lease_timeout_seconds":40`), steps: steps, carried: carried,
		newest: map[string]int64{}, runs: map[string]int{}, known: map[string]string{}, unanswered: map[string]string{}, acked: map[string]bool{},
		ackedBeforeKill: map[string]bool{}, finished: map[string]bool{},
		milestone: executions * steps / 3, reached: make(chan struct{})}
	w.ref = cxRef(k, w.a)
	stop := make(chan struct{})
	go w.route(stop)
	defer close(stop)

	ids := make([]string, executions)
	for i := range ids {
		ids[i] = k.CreateExecution(w.a.ID, fmt.Sprintf(`{"n":%d}`, i))
	}
	select {
	case <-w.reached:
	case <-time.After(30 * time.Second):
		w.mu.Lock()
		defer w.mu.Unlock()
		t.Fatalf("workload made no progress: %d acknowledged outcomes; %v", w.acks, w.violations)
	}
	w.mu.Lock()
	w.killed = true
	w.mu.Unlock()
	k.Kill()
	w.mu.Lock()
	before := make(map[string]string, len(w.ackedBeforeKill))
	for s := range w.ackedBeforeKill {
		before[s] = w.known[s]
	}
	w.mu.Unlock()

	k.Restart()
	// What was acknowledged is there, exactly, before any agent runs again.
	for _, id := range ids {
		cxEvents(t, k, id) // fails on a gap
	}
	owner := map[string]string{}
	for _, id := range ids {
		var list []map[string]json.RawMessage
		k.Must(200, k.Do("GET", "/v0/executions/"+id+"/steps", nil, nil)).JSON(t, &list)
		for _, s := range list {
			owner[cxRawString(s["step_id"])] = id
		}
	}
	for s, result := range before {
		id, ok := owner[s]
		if !ok {
			t.Fatalf("acknowledged step %s is missing after the restart", s)
		}
		st := cxStep(t, k, id, s)
		if cxRawString(st["status"]) != "succeeded" || string(st["result"]) != result {
			t.Fatalf("acknowledged step %s after the restart: status %s result %s, want %s", s, st["status"], st["result"], result)
		}
	}

	// The leases of the killed process's attempts lapse; every execution is
	// redelivered and finished.
	k.AdvanceClock(41 * time.Second)
	for _, id := range ids {
		k.WaitStatus(id, "completed")
	}
	done := make(chan struct{})
	go func() { w.wg.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(30 * time.Second):
		t.Fatalf("handlers still running")
	}

	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.violations) > 0 {
		t.Fatalf("%d violations:\n%s", len(w.violations), strings.Join(w.violations, "\n"))
	}
	for s := range before {
		if w.runs[s] != 1 {
			t.Fatalf("step %s, acknowledged before the kill, ran %d times", s, w.runs[s])
		}
	}
	reruns := 0
	for _, id := range ids {
		var list []map[string]json.RawMessage
		k.Must(200, k.Do("GET", "/v0/executions/"+id+"/steps", nil, nil)).JSON(t, &list)
		if len(list) != steps {
			t.Fatalf("execution %s has %d steps, want %d", id, len(list), steps)
		}
		for _, s := range list {
			sid := cxRawString(s["step_id"])
			want, ok := w.known[sid]
			if !ok {
				want = w.unanswered[sid]
			}
			if cxRawString(s["status"]) != "succeeded" || string(s["result"]) != want {
				t.Fatalf("step %s: status %s result %s, answers said %q", sid, s["status"], s["result"], want)
			}
			if w.runs[sid] < 1 || w.runs[sid] > 2 {
				t.Fatalf("step %s ran %d times", sid, w.runs[sid])
			}
			reruns += w.runs[sid] - 1
		}
		evs := cxEvents(t, k, id)
		if evs[len(evs)-1].Type != "execution.completed" {
			t.Fatalf("execution %s ends with %v", id, evs[len(evs)-1])
		}
	}
	t.Logf("%d outcomes acknowledged before the kill, %d step bodies re-run after it (outcome lost with the process)", len(before), reruns)
}

// TestCrashAfterCreate: an execution whose create was answered 201 survives
// a kill -9 that follows at once, and is delivered after the restart.
func TestCrashAfterCreate(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("crash-agent", `"lease_timeout_seconds":40`)
	for round := 0; round < 3; round++ {
		id := k.CreateExecution(a.ID, fmt.Sprintf(`{"round":%d}`, round))
		k.Kill()
		delivered := false
		for drained := false; !drained; {
			select {
			case wh := <-a.Webhooks:
				if wh.ExecutionID != id {
					t.Fatalf("round %d: webhook of %s", round, wh.ExecutionID)
				}
				delivered = true
			default:
				drained = true
			}
		}
		k.Restart()
		ex := k.Execution(id)
		if ex["status"] != "running" || ex["agent_id"] != a.ID || ex["input"].(map[string]any)["round"] != float64(round) {
			t.Fatalf("round %d: execution after the restart: %v", round, ex)
		}
		evs := cxEvents(t, k, id)
		if got := strings.Join(cxTypes(evs[:3]), ","); got != "execution.created,execution.started,dispatch.queued" {
			t.Fatalf("round %d: log after the restart: %v", round, evs)
		}
		// A pending dispatch goes out at once: the dispatcher scans for due
		// work when it starts. One claimed by the killed process is
		// reclaimed when its lease lapses. Each process's manual clock starts at the real time,
		// so the advance must also cover what earlier rounds advanced.
		var wh kt.Webhook
		waitPending := 500 * time.Millisecond
		if delivered {
			waitPending = 0
		}
		select {
		case wh = <-a.Webhooks:
		case <-time.After(waitPending):
			k.AdvanceClock(time.Duration(round+1)*41*time.Second + time.Second)
			wh = a.NextWebhook()
		}
		if wh.ExecutionID != id || wh.DispatchID != evs[2].str("dispatch_id") || wh.DispatchAttempt > 2 ||
			(delivered && wh.DispatchAttempt != 2) {
			t.Fatalf("round %d: redelivery %s (delivered before the kill: %v)", round, wh.Body, delivered)
		}
		e := &cxEnv{t: t, k: k, a: a, id: id}
		l := kt.LeaseOf(wh)
		s := e.proceed(l, `{"kind":"tool_call","target":"after-crash"}`)
		e.record(s, l, "complete", `{"result":true}`)
		e.k.Must(204, e.agentCall(id, "complete", `{"output":1}`, l))
		cxEvents(t, k, id)
		a.NoWebhook(50 * time.Millisecond)
	}
}

// TestCrashDuringTail: a tail cut by a kill -9 resumes after the restart
// with Last-Event-ID and loses nothing.
func TestCrashDuringTail(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true}, `"lease_timeout_seconds":40`)
	s := e.proceed(e.lease, `{"kind":"tool_call","target":"before"}`)
	e.record(s, e.lease, "complete", `{"result":1}`)
	path := "/v0/executions/" + e.id + "/events/stream"
	st := cxOpenSSE(t, cxBearerGet(t, e.k, path, nil))
	n := int64(len(e.rawEvents(e.id)))
	for i := int64(1); i <= n; i++ {
		st.event(i)
	}
	e.k.Kill()
	for {
		f, ok := st.next()
		if !ok {
			break
		}
		if !f.Comment {
			t.Fatalf("frame after the kill: %q", f.Lines)
		}
	}
	e.k.Restart()
	e.k.AdvanceClock(41 * time.Second)
	l2 := kt.LeaseOf(e.nextWebhook(e.id, 2))
	st = cxOpenSSE(t, cxBearerGet(t, e.k, path, map[string]string{"Last-Event-ID": fmt.Sprint(n)}))
	st.checkHeaders()
	if d, _ := e.submit(l2, `{"kind":"tool_call","target":"before"}`); d.Decision != "replay" {
		t.Fatalf("after the restart: %+v", d)
	}
	e.k.Must(204, e.agentCall(e.id, "complete", `{}`, l2))
	all := e.rawEvents(e.id)
	for i := n + 1; i <= int64(len(all)); i++ {
		if ev := st.event(i); ev.Type != all[i-1].Type {
			t.Fatalf("frame %d: %s, log has %s", i, ev.Type, all[i-1].Type)
		}
	}
	st.end(e.id, "completed")
}

// TestRetention: terminal executions older than --retention are deleted by
// the sweep; running ones never are, however old (docs/protocol/executions.md §10).
func TestRetention(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--retention", "1h", "--cleanup-interval", "1m",
		"--dispatch-max-attempts", "1000"}})
	a := k.NewAgent("keeper", `"lease_timeout_seconds":86400`)
	e := &cxEnv{t: t, k: k, a: a}
	finish := func() (string, string) {
		id, wh := e.create()
		l := kt.LeaseOf(wh)
		s := e.proceedIn(id, l, `{"kind":"tool_call","target":"t"}`)
		e.recordIn(id, s, l, "complete", `{"result":1}`)
		k.Must(204, e.agentCall(id, "complete", `{"output":1}`, l))
		return id, s
	}
	gone := func(id string) {
		t.Helper()
		deadline := time.Now().Add(5 * time.Second)
		for k.Do("GET", "/v0/executions/"+id, nil, nil).Status != 404 {
			if time.Now().After(deadline) {
				t.Fatalf("execution %s was not deleted", id)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	old, oldStep := finish()
	keyed := k.Must(201, k.Do("POST", "/v0/executions", []byte(`{"agent_id":"keeper","input":1}`),
		map[string]string{"Idempotency-Key": "retained-key"})).Map(t)["id"].(string)
	e.nextWebhook(keyed, 1)
	k.Must(204, k.Do("POST", "/v0/executions/"+keyed+"/cancel", nil, nil))
	running, _ := e.create()
	cancelled, _ := e.create()
	k.Must(204, k.Do("POST", "/v0/executions/"+cancelled+"/cancel", nil, nil))

	k.AdvanceClock(30 * time.Minute)
	younger, _ := finish()
	k.AdvanceClock(31 * time.Minute) // old and cancelled are 61 min old, younger 31 min
	gone(old)
	gone(cancelled)
	gone(keyed)
	// The key went with its execution: using it again creates a new one.
	again := k.Must(201, k.Do("POST", "/v0/executions", []byte(`{"agent_id":"keeper","input":1}`),
		map[string]string{"Idempotency-Key": "retained-key"})).Map(t)["id"].(string)
	if again == keyed {
		t.Fatalf("a deleted execution came back through its idempotency key")
	}
	e.nextWebhook(again, 1)
	k.Must(204, k.Do("POST", "/v0/executions/"+again+"/cancel", nil, nil))
	for _, path := range []string{"/events", "/steps", "/steps/" + oldStep} {
		cxExpectCode(t, k.Do("GET", "/v0/executions/"+old+path, nil, nil), 404, "not_found")
	}
	k.Must(200, k.Do("GET", "/v0/executions/"+younger, nil, nil))
	k.Must(200, k.Do("GET", "/v0/executions/"+running, nil, nil))

	// Much later, the running execution is still there; the sweep that
	// deleted younger shows it ran.
	k.AdvanceClock(20 * time.Hour)
	gone(younger)
	if st := k.Execution(running)["status"]; st != "running" {
		t.Fatalf("old running execution: %v", st)
	}
	if n := len(cxEvents(t, k, running)); n < 3 {
		t.Fatalf("old running execution lost its log: %d events", n)
	}
}

// TestStorageLimitSteps: the step that would exceed --max-steps-per-execution
// is not recorded; the execution fails with storage_limit_exceeded (docs/protocol/operations.md §2.4).
func TestStorageLimitSteps(t *testing.T) {
	e := cxStart(t, kt.Options{Args: []string{"--max-steps-per-execution", "3"}}, "")
	l := e.lease
	s1 := e.proceed(l, `{"kind":"tool_call","target":"s1"}`)
	e.record(s1, l, "complete", `{"result":1}`)
	s2 := e.proceed(l, `{"kind":"tool_call","target":"s2"}`)
	s3 := e.proceed(l, `{"kind":"local","target":"s3"}`)
	// Replays and re-runs of recorded steps are not new steps.
	if d, _ := e.submit(cxWithOccurrence(l, 0), `{"kind":"tool_call","target":"s1"}`); d.Decision != "replay" {
		t.Fatalf("replay at the limit: %+v", d)
	}
	n := len(e.rawEvents(e.id))
	d, r := e.submit(l, `{"kind":"tool_call","target":"s4"}`)
	if d.Decision != "execution_terminal" || d.StepID != "" || r.Header.Get("Rebuno-Step-Occurrence") != "" {
		t.Fatalf("step over the limit: %s", r.Body)
	}
	ex := e.k.Execution(e.id)
	if ex["status"] != "failed" || ex["failure_reason"] != "storage_limit_exceeded" {
		t.Fatalf("execution over the limit: %v", ex)
	}
	evs := e.rawEvents(e.id)[n:]
	if strings.Join(cxTypes(evs), ",") != "execution.failed,step.cancelled,step.cancelled" ||
		evs[0].str("reason") != "storage_limit_exceeded" || evs[1].str("step_id") != s2 || evs[2].str("step_id") != s3 {
		t.Fatalf("storage-limit transaction: %v", evs)
	}
	cxSameRaw(t, "clean-up error", evs[1].Payload["error"], `{"reason":"execution_failed"}`)
	var list []json.RawMessage
	e.k.Must(200, e.k.Do("GET", "/v0/executions/"+e.id+"/steps", nil, nil)).JSON(t, &list)
	if len(list) != 3 {
		t.Fatalf("%d steps recorded, want 3", len(list))
	}
	if d, _ := e.submit(l, `{"kind":"tool_call","target":"s5"}`); d.Decision != "execution_terminal" {
		t.Fatalf("submit after the limit: %+v", d)
	}
	cxExpectCode(t, e.agentCall(e.id, "complete", `{}`, l), 409, "execution_terminal")
	if got := len(e.rawEvents(e.id)); got != n+3 {
		t.Fatalf("events after the terminal transaction")
	}
}

// TestStorageLimitBytes: a write that would cross --max-execution-bytes is
// not applied; the execution fails instead and the request is answered as
// for a terminal execution (docs/protocol/operations.md §2.4).
func TestStorageLimitBytes(t *testing.T) {
	opt := kt.Options{Args: []string{"--max-body-bytes", "65536", "--max-execution-bytes", "65536"}}
	big := strings.Repeat("x", 33000)

	t.Run("step result", func(t *testing.T) {
		e := cxStart(t, opt, "")
		s := e.proceed(e.lease, `{"kind":"tool_call","target":"big","args":{"blob":"`+big+`"}}`)
		n := len(e.rawEvents(e.id))
		if d := e.record(s, e.lease, "complete", `{"result":{"blob":"`+big+`"}}`); d.Decision != "execution_terminal" {
			t.Fatalf("complete over the limit: %+v", d)
		}
		ex := e.k.Execution(e.id)
		if ex["status"] != "failed" || ex["failure_reason"] != "storage_limit_exceeded" {
			t.Fatalf("execution: %v", ex)
		}
		evs := e.rawEvents(e.id)[n:]
		if strings.Join(cxTypes(evs), ",") != "execution.failed,step.cancelled" || evs[1].str("step_id") != s {
			t.Fatalf("storage-limit transaction: %v", evs)
		}
		st := cxStep(t, e.k, e.id, s)
		if cxRawString(st["status"]) != "cancelled" || st["result"] != nil {
			t.Fatalf("the result over the limit was stored: %v", cxRawString(st["status"]))
		}
		if d := e.record(s, e.lease, "complete", `{"result":1}`); d.Decision != "execution_terminal" {
			t.Fatalf("complete after the limit: %+v", d)
		}
	})
	t.Run("execution output", func(t *testing.T) {
		e := cxStart(t, opt, "")
		e.proceed(e.lease, `{"kind":"tool_call","target":"big","args":{"blob":"`+big+`"}}`)
		n := len(e.rawEvents(e.id))
		cxExpectCode(t, e.agentCall(e.id, "complete", `{"output":{"blob":"`+big+`"}}`, e.lease), 409, "execution_terminal")
		ex := e.k.Execution(e.id)
		if ex["status"] != "failed" || ex["failure_reason"] != "storage_limit_exceeded" || ex["output"] != nil {
			t.Fatalf("execution: %v", ex)
		}
		evs := e.rawEvents(e.id)[n:]
		if strings.Join(cxTypes(evs), ",") != "execution.failed,step.cancelled" || evs[0].str("reason") != "storage_limit_exceeded" {
			t.Fatalf("storage-limit transaction: %v", evs)
		}
	})
	t.Run("step args", func(t *testing.T) {
		e := cxStart(t, opt, "")
		e.proceed(e.lease, `{"kind":"tool_call","target":"a","args":{"blob":"`+big+`"}}`)
		n := len(e.rawEvents(e.id))
		d, r := e.submit(e.lease, `{"kind":"tool_call","target":"b","args":{"blob":"`+big+`"}}`)
		if d.Decision != "execution_terminal" {
			t.Fatalf("submit over the limit: %s", r.Body)
		}
		evs := e.rawEvents(e.id)[n:]
		if strings.Join(cxTypes(evs), ",") != "execution.failed,step.cancelled" {
			t.Fatalf("storage-limit transaction: %v", evs)
		}
		if e.k.Execution(e.id)["failure_reason"] != "storage_limit_exceeded" {
			t.Fatalf("failure_reason")
		}
	})
}
