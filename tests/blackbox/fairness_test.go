package blackbox

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestHostileAgentsCannotStarveOthers: beside three hostile agents — one
// whose webhook accepts connections and never answers, one that takes 5 s,
// one that answers 500 — each with 100 executions, a healthy agent's
// executions are delivered at once; and once only the hanging deliveries are
// left, with more of that agent's work due than its share lets run, the
// kernel sleeps rather than spinning. With REBUNO_TEST_BACKEND=postgres
// (make test-go) the same runs on a server-mode kernel on Postgres.
func TestHostileAgentsCannotStarveOthers(t *testing.T) {
	k := kt.Start(t, kt.Options{Args: []string{
		"--dispatch-backoff-base", "100ms", "--dispatch-backoff-max", "400ms"}})
	stop := make(chan struct{})
	defer close(stop)
	var slowDone, errorHits atomic.Int64
	hostile := map[string]http.HandlerFunc{
		"hanging": func(w http.ResponseWriter, r *http.Request) { <-stop },
		"slow": func(w http.ResponseWriter, r *http.Request) {
			select {
			case <-time.After(5 * time.Second):
				slowDone.Add(1)
			case <-stop:
			}
		},
		"erroring": func(w http.ResponseWriter, r *http.Request) {
			errorHits.Add(1)
			w.WriteHeader(http.StatusInternalServerError)
		},
	}
	register := func(id string, h http.Handler) {
		srv := httptest.NewServer(h)
		t.Cleanup(srv.Close)
		k.Must(201, k.Do("POST", "/v0/agents", []byte(fmt.Sprintf(`{"id":%q,"webhook_url":%q,"secret":"secret-%s-0123456789"}`,
			id, srv.URL, id)), nil))
	}
	for id, h := range hostile {
		register(id, h)
	}
	arrived := make(chan string, 1000)
	register("healthy", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		arrived <- r.Header.Get("Rebuno-Execution-Id")
	}))
	for i := 0; i < 100; i++ {
		for id := range hostile {
			k.CreateExecution(id, "null")
		}
	}

	// The healthy agent's dispatch latency: create sent → webhook received.
	var latencies []time.Duration
	for i := 0; i < 100; i++ {
		begin := time.Now()
		id := k.CreateExecution("healthy", "null")
		for got := ""; got != id; {
			select {
			case got = <-arrived:
			case <-time.After(30 * time.Second):
				t.Fatalf("healthy execution %d was not delivered within 30 s", i)
			}
		}
		latencies = append(latencies, time.Since(begin))
		time.Sleep(20 * time.Millisecond) // spread the samples over the hostile load
	}
	slices.Sort(latencies)
	p50, p99 := latencies[len(latencies)/2], latencies[len(latencies)*99/100-1]
	t.Logf("healthy dispatch latency p50 %v, p99 %v, max %v", p50, p99, latencies[len(latencies)-1])
	if p50 > 50*time.Millisecond || p99 > 500*time.Millisecond {
		t.Fatalf("healthy dispatch latency p50 %v (want ≤ 50 ms), p99 %v (want ≤ 500 ms)", p50, p99)
	}

	// Wait until only the hanging deliveries are left: the slow ones have
	// answered and the erroring ones spent their attempts.
	deadline := time.Now().Add(60 * time.Second)
	for slowDone.Load() < 100 || failedCount(t, k, "erroring") < 100 {
		if time.Now().After(deadline) {
			t.Fatalf("slow deliveries done %d of 100, erroring executions failed %d of 100", slowDone.Load(), failedCount(t, k, "erroring"))
		}
		time.Sleep(50 * time.Millisecond)
	}
	before := k.CPUTime()
	window := 2 * time.Second
	time.Sleep(window) // the measurement window
	used := k.CPUTime() - before
	t.Logf("kernel CPU with only hanging deliveries left: %v in %v", used, window)
	if used > window/20 {
		t.Fatalf("the kernel used %v of CPU in %v with only hanging deliveries left (more than 5%% of a core)", used, window)
	}
}

func failedCount(t *testing.T, k *kt.Kernel, agent string) int {
	t.Helper()
	r := k.Must(200, k.Do("GET", "/v0/executions?status=failed&limit=200&agent_id="+agent, nil, nil))
	return strings.Count(string(r.Body), `"status":"failed"`)
}
