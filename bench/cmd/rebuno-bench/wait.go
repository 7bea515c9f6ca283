package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"strconv"
	"time"
)

// The WAIT metric: awaiting a result (docs/protocol/executions.md §3.1). A client
// creates an execution and waits for its result in one request
// (POST /v0/executions?wait=), or creates it and then waits with one read
// (GET /v0/executions/{id}?wait=), alternating; the agent takes the webhook
// and completes the execution at once. The figure of merit is how long after
// the agent's completion was answered the waiting client has its answer —
// both answers follow the same commit — and how many requests a result cost.

// waitHold is the wait each client request asks for: far longer than any
// sample, so that every answer is the kernel's reaction to the completion.
const waitHold = "60s"

// waitSample is one execution awaited by the client.
type waitSample struct {
	oneRequest bool          // create and wait, else create then a waiting read
	requests   int           // requests the client sent for the result
	completed  time.Duration // agent's complete answered → client's answer
	sent       time.Duration // agent's complete sent → client's answer
	endToEnd   time.Duration // client's create sent → client's answer
}

// waitAnswer is what the waiting client received.
type waitAnswer struct {
	at   time.Time
	body []byte
	err  error
}

func (b *bench) runWAIT(ctx context.Context) *metricResult {
	m := newMetric("WAIT", "awaiting a result: the client's answer after the execution completes, and requests per result")
	m.Conditions = b.conditions("1 (one execution at a time: the client creates and waits, the agent takes the webhook and completes)")
	k, c, err := b.freshKernel("wait")
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer b.stopKernel(k)
	from, to := b.window()
	m.cpu = &cpuSampler{}
	done := make(chan struct{})
	defer close(done)
	m.cpu.schedule(k, from, to, done)

	var samples []waitSample
	// The kernel's own counts of answered waiting requests, and of those
	// whose client had left, at the start and the end of the window.
	var held, gone [2]float64
	inWindow := false
	for i := 0; ctx.Err() == nil && time.Now().Before(to); i++ {
		if !inWindow && !time.Now().Before(from) {
			inWindow = true
			held[0], gone[0] = scrapeHeld(k.URL)
		}
		s, err := b.awaitOne(ctx, c, i%2 == 0)
		if err != nil {
			m.errs.add(err)
			pause(ctx)
			continue
		}
		if inWindow {
			samples = append(samples, s)
		}
	}
	held[1], gone[1] = scrapeHeld(k.URL)
	m.cpu.stop()
	m.finishKernel(k)

	var one, two, oneSent, twoSent, oneE2E, twoE2E []time.Duration
	requests := [2]int{}
	for _, s := range samples {
		if s.oneRequest {
			one, oneSent, oneE2E = append(one, s.completed), append(oneSent, s.sent), append(oneE2E, s.endToEnd)
			requests[0] += s.requests
		} else {
			two, twoSent, twoE2E = append(two, s.completed), append(twoSent, s.sent), append(twoE2E, s.endToEnd)
			requests[1] += s.requests
		}
	}
	s1 := m.addLatency("create and wait: agent's complete answered → client's answer", one)
	m.addLatency("create and wait: agent's complete sent → client's answer", oneSent)
	m.addLatency("create and wait: create sent → answer with the output", oneE2E)
	s2 := m.addLatency("waiting read: agent's complete answered → client's answer", two)
	m.addLatency("waiting read: agent's complete sent → client's answer", twoSent)
	m.addLatency("waiting read: create sent → answer with the output", twoE2E)
	if len(one) > 0 {
		m.addValue("requests per result, create and wait", float64(requests[0])/float64(len(one)), "requests (the create included)")
	}
	if len(two) > 0 {
		m.addValue("requests per result, create then a waiting read", float64(requests[1])/float64(len(two)), "requests (the create included)")
	}
	if n := len(samples); n > 0 {
		kcpu, _, _ := m.cpu.result()
		m.addValue("kernel CPU per awaited execution", kcpu*b.cfg.Duration.Seconds()/float64(n)*1e6, "µs of its core (create, delivery, complete and the wait)")
		m.addValue("waiting requests per awaited execution, as the kernel counted them", (held[1]-held[0])/float64(n), "(1 expected)")
		m.addValue("waiting requests whose client left", gone[1]-gone[0], "(none expected)")
	}
	all := summarize(append(append([]time.Duration{}, one...), two...))
	switch {
	case all.N == 0:
		m.addTarget("result after completion, p50", "≤ 2 ms", "no samples", false)
	default:
		m.addTarget("result after completion, p50", "≤ 2 ms", ms(all.P50), all.P50 <= 2*time.Millisecond)
		perResult := float64(requests[0]) / float64(max(len(one), 1))
		m.addTarget("awaiting costs one request", "1 request per result (create and wait)", fmt.Sprintf("%.2f", perResult), len(one) > 0 && perResult == 1)
	}
	if s1.N > 0 && s2.N > 0 {
		m.note("both ways answer after the same commit as the agent's complete; the difference to the agent's answer is the kernel waking the waiter, reading the execution and writing the answer, plus the client's own scheduling")
	}
	m.note("polling at the former 100 ms interval would answer ~50 ms after completion on average and send one read per 100 ms of the execution's life")
	return m
}

// awaitOne creates an execution and awaits its result as a client does,
// while the agent side takes its webhook and completes it at once.
func (b *bench) awaitOne(ctx context.Context, c *client, oneRequest bool) (waitSample, error) {
	s := waitSample{oneRequest: oneRequest}
	answered := make(chan waitAnswer, 1)
	created := time.Now()
	body := []byte(`{"agent_id":"` + c.agentID + `","input":{"bench":"wait"}}`)
	if oneRequest {
		s.requests = 1
		go func() {
			b, err := c.bearer("POST", "/v0/executions?wait="+waitHold, body, http.StatusCreated)
			answered <- waitAnswer{at: time.Now(), body: b, err: err}
		}()
	} else {
		s.requests = 2
		id, err := c.create(`{"bench":"wait"}`)
		if err != nil {
			return s, err
		}
		go func() {
			b, err := c.bearer("GET", "/v0/executions/"+id+"?wait="+waitHold, nil, http.StatusOK)
			answered <- waitAnswer{at: time.Now(), body: b, err: err}
		}()
	}
	wh, err := b.recv.wait(ctx, anyExecution, 30*time.Second)
	if err != nil {
		return s, err
	}
	sent := time.Now()
	if err := c.finish(wh.ExecutionID, wh.lease(), `{"ok":true}`); err != nil {
		return s, err
	}
	completed := time.Now()
	var a waitAnswer
	select {
	case a = <-answered:
	case <-time.After(90 * time.Second):
		return s, fmt.Errorf("no answer to the waiting request of %s within 90s", wh.ExecutionID)
	}
	if a.err != nil {
		return s, a.err
	}
	var e struct {
		ID     string          `json:"id"`
		Status string          `json:"status"`
		Output json.RawMessage `json:"output"`
	}
	if err := json.Unmarshal(a.body, &e); err != nil || e.ID != wh.ExecutionID || e.Status != "completed" || string(e.Output) != `{"ok":true}` {
		return s, fmt.Errorf("the waiting request answered %s, want %s completed with its output", a.body, wh.ExecutionID)
	}
	s.completed, s.sent, s.endToEnd = a.at.Sub(completed), a.at.Sub(sent), a.at.Sub(created)
	return s, nil
}

// heldSeries matches the kernel's counters of requests that waited.
var heldSeries = regexp.MustCompile(`(?m)^rebuno_http_requests_total\{route="(?:GET /v0/executions/\{id\}|POST /v0/executions)\?wait",status="(\d+)"\} (\S+)$`)

// scrapeHeld reads how many waiting requests the kernel has answered, and
// how many of those had lost their client (status 499).
func scrapeHeld(base string) (answered, gone float64) {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return 0, 0
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(resp.Body)
	if err != nil {
		return 0, 0
	}
	for _, m := range heldSeries.FindAllStringSubmatch(string(body), -1) {
		v, _ := strconv.ParseFloat(m[2], 64)
		if m[1] == "499" {
			gone += v
		} else {
			answered += v
		}
	}
	return answered, gone
}
