package api

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// doAsync sends r on its own goroutine.
func (v *env) doAsync(r req) chan *httptest.ResponseRecorder {
	done := make(chan *httptest.ResponseRecorder, 1)
	go func() { done <- v.do(r) }()
	return done
}

// waiters waits until n executions have a waiting request subscribed.
func (v *env) waiters(n int) {
	v.t.Helper()
	waitUntil(v.t, "the waiting requests", func() bool { _, ends, _ := v.k.Subscriptions(); return ends == n })
}

func answer(t *testing.T, done chan *httptest.ResponseRecorder) *httptest.ResponseRecorder {
	t.Helper()
	select {
	case rec := <-done:
		return rec
	case <-time.After(30 * time.Second):
		t.Fatal("the waiting request was not answered within 30s")
		return nil
	}
}

func (v *env) executionCount() int {
	v.t.Helper()
	res, err := v.k.ListExecutions(v.ctx, store.ExecutionFilter{})
	if err != nil {
		v.t.Fatal(err)
	}
	return len(res.Executions)
}

func TestWaitParameter(t *testing.T) {
	v := newEnv(t)
	e, _ := v.start("a1")
	get := "/v0/executions/" + e.ID
	for _, bad := range []string{"abc", "-1s", "-1", "1e3", "5x", "1.", ".5", "+3", "0x10", "NaN", "Inf", "99999999h", "9999999999999"} {
		body := errorOf(t, v.do(req{method: "GET", target: get + "?wait=" + bad}), 400, wire.CodeValidation)
		if f := field(body, "details", "field"); f == nil || f.Str != "wait" {
			t.Errorf("wait=%s: details.field = %v, want wait", bad, f)
		}
		create := v.do(req{method: "POST", target: "/v0/executions?wait=" + bad, body: `{"agent_id":"a1"}`})
		errorOf(t, create, 400, wire.CodeValidation)
	}
	errorOf(t, v.do(req{method: "GET", target: get + "?wait=1s&wait=2s"}), 400, wire.CodeValidation)
	if n := v.executionCount(); n != 1 {
		t.Fatalf("%d executions after refused creates, want 1", n)
	}
	// Absent, empty and zero answer at once, as a plain read.
	for _, q := range []string{"", "?wait=", "?wait=0", "?wait=0s", "?wait=0.0"} {
		if got := jsonOf(t, v.do(req{method: "GET", target: get + q}), 200); got.Get("status").Str != wire.ExecRunning {
			t.Fatalf("GET%s: %s", q, got.Raw)
		}
	}
	// Both forms wait, briefly here.
	for _, q := range []string{"?wait=0.02", "?wait=20ms"} {
		if got := jsonOf(t, v.do(req{method: "GET", target: get + q}), 200); got.Get("status").Str != wire.ExecRunning {
			t.Fatalf("GET%s: %s", q, got.Raw)
		}
	}
	m := v.k.Metrics().HTTPRequests
	if got := testutil.ToFloat64(m.WithLabelValues("GET /v0/executions/{id}?wait", "200")); got != 2 {
		t.Errorf("waiting reads counted under the ?wait route: %v, want 2", got)
	}
	if got := testutil.ToFloat64(m.WithLabelValues("GET /v0/executions/{id}", "200")); got != 5 {
		t.Errorf("plain reads counted: %v, want 5", got)
	}
}

func TestWaitAnswersWhenTheExecutionEnds(t *testing.T) {
	v := newEnv(t)
	e, del := v.start("a1")
	done := v.doAsync(req{method: "GET", target: "/v0/executions/" + e.ID + "?wait=60s"})
	v.waiters(1)
	if got := testutil.ToFloat64(v.k.Metrics().WaitingReads); got != 1 {
		t.Errorf("waiting_reads = %v while one request waits", got)
	}
	if err := v.k.CompleteExecution(v.ctx, kernel.Caller{Agent: "a1"}, e.ID,
		kernel.DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}, kernel.CompleteRequest{Output: []byte(`{"ok": true}`)}); err != nil {
		t.Fatal(err)
	}
	got := jsonOf(t, answer(t, done), 200)
	if got.Get("status").Str != wire.ExecCompleted || string(got.Get("output").Raw) != `{"ok": true}` {
		t.Fatalf("answer = %s", got.Raw)
	}
	if got := testutil.ToFloat64(v.k.Metrics().WaitingReads); got != 0 {
		t.Errorf("waiting_reads = %v after the answer", got)
	}
	// An agent may wait on its own execution only.
	v.agent("a2")
	errorOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "?wait=60s", agent: "a2"}), 403, wire.CodeForbidden)
	if got := jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "?wait=60s", agent: "a1"}), 200); got.Get("status").Str != wire.ExecCompleted {
		t.Fatalf("the agent's own wait = %s", got.Raw)
	}
}

func TestCreateAndWait(t *testing.T) {
	v := newEnv(t)
	v.agent("a1")
	// The wait runs out: 201 with the execution still running.
	got := jsonOf(t, v.do(req{method: "POST", target: "/v0/executions?wait=0.02", body: `{"agent_id":"a1","input":{"n":1}}`}), 201)
	if got.Get("status").Str != wire.ExecRunning || string(got.Get("input").Raw) != `{"n":1}` {
		t.Fatalf("create that ran out of wait = %s", got.Raw)
	}
	// The execution ends during the wait: 201 with it ended.
	done := v.doAsync(req{method: "POST", target: "/v0/executions?wait=1m", body: `{"agent_id":"a1","input":{"n":2}}`,
		header: http.Header{wire.HeaderIdempotencyKey: {"wait-key"}}})
	v.waiters(1)
	res, err := v.k.ListExecutions(v.ctx, store.ExecutionFilter{})
	if err != nil {
		t.Fatal(err)
	}
	id := res.Executions[0].ID
	if err := v.k.CancelExecution(v.ctx, id); err != nil {
		t.Fatal(err)
	}
	got = jsonOf(t, answer(t, done), 201)
	if got.Get("id").Str != id || got.Get("status").Str != wire.ExecCancelled || got.Get("failure_reason").Str != wire.ReasonClientCancelled {
		t.Fatalf("create and wait = %s", got.Raw)
	}
	// A retry under the same key waits on (here: answers at once with) the
	// execution the first request created.
	got = jsonOf(t, v.do(req{method: "POST", target: "/v0/executions?wait=1m", body: `{"agent_id":"a1","input":{"n":2}}`,
		header: http.Header{wire.HeaderIdempotencyKey: {"wait-key"}}}), 201)
	if got.Get("id").Str != id || got.Get("status").Str != wire.ExecCancelled {
		t.Fatalf("the retried create and wait = %s", got.Raw)
	}
	if got := testutil.ToFloat64(v.k.Metrics().HTTPRequests.WithLabelValues("POST /v0/executions?wait", "201")); got != 3 {
		t.Errorf("creates that waited, counted: %v, want 3", got)
	}
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions?wait=1m", body: `{"agent_id":"nobody"}`}), 404, wire.CodeNotFound)
}

// Waiting requests beyond --max-waits are refused before anything is read
// or created; plain reads are not counted.
func TestWaitBound(t *testing.T) {
	v := newEnv(t, func(o *Options) { o.MaxWaits = 1 })
	e, _ := v.start("a1")
	done := v.doAsync(req{method: "GET", target: "/v0/executions/" + e.ID + "?wait=60s"})
	v.waiters(1)
	rec := v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "?wait=60s"})
	errorOf(t, rec, 503, wire.CodeUnavailable)
	if rec.Header().Get(wire.HeaderRetryAfter) != "1" {
		t.Errorf("the refused wait has Retry-After %q", rec.Header().Get(wire.HeaderRetryAfter))
	}
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions?wait=60s", body: `{"agent_id":"a1"}`}), 503, wire.CodeUnavailable)
	if n := v.executionCount(); n != 1 {
		t.Fatalf("%d executions after a refused create and wait, want 1", n)
	}
	jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID}), 200)
	jsonOf(t, v.do(req{method: "POST", target: "/v0/executions", body: `{"agent_id":"a1"}`}), 201)
	if err := v.k.CancelExecution(v.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	jsonOf(t, answer(t, done), 200)
	// The place is free again.
	jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "?wait=60s"}), 200)
}

// A client that goes away ends its wait: its place, its subscription and
// its gauge are released at once, and the request is logged as 499.
func TestWaitClientGone(t *testing.T) {
	v := newEnv(t, func(o *Options) { o.MaxWaits = 1 })
	srv := httptest.NewServer(v.s)
	t.Cleanup(srv.Close)
	e, _ := v.start("a1")
	ctx, cancel := context.WithCancel(context.Background())
	r, _ := http.NewRequestWithContext(ctx, "GET", srv.URL+"/v0/executions/"+e.ID+"?wait=60s", nil)
	failed := make(chan error, 1)
	go func() {
		resp, err := srv.Client().Do(r)
		if err == nil {
			resp.Body.Close()
		}
		failed <- err
	}()
	v.waiters(1)
	cancel()
	if err := <-failed; !errors.Is(err, context.Canceled) {
		t.Fatalf("the cancelled request ended with %v", err)
	}
	v.waiters(0)
	waitUntil(t, "the gauge to drop", func() bool { return testutil.ToFloat64(v.k.Metrics().WaitingReads) == 0 })
	waitUntil(t, "the request to be counted", func() bool {
		return testutil.ToFloat64(v.k.Metrics().HTTPRequests.WithLabelValues("GET /v0/executions/{id}?wait", "499")) == 1
	})
	// Its place under --max-waits (1) is free.
	jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "?wait=0.01"}), 200)
}

// Draining answers every waiting request at once with the execution as it is.
func TestWaitEndsOnDrain(t *testing.T) {
	v := newEnv(t)
	e, _ := v.start("a1")
	done := v.doAsync(req{method: "GET", target: "/v0/executions/" + e.ID + "?wait=60s"})
	v.waiters(1)
	v.s.Drain()
	if got := jsonOf(t, answer(t, done), 200); got.Get("status").Str != wire.ExecRunning {
		t.Fatalf("answer at drain = %s", got.Raw)
	}
}

func TestWaitParamForms(t *testing.T) {
	for q, want := range map[string]time.Duration{
		"30": 30 * time.Second, "1.5": 1500 * time.Millisecond, "250ms": 250 * time.Millisecond, "1m": time.Minute,
		"10m": kernel.MaxWait, "3600": kernel.MaxWait, "2h45m": kernel.MaxWait, "0": 0,
	} {
		c := &call{r: httptest.NewRequest("GET", "/v0/executions/x?wait="+q, nil)}
		got, err := c.waitParam()
		if err != nil || got != want {
			t.Errorf("wait=%s: %v, %v; want %v", q, got, err, want)
		}
		if c.waited != (want > 0) {
			t.Errorf("wait=%s: waited = %v", q, c.waited)
		}
	}
}
