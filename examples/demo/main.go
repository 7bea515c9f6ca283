// Command demo tells Rebuno's story in under a minute: it starts a kernel on a
// throwaway SQLite file and the raw-HTTP example agent, runs an execution,
// kills the agent with SIGKILL in the middle, starts it again, and shows the
// recorded steps replaying instead of running twice. It cleans up after
// itself. `make demo` builds the binaries and runs it.
package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"syscall"
	"time"
)

func main() {
	kernelBin := flag.String("kernel", "bin/rebuno", "rebuno binary")
	agentBin := flag.String("agent", "bin/demo-agent", "example agent binary")
	flag.Parse()
	log.SetFlags(0)
	if err := run(*kernelBin, *agentBin); err != nil {
		log.Fatalf("demo failed: %v", err)
	}
}

func run(kernelBin, agentBin string) error {
	dir, err := os.MkdirTemp("", "rebuno-demo-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(dir)

	say("Starting the kernel on a fresh SQLite file in %s", dir)
	kernel := exec.Command(kernelBin, "dev", "--db", filepath.Join(dir, "rebuno.db"), "--listen-addr", "127.0.0.1:0",
		"--no-repl", "--dispatch-timeout", "2s", "--log-level", "warn")
	kernelURL, err := startAndFindURL(kernel)
	if err != nil {
		return fmt.Errorf("start kernel: %w", err)
	}
	defer stop(kernel)

	agentAddr, err := freeAddr()
	if err != nil {
		return err
	}
	secret := fmt.Sprintf("demo-secret-%d", time.Now().UnixNano())
	// A 3-second lease keeps the demo short: the kernel notices the crash
	// and redelivers within seconds.
	register := fmt.Sprintf(`{"id":"researcher","webhook_url":"http://%s/webhook","secret":%q,"lease_timeout_seconds":3}`, agentAddr, secret)
	if _, err := post(kernelURL+"/v0/agents", register, 201); err != nil {
		return fmt.Errorf("register agent: %w", err)
	}
	agentLog, err := os.Create(filepath.Join(dir, "agent.log"))
	if err != nil {
		return err
	}
	startAgent := func() (*exec.Cmd, error) {
		cmd := exec.Command(agentBin, "-kernel", kernelURL, "-listen", agentAddr, "-id", "researcher", "-secret", secret)
		cmd.Stdout, cmd.Stderr = agentLog, agentLog
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return cmd, waitListening(agentAddr)
	}
	say("Starting the example agent (examples/go-agent: raw HTTP, v1 signatures, no SDK)")
	agent, err := startAgent()
	if err != nil {
		return fmt.Errorf("start agent: %w", err)
	}
	defer func() { stop(agent) }()

	body, err := post(kernelURL+"/v0/executions", `{"agent_id":"researcher","input":{"topic":"durable agents"}}`, 201)
	if err != nil {
		return fmt.Errorf("create execution: %w", err)
	}
	var created struct{ ID string }
	json.Unmarshal(body, &created)
	say("Created execution %s; following its event log:\n", created.ID)

	killed := false
	fetches := 0
	var final map[string]any
	err = tail(kernelURL, created.ID, func(ev event) {
		printEvent(ev)
		if ev.Type == "step.executing" && ev.Payload["target"] == "fetch_page" && !killed {
			if fetches++; fetches == 2 {
				killed = true
				agent.Process.Signal(syscall.SIGKILL)
				agent.Wait()
				fmt.Printf("\n    💥 kill -9 the agent in the middle of a step. Restarting it; the kernel redelivers when the lease lapses.\n\n")
				go func() {
					time.Sleep(500 * time.Millisecond)
					if a, err := startAgent(); err == nil {
						agent = a
					}
				}()
			}
		}
	}, func(status string) {
		final = map[string]any{"status": status}
	})
	if err != nil {
		return err
	}
	exe, err := get(kernelURL + "/v0/executions/" + created.ID)
	if err != nil {
		return err
	}
	var e struct {
		Status string          `json:"status"`
		Output json.RawMessage `json:"output"`
	}
	json.Unmarshal(exe, &e)
	fmt.Println()
	say("Execution %s: %s", final["status"], compact(e.Output))
	say("What the agent processes did (their log):")
	agentLog.Sync()
	if b, err := os.ReadFile(agentLog.Name()); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if i := strings.Index(line, ": "); i > 0 && (strings.Contains(line, " run ") || strings.Contains(line, " replay ") || strings.Contains(line, "attempt")) {
				fmt.Println("      " + line[i+2:])
			}
		}
	}
	say("The steps recorded before the crash replayed from the log; only the interrupted one ran again.")
	if e.Status != "completed" {
		return fmt.Errorf("execution ended %s", e.Status)
	}
	return nil
}

type event struct {
	Seq     int64          `json:"event_seq"`
	Type    string         `json:"type"`
	Payload map[string]any `json:"payload"`
}

// tail follows the SSE event log until the end frame.
func tail(base, id string, onEvent func(event), onEnd func(status string)) error {
	resp, err := http.Get(base + "/v0/executions/" + id + "/events/stream")
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 1<<20), 1<<20)
	isEnd := false
	deadline := time.AfterFunc(50*time.Second, func() { resp.Body.Close() })
	defer deadline.Stop()
	for sc.Scan() {
		line := sc.Text()
		switch {
		case line == "event: end":
			isEnd = true
		case strings.HasPrefix(line, "data: ") && isEnd:
			var end struct{ Status string }
			json.Unmarshal([]byte(line[6:]), &end)
			onEnd(end.Status)
			return nil
		case strings.HasPrefix(line, "data: "):
			var ev event
			if err := json.Unmarshal([]byte(line[6:]), &ev); err == nil {
				onEvent(ev)
			}
		}
	}
	return fmt.Errorf("event stream ended before the execution did")
}

func printEvent(ev event) {
	p := ev.Payload
	detail := ""
	switch {
	case strings.HasPrefix(ev.Type, "step."):
		detail = fmt.Sprintf("%-9s %s", p["step_type"], p["target"])
		if p["retry"] == true {
			detail += "  (re-run: its first run never reported)"
		}
	case strings.HasPrefix(ev.Type, "dispatch."):
		detail = fmt.Sprintf("attempt %v", p["attempt"])
		if s, ok := p["status"].(string); ok && ev.Type == "dispatch.lease_expired" {
			detail += " → " + s
		}
	case ev.Type == "execution.failed" || ev.Type == "execution.cancelled":
		detail = fmt.Sprint(p["reason"])
	}
	fmt.Printf("  %3d  %-24s %s\n", ev.Seq, ev.Type, detail)
}

func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

var urlLine = regexp.MustCompile(`url:\s+(http://\S+)`)

func startAndFindURL(cmd *exec.Cmd) (string, error) {
	stderr, err := cmd.StderrPipe()
	if err != nil {
		return "", err
	}
	if err := cmd.Start(); err != nil {
		return "", err
	}
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(stderr)
		for sc.Scan() {
			if m := urlLine.FindStringSubmatch(sc.Text()); m != nil {
				found <- m[1]
			}
		}
	}()
	select {
	case u := <-found:
		return u, nil
	case <-time.After(20 * time.Second):
		return "", fmt.Errorf("no URL in the kernel's banner")
	}
}

func stop(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	done := make(chan struct{})
	go func() { cmd.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		cmd.Process.Kill()
	}
}

func freeAddr() (string, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return "", err
	}
	defer ln.Close()
	return ln.Addr().String(), nil
}

func waitListening(addr string) error {
	for i := 0; i < 200; i++ {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	return fmt.Errorf("agent did not listen on %s", addr)
}

func post(url, body string, want int) ([]byte, error) {
	resp, err := http.Post(url, "application/json", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return nil, fmt.Errorf("%s: %d %s", url, resp.StatusCode, b)
	}
	return b, nil
}

func get(url string) ([]byte, error) {
	resp, err := http.Get(url)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

func compact(b []byte) string {
	var buf bytes.Buffer
	if json.Compact(&buf, b) != nil {
		return string(b)
	}
	return buf.String()
}
