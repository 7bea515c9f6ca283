package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
)

// client speaks the kernel's HTTP API as a bearer client and, signing with
// the agent's secret (v1 signatures), as the agent.
type client struct {
	// bases are the kernel's URLs, one per replica; requests go to each in
	// turn, as a load balancer would send them.
	bases   atomic.Pointer[[]string]
	next    atomic.Uint64
	token   string
	agentID string
	secret  []byte
	hc      *http.Client
}

func newClient(base, token, agentID, secret string) *client {
	tr := &http.Transport{
		DialContext:         (&net.Dialer{Timeout: 5 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        2048,
		MaxIdleConnsPerHost: 2048,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
	}
	c := &client{token: token, agentID: agentID, secret: []byte(secret), hc: &http.Client{Transport: tr, Timeout: 60 * time.Second}}
	c.SetBase(base)
	return c
}

// SetBase points the client at a (restarted) kernel.
func (c *client) SetBase(base string) { c.SetBases([]string{base}) }

// SetBases points the client at replicas of one kernel.
func (c *client) SetBases(bases []string) { c.bases.Store(&bases) }

// url is path on the next replica.
func (c *client) url(path string) string {
	bases := *c.bases.Load()
	return bases[c.next.Add(1)%uint64(len(bases))] + path
}

// apiError is a non-success answer.
type apiError struct {
	Method, Path string
	Status       int
	Body         string
}

func (e *apiError) Error() string {
	return fmt.Sprintf("%s %s: %d %s", e.Method, e.Path, e.Status, e.Body)
}

func (c *client) send(req *http.Request, want int) ([]byte, http.Header, error) {
	resp, err := c.hc.Do(req)
	if err != nil {
		return nil, nil, err
	}
	body, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	if err != nil {
		return nil, nil, err
	}
	if resp.StatusCode != want {
		if len(body) > 300 {
			body = body[:300]
		}
		return body, resp.Header, &apiError{Method: req.Method, Path: req.URL.Path, Status: resp.StatusCode, Body: string(body)}
	}
	return body, resp.Header, nil
}

// bearer sends a client request.
func (c *client) bearer(method, path string, body []byte, want int) ([]byte, error) {
	req, err := http.NewRequest(method, c.url(path), bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Authorization", "Bearer "+c.token)
	if body != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	b, _, err := c.send(req, want)
	return b, err
}

// lease is what an agent request carries of its dispatch.
type lease struct {
	DispatchID string
	Attempt    int64
}

// signed sends an agent request with a v1 signature and both dispatch
// headers; occurrence >= 0 adds Rebuno-Step-Occurrence.
func (c *client) signed(method, path string, body []byte, l lease, occurrence int64, want int) ([]byte, http.Header, error) {
	req, err := http.NewRequest(method, c.url(path), bytes.NewReader(body))
	if err != nil {
		return nil, nil, err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	attempt := strconv.FormatInt(l.Attempt, 10)
	h := req.Header
	h.Set("Content-Type", "application/json")
	h.Set("Rebuno-Agent-Id", c.agentID)
	h.Set("Rebuno-Timestamp", ts)
	h.Set("Rebuno-Dispatch-Id", l.DispatchID)
	h.Set("Rebuno-Dispatch-Attempt", attempt)
	sig := auth.SignV1(c.secret, method, req.URL.RequestURI(), ts, l.DispatchID, attempt, body)
	h.Set("Rebuno-Signature", sig)
	if occurrence >= 0 {
		occ := strconv.FormatInt(occurrence, 10)
		h.Set("Rebuno-Step-Occurrence", occ)
		h.Set("Rebuno-Occurrence-Signature", auth.SignOccurrence(c.secret, sig, occ))
	}
	return c.send(req, want)
}

// decision is a step decision.
type decision struct {
	Decision string          `json:"decision"`
	StepID   string          `json:"step_id"`
	Result   json.RawMessage `json:"result"`
}

// register (re-)registers the agent with its receiver's URL.
func (c *client) register(webhookURL string, leaseSeconds int) error {
	body := fmt.Sprintf(`{"id":%q,"webhook_url":%q,"secret":%q,"lease_timeout_seconds":%d}`, c.agentID, webhookURL, c.secret, leaseSeconds)
	_, err := c.bearer("POST", "/v0/agents", []byte(body), http.StatusCreated)
	return err
}

// create creates an execution and returns its id.
func (c *client) create(input string) (string, error) {
	b, err := c.bearer("POST", "/v0/executions", []byte(`{"agent_id":"`+c.agentID+`","input":`+input+`}`), http.StatusCreated)
	if err != nil {
		return "", err
	}
	var e struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(b, &e); err != nil || e.ID == "" {
		return "", fmt.Errorf("create: bad answer %q", b)
	}
	return e.ID, nil
}

// submit proposes a step.
func (c *client) submit(execID string, l lease, body []byte, occurrence int64) (decision, error) {
	var d decision
	b, _, err := c.signed("POST", "/v0/executions/"+execID+"/steps", body, l, occurrence, http.StatusOK)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("submit: bad answer %q", b)
	}
	return d, nil
}

// complete records a step's result.
func (c *client) complete(execID, stepID string, l lease, result string) (decision, error) {
	var d decision
	b, _, err := c.signed("POST", "/v0/executions/"+execID+"/steps/"+stepID+"/complete", []byte(`{"result":`+result+`}`), l, -1, http.StatusOK)
	if err != nil {
		return d, err
	}
	if err := json.Unmarshal(b, &d); err != nil {
		return d, fmt.Errorf("complete: bad answer %q", b)
	}
	return d, nil
}

// finish completes the execution; output may be followed by more members
// (a carried outcome).
func (c *client) finish(execID string, l lease, output string) error {
	_, _, err := c.signed("POST", "/v0/executions/"+execID+"/complete", []byte(`{"output":`+output+`}`), l, -1, http.StatusNoContent)
	return err
}

// ---- webhook receiver ----

// webhook is one delivery as the receiver saw it.
type webhook struct {
	ExecutionID  string `json:"execution_id"`
	DispatchID   string `json:"dispatch_id"`
	Attempt      int64  `json:"dispatch_attempt"`
	LeaseSeconds int64  `json:"lease_timeout_seconds"`
	At           time.Time
}

func (w webhook) lease() lease { return lease{DispatchID: w.DispatchID, Attempt: w.Attempt} }

// receiver is the agent's webhook endpoint. It checks each delivery's
// signature as an agent must (docs/protocol/sdk.md §1), answers 200 at once, and hands the
// delivery to whoever waits for that execution.
type receiver struct {
	secret []byte
	srv    *http.Server
	URL    string

	mu      sync.Mutex
	waiting map[string]chan webhook
	early   map[string]webhook

	Received   atomic.Int64
	BadSig     atomic.Int64
	BadRequest atomic.Int64
}

func newReceiver(secret string) (*receiver, error) {
	r := &receiver{secret: []byte(secret), waiting: map[string]chan webhook{}, early: map[string]webhook{}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	r.srv = &http.Server{Handler: http.HandlerFunc(r.serve), ReadHeaderTimeout: 10 * time.Second, IdleTimeout: 120 * time.Second}
	r.URL = "http://" + ln.Addr().String() + "/webhook"
	go r.srv.Serve(ln)
	return r, nil
}

func (r *receiver) Close() { r.srv.Close() }

func (r *receiver) serve(w http.ResponseWriter, req *http.Request) {
	at := time.Now()
	body, err := io.ReadAll(io.LimitReader(req.Body, 64<<10))
	if err != nil || req.Method != http.MethodPost {
		r.BadRequest.Add(1)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if !hmac.Equal([]byte(req.Header.Get("Rebuno-Signature")), []byte(auth.SignBody(r.secret, body))) {
		r.BadSig.Add(1)
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var wh webhook
	if err := json.Unmarshal(body, &wh); err != nil || wh.ExecutionID == "" || wh.DispatchID == "" {
		r.BadRequest.Add(1)
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	wh.At = at
	w.WriteHeader(http.StatusOK)
	r.Received.Add(1)
	r.mu.Lock()
	if ch, ok := r.waiting[wh.ExecutionID]; ok {
		delete(r.waiting, wh.ExecutionID)
		ch <- wh
	} else if ch, ok := r.waiting[anyExecution]; ok {
		delete(r.waiting, anyExecution)
		ch <- wh
	} else {
		r.early[wh.ExecutionID] = wh
	}
	r.mu.Unlock()
}

// anyExecution, passed to wait, takes the next delivery of any execution:
// for a metric whose client learns the id only at the end (create and wait).
const anyExecution = "*"

// wait returns the next delivery for an execution, which may already have
// arrived.
func (r *receiver) wait(ctx context.Context, execID string, timeout time.Duration) (webhook, error) {
	ch := make(chan webhook, 1)
	r.mu.Lock()
	if wh, ok := r.takeEarly(execID); ok {
		r.mu.Unlock()
		return wh, nil
	}
	r.waiting[execID] = ch
	r.mu.Unlock()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case wh := <-ch:
		return wh, nil
	case <-ctx.Done():
	case <-t.C:
	}
	r.mu.Lock()
	delete(r.waiting, execID)
	r.mu.Unlock()
	// A delivery racing with the give-up is still taken.
	select {
	case wh := <-ch:
		return wh, nil
	default:
	}
	if ctx.Err() != nil {
		return webhook{}, ctx.Err()
	}
	return webhook{}, errors.New("no webhook for execution " + execID + " within " + timeout.String())
}

// takeEarly removes and returns a delivery for execID (any execution's for
// anyExecution) that arrived before anyone waited for it; r.mu is held.
func (r *receiver) takeEarly(execID string) (webhook, bool) {
	if execID != anyExecution {
		wh, ok := r.early[execID]
		delete(r.early, execID)
		return wh, ok
	}
	for id, wh := range r.early {
		delete(r.early, id)
		return wh, true
	}
	return webhook{}, false
}

// start creates an execution and waits for its first delivery. It returns
// the execution id, the delivery, and when the create was sent.
func start(ctx context.Context, c *client, r *receiver, input string) (string, webhook, time.Time, error) {
	sent := time.Now()
	id, err := c.create(input)
	if err != nil {
		return "", webhook{}, sent, err
	}
	wh, err := r.wait(ctx, id, 30*time.Second)
	return id, wh, sent, err
}
