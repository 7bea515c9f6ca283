package blackbox

// Black-box tests of webhook dispatch (docs/protocol/dispatch.md) and of leases, heartbeats,
// reclaim and fencing (docs/protocol/dispatch.md §8–§12), driven by the manual test clock.

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"regexp"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// cxDelivery is one webhook a cxHook received.
type cxDelivery struct {
	kt.Webhook
	Method string
	Path   string
	At     time.Time
}

// cxHook is a webhook receiver whose answer the test programs: a status
// with headers, a redirect, or a hang until the kernel gives up.
type cxHook struct {
	t      *testing.T
	srv    *httptest.Server
	mu     sync.Mutex
	answer func(w http.ResponseWriter, r *http.Request)
	got    chan cxDelivery
	strays chan string
	stop   chan struct{} // closed at clean-up: hanging answers return
}

func cxNewHook(t *testing.T) *cxHook {
	h := &cxHook{t: t, got: make(chan cxDelivery, 100), strays: make(chan string, 100), stop: make(chan struct{})}
	h.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		if r.URL.Path != "/webhook" {
			h.strays <- r.Method + " " + r.URL.Path
			return
		}
		var d cxDelivery
		json.Unmarshal(body, &d.Webhook)
		d.Header, d.Body, d.Method, d.Path, d.At = r.Header.Clone(), body, r.Method, r.URL.Path, time.Now()
		h.got <- d
		h.mu.Lock()
		answer := h.answer
		h.mu.Unlock()
		if answer == nil {
			w.WriteHeader(200)
			return
		}
		answer(w, r)
	}))
	t.Cleanup(func() {
		close(h.stop)
		h.srv.Close()
	})
	return h
}

func (h *cxHook) set(answer func(w http.ResponseWriter, r *http.Request)) {
	h.mu.Lock()
	h.answer = answer
	h.mu.Unlock()
}

// cxStatus answers with a status and header pairs.
func cxStatus(code int, headers ...string) func(http.ResponseWriter, *http.Request) {
	return func(w http.ResponseWriter, r *http.Request) {
		for i := 0; i+1 < len(headers); i += 2 {
			w.Header().Set(headers[i], headers[i+1])
		}
		w.WriteHeader(code)
		io.WriteString(w, "not today")
	}
}

// hang never answers; it returns when the kernel abandons the request or
// the test ends.
func (h *cxHook) hang(w http.ResponseWriter, r *http.Request) {
	select {
	case <-r.Context().Done():
	case <-h.stop:
	}
}

func (h *cxHook) next(id string, attempt int64) cxDelivery {
	h.t.Helper()
	select {
	case d := <-h.got:
		if d.ExecutionID != id || d.DispatchAttempt != attempt {
			h.t.Fatalf("want webhook of %s attempt %d, got %s", id, attempt, d.Body)
		}
		return d
	case <-time.After(10 * time.Second):
		h.t.Fatalf("no webhook of %s attempt %d within 10s", id, attempt)
	}
	return cxDelivery{}
}

func (h *cxHook) none(d time.Duration) {
	h.t.Helper()
	select {
	case got := <-h.got:
		h.t.Fatalf("unexpected webhook: %s", got.Body)
	case <-time.After(d):
	}
}

// cxHookAgent registers an agent whose webhooks go to a programmable hook.
func cxHookAgent(t *testing.T, k *kt.Kernel, id, extra string) (*kt.Agent, *cxHook) {
	a := k.NewAgent(id, extra)
	h := cxNewHook(t)
	a.URL = h.srv.URL + "/webhook"
	a.Register(extra)
	return a, h
}

var cxUUIDv7 = regexp.MustCompile(`^[0-9a-f]{8}-[0-9a-f]{4}-7[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$`)

// TestWebhookRequest checks the exact webhook of docs/protocol/dispatch.md §4 — body bytes, headers,
// body-only signature — and that it is sent at once, without polling.
func TestWebhookRequest(t *testing.T) {
	k := kt.Start(t, kt.Options{Args: []string{"--dispatch-lease-timeout", "90s"}})
	plain, plainHook := cxHookAgent(t, k, "plain", "")
	leased, leasedHook := cxHookAgent(t, k, "leased", `"lease_timeout_seconds":40`)

	for i := 0; i < 6; i++ {
		a, h, lease := plain, plainHook, 90
		if i%2 == 1 {
			a, h, lease = leased, leasedHook, 40
		}
		start := time.Now()
		id := k.CreateExecution(a.ID, `{"n":1}`)
		d := h.next(id, 1)
		if took := d.At.Sub(start); took > 500*time.Millisecond {
			t.Fatalf("webhook arrived %v after the create was sent", took)
		}
		evs := cxEvents(t, k, id)
		if evs[2].Type != "dispatch.queued" || evs[2].str("status") != "pending" || evs[2].num("attempt") != 0 {
			t.Fatalf("dispatch.queued: %v", evs[2])
		}
		dispatchID := evs[2].str("dispatch_id")
		if !cxUUIDv7.MatchString(dispatchID) {
			t.Fatalf("dispatch id %q is not a lowercase UUIDv7", dispatchID)
		}
		want := fmt.Sprintf(`{"execution_id":"%s","dispatch_id":"%s","dispatch_attempt":1,"lease_timeout_seconds":%d}`, id, dispatchID, lease)
		if string(d.Body) != want {
			t.Fatalf("webhook body\n got %s\nwant %s", d.Body, want)
		}
		if d.Method != "POST" {
			t.Fatalf("webhook method %s", d.Method)
		}
		for name, v := range map[string]string{
			"Content-Type":            "application/json",
			"Rebuno-Agent-Id":         a.ID,
			"Rebuno-Execution-Id":     id,
			"Rebuno-Dispatch-Id":      dispatchID,
			"Rebuno-Dispatch-Attempt": "1",
			"Rebuno-Signature":        auth.SignBody([]byte(a.Secret), []byte(want)),
		} {
			if got := d.Header.Values(name); len(got) != 1 || got[0] != v {
				t.Fatalf("header %s: got %q, want %q", name, got, v)
			}
		}
		if ua := d.Header.Get("User-Agent"); !strings.HasPrefix(ua, "rebuno-kernel/") {
			t.Fatalf("User-Agent %q", ua)
		}
		// An agent verifies it as a body-only signature (docs/protocol/sdk.md §1), and it is
		// bound to these bytes and to this secret.
		req := auth.Request{Method: "POST", Target: "/webhook", Header: d.Header, Body: d.Body}
		if err := auth.Verify(req, []byte(a.Secret), auth.Options{Now: time.Now()}); err != nil {
			t.Fatalf("webhook signature does not verify: %v", err)
		}
		req.Body = []byte(strings.Replace(want, `"dispatch_attempt":1`, `"dispatch_attempt":2`, 1))
		if auth.Verify(req, []byte(a.Secret), auth.Options{Now: time.Now()}) == nil {
			t.Fatalf("webhook signature verifies another body")
		}
		if auth.Verify(auth.Request{Method: "POST", Target: "/webhook", Header: d.Header, Body: d.Body}, []byte("other"), auth.Options{Now: time.Now()}) == nil {
			t.Fatalf("webhook signature verifies under another secret")
		}
		acked := cxWaitEvent(t, k, id, "dispatch.acked", cxIsEvent("dispatch.acked", 1))
		if acked.str("dispatch_id") != dispatchID || acked.str("execution_id") != id || acked.str("status") != "acked" {
			t.Fatalf("dispatch.acked: %v", acked)
		}
	}
}

// TestWebhookSecretAtDelivery: each attempt is sent to the agent's URL and
// signed with its secret as they are when it is delivered (docs/protocol/dispatch.md §4).
func TestWebhookSecretAtDelivery(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a, h := cxHookAgent(t, k, "agent-d", "")
	h.set(cxStatus(503))
	id := k.CreateExecution(a.ID, `null`)
	h.next(id, 1)
	cxWaitEvent(t, k, id, "failure 1", cxIsEvent("dispatch.failed", 1))
	moved := cxNewHook(t)
	oldSecret := a.Secret
	a.Secret = "a-brand-new-secret"
	a.URL = moved.srv.URL + "/webhook"
	a.Register("")
	k.AdvanceClock(1300 * time.Millisecond)
	d := moved.next(id, 2)
	if got := d.Header.Get("Rebuno-Signature"); got != auth.SignBody([]byte(a.Secret), d.Body) || got == auth.SignBody([]byte(oldSecret), d.Body) {
		t.Fatalf("retry signed %s", got)
	}
	h.none(10 * time.Millisecond)
}

// TestSlowWebhookDoesNotDelayOthers: each delivery is independent (docs/protocol/dispatch.md §3).
func TestSlowWebhookDoesNotDelayOthers(t *testing.T) {
	k := kt.Start(t, kt.Options{Args: []string{"--dispatch-timeout", "5s"}})
	slow, slowHook := cxHookAgent(t, k, "slow", "")
	slowHook.set(slowHook.hang)
	fast, fastHook := cxHookAgent(t, k, "fast", "")
	for i := 0; i < 3; i++ {
		slowHook.next(k.CreateExecution(slow.ID, `null`), 1)
	}
	start := time.Now()
	id := k.CreateExecution(fast.ID, `null`)
	if d := fastHook.next(id, 1); d.At.Sub(start) > 500*time.Millisecond {
		t.Fatalf("a webhook waited %v behind hanging deliveries", d.At.Sub(start))
	}
}

// TestDispatchFailedDeliveries: a non-2xx answer, a redirect or a timeout is
// a failed attempt (docs/protocol/dispatch.md §5), recorded with its cause and retried only when the
// backoff delay has passed on the kernel's clock (docs/protocol/dispatch.md §6).
func TestDispatchFailedDeliveries(t *testing.T) {
	cases := []struct {
		name   string
		answer func(h *cxHook) func(http.ResponseWriter, *http.Request)
		status int64 // 0: no response
	}{
		{"500", func(*cxHook) func(http.ResponseWriter, *http.Request) { return cxStatus(500) }, 500},
		{"404", func(*cxHook) func(http.ResponseWriter, *http.Request) { return cxStatus(404) }, 404},
		{"401", func(*cxHook) func(http.ResponseWriter, *http.Request) { return cxStatus(401) }, 401},
		{"302", func(h *cxHook) func(http.ResponseWriter, *http.Request) {
			return cxStatus(302, "Location", h.srv.URL+"/elsewhere")
		}, 302},
		{"307", func(h *cxHook) func(http.ResponseWriter, *http.Request) {
			return cxStatus(307, "Location", h.srv.URL+"/elsewhere")
		}, 307},
		{"timeout", func(h *cxHook) func(http.ResponseWriter, *http.Request) { return h.hang }, 0},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel() // each has its own kernel; nothing here measures latency
			k := kt.Start(t, kt.Options{ManualClock: true,
				Args: []string{"--dispatch-backoff-base", "1s", "--dispatch-timeout", "300ms"}})
			a, h := cxHookAgent(t, k, "agent-d", "")
			h.set(c.answer(h))
			id := k.CreateExecution(a.ID, `null`)
			first := h.next(id, 1)
			failed := cxWaitEvent(t, k, id, "dispatch.failed", cxIsEvent("dispatch.failed", 1))
			if failed.str("status") != "failed" || failed.str("dispatch_id") != first.DispatchID || failed.str("execution_id") != id {
				t.Fatalf("dispatch.failed: %v", failed)
			}
			if _, has := failed.Payload["http_status"]; has != (c.status != 0) || (has && failed.num("http_status") != c.status) {
				t.Fatalf("dispatch.failed http_status: %v", failed)
			}
			if msg := failed.str("error"); msg == "" || len(msg) > 256 {
				t.Fatalf("dispatch.failed error %q", msg)
			}
			if k.Execution(id)["status"] != "running" {
				t.Fatalf("one failed delivery ended the execution")
			}
			// No redelivery until the kernel's clock passes the delay.
			h.set(nil)
			h.none(cxQuiet)
			k.AdvanceClock(1300 * time.Millisecond)
			second := h.next(id, 2)
			want := fmt.Sprintf(`{"execution_id":"%s","dispatch_id":"%s","dispatch_attempt":2,"lease_timeout_seconds":120}`, id, first.DispatchID)
			if string(second.Body) != want || second.Header.Get("Rebuno-Dispatch-Attempt") != "2" ||
				second.Header.Get("Rebuno-Dispatch-Id") != first.DispatchID {
				t.Fatalf("retry: %s %v", second.Body, second.Header)
			}
			cxWaitEvent(t, k, id, "dispatch.acked", cxIsEvent("dispatch.acked", 2))
			select {
			case s := <-h.strays:
				t.Fatalf("the kernel followed a redirect: %s", s)
			default:
			}
			types := cxTypes(cxEvents(t, k, id))
			if strings.Join(types, ",") != "execution.created,execution.started,dispatch.queued,dispatch.failed,dispatch.acked" {
				t.Fatalf("events: %v", types)
			}
		})
	}
}

// TestWebhookAckWithoutBody: a 2xx is an ack as soon as its headers arrive;
// the kernel reads at most 64 KiB of the body within the same deadline and
// does not wait for the rest (docs/protocol/dispatch.md §4, §5).
func TestWebhookAckWithoutBody(t *testing.T) {
	k := kt.Start(t, kt.Options{Args: []string{"--dispatch-timeout", "300ms"}})
	cases := map[string]func(h *cxHook) func(http.ResponseWriter, *http.Request){
		"hanging body": func(h *cxHook) func(http.ResponseWriter, *http.Request) {
			return func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(202)
				w.(http.Flusher).Flush()
				h.hang(w, r)
			}
		},
		"endless body": func(h *cxHook) func(http.ResponseWriter, *http.Request) {
			return func(w http.ResponseWriter, r *http.Request) {
				w.WriteHeader(200)
				chunk := []byte(strings.Repeat("z", 4096))
				for {
					if _, err := w.Write(chunk); err != nil {
						return
					}
					select {
					case <-h.stop:
						return
					default:
					}
				}
			}
		},
	}
	for name, answer := range cases {
		a, h := cxHookAgent(t, k, strings.ReplaceAll(name, " ", "-"), "")
		h.set(answer(h))
		id := k.CreateExecution(a.ID, `null`)
		h.next(id, 1)
		acked := cxWaitEvent(t, k, id, name+" ack", func(ev cxRawEvent) bool {
			return ev.Type == "dispatch.acked" || ev.Type == "dispatch.failed"
		})
		if acked.Type != "dispatch.acked" {
			t.Fatalf("%s: %v", name, acked)
		}
	}
}

// TestDeliveryOutcomeAfterTerminal: a delivery that ends after its execution
// became terminal writes nothing (docs/protocol/dispatch.md §5, docs/protocol/executions.md §9).
func TestDeliveryOutcomeAfterTerminal(t *testing.T) {
	k := kt.Start(t, kt.Options{Args: []string{"--dispatch-timeout", "2s"}})
	release := make(chan int)
	answered := make(chan struct{}, 10)
	a, h := cxHookAgent(t, k, "agent-d", "")
	h.set(func(w http.ResponseWriter, r *http.Request) {
		defer func() { answered <- struct{}{} }()
		select {
		case code := <-release:
			w.WriteHeader(code)
		case <-r.Context().Done():
		case <-h.stop:
		}
	})
	for _, code := range []int{200, 500} {
		id := k.CreateExecution(a.ID, `null`)
		h.next(id, 1)
		k.Must(204, k.Do("POST", "/v0/executions/"+id+"/cancel", nil, nil))
		n := len(cxEvents(t, k, id))
		release <- code
		<-answered
		time.Sleep(cxQuiet)
		if evs := cxEvents(t, k, id); len(evs) != n {
			t.Fatalf("a %d answer after the cancel was recorded: %v", code, evs[n:])
		}
	}
}

// TestDispatchBackoff checks delay(n) = min(base × 2^(n−1), max) + jitter.
func TestDispatchBackoff(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--dispatch-backoff-base", "1s",
		"--dispatch-backoff-max", "2s", "--dispatch-max-attempts", "10"}})
	a, h := cxHookAgent(t, k, "agent-d", "")
	h.set(cxStatus(500))
	id := k.CreateExecution(a.ID, `null`)
	h.next(id, 1)
	cxWaitEvent(t, k, id, "failure 1", cxIsEvent("dispatch.failed", 1))
	h.none(cxQuiet)
	k.AdvanceClock(1300 * time.Millisecond) // delay(1) is in [1 s, 1.25 s)
	h.next(id, 2)
	cxWaitEvent(t, k, id, "failure 2", cxIsEvent("dispatch.failed", 2))
	k.AdvanceClock(1500 * time.Millisecond) // delay(2) is in [2 s, 2.5 s)
	h.none(cxQuiet)
	k.AdvanceClock(1100 * time.Millisecond)
	h.next(id, 3)
	cxWaitEvent(t, k, id, "failure 3", cxIsEvent("dispatch.failed", 3))
	k.AdvanceClock(1900 * time.Millisecond) // delay(3) is capped: [2 s, 2.5 s), not 4 s
	h.none(cxQuiet)
	h.set(nil)
	k.AdvanceClock(700 * time.Millisecond)
	// Retries are timed on the clock, not on a polling tick.
	advanced := time.Now()
	if d := h.next(id, 4); d.At.Sub(advanced) > 500*time.Millisecond {
		t.Fatalf("retry delivered %v after it became due", d.At.Sub(advanced))
	}
	cxWaitEvent(t, k, id, "ack 4", cxIsEvent("dispatch.acked", 4))
}

// TestDispatchRetryAfter: Retry-After (seconds) on 429 and 503 raises the
// delay, capped at 60 s; other statuses and date values do not.
func TestDispatchRetryAfter(t *testing.T) {
	cases := []struct {
		name          string
		answer        func(http.ResponseWriter, *http.Request)
		early, enough time.Duration
	}{
		{"503", cxStatus(503, "Retry-After", "10"), 9 * time.Second, 1500 * time.Millisecond},
		{"429", cxStatus(429, "Retry-After", "100"), 59 * time.Second, 1500 * time.Millisecond},
		{"500 ignores it", cxStatus(500, "Retry-After", "10"), 0, 1300 * time.Millisecond},
		{"503 with a date", cxStatus(503, "Retry-After", "Wed, 21 Oct 2015 07:28:00 GMT"), 0, 1300 * time.Millisecond},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			t.Parallel()
			k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--dispatch-backoff-base", "1s"}})
			a, h := cxHookAgent(t, k, "agent-d", "")
			h.set(c.answer)
			id := k.CreateExecution(a.ID, `null`)
			h.next(id, 1)
			cxWaitEvent(t, k, id, "dispatch.failed", cxIsEvent("dispatch.failed", 1))
			h.set(nil)
			if c.early > 0 {
				k.AdvanceClock(c.early)
				h.none(cxQuiet)
			}
			k.AdvanceClock(c.enough)
			h.next(id, 2)
		})
	}
}

// TestDispatchExhaustion: after --dispatch-max-attempts failed deliveries
// the execution fails with dispatch_exhausted, in the transaction of the
// last failure, with the clean-up of docs/protocol/executions.md §9 (docs/protocol/dispatch.md §7, docs/protocol/events.md §3).
func TestDispatchExhaustion(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--dispatch-max-attempts", "3"}})
	a, h := cxHookAgent(t, k, "agent-d", "")
	h.set(cxStatus(500))
	id := k.CreateExecution(a.ID, `null`)
	d1 := h.next(id, 1)
	cxWaitEvent(t, k, id, "failure 1", cxIsEvent("dispatch.failed", 1))
	// The agent started anyway and has a step running.
	e := &cxEnv{t: t, k: k, a: a, id: id}
	open := e.proceed(kt.LeaseOf(d1.Webhook), `{"kind":"tool_call","target":"t"}`)
	k.AdvanceClock(1300 * time.Millisecond)
	h.next(id, 2)
	cxWaitEvent(t, k, id, "failure 2", cxIsEvent("dispatch.failed", 2))
	k.AdvanceClock(2600 * time.Millisecond)
	h.next(id, 3)
	ex := k.WaitStatus(id, "failed")
	if ex["failure_reason"] != "dispatch_exhausted" {
		t.Fatalf("exhausted execution: %v", ex)
	}
	evs := cxEvents(t, k, id)
	want := "execution.created,execution.started,dispatch.queued,dispatch.failed,step.proposed,step.allowed," +
		"step.executing,dispatch.failed,dispatch.failed,execution.failed,step.cancelled"
	if strings.Join(cxTypes(evs), ",") != want {
		t.Fatalf("events:\n got %v\nwant %s", cxTypes(evs), want)
	}
	last := evs[len(evs)-3:]
	if last[0].num("attempt") != 3 || last[0].num("http_status") != 500 || last[1].str("reason") != "dispatch_exhausted" ||
		last[2].str("step_id") != open || last[1].OccurredAt != last[0].OccurredAt || last[2].OccurredAt != last[0].OccurredAt {
		t.Fatalf("exhaustion transaction: %v", last)
	}
	cxSameRaw(t, "clean-up error", last[2].Payload["error"], `{"reason":"execution_failed"}`)
	h.set(nil)
	k.AdvanceClock(time.Hour)
	h.none(cxQuiet)
	if n := len(cxEvents(t, k, id)); n != len(evs) {
		t.Fatalf("events after exhaustion: %v", cxEvents(t, k, id)[len(evs):])
	}
}

// TestDispatchProgressResetsBudget: a recorded step outcome resets the
// attempt budget and the backoff (docs/protocol/dispatch.md §6, §7).
func TestDispatchProgressResetsBudget(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--dispatch-max-attempts", "2"}})
	a, h := cxHookAgent(t, k, "agent-d", "")
	e := &cxEnv{t: t, k: k, a: a}
	h.set(cxStatus(500))
	e.id = k.CreateExecution(a.ID, `null`)
	h.next(e.id, 1)
	cxWaitEvent(t, k, e.id, "failure 1", cxIsEvent("dispatch.failed", 1))
	h.set(nil)
	k.AdvanceClock(1300 * time.Millisecond)
	l2 := kt.LeaseOf(h.next(e.id, 2).Webhook)
	cxWaitEvent(t, k, e.id, "ack 2", cxIsEvent("dispatch.acked", 2))
	s := e.proceed(l2, `{"kind":"tool_call","target":"t"}`)
	if d := e.record(s, l2, "complete", `{"result":1}`); d.Decision != "recorded" {
		t.Fatalf("complete: %+v", d)
	}
	// Attempt 2 made progress, so its lease expiry and one more failure do
	// not spend a budget of 2, and the backoff starts again at the base.
	h.set(cxStatus(500))
	k.AdvanceClock(121 * time.Second)
	h.next(e.id, 3)
	expired := cxWaitEvent(t, k, e.id, "lease expiry", cxIsEvent("dispatch.lease_expired", 2))
	if expired.str("status") != "pending" {
		t.Fatalf("lease expiry after progress: %v", expired)
	}
	cxWaitEvent(t, k, e.id, "failure 3", cxIsEvent("dispatch.failed", 3))
	if st := k.Execution(e.id)["status"]; st != "running" {
		t.Fatalf("execution %v after attempt 3", st)
	}
	h.none(cxQuiet)
	k.AdvanceClock(1300 * time.Millisecond)
	h.next(e.id, 4)
	ex := k.WaitStatus(e.id, "failed")
	if ex["failure_reason"] != "dispatch_exhausted" {
		t.Fatalf("execution: %v", ex)
	}
	evs := cxEvents(t, k, e.id)
	if tail := strings.Join(cxTypes(evs[len(evs)-2:]), ","); tail != "dispatch.failed,execution.failed" || evs[len(evs)-2].num("attempt") != 4 {
		t.Fatalf("exhaustion: %v", evs[len(evs)-2:])
	}
}

// TestDispatchProgressWhileRetrying: progress_attempt is the highest attempt
// whose step outcome was recorded (docs/protocol/dispatch.md §7, docs/protocol/steps.md §10 step 4), also when that attempt's
// delivery failed and the agent ran the handler anyway: the renewal has no
// effect on a dispatch that is not in flight, the progress still counts.
func TestDispatchProgressWhileRetrying(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--dispatch-max-attempts", "2"}})
	a, h := cxHookAgent(t, k, "agent-d", "")
	e := &cxEnv{t: t, k: k, a: a}
	h.set(cxStatus(500))
	e.id = k.CreateExecution(a.ID, `null`)
	l1 := kt.LeaseOf(h.next(e.id, 1).Webhook)
	cxWaitEvent(t, k, e.id, "failure 1", cxIsEvent("dispatch.failed", 1))
	s := e.proceed(l1, `{"kind":"tool_call","target":"t"}`)
	if d := e.record(s, l1, "complete", `{"result":1}`); d.Decision != "recorded" {
		t.Fatalf("complete: %+v", d)
	}
	k.AdvanceClock(1300 * time.Millisecond)
	h.next(e.id, 2)
	cxWaitEvent(t, k, e.id, "failure 2", cxIsEvent("dispatch.failed", 2))
	// 2 − 1 < 2: attempt 2 does not spend the budget.
	if st := k.Execution(e.id)["status"]; st != "running" {
		t.Fatalf("execution %v: attempt 1's recorded outcome did not count as progress", st)
	}
	h.set(nil)
	k.AdvanceClock(1300 * time.Millisecond) // the backoff restarted at the base
	h.next(e.id, 3)
}

// TestLeaseExpiry: an expired lease is reclaimed and redelivered at once
// under the same dispatch id as attempt+1, with the agent's lease or the
// kernel default (docs/protocol/dispatch.md §10, §3).
func TestLeaseExpiry(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true, Args: []string{"--dispatch-lease-timeout", "60s"}})
	a := k.NewAgent("leased", `"lease_timeout_seconds":40`)
	b := k.NewAgent("defaulted", "")
	ea := &cxEnv{t: t, k: k, a: a}
	eb := &cxEnv{t: t, k: k, a: b}
	ea.id, ea.wh = ea.create()
	eb.id, eb.wh = eb.create()
	if ea.wh.LeaseTimeoutSeconds != 40 || eb.wh.LeaseTimeoutSeconds != 60 {
		t.Fatalf("leases %d and %d", ea.wh.LeaseTimeoutSeconds, eb.wh.LeaseTimeoutSeconds)
	}
	cxWaitEvent(t, k, ea.id, "ack", cxIsEvent("dispatch.acked", 1))
	cxWaitEvent(t, k, eb.id, "ack", cxIsEvent("dispatch.acked", 1))
	// A new lease applies from the next claim only.
	a.Register(`"lease_timeout_seconds":50`)

	k.AdvanceClock(39 * time.Second)
	a.NoWebhook(cxQuiet)
	b.NoWebhook(10 * time.Millisecond)
	k.AdvanceClock(2 * time.Second)
	advanced := time.Now()
	wh := ea.nextWebhook(ea.id, 2)
	// Reclaim within 1 s of expiry (docs/protocol/dispatch.md §10), then redelivery at once.
	if took := time.Since(advanced); took > 1500*time.Millisecond {
		t.Fatalf("expired lease reclaimed and redelivered %v after it expired", took)
	}
	if wh.DispatchID != ea.wh.DispatchID || wh.LeaseTimeoutSeconds != 50 {
		t.Fatalf("redelivery: %s", wh.Body)
	}
	exp := cxWaitEvent(t, k, ea.id, "lease expiry", cxIsEvent("dispatch.lease_expired", 1))
	if exp.str("status") != "pending" || exp.str("dispatch_id") != wh.DispatchID || exp.str("execution_id") != ea.id {
		t.Fatalf("dispatch.lease_expired: %v", exp)
	}
	cxWaitEvent(t, k, ea.id, "ack 2", cxIsEvent("dispatch.acked", 2))
	evs := cxEvents(t, k, ea.id)
	if got := strings.Join(cxTypes(evs[3:]), ","); got != "dispatch.acked,dispatch.lease_expired,dispatch.acked" {
		t.Fatalf("events: %v", evs)
	}
	b.NoWebhook(10 * time.Millisecond)
	k.AdvanceClock(20 * time.Second)
	if wh := eb.nextWebhook(eb.id, 2); wh.LeaseTimeoutSeconds != 60 || wh.DispatchID != eb.wh.DispatchID {
		t.Fatalf("default-lease redelivery: %s", wh.Body)
	}
	// Attempt 2 of the first agent runs on its 50 s lease, claimed at +41 s.
	a.NoWebhook(10 * time.Millisecond)
	k.AdvanceClock(29 * time.Second)
	a.NoWebhook(cxQuiet)
	k.AdvanceClock(2 * time.Second)
	ea.nextWebhook(ea.id, 3)
}

// TestLeaseRenewal: heartbeats, submits and recorded outcomes renew the
// lease; replays, errors and reads do not (docs/protocol/dispatch.md §8, §9).
func TestLeaseRenewal(t *testing.T) {
	// Requests without an attempt header need the legacy-compatible mode.
	e := cxStart(t, kt.Options{ManualClock: true, Args: []string{legacyOn}}, `"lease_timeout_seconds":40`)
	cxWaitEvent(t, e.k, e.id, "ack", cxIsEvent("dispatch.acked", 1))
	l := e.lease
	// Each renewal below moves the expiry to now + 40 s; 30 s later, 60 s
	// after the renewal before it, the lease still holds.
	e.k.AdvanceClock(30 * time.Second)
	e.k.Must(204, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, l))
	e.k.AdvanceClock(30 * time.Second) // 60 s after the claim, 30 s after the heartbeat
	e.a.NoWebhook(cxQuiet)
	// A heartbeat without dispatch headers renews the live dispatch (docs/protocol/dispatch.md §8).
	e.k.Must(204, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, kt.Lease{Occurrence: -1}))
	e.k.AdvanceClock(30 * time.Second)
	e.a.NoWebhook(cxQuiet)
	s := e.proceed(l, `{"kind":"tool_call","target":"t"}`)
	e.k.AdvanceClock(30 * time.Second)
	e.a.NoWebhook(cxQuiet)
	if d := e.record(s, l, "complete", `{"result":1}`); d.Decision != "recorded" {
		t.Fatalf("complete: %+v", d)
	}
	e.k.AdvanceClock(30 * time.Second)
	e.a.NoWebhook(cxQuiet)
	// A submit answered replay renews too.
	if d, _ := e.submit(cxWithOccurrence(l, 0), `{"kind":"tool_call","target":"t"}`); d.Decision != "replay" {
		t.Fatalf("replay: %+v", d)
	}
	e.k.AdvanceClock(30 * time.Second)
	e.a.NoWebhook(cxQuiet)
	// None of these renews.
	if d := e.record(s, l, "complete", `{"result":1}`); d.Decision != "replay" {
		t.Fatalf("second complete: %+v", d)
	}
	cxExpectCode(t, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", []byte(`{}`), l), 400, "validation_error")
	e.k.Must(200, e.a.Request("GET", "/v0/executions/"+e.id, nil, l))
	e.k.Must(204, e.a.Request("POST", "/v0/executions/"+e.id+"/steps/"+s+"/stream", []byte(`{"seq":0,"data":"x"}`), l))
	e.k.AdvanceClock(11 * time.Second)
	wh := e.nextWebhook(e.id, 2)
	if wh.DispatchID != e.wh.DispatchID {
		t.Fatalf("redelivery: %s", wh.Body)
	}
}

// TestAckRenewsLease: the ack renews the lease from the time it is recorded
// (docs/protocol/dispatch.md §5), not from the claim.
func TestAckRenewsLease(t *testing.T) {
	k := kt.Start(t, kt.Options{ManualClock: true})
	a, h := cxHookAgent(t, k, "agent-d", `"lease_timeout_seconds":40`)
	release := make(chan struct{})
	h.set(func(w http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-h.stop:
		}
		w.WriteHeader(200)
	})
	id := k.CreateExecution(a.ID, `null`)
	h.next(id, 1)                    // claimed: the lease runs to +40 s
	k.AdvanceClock(30 * time.Second) // the agent answers 30 s later
	close(release)
	cxWaitEvent(t, k, id, "ack", cxIsEvent("dispatch.acked", 1)) // now to +70 s
	k.AdvanceClock(30 * time.Second)
	h.none(cxQuiet)
	k.AdvanceClock(11 * time.Second)
	h.next(id, 2)
}

// TestFencingAfterReclaim: once a lease is reclaimed, the old attempt can
// report the outcome of a step still executing and nothing else (docs/protocol/dispatch.md §11).
func TestFencingAfterReclaim(t *testing.T) {
	// Requests without an attempt header need the legacy-compatible mode.
	e := cxStart(t, kt.Options{ManualClock: true, Args: []string{legacyOn}}, `"lease_timeout_seconds":40`)
	l1 := e.lease
	done := e.proceed(l1, `{"kind":"tool_call","target":"done"}`)
	e.record(done, l1, "complete", `{"result":"first"}`)
	open1 := e.proceed(l1, `{"kind":"tool_call","target":"open1"}`)
	open2 := e.proceed(l1, `{"kind":"tool_call","target":"open2"}`)
	open3 := e.proceed(l1, `{"kind":"tool_call","target":"open3"}`)
	e.k.AdvanceClock(41 * time.Second)
	l2 := kt.LeaseOf(e.nextWebhook(e.id, 2))
	cxWaitEvent(t, e.k, e.id, "ack 2", cxIsEvent("dispatch.acked", 2))
	n := len(e.rawEvents(e.id))

	superseded := []struct {
		what string
		r    *kt.Response
	}{
		{"submit of a new step", e.a.Request("POST", "/v0/executions/"+e.id+"/steps", []byte(`{"kind":"tool_call","target":"new"}`), l1)},
		{"submit of an executing step", e.a.Request("POST", "/v0/executions/"+e.id+"/steps", []byte(`{"kind":"tool_call","target":"open1"}`), l1)},
		{"submit with an occurrence", e.a.Request("POST", "/v0/executions/"+e.id+"/steps", []byte(`{"kind":"tool_call","target":"done"}`), cxWithOccurrence(l1, 0))},
		{"heartbeat", e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, l1)},
		{"execution complete", e.agentCall(e.id, "complete", `{"output":1}`, l1)},
		{"execution fail", e.agentCall(e.id, "fail", `{"error":"x"}`, l1)},
		{"complete of a succeeded step", e.outcomeIn(e.id, done, l1, "complete", `{"result":"again"}`)},
		{"fail of a succeeded step", e.outcomeIn(e.id, done, l1, "fail", `{"error":"again"}`)},
	}
	for _, c := range superseded {
		if c.r.Status != 409 || c.r.Code() != "lease_superseded" {
			t.Fatalf("%s from the old attempt: %s", c.what, c.r)
		}
	}
	if got := len(e.rawEvents(e.id)); got != n {
		t.Fatalf("superseded requests wrote %d events", got-n)
	}
	if e.k.Execution(e.id)["status"] != "running" {
		t.Fatalf("a superseded complete ended the execution")
	}

	// The effects the old attempt started ran: their outcomes are recorded.
	if d := e.record(open1, l1, "complete", `{"result":"late"}`); d.Decision != "recorded" {
		t.Fatalf("old attempt completes an executing step: %+v", d)
	}
	if d := e.record(open2, l1, "fail", `{"error":"late"}`); d.Decision != "recorded" {
		t.Fatalf("old attempt fails an executing step: %+v", d)
	}
	evs := e.rawEvents(e.id)[n:]
	if strings.Join(cxTypes(evs), ",") != "step.succeeded,step.failed" || evs[0].str("step_id") != open1 || evs[1].str("step_id") != open2 {
		t.Fatalf("recorded late outcomes: %v", evs)
	}
	// Now terminal, those steps are fenced like any other.
	cxExpectCode(t, e.outcomeIn(e.id, open1, l1, "complete", `{"result":"later"}`), 409, "lease_superseded")

	// The current attempt replays what the old one recorded.
	if d, r := e.submit(l2, `{"kind":"tool_call","target":"done"}`); d.Decision != "replay" || string(d.Result) != `"first"` {
		t.Fatalf("replay of done: %s", r.Body)
	}
	if d, r := e.submit(l2, `{"kind":"tool_call","target":"open1"}`); d.Decision != "replay" || string(d.Result) != `"late"` {
		t.Fatalf("replay of open1: %s", r.Body)
	}
	if d, r := e.submit(l2, `{"kind":"tool_call","target":"open2"}`); d.Decision != "replay" || string(d.Error) != `"late"` {
		t.Fatalf("replay of open2: %s", r.Body)
	}
	if d, r := e.submit(l2, `{"kind":"tool_call","target":"open3"}`); d.Decision != "proceed" || d.StepID != open3 {
		t.Fatalf("re-run of open3: %s", r.Body)
	}
	// A request naming the dispatch without an attempt is never superseded by
	// attempt; one naming an attempt the kernel has not made is 400.
	noAttempt := l1
	noAttempt.Attempt = 0
	e.k.Must(204, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, noAttempt))
	ahead := l2
	ahead.Attempt = 3
	cxExpectCode(t, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, ahead), 400, "validation_error")
	// The current attempt finishes; the old one learns the execution is over.
	e.k.Must(204, e.agentCall(e.id, "complete", `{"output":"ok"}`, l2))
	cxExpectCode(t, e.agentCall(e.id, "complete", `{"output":1}`, l1), 409, "execution_terminal")
	cxExpectCode(t, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, l1), 409, "execution_terminal")
	if d, _ := e.submit(l1, `{"kind":"tool_call","target":"new"}`); d.Decision != "execution_terminal" {
		t.Fatalf("old attempt submit on a terminal execution: %+v", d)
	}
}

// TestLeaseExhaustion: lease expiries spend the attempt budget like failed
// deliveries (docs/protocol/dispatch.md §7, §10).
func TestLeaseExhaustion(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true, Args: []string{"--dispatch-max-attempts", "2"}}, `"lease_timeout_seconds":40`)
	open := e.proceed(e.lease, `{"kind":"tool_call","target":"t"}`)
	cxWaitEvent(t, e.k, e.id, "ack 1", cxIsEvent("dispatch.acked", 1))
	e.k.AdvanceClock(41 * time.Second)
	e.nextWebhook(e.id, 2)
	// The ack renews the lease when the kernel records it: wait for it so
	// that the next advance is measured from it.
	cxWaitEvent(t, e.k, e.id, "ack 2", cxIsEvent("dispatch.acked", 2))
	e.k.AdvanceClock(41 * time.Second)
	ex := e.k.WaitStatus(e.id, "failed")
	if ex["failure_reason"] != "dispatch_exhausted" {
		t.Fatalf("execution: %v", ex)
	}
	evs := e.rawEvents(e.id)
	last := evs[len(evs)-3:]
	if strings.Join(cxTypes(last), ",") != "dispatch.lease_expired,execution.failed,step.cancelled" ||
		last[0].str("status") != "exhausted" || last[0].num("attempt") != 2 || last[1].str("reason") != "dispatch_exhausted" ||
		last[2].str("step_id") != open || last[1].OccurredAt != last[0].OccurredAt || last[2].OccurredAt != last[0].OccurredAt {
		t.Fatalf("exhaustion by lease expiry: %v", last)
	}
	first := cxWaitEvent(t, e.k, e.id, "first expiry", cxIsEvent("dispatch.lease_expired", 1))
	if first.str("status") != "pending" {
		t.Fatalf("first expiry: %v", first)
	}
	e.k.AdvanceClock(time.Hour)
	e.a.NoWebhook(cxQuiet)
	if got := len(e.rawEvents(e.id)); got != len(evs) {
		t.Fatalf("events after exhaustion")
	}
	cxExpectCode(t, e.a.Request("POST", "/v0/executions/"+e.id+"/heartbeat", nil, e.lease), 409, "execution_terminal")
}
