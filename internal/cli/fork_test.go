package cli

import (
	"bytes"
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"
)

// TestResourceTimelineLines checks the rendering of every resource event,
// of execution.forked and of what step.executing adds.
func TestResourceTimelineLines(t *testing.T) {
	t0 := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	var b bytes.Buffer
	tl := NewTimeline(&b, TimelineOptions{Origin: t0, Width: 200})
	events := []struct{ typ, payload string }{
		{"resource.registered", `{"key":"workspace","driver_id":"local.v1","configuration":{"b":1,"a":2},"coverage_reuse":false,"every_steps":1,"on_completion":true}`},
		{"resource.registered", `{"key":"db","driver_id":"pg.v1","configuration":null,"coverage_reuse":true,"every_steps":5,"on_completion":false}`},
		{"resource.registered", `{"key":"x","driver_id":"d","configuration":null,"coverage_reuse":false,"every_steps":0,"on_completion":true}`},
		{"resource.registered", `{"key":"y","driver_id":"d","configuration":null,"coverage_reuse":false,"every_steps":0,"on_completion":false}`},
		{"resource.bound", `{"key":"workspace","binding":{"sandbox_id":"i8x"}}`},
		{"resource.checkpointed", `{"key":"workspace","generation":2,"checkpoint_ref":"C1","covered_seq":15}`},
		{"resource.checkpointed", `{"key":"workspace","generation":0,"checkpoint_ref":"B0","covered_seq":3,"invalidated_seq":6}`},
		{"resource.checkpointed", `{"key":"workspace","generation":0,"checkpoint_ref":"B1","covered_seq":4,"invalidated_seq":5}`},
		{"resource.checkpoint_failed", `{"key":"workspace","generation":1,"error":"snapshot quota exceeded"}`},
		{"resource.checkpoint_failed", `{"key":"workspace","generation":1,"error":"stale_generation"}`},
		{"resource.checkpoint_failed", `{"key":"workspace","generation":3,"error":"writers_active"}`},
		{"resource.checkpoint_failed", `{"key":"nope","generation":0,"error":"unknown_resource"}`},
		{"resource.initialized", `{"key":"workspace","generation":5,"checkpoint_ref":"B0"}`},
		{"resource.initialized", `{"key":"workspace","generation":1}`},
		{"execution.forked", `{"source_execution_id":"01a237ae-7cb5-73f2-81a0-1bce14b3cad6","fork_seq":15,"restoration":{"workspace":{"checkpoint_ref":"C1","checkpoint_seq":15,"covered":true},"db":{"covered":false}}}`},
		{"execution.forked", `{"source_execution_id":"01a237ae-7cb5-73f2-81a0-1bce14b3cad6","fork_seq":3,"restoration":{}}`},
		{"step.executing", `{"step_id":"s1","step_type":"tool_call","target":"write_file","resources":["workspace","db"],"generations":{"workspace":2,"db":7}}`},
		{"step.executing", `{"step_id":"s2","step_type":"llm_call","target":"gpt","generations":{"workspace":3},"retry":true}`},
		{"resource.renamed", `{"key":"workspace","to":"w2"}`},
	}
	for i, e := range events {
		tl.Event(ev(int64(i+1), e.typ, e.payload, t0))
	}
	want := []string{
		`   1       +0s  ◆ resource.registered     workspace  driver local.v1  checkpoint every step + on completion  config {"b":1,"a":2}`,
		`   2       +0s  ◆ resource.registered     db  driver pg.v1  checkpoint every 5 steps  coverage_reuse`,
		`   3       +0s  ◆ resource.registered     x  driver d  checkpoint on completion`,
		`   4       +0s  ◆ resource.registered     y  driver d  no checkpoints`,
		`   5       +0s  ◆ resource.bound          workspace  binding {"sandbox_id":"i8x"}`,
		`   6       +0s  ◆ resource.checkpointed   workspace  checkpoint "C1"  gen 2  covers from 15`,
		`   7       +0s  ◆ resource.checkpointed   workspace  checkpoint "B0"  gen 0  covered 3-5`,
		`   8       +0s  ◆ resource.checkpointed   workspace  checkpoint "B1"  gen 0  covered 4`,
		`   9       +0s  ⚠ resource.checkpoint_failed workspace  gen 1  capture failed: "snapshot quota exceeded"`,
		`  10       +0s  ⊘ resource.checkpoint_failed workspace  gen 1  refused stale_generation: a step began after the capture`,
		`  11       +0s  ⊘ resource.checkpoint_failed workspace  gen 3  refused writers_active: a step changing it was running`,
		`  12       +0s  ⊘ resource.checkpoint_failed nope  gen 0  refused unknown_resource: the key is not registered`,
		`  13       +0s  ◆ resource.initialized    workspace  gen 5  restored from checkpoint "B0"`,
		`  14       +0s  ◆ resource.initialized    workspace  gen 1  starts from the initial environment`,
		`  15       +0s  ⑂ execution.forked        from 14b3cad6  at seq 15  uncovered  restores workspace=C1@15 db=(initial)`,
		`  16       +0s  ⑂ execution.forked        from 14b3cad6  at seq 3`,
		`  17       +0s  ▸ step.executing          tool_call write_file  changes workspace,db  gen workspace→2 db→7`,
		`  18       +0s  ↻ step.executing          llm_call gpt  gen workspace→3  re-run: its earlier run never reported an outcome`,
		`  19       +0s  ◆ resource.renamed        workspace  {"key":"workspace","to":"w2"}`,
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
	for token := range refusals {
		if RefusalText(token) == "" {
			t.Fatalf("no text for %s", token)
		}
	}
	if RefusalText("snapshot quota exceeded") != "" {
		t.Fatal("a client's text taken for a token")
	}
}

// rangesOf builds a ranges answer from (key, registered_seq, ranges) triples.
func rangesOf(last int64, overall [][2]int64, res ...any) *CoverageRanges {
	rg := &CoverageRanges{ExecutionID: "x", LastEventSeq: last, Ranges: overall}
	for i := 0; i+2 < len(res); i += 3 {
		rg.Resources = append(rg.Resources, struct {
			Key           string     `json:"key"`
			RegisteredSeq int64      `json:"registered_seq"`
			Ranges        [][2]int64 `json:"covered_ranges"`
		}{res[i].(string), res[i+1].(int64), res[i+2].([][2]int64)})
	}
	return rg
}

func pointText(pt CoveragePoint) string {
	var parts []string
	for _, r := range pt.Resources {
		s := fmt.Sprintf("%s:%s", r.Key, r.Reason)
		if r.CheckpointSeq != 0 {
			s += fmt.Sprintf(":%s@%d", r.CheckpointRef, r.CheckpointSeq)
		}
		parts = append(parts, s)
	}
	return fmt.Sprintf("%d %v [%s]", pt.AtSeq, pt.Covered, strings.Join(parts, " "))
}

// TestPointsFromLog computes the per-event answers of Example E's fork F
// (docs/protocol/resources.md §7): copied checkpoints are written after the
// copied events, so their covered_seq, not their own seq, places them.
func TestPointsFromLog(t *testing.T) {
	logTypes := map[int64]string{
		13: `{"key":"workspace","generation":0,"checkpoint_ref":"B0","covered_seq":3,"invalidated_seq":4}`,
		18: `{"key":"workspace","generation":5,"checkpoint_ref":"B1","covered_seq":18}`,
	}
	var events []Event
	for s := int64(1); s <= 20; s++ {
		typ, p := "step.succeeded", `{}`
		if x, ok := logTypes[s]; ok {
			typ, p = "resource.checkpointed", x
		}
		events = append(events, Event{Seq: s, Type: typ, Payload: json.RawMessage(p)})
	}
	rg := rangesOf(20, [][2]int64{{1, 3}, {18, 18}}, "workspace", int64(3), [][2]int64{{3, 3}, {18, 18}})
	pts := PointsFromLog(rg, events)
	if len(pts) != 20 {
		t.Fatalf("%d points", len(pts))
	}
	want := map[int64]string{
		1:  "1 true []",
		2:  "2 true []",
		3:  "3 true [workspace:covered:B0@3]",
		4:  "4 false [workspace:step_started:B0@3]",
		17: "17 false [workspace:step_started:B0@3]",
		18: "18 true [workspace:covered:B1@18]",
		19: "19 false [workspace:step_started:B1@18]",
	}
	for s, w := range want {
		if got := pointText(pts[s-1]); got != w {
			t.Errorf("point %d: %s, want %s", s, got, w)
		}
	}

	// Two resources: one registered later, one without a checkpoint yet.
	events = events[:0]
	for s := int64(1); s <= 8; s++ {
		typ, p := "step.succeeded", `{}`
		if s == 4 {
			typ, p = "resource.checkpointed", `{"key":"a","generation":0,"checkpoint_ref":"A0","covered_seq":4}`
		}
		events = append(events, Event{Seq: s, Type: typ, Payload: json.RawMessage(p)})
	}
	rg = rangesOf(8, [][2]int64{{1, 1}, {4, 5}}, "a", int64(2), [][2]int64{{4, 8}}, "b", int64(6), [][2]int64{})
	pts = PointsFromLog(rg, events)
	for s, w := range map[int64]string{
		1: "1 true []",
		2: "2 false [a:no_checkpoint]",
		5: "5 true [a:covered:A0@4]",
		6: "6 false [a:covered:A0@4 b:no_checkpoint]",
	} {
		if got := pointText(pts[s-1]); got != w {
			t.Errorf("two keys, point %d: %s, want %s", s, got, w)
		}
	}
	st := newStyles(&bytes.Buffer{}, false)
	if c := st.forkCell(pts[5]); c != "✘ b: no checkpoint" {
		t.Fatalf("fork cell %q", c)
	}
	if c := restoreCell(pts[5]); c != "a=A0@4 b=(initial)" {
		t.Fatalf("restore cell %q", c)
	}
	if c := restoreCell(pts[0]); c != "-" {
		t.Fatalf("restore cell of no resources %q", c)
	}
	if c := st.forkCell(pts[1]); c != "✘ no checkpoint" {
		t.Fatalf("fork cell %q", c)
	}
}

func TestRestorationAndRanges(t *testing.T) {
	rs := parseRestoration(json.RawMessage(`{"zeta":{"checkpoint_ref":"Z","checkpoint_seq":9,"covered":true},"alpha":{"covered":false}}`))
	if len(rs) != 2 || rs[0] != (Restore{Key: "zeta", Ref: "Z", Seq: 9, Covered: true}) || rs[1] != (Restore{Key: "alpha"}) {
		t.Fatalf("restoration out of order or misread: %+v", rs)
	}
	if restorationCovered(rs) || !restorationCovered(nil) || !restorationCovered(rs[:1]) {
		t.Fatal("restorationCovered")
	}
	if parseRestoration(json.RawMessage(`null`)) != nil || members(json.RawMessage(`[1]`)) != nil {
		t.Fatal("non-objects")
	}
	if got := rangesText([][2]int64{{1, 4}, {7, 7}, {9, 30}}); got != "1-4, 7, 9-30" {
		t.Fatalf("ranges %q", got)
	}
	if rangesText(nil) != "none" {
		t.Fatal("empty ranges")
	}
	long := strings.Repeat("r", 64)
	if got := restoreCompact("k", long, 3); got != "k="+strings.Repeat("r", 23)+"…@3" {
		t.Fatalf("long ref %q", got)
	}

	// exec get of a fork.
	var b bytes.Buffer
	a := New(Options{Out: &b, Err: &bytes.Buffer{}, FixedURL: "http://127.0.0.1:1"})
	seq := int64(22)
	a.printExecution(&Execution{ID: "f", AgentID: "coder", Status: "running", ForkedFrom: "src", ForkSeq: &seq,
		Restoration: json.RawMessage(`{"workspace":{"checkpoint_ref":"C1","checkpoint_seq":15,"covered":false},"db":{"covered":false}}`)})
	for _, want := range []string{
		"  forked from    src at event 22\n",
		"  restoration    not covered: a resource starts from an earlier state\n",
		"    workspace    from checkpoint \"C1\" (event 15): older than the fork point; later steps replay without their changes\n",
		"    db           from the initial environment (no checkpoint at or before the fork point)\n",
	} {
		if !strings.Contains(b.String(), want) {
			t.Errorf("exec get lacks %q:\n%s", want, b.String())
		}
	}
}
