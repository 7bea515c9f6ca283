// Command go-agent is a Rebuno agent written against the raw HTTP protocol,
// with no SDK: it shows gateway authors every message an agent exchanges with
// the kernel (docs/protocol/sdk.md §1–§2, docs/protocol/steps.md §1–§4, §10).
//
// It runs a small "research" program: search, fetch three pages, summarise.
// Every effect is a step: the kernel says proceed (run it, then report the
// result) or replay (the result is recorded; use it). Kill the process at any
// point and start it again: recorded steps replay instead of running twice.
package main

import (
	"bytes"
	"context"
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log"
	"math/rand/v2"
	"net/http"
	"os"
	"strconv"
	"sync"
	"time"
)

func main() {
	kernelURL := flag.String("kernel", envOr("REBUNO_URL", "http://127.0.0.1:8080"), "kernel base URL")
	listen := flag.String("listen", "127.0.0.1:5000", "address to serve the webhook on")
	agentID := flag.String("id", "researcher", "agent id")
	secret := flag.String("secret", os.Getenv("REBUNO_AGENT_SECRET"), "agent secret (REBUNO_AGENT_SECRET)")
	stepDelay := flag.Duration("step-delay", 400*time.Millisecond, "how long each tool pretends to work")
	flag.Parse()
	if *secret == "" {
		log.Fatal("a secret is required: -secret or REBUNO_AGENT_SECRET")
	}
	a := &agent{kernel: *kernelURL, id: *agentID, secret: []byte(*secret), delay: *stepDelay,
		http: &http.Client{Timeout: 35 * time.Second}, running: map[string]*run{}}
	http.HandleFunc("POST /webhook", a.webhook)
	log.Printf("agent %s listening on http://%s/webhook", a.id, *listen)
	log.Fatal(http.ListenAndServe(*listen, nil))
}

func envOr(name, def string) string {
	if v := os.Getenv(name); v != "" {
		return v
	}
	return def
}

type agent struct {
	kernel string
	id     string
	secret []byte
	delay  time.Duration
	http   *http.Client

	mu      sync.Mutex
	running map[string]*run // by execution id
}

// run is one handler invocation: one attempt of one dispatch.
type run struct {
	executionID string
	dispatchID  string
	attempt     int64
	lease       time.Duration
	cancel      context.CancelFunc
	// occurrences counts, per step identity, the calls made in this attempt,
	// so that a submit whose answer was lost can be re-sent safely (docs/protocol/identity.md §7).
	occurrences map[string]int64
	renewed     time.Time
}

// webhook is step 1–4 of docs/protocol/sdk.md §1: verify, validate, answer at once, run later.
func (a *agent) webhook(w http.ResponseWriter, r *http.Request) {
	body, err := io.ReadAll(io.LimitReader(r.Body, 1<<20))
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	// Webhooks carry the body-only signature: sha256=<hex HMAC of the body>.
	mac := hmac.New(sha256.New, a.secret)
	mac.Write(body)
	want := "sha256=" + hex.EncodeToString(mac.Sum(nil))
	if !hmac.Equal([]byte(r.Header.Get("Rebuno-Signature")), []byte(want)) {
		w.WriteHeader(http.StatusUnauthorized)
		return
	}
	var wh struct {
		ExecutionID         string `json:"execution_id"`
		DispatchID          string `json:"dispatch_id"`
		DispatchAttempt     int64  `json:"dispatch_attempt"`
		LeaseTimeoutSeconds int64  `json:"lease_timeout_seconds"`
	}
	if json.Unmarshal(body, &wh) != nil || wh.ExecutionID == "" || wh.DispatchID == "" {
		w.WriteHeader(http.StatusBadRequest)
		return
	}
	if wh.LeaseTimeoutSeconds == 0 {
		wh.LeaseTimeoutSeconds = 120
	}
	w.WriteHeader(http.StatusOK)

	a.mu.Lock()
	defer a.mu.Unlock()
	if old := a.running[wh.ExecutionID]; old != nil {
		// Dispatch ids of one execution increase; within one dispatch, attempts do.
		newer := wh.DispatchID > old.dispatchID || (wh.DispatchID == old.dispatchID && wh.DispatchAttempt > old.attempt)
		if !newer {
			return
		}
		old.cancel() // the kernel fences the old attempt anyway (docs/protocol/dispatch.md §11)
	}
	ctx, cancel := context.WithCancel(context.Background())
	rn := &run{executionID: wh.ExecutionID, dispatchID: wh.DispatchID, attempt: wh.DispatchAttempt,
		lease: time.Duration(wh.LeaseTimeoutSeconds) * time.Second, cancel: cancel,
		occurrences: map[string]int64{}, renewed: time.Now()}
	a.running[wh.ExecutionID] = rn
	go a.handle(ctx, rn)
}

// errStop ends a handler without reporting anything: the execution is over,
// or a newer attempt owns it.
var errStop = errors.New("stop")

func (a *agent) handle(ctx context.Context, rn *run) {
	defer func() {
		a.mu.Lock()
		if a.running[rn.executionID] == rn {
			delete(a.running, rn.executionID)
		}
		a.mu.Unlock()
		rn.cancel()
	}()
	var exec struct {
		Status string          `json:"status"`
		Input  json.RawMessage `json:"input"`
	}
	if err := a.call(ctx, rn, "GET", "/v0/executions/"+rn.executionID, nil, false, nil, &exec); err != nil {
		log.Printf("%s: read execution: %v", rn.executionID, err)
		return
	}
	if exec.Status == "completed" || exec.Status == "failed" || exec.Status == "cancelled" {
		return
	}
	go a.heartbeat(ctx, rn)
	log.Printf("%s: attempt %d of dispatch %s", short(rn.executionID), rn.attempt, short(rn.dispatchID))

	output, err := a.research(ctx, rn, exec.Input)
	switch {
	case errors.Is(err, errStop), ctx.Err() != nil:
		return
	case err != nil:
		a.call(ctx, rn, "POST", "/v0/executions/"+rn.executionID+"/fail",
			map[string]any{"error": "agent_error: " + err.Error()}, true, nil, nil)
		return
	}
	if err := a.call(ctx, rn, "POST", "/v0/executions/"+rn.executionID+"/complete",
		map[string]any{"output": output}, true, nil, nil); err != nil {
		log.Printf("%s: complete: %v", short(rn.executionID), err)
	}
}

// research is the agent's program. It reads like ordinary code; step() is
// where durability happens.
func (a *agent) research(ctx context.Context, rn *run, input json.RawMessage) (any, error) {
	var in struct {
		Topic string `json:"topic"`
	}
	json.Unmarshal(input, &in)
	if in.Topic == "" {
		in.Topic = "durable execution"
	}
	var hits []string
	if err := a.step(ctx, rn, "tool_call", "web_search", map[string]any{"query": in.Topic}, &hits, func() any {
		return []string{"https://example.org/a", "https://example.org/b", "https://example.org/c"}
	}); err != nil {
		return nil, err
	}
	var pages []string
	for _, url := range hits {
		var page string
		if err := a.step(ctx, rn, "tool_call", "fetch_page", map[string]any{"url": url}, &page, func() any {
			return "contents of " + url
		}); err != nil {
			return nil, err
		}
		pages = append(pages, page)
	}
	var summary string
	if err := a.step(ctx, rn, "local", "summarize", map[string]any{"pages": len(pages)}, &summary, func() any {
		return fmt.Sprintf("%d pages about %s, summarised at %s", len(pages), in.Topic, time.Now().Format(time.Kitchen))
	}); err != nil {
		return nil, err
	}
	return map[string]any{"topic": in.Topic, "sources": hits, "summary": summary}, nil
}

// step submits an effect and either runs body (proceed) or decodes the
// recorded result (replay) into out.
func (a *agent) step(ctx context.Context, rn *run, kind, target string, args, out any, body func() any) error {
	identity := kind + "\x00" + target + "\x00" + mustJSON(args)
	occurrence := rn.occurrences[identity]
	var dec struct {
		Decision string          `json:"decision"`
		StepID   string          `json:"step_id"`
		Result   json.RawMessage `json:"result"`
		Error    json.RawMessage `json:"error"`
		Reason   string          `json:"reason"`
	}
	headers := map[string]string{"Rebuno-Step-Occurrence": strconv.FormatInt(occurrence, 10)}
	err := a.call(ctx, rn, "POST", "/v0/executions/"+rn.executionID+"/steps",
		map[string]any{"kind": kind, "target": target, "args": args}, true, headers, &dec)
	if err != nil {
		return err
	}
	if dec.StepID != "" {
		rn.occurrences[identity] = occurrence + 1
	}
	switch dec.Decision {
	case "replay":
		if len(dec.Error) > 0 {
			return fmt.Errorf("%s failed earlier: %s", target, dec.Error)
		}
		log.Printf("%s:   replay  %s %s", short(rn.executionID), target, mustJSON(args))
		return json.Unmarshal(dec.Result, out)
	case "proceed":
		log.Printf("%s:   run     %s %s", short(rn.executionID), target, mustJSON(args))
		select {
		case <-time.After(a.delay):
		case <-ctx.Done():
			return errStop
		}
		result := body()
		if err := a.call(ctx, rn, "POST", "/v0/executions/"+rn.executionID+"/steps/"+dec.StepID+"/complete",
			map[string]any{"result": result}, true, nil, nil); err != nil {
			return err
		}
		b, _ := json.Marshal(result)
		return json.Unmarshal(b, out)
	case "denied":
		return fmt.Errorf("%s denied: %s", target, dec.Reason)
	default: // blocked, execution_blocked, execution_terminal, rate_limited
		log.Printf("%s: %s on %s; stopping this attempt", short(rn.executionID), dec.Decision, target)
		return errStop
	}
}

func (a *agent) heartbeat(ctx context.Context, rn *run) {
	every := min(30*time.Second, rn.lease/3)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
			if err := a.call(ctx, rn, "POST", "/v0/executions/"+rn.executionID+"/heartbeat", nil, true, nil, nil); errors.Is(err, errStop) {
				rn.cancel()
				return
			}
		}
	}
}

// call sends one signed request. Agent writes carry the dispatch headers so
// the kernel can fence a superseded attempt. Transport failures are retried
// with jittered backoff until the lease would have lapsed (docs/protocol/sdk.md §2).
func (a *agent) call(ctx context.Context, rn *run, method, path string, body any, fenced bool, extra map[string]string, out any) error {
	var raw []byte
	if body != nil {
		raw, _ = json.Marshal(body)
	}
	backoff := 100 * time.Millisecond
	for {
		status, resp, err := a.send(ctx, rn, method, path, raw, fenced, extra)
		if err == nil && status != http.StatusServiceUnavailable {
			if status == http.StatusConflict {
				var env struct{ Code string }
				json.Unmarshal(resp, &env)
				if env.Code == "lease_superseded" || env.Code == "execution_terminal" {
					return errStop
				}
			}
			if status >= 300 {
				return fmt.Errorf("%s %s: %d %s", method, path, status, bytes.TrimSpace(resp))
			}
			if fenced {
				rn.renewed = time.Now()
			}
			if out != nil && len(resp) > 0 {
				return json.Unmarshal(resp, out)
			}
			return nil
		}
		if time.Since(rn.renewed) > rn.lease || ctx.Err() != nil {
			return errStop // let the lease lapse; the kernel redelivers
		}
		sleep := backoff/2 + rand.N(backoff/2+1)
		select {
		case <-time.After(sleep):
		case <-ctx.Done():
			return errStop
		}
		backoff = min(backoff*2, 5*time.Second)
	}
}

// mac is the lowercase hex HMAC-SHA256 of msg under the agent's secret.
func (a *agent) mac(msg []byte) string {
	m := hmac.New(sha256.New, a.secret)
	m.Write(msg)
	return hex.EncodeToString(m.Sum(nil))
}

func (a *agent) send(ctx context.Context, rn *run, method, path string, body []byte, fenced bool, extra map[string]string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, method, a.kernel+path, bytes.NewReader(body))
	if err != nil {
		return 0, nil, err
	}
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	dispatchID, attempt := "", ""
	if fenced {
		dispatchID, attempt = rn.dispatchID, strconv.FormatInt(rn.attempt, 10)
		req.Header.Set("Rebuno-Dispatch-Id", dispatchID)
		req.Header.Set("Rebuno-Dispatch-Attempt", attempt)
	}
	for k, v := range extra {
		req.Header.Set(k, v)
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Rebuno-Agent-Id", a.id)
	req.Header.Set("Rebuno-Timestamp", ts)
	// The v1 signature binds method, target, time, dispatch and body (docs/protocol/auth.md §3).
	msg := fmt.Appendf(nil, "rebuno-request-v1\n%s\n%s\n%s\n%s\n%s\n", method, req.URL.RequestURI(), ts, dispatchID, attempt)
	sig := "v1=" + a.mac(append(msg, body...))
	req.Header.Set("Rebuno-Signature", sig)
	// The request signature does not cover the occurrence; its own signature
	// binds it to this request, so a replay cannot change it.
	if occ := req.Header.Get("Rebuno-Step-Occurrence"); occ != "" {
		req.Header.Set("Rebuno-Occurrence-Signature", "v1="+a.mac([]byte("rebuno-occurrence-v1\n"+sig+"\n"+occ)))
	}
	resp, err := a.http.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	return resp.StatusCode, b, err
}

func mustJSON(v any) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func short(id string) string {
	if len(id) > 8 {
		return id[len(id)-8:]
	}
	return id
}
