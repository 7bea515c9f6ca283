package blackbox

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- Examples A–F (docs/protocol/resources.md §7) ----

// rfForkWant is one row of an example's fork table, in the example's
// numbering.
type rfForkWant struct {
	at      int64
	none    bool // no resource registered at the point
	covered bool
	ref     string // the restored checkpoint's ref ("" for the initial environment)
	refAt   int64  // its covered_seq
	copied  []string
	gen     int64
}

type rfEx struct {
	t     *testing.T
	k     *kt.Kernel
	a     *rfAgent
	r     *rfRun
	real  []int64 // real[c-1] is the seq of the example's event c
	o     *rfOracle
	forks map[int64]*rfFork
}

// seq translates the example's numbering to the log's.
func (x *rfEx) seq(c int64) int64 { return x.real[c-1] }

type rfExample struct {
	name string
	// full: the example lists every event; otherwise it omits
	// step.proposed and step.allowed and numbers as if they did not exist.
	full   bool
	script func(x *rfEx)
	types  []string        // the log, in the example's numbering
	gens   map[int64]int64 // workspace generation after an event
	ranges [][2]int64      // covered ranges, in the example's numbering
	forks  []rfForkWant
	after  func(x *rfEx)
}

const (
	evCreated   = "execution.created"
	evStarted   = "execution.started"
	evQueued    = "dispatch.queued"
	evAcked     = "dispatch.acked"
	evReg       = "resource.registered"
	evBound     = "resource.bound"
	evCkpt      = "resource.checkpointed"
	evCkptFail  = "resource.checkpoint_failed"
	evInit      = "resource.initialized"
	evProposed  = "step.proposed"
	evAllowed   = "step.allowed"
	evExecuting = "step.executing"
	evSucceeded = "step.succeeded"
	evCompleted = "execution.completed"
)

func rfHead(more ...string) []string {
	return append([]string{evCreated, evStarted, evQueued, evAcked, evReg, evBound}, more...)
}

var ws = []string{"workspace"}

// rfSetup registers workspace with a policy, binds it and, when baseline is
// not "", publishes the baseline at generation 0 (events 5, 6, 7).
func (x *rfEx) setup(reuse bool, every int, baseline string) {
	v := x.r.register(rfWS(reuse, every))
	if v.RegisteredSeq != 5 || v.Generation != 0 || v.Covered || string(v.Binding) != "null" || v.CheckpointRef != "" ||
		v.EverySteps != int64(every) || v.CoverageReuse != reuse || !v.OnCompletion || string(v.Configuration) != `{"template":null}` {
		x.t.Fatalf("new resource view %+v", v)
	}
	x.r.bind("workspace", `{"path":"/tmp/ws-1"}`)
	if baseline != "" {
		x.r.publish(rfCaps(rfCap("workspace", 0, baseline)))
	}
}

// step runs one step to success; caps is the complete body's extra members.
func (x *rfEx) step(kind, target string, res []string, want []rfEntry, caps string) string {
	id := x.r.live(kind, target, fmt.Sprintf(`{"n":%q}`, target), res, want...)
	x.r.done(id, fmt.Sprintf(`"did %s"`, target), caps)
	return id
}

func rfExamples() []rfExample {
	e := func(gen int64, due bool) []rfEntry { return []rfEntry{ent("workspace", gen, due)} }
	withCaps := func(entries ...string) string { return `,"captures":[` + strings.Join(entries, ",") + `]` }
	return []rfExample{
		{
			name: "A every_steps=1, the docs' agent",
			full: true,
			script: func(x *rfEx) {
				x.setup(false, 1, "B0")
				x.step("llm_call", "gpt", nil, e(1, false), "")
				x.step("tool_call", "write_file", ws, e(2, true), withCaps(rfCap("workspace", 2, "C1")))
				x.step("llm_call", "gpt2", nil, e(3, false), "")
				x.step("tool_call", "read_file", nil, e(4, false), "")
				x.step("llm_call", "gpt3", nil, e(5, false), "")
				// The handler returns; the completion capture is due since
				// the view says uncovered.
				if v := x.r.register(rfWS(false, 1)); v.Covered || v.Generation != 5 {
					x.t.Fatalf("view before completion: %+v", v)
				}
				x.r.publish(rfCaps(rfCap("workspace", 5, "C2")))
				x.r.finish()
			},
			types: rfHead(evCkpt,
				evProposed, evAllowed, evExecuting, evSucceeded,
				evProposed, evAllowed, evExecuting, evSucceeded, evCkpt,
				evProposed, evAllowed, evExecuting, evSucceeded,
				evProposed, evAllowed, evExecuting, evSucceeded,
				evProposed, evAllowed, evExecuting, evSucceeded,
				evCkpt, evCompleted),
			gens:   map[int64]int64{5: 0, 7: 0, 9: 0, 10: 1, 14: 2, 16: 2, 19: 3, 23: 4, 27: 5, 29: 5, 30: 5},
			ranges: [][2]int64{{1, 4}, {7, 9}, {15, 18}, {29, 30}},
			forks: []rfForkWant{
				{at: 3, none: true},
				{at: 6, covered: false, gen: 1},
				{at: 7, covered: true, ref: "B0", refAt: 7, gen: 0},
				{at: 9, covered: true, ref: "B0", refAt: 7, gen: 0},
				{at: 11, covered: false, ref: "B0", refAt: 7, copied: []string{"gpt"}, gen: 2},
				{at: 14, covered: false, ref: "B0", refAt: 7, copied: []string{"gpt"}, gen: 3},
				{at: 15, covered: true, ref: "C1", refAt: 15, copied: []string{"gpt", "write_file"}, gen: 2},
				{at: 18, covered: true, ref: "C1", refAt: 15, copied: []string{"gpt", "write_file"}, gen: 2},
				{at: 20, covered: false, ref: "C1", refAt: 15, copied: []string{"gpt", "write_file", "gpt2"}, gen: 4},
				{at: 28, covered: false, ref: "C1", refAt: 15, copied: []string{"gpt", "write_file", "gpt2", "read_file", "gpt3"}, gen: 6},
				{at: 29, covered: true, ref: "C2", refAt: 29, copied: []string{"gpt", "write_file", "gpt2", "read_file", "gpt3"}, gen: 5},
				{at: 30, covered: true, ref: "C2", refAt: 29, copied: []string{"gpt", "write_file", "gpt2", "read_file", "gpt3"}, gen: 5},
			},
			after: rfAfterA,
		},
		{
			name: "B every_steps=3, consecutive writes",
			script: func(x *rfEx) {
				x.setup(false, 3, "B0")
				x.step("tool_call", "w1", ws, e(1, false), "")
				x.step("tool_call", "w2", ws, e(2, false), "")
				x.step("tool_call", "w3", ws, e(3, true), withCaps(rfCap("workspace", 3, "P1")))
				x.step("tool_call", "w4", ws, e(4, false), "")
				if v := x.r.register(rfWS(false, 3)); v.Covered || v.Generation != 4 {
					x.t.Fatalf("view before completion: %+v", v)
				}
				x.r.publish(rfCaps(rfCap("workspace", 4, "C")))
				x.r.finish()
			},
			types: rfHead(evCkpt, evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt,
				evExecuting, evSucceeded, evCkpt, evCompleted),
			gens:   map[int64]int64{7: 0, 8: 1, 9: 1, 10: 2, 11: 2, 12: 3, 13: 3, 14: 3, 15: 4, 16: 4, 17: 4, 18: 4},
			ranges: [][2]int64{{1, 4}, {7, 7}, {13, 14}, {17, 18}},
			forks: []rfForkWant{
				{at: 11, covered: false, ref: "B0", refAt: 7, copied: []string{"w1", "w2"}, gen: 3},
				{at: 13, covered: true, ref: "P1", refAt: 13, copied: []string{"w1", "w2", "w3"}, gen: 3},
				{at: 16, covered: false, ref: "P1", refAt: 13, copied: []string{"w1", "w2", "w3", "w4"}, gen: 5},
			},
		},
		{
			name: "C coverage_reuse on",
			script: func(x *rfEx) {
				x.setup(true, 1, "B0")
				x.step("tool_call", "read_file", nil, nil, "")
				x.step("tool_call", "write_file", ws, e(1, true), withCaps(rfCap("workspace", 1, "P1")))
				x.step("local", "lint", nil, nil, "")
				x.step("llm_call", "gpt", nil, nil, "")
				// Still covered at the end: no completion capture.
				if v := x.r.register(rfWS(true, 1)); !v.Covered || v.Generation != 1 {
					x.t.Fatalf("view before completion: %+v", v)
				}
				x.r.finish()
			},
			types: rfHead(evCkpt, evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt,
				evExecuting, evSucceeded, evExecuting, evSucceeded, evCompleted),
			gens:   map[int64]int64{7: 0, 8: 0, 9: 0, 10: 1, 11: 1, 12: 1, 13: 1, 14: 1, 15: 1, 16: 1, 17: 1},
			ranges: [][2]int64{{1, 4}, {7, 9}, {11, 17}},
			forks: []rfForkWant{
				{at: 9, covered: true, ref: "B0", refAt: 7, copied: []string{"read_file"}, gen: 0},
				{at: 10, covered: false, ref: "B0", refAt: 7, copied: []string{"read_file"}, gen: 2},
				{at: 16, covered: true, ref: "P1", refAt: 11, copied: []string{"read_file", "write_file", "lint", "gpt"}, gen: 1},
			},
		},
		{
			name: "C coverage_reuse off",
			script: func(x *rfEx) {
				x.setup(false, 1, "B0")
				x.step("tool_call", "read_file", nil, e(1, false), "")
				x.step("tool_call", "write_file", ws, e(2, true), withCaps(rfCap("workspace", 2, "P1")))
				x.step("local", "lint", nil, e(3, false), "")
				x.step("llm_call", "gpt", nil, e(4, false), "")
				if v := x.r.register(rfWS(false, 1)); v.Covered || v.Generation != 4 {
					x.t.Fatalf("view before completion: %+v", v)
				}
				x.r.publish(rfCaps(rfCap("workspace", 4, "C2")))
				x.r.finish()
			},
			types: rfHead(evCkpt, evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt,
				evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt, evCompleted),
			gens:   map[int64]int64{7: 0, 8: 1, 10: 2, 12: 2, 13: 3, 15: 4, 17: 4, 18: 4},
			ranges: [][2]int64{{1, 4}, {7, 7}, {11, 12}, {17, 18}},
			forks: []rfForkWant{
				{at: 12, covered: true, ref: "P1", refAt: 11, copied: []string{"read_file", "write_file"}, gen: 2},
				{at: 14, covered: false, ref: "P1", refAt: 11, copied: []string{"read_file", "write_file", "lint"}, gen: 4},
			},
		},
		{
			name: "D capture failure",
			script: func(x *rfEx) {
				x.setup(false, 1, "B0")
				x.step("tool_call", "w1", ws, e(1, true), `,"capture_failures":[`+rfCapFail("workspace", 1, "snapshot quota exceeded")+`]`)
				// The counter stayed at 1: w2 is due again.
				x.step("tool_call", "w2", ws, e(2, true), withCaps(rfCap("workspace", 2, "P2")))
			},
			types:  rfHead(evCkpt, evExecuting, evSucceeded, evCkptFail, evExecuting, evSucceeded, evCkpt),
			gens:   map[int64]int64{7: 0, 8: 1, 9: 1, 10: 1, 11: 2, 12: 2, 13: 2},
			ranges: [][2]int64{{1, 4}, {7, 7}, {12, 13}},
			forks: []rfForkWant{
				{at: 10, covered: false, ref: "B0", refAt: 7, copied: []string{"w1"}, gen: 2},
				{at: 12, covered: true, ref: "P2", refAt: 12, copied: []string{"w1", "w2"}, gen: 2},
			},
			after: rfAfterD,
		},
		{
			name: "E uncovered fork, its log, and forks of it",
			script: func(x *rfEx) {
				x.setup(false, 5, "B0")
				x.step("tool_call", "w1", ws, e(1, false), "")
				x.step("tool_call", "w2", ws, e(2, false), "")
				x.step("tool_call", "w3", ws, e(3, false), "")
				x.step("llm_call", "gpt", nil, e(4, false), "")
			},
			types:  rfHead(evCkpt, evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded),
			gens:   map[int64]int64{7: 0, 8: 1, 10: 2, 12: 3, 14: 4, 15: 4},
			ranges: [][2]int64{{1, 4}, {7, 7}},
			forks: []rfForkWant{
				{at: 11, covered: false, ref: "B0", refAt: 7, copied: []string{"w1", "w2"}, gen: 3},
				{at: 15, covered: false, ref: "B0", refAt: 7, copied: []string{"w1", "w2", "w3", "gpt"}, gen: 5},
			},
			after: rfAfterE,
		},
		{
			name: "F no checkpoint at all",
			script: func(x *rfEx) {
				x.setup(false, 2, "")
				x.r.publish(`{"capture_failures":[` + rfCapFail("workspace", 0, "baseline failed") + `]}`)
				x.step("tool_call", "w1", ws, e(1, false), "")
				x.step("tool_call", "w2", ws, e(2, true), withCaps(rfCap("workspace", 2, "P1")))
			},
			types:  rfHead(evCkptFail, evExecuting, evSucceeded, evExecuting, evSucceeded, evCkpt),
			gens:   map[int64]int64{7: 0, 8: 1, 10: 2, 12: 2},
			ranges: [][2]int64{{1, 4}, {11, 12}},
			forks: []rfForkWant{
				{at: 9, covered: false, copied: []string{"w1"}, gen: 2},
			},
			after: rfAfterF,
		},
	}
}

// TestResourceExamples reproduces Examples A–F of docs/protocol/resources.md §7
// over HTTP: each log exactly, the `due` answers, the generations, the
// ranges, the point answer at every seq (against the oracle), and each fork
// of the example's table with its log and rows (against the fork model).
func TestResourceExamples(t *testing.T) {
	for _, ex := range rfExamples() {
		t.Run(ex.name, func(t *testing.T) {
			k, a := rfStartKernel(t, "")
			x := &rfEx{t: t, k: k, a: a, r: rfBegin(t, k, a, `{"task":"example"}`), forks: map[int64]*rfFork{}}
			ex.script(x)
			evs := k.Events(x.r.id)
			for _, ev := range evs {
				if ex.full || (ev.Type != evProposed && ev.Type != evAllowed) {
					x.real = append(x.real, ev.Seq)
				}
			}
			var got []string
			for _, s := range x.real {
				got = append(got, evs[s-1].Type)
			}
			if !slices.Equal(got, ex.types) {
				t.Fatalf("log (example numbering):\n got %v\nwant %v", got, ex.types)
			}
			x.o, _ = rfCheckCoverage(t, k, x.r.id)
			for c, g := range ex.gens {
				if got := x.o.genAt[x.seq(c)]["workspace"]; got != g {
					t.Fatalf("generation after %d: %d, want %d", c, got, g)
				}
			}
			var points []bool
			for c := range x.real {
				points = append(points, x.o.covered(x.seq(int64(c+1))))
			}
			if got := rfRanges(points); !reflect.DeepEqual(got, ex.ranges) {
				t.Fatalf("covered ranges (example numbering) %v, want %v", got, ex.ranges)
			}
			// Events the example omits answer as the event before them.
			for s := int64(2); s <= x.o.last; s++ {
				if typ := evs[s-1].Type; !ex.full && (typ == evProposed || typ == evAllowed) && x.o.covered(s) != x.o.covered(s-1) {
					t.Fatalf("coverage changes at %s (%d)", typ, s)
				}
			}
			for _, fw := range ex.forks {
				f := rfForkAt(t, k, x.r.id, x.seq(fw.at))
				x.forks[fw.at] = f
				what := fmt.Sprintf("fork at %d", fw.at)
				if !slices.Equal(f.targets, fw.copied) {
					t.Fatalf("%s copied %v, want %v", what, f.targets, fw.copied)
				}
				if fw.none {
					if len(f.restoration) != 0 || len(f.gen) != 0 {
						t.Fatalf("%s: restoration %v", what, f.restoration)
					}
					continue
				}
				want := map[string]any{"covered": fw.covered}
				if fw.ref != "" {
					want["checkpoint_ref"], want["checkpoint_seq"] = fw.ref, float64(x.seq(fw.refAt))
				}
				if !reflect.DeepEqual(f.restoration["workspace"], want) || f.gen["workspace"] != fw.gen {
					t.Fatalf("%s: restoration %v generation %d, want %v generation %d", what, f.restoration, f.gen["workspace"], want, fw.gen)
				}
			}
			if ex.after != nil {
				ex.after(x)
			}
		})
	}
}

// rfAfterA checks the point answer the spec shows, the log of fork(A, 15)
// row by row, and that fork's first dispatch.
func rfAfterA(x *rfEx) {
	t, k := x.t, x.k
	resp := k.Must(200, k.Do("GET", "/v0/executions/"+x.r.id+"/coverage?at_seq=23", nil, nil))
	var pa map[string]any
	resp.JSON(t, &pa)
	want := map[string]any{"execution_id": x.r.id, "at_seq": 23.0, "covered": false, "resources": []any{
		map[string]any{"key": "workspace", "covered": false, "reason": "step_started", "checkpoint_ref": "C1", "checkpoint_seq": 15.0}}}
	if !reflect.DeepEqual(pa, want) {
		t.Fatalf("point answer at 23: %s", resp.Body)
	}
	if _, pts := rfGetPoint(t, k, x.r.id, 6); len(pts) != 1 || pts[0].Reason != "no_checkpoint" || pts[0].Ref != "" {
		t.Fatalf("point answer at 6: %+v", pts)
	}
	if c, pts := rfGetPoint(t, k, x.r.id, 3); !c || len(pts) != 0 {
		t.Fatalf("point answer at 3: %v %+v", c, pts)
	}

	f := x.forks[15]
	rfWantTypes(t, "fork(A, 15)", f.evs, evCreated, "execution.forked", evReg,
		evProposed, evAllowed, evExecuting, evSucceeded, evProposed, evAllowed, evExecuting, evSucceeded,
		evInit, evCkpt, evCkpt, evStarted, evQueued, evAcked)
	rfWantPayload(t, "fork(A, 15) 2", f.evs[1], fmt.Sprintf(`{"source_execution_id":%q,"fork_seq":15,`+
		`"restoration":{"workspace":{"checkpoint_ref":"C1","checkpoint_seq":15,"covered":true}}}`, x.r.id))
	rfWantPayload(t, "fork(A, 15) 12", f.evs[11], `{"key":"workspace","generation":2,"checkpoint_ref":"C1"}`)
	rfWantPayload(t, "fork(A, 15) 13", f.evs[12], `{"key":"workspace","generation":0,"checkpoint_ref":"B0","covered_seq":3,"invalidated_seq":6}`)
	rfWantPayload(t, "fork(A, 15) 14", f.evs[13], `{"key":"workspace","generation":2,"checkpoint_ref":"C1","covered_seq":11}`)
	var cov []bool
	for p := int64(1); p <= 16; p++ {
		cov = append(cov, f.o.covered(p))
	}
	if got := rfRanges(cov); !reflect.DeepEqual(got, [][2]int64{{1, 5}, {11, 16}}) {
		t.Fatalf("fork(A, 15) coverage %v", got)
	}
	// Its first dispatch: the view restores C1, covered; the stored policy
	// wins over a different one; bind; the copies replay.
	r := rfAttach(t, k, x.a, f.id)
	v := r.register(rfWS(false, 7))
	if !v.Covered || v.CheckpointRef != "C1" || v.Generation != 2 || v.RegisteredSeq != 3 || v.EverySteps != 1 || string(v.Binding) != "null" {
		t.Fatalf("fork(A, 15) view %+v", v)
	}
	r.bind("workspace", `{"path":"/tmp/ws-2"}`)
	for _, target := range []string{"gpt", "write_file"} {
		kind := "llm_call"
		if target == "write_file" {
			kind = "tool_call"
		}
		var res []string
		if kind == "tool_call" {
			res = ws
		}
		d := r.submit(rfStepBody(kind, target, fmt.Sprintf(`{"n":%q}`, target), res...))
		if d.Decision != "replay" || d.StepID != f.stepIDs[x.stepOf(target)] || string(d.Result) != fmt.Sprintf(`"did %s"`, target) {
			t.Fatalf("fork(A, 15) replay of %s: %s", target, d.raw)
		}
	}
	if evs := k.Events(f.id); rfTypes(evs)[len(evs)-1] != evBound {
		t.Fatalf("replays wrote events: %v", rfTypes(evs[17:]))
	}
	r.finish()
}

// stepOf returns the source step id of a target.
func (x *rfEx) stepOf(target string) string {
	for _, st := range rfSteps(x.t, x.k, x.r.id) {
		if st.str("target") == target {
			return st.str("step_id")
		}
	}
	x.t.Fatalf("no step %s", target)
	return ""
}

// rfAfterD: a capture of generation 1 reported after w2's start is refused
// as stale_generation; it changes no coverage.
func rfAfterD(x *rfEx) {
	seq := x.r.lastSeq()
	x.r.publish(rfCaps(rfCap("workspace", 1, "late")))
	evs := x.r.since(seq)
	rfWantTypes(x.t, "late capture", evs, evCkptFail)
	rfWantPayload(x.t, "late capture", evs[0], `{"key":"workspace","generation":1,"error":"stale_generation"}`)
	o, _ := rfCheckCoverage(x.t, x.k, x.r.id)
	if !o.covered(x.seq(13)) || !o.covered(o.last) || o.last != x.seq(13)+1 {
		x.t.Fatal("a refused capture changed coverage")
	}
}

// rfAfterE runs F = fork(P, 15) as the example does, then forks F at 7, 13
// and 18.
func rfAfterE(x *rfEx) {
	t, k := x.t, x.k
	f := x.forks[15]
	var compressed []kt.Event
	for _, ev := range f.evs {
		if ev.Type != evProposed && ev.Type != evAllowed {
			compressed = append(compressed, ev)
		}
	}
	rfWantTypes(t, "F's log", compressed, evCreated, "execution.forked", evReg,
		evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded, evExecuting, evSucceeded,
		evInit, evCkpt, evStarted, evQueued, evAcked)
	// Run F's first dispatch. F's log numbers as the example's once the
	// copies of proposed/allowed are left out, as the example does.
	r := rfAttach(t, k, x.a, f.id)
	var fReal []int64
	renumber := func() {
		fReal = fReal[:0]
		for _, ev := range k.Events(f.id) {
			if ev.Type != evProposed && ev.Type != evAllowed {
				fReal = append(fReal, ev.Seq)
			}
		}
	}
	renumber()
	if len(fReal) != 16 {
		t.Fatalf("F has %d events in the example's numbering", len(fReal))
	}
	fev := k.Events(f.id)
	rfWantPayload(t, "F 2", fev[fReal[1]-1], fmt.Sprintf(`{"source_execution_id":%q,"fork_seq":%d,`+
		`"restoration":{"workspace":{"checkpoint_ref":"B0","checkpoint_seq":%d,"covered":false}}}`, x.r.id, x.seq(15), x.seq(7)))
	rfWantPayload(t, "F 12", fev[fReal[11]-1], `{"key":"workspace","generation":5,"checkpoint_ref":"B0"}`)
	rfWantPayload(t, "F 13", fev[fReal[12]-1], fmt.Sprintf(`{"key":"workspace","generation":0,"checkpoint_ref":"B0","covered_seq":3,"invalidated_seq":%d}`,
		fReal[3]))
	v := r.register(rfWS(false, 2))
	if v.Covered || v.CheckpointRef != "B0" || v.Generation != 5 || v.EverySteps != 5 || v.RegisteredSeq != 3 {
		t.Fatalf("F's view %+v", v)
	}
	r.bind("workspace", `{"path":"/tmp/ws-F"}`)    // 17
	r.publish(rfCaps(rfCap("workspace", 5, "B1"))) // 18: the baseline
	seq := r.lastSeq()
	for _, target := range []string{"w1", "w2", "w3", "gpt"} {
		kind, res := "tool_call", ws
		if target == "gpt" {
			kind, res = "llm_call", nil
		}
		if d := r.submit(rfStepBody(kind, target, fmt.Sprintf(`{"n":%q}`, target), res...)); d.Decision != "replay" {
			t.Fatalf("F replay of %s: %s", target, d.raw)
		}
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("replays appended %d events", n)
	}
	w4 := r.live("tool_call", "w4", `{"n":"w4"}`, ws, ent("workspace", 6, false)) // 19: F's counter is 1
	r.done(w4, `"did w4"`, "")                                                    // 20
	renumber()
	if len(fReal) != 20 {
		t.Fatalf("F has %d events in the example's numbering, want 20", len(fReal))
	}
	fo, fev := rfCheckCoverage(t, k, f.id)
	for c := int64(1); c <= 20; c++ {
		want := c <= 3 || c == 18 // 1–2 vacuous, 3 (P's 5–7), 18 (B1)
		if got := fo.covered(fReal[c-1]); got != want {
			t.Fatalf("F's coverage at %d (%s): %v, want %v", c, fev[fReal[c-1]-1].Type, got, want)
		}
	}
	fx := &rfEx{t: t, k: k, a: x.a, r: r, real: fReal}
	// fork(F, 7) lies in the copied range: it restores B0 and copies w1 and
	// w2, exactly as fork(P, 11) does.
	f7 := rfForkAt(t, k, f.id, fx.seq(7))
	p11 := x.forks[11]
	if !slices.Equal(f7.targets, p11.targets) || f7.gen["workspace"] != p11.gen["workspace"] ||
		f7.restoration["workspace"].(map[string]any)["checkpoint_ref"] != "B0" ||
		f7.restoration["workspace"].(map[string]any)["covered"] != false ||
		!slices.Equal(rfTypes(f7.evs), rfTypes(p11.evs)) {
		t.Fatalf("fork(F, 7) %v %v %v differs from fork(P, 11) %v %v %v", f7.targets, f7.gen, rfTypes(f7.evs),
			p11.targets, p11.gen, rfTypes(p11.evs))
	}
	// fork(F, 13) is uncovered (the B0 copy closed at 4): it restores B0,
	// copies all four and gets F's generation at 13 (5, from its
	// resource.initialized) plus one.
	f13 := rfForkAt(t, k, f.id, fx.seq(13))
	if !slices.Equal(f13.targets, []string{"w1", "w2", "w3", "gpt"}) || f13.gen["workspace"] != 6 ||
		!reflect.DeepEqual(f13.restoration["workspace"], map[string]any{"covered": false, "checkpoint_ref": "B0", "checkpoint_seq": 3.0}) {
		t.Fatalf("fork(F, 13): %v %v %v", f13.targets, f13.gen, f13.restoration)
	}
	r13 := rfAttach(t, k, x.a, f13.id)
	if v := r13.register(rfWS(false, 5)); v.Covered || v.CheckpointRef != "B0" || v.Generation != 6 {
		t.Fatalf("fork(F, 13) view %+v: it must take its own baseline", v)
	}
	// fork(F, 18) is covered by B1: no baseline.
	f18 := rfForkAt(t, k, f.id, fx.seq(18))
	if !slices.Equal(f18.targets, []string{"w1", "w2", "w3", "gpt"}) || f18.gen["workspace"] != 5 ||
		!reflect.DeepEqual(f18.restoration["workspace"], map[string]any{"covered": true, "checkpoint_ref": "B1", "checkpoint_seq": float64(fx.seq(18))}) {
		t.Fatalf("fork(F, 18): %v %v %v", f18.targets, f18.gen, f18.restoration)
	}
	r18 := rfAttach(t, k, x.a, f18.id)
	if v := r18.register(rfWS(false, 5)); !v.Covered || v.CheckpointRef != "B1" || v.Generation != 5 {
		t.Fatalf("fork(F, 18) view %+v", v)
	}
	// Only direct forks are listed.
	if got := rfForkIDs(t, k, x.r.id, ""); len(got) != len(x.forks) {
		t.Fatalf("P's forks %v, want %d", got, len(x.forks))
	}
	if got := rfForkIDs(t, k, f.id, ""); !slices.Equal(got, []string{f18.id, f13.id, f7.id}) {
		t.Fatalf("F's forks %v", got)
	}
}

// rfAfterF: a fork at 9 has no checkpoint to restore: create() with no ref
// and its own baseline.
func rfAfterF(x *rfEx) {
	f := x.forks[9]
	for _, ev := range f.evs {
		if ev.Type == evInit {
			rfWantPayload(x.t, "fork(F, 9) initialized", ev, `{"key":"workspace","generation":2}`)
		}
		if ev.Type == evCkpt {
			x.t.Fatalf("fork(F, 9) copied a checkpoint: %v", ev.Payload)
		}
	}
	for s := int64(5); s <= 10; s++ {
		if _, pts := rfGetPoint(x.t, x.k, x.r.id, x.seq(s)); pts[0].Reason != "no_checkpoint" || pts[0].Ref != "" {
			x.t.Fatalf("point at %d: %+v", s, pts)
		}
	}
	r := rfAttach(x.t, x.k, x.a, f.id)
	if v := r.register(rfWS(false, 2)); v.Covered || v.CheckpointRef != "" || v.Generation != 2 || v.EverySteps != 2 {
		x.t.Fatalf("fork(F, 9) view %+v", v)
	}
}

func rfForkIDs(t *testing.T, k *kt.Kernel, id, query string) []string {
	t.Helper()
	var page struct {
		Executions []map[string]any `json:"executions"`
	}
	k.Must(200, k.Do("GET", "/v0/executions/"+id+"/forks"+query, nil, nil)).JSON(t, &page)
	var out []string
	for _, e := range page.Executions {
		if e["forked_from"] != id {
			t.Fatalf("listed fork %v is not forked from %s", e["id"], id)
		}
		out = append(out, e["id"].(string))
	}
	return out
}
