package cli_test

import (
	"bytes"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/creack/pty"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

var ansiRe = regexp.MustCompile(`\x1b\[[0-9;?]*[A-Za-z]|\x1b[()][0-9A-Za-z]|\r`)

func stripANSI(s string) string { return ansiRe.ReplaceAllString(s, "") }

func regexpMatch(pattern, s string) bool { return regexp.MustCompile(pattern).MatchString(s) }

func writeFileErr(path, s string) error { return os.WriteFile(path, []byte(s), 0o644) }

// terminal is a process on a pseudo-terminal.
type terminal struct {
	t    *testing.T
	f    *os.File
	cmd  *exec.Cmd
	mu   sync.Mutex
	buf  bytes.Buffer
	mark int
	done chan struct{}
	read chan struct{} // closed when the reader hit the end of the output
	err  error
}

func startTerminal(t *testing.T, env []string, args ...string) *terminal {
	t.Helper()
	cmd := exec.Command(kt.Binary(t), args...)
	cmd.Env = cleanEnv(env...)
	f, err := pty.StartWithSize(cmd, &pty.Winsize{Rows: 50, Cols: 200})
	if err != nil {
		t.Fatal(err)
	}
	tm := &terminal{t: t, f: f, cmd: cmd, done: make(chan struct{}), read: make(chan struct{})}
	go func() {
		defer close(tm.read)
		b := make([]byte, 4096)
		for {
			n, err := f.Read(b)
			tm.mu.Lock()
			tm.buf.Write(b[:n])
			tm.mu.Unlock()
			if err != nil {
				break
			}
		}
	}()
	go func() {
		tm.err = cmd.Wait()
		close(tm.done)
	}()
	t.Cleanup(func() {
		select {
		case <-tm.done:
		default:
			cmd.Process.Kill()
			<-tm.done
		}
		f.Close()
	})
	return tm
}

// output is everything the terminal showed so far, without colour codes.
func (tm *terminal) output() string {
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return stripANSI(tm.buf.String())
}

// expect waits until text appears after the previous match and moves the
// mark past it.
func (tm *terminal) expect(text string) {
	tm.t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for {
		out := tm.output()
		if tm.mark <= len(out) {
			if i := strings.Index(out[tm.mark:], text); i >= 0 {
				tm.mark += i + len(text)
				return
			}
		}
		if time.Now().After(deadline) {
			tm.t.Fatalf("terminal did not show %q; it shows:\n%s", text, out)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

func (tm *terminal) send(s string) {
	tm.t.Helper()
	if _, err := tm.f.Write([]byte(s)); err != nil {
		tm.t.Fatal(err)
	}
}

// wait waits for the process to exit and returns its exit code.
func (tm *terminal) wait() int {
	tm.t.Helper()
	select {
	case <-tm.done:
	case <-time.After(20 * time.Second):
		tm.t.Fatalf("process did not exit; terminal shows:\n%s", tm.output())
	}
	// Everything the process wrote before it exited is still readable.
	select {
	case <-tm.read:
	case <-time.After(5 * time.Second):
	}
	if tm.err == nil {
		return 0
	}
	if ee, ok := tm.err.(*exec.ExitError); ok {
		return ee.ExitCode()
	}
	tm.t.Fatal(tm.err)
	return -1
}

// runPTY runs a command to completion on a terminal and returns its output.
func runPTY(t *testing.T, env []string, args ...string) string {
	t.Helper()
	tm := startTerminal(t, env, args...)
	if code := tm.wait(); code != 0 {
		t.Fatalf("%v: exit %d:\n%s", args, code, tm.output())
	}
	tm.mu.Lock()
	defer tm.mu.Unlock()
	return tm.buf.String()
}

var bannerURL = regexp.MustCompile(`url:\s+(http://\S+)`)

func startREPL(t *testing.T, home string, extra ...string) (*terminal, string) {
	t.Helper()
	args := append([]string{"dev", "--db", filepath.Join(home, "rebuno.db"), "--listen-addr", "127.0.0.1:0"}, extra...)
	tm := startTerminal(t, []string{"HOME=" + home, "TERM=xterm-256color"}, args...)
	tm.expect("rebuno> ")
	m := bannerURL.FindStringSubmatch(tm.output())
	if m == nil {
		t.Fatalf("no URL in the banner:\n%s", tm.output())
	}
	return tm, m[1]
}

func getJSON(t *testing.T, url string, v any) {
	t.Helper()
	resp, err := http.Get(url)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %d %s", url, resp.StatusCode, b)
	}
	if err := json.Unmarshal(b, v); err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
}

func newestExecution(t *testing.T, base string) string {
	t.Helper()
	var page struct {
		Executions []struct {
			ID string `json:"id"`
		} `json:"executions"`
	}
	getJSON(t, base+"/v0/executions?limit=1", &page)
	if len(page.Executions) == 0 {
		t.Fatal("no execution")
	}
	return page.Executions[0].ID
}

// TestREPL drives `rebuno dev` on a pseudo-terminal: commands, tab
// completion of verbs and execution ids, watch (stopped by Ctrl-C without
// stopping the kernel), help, errors, history, and quit shutting the kernel
// down gracefully.
func TestREPL(t *testing.T) {
	home := t.TempDir()
	// One delivery attempt: the REPL's executions must be dispatched with the
	// kernel's configured --dispatch-max-attempts (docs/protocol/configuration.md §7).
	tm, base := startREPL(t, home, "--dispatch-max-attempts", "1")

	// An agent whose webhook refuses connections: its executions fail after
	// the single attempt.
	tm.send("agent add --id broken --webhook-url " + closedURL(t) + "/webhook --secret 0123456789abcdef\r")
	tm.expect("Registered agent broken")
	tm.expect("rebuno> ")
	tm.send("exec create broken '{\"topic\": \"repl\"}'\r")
	tm.expect("Created execution")
	tm.expect("follow it: exec watch ")
	tm.expect("rebuno> ")
	id := newestExecution(t, base)

	// Tab completes the verb, then the only execution's short id.
	tm.send("exec wa\t")
	tm.expect("exec watch ")
	tm.send("\t")
	tm.expect(id[28:])
	tm.send("\r")
	tm.expect("dispatch.failed")
	tm.expect("attempt 1 failed")
	tm.expect("execution.failed")
	tm.expect("execution " + id[28:] + " failed")
	tm.expect("dispatch_exhausted")
	tm.expect("rebuno> ")
	var e map[string]any
	getJSON(t, base+"/v0/executions/"+id, &e)
	if e["status"] != "failed" || e["failure_reason"] != "dispatch_exhausted" {
		t.Fatalf("execution %v", e)
	}

	// A live watch, stopped with Ctrl-C: the kernel keeps running.
	hook := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(200) }))
	defer hook.Close()
	tm.send("agent add --id quiet --webhook-url " + hook.URL + "/webhook --secret 0123456789abcdef\r")
	tm.expect("Registered agent quiet")
	tm.send("exec create quiet\r")
	tm.expect("Created execution")
	tm.expect("rebuno> ")
	live := newestExecution(t, base)
	tm.send("exec watch " + live[24:] + "\r")
	tm.expect("dispatch.acked")
	tm.send("\x03")
	tm.expect("stopped watching " + live[28:])
	tm.expect("rebuno> ")
	var health map[string]any
	getJSON(t, base+"/v0/health", &health)

	// The same id rules and errors as the command line.
	tm.send("exec get 12345\r")
	tm.expect("invalid execution id")
	tm.send("executions list\r")
	tm.expect(live[28:])
	tm.expect("running")
	tm.send("frobnicate\r")
	tm.expect(`unknown command "frobnicate"`)
	tm.send("help\r")
	tm.expect("exec create <agent_id> [input]")
	tm.expect("quit | exit")
	tm.send("agents get quiet\r")
	tm.expect("webhook")
	tm.expect("none (every step is allowed)")

	tm.send("quit\r")
	if code := tm.wait(); code != 0 {
		t.Fatalf("quit: exit %d\n%s", code, tm.output())
	}
	if !strings.Contains(tm.output(), "shutting down") {
		t.Fatalf("no graceful shutdown:\n%s", tm.output())
	}
	hist, err := os.ReadFile(filepath.Join(home, ".rebuno_repl_history"))
	if err != nil || !strings.Contains(string(hist), "exec create broken") || !strings.Contains(string(hist), "agents get quiet") {
		t.Fatalf("history: %v %q", err, hist)
	}
}

// TestREPLQuitKeys: Ctrl-C on an empty line and Ctrl-D both shut the kernel
// down cleanly; Ctrl-C on a non-empty line only clears it.
func TestREPLQuitKeys(t *testing.T) {
	for _, key := range []string{"\x03", "\x04"} {
		home := t.TempDir()
		tm, base := startREPL(t, home)
		if key == "\x03" {
			tm.send("exec l")
			tm.send("\x03")
			tm.expect("rebuno> ")
			var health map[string]any
			getJSON(t, base+"/v0/health", &health)
		}
		tm.send(key)
		if code := tm.wait(); code != 0 {
			t.Fatalf("key %q: exit %d\n%s", key, code, tm.output())
		}
		if _, err := http.Get(base + "/v0/health"); err == nil {
			t.Fatalf("key %q: the kernel still answers", key)
		}
	}
}
