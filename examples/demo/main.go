// Command demo tells Rebuno's story in under a minute on a throwaway kernel,
// and cleans up after itself. It checks its own story and exits non-zero when
// any part of it did not happen, so that `make test` can rely on it.
//
// `make demo` (-python, -script) runs the Python agent of
// examples/python/demo: it edits files in a workspace resource; a write waits
// for a person's approval, which the demo grants; the agent is killed with
// SIGKILL in the middle of a write and started again, and the steps recorded
// before the crash replay; checkpoints are taken along the way; then the demo
// forks the execution at an earlier event, shows the fork's workspace holding
// the earlier content, and lets the fork decide differently (workspace.go).
//
// `make demo-ts` (-node, -script) runs the TypeScript agent of
// examples/typescript/demo, which tells the same story with the TypeScript SDK.
//
// `make demo-go` (-agent) runs the raw-HTTP Go agent of examples/go-agent,
// which has no resources: it tells the crash-and-replay part with web_search,
// three fetch_page calls and a local summarize step (research.go).
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
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/rebuno/rebuno/internal/cli"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func main() {
	kernelBin := flag.String("kernel", "bin/rebuno", "rebuno binary (also used as the command-line client)")
	agentBin := flag.String("agent", "bin/demo-agent", "the Go example agent's binary (when neither -python nor -node is given)")
	python := flag.String("python", "", "a Python interpreter with the SDK installed: run the Python agent's story instead")
	node := flag.String("node", "", "node, to run the TypeScript agent's story instead (the script's package must have tsx and the SDK installed)")
	script := flag.String("script", "examples/python/demo/agent.py", "the agent's script (with -python or -node); its policy.yaml sits beside it")
	flag.Parse()
	log.SetFlags(0)
	var err error
	switch {
	case *python != "":
		err = runWorkspace(*kernelBin, sdkAgent{language: "Python", runner: []string{*python}, script: *script, toolName: "@tool"})
	case *node != "":
		var agent sdkAgent
		if agent, err = typescriptAgent(*node, *script); err == nil {
			err = runWorkspace(*kernelBin, agent)
		}
	default:
		err = runResearch(*kernelBin, goAgent(*agentBin))
	}
	if err != nil {
		log.Fatalf("demo failed: %v", err)
	}
}

// say prints a line of narration.
func say(format string, args ...any) { fmt.Printf("==> "+format+"\n", args...) }

// aside prints an indented remark between timeline lines.
func aside(format string, args ...any) { fmt.Printf("\n    "+format+"\n\n", args...) }

// kernel is a `rebuno dev` process on a throwaway SQLite file.
type kernel struct {
	bin string
	url string
	cmd *exec.Cmd
}

func startKernel(bin, dir string) (*kernel, error) {
	cmd := exec.Command(bin, "dev", "--db", filepath.Join(dir, "rebuno.db"), "--listen-addr", "127.0.0.1:0",
		"--no-repl", "--dispatch-timeout", "2s", "--log-level", "warn")
	url, err := startAndFindURL(cmd)
	if err != nil {
		stop(cmd)
		return nil, fmt.Errorf("start kernel: %w", err)
	}
	return &kernel{bin: bin, url: url, cmd: cmd}, nil
}

// cli runs `rebuno ARGS...` — the command-line client, in process, as a
// terminal would show it — against the kernel, printing the command line and
// its output. head > 0 keeps only that many lines of the output (the command
// line says `| head -N`).
func (k *kernel) cli(head int, args ...string) (string, error) {
	shown := make([]string, len(args))
	for i, a := range args {
		shown[i] = a
		if strings.ContainsAny(a, " \"'") {
			shown[i] = strconv.Quote(a)
		}
	}
	line := "rebuno " + strings.Join(shown, " ")
	if head > 0 {
		line += fmt.Sprintf(" | head -%d", head)
	}
	fmt.Printf("    $ %s\n", line)
	var out bytes.Buffer
	yes, colour := true, term.IsTerminal(int(os.Stdout.Fd())) && os.Getenv("NO_COLOR") == ""
	app := cli.New(cli.Options{In: strings.NewReader(""), Out: &out, Err: &out, FixedURL: k.url,
		TTY: &yes, Color: &colour, Width: 116})
	root := &cobra.Command{Use: "rebuno", SilenceUsage: true, SilenceErrors: true}
	root.AddCommand(app.Commands()...)
	root.SetArgs(args)
	err := root.Execute()
	lines := strings.Split(strings.TrimRight(out.String(), "\n"), "\n")
	if head > 0 && len(lines) > head {
		lines = lines[:head]
	}
	for _, l := range lines {
		fmt.Println(strings.TrimRight("      "+l, " "))
	}
	if err != nil {
		return out.String(), fmt.Errorf("%s: %w", line, err)
	}
	return out.String(), nil
}

// post sends a JSON body and expects the status want.
func (k *kernel) post(path, body string, want int) ([]byte, error) {
	resp, err := http.Post(k.url+path, "application/json", strings.NewReader(body))
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != want {
		return nil, fmt.Errorf("POST %s: %d %s", path, resp.StatusCode, b)
	}
	return b, nil
}

// get reads a JSON answer into v.
func (k *kernel) get(path string, v any) error {
	resp, err := http.Get(k.url + path)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("GET %s: %d %s", path, resp.StatusCode, b)
	}
	return json.Unmarshal(b, v)
}

// registerAgent registers the demo's agent under id with a fresh secret and
// a free address to serve on. A 3-second lease keeps the demo short: the
// kernel notices the crash and redelivers within seconds.
func (k *kernel) registerAgent(id string) (addr, secret string, err error) {
	if addr, err = freeAddr(); err != nil {
		return "", "", err
	}
	secret = fmt.Sprintf("demo-secret-%d", time.Now().UnixNano())
	register := fmt.Sprintf(`{"id":%q,"webhook_url":"http://%s/webhook","secret":%q,"lease_timeout_seconds":3}`, id, addr, secret)
	if _, err := k.post("/v0/agents", register, 201); err != nil {
		return "", "", fmt.Errorf("register agent: %w", err)
	}
	return addr, secret, nil
}

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
				select {
				case found <- m[1]:
				default:
				}
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
		<-done
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

// agentProcess starts and restarts one example agent, logging to a file.
type agentProcess struct {
	start func() *exec.Cmd
	ready time.Duration
	addr  string
	log   *os.File
	cmd   *exec.Cmd
}

func (a *agentProcess) run() error {
	cmd := a.start()
	cmd.Stdout, cmd.Stderr = a.log, a.log
	if err := cmd.Start(); err != nil {
		return err
	}
	a.cmd = cmd
	return waitListening(a.addr, a.ready)
}

// kill ends the agent with SIGKILL: no clean-up, no last words.
func (a *agentProcess) kill() {
	if a.cmd != nil && a.cmd.Process != nil {
		a.cmd.Process.Signal(syscall.SIGKILL)
		a.cmd.Wait()
	}
}

func (a *agentProcess) stop() { stop(a.cmd) }

// lines returns the agent's log so far.
func (a *agentProcess) lines() []string {
	a.log.Sync()
	b, err := os.ReadFile(a.log.Name())
	if err != nil {
		return nil
	}
	return strings.Split(strings.TrimRight(string(b), "\n"), "\n")
}
