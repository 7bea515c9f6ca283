// Command demo tells Rebuno's story in under a minute: it starts a kernel on a
// throwaway SQLite file and an example agent, runs an execution, kills the
// agent with SIGKILL in the middle, starts it again, and shows the recorded
// steps replaying instead of running twice. It cleans up after itself.
//
// `make demo` runs the Python agent written with the SDK
// (examples/python/demo/agent.py, with -python and -script); `make demo-go`
// runs the raw-HTTP Go agent (examples/go-agent, with -agent). Both tell the
// same story: web_search, three fetch_page calls and a local summarize step.
package main

import (
	"bufio"
	"context"
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

	"github.com/rebuno/rebuno/internal/cli"
)

func main() {
	kernelBin := flag.String("kernel", "bin/rebuno", "rebuno binary")
	agentBin := flag.String("agent", "bin/demo-agent", "the Go example agent's binary (when -python is not given)")
	python := flag.String("python", "", "a Python interpreter with the SDK installed: run the Python agent instead")
	script := flag.String("script", "examples/python/demo/agent.py", "the Python agent's script (with -python)")
	flag.Parse()
	log.SetFlags(0)
	agent := goAgent(*agentBin)
	if *python != "" {
		agent = pythonAgent(*python, *script)
	}
	if err := run(*kernelBin, agent); err != nil {
		log.Fatalf("demo failed: %v", err)
	}
}

// exampleAgent says how to start one of the example agents.
type exampleAgent struct {
	about   string
	command func(kernelURL, listen, id, secret string) *exec.Cmd
	// ready bounds the wait for the webhook port: an interpreter takes
	// longer to start than a Go binary.
	ready time.Duration
}

func goAgent(bin string) exampleAgent {
	return exampleAgent{
		about: "the Go example agent (examples/go-agent: raw HTTP, v1 signatures, no SDK)",
		command: func(kernelURL, listen, id, secret string) *exec.Cmd {
			return exec.Command(bin, "-kernel", kernelURL, "-listen", listen, "-id", id, "-secret", secret)
		},
		ready: 5 * time.Second,
	}
}

func pythonAgent(python, script string) exampleAgent {
	return exampleAgent{
		about: fmt.Sprintf("the Python example agent (%s: @tool, step(), the Python SDK)", script),
		command: func(kernelURL, listen, id, secret string) *exec.Cmd {
			cmd := exec.Command(python, script, "--kernel", kernelURL, "--listen", listen, "--id", id, "--secret", secret)
			cmd.Env = append(os.Environ(), "PYTHONUNBUFFERED=1")
			return cmd
		},
		ready: 30 * time.Second,
	}
}

func run(kernelBin string, example exampleAgent) error {
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
		cmd := example.command(kernelURL, agentAddr, "researcher", secret)
		cmd.Stdout, cmd.Stderr = agentLog, agentLog
		if err := cmd.Start(); err != nil {
			return nil, err
		}
		return cmd, waitListening(agentAddr, example.ready)
	}
	say("Starting %s", example.about)
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

	// Follow the execution with the CLI's own timeline (`rebuno exec watch`).
	// When the agent starts the second page fetch, kill it with SIGKILL and
	// start it again at once: the kernel redelivers when the lease lapses,
	// and the steps recorded before the crash replay instead of running twice.
	killed, reran := false, false
	fetches := 0
	var restartErr error
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Second)
	defer cancel()
	final, err := cli.Watch(ctx, created.ID, cli.WatchOptions{URL: kernelURL, Out: os.Stdout, Err: os.Stderr,
		OnEvent: func(ev cli.Event) {
			var p struct {
				Target string `json:"target"`
				Retry  bool   `json:"retry"`
			}
			json.Unmarshal(ev.Payload, &p)
			if ev.Type == "step.executing" && p.Retry {
				reran = true
			}
			if ev.Type != "step.executing" || p.Target != "fetch_page" || killed {
				return
			}
			if fetches++; fetches == 2 {
				killed = true
				agent.Process.Signal(syscall.SIGKILL)
				agent.Wait()
				fmt.Printf("\n    💥 kill -9 the agent in the middle of a step; starting it again. The kernel redelivers when the lease lapses.\n\n")
				agent, restartErr = startAgent()
			}
		}})
	if err != nil {
		return fmt.Errorf("watch: %w", err)
	}
	if restartErr != nil {
		return fmt.Errorf("restart agent: %w", restartErr)
	}
	fmt.Println()
	say("What the agent processes did (their log):")
	agentLog.Sync()
	replays := 0
	if b, err := os.ReadFile(agentLog.Name()); err == nil {
		for _, line := range strings.Split(string(b), "\n") {
			if i := strings.Index(line, ": "); i > 0 && (strings.Contains(line, " run ") || strings.Contains(line, " replay ") || strings.Contains(line, "attempt")) {
				fmt.Println("      " + line[i+2:])
				if strings.Contains(line, " replay ") {
					replays++
				}
			}
		}
	}
	say("The steps recorded before the crash replayed from the log; only the interrupted one ran again.")
	// The demo checks its own story, so that `make test` can rely on it.
	switch {
	case final.Status != "completed":
		return fmt.Errorf("execution ended %s", final.Status)
	case !killed:
		return fmt.Errorf("the agent was never killed")
	case !reran:
		return fmt.Errorf("no step was re-run after the crash")
	case replays == 0:
		return fmt.Errorf("no step replayed after the crash")
	}
	return nil
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

func waitListening(addr string, within time.Duration) error {
	for deadline := time.Now().Add(within); time.Now().Before(deadline); time.Sleep(25 * time.Millisecond) {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return nil
		}
	}
	return fmt.Errorf("agent did not listen on %s within %s", addr, within)
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
