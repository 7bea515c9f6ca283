package server_test

import (
	"bufio"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// pyAgent is testdata/replica_agent.py, an agent on this project's Python
// SDK, in a child process.
type pyAgent struct {
	ID, Secret string
	URL        string // its webhook
	markers    string
	cmd        *exec.Cmd
	mu         sync.Mutex
	output     strings.Builder
}

// repoRoot is the repository's root folder.
func repoRoot() string {
	_, file, _, _ := runtime.Caller(0)
	return filepath.Join(filepath.Dir(file), "..", "..")
}

// sdkPython is the Python of the SDK's virtualenv (`make
// sdk/python/.venv/.installed`), or $REBUNO_PYTHON. Without one the test is
// skipped, and fails under CI=true.
func sdkPython(t *testing.T) string {
	t.Helper()
	python := os.Getenv("REBUNO_PYTHON")
	if python == "" {
		python = filepath.Join(repoRoot(), "sdk", "python", ".venv", "bin", "python")
	}
	if _, err := os.Stat(python); err != nil {
		const how = "run make sdk/python/.venv/.installed or set REBUNO_PYTHON"
		if os.Getenv("CI") == "true" {
			t.Fatalf("no Python SDK virtualenv under CI: %s", how)
		}
		t.Skipf("no Python SDK virtualenv (%s)", how)
	}
	return python
}

// startPyAgent starts the agent, sending its requests to kernelURL, and
// waits until it serves.
func startPyAgent(t *testing.T, id, kernelURL string, env ...string) *pyAgent {
	t.Helper()
	python := sdkPython(t)
	dir := t.TempDir()
	a := &pyAgent{ID: id, Secret: "secret-" + id + "-0123456789", markers: filepath.Join(dir, "markers")}
	sdk := filepath.Join(repoRoot(), "sdk", "python")
	a.cmd = exec.Command(python, filepath.Join(repoRoot(), "tests", "server", "testdata", "replica_agent.py"))
	a.cmd.Dir = sdk
	a.cmd.Env = append(os.Environ(), "REBUNO_URL="+kernelURL, "REBUNO_AGENT_SECRET="+a.Secret, "AGENT_ID="+id,
		"MARKERS="+a.markers, "REBUNO_LOCAL_RESOURCES="+filepath.Join(dir, "resources"), "PYTHONPATH="+sdk,
		"PYTHONUNBUFFERED=1")
	a.cmd.Env = append(a.cmd.Env, env...)
	a.cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	out, err := a.cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	a.cmd.Stderr = a.cmd.Stdout
	if err := a.cmd.Start(); err != nil {
		t.Fatal(err)
	}
	port := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			line := sc.Text()
			a.mu.Lock()
			a.output.WriteString(line + "\n")
			a.mu.Unlock()
			if p, ok := strings.CutPrefix(line, "PORT "); ok {
				port <- p
			}
		}
		close(port)
	}()
	t.Cleanup(func() {
		a.cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { a.cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(10 * time.Second):
			a.cmd.Process.Kill()
			<-done
		}
		if t.Failed() {
			t.Logf("agent output:\n%s", a.Output())
		}
	})
	select {
	case p, ok := <-port:
		if !ok {
			a.cmd.Wait()
			t.Fatalf("the Python agent exited before serving:\n%s", a.Output())
		}
		a.URL = "http://127.0.0.1:" + p + "/webhook"
	case <-time.After(60 * time.Second):
		t.Fatalf("the Python agent did not serve within 60s:\n%s", a.Output())
	}
	return a
}

// Output is what the agent printed (its log included).
func (a *pyAgent) Output() string {
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.output.String()
}

// bodyRun is one run of a step's body, as the agent marked it.
type bodyRun struct {
	Tool, ExecutionID, StepID string
	Attempt                   int
}

// runs reads every body run marked so far, by step id.
func (a *pyAgent) runs(t *testing.T) map[string][]bodyRun {
	t.Helper()
	data, err := os.ReadFile(a.markers)
	if os.IsNotExist(err) {
		return map[string][]bodyRun{}
	}
	if err != nil {
		t.Fatal(err)
	}
	out := map[string][]bodyRun{}
	lines := strings.Split(string(data), "\n")
	// The last element is "" or a line the agent is still writing.
	for _, line := range lines[:len(lines)-1] {
		f := strings.Fields(line)
		if len(f) != 4 {
			t.Fatalf("marker line %q", line)
		}
		attempt, _ := strconv.Atoi(f[3])
		out[f[2]] = append(out[f[2]], bodyRun{Tool: f[0], ExecutionID: f[1], StepID: f[2], Attempt: attempt})
	}
	return out
}

// register registers the agent with a kernel (any replica) and the lease
// its dispatches get.
func (a *pyAgent) register(t *testing.T, front interface {
	do(method, path string, body []byte, headers map[string]string) (int, []byte)
}, leaseSeconds int) {
	t.Helper()
	status, body := front.do("POST", "/v0/agents", fmt.Appendf(nil, `{"id":%q,"webhook_url":%q,"secret":%q,"lease_timeout_seconds":%d}`,
		a.ID, a.URL, a.Secret, leaseSeconds), nil)
	if status != 201 {
		t.Fatalf("register %s: %d %s", a.ID, status, body)
	}
}
