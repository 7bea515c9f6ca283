package server_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// The crash matrix: replicas behind a load balancer, the Python SDK agent
// driving a hundred executions at once, and one replica killed (SIGKILL)
// at a chosen phase of a step. Every execution must finish through the
// surviving replicas, with nothing recorded lost and no body run twice.

const (
	// matrixBatch is how many executions are in flight at each kill.
	matrixBatch = 100
	// matrixSteps is each execution's tool calls before its at_most_once
	// call.
	matrixSteps = 3
	// matrixLease is the agent's lease: what a dispatch claimed by a
	// killed replica waits before another delivers it.
	matrixLease = 6
	// settle bounds how long a batch may take to finish after a kill, on
	// a loaded two-core machine.
	settle = 120 * time.Second
)

// front is an operator's client of the replicas behind the balancer. Like
// this project's SDK clients it sends a request again after a cut
// connection or a 503, and creates and forks carry an idempotency key, so a
// repeat creates nothing.
type front struct {
	url string
	hc  *http.Client
}

func newFront(t *testing.T, url string) *front {
	f := &front{url: url, hc: &http.Client{Timeout: 60 * time.Second, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}}
	t.Cleanup(f.hc.CloseIdleConnections)
	return f
}

// do sends a bearer request until it gets an answer other than 503, for up
// to settle; status 0 means it never did. Safe from any goroutine.
func (f *front) do(method, path string, body []byte, headers map[string]string) (int, []byte) {
	deadline := time.Now().Add(settle)
	wait := 20 * time.Millisecond
	var last string
	for time.Now().Before(deadline) {
		req, _ := http.NewRequest(method, f.url+path, bytes.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+token)
		if len(body) > 0 {
			req.Header.Set("Content-Type", "application/json")
		}
		for k, v := range headers {
			req.Header.Set(k, v)
		}
		resp, err := f.hc.Do(req)
		if err == nil {
			data, rerr := io.ReadAll(resp.Body)
			resp.Body.Close()
			if rerr == nil && resp.StatusCode != 503 {
				return resp.StatusCode, data
			}
			last = fmt.Sprintf("%d %s %v", resp.StatusCode, data, rerr)
		} else {
			last = err.Error()
		}
		time.Sleep(wait)
		wait = min(2*wait, 500*time.Millisecond)
	}
	return 0, []byte(last)
}

func (f *front) must(t *testing.T, status int, method, path string, body []byte, headers map[string]string) []byte {
	t.Helper()
	got, data := f.do(method, path, body, headers)
	if got != status {
		t.Fatalf("%s %s: %d %s, want %d", method, path, got, data, status)
	}
	return data
}

func (f *front) execution(t *testing.T, id string) map[string]any {
	t.Helper()
	var e map[string]any
	json.Unmarshal(f.must(t, 200, "GET", "/v0/executions/"+id, nil, nil), &e)
	return e
}

func (f *front) events(t *testing.T, id string) []kt.Event {
	t.Helper()
	var all []kt.Event
	for after := int64(0); ; {
		var page []kt.Event
		json.Unmarshal(f.must(t, 200, "GET", fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", id, after), nil, nil), &page)
		all = append(all, page...)
		if len(page) < 1000 {
			return all
		}
		after = page[len(page)-1].Seq
	}
}

type stepView struct {
	StepID      string          `json:"step_id"`
	Target      string          `json:"target"`
	Status      string          `json:"status"`
	Idempotency string          `json:"idempotency"`
	Result      json.RawMessage `json:"result"`
}

func (f *front) steps(t *testing.T, id string) []stepView {
	t.Helper()
	var steps []stepView
	json.Unmarshal(f.must(t, 200, "GET", "/v0/executions/"+id+"/steps", nil, nil), &steps)
	return steps
}

// createBatch creates n executions of the agent through the balancer, half
// of them with a workspace resource; first numbers their inputs.
func (f *front) createBatch(t *testing.T, agentID string, first, n int) []string {
	t.Helper()
	ids := make([]string, n)
	var wg sync.WaitGroup
	errs := make(chan string, n)
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			num := first + i
			body := fmt.Appendf(nil, `{"agent_id":%q,"input":{"n":%d,"steps":%d,"workspace":%t}}`, agentID, num, matrixSteps, num%2 == 0)
			status, data := f.do("POST", "/v0/executions", body, map[string]string{"Idempotency-Key": fmt.Sprintf("create-%d", num)})
			var e struct{ ID string }
			if status != 201 || json.Unmarshal(data, &e) != nil {
				errs <- fmt.Sprintf("create %d: %d %s", num, status, data)
				return
			}
			ids[i] = e.ID
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	return ids
}

// awaitFinished waits until every execution is terminal and fails the test
// unless each completed.
func (f *front) awaitFinished(t *testing.T, ids []string) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for _, id := range ids {
		for {
			e := f.execution(t, id)
			if e["status"] == "completed" {
				break
			}
			if e["status"] != "running" {
				t.Fatalf("execution %s ended %v (%v)", id, e["status"], e["failure_reason"])
			}
			if time.Now().After(deadline) {
				t.Fatalf("execution %s still running %s after the kill", id, settle)
			}
			time.Sleep(25 * time.Millisecond)
		}
	}
}

// audit checks what the kernel recorded of finished executions against the
// bodies the agent ran: each execution's log is gap-free and ends
// completed, each of its own steps succeeded and its body ran exactly once
// (at_most_once steps included), and steps copied by a fork never ran in it.
// copied names, per fork, how many of its steps are copies. It returns how
// many attempts after the first were delivered.
func audit(t *testing.T, f *front, a *pyAgent, ids []string, copied map[string]int) (redelivered int) {
	t.Helper()
	runs := a.runs(t)
	for _, id := range ids {
		evs := f.events(t, id)
		for i, e := range evs {
			if e.Seq != int64(i+1) {
				t.Fatalf("execution %s: event %d has seq %d", id, i+1, e.Seq)
			}
			if attempt, _ := e.Payload["attempt"].(float64); e.Type == "dispatch.acked" && attempt > 1 {
				redelivered++
			}
		}
		if last := evs[len(evs)-1].Type; last != "execution.completed" {
			t.Errorf("execution %s ends with %s", id, last)
		}
		steps := f.steps(t, id)
		if len(steps) != matrixSteps+1 {
			t.Errorf("execution %s has %d steps, want %d", id, len(steps), matrixSteps+1)
		}
		fresh := 0
		for _, s := range steps {
			if s.Status != "succeeded" {
				t.Errorf("execution %s: step %s (%s) is %s", id, s.StepID, s.Target, s.Status)
			}
			n := len(runs[s.StepID])
			for _, r := range runs[s.StepID] {
				if r.ExecutionID != id {
					t.Errorf("step %s of %s ran as a step of %s", s.StepID, id, r.ExecutionID)
				}
			}
			if n == 0 {
				continue
			}
			fresh++
			if n != 1 {
				t.Errorf("execution %s: the body of %s step %s (%s) ran %d times", id, s.Target, s.StepID, s.Idempotency, n)
			}
		}
		if want := len(steps) - copied[id]; fresh != want {
			t.Errorf("execution %s: %d of its steps ran a body, want %d (%d copied by its fork)", id, fresh, want, copied[id])
		}
	}
	return redelivered
}

// phase is one row of the matrix: when the kill happens.
type phase struct {
	name  string
	when  killMoment
	match func(r *http.Request, body []byte) bool
}

func agentCall(suffix string) func(*http.Request, []byte) bool {
	return func(r *http.Request, _ []byte) bool {
		return r.Method == "POST" && r.Header.Get("Rebuno-Agent-Id") != "" && strings.HasSuffix(r.URL.Path, suffix)
	}
}

func isStepComplete(r *http.Request) bool {
	return r.Method == "POST" && strings.Contains(r.URL.Path, "/steps/") && strings.HasSuffix(r.URL.Path, "/complete")
}

var matrixPhases = []phase{
	// The submit was recorded; its answer is lost, and the agent sends it
	// again to another replica, which answers it the same.
	{"after submit", answerLost, agentCall("/steps")},
	// The agent got proceed and runs the body while its replica dies; the
	// outcome goes to another.
	{"after tool start", afterRelay, agentCall("/steps")},
	// The outcome was recorded; its answer is lost.
	{"after complete", answerLost, func(r *http.Request, _ []byte) bool { return isStepComplete(r) }},
	// The replica dies while it handles an outcome that carries a capture
	// of the workspace (or a capture published outside a step).
	{"during a capture", whileInFlight, func(r *http.Request, body []byte) bool {
		return r.Method == "POST" && (isStepComplete(r) || strings.HasSuffix(r.URL.Path, "/resources/checkpoints")) &&
			bytes.Contains(body, []byte(`"captures"`))
	}},
	// The replica dies while it writes a fork.
	{"during a fork", whileInFlight, func(r *http.Request, _ []byte) bool {
		return r.Method == "POST" && strings.HasSuffix(r.URL.Path, "/fork")
	}},
}

// TestCrashMatrix kills one of three replicas at each phase of a step while
// a hundred executions are in flight, restarting it before the next phase.
func TestCrashMatrix(t *testing.T) {
	_, ks := replicas(t, 3, "--dispatch-timeout", "3s", "--dispatch-backoff-base", "100ms", "--dispatch-backoff-max", "1s",
		"--dispatch-max-attempts", "50")
	lb := newBalancer(t, ks...)
	f := newFront(t, lb.URL())
	agent := startPyAgent(t, "matrix-agent", lb.URL())
	agent.register(t, f, matrixLease)

	var finished []string // executions of earlier phases, to fork
	for i, ph := range matrixPhases {
		ok := t.Run(ph.name, func(t *testing.T) {
			ids := f.createBatch(t, agent.ID, i*matrixBatch, matrixBatch)
			tr := lb.arm(ph.name, ph.when, ph.match)
			copied := map[string]int{}
			if ph.name == "during a fork" {
				forks, n := forkMany(t, f, finished[:20])
				ids = append(ids, forks...)
				copied = n
			}
			tr.wait(t, settle)
			start := time.Now()
			f.awaitFinished(t, ids)
			took := time.Since(start)
			tr.victim.Restart()
			lb.revive(tr.victim)
			redelivered := audit(t, f, agent, ids, copied)
			t.Logf("the replica at %s died at %s; %d executions finished %s later; %d later attempts were delivered",
				tr.victim.URL, tr.hit, len(ids), took.Round(time.Millisecond), redelivered)
			finished = append(finished, ids...)
		})
		if !ok {
			break
		}
	}
}

// forkMany forks each source at its second recorded step, through the
// balancer, all at once, sending each fork again (with its key) until it
// is answered, and checks that each source has exactly one fork. It
// returns the forks and how many steps each copied.
func forkMany(t *testing.T, f *front, sources []string) ([]string, map[string]int) {
	t.Helper()
	type fork struct {
		id     string
		copied int
	}
	out := make([]fork, len(sources))
	var wg sync.WaitGroup
	errs := make(chan string, len(sources))
	for i, src := range sources {
		at, copies := int64(0), 0
		for _, e := range f.events(t, src) {
			if e.Type == "step.succeeded" {
				copies++
				if at = e.Seq; copies == 2 {
					break
				}
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			status, data := f.do("POST", "/v0/executions/"+src+"/fork", fmt.Appendf(nil, `{"at_seq":%d}`, at),
				map[string]string{"Idempotency-Key": "fork-" + src})
			var e struct{ ID string }
			if status != 201 || json.Unmarshal(data, &e) != nil {
				errs <- fmt.Sprintf("fork of %s: %d %s", src, status, data)
				return
			}
			out[i] = fork{e.ID, copies}
		}()
	}
	wg.Wait()
	close(errs)
	for e := range errs {
		t.Fatal(e)
	}
	var ids []string
	copied := map[string]int{}
	for i, src := range sources {
		var page struct{ Executions []struct{ ID string } }
		json.Unmarshal(f.must(t, 200, "GET", "/v0/executions/"+src+"/forks", nil, nil), &page)
		if len(page.Executions) != 1 || page.Executions[0].ID != out[i].id {
			t.Fatalf("source %s has forks %v, want exactly %s", src, page.Executions, out[i].id)
		}
		ids = append(ids, out[i].id)
		copied[out[i].id] = out[i].copied
	}
	sort.Strings(ids)
	return ids, copied
}

// TestPostgresCrash stops Postgres itself as a crash would (pg_ctl stop -m
// immediate) while a hundred executions are in flight on two replicas, and
// starts it again: the replicas serve 503 meanwhile, recover by themselves,
// and every execution finishes with nothing recorded lost and no body run
// twice.
func TestPostgresCrash(t *testing.T) {
	cluster := pgtest.NewCluster(t)
	var ks []*kt.Kernel
	for i := range 2 {
		ks = append(ks, kt.Start(t, kt.Options{DBURL: cluster.URL, ReplicaID: fmt.Sprintf("replica-%d", i+1), Token: token,
			Args: []string{"--dispatch-timeout", "3s", "--dispatch-backoff-base", "100ms", "--dispatch-backoff-max", "1s",
				"--dispatch-max-attempts", "50"}}))
	}
	lb := newBalancer(t, ks...)
	f := newFront(t, lb.URL())
	agent := startPyAgent(t, "pg-crash-agent", lb.URL())
	agent.register(t, f, matrixLease)

	ids := f.createBatch(t, agent.ID, 0, matrixBatch)
	// A quarter of the bodies have run: every execution is under way.
	deadline := time.Now().Add(settle)
	for len(agent.runs(t)) < matrixBatch*(matrixSteps+1)/4 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d bodies ran within %s", len(agent.runs(t)), settle)
		}
		time.Sleep(10 * time.Millisecond)
	}
	cluster.Crash()
	before := len(agent.runs(t))
	for _, k := range ks {
		awaitReady(t, k, 503)
	}
	cluster.Restart()
	for _, k := range ks {
		awaitReady(t, k, 200)
	}
	start := time.Now()
	f.awaitFinished(t, ids)
	redelivered := audit(t, f, agent, ids, nil)
	t.Logf("%d bodies had run when Postgres crashed; %d executions finished %s after its restart; %d later attempts were delivered",
		before, len(ids), time.Since(start).Round(time.Millisecond), redelivered)
}

// awaitReady waits until a replica's /v0/ready answers status.
func awaitReady(t *testing.T, k *kt.Kernel, status int) {
	t.Helper()
	deadline := time.Now().Add(settle)
	for k.Do("GET", "/v0/ready", nil, nil).Status != status {
		if time.Now().After(deadline) {
			t.Fatalf("%s/v0/ready did not answer %d within %s", k.URL, status, settle)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
