package cli

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"
)

func TestFormatDuration(t *testing.T) {
	for d, want := range map[time.Duration]string{
		0:                        "0s",
		500 * time.Microsecond:   "500µs",
		406 * time.Millisecond:   "406ms",
		2 * time.Second:          "2s",
		2400 * time.Millisecond:  "2.4s",
		1050 * time.Millisecond:  "1.05s",
		32500 * time.Millisecond: "32.5s",
		65 * time.Second:         "1m05s",
		123 * time.Minute:        "2h03m",
		50 * time.Hour:           "2d02h",
	} {
		if got := FormatDuration(d); got != want {
			t.Errorf("FormatDuration(%v) = %q, want %q", d, got, want)
		}
	}
}

func TestRelativeTime(t *testing.T) {
	now := time.Date(2026, 12, 2, 12, 0, 0, 0, time.UTC)
	for d, want := range map[time.Duration]string{
		0:                   "just now",
		3 * time.Second:     "3s ago",
		5 * time.Minute:     "5m ago",
		2 * time.Hour:       "2h ago",
		72 * time.Hour:      "3d ago",
		-90 * time.Second:   "in 1m",
		40 * 24 * time.Hour: now.Add(-40 * 24 * time.Hour).Local().Format("2006-01-02"),
	} {
		if got := RelativeTime(now.Add(-d), now); got != want {
			t.Errorf("RelativeTime(-%v) = %q, want %q", d, got, want)
		}
	}
}

func TestTruncateAndCompact(t *testing.T) {
	if got := CompactJSON([]byte(" {\"a\": [1.50,\n 2e3], \"b\" : \"x\"} ")); got != `{"a":[1.50,2e3],"b":"x"}` {
		t.Fatalf("compact: %s", got)
	}
	if got := Truncate("abcdefgh", 5); got != "abcd…" {
		t.Fatalf("truncate: %q", got)
	}
	if got := Truncate("héllo", 10); got != "héllo" {
		t.Fatalf("truncate short: %q", got)
	}
}

func ev(seq int64, typ, payload string, at time.Time) Event {
	return Event{Seq: seq, Type: typ, Payload: []byte(payload), OccurredAt: at}
}

// TestTimelineLines checks the rendering of each kind of event, the step
// duration, the args/result lookup and the no-repeat rule.
func TestTimelineLines(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	var lookups []string
	steps := func(id string, fresh bool) *Step {
		lookups = append(lookups, fmt.Sprintf("%s/%v", id, fresh))
		return &Step{StepID: id, Status: "succeeded", Args: []byte(`{"q": "x"}`), Result: []byte(`{"hits": 3}`)}
	}
	var b bytes.Buffer
	tl := NewTimeline(&b, TimelineOptions{Origin: t0, Steps: steps, Width: 200})
	step := `"step_id":"s1","step_type":"tool_call","target":"web_search"`
	tl.Event(ev(1, "execution.created", `{"agent_id":"researcher","status":"pending"}`, t0))
	tl.Event(ev(2, "dispatch.acked", `{"attempt":2,"status":"acked"}`, t0.Add(5*time.Millisecond)))
	tl.Event(ev(3, "step.proposed", "{"+step+"}", t0.Add(10*time.Millisecond)))
	tl.Event(ev(4, "step.executing", "{"+step+`,"retry":true}`, t0.Add(10*time.Millisecond)))
	tl.Event(ev(5, "step.succeeded", "{"+step+"}", t0.Add(1510*time.Millisecond)))
	tl.Event(ev(5, "step.succeeded", "{"+step+"}", t0.Add(1510*time.Millisecond))) // a repeat: ignored
	tl.Event(ev(6, "dispatch.failed", `{"attempt":3,"http_status":503,"error":"503 Service Unavailable"}`, t0.Add(2*time.Second)))
	tl.Event(ev(7, "dispatch.lease_expired", `{"attempt":3,"status":"exhausted"}`, t0.Add(3*time.Second)))
	tl.Event(ev(8, "step.denied", `{"step_id":"s2","step_type":"tool_call","target":"rm","rule_id":"r9","error":{"reason":"no"}}`, t0.Add(3*time.Second)))
	tl.Event(ev(9, "approval.granted", `{"approval_id":"01a237ae-7cb5-73f2-81a0-1bce14b3cad6","decided_by":"alice","rationale":"ok"}`, t0.Add(4*time.Second)))
	tl.Event(ev(10, "execution.failed", `{"reason":"dispatch_exhausted"}`, t0.Add(65*time.Second)))
	tl.Event(ev(11, "resource.bound", `{"key":"ws","binding":{"dir":"/w"}}`, t0.Add(65*time.Second)))
	tl.Event(ev(12, "something.new", `{"x":1}`, t0.Add(65*time.Second)))
	// A fork's copied events keep their source's earlier times.
	tl.Event(ev(13, "step.proposed", "{"+step+"}", t0.Add(-3990*time.Millisecond)))
	want := []string{
		"   1       +0s  ● execution.created       agent researcher",
		"   2      +5ms  → dispatch.acked          attempt 2 delivered  (redelivery)",
		`   3     +10ms  · step.proposed           tool_call web_search  {"q":"x"}`,
		"   4     +10ms  ↻ step.executing          tool_call web_search  re-run: its earlier run never reported an outcome",
		`   5    +1.51s  ✔ step.succeeded          tool_call web_search  1.5s  → {"hits":3}`,
		"   6       +2s  ⚠ dispatch.failed         attempt 3 failed  HTTP 503  503 Service Unavailable",
		"   7       +3s  ⚠ dispatch.lease_expired  attempt 3: lease expired  attempts exhausted",
		"   8       +3s  ⊘ step.denied             tool_call rm  no  rule r9",
		`   9       +4s  ✔ approval.granted        approval 14b3cad6  by alice  "ok"`,
		"  10    +1m05s  ✘ execution.failed        dispatch_exhausted",
		`  11    +1m05s  ◆ resource.bound          ws  binding {"dir":"/w"}`,
		`  12    +1m05s  · something.new           {"x":1}`,
		`  13    -3.99s  · step.proposed           tool_call web_search  {"q":"x"}`,
	}
	got := strings.Split(strings.TrimRight(b.String(), "\n"), "\n")
	if len(got) != len(want) {
		t.Fatalf("got %d lines:\n%s", len(got), b.String())
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d:\n got %q\nwant %q", i+1, got[i], want[i])
		}
	}
	if strings.Join(lookups, " ") != "s1/false s1/true s1/false" {
		t.Fatalf("step lookups: %v", lookups)
	}
	if tl.LastSeq() != 13 {
		t.Fatalf("last seq %d", tl.LastSeq())
	}
}

func TestTimelineWidthAndFooter(t *testing.T) {
	var b bytes.Buffer
	tl := NewTimeline(&b, TimelineOptions{Width: 60})
	tl.Event(ev(1, "execution.completed", `{"output":{"text":"`+strings.Repeat("x", 100)+`"}}`, time.Time{}))
	line := strings.TrimRight(b.String(), "\n")
	if n := len([]rune(line)); n != 60 || !strings.HasSuffix(line, "…") {
		t.Fatalf("line of %d runes: %q", n, line)
	}
	b.Reset()
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	tl.Footer(&Execution{ID: "01a237ae-7cb5-73f2-81a0-1bce14b3cad6", Status: "cancelled", FailureReason: "client_cancelled",
		CreatedAt: t0, UpdatedAt: t0.Add(3 * time.Second)})
	if got := b.String(); got != "✘ execution 14b3cad6 cancelled after 3s: client_cancelled\n" {
		t.Fatalf("footer %q", got)
	}
}

func TestColourOnlyWhenAsked(t *testing.T) {
	var plain, colour bytes.Buffer
	for _, c := range []struct {
		b  *bytes.Buffer
		on bool
	}{{&plain, false}, {&colour, true}} {
		tl := NewTimeline(c.b, TimelineOptions{Color: c.on})
		tl.Event(ev(1, "execution.failed", `{"reason":"boom"}`, time.Time{}))
	}
	if strings.Contains(plain.String(), "\x1b[") || !strings.Contains(colour.String(), "\x1b[") {
		t.Fatalf("plain %q colour %q", plain.String(), colour.String())
	}
}

// TestResolveExecution covers full ids, unique suffixes, ambiguity and
// unknown suffixes against a fake list.
func TestResolveExecution(t *testing.T) {
	ids := []string{
		"01a237ae-7cb5-73f2-81a0-1bce14b3cad6",
		"01a237ae-7cb6-73f2-81a0-aaaa14b3cad6",
		"01a237ae-7cb7-73f2-81a0-000000abcdef",
	}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/v0/executions" || r.URL.Query().Get("limit") != "200" {
			http.Error(w, `{"code":"not_found","message":"route not found"}`, 404)
			return
		}
		var rows []string
		for _, id := range ids {
			rows = append(rows, fmt.Sprintf(`{"id":%q,"agent_id":"a","status":"running","created_at":"2026-12-02T09:00:00Z"}`, id))
		}
		fmt.Fprintf(w, `{"executions":[%s]}`, strings.Join(rows, ","))
	}))
	defer srv.Close()
	a := New(Options{Out: &bytes.Buffer{}, Err: &bytes.Buffer{}, FixedURL: srv.URL})
	ctx := context.Background()

	if id, err := a.ResolveExecution(ctx, "01A237AE-7CB5-73F2-81A0-1BCE14B3CAD6"); err != nil || id != ids[0] {
		t.Fatalf("full id: %q %v", id, err)
	}
	if id, err := a.ResolveExecution(ctx, "ABCDEF"); err != nil || id != ids[2] {
		t.Fatalf("suffix: %q %v", id, err)
	}
	if id, err := a.ResolveExecution(ctx, "1bce14b3cad6"); err != nil || id != ids[0] {
		t.Fatalf("long suffix: %q %v", id, err)
	}
	_, err := a.ResolveExecution(ctx, "14b3cad6")
	var ue *UsageError
	if !errors.As(err, &ue) || !strings.Contains(ue.Msg, "ambiguous") || !strings.Contains(ue.Msg, ids[0]) || !strings.Contains(ue.Msg, ids[1]) {
		t.Fatalf("ambiguous: %v", err)
	}
	if ExitCode(err) != ExitUsage {
		t.Fatalf("ambiguous exit %d", ExitCode(err))
	}
	_, err = a.ResolveExecution(ctx, "999999")
	var ae *APIError
	if !errors.As(err, &ae) || ae.Code != "not_found" || ExitCode(err) != ExitKernelError {
		t.Fatalf("unknown suffix: %v", err)
	}
	for _, bad := range []string{"12345", "xyzxyz", "0123456789abc", "01a237ae-7cb5"} {
		if _, err := a.ResolveExecution(ctx, bad); !errors.As(err, &ue) {
			t.Fatalf("%q: %v", bad, err)
		}
	}
}

func TestReportFormats(t *testing.T) {
	var b bytes.Buffer
	code := Report(&b, &APIError{Status: 400, Code: "validation_error", Message: "validation error: limit must be >= 0",
		Details: map[string]any{"field": "limit"}})
	if code != 1 || b.String() != "error: validation_error: validation error: limit must be >= 0\n" {
		t.Fatalf("%d %q", code, b.String())
	}
	b.Reset()
	code = Report(&b, &APIError{Status: 500, Code: "internal_error", Message: "internal error", Details: map[string]any{"request_id": "r1"}})
	if code != 1 || !strings.Contains(b.String(), "request id: r1") {
		t.Fatalf("%d %q", code, b.String())
	}
	b.Reset()
	if code := Report(&b, &EndedError{ID: "x", Status: "failed", Reason: "r"}); code != 4 || b.Len() != 0 {
		t.Fatalf("%d %q", code, b.String())
	}
	if code := Report(&b, &EndedError{ID: "x", Status: "failed", Reason: "boom", Explain: true}); code != 4 || b.String() != "error: execution x ended failed: boom\n" {
		t.Fatalf("%d %q", code, b.String())
	}
	b.Reset()
	if code := Report(&b, &UnreachableError{URL: "u", Cause: "c"}); code != 3 {
		t.Fatal(code)
	}
}
