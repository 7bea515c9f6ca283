package blackbox

// Black-box tests of the event log tail (docs/protocol/events.md §4) and the delta side channel
// (docs/protocol/events.md §5).

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// cxFrame is one server-sent event as the client parsed it.
type cxFrame struct {
	ID, Event, Data   string
	HasID, HasEvent   bool
	Comment           bool
	Lines             []string
	At                time.Time
	dataLines, others int
}

// cxSSE is an open stream, read by its own goroutine.
type cxSSE struct {
	t      *testing.T
	Status int
	Header http.Header
	Body   []byte // the body of a non-200 answer
	frames chan cxFrame
	cancel context.CancelFunc
}

// cxStreamClient has a transport of its own, whose idle connections each
// test closes before its kernel stops: a connection dialled for a stream the
// test had already cancelled sits in the pool unused, and the server waits
// 5 s for such never-used connections when it shuts down.
var cxStreamClient = &http.Client{Transport: &http.Transport{}}

func cxOpenSSE(t *testing.T, req *http.Request) *cxSSE {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(func() {
		cancel()
		cxStreamClient.CloseIdleConnections()
	})
	resp, err := cxStreamClient.Do(req.WithContext(ctx))
	if err != nil {
		t.Fatalf("GET %s: %v", req.URL, err)
	}
	s := &cxSSE{t: t, Status: resp.StatusCode, Header: resp.Header, frames: make(chan cxFrame, 10000), cancel: cancel}
	if resp.StatusCode != 200 {
		s.Body, _ = io.ReadAll(resp.Body)
		resp.Body.Close()
		close(s.frames)
		return s
	}
	go func() {
		defer close(s.frames)
		defer resp.Body.Close()
		br := bufio.NewReader(resp.Body)
		var f cxFrame
		for {
			line, err := br.ReadString('\n')
			if err != nil {
				return
			}
			line = strings.TrimSuffix(line, "\n")
			if line == "" {
				if len(f.Lines) > 0 {
					f.At = time.Now()
					s.frames <- f
				}
				f = cxFrame{}
				continue
			}
			f.Lines = append(f.Lines, line)
			switch {
			case strings.HasPrefix(line, ":"):
				f.Comment = true
			case strings.HasPrefix(line, "id: "):
				f.ID, f.HasID = line[4:], true
			case strings.HasPrefix(line, "event: "):
				f.Event, f.HasEvent = line[7:], true
			case strings.HasPrefix(line, "data: "):
				f.Data = line[6:]
				f.dataLines++
			default:
				f.others++
			}
		}
	}()
	return s
}

// cxBearerGet builds a bearer GET with extra headers.
func cxBearerGet(t *testing.T, k *kt.Kernel, path string, headers map[string]string) *http.Request {
	req, err := http.NewRequest("GET", k.URL+path, nil)
	if err != nil {
		t.Fatal(err)
	}
	k.Authorize(req)
	for n, v := range headers {
		req.Header.Set(n, v)
	}
	return req
}

// next returns the next frame that is not a comment; ok is false at EOF.
func (s *cxSSE) next() (cxFrame, bool) {
	s.t.Helper()
	for {
		select {
		case f, ok := <-s.frames:
			if !ok {
				return f, false
			}
			if f.Comment && !f.HasID && !f.HasEvent && f.dataLines == 0 {
				continue
			}
			if f.dataLines != 1 || f.others != 0 {
				s.t.Fatalf("malformed frame %q", f.Lines)
			}
			return f, true
		case <-time.After(10 * time.Second):
			s.t.Fatalf("no frame within 10s")
		}
	}
}

// event reads the next frame, which must be an event frame with seq.
func (s *cxSSE) event(seq int64) cxRawEvent {
	s.t.Helper()
	f, ok := s.next()
	if !ok {
		s.t.Fatalf("stream ended, want event %d", seq)
	}
	if f.HasEvent || !f.HasID || f.ID != strconv.FormatInt(seq, 10) {
		s.t.Fatalf("want event frame %d, got %q", seq, f.Lines)
	}
	var ev cxRawEvent
	if err := json.Unmarshal([]byte(f.Data), &ev); err != nil || ev.Seq != seq {
		s.t.Fatalf("frame %d data %s: %v", seq, f.Data, err)
	}
	return ev
}

// end reads the end frame and then the end of the stream.
func (s *cxSSE) end(id, status string) {
	s.t.Helper()
	f, ok := s.next()
	if !ok || f.Event != "end" || f.HasID {
		s.t.Fatalf("want the end frame, got %q (open %v)", f.Lines, ok)
	}
	if want := fmt.Sprintf(`{"execution_id":"%s","status":"%s"}`, id, status); f.Data != want {
		s.t.Fatalf("end frame data %s, want %s", f.Data, want)
	}
	s.eof()
}

func (s *cxSSE) eof() {
	s.t.Helper()
	deadline := time.After(5 * time.Second)
	for {
		select {
		case f, ok := <-s.frames:
			if !ok {
				return
			}
			if !f.Comment {
				s.t.Fatalf("frame after the end: %q", f.Lines)
			}
		case <-deadline:
			s.t.Fatalf("the stream was not closed")
		}
	}
}

func (s *cxSSE) checkHeaders() {
	s.t.Helper()
	if s.Status != 200 {
		s.t.Fatalf("stream answered %d %s", s.Status, s.Body)
	}
	for name, want := range map[string]string{"Content-Type": "text/event-stream", "Cache-Control": "no-cache",
		"Connection": "keep-alive", "X-Accel-Buffering": "no"} {
		if got := s.Header.Get(name); got != want && !(name == "Content-Type" && strings.HasPrefix(got, want)) {
			s.t.Fatalf("stream header %s: %q", name, got)
		}
	}
}

func cxSameEvent(t *testing.T, got cxRawEvent, want json.RawMessage) {
	t.Helper()
	var a, b map[string]any
	raw, _ := json.Marshal(got)
	json.Unmarshal(raw, &a)
	json.Unmarshal(want, &b)
	delete(b, "execution_id")
	if !reflect.DeepEqual(a, b) {
		t.Fatalf("streamed event %s differs from the log's %s", raw, want)
	}
}

// TestSSEBacklogThenLive: the tail sends the backlog, then live events as
// they commit, then the end frame once the execution is terminal (docs/protocol/events.md §4).
func TestSSEBacklogThenLive(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	s := e.proceed(e.lease, `{"kind":"tool_call","target":"first"}`)
	e.record(s, e.lease, "complete", `{"result":1}`)
	var backlog []json.RawMessage
	e.k.Must(200, e.k.Do("GET", "/v0/executions/"+e.id+"/events", nil, nil)).JSON(t, &backlog)

	st := cxOpenSSE(t, cxBearerGet(t, e.k, "/v0/executions/"+e.id+"/events/stream", nil))
	st.checkHeaders()
	for i, raw := range backlog {
		ev := st.event(int64(i + 1))
		cxSameEvent(t, ev, raw)
		var exec struct {
			ExecutionID string `json:"execution_id"`
		}
		json.Unmarshal(raw, &exec)
		if exec.ExecutionID != e.id {
			t.Fatalf("event of another execution: %s", raw)
		}
	}
	// A second reader joins at the current end of a running execution: it
	// gets a stream (not 204) and only what comes next.
	late := cxOpenSSE(t, cxBearerGet(t, e.k, "/v0/executions/"+e.id+"/events/stream",
		map[string]string{"Last-Event-ID": strconv.Itoa(len(backlog))}))
	late.checkHeaders()

	seq := int64(len(backlog))
	var worst time.Duration
	for i := 0; i < 10; i++ {
		start := time.Now()
		id := e.proceed(e.lease, fmt.Sprintf(`{"kind":"tool_call","target":"live","args":%d}`, i))
		for _, typ := range []string{"step.proposed", "step.allowed", "step.executing"} {
			seq++
			ev := st.event(seq)
			if ev.Type != typ || ev.str("step_id") != id {
				t.Fatalf("live frame %d: %v", seq, ev)
			}
			if lat := time.Since(start); typ == "step.proposed" {
				worst = max(worst, lat)
			}
			if ev2 := late.event(seq); ev2.Type != typ {
				t.Fatalf("second reader frame %d: %v", seq, ev2)
			}
		}
	}
	t.Logf("worst submit-to-frame latency: %v", worst)
	if worst > 500*time.Millisecond {
		t.Fatalf("a live event took %v to reach the tail", worst)
	}
	e.k.Must(204, e.agentCall(e.id, "complete", `{"output":"done"}`, e.lease))
	all := e.rawEvents(e.id)
	for _, r := range []*cxSSE{st, late} {
		for i := seq + 1; i <= int64(len(all)); i++ {
			if ev := r.event(i); ev.Type != all[i-1].Type {
				t.Fatalf("frame %d is %s, log has %s", i, ev.Type, all[i-1].Type)
			}
		}
		r.end(e.id, "completed")
	}
	if all[seq].Type != "execution.completed" {
		t.Fatalf("terminal transaction starts with %s", all[seq].Type)
	}
}

// TestSSEResume: Last-Event-ID, else after_seq, picks the resume point; a
// terminal execution resumed at its end answers 204 (docs/protocol/events.md §4).
func TestSSEResume(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	s := e.proceed(e.lease, `{"kind":"tool_call","target":"x"}`)
	e.record(s, e.lease, "complete", `{"result":1}`)
	e.k.Must(204, e.agentCall(e.id, "fail", `{"error":"gave up"}`, e.lease))
	all := e.rawEvents(e.id)
	n := len(all)
	path := "/v0/executions/" + e.id + "/events/stream"

	cases := []struct {
		query  string
		header string
		first  int
	}{
		{"", "", 1},
		{"", "3", 4},
		{"?after_seq=5", "", 6},
		{"?after_seq=5", "2", 3},
		{"?after_seq=", "", 1},
		{"?after_seq=" + strconv.Itoa(n-1), "", n},
		{"", "0", 1},
	}
	for _, c := range cases {
		h := map[string]string{}
		if c.header != "" {
			h["Last-Event-ID"] = c.header
		}
		st := cxOpenSSE(t, cxBearerGet(t, e.k, path+c.query, h))
		st.checkHeaders()
		for i := c.first; i <= n; i++ {
			if ev := st.event(int64(i)); ev.Type != all[i-1].Type {
				t.Fatalf("resume %q/%q: frame %d is %s", c.query, c.header, i, ev.Type)
			}
		}
		st.end(e.id, "failed")
	}

	// Resumed at (or past) its end, a terminal execution has nothing more.
	for _, c := range []struct{ query, header string }{
		{"?after_seq=" + strconv.Itoa(n), ""},
		{"?after_seq=" + strconv.Itoa(n+7), ""},
		{"", strconv.Itoa(n)},
		{"?after_seq=0", strconv.Itoa(n)},
	} {
		h := map[string]string{}
		if c.header != "" {
			h["Last-Event-ID"] = c.header
		}
		r := e.k.Do("GET", path+c.query, nil, h)
		if r.Status != 204 || len(r.Body) != 0 {
			t.Fatalf("resume at the end (%q, %q): %s", c.query, c.header, r)
		}
	}

	// The owning agent may tail it (dual auth); another agent may not.
	owner := e.a.SignedRequest("GET", path+"?after_seq="+strconv.Itoa(n-2), nil, kt.Lease{Occurrence: -1}, nil)
	st := cxOpenSSE(t, owner)
	st.checkHeaders()
	st.event(int64(n - 1))
	st.event(int64(n))
	st.end(e.id, "failed")
	other := e.k.NewAgent("other-agent", "")
	r := other.Request("GET", path, nil, kt.Lease{Occurrence: -1})
	cxExpectCode(t, r, 403, "forbidden")
	cxExpectCode(t, e.k.Do("GET", "/v0/executions/018ff0a0-0000-7000-8000-000000000001/events/stream", nil, nil), 404, "not_found")
	cxExpectCode(t, e.k.Do("GET", path, nil, map[string]string{"Last-Event-ID": "-1"}), 400, "validation_error")
}

// TestSSELongBacklog: a backlog longer than one store page (1,000 events)
// streams in order, without gaps, then the live tail continues.
func TestSSELongBacklog(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	for i := 0; i < 350; i++ {
		e.proceed(e.lease, fmt.Sprintf(`{"kind":"local","target":"many","args":%d}`, i%7))
	}
	n := int64(len(e.rawEvents(e.id)))
	if n <= 1000 {
		t.Fatalf("only %d events", n)
	}
	st := cxOpenSSE(t, cxBearerGet(t, e.k, "/v0/executions/"+e.id+"/events/stream?after_seq=1", nil))
	st.checkHeaders()
	for i := int64(2); i <= n; i++ {
		st.event(i)
	}
	e.k.Must(204, e.agentCall(e.id, "complete", `{}`, e.lease))
	all := e.rawEvents(e.id)
	for i := n + 1; i <= int64(len(all)); i++ {
		st.event(i)
	}
	st.end(e.id, "completed")
}

// TestSSEReconnectLosesNothing: a reader that drops its connection every few
// frames and resumes with Last-Event-ID sees every event exactly once, while
// the agent keeps writing.
func TestSSEReconnectLosesNothing(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	t.Cleanup(cxAgentClient.CloseIdleConnections)
	path := "/v0/executions/" + e.id + "/events/stream"
	tick := make(chan struct{}, 1)
	errs := make(chan error, 1)
	ref := cxRef(e.k, e.a)
	const steps = 15
	go func() {
		errs <- func() error {
			for i := 0; i < steps; i++ {
				<-tick
				d, err := cxCallDecision(ref, "POST", "/v0/executions/"+e.id+"/steps",
					fmt.Sprintf(`{"kind":"tool_call","target":"w","args":%d}`, i), e.lease)
				if err != nil || d.Decision != "proceed" {
					return fmt.Errorf("submit %d: %+v %v", i, d, err)
				}
				d, err = cxCallDecision(ref, "POST", "/v0/executions/"+e.id+"/steps/"+d.StepID+"/complete", `{"result":1}`, e.lease)
				if err != nil || d.Decision != "recorded" {
					return fmt.Errorf("complete %d: %+v %v", i, d, err)
				}
			}
			<-tick
			status, body, err := cxCall(ref, "POST", "/v0/executions/"+e.id+"/complete", `{"output":null}`, e.lease)
			if err != nil || status != 204 {
				return fmt.Errorf("execution complete: %d %s %v", status, body, err)
			}
			return nil
		}()
	}()

	var last int64
	conns := 0
	for ended := false; !ended; {
		if conns > 200 {
			t.Fatalf("no end after %d connections", conns)
		}
		h := map[string]string{}
		if last > 0 {
			h["Last-Event-ID"] = strconv.FormatInt(last, 10)
		}
		st := cxOpenSSE(t, cxBearerGet(t, e.k, path, h))
		conns++
		if st.Status == 204 {
			t.Fatalf("204 before the end frame was seen (last %d)", last)
		}
		st.checkHeaders()
		select {
		case tick <- struct{}{}:
		default:
		}
		for read := 0; read < 3; read++ {
			f, ok := st.next()
			if !ok {
				t.Fatalf("stream closed without an end frame after %d", last)
			}
			if f.Event == "end" {
				if f.Data != fmt.Sprintf(`{"execution_id":"%s","status":"completed"}`, e.id) {
					t.Fatalf("end frame %s", f.Data)
				}
				st.eof()
				ended = true
				break
			}
			if f.ID != strconv.FormatInt(last+1, 10) {
				t.Fatalf("after %d the stream sent id %q (duplicate or gap)", last, f.ID)
			}
			last++
		}
		st.cancel()
	}
	if err := <-errs; err != nil {
		t.Fatal(err)
	}
	if n := int64(len(e.rawEvents(e.id))); last != n {
		t.Fatalf("read %d events over %d connections, the log has %d", last, conns, n)
	}
	t.Logf("%d events over %d connections", last, conns)
}

// TestSSEEndOnCancel: the clean-up events of the terminal transaction come
// before the end frame (docs/protocol/executions.md §9, docs/protocol/events.md §4).
func TestSSEEndOnCancel(t *testing.T) {
	e := cxStart(t, kt.Options{}, "")
	s1 := e.proceed(e.lease, `{"kind":"tool_call","target":"a"}`)
	s2 := e.proceed(e.lease, `{"kind":"local","target":"b"}`)
	n := int64(len(e.rawEvents(e.id)))
	st := cxOpenSSE(t, cxBearerGet(t, e.k, "/v0/executions/"+e.id+"/events/stream?after_seq="+strconv.FormatInt(n, 10), nil))
	st.checkHeaders()
	e.k.Must(204, e.k.Do("POST", "/v0/executions/"+e.id+"/cancel", nil, nil))
	if ev := st.event(n + 1); ev.Type != "execution.cancelled" || ev.str("reason") != "client_cancelled" {
		t.Fatalf("frame %d: %v", n+1, ev)
	}
	for i, s := range []string{s1, s2} {
		if ev := st.event(n + 2 + int64(i)); ev.Type != "step.cancelled" || ev.str("step_id") != s {
			t.Fatalf("frame %d: %v", n+2+int64(i), ev)
		}
	}
	st.end(e.id, "cancelled")
}

// TestStreamLimit: over --max-streams open streams (event tails and delta
// streams together) the kernel answers 503 unavailable with Retry-After: 1.
func TestStreamLimit(t *testing.T) {
	e := cxStart(t, kt.Options{Args: []string{"--max-streams", "2"}}, "")
	tail := cxOpenSSE(t, cxBearerGet(t, e.k, "/v0/executions/"+e.id+"/events/stream", nil))
	tail.checkHeaders()
	deltas := cxOpenSSE(t, cxBearerGet(t, e.k, "/v0/executions/"+e.id+"/stream", nil))
	deltas.checkHeaders()
	for _, path := range []string{"/events/stream", "/stream"} {
		r := e.k.Do("GET", "/v0/executions/"+e.id+path, nil, nil)
		if r.Status != 503 || r.Code() != "unavailable" || r.Header.Get("Retry-After") != "1" {
			t.Fatalf("%s over the limit: %s %v", path, r, r.Header)
		}
	}
	// A closed stream frees its place.
	tail.cancel()
	deadline := time.Now().Add(5 * time.Second)
	for {
		again := cxOpenSSE(t, cxBearerGet(t, e.k, "/v0/executions/"+e.id+"/events/stream", nil))
		if again.Status == 200 {
			again.cancel()
			break
		}
		if again.Status != 503 || time.Now().After(deadline) {
			t.Fatalf("after closing a stream: %d %s", again.Status, again.Body)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestDeltaStream covers docs/protocol/events.md §5: consumers get the deltas posted while they are
// connected, as data-only frames, from current and superseded attempts, and
// the stream ends when the execution does.
func TestDeltaStream(t *testing.T) {
	e := cxStart(t, kt.Options{ManualClock: true}, "")
	s := e.proceed(e.lease, `{"kind":"llm_call","target":"gpt-4o"}`)
	path := "/v0/executions/" + e.id + "/stream"
	post := func(l kt.Lease, seq int64, data string) {
		t.Helper()
		body, _ := json.Marshal(map[string]any{"seq": seq, "data": data})
		r := e.a.Request("POST", "/v0/executions/"+e.id+"/steps/"+s+"/stream", body, l)
		if r.Status != 204 || len(r.Body) != 0 {
			t.Fatalf("delta %d: %s", seq, r)
		}
	}
	expect := func(c *cxSSE, seq int64, data string) {
		t.Helper()
		f, ok := c.next()
		if !ok || f.HasID || f.HasEvent {
			t.Fatalf("want a data-only frame, got %q (open %v)", f.Lines, ok)
		}
		var m map[string]any
		if err := json.Unmarshal([]byte(f.Data), &m); err != nil {
			t.Fatalf("delta frame %s: %v", f.Data, err)
		}
		want := map[string]any{"step_id": s, "seq": float64(seq), "data": data}
		if !reflect.DeepEqual(m, want) {
			t.Fatalf("delta frame %s, want %v", f.Data, want)
		}
	}
	post(e.lease, 0, "nobody is listening")
	c1 := cxOpenSSE(t, cxBearerGet(t, e.k, path, nil))
	c1.checkHeaders()
	c2 := cxOpenSSE(t, e.a.SignedRequest("GET", path, nil, kt.Lease{Occurrence: -1}, nil))
	c2.checkHeaders()
	big := strings.Repeat("é", 3500) // 7,000 bytes: the largest delta
	deltas := []string{"héllo \"there\"\nnew line", "", big, "<&>"}
	for i, d := range deltas {
		post(e.lease, int64(i+1), d)
	}
	for _, c := range []*cxSSE{c1, c2} {
		for i, d := range deltas {
			expect(c, int64(i+1), d)
		}
	}

	// A superseded attempt's delta is accepted and delivered.
	e.k.AdvanceClock(121 * time.Second)
	l2 := kt.LeaseOf(e.nextWebhook(e.id, 2))
	post(e.lease, 10, "from attempt 1")
	post(l2, 11, "from attempt 2")
	expect(c1, 10, "from attempt 1")
	expect(c1, 11, "from attempt 2")
	expect(c2, 10, "from attempt 1")
	expect(c2, 11, "from attempt 2")

	// Terminal: the streams end, new consumers get 204, producers still 204.
	e.k.Must(204, e.agentCall(e.id, "complete", `{}`, l2))
	c1.eof()
	c2.eof()
	r := e.k.Do("GET", path, nil, nil)
	if r.Status != 204 || len(r.Body) != 0 {
		t.Fatalf("delta stream of a terminal execution: %s", r)
	}
	post(l2, 12, "too late")
	other := e.k.NewAgent("other-agent", "")
	cxExpectCode(t, other.Request("GET", path, nil, kt.Lease{Occurrence: -1}), 403, "forbidden")
	cxExpectCode(t, e.k.Do("GET", "/v0/executions/018ff0a0-0000-7000-8000-000000000001/stream", nil, nil), 404, "not_found")
}
