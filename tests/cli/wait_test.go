package cli_test

import (
	"os"
	"regexp"
	"strconv"
	"strings"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// heldReads reads how many waiting reads of an execution the kernel has
// answered (its request counter of the ?wait route).
func heldReads(t *testing.T, k *kt.Kernel) int {
	t.Helper()
	body := string(k.Must(200, k.Do("GET", "/metrics", nil, nil)).Body)
	m := regexp.MustCompile(`(?m)^rebuno_http_requests_total\{route="GET /v0/executions/\{id\}\?wait",status="200"\} (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		return 0
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// waitingReads reads the kernel's gauge of held requests.
func waitingReads(t *testing.T, k *kt.Kernel) int {
	t.Helper()
	body := string(k.Must(200, k.Do("GET", "/metrics", nil, nil)).Body)
	m := regexp.MustCompile(`(?m)^rebuno_waiting_reads (\d+)$`).FindStringSubmatch(body)
	if m == nil {
		t.Fatal("no rebuno_waiting_reads in /metrics")
	}
	n, _ := strconv.Atoi(m[1])
	return n
}

// TestCreateWait: `exec create --wait` prints nothing until the execution
// ends, then its output as JSON (exit 0), or the reason with exit 4; a long
// wait is a sequence of requests the kernel holds.
func TestCreateWait(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("researcher", "")
	env := []string{"REBUNO_URL=" + k.URL}

	// Completed, with --timeout 2s: the kernel holds each read for 1 s, so
	// the agent finishes once the CLI has asked twice.
	w := startWatch(t, env, "exec", "create", "researcher", `{"topic":"waiting"}`, "--wait", "--timeout", "2s")
	wh := a.NextWebhook()
	waitFor(t, "two held reads", func() bool { return heldReads(t, k) >= 2 })
	if w.has(regexp.MustCompile(`.`)) {
		t.Fatalf("output before the execution ended: %q", w.lines)
	}
	a.Finish(wh.ExecutionID, kt.LeaseOf(wh), `{"summary": "done", "n": [1, 2]}`)
	if code := w.wait(t); code != 0 || w.errText() != "" {
		t.Fatalf("create --wait of a completed execution: exit %d, stderr %q", code, w.errText())
	}
	if got := strings.Join(w.lines, "\n"); got != `{"summary": "done", "n": [1, 2]}` {
		t.Fatalf("create --wait printed %q, want the output as recorded", got)
	}

	// --json prints the execution as the kernel answers it.
	w = startWatch(t, env, "exec", "create", "researcher", `{}`, "--wait", "--json")
	wh = a.NextWebhook()
	a.Finish(wh.ExecutionID, kt.LeaseOf(wh), `"ok"`)
	if code := w.wait(t); code != 0 || len(w.lines) != 1 || !strings.Contains(w.lines[0], `"status":"completed"`) ||
		!strings.Contains(w.lines[0], `"output":"ok"`) || !strings.Contains(w.lines[0], `"id":"`+wh.ExecutionID+`"`) {
		t.Fatalf("create --wait --json: exit %d, %q", code, w.lines)
	}

	// Failed: exit 4, the reason on stderr, nothing on stdout.
	w = startWatch(t, env, "exec", "create", "researcher", `{}`, "--wait")
	wh = a.NextWebhook()
	k.Must(204, a.Request("POST", "/v0/executions/"+wh.ExecutionID+"/fail", []byte(`{"error":"the model refused"}`), kt.LeaseOf(wh)))
	if code := w.wait(t); code != 4 || len(w.lines) != 0 ||
		w.errText() != "error: execution "+wh.ExecutionID+" ended failed: the model refused\n" {
		t.Fatalf("create --wait of a failed execution: exit %d, stdout %q, stderr %q", code, w.lines, w.errText())
	}

	// Cancelled: exit 4 as well.
	w = startWatch(t, env, "exec", "create", "researcher", `{}`, "--wait")
	wh = a.NextWebhook()
	cli(t, k, 0, "exec", "cancel", wh.ExecutionID)
	if code := w.wait(t); code != 4 || !strings.Contains(w.errText(), "ended cancelled: client_cancelled") {
		t.Fatalf("create --wait of a cancelled execution: exit %d, stderr %q", code, w.errText())
	}

	// Ctrl-C: the CLI dies, the kernel lets its held read go at once, and
	// the execution goes on.
	w = startWatch(t, env, "exec", "create", "researcher", `{}`, "--wait")
	wh = a.NextWebhook()
	waitFor(t, "a held request", func() bool { return waitingReads(t, k) == 1 })
	if err := w.cmd.Process.Signal(os.Interrupt); err != nil {
		t.Fatal(err)
	}
	w.wait(t)
	waitFor(t, "the kernel to let the read go", func() bool { return waitingReads(t, k) == 0 })
	if st := k.Execution(wh.ExecutionID)["status"]; st != "running" {
		t.Fatalf("the interrupted wait left the execution %v", st)
	}

	r := cli(t, k, 2, "exec", "create", "researcher", "--wait", "--watch")
	if !strings.Contains(r.Stderr, "--watch and --wait cannot be used together") {
		t.Fatalf("--wait with --watch: %s", r)
	}
}

// TestExecRun: `exec run` is `exec create --wait` under the SDKs' name for
// it: the output once the execution ends, exit 4 with the reason when it
// fails.
func TestExecRun(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("researcher", "")
	env := []string{"REBUNO_URL=" + k.URL}

	w := startWatch(t, env, "exec", "run", "researcher", `{"topic":"run"}`)
	wh := a.NextWebhook()
	if in := k.Execution(wh.ExecutionID)["input"]; in.(map[string]any)["topic"] != "run" {
		t.Fatalf("exec run created an execution with input %v", in)
	}
	a.Finish(wh.ExecutionID, kt.LeaseOf(wh), `{"summary": "ran"}`)
	if code := w.wait(t); code != 0 || strings.Join(w.lines, "\n") != `{"summary": "ran"}` {
		t.Fatalf("exec run: exit %d, stdout %q, stderr %q", code, w.lines, w.errText())
	}

	w = startWatch(t, env, "exec", "run", "researcher")
	wh = a.NextWebhook()
	k.Must(204, a.Request("POST", "/v0/executions/"+wh.ExecutionID+"/fail", []byte(`{"error":"no luck"}`), kt.LeaseOf(wh)))
	if code := w.wait(t); code != 4 || len(w.lines) != 0 || !strings.Contains(w.errText(), "ended failed: no luck") {
		t.Fatalf("exec run of a failed execution: exit %d, stdout %q, stderr %q", code, w.lines, w.errText())
	}

	r := cli(t, k, 2, "exec", "run")
	if !strings.Contains(r.Stderr, "takes an agent id") {
		t.Fatalf("exec run without an agent: %s", r)
	}
}
