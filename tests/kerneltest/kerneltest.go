// Package kerneltest starts the real rebuno binary and drives it over HTTP,
// as a client and as an agent would. Black-box tests, the benchmark harness
// and the demo build on it.
package kerneltest

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
)

var (
	buildOnce sync.Once
	builtBin  string
	buildErr  error
)

// Binary returns the kernel binary under test: $REBUNO_BIN when set (the
// Makefile builds it with the rebuno_test tag), else one built on first use.
func Binary(tb testing.TB) string {
	if b := os.Getenv("REBUNO_BIN"); b != "" {
		return b
	}
	buildOnce.Do(func() {
		_, file, _, _ := runtime.Caller(0)
		root := filepath.Join(filepath.Dir(file), "..", "..")
		dir, err := os.MkdirTemp("", "rebuno-bin-")
		if err != nil {
			buildErr = err
			return
		}
		builtBin = filepath.Join(dir, "rebuno-test")
		cmd := exec.Command("go", "build", "-tags", "rebuno_test", "-o", builtBin, "./cmd/rebuno")
		cmd.Dir = root
		out, err := cmd.CombinedOutput()
		if err != nil {
			buildErr = fmt.Errorf("go build: %v\n%s", err, out)
		}
	})
	if buildErr != nil {
		tb.Fatal(buildErr)
	}
	return builtBin
}

// Options configure a kernel process.
type Options struct {
	// DB is the database file; empty means a fresh file in a temp dir.
	DB string
	// DBURL, when set, starts `rebuno server` on this Postgres database
	// instead of `rebuno dev` (Token is then required); ReplicaID names the
	// replica.
	DBURL     string
	ReplicaID string
	// Args are extra flags for `rebuno dev` (or `rebuno server`).
	Args []string
	// Env are extra environment variables (NAME=value).
	Env []string
	// ManualClock starts the kernel with REBUNO_TEST_CLOCK=manual.
	ManualClock bool
	Token       string
}

// Kernel is a running kernel process.
type Kernel struct {
	tb     testing.TB
	opt    Options
	URL    string
	addr   string
	cmd    *exec.Cmd
	mu     sync.Mutex
	stderr bytes.Buffer
	exited chan struct{}
	HTTP   *http.Client
}

var urlLine = regexp.MustCompile(`url:\s+http://(\S+)`)

// BackendEnv names the backend a test's kernel runs on when the test does not
// choose one: unset or "sqlite" is `rebuno dev` on a fresh file, "postgres"
// is `rebuno server` on a fresh Postgres database (REBUNO_TEST_POSTGRES_URL),
// so that one suite proves both backends.
const BackendEnv = "REBUNO_TEST_BACKEND"

// BackendToken is the bearer token of a kernel Start puts on Postgres: a
// server refuses to run without one.
const BackendToken = "kerneltest-backend-token"

// OnPostgres reports whether kernels started without a database run on Postgres.
func OnPostgres() bool { return os.Getenv(BackendEnv) == "postgres" }

// SQLiteOnly skips a test of what only `rebuno dev` has (its database file,
// its REPL) when the suite runs on Postgres.
func SQLiteOnly(tb testing.TB, why string) {
	tb.Helper()
	if OnPostgres() {
		tb.Skipf("rebuno dev only (%s): not part of the Postgres run", why)
	}
}

// Start launches the kernel (`rebuno dev`, or `rebuno server` with DBURL or
// on the Postgres backend) and waits until it is ready.
func Start(tb testing.TB, opt Options) *Kernel {
	tb.Helper()
	if opt.DB == "" && opt.DBURL == "" {
		if OnPostgres() {
			opt.DBURL = pgtest.NewDatabase(tb)
			if opt.Token == "" {
				opt.Token = BackendToken
			}
		} else {
			opt.DB = filepath.Join(tb.TempDir(), "rebuno.db")
		}
	}
	k := &Kernel{tb: tb, opt: opt, addr: "127.0.0.1:0", HTTP: &http.Client{Timeout: 30 * time.Second}}
	k.start()
	tb.Cleanup(k.Stop)
	return k
}

// Remote is a handle on a kernel this harness did not start (replicas behind
// a load balancer, say): requests go to url with the bearer token; Kill,
// Stop and Restart do nothing.
func Remote(tb testing.TB, url, token string) *Kernel {
	return &Kernel{tb: tb, opt: Options{Token: token}, URL: url, HTTP: &http.Client{Timeout: 30 * time.Second}}
}

func (k *Kernel) start() {
	k.tb.Helper()
	args := []string{"dev", "--db", k.opt.DB, "--listen-addr", k.addr, "--no-repl"}
	if k.opt.DBURL != "" {
		args = []string{"server", "--db-url", k.opt.DBURL, "--listen-addr", k.addr}
		if k.opt.ReplicaID != "" {
			args = append(args, "--replica-id", k.opt.ReplicaID)
		}
	}
	args = append(args, k.opt.Args...)
	if k.opt.Token != "" {
		args = append(args, "--bearer-token", k.opt.Token)
	}
	cmd := exec.Command(Binary(k.tb), args...)
	cmd.Env = append(os.Environ(), k.opt.Env...)
	if k.opt.ManualClock {
		cmd.Env = append(cmd.Env, "REBUNO_TEST_CLOCK=manual")
	}
	pr, pw := io.Pipe()
	cmd.Stderr = pw
	cmd.Stdout = io.Discard
	if err := cmd.Start(); err != nil {
		k.tb.Fatalf("start kernel: %v", err)
	}
	k.cmd = cmd
	k.exited = make(chan struct{})
	found := make(chan string, 1)
	go func() {
		sc := bufio.NewScanner(pr)
		sc.Buffer(make([]byte, 1<<20), 1<<20)
		sent := false
		url := ""
		for sc.Scan() {
			line := sc.Text()
			k.mu.Lock()
			k.stderr.WriteString(line + "\n")
			k.mu.Unlock()
			if m := urlLine.FindStringSubmatch(line); m != nil && url == "" {
				url = m[1]
			}
			// The banner ends with the provisioned agents line: once it is
			// read, tests can inspect the whole banner.
			if url != "" && !sent && strings.Contains(line, "provisioned agents:") {
				found <- url
				sent = true
			}
		}
	}()
	go func() {
		cmd.Wait()
		pw.Close()
		close(k.exited)
	}()
	select {
	case addr := <-found:
		k.addr = addr
		k.URL = "http://" + addr
	case <-k.exited:
		k.tb.Fatalf("kernel exited during startup:\n%s", k.Stderr())
	case <-time.After(30 * time.Second):
		k.tb.Fatalf("kernel did not start:\n%s", k.Stderr())
	}
	k.waitReady()
}

func (k *Kernel) waitReady() {
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		resp, err := http.Get(k.URL + "/v0/ready")
		if err == nil {
			resp.Body.Close()
			if resp.StatusCode == 200 {
				return
			}
		}
		time.Sleep(10 * time.Millisecond)
	}
	k.tb.Fatalf("kernel not ready:\n%s", k.Stderr())
}

// Stderr returns what the kernel logged so far.
func (k *Kernel) Stderr() string {
	k.mu.Lock()
	defer k.mu.Unlock()
	return k.stderr.String()
}

// CPUTime is the CPU time (user and system) the kernel process has used,
// read from /proc.
func (k *Kernel) CPUTime() time.Duration {
	k.tb.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", k.cmd.Process.Pid))
	if err != nil {
		k.tb.Fatal(err)
	}
	// Fields after the command name, which is parenthesised and may hold
	// spaces: utime and stime are the 12th and 13th of them, in clock ticks
	// (100 per second on Linux).
	fields := strings.Fields(string(b[bytes.LastIndexByte(b, ')')+1:]))
	utime, _ := strconv.ParseInt(fields[11], 10, 64)
	stime, _ := strconv.ParseInt(fields[12], 10, 64)
	return time.Duration(utime+stime) * 10 * time.Millisecond
}

// Kill ends the process with SIGKILL: no shutdown, no flush.
func (k *Kernel) Kill() {
	if k.cmd == nil {
		return
	}
	k.cmd.Process.Signal(syscall.SIGKILL)
	<-k.exited
	k.cmd = nil
}

// Stop ends the process with SIGTERM and waits for it.
func (k *Kernel) Stop() {
	if k.cmd == nil {
		return
	}
	k.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-k.exited:
	case <-time.After(20 * time.Second):
		k.cmd.Process.Kill()
		<-k.exited
	}
	k.cmd = nil
}

// Restart starts the kernel again on the same database and port.
func (k *Kernel) Restart() {
	k.tb.Helper()
	if k.exited == nil {
		return // Remote
	}
	k.Stop()
	k.start()
}

// Response is a finished HTTP exchange.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into v, failing the test on error.
func (r *Response) JSON(tb testing.TB, v any) {
	tb.Helper()
	if err := json.Unmarshal(r.Body, v); err != nil {
		tb.Fatalf("decode %q: %v", r.Body, err)
	}
}

// Map decodes the body as a JSON object.
func (r *Response) Map(tb testing.TB) map[string]any {
	tb.Helper()
	var m map[string]any
	r.JSON(tb, &m)
	return m
}

// Code returns the error envelope's code ("" when there is none).
func (r *Response) Code() string {
	var m struct{ Code string }
	json.Unmarshal(r.Body, &m)
	return m.Code
}

func (r *Response) String() string { return fmt.Sprintf("%d %s", r.Status, r.Body) }

// Do sends a request with the kernel's bearer token (if any) and headers.
func (k *Kernel) Do(method, path string, body []byte, headers map[string]string) *Response {
	k.tb.Helper()
	req, err := http.NewRequest(method, k.URL+path, bytes.NewReader(body))
	if err != nil {
		k.tb.Fatal(err)
	}
	k.Authorize(req)
	if len(body) > 0 {
		req.Header.Set("Content-Type", "application/json")
	}
	for name, v := range headers {
		req.Header.Set(name, v)
	}
	return k.send(req)
}

// Authorize adds the kernel's bearer token to a request built by hand; a
// kernel without one (rebuno dev's default) takes the request as it is.
func (k *Kernel) Authorize(req *http.Request) {
	if k.opt.Token != "" {
		req.Header.Set("Authorization", "Bearer "+k.opt.Token)
	}
}

func (k *Kernel) send(req *http.Request) *Response {
	k.tb.Helper()
	resp, err := k.HTTP.Do(req)
	if err != nil {
		k.tb.Fatalf("%s %s: %v", req.Method, req.URL, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		k.tb.Fatalf("read %s %s: %v", req.Method, req.URL, err)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}
}

// Must fails the test unless the response has the given status.
func (k *Kernel) Must(status int, r *Response) *Response {
	k.tb.Helper()
	if r.Status != status {
		k.tb.Fatalf("want status %d, got %s", status, r)
	}
	return r
}

// AdvanceClock moves the manual test clock.
func (k *Kernel) AdvanceClock(d time.Duration) {
	k.tb.Helper()
	k.Must(200, k.Do("POST", "/v0/test/clock", fmt.Appendf(nil, `{"advance":%q}`, d.String()), nil))
}

// CreateExecution creates an execution and returns its id.
func (k *Kernel) CreateExecution(agentID string, input string) string {
	k.tb.Helper()
	body := fmt.Sprintf(`{"agent_id":%q,"input":%s}`, agentID, input)
	r := k.Must(201, k.Do("POST", "/v0/executions", []byte(body), nil))
	return r.Map(k.tb)["id"].(string)
}

// Execution reads an execution as a map.
func (k *Kernel) Execution(id string) map[string]any {
	k.tb.Helper()
	return k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil)).Map(k.tb)
}

// Event is an event as tests read it.
type Event struct {
	ExecutionID string         `json:"execution_id"`
	Seq         int64          `json:"event_seq"`
	Type        string         `json:"type"`
	Payload     map[string]any `json:"payload"`
	OccurredAt  string         `json:"occurred_at"`
}

// Events reads the whole log of an execution.
func (k *Kernel) Events(id string) []Event {
	k.tb.Helper()
	var all []Event
	after := int64(0)
	for {
		var page []Event
		k.Must(200, k.Do("GET", fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", id, after), nil, nil)).JSON(k.tb, &page)
		all = append(all, page...)
		if len(page) < 1000 {
			return all
		}
		after = page[len(page)-1].Seq
	}
}

// EventTypes lists the types of an execution's events in order.
func (k *Kernel) EventTypes(id string) []string {
	var out []string
	for _, e := range k.Events(id) {
		out = append(out, e.Type)
	}
	return out
}

// WaitStatus polls until the execution has one of the statuses.
func (k *Kernel) WaitStatus(id string, statuses ...string) map[string]any {
	k.tb.Helper()
	deadline := time.Now().Add(30 * time.Second)
	for {
		e := k.Execution(id)
		for _, s := range statuses {
			if e["status"] == s {
				return e
			}
		}
		if time.Now().After(deadline) {
			k.tb.Fatalf("execution %s is %v, want one of %v", id, e["status"], statuses)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// ---- agents ----

// Webhook is one delivery received by a test agent.
type Webhook struct {
	ExecutionID         string `json:"execution_id"`
	DispatchID          string `json:"dispatch_id"`
	DispatchAttempt     int64  `json:"dispatch_attempt"`
	LeaseTimeoutSeconds int64  `json:"lease_timeout_seconds"`
	Header              http.Header
	Body                []byte
}

// Agent is a test agent: a webhook receiver plus a signing client.
type Agent struct {
	k        *Kernel
	ID       string
	Secret   string
	Webhooks chan Webhook
	// Status is what the receiver answers (200 unless a test changes it).
	mu     sync.Mutex
	status int
	srv    *http.Server
	URL    string
}

// NewAgent starts a receiver and registers the agent with extra register
// fields (JSON members, e.g. `"lease_timeout_seconds":40`).
func (k *Kernel) NewAgent(id string, extra string) *Agent {
	k.tb.Helper()
	a := &Agent{k: k, ID: id, Secret: "secret-" + id + "-0123456789", Webhooks: make(chan Webhook, 1000), status: 200}
	mux := http.NewServeMux()
	mux.HandleFunc("/webhook", func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		var wh Webhook
		json.Unmarshal(body, &wh)
		wh.Header, wh.Body = r.Header.Clone(), body
		a.mu.Lock()
		status := a.status
		a.mu.Unlock()
		w.WriteHeader(status)
		a.Webhooks <- wh
	})
	ln, err := listenLocal()
	if err != nil {
		k.tb.Fatal(err)
	}
	a.srv = &http.Server{Handler: mux}
	go a.srv.Serve(ln)
	k.tb.Cleanup(func() { a.srv.Close() })
	a.URL = "http://" + ln.Addr().String() + "/webhook"
	a.Register(extra)
	return a
}

// Via returns the agent making its requests to another kernel process (a
// replica of the same database), sharing its webhook receiver.
func (a *Agent) Via(k *Kernel) *Agent {
	return &Agent{k: k, ID: a.ID, Secret: a.Secret, Webhooks: a.Webhooks, status: a.status, srv: a.srv, URL: a.URL}
}

// Register (re-)registers the agent with the kernel.
func (a *Agent) Register(extra string) {
	body := fmt.Sprintf(`{"id":%q,"webhook_url":%q,"secret":%q`, a.ID, a.URL, a.Secret)
	if extra != "" {
		body += "," + extra
	}
	a.k.Must(201, a.k.Do("POST", "/v0/agents", []byte(body+"}"), nil))
}

// SetStatus sets the HTTP status the receiver answers webhooks with.
func (a *Agent) SetStatus(status int) {
	a.mu.Lock()
	a.status = status
	a.mu.Unlock()
}

// NextWebhook waits for the next delivery.
func (a *Agent) NextWebhook() Webhook {
	a.k.tb.Helper()
	select {
	case wh := <-a.Webhooks:
		return wh
	case <-time.After(30 * time.Second):
		a.k.tb.Fatalf("agent %s: no webhook within 30s", a.ID)
	}
	return Webhook{}
}

// NoWebhook asserts that no delivery arrives within d.
func (a *Agent) NoWebhook(d time.Duration) {
	a.k.tb.Helper()
	select {
	case wh := <-a.Webhooks:
		a.k.tb.Fatalf("unexpected webhook: %s", wh.Body)
	case <-time.After(d):
	}
}

// Lease is what an agent request carries of its dispatch.
type Lease struct {
	DispatchID string
	Attempt    int64
	// Occurrence, when >= 0, is sent as Rebuno-Step-Occurrence.
	Occurrence int64
}

// LeaseOf returns the lease a webhook grants.
func LeaseOf(wh Webhook) Lease {
	return Lease{DispatchID: wh.DispatchID, Attempt: wh.DispatchAttempt, Occurrence: -1}
}

// Request sends a v1-signed agent request.
func (a *Agent) Request(method, path string, body []byte, lease Lease) *Response {
	a.k.tb.Helper()
	return a.k.send(a.SignedRequest(method, path, body, lease, nil))
}

// SignedRequest builds a v1-signed request; extra headers are added before
// signing.
func (a *Agent) SignedRequest(method, path string, body []byte, lease Lease, extra map[string]string) *http.Request {
	req, err := http.NewRequest(method, a.k.URL+path, bytes.NewReader(body))
	if err != nil {
		a.k.tb.Fatal(err)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Rebuno-Agent-Id", a.ID)
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	req.Header.Set("Rebuno-Timestamp", ts)
	attempt := ""
	if lease.DispatchID != "" {
		req.Header.Set("Rebuno-Dispatch-Id", lease.DispatchID)
	}
	if lease.Attempt > 0 {
		attempt = strconv.FormatInt(lease.Attempt, 10)
		req.Header.Set("Rebuno-Dispatch-Attempt", attempt)
	}
	if lease.Occurrence >= 0 && lease.DispatchID != "" {
		req.Header.Set("Rebuno-Step-Occurrence", strconv.FormatInt(lease.Occurrence, 10))
	}
	for n, v := range extra {
		req.Header.Set(n, v)
	}
	sig := auth.SignV1([]byte(a.Secret), method, req.URL.RequestURI(), ts, req.Header.Get("Rebuno-Dispatch-Id"), attempt, body)
	req.Header.Set("Rebuno-Signature", sig)
	if occ := req.Header.Get("Rebuno-Step-Occurrence"); occ != "" && req.Header.Get("Rebuno-Occurrence-Signature") == "" {
		req.Header.Set("Rebuno-Occurrence-Signature", auth.SignOccurrence([]byte(a.Secret), sig, occ))
	}
	return req
}

// Decision is a step decision as tests read it.
type Decision struct {
	Decision   string          `json:"decision"`
	StepID     string          `json:"step_id"`
	Result     json.RawMessage `json:"result"`
	Error      json.RawMessage `json:"error"`
	ApprovalID string          `json:"approval_id"`
	Reason     string          `json:"reason"`
	RuleID     string          `json:"rule_id"`
	Resources  []any           `json:"resources"`
}

// Submit submits a step and decodes the decision (fails unless 200).
func (a *Agent) Submit(execID string, lease Lease, body string) Decision {
	a.k.tb.Helper()
	r := a.Request("POST", "/v0/executions/"+execID+"/steps", []byte(body), lease)
	var d Decision
	a.k.Must(200, r).JSON(a.k.tb, &d)
	return d
}

// Complete completes a step with a result (fails unless 200).
func (a *Agent) Complete(execID, stepID string, lease Lease, result string) Decision {
	a.k.tb.Helper()
	r := a.Request("POST", "/v0/executions/"+execID+"/steps/"+stepID+"/complete", []byte(`{"result":`+result+`}`), lease)
	var d Decision
	a.k.Must(200, r).JSON(a.k.tb, &d)
	return d
}

// Finish completes the execution with an output (fails unless 204).
func (a *Agent) Finish(execID string, lease Lease, output string) {
	a.k.tb.Helper()
	a.k.Must(204, a.Request("POST", "/v0/executions/"+execID+"/complete", []byte(`{"output":`+output+`}`), lease))
}

// Context returns a context bounded by the test's deadline if it has one.
func Context(tb testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	tb.Cleanup(cancel)
	return ctx
}

// Contains reports whether list holds s.
func Contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// Join is strings.Join for assertion messages.
func Join(l []string) string { return strings.Join(l, ",") }

func listenLocal() (net.Listener, error) { return net.Listen("tcp", "127.0.0.1:0") }
