package main

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"

	"github.com/google/uuid"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/wire"
)

// nullKernelArg, as the first argument, makes this binary a null kernel
// instead of the harness (see runNullKernel).
const nullKernelArg = "null-kernel"

// nullKernel answers the requests of the step loop the way the kernel does
// on the wire (agent registration, creates followed by a signed webhook,
// submits answered proceed, completes answered recorded) while recording
// nothing. It pays what any kernel must per request: reading it, checking
// its bearer token or v1 signature, parsing its JSON, hashing a submit's
// step identity and writing the answer. The CEIL metric drives it with P2's
// load to show how many steps per second this machine's loopback HTTP and
// the load generator leave for a kernel that does its work in no time.
type nullKernel struct {
	token   string
	webhook *http.Client

	mu     sync.Mutex
	agents map[string]nullAgent
	owner  map[string]string // execution → agent
}

type nullAgent struct {
	webhookURL string
	secret     []byte
	lease      int64
}

// runNullKernel serves until killed. Its stderr line "url: http://ADDR" is
// what the harness waits for, as with `rebuno dev`.
func runNullKernel(args []string) error {
	token := ""
	for i := 0; i+1 < len(args); i++ {
		if args[i] == "--bearer-token" {
			token = args[i+1]
		}
	}
	if token == "" {
		return fmt.Errorf("%s: --bearer-token is required", nullKernelArg)
	}
	n := &nullKernel{token: token, agents: map[string]nullAgent{}, owner: map[string]string{},
		webhook: &http.Client{Timeout: 10 * time.Second}}
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v0/ready", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("POST /v0/agents", n.register)
	mux.HandleFunc("POST /v0/executions", n.create)
	mux.HandleFunc("POST /v0/executions/{id}/steps", n.submit)
	mux.HandleFunc("POST /v0/executions/{id}/steps/{step}/complete", n.completeStep)
	mux.HandleFunc("POST /v0/executions/{id}/complete", n.completeExecution)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "null kernel (records nothing)\n  url: http://%s\n", ln.Addr())
	srv := &http.Server{Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	return srv.Serve(ln)
}

// nullBody reads a request's body and parses it as the kernel does.
func nullBody(w http.ResponseWriter, r *http.Request) ([]byte, *jsonx.Value, bool) {
	raw, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, nil, false
	}
	v, err := jsonx.Parse(raw, wire.MaxNesting)
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return nil, nil, false
	}
	return raw, v, true
}

// client checks a client request's bearer token and reads its body.
func (n *nullKernel) client(w http.ResponseWriter, r *http.Request) ([]byte, *jsonx.Value, bool) {
	if !auth.BearerOK(r.Header.Get("Authorization"), n.token) {
		http.Error(w, "unauthorized", http.StatusUnauthorized)
		return nil, nil, false
	}
	return nullBody(w, r)
}

func (n *nullKernel) register(w http.ResponseWriter, r *http.Request) {
	raw, _, ok := n.client(w, r)
	if !ok {
		return
	}
	var a struct {
		ID         string `json:"id"`
		WebhookURL string `json:"webhook_url"`
		Secret     string `json:"secret"`
		Lease      int64  `json:"lease_timeout_seconds"`
	}
	if err := json.Unmarshal(raw, &a); err != nil || a.ID == "" || a.Secret == "" {
		http.Error(w, "bad agent", http.StatusBadRequest)
		return
	}
	n.mu.Lock()
	n.agents[a.ID] = nullAgent{webhookURL: a.WebhookURL, secret: []byte(a.Secret), lease: a.Lease}
	n.mu.Unlock()
	w.WriteHeader(http.StatusCreated)
}

func (n *nullKernel) create(w http.ResponseWriter, r *http.Request) {
	_, v, ok := n.client(w, r)
	if !ok {
		return
	}
	agentName := ""
	if a := v.Get("agent_id"); a != nil && a.Kind == jsonx.KindString {
		agentName = a.Str
	}
	n.mu.Lock()
	agent, found := n.agents[agentName]
	execID := uuid.Must(uuid.NewV7()).String()
	if found {
		n.owner[execID] = agentName
	}
	n.mu.Unlock()
	if !found {
		http.Error(w, "unknown agent", http.StatusNotFound)
		return
	}
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(http.StatusCreated)
	fmt.Fprintf(w, `{"id":%q,"status":"pending"}`, execID)
	// Delivered at once, as the kernel's dispatcher does once the create commits.
	go n.deliver(agent, execID)
}

func (n *nullKernel) deliver(a nullAgent, execID string) {
	body := fmt.Appendf(nil, `{"execution_id":%q,"dispatch_id":%q,"dispatch_attempt":1,"lease_timeout_seconds":%d}`,
		execID, uuid.Must(uuid.NewV7()).String(), a.lease)
	req, err := http.NewRequest(http.MethodPost, a.webhookURL, bytes.NewReader(body))
	if err != nil {
		return
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set(wire.HeaderSignature, auth.SignBody(a.secret, body))
	if resp, err := n.webhook.Do(req); err == nil {
		io.Copy(io.Discard, resp.Body)
		resp.Body.Close()
	}
}

// agent checks a signed agent request against its execution's agent.
func (n *nullKernel) agent(w http.ResponseWriter, r *http.Request) ([]byte, *jsonx.Value, bool) {
	raw, v, ok := nullBody(w, r)
	if !ok {
		return nil, nil, false
	}
	n.mu.Lock()
	a, found := n.agents[n.owner[r.PathValue("id")]]
	n.mu.Unlock()
	if !found {
		http.Error(w, "unknown execution", http.StatusNotFound)
		return nil, nil, false
	}
	req := auth.Request{Method: r.Method, Target: r.RequestURI, Header: r.Header, Body: raw}
	if err := auth.Verify(req, a.secret, auth.Options{Now: time.Now(), RequireV1: true}); err != nil {
		http.Error(w, err.Error(), http.StatusUnauthorized)
		return nil, nil, false
	}
	return raw, v, true
}

func (n *nullKernel) submit(w http.ResponseWriter, r *http.Request) {
	_, v, ok := n.agent(w, r)
	if !ok {
		return
	}
	kind, target := v.Get("kind"), v.Get("target")
	if kind == nil || target == nil || kind.Kind != jsonx.KindString || target.Kind != jsonx.KindString {
		http.Error(w, "kind and target are required", http.StatusBadRequest)
		return
	}
	occurrence, _ := strconv.ParseInt(r.Header.Get(wire.HeaderStepOccurrence), 10, 64)
	stepID := identity.StepID(r.PathValue("id"), kind.Str, target.Str,
		identity.ArgsHash(v.Get("args")), occurrence)
	w.Header().Set("Content-Type", "application/json")
	fmt.Fprintf(w, `{"decision":"proceed","step_id":%q,"occurrence":%d,"reason":"","rule_id":"permissive","resources":[]}`,
		stepID, occurrence)
}

func (n *nullKernel) completeStep(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := n.agent(w, r); !ok {
		return
	}
	w.Header().Set("Content-Type", "application/json")
	io.WriteString(w, `{"decision":"recorded"}`)
}

func (n *nullKernel) completeExecution(w http.ResponseWriter, r *http.Request) {
	if _, _, ok := n.agent(w, r); !ok {
		return
	}
	n.mu.Lock()
	delete(n.owner, r.PathValue("id"))
	n.mu.Unlock()
	w.WriteHeader(http.StatusNoContent)
}
