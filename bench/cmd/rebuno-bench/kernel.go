package main

import (
	"bufio"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"time"
)

// kernelProc is one `rebuno dev` process on its own database file, or one
// `rebuno server` replica on a Postgres database (dbURL).
type kernelProc struct {
	bin, db, token string
	dbURL, replica string
	pin            pinning
	gomaxprocs     int
	null           bool // this binary as a null kernel (nullkernel.go), not bin

	cmd    *exec.Cmd
	Pid    int
	URL    string
	exited chan struct{}

	mu     sync.Mutex
	lines  []string // the last lines of stderr
	banner []string
}

const keepLines = 200

var urlLine = regexp.MustCompile(`url:\s+http://(\S+)`)

// startKernel launches the kernel pinned as planned and waits until it is
// ready.
func startKernel(bin, db, token string, pin pinning, gomaxprocs int) (*kernelProc, error) {
	k := &kernelProc{bin: bin, db: db, token: token, pin: pin, gomaxprocs: gomaxprocs}
	return k, k.start()
}

// startReplica launches a `rebuno server` replica on a Postgres database.
func startReplica(bin, dbURL, replica, token string, pin pinning, gomaxprocs int) (*kernelProc, error) {
	k := &kernelProc{bin: bin, dbURL: dbURL, replica: replica, token: token, pin: pin, gomaxprocs: gomaxprocs}
	return k, k.start()
}

// startNullKernel launches this binary as a null kernel, pinned as a kernel
// is.
func startNullKernel(token string, pin pinning, gomaxprocs int) (*kernelProc, error) {
	self, err := os.Executable()
	if err != nil {
		return nil, err
	}
	k := &kernelProc{bin: self, token: token, pin: pin, gomaxprocs: gomaxprocs, null: true}
	return k, k.start()
}

func (k *kernelProc) start() error {
	cmd := exec.Command(k.bin, "dev", "--db", k.db, "--listen-addr", "127.0.0.1:0", "--no-repl", "--bearer-token", k.token)
	if k.dbURL != "" {
		cmd = exec.Command(k.bin, "server", "--db-url", k.dbURL, "--replica-id", k.replica, "--listen-addr", "127.0.0.1:0",
			"--bearer-token", k.token)
	}
	if k.null {
		cmd = exec.Command(k.bin, nullKernelArg, "--bearer-token", k.token)
	}
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "GOMAXPROCS=") && !strings.HasPrefix(kv, "REBUNO_") {
			env = append(env, kv)
		}
	}
	cmd.Env = append(env, fmt.Sprintf("GOMAXPROCS=%d", k.gomaxprocs))
	cmd.Stdout = io.Discard
	// The kernel dies with the harness, however the harness ends.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	if err := startPinned(cmd, k.pin); err != nil {
		return fmt.Errorf("start kernel: %w", err)
	}
	k.cmd, k.Pid = cmd, cmd.Process.Pid
	k.exited = make(chan struct{})
	k.mu.Lock()
	k.banner = nil
	k.mu.Unlock()
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 64<<10), 1<<20)
		sent := false
		for sc.Scan() {
			line := sc.Text()
			k.mu.Lock()
			k.lines = append(k.lines, line)
			if len(k.lines) > keepLines {
				k.lines = k.lines[len(k.lines)-keepLines:]
			}
			if len(k.banner) < 20 {
				k.banner = append(k.banner, line)
			}
			k.mu.Unlock()
			if m := urlLine.FindStringSubmatch(line); m != nil && !sent {
				found <- m[1]
				sent = true
			}
		}
		io.Copy(io.Discard, pr)
	}()
	go func() {
		cmd.Wait()
		pw.Close()
		close(k.exited)
	}()
	select {
	case addr := <-found:
		k.URL = "http://" + addr
	case <-k.exited:
		return fmt.Errorf("kernel exited during startup:\n%s", k.Log())
	case <-time.After(60 * time.Second):
		k.Kill()
		return fmt.Errorf("kernel did not print its URL within 60s:\n%s", k.Log())
	}
	deadline := time.Now().Add(30 * time.Second)
	for {
		resp, err := http.Get(k.URL + "/v0/ready")
		if err == nil {
			io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return nil
			}
		}
		if time.Now().After(deadline) {
			k.Kill()
			return fmt.Errorf("kernel not ready within 30s:\n%s", k.Log())
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Log returns the last lines the kernel wrote to stderr.
func (k *kernelProc) Log() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return strings.Join(k.lines, "\n")
}

// StoreLine is the banner's description of the store (it states durability).
// The banner is printed in one go at startup; the line may trail the URL
// line by a moment.
func (k *kernelProc) StoreLine() string {
	deadline := time.Now().Add(2 * time.Second)
	for {
		k.mu.Lock()
		for _, l := range k.banner {
			if s, ok := strings.CutPrefix(strings.TrimSpace(l), "store:"); ok {
				k.mu.Unlock()
				return strings.TrimSpace(s)
			}
		}
		k.mu.Unlock()
		if time.Now().After(deadline) {
			return "unknown"
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// Stop ends the kernel with SIGTERM (a clean shutdown) and waits for it.
func (k *kernelProc) Stop() {
	if k.cmd == nil {
		return
	}
	k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(30 * time.Second):
		k.cmd.Process.Kill()
		<-k.exited
	}
	k.cmd = nil
}

// Kill ends the kernel with SIGKILL.
func (k *kernelProc) Kill() {
	if k.cmd == nil {
		return
	}
	k.cmd.Process.Kill()
	<-k.exited
	k.cmd = nil
}

// Restart stops the kernel and starts it again on the same database.
func (k *kernelProc) Restart() error {
	k.Stop()
	return k.start()
}

// CPU is the CPU time the kernel has used so far.
func (k *kernelProc) CPU() time.Duration {
	d, _ := procCPU(k.Pid)
	return d
}

// RSS returns the kernel's resident memory and its peak, in bytes.
func (k *kernelProc) RSS() (cur, peak int64) { return rss(k.Pid) }

// AllowedCPUs is the kernel's Cpus_allowed_list, to verify the pinning.
func (k *kernelProc) AllowedCPUs() string {
	st, err := procStatus(k.Pid)
	if err != nil {
		return "unknown"
	}
	return st["Cpus_allowed_list"]
}

// kernelVersion runs `<kernel> version`.
func kernelVersion(bin string) string {
	out, err := exec.Command(bin, "version").CombinedOutput()
	if err != nil {
		return "unknown (" + strings.TrimSpace(string(out)) + ")"
	}
	return strings.TrimSpace(string(out))
}
