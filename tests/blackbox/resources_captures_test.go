package blackbox

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- captures ----

// TestCaptureRefusals: every refusal token of docs/protocol/resources.md §4, in rule order, on the
// publish route and with step outcomes; writers, including an orphan of a
// reclaimed attempt that stops being one; a late capture of a re-run
// orphan's first attempt.
func TestCaptureRefusals(t *testing.T) {
	k, a := rfStartKernel(t, `"lease_timeout_seconds":31`)
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 1))
	r.register(`{"key":"ro","driver_id":"d","coverage_reuse":true,"every_steps":1}`)
	// Rule order within one list.
	seq := r.lastSeq()
	r.publish(`{"captures":[` + strings.Join([]string{
		rfCap("nope", 0, "x"),
		rfCap("workspace", 0, ""),
		`{"key":"workspace","generation":0,"checkpoint_ref":5}`,
		`{"key":"workspace","generation":0,"checkpoint_ref":null}`,
		`{"key":"workspace","generation":0}`,
		rfCap("workspace", 0, strings.Repeat("r", 1025)),
		rfCap("workspace", 7, "ok"),
		rfCap("nope", 0, "y"),
	}, ",") + `]}`)
	want := []string{"nope@0:unknown_resource", "workspace@0:missing_checkpoint_ref", "workspace@0:missing_checkpoint_ref",
		"workspace@0:missing_checkpoint_ref", "workspace@0:missing_checkpoint_ref", "workspace@0:checkpoint_ref_too_long",
		"workspace@7:duplicate_capture", "nope@0:unknown_resource"}
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, want) || len(r.since(seq)) != len(want) {
		t.Fatalf("refusals %v, want %v", got, want)
	}
	// A stale first entry is stale; a later one of the same key is a
	// duplicate whatever its generation.
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("workspace", 1, "stale"), rfCap("workspace", 0, "dup")))
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, []string{"workspace@1:stale_generation", "workspace@0:duplicate_capture"}) {
		t.Fatalf("refusals %v", got)
	}
	// A ref of exactly 1,024 bytes is accepted.
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("workspace", 0, strings.Repeat("r", 1024)), rfCap("ro", 0, "ro0")))
	rfWantTypes(t, "1 KiB ref", r.since(seq), evCkpt, evCkpt)
	if c := rfNum(r.since(seq)[1].Payload["covered_seq"]); c != seq+1 {
		t.Fatalf("both captures of one publish cover from its first event: %d", c)
	}

	// Writers. T1 (tool, no resources) writes workspace (no reuse), not ro.
	t1 := r.live("tool_call", "t1", "", nil, ent("workspace", 1, false))
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("workspace", 1, "w1"), rfCap("ro", 0, "ro1")))
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, []string{"workspace@1:writers_active"}) {
		t.Fatalf("writers: %v", got)
	}
	rfWantTypes(t, "writers", r.since(seq), evCkptFail, evCkpt)
	// With its own outcome T1 is no longer a writer.
	seq = r.lastSeq()
	r.done(t1, `"t1"`, `,"captures":[`+rfCap("workspace", 1, "w1b")+`]`)
	rfWantTypes(t, "capture with outcome", r.since(seq), evSucceeded, evCkpt)
	if c := rfNum(r.since(seq)[1].Payload["covered_seq"]); c != seq+1 {
		t.Fatalf("capture with an outcome covers from %d, want the outcome %d", c, seq+1)
	}
	// T2 (local, declares ro) and an LLM call L.
	t2 := r.live("local", "t2", "", []string{"ro"}, ent("ro", 1, true), ent("workspace", 2, false))
	l := r.live("llm_call", "l", "", nil, ent("workspace", 3, false))
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("ro", 1, "r"), rfCap("workspace", 3, "w")))
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, []string{"ro@1:writers_active", "workspace@3:writers_active"}) {
		t.Fatalf("writers: %v", got)
	}
	// An LLM step is never a writer.
	seq = r.lastSeq()
	r.done(t2, `"t2"`, `,"captures":[`+rfCap("ro", 1, "r2")+`,`+rfCap("workspace", 3, "w2")+`]`)
	rfWantTypes(t, "captures with T2's outcome", r.since(seq), evSucceeded, evCkpt, evCkpt)
	r.done(l, `"l"`, "")

	// An orphan of a reclaimed attempt is not a writer; its re-run is.
	t3 := r.live("tool_call", "t3", "", ws, ent("workspace", 4, true))
	seq = r.lastSeq()
	r.publish(rfCaps(rfCap("workspace", 4, "w4")))
	if got := rfFailures(t, r.since(seq)); !slices.Equal(got, []string{"workspace@4:writers_active"}) {
		t.Fatalf("before the reclaim: %v", got)
	}
	k.AdvanceClock(32 * time.Second)
	r2 := rfAttach(t, k, a, r.id)
	seq = r2.lastSeq()
	r2.publish(rfCaps(rfCap("workspace", 4, "w4-after-reclaim")))
	rfWantTypes(t, "orphan is not a writer", r2.since(seq), evCkpt)
	// The re-run: a new step.executing with retry, a higher generation, and
	// the counter counts it (due again at every_steps 1).
	seq = r2.lastSeq()
	d := r2.submit(rfStepBody("tool_call", "t3", "", ws...))
	if d.Decision != "proceed" || d.StepID != t3 || !slices.Equal(d.Resources, []rfEntry{ent("workspace", 5, true)}) {
		t.Fatalf("re-run: %s", d.raw)
	}
	evs := r2.since(seq)
	rfWantTypes(t, "re-run", evs, evExecuting)
	rfWantPayload(t, "re-run", evs[0], fmt.Sprintf(`{"step_id":%q,"step_type":"tool_call","target":"t3","resources":["workspace"],`+
		`"generations":{"workspace":5},"retry":true}`, t3))
	seq = r2.lastSeq()
	r2.publish(rfCaps(rfCap("workspace", 5, "w5")))
	if got := rfFailures(t, r2.since(seq)); !slices.Equal(got, []string{"workspace@5:writers_active"}) {
		t.Fatalf("re-run writer: %v", got)
	}
	// The first attempt reports its outcome late (recorded: the effect
	// ran), with a capture of its own generation: stale.
	seq = r2.lastSeq()
	if dd := r.doneAs(r.lease, t3, "complete", `"t3 first"`, `,"captures":[`+rfCap("workspace", 4, "late")+`]`); dd.Decision != "recorded" {
		t.Fatalf("late outcome: %s", dd.raw)
	}
	evs = r2.since(seq)
	rfWantTypes(t, "late outcome", evs, evSucceeded, evCkptFail)
	rfWantPayload(t, "late capture", evs[1], `{"key":"workspace","generation":4,"error":"stale_generation"}`)
	rfCheckCoverage(t, k, r.id)
}

// TestCaptureFailures: capture_failures on publish and outcomes, the 4 KiB
// cut, the counter rules (failures and refusals leave it, acceptance resets
// it), captures of outcomes that are not recorded, and bad shapes.
func TestCaptureFailures(t *testing.T) {
	k, a := rfStartKernel(t, "")
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 2))
	r.publish(rfCaps(rfCap("workspace", 0, "B0")))
	w1 := r.live("tool_call", "w1", "", ws, ent("workspace", 1, false))
	r.done(w1, `"1"`, "")
	w2 := r.live("tool_call", "w2", "", ws, ent("workspace", 2, true))
	long := strings.Repeat("é", 3000) + "!" // 6,001 bytes
	seq := r.lastSeq()
	r.done(w2, `"2"`, `,"capture_failures":[`+rfCapFail("workspace", 2, long)+`,{"key":"ghost","generation":9,"error":null},{"key":"g2","generation":0}]`)
	evs := r.since(seq)
	rfWantTypes(t, "failures", evs, evSucceeded, evCkptFail, evCkptFail, evCkptFail)
	if e := evs[1].Payload["error"].(string); e != strings.Repeat("é", 2048) {
		t.Fatalf("error cut to %d bytes, want 4096 at a character boundary", len(e))
	}
	rfWantPayload(t, "null error", evs[2], `{"key":"ghost","generation":9,"error":""}`)
	rfWantPayload(t, "absent error", evs[3], `{"key":"g2","generation":0,"error":""}`)
	// The counter stayed at 2. An LLM call raises the generation but is
	// never due (only declared keys are); w3 is due; its capture is
	// refused (stale), so w4 is due again; w4's is accepted, so w5 is not
	// due.
	l := r.live("llm_call", "l", "", nil, ent("workspace", 3, false))
	r.done(l, `"l"`, "")
	w3 := r.live("tool_call", "w3", "", ws, ent("workspace", 4, true))
	r.done(w3, `"3"`, `,"captures":[`+rfCap("workspace", 2, "stale")+`]`)
	w4 := r.live("tool_call", "w4", "", ws, ent("workspace", 5, true))
	seq = r.lastSeq()
	d := r.doneAs(r.lease, w4, "fail", `{"message":"boom"}`, `,"captures":[`+rfCap("workspace", 5, "P4")+`]`)
	if d.Decision != "recorded" {
		t.Fatalf("fail: %s", d.raw)
	}
	rfWantTypes(t, "capture with a failure", r.since(seq), "step.failed", evCkpt)
	w5 := r.live("tool_call", "w5", "", ws, ent("workspace", 6, false))
	// Bad shapes: 400, and the outcome is not recorded.
	seq = r.lastSeq()
	for what, extra := range map[string]string{
		"captures not a list":    `,"captures":{}`,
		"entry not an object":    `,"captures":["x"]`,
		"missing key":            `,"captures":[{"generation":1,"checkpoint_ref":"x"}]`,
		"key not a string":       `,"captures":[{"key":1,"generation":1,"checkpoint_ref":"x"}]`,
		"missing generation":     `,"captures":[{"key":"workspace","checkpoint_ref":"x"}]`,
		"negative generation":    `,"captures":[{"key":"workspace","generation":-1,"checkpoint_ref":"x"}]`,
		"fractional generation":  `,"captures":[{"key":"workspace","generation":1.5,"checkpoint_ref":"x"}]`,
		"string generation":      `,"captures":[{"key":"workspace","generation":"1","checkpoint_ref":"x"}]`,
		"unknown entry field":    `,"captures":[{"key":"workspace","generation":1,"checkpoint_ref":"x","kind":"y"}]`,
		"error in a capture":     `,"captures":[{"key":"workspace","generation":1,"error":"x"}]`,
		"ref in a failure":       `,"capture_failures":[{"key":"workspace","generation":1,"checkpoint_ref":"x"}]`,
		"error not a string":     `,"capture_failures":[{"key":"workspace","generation":1,"error":5}]`,
		"33 captures":            `,"captures":[` + strings.TrimSuffix(strings.Repeat(rfCap("workspace", 5, "x")+",", 33), ",") + `]`,
		"33 capture failures":    `,"capture_failures":[` + strings.TrimSuffix(strings.Repeat(rfCapFail("workspace", 5, "x")+",", 33), ",") + `]`,
		"failures not a list":    `,"capture_failures":"x"`,
		"unknown outcome member": `,"checkpoints":[]`,
	} {
		rfErr(t, "complete: "+what, r.call("POST", "/steps/"+w5+"/complete", `{"result":1`+extra+`}`), 400, "validation_error", "")
		rfErr(t, "publish: "+what, r.call("POST", "/resources/checkpoints", `{`+strings.TrimPrefix(extra, ",")+`}`), 400, "validation_error", "")
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("bad shapes wrote %v", rfTypes(r.since(seq)))
	}
	// 32 entries are accepted (one per list is a duplicate after the first).
	r.publish(`{"captures":[` + strings.TrimSuffix(strings.Repeat(rfCap("nope", 0, "x")+",", 32), ",") + `]}`)
	// Captures travel only with a recorded outcome.
	r.done(w5, `"5"`, "")
	seq = r.lastSeq()
	if d := r.doneAs(r.lease, w5, "complete", `"again"`, `,"captures":[`+rfCap("workspace", 5, "C")+`],"capture_failures":[`+rfCapFail("workspace", 5, "x")+`]`); d.Decision != "replay" {
		t.Fatalf("second complete: %s", d.raw)
	}
	if d := r.doneAs(r.lease, w4, "fail", `"again"`, `,"captures":[`+rfCap("workspace", 5, "C")+`]`); d.Decision != "replay" {
		t.Fatalf("second fail: %s", d.raw)
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("captures of replayed outcomes wrote %v", rfTypes(r.since(seq)))
	}
	w6 := r.live("tool_call", "w6", "", ws, ent("workspace", 7, true))
	r.finish()
	seq = r.lastSeq()
	if d := r.doneAs(r.lease, w6, "complete", `"late"`, `,"captures":[`+rfCap("workspace", 6, "C")+`]`); d.Decision != "execution_terminal" {
		t.Fatalf("complete on a terminal execution: %s", d.raw)
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("captures on a terminal execution wrote %v", rfTypes(r.since(seq)))
	}
	rfCheckCoverage(t, k, r.id)
}

// TestSubmitResources: the submit body's resources (docs/protocol/steps.md §1 hooks), the step's
// resources, and the same-attempt retry answering the stored entries.
func TestSubmitResources(t *testing.T) {
	k, a := rfStartKernel(t, "")
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 2))
	r.register(`{"key":"ro","driver_id":"d","coverage_reuse":true}`)
	seq := r.lastSeq()
	rfErr(t, "unregistered key", r.call("POST", "/steps", rfStepBody("tool_call", "x", "", "nope")), 400, "validation_error",
		`validation error: unknown resource key \"nope\"`)
	rfErr(t, "llm_call with resources", r.call("POST", "/steps", rfStepBody("llm_call", "x", "", "workspace")), 400, "validation_error", "")
	rfErr(t, "bad key", r.call("POST", "/steps", rfStepBody("tool_call", "x", "", "a b")), 400, "validation_error", "")
	rfErr(t, "resources not strings", r.call("POST", "/steps", `{"kind":"tool_call","target":"x","resources":[1]}`), 400, "validation_error", "")
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("refused submits wrote %v", rfTypes(r.since(seq)))
	}
	// [] is allowed on every kind; duplicates are dropped.
	l := r.live("llm_call", "l", "", []string{}, ent("workspace", 1, false))
	r.done(l, "1", "")
	occ := func(n int64) kt.Lease { x := r.lease; x.Occurrence = n; return x }
	x := r.submitAs(occ(0), rfStepBody("tool_call", "x", "", "ro", "workspace", "ro"))
	want := []rfEntry{ent("ro", 1, false), ent("workspace", 2, false)}
	if x.Decision != "proceed" || !slices.Equal(x.Resources, want) {
		t.Fatalf("x: %s", x.raw)
	}
	var st rfStep
	k.Must(200, k.Do("GET", r.path("/steps/"+x.StepID), nil, nil)).JSON(t, &st)
	if string(st["resources"]) != `["ro","workspace"]` {
		t.Fatalf("step resources %s", st["resources"])
	}
	// Y raises the counter to 2 while X is executing.
	y := r.submitAs(occ(0), rfStepBody("local", "y", "", "workspace"))
	if !slices.Equal(y.Resources, []rfEntry{ent("workspace", 3, true)}) {
		t.Fatalf("y: %s", y.raw)
	}
	// X's proceed was "lost": the same attempt asks again. The answer is
	// X's own start (generations 1 and 2) with due read now (true).
	seq = r.lastSeq()
	again := r.submitAs(occ(0), rfStepBody("tool_call", "x", "", "workspace"))
	if again.Decision != "proceed" || again.StepID != x.StepID || !slices.Equal(again.Resources, []rfEntry{ent("ro", 1, false), ent("workspace", 2, true)}) {
		t.Fatalf("same-attempt retry: %s", again.raw)
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("same-attempt retry wrote %v", rfTypes(r.since(seq)))
	}
	// The stored declaration counts, not the retry's.
	k.Must(200, k.Do("GET", r.path("/steps/"+x.StepID), nil, nil)).JSON(t, &st)
	if string(st["resources"]) != `["ro","workspace"]` {
		t.Fatalf("step resources after the retry %s", st["resources"])
	}
	// A step that raised nothing answers [] again.
	r.done(y.StepID, "1", "")
	r.done(x.StepID, "1", "")
	rfCheckCoverage(t, k, r.id)
}
