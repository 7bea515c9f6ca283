package server_test

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"
)

// compatPython is the interpreter of the compatibility suite's virtualenv,
// which holds the published rebuno 0.29.2 client (make test builds it before
// the Go tests run).
func compatPython(t *testing.T) (python, agents string) {
	t.Helper()
	_, file, _, _ := runtime.Caller(0)
	compat := filepath.Join(filepath.Dir(file), "..", "compat")
	python = filepath.Join(compat, ".venv", "bin", "python")
	if _, err := os.Stat(python); err != nil {
		if os.Getenv("CI") == "true" {
			t.Fatalf("no compatibility virtualenv at %s under CI (make test builds it)", python)
		}
		t.Skipf("no compatibility virtualenv at %s: make test-compat builds it", python)
	}
	return python, filepath.Join(compat, "agents")
}

func freePort(t *testing.T) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port
}

// The published client, unchanged, serves an execution created on one
// replica while it talks to another: its decorated tools and local step
// each run once and the execution completes with its output.
func TestPublishedClientAgainstReplicas(t *testing.T) {
	python, agents := compatPython(t)
	_, ks := replicas(t, 2)
	r1, r2 := ks[0], ks[1]
	const agentID = "published-first-run"
	secret := "published-secret-0123456789"
	port := freePort(t)
	r1.Must(201, r1.Do("POST", "/v0/agents", fmt.Appendf(nil, `{"id":%q,"webhook_url":"http://127.0.0.1:%d/webhook","secret":%q}`,
		agentID, port, secret), map[string]string{"Content-Type": "application/json"}))

	dir := t.TempDir()
	record := filepath.Join(dir, "record.jsonl")
	gates := filepath.Join(dir, "gates")
	os.Mkdir(gates, 0o755)
	cmd := exec.Command(python, filepath.Join(agents, "first_run.py"))
	cmd.Dir = agents
	cmd.Env = append(os.Environ(), "REBUNO_URL="+r2.URL, "REBUNO_AGENT_SECRET="+secret, "COMPAT_AGENT_ID="+agentID,
		fmt.Sprintf("COMPAT_PORT=%d", port), "COMPAT_RECORD="+record, "COMPAT_GATES="+gates, "PYTHONUNBUFFERED=1")
	var log strings.Builder
	cmd.Stdout, cmd.Stderr = &log, &log
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			t.Logf("agent log:\n%s", log.String())
		}
	})
	deadline := time.Now().Add(60 * time.Second)
	for {
		resp, err := http.Get(fmt.Sprintf("http://127.0.0.1:%d/openapi.json", port))
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				break
			}
		}
		if time.Now().After(deadline) {
			t.Fatalf("the published agent did not serve within 60s:\n%s", log.String())
		}
		time.Sleep(50 * time.Millisecond)
	}

	id := r1.CreateExecution(agentID, `{"topic":"durable agents"}`)
	ex := r2.WaitStatus(id, "completed", "failed", "cancelled")
	want := `{"hits":["durable agents #1","durable agents #2"],"sent":{"sent":true,"subject":"T-0042: durable agents #1","to":"ops@example.com"},"ticket":"T-0042"}`
	got, _ := json.Marshal(ex["output"])
	if ex["status"] != "completed" || string(got) != want {
		t.Fatalf("execution: %v, output %s; want completed with %s", ex["status"], got, want)
	}
	counts := map[string]int{}
	f, err := os.Open(record)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		var line struct{ Event string }
		json.Unmarshal(sc.Bytes(), &line)
		counts[line.Event]++
	}
	for _, body := range []string{"tool:search", "step:ticket", "tool:send_email", "handler:start"} {
		if counts[body] != 1 {
			t.Errorf("%s ran %d times, want once (%v)", body, counts[body], counts)
		}
	}
	var succeeded int
	for _, e := range r1.Events(id) {
		if e.Type == "step.succeeded" {
			succeeded++
		}
	}
	if succeeded != 3 {
		t.Errorf("%d step.succeeded events, want 3: %v", succeeded, r1.EventTypes(id))
	}
}
