package blackbox

import (
	"context"
	"errors"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- docs/protocol/executions.md §3: waiting reads ----

// wtResult is the answer to a request sent on its own goroutine.
type wtResult struct {
	r   *kt.Response
	err error
}

// wtSend sends a bearer request with its own client (no overall timeout:
// the wait is the kernel's to bound) on its own goroutine.
func wtSend(ctx context.Context, k *kt.Kernel, method, path, body string) chan wtResult {
	done := make(chan wtResult, 1)
	go func() {
		req, err := http.NewRequestWithContext(ctx, method, k.URL+path, strings.NewReader(body))
		if err != nil {
			done <- wtResult{err: err}
			return
		}
		if body != "" {
			req.Header.Set("Content-Type", "application/json")
		}
		k.Authorize(req)
		client := &http.Client{Transport: &http.Transport{}}
		defer client.CloseIdleConnections()
		resp, err := client.Do(req)
		if err != nil {
			done <- wtResult{err: err}
			return
		}
		defer resp.Body.Close()
		var b strings.Builder
		_, err = io.Copy(&b, resp.Body)
		done <- wtResult{r: &kt.Response{Status: resp.StatusCode, Header: resp.Header, Body: []byte(b.String())}, err: err}
	}()
	return done
}

func wtAnswer(t *testing.T, done chan wtResult) *kt.Response {
	t.Helper()
	select {
	case res := <-done:
		if res.err != nil {
			t.Fatalf("waiting request: %v", res.err)
		}
		return res.r
	case <-time.After(40 * time.Second):
		t.Fatal("the waiting request was not answered within 40s")
		return nil
	}
}

// wtWaiting waits until the kernel holds n waiting requests.
func wtWaiting(t *testing.T, k *kt.Kernel, n float64) {
	t.Helper()
	gvWaitMetric(t, k, "rebuno_waiting_reads", nil, n)
}

// TestWaitForTheResult: a read with wait= is answered when the agent
// completes the execution, with its output; a create with wait= answers
// 201 with the execution as it ended.
func TestWaitForTheResult(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("waited", "")
	run := hsStartRun(t, k, a, `{"n":1}`)
	done := wtSend(context.Background(), k, "GET", "/v0/executions/"+run.id+"?wait=60s", "")
	wtWaiting(t, k, 1)
	d := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"lookup","args":{"q":1}}`)
	a.Complete(run.id, d.StepID, run.lease, `{"hits":3}`)
	if done := len(done); done != 0 {
		t.Fatal("the waiting read was answered before the execution ended")
	}
	a.Finish(run.id, run.lease, `{"answer": [1, 2]}`)
	r := wtAnswer(t, done)
	e := k.Must(200, r).Map(t)
	if e["status"] != "completed" || string(hsRawMembers(t, r.Body)["output"]) != `{"answer": [1, 2]}` {
		t.Fatalf("waiting read answered %s", r.Body)
	}
	hsWantJSON(t, r)
	wtWaiting(t, k, 0)

	// Create and wait: the agent finishes while the create is held.
	done = wtSend(context.Background(), k, "POST", "/v0/executions?wait=30", `{"agent_id":"waited","input":{"n":2}}`)
	var wh kt.Webhook
	for wh = a.NextWebhook(); wh.ExecutionID == run.id; wh = a.NextWebhook() {
	}
	wtWaiting(t, k, 1)
	a.Finish(wh.ExecutionID, kt.LeaseOf(wh), `"done"`)
	r = wtAnswer(t, done)
	e = k.Must(201, r).Map(t)
	if e["id"] != wh.ExecutionID || e["status"] != "completed" || e["output"] != "done" {
		t.Fatalf("create and wait answered %s", r.Body)
	}

	// A wait that runs out answers the execution as it is.
	run = hsStartRun(t, k, a, `{"n":3}`)
	r = k.Do("GET", "/v0/executions/"+run.id+"?wait=50ms", nil, nil)
	if e := k.Must(200, r).Map(t); e["status"] != "running" {
		t.Fatalf("a wait that ran out answered %s", r.Body)
	}
	hsWantErr(t, k.Do("GET", "/v0/executions/"+run.id+"?wait=soon", nil, nil), 400, "validation_error")
}

// TestWaitLimitAndClientGone: beyond --max-waits a waiting request is 503
// and creates nothing; a client that goes away frees its place at once.
func TestWaitLimitAndClientGone(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{Args: []string{"--max-waits", "2"}})
	a := k.NewAgent("limited", "")
	run := hsStartRun(t, k, a, `{}`)
	path := "/v0/executions/" + run.id + "?wait=60s"
	ctx, leave := context.WithCancel(context.Background())
	defer leave()
	first := wtSend(ctx, k, "GET", path, "")
	second := wtSend(context.Background(), k, "GET", path, "")
	wtWaiting(t, k, 2)
	r := k.Do("GET", path, nil, nil)
	if r.Status != 503 || r.Code() != "unavailable" || r.Header.Get("Retry-After") != "1" {
		t.Fatalf("a third waiting read: %s %v", r, r.Header)
	}
	before := hsExecutionIDs(t, k, "")
	hsWantErr(t, k.Do("POST", "/v0/executions?wait=60s", []byte(`{"agent_id":"limited"}`), nil), 503, "unavailable")
	if after := hsExecutionIDs(t, k, ""); len(after) != len(before) {
		t.Fatalf("a refused create and wait created an execution: %d → %d", len(before), len(after))
	}
	// Plain reads are not counted.
	k.Must(200, k.Do("GET", "/v0/executions/"+run.id, nil, nil))

	// The first client goes away: its place is free at once, long before
	// its wait would have run out.
	leave()
	if res := <-first; !errors.Is(res.err, context.Canceled) {
		t.Fatalf("the abandoned request ended with %v", res.err)
	}
	wtWaiting(t, k, 1)
	metrics := string(k.Must(200, k.Do("GET", "/metrics", nil, nil)).Body)
	if !strings.Contains(metrics, `rebuno_http_requests_total{route="GET /v0/executions/{id}?wait",status="499"} 1`) {
		t.Errorf("the abandoned wait is not counted as 499")
	}
	third := wtSend(context.Background(), k, "GET", path, "")
	wtWaiting(t, k, 2)
	k.Must(204, k.Do("POST", "/v0/executions/"+run.id+"/cancel", nil, nil))
	for _, done := range []chan wtResult{second, third} {
		if e := k.Must(200, wtAnswer(t, done)).Map(t); e["status"] != "cancelled" {
			t.Fatalf("a waiting read after the cancel: %v", e)
		}
	}
	wtWaiting(t, k, 0)
}
