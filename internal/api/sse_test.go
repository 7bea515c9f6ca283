package api

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

// frame is one server-sent event.
type frame struct {
	id, event, data string
	comment         bool
}

// stream is an open SSE response read frame by frame on its own goroutine.
type stream struct {
	resp   *http.Response
	frames chan frame
	done   chan struct{} // closed at EOF
	cancel context.CancelFunc
}

func openStream(t *testing.T, srv *httptest.Server, target string, h http.Header) (*stream, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	r, err := http.NewRequestWithContext(ctx, "GET", srv.URL+target, nil)
	if err != nil {
		t.Fatal(err)
	}
	for k, vs := range h {
		for _, v := range vs {
			r.Header.Add(k, v)
		}
	}
	resp, err := srv.Client().Do(r)
	if err != nil {
		cancel()
		t.Fatal(err)
	}
	if resp.StatusCode != 200 {
		cancel()
		return nil, resp
	}
	s := &stream{resp: resp, frames: make(chan frame, 1000), done: make(chan struct{}), cancel: cancel}
	t.Cleanup(func() {
		cancel()
		resp.Body.Close()
	})
	go func() {
		defer close(s.done)
		sc := bufio.NewScanner(resp.Body)
		var f frame
		started := false
		for sc.Scan() {
			line := sc.Text()
			switch {
			case line == "":
				if started {
					s.frames <- f
				}
				f, started = frame{}, false
			case strings.HasPrefix(line, ":"):
				s.frames <- frame{comment: true, data: line}
			case strings.HasPrefix(line, "id: "):
				f.id, started = line[4:], true
			case strings.HasPrefix(line, "event: "):
				f.event, started = line[7:], true
			case strings.HasPrefix(line, "data: "):
				f.data, started = line[6:], true
			default:
				s.frames <- frame{event: "malformed", data: line}
			}
		}
	}()
	// Every stream opens with a comment (docs/protocol/events.md §4), which
	// tells a browser's EventSource at once that the stream is open.
	if f := s.next(t); !f.comment || f.data != ": open" {
		t.Fatalf("first frame %+v, want the opening comment", f)
	}
	return s, resp
}

func (s *stream) next(t *testing.T) frame {
	t.Helper()
	select {
	case f := <-s.frames:
		return f
	case <-time.After(10 * time.Second):
		t.Fatal("no frame within 10 s")
		return frame{}
	}
}

func (s *stream) waitClosed(t *testing.T) {
	t.Helper()
	select {
	case <-s.done:
	case <-time.After(10 * time.Second):
		t.Fatal("the stream did not end")
	}
}

func TestEventStream(t *testing.T) {
	v := newEnv(t)
	srv := httptest.NewServer(v.s)
	t.Cleanup(srv.Close) // after the streams' own clean-ups, which end them
	e, del := v.start("a1")
	target := "/v0/executions/" + e.ID + "/events/stream"

	s, resp := openStream(t, srv, target, nil)
	if s == nil {
		t.Fatalf("status %d", resp.StatusCode)
	}
	for name, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache", "X-Accel-Buffering": "no"} {
		if got := resp.Header.Get(name); got != want {
			t.Errorf("%s = %q, want %q", name, got, want)
		}
	}
	if resp.Header.Get(wire.HeaderRequestID) == "" {
		t.Error("the stream lacks Rebuno-Request-Id")
	}
	// The backlog: three events of the create.
	for seq := 1; seq <= 3; seq++ {
		f := s.next(t)
		if f.id != strconv.Itoa(seq) || f.event != "" {
			t.Fatalf("frame %d = %+v", seq, f)
		}
		ev, err := jsonx.Parse([]byte(f.data), 128)
		if err != nil || string(ev.Get("event_seq").Raw) != strconv.Itoa(seq) || ev.Get("execution_id").Str != e.ID {
			t.Fatalf("frame %d data = %s (%v)", seq, f.data, err)
		}
	}
	if got := testutil.ToFloat64(v.k.Metrics().StreamConnections.WithLabelValues("events")); got != 1 {
		t.Fatalf("stream_connections{events} = %v", got)
	}
	// Live events follow as they commit.
	_, err := v.k.SubmitStep(v.ctx, kernel.Caller{Agent: "a1"}, e.ID, kernel.DispatchHeaders{ID: del.DispatchID, Attempt: 1},
		kernel.SubmitRequest{Kind: wire.KindLocal, Target: "x"})
	if err != nil {
		t.Fatal(err)
	}
	for seq, typ := range []string{wire.EventStepProposed, wire.EventStepAllowed, wire.EventStepExecuting} {
		f := s.next(t)
		if f.id != strconv.Itoa(seq+4) || !strings.Contains(f.data, `"type":"`+typ+`"`) {
			t.Fatalf("live frame = %+v, want %s", f, typ)
		}
	}
	// Terminal: the rest of the log, then the end event, then EOF.
	if err := v.k.CancelExecution(v.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	f := s.next(t)
	if f.id != "7" || !strings.Contains(f.data, wire.EventExecutionCancelled) {
		t.Fatalf("frame = %+v", f)
	}
	f = s.next(t)
	if f.id != "8" || !strings.Contains(f.data, wire.EventStepCancelled) {
		t.Fatalf("frame = %+v", f)
	}
	f = s.next(t)
	if f.event != "end" || f.id != "" || f.data != fmt.Sprintf(`{"execution_id":%q,"status":"cancelled"}`, e.ID) {
		t.Fatalf("end frame = %+v", f)
	}
	s.waitClosed(t)
	waitUntil(t, "the stream gauge to drop", func() bool {
		return testutil.ToFloat64(v.k.Metrics().StreamConnections.WithLabelValues("events")) == 0 && v.s.streams.Load() == 0
	})

	// Resuming a terminal execution at or past its last event: 204.
	for _, h := range []http.Header{{wire.HeaderLastEventID: {"8"}}, {wire.HeaderLastEventID: {"9"}}} {
		if s, resp := openStream(t, srv, target, h); s != nil || resp.StatusCode != 204 {
			t.Fatalf("resume at %s = %d", h.Get(wire.HeaderLastEventID), resp.StatusCode)
		}
	}
	if _, resp := openStream(t, srv, target+"?after_seq=8", nil); resp.StatusCode != 204 {
		t.Fatalf("after_seq=8 = %d", resp.StatusCode)
	}
	// Resuming below it: the rest, then end. Last-Event-ID wins over after_seq.
	s, _ = openStream(t, srv, target+"?after_seq=1", http.Header{wire.HeaderLastEventID: {"6"}})
	if f := s.next(t); f.id != "7" {
		t.Fatalf("resume after 6 starts at %+v", f)
	}
	s.next(t)
	if f := s.next(t); f.event != "end" {
		t.Fatalf("frame = %+v", f)
	}
	s.waitClosed(t)
}

func waitUntil(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		time.Sleep(2 * time.Millisecond)
	}
}

func TestEventStreamRefusals(t *testing.T) {
	v := newEnv(t, func(o *Options) { o.MaxStreams = 1 })
	srv := httptest.NewServer(v.s)
	t.Cleanup(srv.Close) // after the streams' own clean-ups, which end them
	e, _ := v.start("a1")
	v.agent("a2")
	target := "/v0/executions/" + e.ID + "/events/stream"
	get := func(target string, h http.Header) (int, string, http.Header) {
		t.Helper()
		r, _ := http.NewRequest("GET", srv.URL+target, nil)
		for k, vs := range h {
			r.Header[k] = vs
		}
		resp, err := srv.Client().Do(r)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), resp.Header
	}
	for _, tc := range []struct {
		target string
		h      http.Header
		status int
	}{
		{target + "?after_seq=-1", nil, 400},
		{target + "?after_seq=1.5", nil, 400},
		{target, http.Header{wire.HeaderLastEventID: {"x"}}, 400},
		{target, http.Header{wire.HeaderLastEventID: {"-2"}}, 400},
		{target, http.Header{wire.HeaderLastEventID: {"1", "2"}}, 400},
		{"/v0/executions/x/events/stream", nil, 400},
		{"/v0/executions/0190aaaa-0000-7000-8000-000000000000/events/stream", nil, 404},
		{"/v0/executions/0190aaaa-0000-7000-8000-000000000000/stream", nil, 404},
	} {
		if code, body, _ := get(tc.target, tc.h); code != tc.status || !strings.Contains(body, `"code"`) {
			t.Errorf("%s %v = %d %s, want %d", tc.target, tc.h, code, body, tc.status)
		}
	}
	// Agent scope.
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	h := http.Header{wire.HeaderAgentID: {"a2"}, wire.HeaderTimestamp: {ts},
		wire.HeaderSignature: {auth.SignV1([]byte(secret), "GET", target, ts, "", "", nil)}}
	if code, _, _ := get(target, h); code != 403 {
		t.Fatalf("another agent's stream = %d", code)
	}

	// The stream limit.
	s, resp := openStream(t, srv, target, nil)
	if s == nil {
		t.Fatalf("first stream = %d", resp.StatusCode)
	}
	code, body, hdr := get(target, nil)
	if code != 503 || hdr.Get("Retry-After") != "1" || !strings.Contains(body, `"code":"unavailable"`) {
		t.Fatalf("over the limit = %d %s (Retry-After %q)", code, body, hdr.Get("Retry-After"))
	}
	if code, _, _ := get("/v0/executions/"+e.ID+"/stream", nil); code != 503 {
		t.Fatalf("a delta stream over the limit = %d", code)
	}
	s.cancel()
	waitUntil(t, "the stream slot to be released", func() bool { return v.s.streams.Load() == 0 })
	s2, resp := openStream(t, srv, target, nil)
	if s2 == nil {
		t.Fatalf("a stream after the first closed = %d", resp.StatusCode)
	}
}

func TestStreamsEndOnDrain(t *testing.T) {
	v := newEnv(t)
	srv := httptest.NewServer(v.s)
	t.Cleanup(srv.Close) // after the streams' own clean-ups, which end them
	e, _ := v.start("a1")
	events, _ := openStream(t, srv, "/v0/executions/"+e.ID+"/events/stream?after_seq=3", nil)
	deltas, _ := openStream(t, srv, "/v0/executions/"+e.ID+"/stream", nil)
	if events == nil || deltas == nil {
		t.Fatal("streams did not open")
	}
	waitUntil(t, "both streams", func() bool { return v.s.streams.Load() == 2 })
	v.s.Drain()
	events.waitClosed(t)
	deltas.waitClosed(t)
}

func TestDeltaStream(t *testing.T) {
	v := newEnv(t)
	srv := httptest.NewServer(v.s)
	t.Cleanup(srv.Close) // after the streams' own clean-ups, which end them
	e, del := v.start("a1")
	dec, err := v.k.SubmitStep(v.ctx, kernel.Caller{Agent: "a1"}, e.ID, kernel.DispatchHeaders{ID: del.DispatchID}, kernel.SubmitRequest{Kind: wire.KindLLMCall, Target: "m"})
	if err != nil {
		t.Fatal(err)
	}
	target := "/v0/executions/" + e.ID + "/stream"
	s, resp := openStream(t, srv, target, nil)
	if s == nil {
		t.Fatalf("status %d", resp.StatusCode)
	}
	if resp.Header.Get("Content-Type") != "text/event-stream" {
		t.Fatalf("Content-Type = %q", resp.Header.Get("Content-Type"))
	}
	waitUntil(t, "the delta subscription", func() bool { _, _, d := v.k.Subscriptions(); return d == 1 })
	if err := v.k.StreamDelta(v.ctx, kernel.Caller{Agent: "a1"}, e.ID, dec.StepID, kernel.DispatchHeaders{}, 3, "héllo \"w\"\n"); err != nil {
		t.Fatal(err)
	}
	f := s.next(t)
	want := fmt.Sprintf(`{"data":"héllo \"w\"\n","seq":3,"step_id":%q}`, dec.StepID)
	if f.id != "" || f.event != "" || f.data != want {
		t.Fatalf("frame = %+v, want data %s", f, want)
	}
	// A new commit on a running execution does not end the stream; a
	// terminal one does.
	if err := v.k.Heartbeat(v.ctx, kernel.Caller{Agent: "a1"}, e.ID, kernel.DispatchHeaders{}); err != nil {
		t.Fatal(err)
	}
	if err := v.k.CancelExecution(v.ctx, e.ID); err != nil {
		t.Fatal(err)
	}
	s.waitClosed(t)
	waitUntil(t, "the delta subscription to go", func() bool { _, _, d := v.k.Subscriptions(); return d == 0 })
	if _, resp := openStream(t, srv, target, nil); resp.StatusCode != 204 {
		t.Fatalf("delta stream of a terminal execution = %d", resp.StatusCode)
	}
	if tails, _, deltas := v.k.Subscriptions(); tails != 0 || deltas != 0 {
		t.Fatalf("hub entries left: %d, %d", tails, deltas)
	}
}
