package dispatch

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

var (
	t0    = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	quiet = slog.New(slog.NewTextHandler(io.Discard, nil))
)

const secret = "webhook-secret-0123456789"

type env struct {
	t   *testing.T
	st  store.Store
	k   *kernel.Kernel
	clk *clock.Manual
	ctx context.Context
}

func newEnv(t *testing.T, tweak ...func(c *kernel.Config)) *env {
	t.Helper()
	st, err := sqlite.Open(sqlite.Options{Path: filepath.Join(t.TempDir(), "k.db"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { st.Close() })
	cfg := kernel.DefaultConfig()
	for _, f := range tweak {
		f(&cfg)
	}
	clk := clock.NewManual(t0)
	return &env{t: t, st: st, k: kernel.New(kernel.Options{Store: st, Clock: clk, Config: cfg, Logger: quiet}), clk: clk, ctx: context.Background()}
}

// create registers agent id with url (once) and creates an execution.
func (v *env) create(id, url string) *store.Execution {
	v.t.Helper()
	if _, err := v.k.GetAgent(v.ctx, id); err != nil {
		if _, err := v.k.RegisterAgent(v.ctx, kernel.AgentSpec{ID: id, WebhookURL: url, Secret: secret}); err != nil {
			v.t.Fatal(err)
		}
	}
	e, err := v.k.CreateExecution(v.ctx, kernel.CreateRequest{AgentID: id})
	if err != nil {
		v.t.Fatal(err)
	}
	return e
}

func (v *env) events(id string) []*store.Event {
	v.t.Helper()
	evs, err := v.st.Read().Events(v.ctx, id, 0, 1000)
	if err != nil {
		v.t.Fatal(err)
	}
	return evs
}

// waitEvent polls the log until an event of one of the types appears and
// returns it.
func (v *env) waitEvent(id string, types ...string) *store.Event {
	v.t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		for _, ev := range v.events(id) {
			for _, typ := range types {
				if ev.Type == typ {
					return ev
				}
			}
		}
		if time.Now().After(deadline) {
			var got []string
			for _, ev := range v.events(id) {
				got = append(got, ev.Type)
			}
			v.t.Fatalf("no %v event within 10 s; log: %v", types, got)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func (v *env) dispatch(id string) *store.Dispatch {
	v.t.Helper()
	d, err := v.st.Read().Dispatch(v.ctx, id)
	if err != nil {
		v.t.Fatal(err)
	}
	return d
}

func payload(t *testing.T, ev *store.Event) *jsonx.Value {
	t.Helper()
	p, err := jsonx.Parse(ev.Payload, 128)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// recorded is one webhook request as the receiver saw it.
type recorded struct {
	header http.Header
	body   []byte
	method string
	path   string
}

func TestBodyExactBytes(t *testing.T) {
	for _, tc := range []struct {
		del  kernel.Delivery
		want string
	}{
		{kernel.Delivery{ExecutionID: "018ff0a0-0000-7000-8000-000000000001", DispatchID: "01920000-0000-7000-8000-000000000001", Attempt: 1, LeaseTimeout: 120},
			`{"execution_id":"018ff0a0-0000-7000-8000-000000000001","dispatch_id":"01920000-0000-7000-8000-000000000001","dispatch_attempt":1,"lease_timeout_seconds":120}`},
		{kernel.Delivery{ExecutionID: "e", DispatchID: "d", Attempt: 2147483647, LeaseTimeout: 86400},
			`{"execution_id":"e","dispatch_id":"d","dispatch_attempt":2147483647,"lease_timeout_seconds":86400}`},
	} {
		if got := string(Body(&tc.del)); got != tc.want {
			t.Errorf("Body = %s\nwant   %s", got, tc.want)
		}
	}
}

func TestDeliverySuccess(t *testing.T) {
	v := newEnv(t)
	got := make(chan recorded, 1)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		body, _ := io.ReadAll(r.Body)
		got <- recorded{header: r.Header.Clone(), body: body, method: r.Method, path: r.URL.Path}
		w.WriteHeader(http.StatusAccepted)
	}))
	defer srv.Close()
	e := v.create("a1", srv.URL+"/hook")
	d := New(v.k, Limits{Total: 4, PerAgent: 4}, 5*time.Second, "1.2.3", quiet)
	v.clk.Advance(250 * time.Millisecond)
	d.claimDue(v.ctx)

	var req recorded
	select {
	case req = <-got:
	case <-time.After(10 * time.Second):
		t.Fatal("the webhook was not delivered")
	}
	del := &kernel.Delivery{ExecutionID: e.ID, DispatchID: e.DispatchID, Attempt: 1, LeaseTimeout: 120}
	if string(req.body) != string(Body(del)) || req.method != http.MethodPost || req.path != "/hook" {
		t.Fatalf("request %s %s %s", req.method, req.path, req.body)
	}
	h := req.header
	for name, want := range map[string]string{
		"Content-Type":             "application/json",
		"User-Agent":               "rebuno-kernel/1.2.3",
		wire.HeaderAgentID:         "a1",
		wire.HeaderExecutionID:     e.ID,
		wire.HeaderDispatchID:      e.DispatchID,
		wire.HeaderDispatchAttempt: "1",
		wire.HeaderSignature:       auth.SignBody([]byte(secret), req.body),
	} {
		if got := h.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if !strings.HasPrefix(h.Get(wire.HeaderSignature), "sha256=") {
		t.Fatalf("signature %q is not the legacy body-only form", h.Get(wire.HeaderSignature))
	}
	// The agent verifies the signature over the exact body (docs/protocol/sdk.md §1), and it is
	// never a valid v1 request signature.
	areq := auth.Request{Method: http.MethodPost, Target: "/hook", Header: h, Body: req.body}
	if err := auth.Verify(areq, []byte(secret), auth.Options{Now: time.Now()}); err != nil {
		t.Fatalf("the webhook signature does not verify: %v", err)
	}
	if err := auth.Verify(areq, []byte("other-secret"), auth.Options{Now: time.Now()}); err == nil {
		t.Fatal("the webhook signature verifies with another secret")
	}
	if err := auth.Verify(areq, []byte(secret), auth.Options{Now: time.Now(), RequireV1: true}); err == nil {
		t.Fatal("the webhook signature passes as a v1 request signature")
	}

	ack := v.waitEvent(e.ID, wire.EventDispatchAcked, wire.EventDispatchFailed)
	if ack.Type != wire.EventDispatchAcked || string(payload(t, ack).Get("attempt").Raw) != "1" {
		t.Fatalf("outcome = %s %s", ack.Type, ack.Payload)
	}
	if dd := v.dispatch(e.DispatchID); dd.Status != wire.DispatchInFlight || dd.Attempt != 1 {
		t.Fatalf("dispatch = %+v", dd)
	}
	m := v.k.Metrics()
	waitFor(t, "the latency observation", func() bool { return histogramCount(t, m.Registry, "rebuno_dispatch_latency_seconds") == 1 })
	success := m.DispatchOutcomes.WithLabelValues("success")
	waitFor(t, "the success counted", func() bool { return testutil.ToFloat64(success) >= 1 })
	if got := testutil.ToFloat64(success); got != 1 {
		t.Fatalf("dispatch_outcomes_total{success} = %v", got)
	}
	waitFor(t, "the delivery slot to be released", func() bool { return d.busy() == 0 })
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

// histogramCount reads the sample count of a histogram from a registry.
func histogramCount(t *testing.T, reg prometheus.Gatherer, name string) uint64 {
	t.Helper()
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatal(err)
	}
	for _, mf := range mfs {
		if mf.GetName() == name && len(mf.GetMetric()) == 1 {
			return mf.GetMetric()[0].GetHistogram().GetSampleCount()
		}
	}
	t.Fatalf("no histogram %s", name)
	return 0
}

func TestFailedAttempts(t *testing.T) {
	redirectTarget := atomic.Int32{}
	target := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		redirectTarget.Add(1)
	}))
	defer target.Close()
	cases := []struct {
		name       string
		handler    http.HandlerFunc
		httpStatus int64 // 0: no response
		errPrefix  string
		minDelay   time.Duration
	}{
		{"500", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(500) }, 500, "webhook answered 500", time.Second},
		{"404", func(w http.ResponseWriter, r *http.Request) { http.NotFound(w, r) }, 404, "webhook answered 404", time.Second},
		{"401 from a wrong secret", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(401) }, 401, "webhook answered 401", time.Second},
		{"302 is not followed", func(w http.ResponseWriter, r *http.Request) {
			http.Redirect(w, r, target.URL+"/elsewhere", http.StatusFound)
		}, 302, "webhook answered 302", time.Second},
		{"429 with Retry-After", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "17")
			w.WriteHeader(429)
		}, 429, "webhook answered 429", 17 * time.Second},
		{"503 with Retry-After over the cap", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "3600")
			w.WriteHeader(503)
		}, 503, "webhook answered 503", 60 * time.Second},
		{"503 with an HTTP-date Retry-After", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "Wed, 21 Oct 2026 07:28:00 GMT")
			w.WriteHeader(503)
		}, 503, "webhook answered 503", time.Second},
		{"500 ignores Retry-After", func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Retry-After", "17")
			w.WriteHeader(500)
		}, 500, "webhook answered 500", time.Second},
		{"timeout", func(w http.ResponseWriter, r *http.Request) {
			// Reading the body lets the server notice the client hanging up.
			io.ReadAll(r.Body)
			select {
			case <-r.Context().Done():
			case <-time.After(10 * time.Second):
			}
		}, 0, "timeout after 200ms", time.Second},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			v := newEnv(t)
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			e := v.create("a1", srv.URL)
			d := New(v.k, Limits{Total: 4, PerAgent: 4}, 200*time.Millisecond, "test", quiet)
			d.claimDue(v.ctx)
			ev := v.waitEvent(e.ID, wire.EventDispatchFailed, wire.EventDispatchAcked)
			if ev.Type != wire.EventDispatchFailed {
				t.Fatalf("outcome = %s", ev.Type)
			}
			p := payload(t, ev)
			if hs := p.Get("http_status"); tc.httpStatus == 0 && hs != nil || tc.httpStatus != 0 && (hs == nil || string(hs.Raw) != fmt.Sprint(tc.httpStatus)) {
				t.Fatalf("http_status = %v in %s, want %d", hs, ev.Payload, tc.httpStatus)
			}
			if msg := p.Get("error"); msg == nil || !strings.HasPrefix(msg.Str, tc.errPrefix) {
				t.Fatalf("error in %s does not start with %q", ev.Payload, tc.errPrefix)
			}
			dd := v.dispatch(e.DispatchID)
			delay := dd.NextAttemptAt.Sub(v.clk.Now())
			if dd.Status != wire.DispatchFailed || delay < tc.minDelay || delay >= tc.minDelay+tc.minDelay/4 {
				t.Fatalf("dispatch %s, next attempt in %v; want failed, in [%v, %v)", dd.Status, delay, tc.minDelay, tc.minDelay+tc.minDelay/4)
			}
			// Metrics are counted after the commit that made the event
			// visible, so the count may trail the event by a moment.
			rejected := v.k.Metrics().DispatchOutcomes.WithLabelValues("rejected")
			waitFor(t, "the rejected outcome counted", func() bool { return testutil.ToFloat64(rejected) >= 1 })
			if got := testutil.ToFloat64(rejected); got != 1 {
				t.Fatalf("dispatch_outcomes_total{rejected} = %v", got)
			}
		})
	}
	if n := redirectTarget.Load(); n != 0 {
		t.Fatalf("the redirect target was requested %d times", n)
	}
}

func TestConnectionRefused(t *testing.T) {
	v := newEnv(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	url := srv.URL
	srv.Close()
	e := v.create("a1", url)
	d := New(v.k, Limits{Total: 1, PerAgent: 1}, time.Second, "test", quiet)
	d.claimDue(v.ctx)
	ev := v.waitEvent(e.ID, wire.EventDispatchFailed)
	p := payload(t, ev)
	if p.Get("http_status") != nil || p.Get("error") == nil || p.Get("error").Str == "" || len(p.Get("error").Str) > 256 {
		t.Fatalf("payload = %s", ev.Payload)
	}
}

func TestPostBadURL(t *testing.T) {
	v := newEnv(t)
	d := New(v.k, Limits{Total: 1, PerAgent: 1}, time.Second, "test", quiet)
	out := d.post(v.ctx, &kernel.Delivery{WebhookURL: "http://[::1", Secret: "s"})
	if out.Acked || !strings.HasPrefix(out.Error, "bad webhook url") {
		t.Fatalf("outcome = %+v", out)
	}
}

func TestResponseBodyReadIsCapped(t *testing.T) {
	v := newEnv(t)
	var written atomic.Int64
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.WriteHeader(200)
		chunk := make([]byte, 32*1024)
		// An endless body: only a capped read lets the delivery finish
		// before its timeout.
		for {
			n, err := w.Write(chunk)
			written.Add(int64(n))
			if err != nil {
				return
			}
		}
	}))
	defer srv.Close()
	d := New(v.k, Limits{Total: 1, PerAgent: 1}, 30*time.Second, "test", quiet)
	begin := time.Now()
	out := d.post(v.ctx, &kernel.Delivery{WebhookURL: srv.URL, Secret: "s", ExecutionID: "e", DispatchID: "d", Attempt: 1, LeaseTimeout: 120})
	if !out.Acked || out.HTTPStatus != 200 {
		t.Fatalf("outcome = %+v", out)
	}
	if took := time.Since(begin); took > 10*time.Second {
		t.Fatalf("the delivery took %v: the body was not capped", took)
	}
}

func TestConcurrencyBound(t *testing.T) {
	v := newEnv(t)
	release := make(chan struct{})
	var inFlight, maxInFlight, hits atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := inFlight.Add(1)
		for {
			m := maxInFlight.Load()
			if n <= m || maxInFlight.CompareAndSwap(m, n) {
				break
			}
		}
		hits.Add(1)
		<-release
		inFlight.Add(-1)
	}))
	defer srv.Close()
	defer close(release)
	var ids []string
	for i := 0; i < 5; i++ {
		ids = append(ids, v.create("a1", srv.URL).ID)
	}
	d := New(v.k, Limits{Total: 2, PerAgent: 2}, 30*time.Second, "test", quiet)
	v.run(d)

	waitFor(t, "two deliveries in flight", func() bool { return inFlight.Load() == 2 })
	// Nudge the loop repeatedly: with both slots busy nothing more is claimed.
	for i := 0; i < 5; i++ {
		v.k.WakeDispatcher()
		time.Sleep(10 * time.Millisecond)
	}
	if n := maxInFlight.Load(); n != 2 {
		t.Fatalf("%d deliveries ran at once with concurrency 2", n)
	}
	claimed := 0
	for _, id := range ids {
		if dd := v.dispatch(v.execDispatch(id)); dd.Attempt > 0 {
			claimed++
		}
	}
	if claimed != 2 {
		t.Fatalf("%d dispatches claimed while 2 slots are busy", claimed)
	}
	// Let them go: every execution is delivered, never more than 2 at once.
	for i := 0; i < 5; i++ {
		release <- struct{}{}
	}
	waitFor(t, "all five deliveries", func() bool { return hits.Load() == 5 })
	for _, id := range ids {
		v.waitEvent(id, wire.EventDispatchAcked)
	}
	if n := maxInFlight.Load(); n != 2 {
		t.Fatalf("max in flight = %d, want 2", n)
	}
}

func (v *env) execDispatch(id string) string {
	v.t.Helper()
	e, err := v.st.Read().Execution(v.ctx, id)
	if err != nil {
		v.t.Fatal(err)
	}
	return e.DispatchID
}

func TestSlowWebhookDoesNotDelayOthers(t *testing.T) {
	v := newEnv(t)
	block := make(chan struct{})
	slow := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-block }))
	defer slow.Close()
	defer close(block)
	fast := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer fast.Close()
	es := v.create("slow", slow.URL)
	d := New(v.k, Limits{Total: 8, PerAgent: 8}, 30*time.Second, "test", quiet)
	v.run(d)
	waitFor(t, "the slow delivery to start", func() bool { return v.dispatch(es.DispatchID).Attempt == 1 })
	ef := v.create("fast", fast.URL)
	v.waitEvent(ef.ID, wire.EventDispatchAcked)
	for _, ev := range v.events(es.ID) {
		if ev.Type == wire.EventDispatchAcked || ev.Type == wire.EventDispatchFailed {
			t.Fatalf("the slow delivery finished (%s) before it was released", ev.Type)
		}
	}
}

func TestRunRetriesAndReclaims(t *testing.T) {
	v := newEnv(t, func(c *kernel.Config) { c.DispatchMaxAttempts = 3 })
	var mu sync.Mutex
	var attempts []string
	status := atomic.Int32{}
	status.Store(500)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		attempts = append(attempts, r.Header.Get(wire.HeaderDispatchAttempt))
		mu.Unlock()
		w.WriteHeader(int(status.Load()))
	}))
	defer srv.Close()
	e := v.create("a1", srv.URL)
	d := New(v.k, Limits{Total: 4, PerAgent: 4}, 5*time.Second, "test", quiet)
	ctx, cancel := context.WithCancel(v.ctx)
	stopped := make(chan struct{}, 2)
	go func() { d.Run(ctx); stopped <- struct{}{} }()
	// Lease reclaim is one of the kernel's duties.
	go func() { v.k.RunWorkers(ctx); stopped <- struct{}{} }()
	defer func() {
		cancel()
		<-stopped
		<-stopped
	}()

	v.waitEvent(e.ID, wire.EventDispatchFailed)
	status.Store(200)
	// The retry is due after the backoff on the kernel's clock.
	v.clk.Advance(2 * time.Second)
	v.waitEvent(e.ID, wire.EventDispatchAcked)
	// The lease lapses on the kernel's clock: the dispatcher reclaims it and
	// redelivers the same dispatch with the next attempt.
	v.clk.Advance(3 * time.Minute)
	v.waitEvent(e.ID, wire.EventDispatchLeaseExpired)
	waitFor(t, "the redelivery", func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(attempts) == 3
	})
	mu.Lock()
	got := strings.Join(attempts, ",")
	mu.Unlock()
	if got != "1,2,3" {
		t.Fatalf("attempt headers = %s, want 1,2,3", got)
	}
	waitFor(t, "the third outcome", func() bool {
		acks := 0
		for _, ev := range v.events(e.ID) {
			if ev.Type == wire.EventDispatchAcked {
				acks++
			}
		}
		return acks == 2
	})
}

func TestObserveQueue(t *testing.T) {
	v := newEnv(t)
	for i := 0; i < 3; i++ {
		v.create("a1", "http://127.0.0.1:9/")
	}
	d := New(v.k, Limits{Total: 1, PerAgent: 1}, time.Second, "test", quiet)
	d.observeQueue(v.ctx)
	if got := testutil.ToFloat64(v.k.Metrics().QueueDepth); got != 3 {
		t.Fatalf("queue_depth = %v, want 3", got)
	}
}

// busy counts the deliveries in flight.
func (d *Dispatcher) busy() int {
	d.mu.Lock()
	defer d.mu.Unlock()
	return len(d.inFlight)
}

// An agent whose webhook hangs fills its own share of the delivery slots and
// no more: another agent's executions are delivered at once.
func TestAgentShareBound(t *testing.T) {
	v := newEnv(t)
	release := make(chan struct{})
	var hanging, maxHanging atomic.Int32
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := hanging.Add(1)
		for m := maxHanging.Load(); n > m && !maxHanging.CompareAndSwap(m, n); m = maxHanging.Load() {
		}
		<-release
		hanging.Add(-1)
	}))
	defer stuck.Close()
	defer close(release)
	healthy := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))
	defer healthy.Close()
	for i := 0; i < 10; i++ {
		v.create("stuck", stuck.URL)
	}
	d := New(v.k, Limits{Total: 4, PerAgent: 2}, 30*time.Second, "test", quiet)
	v.run(d)
	waitFor(t, "the stuck agent's share in flight", func() bool { return hanging.Load() == 2 })
	for i := 0; i < 5; i++ {
		e := v.create("healthy", healthy.URL)
		v.waitEvent(e.ID, wire.EventDispatchAcked)
	}
	if n := maxHanging.Load(); n != 2 {
		t.Fatalf("the stuck agent had %d deliveries at once, want its share of 2", n)
	}
}

// With every slot held by deliveries that hang and more work due, the loop
// sleeps until a slot frees: it does not spin on the due work it cannot take.
func TestNoSpinWhileFull(t *testing.T) {
	v := newEnv(t)
	release := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer stuck.Close()
	defer close(release)
	for i := 0; i < 6; i++ {
		v.create("stuck", stuck.URL)
	}
	d := New(v.k, Limits{Total: 2, PerAgent: 2}, 30*time.Second, "test", quiet)
	v.run(d)
	waitFor(t, "both slots in use", func() bool { return d.busy() == 2 })
	before := d.rounds.Load()
	time.Sleep(300 * time.Millisecond) // a window to count loop rounds in, not synchronisation
	if n := d.rounds.Load() - before; n > 5 {
		t.Fatalf("the loop ran %d rounds in 300 ms while full: it spins", n)
	}
}

// A webhook URL may carry credentials; a failed delivery's event says what
// went wrong without them.
func TestDeliveryErrorsHideURLCredentials(t *testing.T) {
	v := newEnv(t)
	srv := httptest.NewServer(http.NotFoundHandler())
	addr := strings.TrimPrefix(srv.URL, "http://")
	srv.Close()
	e := v.create("a1", "http://alice:pa55word@"+addr+"/hook?key=1")
	d := New(v.k, Limits{Total: 1, PerAgent: 1}, time.Second, "test", quiet)
	d.claimDue(v.ctx)
	ev := v.waitEvent(e.ID, wire.EventDispatchFailed)
	if msg := payload(t, ev).Get("error").Str; msg == "" || strings.Contains(msg, "pa55word") || strings.Contains(msg, "alice") {
		t.Fatalf("delivery error %q", msg)
	}
}

// However many agents hold every slot, an agent with nothing in flight gets
// one delivery at once, beyond the total; a second of its deliveries waits.
func TestNewcomerBeyondTotal(t *testing.T) {
	v := newEnv(t)
	release := make(chan struct{})
	stuck := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { <-release }))
	defer stuck.Close()
	defer close(release)
	var newcomerHits atomic.Int32
	newcomerRelease := make(chan struct{})
	newcomer := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		newcomerHits.Add(1)
		<-newcomerRelease
	}))
	defer newcomer.Close()
	defer close(newcomerRelease)
	for _, id := range []string{"s1", "s2", "s1", "s2"} {
		v.create(id, stuck.URL)
	}
	d := New(v.k, Limits{Total: 2, PerAgent: 1}, 30*time.Second, "test", quiet)
	v.run(d)
	waitFor(t, "both slots held", func() bool { return d.busy() == 2 })
	v.create("newcomer", newcomer.URL)
	v.create("newcomer", newcomer.URL)
	waitFor(t, "the newcomer's first delivery", func() bool { return newcomerHits.Load() == 1 })
	for i := 0; i < 5; i++ { // nudge: nothing more may start
		v.k.WakeDispatcher()
		time.Sleep(10 * time.Millisecond)
	}
	if n := newcomerHits.Load(); n != 1 || d.busy() != 3 {
		t.Fatalf("newcomer deliveries %d, in flight %d; want 1 and 3", n, d.busy())
	}
}

// run runs d until the test ends.
func (v *env) run(d *Dispatcher) {
	ctx, cancel := context.WithCancel(v.ctx)
	stopped := make(chan struct{})
	go func() { d.Run(ctx); close(stopped) }()
	v.t.Cleanup(func() {
		cancel()
		<-stopped
	})
}
