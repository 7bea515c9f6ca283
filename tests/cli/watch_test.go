package cli_test

import (
	"bufio"
	"bytes"
	"fmt"
	"io"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// watcher is `rebuno exec watch` running as a subprocess.
type watcher struct {
	cmd    *exec.Cmd
	mu     sync.Mutex
	lines  []string
	stderr bytes.Buffer
	done   chan struct{}
	code   int
}

func startWatch(t *testing.T, env []string, args ...string) *watcher {
	t.Helper()
	w := &watcher{done: make(chan struct{})}
	w.cmd = exec.Command(kt.Binary(t), args...)
	w.cmd.Env = cleanEnv(env...)
	out, err := w.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	w.cmd.Stderr = &lockedWriter{mu: &w.mu, w: &w.stderr}
	if err := w.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			w.mu.Lock()
			w.lines = append(w.lines, sc.Text())
			w.mu.Unlock()
		}
		io.Copy(io.Discard, out)
		err := w.cmd.Wait()
		if ee, ok := err.(*exec.ExitError); ok {
			w.code = ee.ExitCode()
		} else if err != nil {
			w.code = -1
		}
		close(w.done)
	}()
	t.Cleanup(func() {
		select {
		case <-w.done:
		default:
			w.cmd.Process.Kill()
			<-w.done
		}
	})
	return w
}

type lockedWriter struct {
	mu *sync.Mutex
	w  io.Writer
}

func (l *lockedWriter) Write(b []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.w.Write(b)
}

func (w *watcher) has(re *regexp.Regexp) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, l := range w.lines {
		if re.MatchString(l) {
			return true
		}
	}
	return false
}

func (w *watcher) errText() string {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.stderr.String()
}

func (w *watcher) wait(t *testing.T) int {
	t.Helper()
	select {
	case <-w.done:
	case <-time.After(30 * time.Second):
		t.Fatalf("watch did not end; stdout:\n%s\nstderr:\n%s", strings.Join(w.lines, "\n"), w.errText())
	}
	return w.code
}

var seqLine = regexp.MustCompile(`^\s*(\d+)\s+\+`)

// seqCounts counts how often each event sequence number was printed.
func (w *watcher) seqCounts() map[int]int {
	w.mu.Lock()
	defer w.mu.Unlock()
	m := map[int]int{}
	for _, l := range w.lines {
		if s := seqLine.FindStringSubmatch(l); s != nil {
			var n int
			fmt.Sscan(s[1], &n)
			m[n]++
		}
	}
	return m
}

// TestWatchSurvivesKernelRestart: `exec watch` keeps following while the
// kernel is killed and started again, reconnects with Last-Event-ID, and
// prints every event exactly once — including events committed while it was
// disconnected.
func TestWatchSurvivesKernelRestart(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("researcher", "")
	id := k.CreateExecution("researcher", `{"topic":"restarts"}`)
	wh := a.NextWebhook()
	lease := kt.LeaseOf(wh)
	s1 := a.Submit(id, lease, `{"kind":"tool_call","target":"web_search","args":{"q":"a"}}`)

	w := startWatch(t, []string{"REBUNO_URL=" + k.URL}, "exec", "watch", id[30:])
	waitFor(t, "the watch to show the first step", func() bool { return w.has(regexp.MustCompile(`step\.executing\s+tool_call web_search`)) })

	// A crash: SIGKILL, no shutdown. The watch notices and keeps trying.
	k.Kill()
	waitFor(t, "the watch to report the lost stream", func() bool { return strings.Contains(w.errText(), "reconnecting") })
	k.Restart()
	// Events written right after the restart, while the watch may still be
	// backing off: they must come from the backlog.
	a.Complete(id, s1.StepID, lease, `{"hits":1}`)
	s2 := a.Submit(id, lease, `{"kind":"tool_call","target":"fetch_page","args":{"url":"u"}}`)
	waitFor(t, "the watch to reconnect", func() bool { return w.has(regexp.MustCompile(`fetch_page`)) })

	// A graceful restart as well (SIGTERM closes the stream at once).
	k.Restart()
	a.Complete(id, s2.StepID, lease, `"page"`)
	a.Finish(id, lease, `{"done":true}`)

	if code := w.wait(t); code != 0 {
		t.Fatalf("watch exit %d\nstderr:\n%s", code, w.errText())
	}
	n := len(k.Events(id))
	counts := w.seqCounts()
	for seq := 1; seq <= n; seq++ {
		if counts[seq] != 1 {
			t.Fatalf("event %d printed %d times (want once); lines:\n%s", seq, counts[seq], strings.Join(w.lines, "\n"))
		}
	}
	if len(counts) != n {
		t.Fatalf("printed %d distinct events, the log has %d", len(counts), n)
	}
	if !w.has(regexp.MustCompile(`execution \S+ completed`)) || !w.has(regexp.MustCompile(`output: \{"done":true\}`)) {
		t.Fatalf("no final output:\n%s", strings.Join(w.lines, "\n"))
	}
	if !strings.Contains(w.errText(), "reconnected") {
		t.Fatalf("stderr: %s", w.errText())
	}
}

// TestWatchExitCodes: 4 when the execution fails or is cancelled, 0 when it
// completes, also for --watch on create and --follow on events.
func TestWatchExitCodes(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("researcher", "")
	env := []string{"REBUNO_URL=" + k.URL}

	failed := k.CreateExecution("researcher", `{}`)
	wh := a.NextWebhook()
	k.Must(204, a.Request("POST", "/v0/executions/"+failed+"/fail", []byte(`{"error":"the model refused"}`), kt.LeaseOf(wh)))
	r := cli(t, k, 4, "exec", "watch", failed)
	if !strings.Contains(r.Stdout, "execution.failed") || !strings.Contains(r.Stdout, "the model refused") || r.Stderr != "" {
		t.Fatalf("failed watch: %s", r)
	}
	cli(t, k, 4, "exec", "events", failed, "--follow")
	// A plain read of a failed execution is not an error.
	cli(t, k, 0, "exec", "events", failed)

	// create --watch on an execution that is then cancelled.
	w := startWatch(t, env, "exec", "create", "researcher", `{"x":1}`, "--watch")
	a.NextWebhook()
	waitFor(t, "the created id", func() bool { return w.has(regexp.MustCompile(`^[0-9a-f-]{36}$`)) })
	w.mu.Lock()
	id := w.lines[0]
	w.mu.Unlock()
	cli(t, k, 0, "exec", "cancel", id[28:])
	if code := w.wait(t); code != 4 {
		t.Fatalf("create --watch of a cancelled execution: exit %d", code)
	}
	if !w.has(regexp.MustCompile(`execution \S+ cancelled after .*: client_cancelled`)) {
		t.Fatalf("no cancellation footer:\n%s", strings.Join(w.lines, "\n"))
	}

	done := k.CreateExecution("researcher", `{}`)
	wh = a.NextWebhook()
	a.Finish(done, kt.LeaseOf(wh), `"ok"`)
	r = cli(t, k, 0, "exec", "watch", done)
	if !strings.Contains(r.Stdout, `output: "ok"`) {
		t.Fatalf("completed watch: %s", r)
	}
}

// TestWatchMultilineOutput: verbatim JSON with line breaks (a pretty-printed
// output) must not break the SSE framing: the watch still shows every event,
// the final one included.
func TestWatchMultilineOutput(t *testing.T) {
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("researcher", "")
	id := k.CreateExecution("researcher", "{\n  \"topic\": \"x\"\r\n}")
	wh := a.NextWebhook()
	a.Finish(id, kt.LeaseOf(wh), "{\n  \"answer\": [1,\n 2]\n}")
	r := cli(t, k, 0, "exec", "watch", id, "--json")
	lines := strings.Split(strings.TrimRight(r.Stdout, "\n"), "\n")
	log := k.Events(id)
	if len(lines) != len(log) {
		t.Fatalf("%d lines for %d events:\n%s", len(lines), len(log), r.Stdout)
	}
	last := lines[len(lines)-1]
	if !strings.Contains(last, `"type":"execution.completed"`) || !strings.Contains(last, `"answer": [1,`) {
		t.Fatalf("last line: %s", last)
	}
	plain := cli(t, k, 0, "exec", "watch", id)
	if !strings.Contains(plain.Stdout, `execution.completed     output {"answer":[1,2]}`) {
		t.Fatalf("timeline:\n%s", plain.Stdout)
	}
}
