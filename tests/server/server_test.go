// Package server_test runs `rebuno server` as real processes on a real
// Postgres: its command line, and several replicas sharing one database
// behind no load balancer but the tests themselves, which send each request
// to the replica they choose.
package server_test

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	neturl "net/url"
	"os"
	"os/exec"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

const token = "server-test-token"

// replicas starts n `rebuno server` processes on one fresh database.
func replicas(t *testing.T, n int, args ...string) (string, []*kt.Kernel) {
	t.Helper()
	url := pgtest.NewDatabase(t)
	var ks []*kt.Kernel
	for i := range n {
		ks = append(ks, kt.Start(t, kt.Options{DBURL: url, ReplicaID: fmt.Sprintf("replica-%d", i+1), Token: token, Args: args}))
	}
	return url, ks
}

// command runs the binary to its end and returns its exit code and stderr.
func command(t *testing.T, timeout time.Duration, args ...string) (int, string, string, time.Duration) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	cmd := exec.CommandContext(ctx, kt.Binary(t), args...)
	cmd.Env = append(os.Environ(), "REBUNO_DB_URL=", "REBUNO_BEARER_TOKEN=")
	var stdout, stderr strings.Builder
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	start := time.Now()
	err := cmd.Run()
	took := time.Since(start)
	if ctx.Err() != nil {
		t.Fatalf("rebuno %s still running after %s:\n%s", strings.Join(args, " "), timeout, stderr.String())
	}
	code := 0
	if ee, ok := err.(*exec.ExitError); ok {
		code = ee.ExitCode()
	} else if err != nil {
		t.Fatal(err)
	}
	return code, stdout.String(), stderr.String(), took
}

func TestServerRequiresItsSettings(t *testing.T) {
	code, _, stderr, _ := command(t, 30*time.Second, "server")
	if code != 2 || !strings.Contains(stderr, "--db-url (REBUNO_DB_URL)") || !strings.Contains(stderr, "--bearer-token (REBUNO_BEARER_TOKEN)") {
		t.Errorf("rebuno server without settings: exit %d, %q; want 2 naming --db-url and --bearer-token", code, stderr)
	}
	code, _, stderr, _ = command(t, 30*time.Second, "server", "--bearer-token", token, "--db-url", "mysql://x")
	if code != 2 || !strings.Contains(stderr, "REBUNO_DB_URL (--db-url)") {
		t.Errorf("rebuno server with a bad URL: exit %d, %q", code, stderr)
	}
	for _, c := range []struct{ flag, value, want string }{
		{"--db-max-conns", "5", "REBUNO_DB_MAX_CONNS (--db-max-conns): must be 0 (automatic) or >= 6"},
		{"--db-min-conns", "17", "REBUNO_DB_MIN_CONNS (--db-min-conns): must be <= 16"},
		{"--replica-id", "", "REBUNO_REPLICA_ID (--replica-id): must not be empty"},
		{"--migrate", "maybe", "REBUNO_MIGRATE (--migrate)"},
	} {
		code, _, stderr, _ = command(t, 30*time.Second, "server", "--bearer-token", token, "--db-url", "postgres://x@127.0.0.1:1/x", c.flag+"="+c.value)
		if code != 2 || !strings.Contains(stderr, c.want) {
			t.Errorf("rebuno server %s=%s: exit %d, %q; want 2 saying %q", c.flag, c.value, code, stderr, c.want)
		}
	}
	code, _, stderr, _ = command(t, 30*time.Second, "migrate")
	if code != 2 || !strings.Contains(stderr, "--db-url") {
		t.Errorf("rebuno migrate without --db-url: exit %d, %q", code, stderr)
	}
}

// A database nobody answers for stops the start at once, with one line
// that says so and no stack trace.
func TestServerUnreachableDatabase(t *testing.T) {
	code, _, stderr, took := command(t, 30*time.Second, "server", "--bearer-token", token,
		"--db-url", "postgres://rebuno@127.0.0.1:1/rebuno?connect_timeout=3", "--listen-addr", "127.0.0.1:0")
	lines := strings.Split(strings.TrimSpace(stderr), "\n")
	if code != 1 || len(lines) != 1 || !strings.HasPrefix(lines[0], "error: cannot reach the database") || strings.Contains(stderr, "goroutine") {
		t.Errorf("rebuno server on an unreachable database: exit %d, stderr %q; want 1 and one error line", code, stderr)
	}
	if took > 5*time.Second {
		t.Errorf("took %s to give up, beyond the connect timeout", took)
	}
}

func TestMigrateThenServeWithoutMigrating(t *testing.T) {
	url := pgtest.NewEmptyDatabase(t)
	code, _, stderr, _ := command(t, 30*time.Second, "server", "--bearer-token", token, "--db-url", url, "--migrate=false",
		"--listen-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(stderr, "rebuno migrate") {
		t.Fatalf("server --migrate=false on an empty database: exit %d, %q; want 1 pointing at rebuno migrate", code, stderr)
	}
	code, stdout, stderr, _ := command(t, 30*time.Second, "migrate", "--db-url", url)
	want := fmt.Sprintf("from schema version 0 to %d", postgres.SchemaVersion())
	if code != 0 || !strings.Contains(stdout, want) {
		t.Fatalf("rebuno migrate: exit %d, %q %q; want 0 and %q", code, stdout, stderr, want)
	}
	code, stdout, _, _ = command(t, 30*time.Second, "migrate", "--db-url", url)
	if code != 0 || !strings.Contains(stdout, "nothing to do") {
		t.Errorf("rebuno migrate again: exit %d, %q", code, stdout)
	}
	k := kt.Start(t, kt.Options{DBURL: url, Token: token, Args: []string{"--migrate=false"}})
	k.NewAgent("after-migrate", "")
}

func TestServerRefusesNewerSchema(t *testing.T) {
	url := pgtest.NewDatabase(t)
	pgtest.Exec(t, url, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'next')`, postgres.SchemaVersion()+1)
	code, _, stderr, _ := command(t, 30*time.Second, "server", "--bearer-token", token, "--db-url", url, "--listen-addr", "127.0.0.1:0")
	if code != 1 || !strings.Contains(stderr, "newer than this rebuno knows") {
		t.Errorf("server on a newer schema: exit %d, %q", code, stderr)
	}
}

// ---- replicas ----

// deliver waits for the webhook of an execution and for its ack.
func deliver(t *testing.T, k *kt.Kernel, a *kt.Agent, id string) kt.Lease {
	t.Helper()
	deadline := time.After(30 * time.Second)
	for {
		select {
		case wh := <-a.Webhooks:
			if wh.ExecutionID != id {
				continue
			}
			waitEvent(t, k, id, func(e kt.Event) bool {
				return e.Type == "dispatch.acked" && e.Payload["dispatch_id"] == wh.DispatchID
			})
			return kt.LeaseOf(wh)
		case <-deadline:
			t.Fatalf("no webhook for %s within 30s", id)
		}
	}
}

func waitEvent(t *testing.T, k *kt.Kernel, id string, match func(kt.Event) bool) kt.Event {
	t.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		for _, e := range k.Events(id) {
			if match(e) {
				return e
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("no matching event in %s within 30s: %v", id, k.EventTypes(id))
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// sse reads an event stream's frames (id and data lines) as they come.
type sse struct {
	frames chan sseFrame
}

type sseFrame struct {
	id, event, data string
	at              time.Time
}

func openSSE(t *testing.T, k *kt.Kernel, path string) *sse {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "GET", k.URL+path, nil)
	req.Header.Set("Authorization", "Bearer "+token)
	client := &http.Client{Transport: &http.Transport{}}
	resp, err := client.Do(req)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	t.Cleanup(func() { cancel(); client.CloseIdleConnections() })
	if resp.StatusCode != 200 {
		b, _ := io.ReadAll(resp.Body)
		t.Fatalf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	s := &sse{frames: make(chan sseFrame, 1000)}
	go func() {
		defer resp.Body.Close()
		defer close(s.frames)
		br := bufio.NewReader(resp.Body)
		var f sseFrame
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			switch {
			case line == "":
				if f.data != "" {
					f.at = time.Now()
					s.frames <- f
				}
				f = sseFrame{}
			case strings.HasPrefix(line, "id: "):
				f.id = line[4:]
			case strings.HasPrefix(line, "event: "):
				f.event = line[7:]
			case strings.HasPrefix(line, "data: "):
				f.data = line[6:]
			}
		}
	}()
	return s
}

// until reads frames until one whose data contains want.
func (s *sse) until(t *testing.T, want string) sseFrame {
	t.Helper()
	timeout := time.After(30 * time.Second)
	for {
		select {
		case f, ok := <-s.frames:
			if !ok {
				t.Fatalf("the stream ended before %q", want)
			}
			if strings.Contains(f.data, want) {
				return f
			}
		case <-timeout:
			t.Fatalf("no frame with %q within 30s", want)
		}
	}
}

// An execution created on one replica is delivered, its events are tailed
// live on another, its agent talks to either, and its approval is decided
// on a third.
func TestReplicasShareExecutions(t *testing.T) {
	_, ks := replicas(t, 3)
	r1, r2, r3 := ks[0], ks[1], ks[2]
	a1 := r1.NewAgent("shared-agent", "")
	a2 := a1.Via(r2)
	r1.Must(204, r1.Do("POST", "/v0/policies/shared-agent", []byte(`{"bundle":"default_action: allow\nrules:\n  - id: pay-needs-ok\n    when: {target: pay}\n    then: {decision: require_approval}\n"}`),
		map[string]string{"Content-Type": "application/json"}))

	id := r1.CreateExecution("shared-agent", `{"n":1}`)
	lease := deliver(t, r2, a2, id)
	stream := openSSE(t, r2, "/v0/executions/"+id+"/events/stream")
	stream.until(t, `"dispatch.acked"`)

	// Live events committed on one replica reach a stream on another.
	var latencies []time.Duration
	for i := range 20 {
		submitter := a1
		if i%2 == 1 {
			submitter = a2.Via(r3)
		}
		d := submitter.Submit(id, lease, fmt.Sprintf(`{"kind":"tool_call","target":"search","args":{"i":%d}}`, i))
		answered := time.Now()
		if d.Decision != "proceed" {
			t.Fatalf("submit %d: %+v", i, d)
		}
		f := stream.until(t, d.StepID)
		latencies = append(latencies, f.at.Sub(answered))
		a2.Complete(id, d.StepID, lease, `{"ok":true}`)
	}
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	t.Logf("a live event reached another replica's stream %s after its commit was answered (p50; max %s)",
		latencies[len(latencies)/2], latencies[len(latencies)-1])
	// Without a notification from the committing replica, the stream would
	// only re-read at its 15 s keep-alive; the speed itself is measured by
	// the store's BenchmarkNotifyAcross.
	if p50 := latencies[len(latencies)/2]; p50 > 5*time.Second {
		t.Errorf("live events reach another replica's stream after %s (p50): no notification woke it", p50)
	}

	// A gated step blocks the execution through r1; the approval is granted
	// on r3; the resumed execution is delivered and finishes through r2.
	r := a1.Request("POST", "/v0/executions/"+id+"/steps", []byte(`{"kind":"tool_call","target":"pay","args":{"amount":5}}`), lease)
	var blocked struct {
		Decision   string `json:"decision"`
		ApprovalID string `json:"approval_id"`
		StepID     string `json:"step_id"`
	}
	r1.Must(200, r).JSON(t, &blocked)
	if blocked.Decision != "blocked" || blocked.ApprovalID == "" {
		t.Fatalf("gated submit: %s", r.Body)
	}
	r3.Must(204, r3.Do("POST", "/v0/approvals/"+blocked.ApprovalID+"/grant", []byte(`{"decided_by":"alice"}`),
		map[string]string{"Content-Type": "application/json"}))
	// The other replicas see it decided: a second decision is refused.
	if r := r2.Do("POST", "/v0/approvals/"+blocked.ApprovalID+"/deny", []byte(`{"decided_by":"bob"}`),
		map[string]string{"Content-Type": "application/json"}); r.Status != 409 {
		t.Errorf("a second decision on another replica: %s, want 409", r)
	}
	stream.until(t, `"approval.granted"`)
	resumed := deliver(t, r1, a1, id)
	d := a2.Submit(id, resumed, `{"kind":"tool_call","target":"pay","args":{"amount":5}}`)
	if d.Decision != "proceed" || d.StepID != blocked.StepID {
		t.Fatalf("the granted step after the resume: %+v", d)
	}
	a1.Complete(id, d.StepID, resumed, `{"paid":true}`)
	a2.Finish(id, resumed, `{"done":true}`)
	if end := stream.until(t, `"execution_id":"`+id+`","status":"completed"}`); end.event != "end" {
		t.Errorf("the stream on another replica ended with %q %s, want the end frame", end.event, end.data)
	}
	for _, k := range ks {
		if st := k.Execution(id)["status"]; st != "completed" {
			t.Errorf("%s reads the execution as %v", k.URL, st)
		}
	}
}

// Executions created on both replicas are each delivered exactly once,
// whichever replica claims them.
func TestDispatchClaimedOnceAcrossReplicas(t *testing.T) {
	_, ks := replicas(t, 2)
	a := ks[0].NewAgent("once-agent", "")
	const n = 40
	var ids []string
	for i := range n {
		ids = append(ids, ks[i%2].CreateExecution("once-agent", fmt.Sprintf(`{"i":%d}`, i)))
	}
	deliveries := map[string]int{}
	for len(deliveries) < n {
		select {
		case wh := <-a.Webhooks:
			deliveries[wh.ExecutionID]++
			if wh.DispatchAttempt != 1 {
				t.Errorf("execution %s delivered as attempt %d", wh.ExecutionID, wh.DispatchAttempt)
			}
		case <-time.After(30 * time.Second):
			t.Fatalf("%d of %d executions delivered within 30s", len(deliveries), n)
		}
	}
	a.NoWebhook(1500 * time.Millisecond)
	for _, id := range ids {
		if deliveries[id] != 1 {
			t.Errorf("execution %s delivered %d times", id, deliveries[id])
		}
		queued := 0
		for _, e := range ks[1].Events(id) {
			if e.Type == "dispatch.acked" {
				queued++
			}
		}
		if queued != 1 {
			t.Errorf("execution %s: %d dispatch.acked events, want 1", id, queued)
		}
	}
}

// A rate limit of N per minute admits exactly N steps across replicas, all
// asking at once.
func TestRateLimitAcrossReplicas(t *testing.T) {
	_, ks := replicas(t, 3)
	a := ks[0].NewAgent("quota-agent", "")
	ks[0].Must(204, ks[0].Do("POST", "/v0/policies/quota-agent", []byte(`{"bundle":"default_action: allow\nrules:\n  - id: quota\n    when: {target: search}\n    then:\n      decision: allow\n      rate_limit: {max_calls: 7, window: 1m, per_what: agent, on_limiter_error: deny}\n"}`),
		map[string]string{"Content-Type": "application/json"}))
	const executions = 6
	type run struct {
		id    string
		lease kt.Lease
	}
	var runs []run
	for i := range executions {
		id := ks[0].CreateExecution("quota-agent", "{}")
		runs = append(runs, run{id, deliver(t, ks[i%3], a, id)})
	}
	var mu sync.Mutex
	decisions := map[string]int{}
	var wg sync.WaitGroup
	for i, r := range runs {
		for j := range 4 {
			wg.Add(1)
			go func() {
				defer wg.Done()
				d := a.Via(ks[(i+j)%3]).Submit(r.id, r.lease, fmt.Sprintf(`{"kind":"tool_call","target":"search","args":{"q":%d}}`, j))
				mu.Lock()
				decisions[strings.TrimSuffix(d.Decision+" "+d.Reason, " ")]++
				mu.Unlock()
			}()
		}
	}
	wg.Wait()
	// One budget of 7 for the three replicas (each alone would admit 7). A
	// check slower than the limiter's budget, which a loaded machine makes,
	// refuses instead (on_limiter_error: deny), and may or may not have
	// taken its token: so at most 7 proceed, and every missing one is such
	// a refusal.
	proceed, unavailable := decisions["proceed"], decisions["rate_limited rate_limiter_unavailable"]
	limited := decisions["rate_limited rate_limit_exceeded"]
	if proceed > 7 || proceed+unavailable < 7 || proceed+unavailable+limited != executions*4 {
		t.Errorf("decisions across three replicas: %v; want 7 proceed (fewer only by limiter timeouts), the rest rate_limited", decisions)
	}
}

// While the database is gone, requests answer 503 with Retry-After and the
// replica is not ready; when it is back, it serves again by itself.
func TestDatabaseLostAnswers503(t *testing.T) {
	url, ks := replicas(t, 1)
	k := ks[0]
	k.NewAgent("lost-agent", "")
	id := k.CreateExecution("lost-agent", "{}")

	pgtest.Cut(t, url)
	r := k.Do("GET", "/v0/executions/"+id, nil, nil)
	if r.Status != 503 || r.Header.Get("Retry-After") == "" || r.Code() != "unavailable" {
		t.Errorf("a read while the database is gone: %s (Retry-After %q); want 503 unavailable with Retry-After", r, r.Header.Get("Retry-After"))
	}
	r = k.Do("POST", "/v0/executions", []byte(`{"agent_id":"lost-agent","input":{}}`), map[string]string{"Content-Type": "application/json"})
	if r.Status != 503 || r.Header.Get("Retry-After") == "" {
		t.Errorf("a write while the database is gone: %s; want 503 with Retry-After", r)
	}
	if r := k.Do("GET", "/v0/ready", nil, nil); r.Status != 503 {
		t.Errorf("/v0/ready while the database is gone: %s, want 503", r)
	}
	if r := k.Do("GET", "/v0/health", nil, nil); r.Status != 200 {
		t.Errorf("/v0/health while the database is gone: %s, want 200", r)
	}

	pgtest.Restore(t, url)
	deadline := time.Now().Add(20 * time.Second)
	for k.Do("GET", "/v0/ready", nil, nil).Status != 200 {
		if time.Now().After(deadline) {
			t.Fatal("not ready 20s after the database came back")
		}
		time.Sleep(50 * time.Millisecond)
	}
	k.Execution(id)
	k.CreateExecution("lost-agent", "{}")
}

// Three replicas asked to decide the same approvals at the same moment,
// two to grant and one to deny: each approval is decided once, by exactly
// one of them, and its execution resumes once.
func TestApprovalDecidedOnceAcrossReplicas(t *testing.T) {
	_, ks := replicas(t, 3)
	a := ks[0].NewAgent("race-agent", "")
	ks[0].Must(204, ks[0].Do("POST", "/v0/policies/race-agent", []byte(`{"bundle":"default_action: allow\nrules:\n  - id: gate\n    when: {target: pay}\n    then: {decision: require_approval}\n"}`),
		map[string]string{"Content-Type": "application/json"}))
	const n = 20
	type gated struct{ execution, approval string }
	var all []gated
	for i := range n {
		id := ks[i%3].CreateExecution("race-agent", fmt.Sprintf(`{"i":%d}`, i))
		lease := deliver(t, ks[(i+1)%3], a, id)
		r := a.Via(ks[(i+2)%3]).Request("POST", "/v0/executions/"+id+"/steps", []byte(`{"kind":"tool_call","target":"pay","args":{}}`), lease)
		var d kt.Decision
		ks[0].Must(200, r).JSON(t, &d)
		if d.Decision != "blocked" || d.ApprovalID == "" {
			t.Fatalf("gated submit: %s", r.Body)
		}
		all = append(all, gated{id, d.ApprovalID})
	}
	verbs := []string{"grant", "deny", "grant"}
	statuses := make([][3]int, n)
	var wg sync.WaitGroup
	start := make(chan struct{})
	for i, g := range all {
		for j, k := range ks {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, _ := http.NewRequest("POST", k.URL+"/v0/approvals/"+g.approval+"/"+verbs[j], strings.NewReader(fmt.Sprintf(`{"decided_by":"r%d"}`, j)))
				req.Header.Set("Authorization", "Bearer "+token)
				req.Header.Set("Content-Type", "application/json")
				<-start
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					t.Error(err)
					return
				}
				resp.Body.Close()
				statuses[i][j] = resp.StatusCode
			}()
		}
	}
	close(start)
	wg.Wait()
	winners := map[int]int{}
	for i, g := range all {
		won := -1
		for j, status := range statuses[i] {
			switch status {
			case 204:
				if won >= 0 {
					t.Errorf("approval %s decided by replicas %d and %d", g.approval, won+1, j+1)
				}
				won = j
			case 409:
			default:
				t.Errorf("approval %s, %s on replica %d: %d", g.approval, verbs[j], j+1, status)
			}
		}
		if won < 0 {
			t.Errorf("approval %s decided by no replica: %v", g.approval, statuses[i])
			continue
		}
		winners[won]++
		decided, queued := 0, 0
		for _, e := range ks[(i+1)%3].Events(g.execution) {
			switch e.Type {
			case "approval.granted", "approval.denied":
				decided++
				if want := "approval." + map[string]string{"grant": "granted", "deny": "denied"}[verbs[won]]; e.Type != want {
					t.Errorf("execution %s records %s, but replica %d's %s won", g.execution, e.Type, won+1, verbs[won])
				}
			case "dispatch.queued":
				queued++
			}
		}
		if decided != 1 || (verbs[won] == "grant" && queued != 2) {
			t.Errorf("execution %s: %d decisions and %d dispatches queued after the race", g.execution, decided, queued)
		}
	}
	t.Logf("decisions won by replica 1, 2, 3: %d, %d, %d", winners[0], winners[1], winners[2])
}

// A replica whose listening connection broke has missed what the others
// announced meanwhile; once it listens again, its event streams re-read the
// store at once instead of at their keep-alive.
func TestStreamsCatchUpAfterListenerLoss(t *testing.T) {
	url := pgtest.NewDatabase(t)
	r1 := kt.Start(t, kt.Options{DBURL: url, ReplicaID: "writer", Token: token})
	// The second replica names its connections, so that the test can cut
	// its listener alone.
	named, _ := neturl.Parse(url)
	q := named.Query()
	q.Set("application_name", "rebuno-tail")
	named.RawQuery = q.Encode()
	r2 := kt.Start(t, kt.Options{DBURL: named.String(), ReplicaID: "tail", Token: token})
	a := r1.NewAgent("resync-agent", "")
	id := r1.CreateExecution("resync-agent", "{}")
	lease := deliver(t, r1, a, id)
	d := a.Submit(id, lease, `{"kind":"tool_call","target":"warm","args":{}}`) // r1's pools now hold connections
	a.Complete(id, d.StepID, lease, `{}`)
	stream := openSSE(t, r2, "/v0/executions/"+id+"/events/stream")
	stream.until(t, d.StepID)
	stream.until(t, `"step.succeeded"`)

	// No new connection is allowed: r2 cannot listen again, while r1
	// commits and notifies over the connections it has.
	db := pgx.Identifier{pgtest.Name(t, url)}.Sanitize()
	pgtest.Admin(t, `ALTER DATABASE `+db+` WITH ALLOW_CONNECTIONS false`)
	t.Cleanup(func() { pgtest.Admin(t, `ALTER DATABASE `+db+` WITH ALLOW_CONNECTIONS true`) })
	pgtest.Admin(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE application_name = 'rebuno-tail' AND query = 'LISTEN rebuno'`)
	missed := a.Submit(id, lease, `{"kind":"tool_call","target":"missed","args":{}}`)
	select {
	case f := <-stream.frames:
		t.Fatalf("a frame reached the replica without a listener: %s", f.data)
	case <-time.After(time.Second):
	}
	pgtest.Admin(t, `ALTER DATABASE `+db+` WITH ALLOW_CONNECTIONS true`)
	restored := time.Now()
	f := stream.until(t, missed.StepID)
	// The stream's keep-alive re-read comes 15 s after its last frame,
	// sent before the cut: past 8 s after the restore, only that re-read
	// could have found the event.
	if took := f.at.Sub(restored); took > 8*time.Second {
		t.Errorf("the missed event reached the stream %s after the listener could return: no resync woke it", took)
	}
}

// A read waiting on one replica is answered when the execution ends on
// another: the end notification crosses replicas, and the wait does not
// depend on its slow re-read (5 s) to see it. So is a create that waits.
func TestWaitAcrossReplicas(t *testing.T) {
	_, ks := replicas(t, 2)
	r1, r2 := ks[0], ks[1]
	a := r1.NewAgent("wait-agent", "")
	id := r1.CreateExecution("wait-agent", `{"n":1}`)
	lease := deliver(t, r1, a, id)

	answered := make(chan *kt.Response, 1)
	go func() { answered <- r2.Do("GET", "/v0/executions/"+id+"?wait=60s", nil, nil) }()
	waitGauge(t, r2, 1)
	finished := time.Now()
	a.Finish(id, lease, `{"answer":42}`)
	r := <-answered
	took := time.Since(finished)
	if e := r2.Must(200, r).Map(t); e["status"] != "completed" || !strings.Contains(string(r.Body), `"output":{"answer":42}`) {
		t.Fatalf("the waiting read on the other replica answered %s", r.Body)
	}
	t.Logf("a read waiting on another replica was answered %s after the completion was", took)
	if took > 4*time.Second {
		t.Errorf("answered %s after the completion: no notification woke the wait (its re-read is every 5 s)", took)
	}

	// Create and wait on r2; the agent answers through r1.
	done := make(chan *kt.Response, 1)
	go func() {
		done <- r2.Do("POST", "/v0/executions?wait=60s", []byte(`{"agent_id":"wait-agent","input":{"n":2}}`),
			map[string]string{"Content-Type": "application/json"})
	}()
	var wh kt.Webhook
	select {
	case wh = <-a.Webhooks:
	case <-time.After(30 * time.Second):
		t.Fatal("no webhook for the created execution within 30s")
	}
	waitEvent(t, r1, wh.ExecutionID, func(e kt.Event) bool { return e.Type == "dispatch.acked" })
	a.Finish(wh.ExecutionID, kt.LeaseOf(wh), `"done"`)
	r = <-done
	if e := r2.Must(201, r).Map(t); e["id"] != wh.ExecutionID || e["status"] != "completed" || e["output"] != "done" {
		t.Fatalf("create and wait on the other replica answered %s", r.Body)
	}
}

// waitGauge waits until the replica holds n waiting requests.
func waitGauge(t *testing.T, k *kt.Kernel, n int) {
	t.Helper()
	want := fmt.Sprintf("\nrebuno_waiting_reads %d\n", n)
	deadline := time.Now().Add(30 * time.Second)
	for !strings.Contains(string(k.Must(200, k.Do("GET", "/metrics", nil, nil)).Body), want) {
		if time.Now().After(deadline) {
			t.Fatalf("the replica does not hold %d waiting requests within 30s", n)
		}
		time.Sleep(5 * time.Millisecond)
	}
}
