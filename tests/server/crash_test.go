package server_test

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

type answer struct {
	status int
	body   []byte
	// retried: an earlier attempt of the same request was cut, so the
	// kernel may have acted on it before this answer.
	retried bool
}

// send sends a signed agent request through the balancer, again after a
// cut connection or a 503, for up to ten seconds.
func (c *crashAgent) send(method, path string, body []byte, lease kt.Lease) (answer, error) {
	var last error
	retried := false
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		resp, err := c.client.Do(c.agent.SignedRequest(method, path, body, lease, nil))
		if err != nil {
			last, retried = err, true
			continue
		}
		data, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		if err != nil || resp.StatusCode == 503 {
			last = fmt.Errorf("%s %s: %d %v", method, path, resp.StatusCode, err)
			retried = retried || err != nil
			continue
		}
		return answer{resp.StatusCode, data, retried}, nil
	}
	return answer{}, last
}

// crashAgent runs each delivered execution: three steps, each run only on
// proceed, then completes it. It counts the bodies it runs and remembers
// the steps the kernel recorded as succeeded.
type crashAgent struct {
	t      *testing.T
	agent  *kt.Agent // signing for the balancer
	client *http.Client
	// carried: each outcome travels with the next submit or the execution's
	// complete (docs/protocol/steps.md §13); a 200 or 204 to the carrier records it.
	carried   bool
	mu        sync.Mutex
	runs      map[string]int  // execution/step → bodies run
	succeeded map[string]bool // execution/step → recorded
	rerun     []string
	progress  atomic.Int64
	// redelivered counts deliveries of a later attempt: leases that the
	// survivor reclaimed.
	redelivered atomic.Int64
}

const crashSteps = 3

// stepWork is what a step's body takes, so that the kill finds executions
// halfway.
const stepWork = 50 * time.Millisecond

func (c *crashAgent) handle(wh kt.Webhook) {
	if wh.DispatchAttempt > 1 {
		c.redelivered.Add(1)
	}
	lease := kt.LeaseOf(wh)
	lease.Occurrence = 0          // each step's args are distinct: its first occurrence
	var pending, pendingID string // the step whose outcome the next request carries
	for i := range crashSteps {
		ans, err := c.send("POST", "/v0/executions/"+wh.ExecutionID+"/steps",
			fmt.Appendf(nil, `{"kind":"tool_call","target":"work","args":{"step":%d}%s}`, i, carriedOutcome(pendingID)), lease)
		if err != nil || ans.status != 200 {
			return // superseded, or no replica answered: a later attempt runs it
		}
		var d kt.Decision
		json.Unmarshal(ans.body, &d)
		if pending != "" && d.Decision != "execution_terminal" {
			c.recorded(pending)
		}
		pending, pendingID = "", ""
		key := fmt.Sprintf("%s/%d", wh.ExecutionID, i)
		switch d.Decision {
		case "replay":
			continue
		case "proceed":
		default:
			return
		}
		c.mu.Lock()
		c.runs[key]++
		if c.succeeded[key] {
			c.rerun = append(c.rerun, key)
		}
		c.mu.Unlock()
		time.Sleep(stepWork)
		if c.carried {
			pending, pendingID = key, d.StepID
			continue
		}
		ans, err = c.send("POST", "/v0/executions/"+wh.ExecutionID+"/steps/"+d.StepID+"/complete", []byte(`{"result":{"ok":true}}`), lease)
		if err != nil || ans.status != 200 {
			return
		}
		c.recorded(key)
	}
	ans, err := c.send("POST", "/v0/executions/"+wh.ExecutionID+"/complete", []byte(`{"output":{"done":true}`+carriedOutcome(pendingID)+`}`), lease)
	// A 409 to a retried complete means the cut attempt ended the
	// execution, and its carried outcome was recorded with that end.
	if err == nil && (ans.status == 204 || ans.status == 409 && ans.retried) && pending != "" {
		c.recorded(pending)
	}
}

func (c *crashAgent) recorded(key string) {
	c.mu.Lock()
	c.succeeded[key] = true
	c.mu.Unlock()
	c.progress.Add(1)
}

// carriedOutcome is the outcome member a carrier adds, "" when none waits.
func carriedOutcome(stepID string) string {
	if stepID == "" {
		return ""
	}
	return `,"outcome":{"step_id":"` + stepID + `","result":{"ok":true}}`
}

// kill -9 of one replica while a raw-HTTP Go agent runs executions through
// the balancer (the crash matrix drives the Python SDK): the survivor
// delivers what the dead one had claimed once its leases expire, every
// execution completes, and no step recorded as succeeded runs again.
func TestReplicaKilledMidRun(t *testing.T) { replicaKilledMidRun(t, false) }

// TestReplicaKilledMidRunCarried is the same with every outcome carried by
// the next request: an acknowledged carrier's outcome is never lost, and no
// step it recorded runs again.
func TestReplicaKilledMidRunCarried(t *testing.T) { replicaKilledMidRun(t, true) }

func replicaKilledMidRun(t *testing.T, carried bool) {
	_, ks := replicas(t, 2, "--dispatch-lease-timeout", "4s", "--dispatch-timeout", "2s",
		"--dispatch-backoff-base", "100ms", "--dispatch-backoff-max", "500ms")
	r1, r2 := ks[0], ks[1]
	lb := newBalancer(t, ks...)
	a1 := r1.NewAgent("crash-agent", "")
	c := &crashAgent{t: t, runs: map[string]int{}, succeeded: map[string]bool{}, carried: carried,
		agent: a1.Via(kt.Remote(t, lb.URL(), token)), client: &http.Client{Timeout: 10 * time.Second}}
	stop := make(chan struct{})
	defer close(stop)
	go func() {
		for {
			select {
			case wh := <-a1.Webhooks:
				go c.handle(wh)
			case <-stop:
				return
			}
		}
	}()

	const n = 40
	var ids []string
	for i := range n {
		ids = append(ids, ks[i%2].CreateExecution("crash-agent", fmt.Sprintf(`{"i":%d}`, i)))
	}
	deadline := time.Now().Add(30 * time.Second)
	for c.progress.Load() < n*crashSteps/3 {
		if time.Now().After(deadline) {
			t.Fatalf("only %d steps recorded in 30s", c.progress.Load())
		}
		time.Sleep(5 * time.Millisecond)
	}
	r1.Kill()
	killedAt := c.progress.Load()

	deadline = time.Now().Add(90 * time.Second)
	for _, id := range ids {
		for {
			e := r2.Execution(id)
			if e["status"] == "completed" {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("execution %s is %v 90s after the kill", id, e["status"])
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	t.Logf("%d of %d steps were recorded when replica 1 was killed; %d deliveries were of a reclaimed lease", killedAt, n*crashSteps, c.redelivered.Load())
	if len(c.rerun) > 0 {
		t.Errorf("steps recorded as succeeded ran again: %v", c.rerun)
	}
	for _, id := range ids {
		for i := range crashSteps {
			if !c.succeeded[fmt.Sprintf("%s/%d", id, i)] {
				t.Errorf("step %d of %s never recorded", i, id)
			}
		}
		var done int
		for _, e := range r2.Events(id) {
			if e.Type == "step.succeeded" {
				done++
			}
		}
		if done != crashSteps {
			t.Errorf("execution %s has %d step.succeeded events, want %d", id, done, crashSteps)
		}
	}
}
