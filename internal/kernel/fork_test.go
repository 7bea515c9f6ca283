package kernel

// Unit tests of forks (docs/protocol/forks.md): the rows and log a fork
// writes, checked against a model of docs/protocol/forks.md §2–§3 computed from the source's
// stored log; forks of forks; limits; and the docs/protocol/forks.md §6 guard.

import (
	"context"
	"database/sql"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

// fkCleanup are the terminal clean-up causes of docs/protocol/executions.md §9.
var fkCleanup = map[string]bool{wire.CauseExecutionCompleted: true, wire.CauseExecutionFailed: true,
	wire.CauseExecutionCancelled: true, wire.CauseDeadlineExceeded: true}

// fkCheck forks src at s and checks everything the fork wrote against the
// model; it returns the fork.
func fkCheck(t *testing.T, fx *fixture, src string, s int64) *store.Execution {
	t.Helper()
	rd := fx.k.store.Read()
	srcEvs := fx.events(src)
	before := len(srcEvs)
	so := ruBuild(t, srcEvs)
	source := fx.exec(src)
	// An in-place plan maps the copied checkpoints' seqs by arithmetic on
	// the kept counts their rows keep: the only runs it reads for mapping
	// are those holding the resources' registrations.
	plan, err := fx.k.planFork(fx.ctx, source, s)
	if err != nil {
		t.Fatalf("plan a fork of %s at %d: %v", src, s, err)
	}
	if ip := plan.inPlace; ip != nil && ip.runReads > len(plan.resources) {
		t.Fatalf("planning a fork of %s at %d read %d runs to map seqs, for %d resources and %d checkpoints",
			src, s, ip.runReads, len(plan.resources), len(plan.checkpoints))
	}
	f, err := fx.k.Fork(fx.ctx, src, ForkRequest{AtSeq: s})
	if err != nil {
		t.Fatalf("fork %s at %d: %v", src, s, err)
	}
	if n := len(fx.events(src)); n != before {
		t.Fatalf("the fork appended %d events to its source", n-before)
	}
	// A marked source is read in place (what follows checks the view); a
	// fork of an in-place fork copies what that view shows.
	if want := source.Mark != nil && !source.ForkInPlace; f.ForkInPlace != want {
		t.Fatalf("fork of %s at %d: in place %v, want %v", src, s, f.ForkInPlace, want)
	}

	// Copied steps, from the log: terminal (succeeded, failed, denied) at
	// s, except clean-up denials.
	terminal := map[string]*store.Event{}
	for _, ev := range srcEvs {
		switch ev.Type {
		case wire.EventStepSucceeded, wire.EventStepFailed, wire.EventStepDenied, wire.EventStepCancelled:
			terminal[ruPayload(t, ev)["step_id"].(string)] = ev
		}
	}
	srcSteps, err := fx.k.readSteps(fx.ctx, rd, fx.view(src), src, nil, 0, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	var copied []*store.Step
	isCopied := map[string]bool{}
	for _, st := range srcSteps {
		ev := terminal[st.StepID]
		if ev == nil || ev.Seq > s || ev.Type == wire.EventStepCancelled {
			continue
		}
		if ev.Type == wire.EventStepDenied {
			e, _ := ruPayload(t, ev)["error"].(map[string]any)
			if reason, _ := e["reason"].(string); fkCleanup[reason] {
				continue
			}
		}
		copied = append(copied, st)
		isCopied[st.StepID] = true
	}
	newID := func(st *store.Step) string {
		return identity.StepID(f.ID, st.Kind, st.Target, st.ArgsHash, st.Occurrence)
	}
	byOld := map[string]string{}
	for _, st := range copied {
		byOld[st.StepID] = newID(st)
	}
	// Copied keys and kept events.
	var keys []*ruKey
	for _, k := range so.keys {
		if k.reg <= s {
			keys = append(keys, k)
		}
	}
	var kept []*store.Event
	for _, ev := range srcEvs[:s] {
		p := ruPayload(t, ev)
		switch {
		case ev.Type == EventResourceRegistered || ev.Type == EventResourceInitialized:
			if k := so.byKey[p["key"].(string)]; k != nil && k.reg <= s {
				kept = append(kept, ev)
			}
		case strings.HasPrefix(ev.Type, "step.") && ev.Type != wire.EventStepRateLimited:
			if id, _ := p["step_id"].(string); isCopied[id] {
				kept = append(kept, ev)
			}
		}
	}
	mapSeq := func(x int64) int64 {
		n := int64(0)
		for _, ev := range kept {
			if ev.Seq <= x {
				n++
			}
		}
		if n == 0 {
			return 2
		}
		return 2 + n
	}

	// The execution row.
	e := fx.exec(f.ID)
	if e.ForkedFrom != src || e.ForkSeq != s || e.AgentID != source.AgentID || string(e.Input) != string(source.Input) ||
		e.AgentVersion != source.AgentVersion || e.ParentID != source.ParentID || e.OnBehalfOf != source.OnBehalfOf ||
		e.Status != wire.ExecRunning || e.StepCount != 0 || e.StepOrder != int64(len(copied)) {
		t.Fatalf("fork row %+v (source %+v)", e, source)
	}
	var wantKeys []string
	for _, k := range keys {
		wantKeys = append(wantKeys, k.key)
	}
	if !slices.Equal(e.ResourceKeys, wantKeys) && len(wantKeys)+len(e.ResourceKeys) > 0 {
		t.Fatalf("fork resource keys %v, want %v", e.ResourceKeys, wantKeys)
	}

	// Resources, restoration and checkpoint rows.
	restoration := map[string]any{}
	gotRes, err := rd.Resources(fx.ctx, f.ID)
	if err != nil {
		t.Fatal(err)
	}
	if len(gotRes) != len(keys) {
		t.Fatalf("fork has %d resources, want %d", len(gotRes), len(keys))
	}
	var wantRows []*store.Checkpoint
	for i, k := range keys {
		pc := so.keyPoint(k.key, s)
		from, err := rd.Resource(fx.ctx, src, k.key)
		if err != nil {
			t.Fatal(err)
		}
		want := *from
		want.ExecutionID, want.Position, want.RegisteredSeq = f.ID, int64(i), mapSeq(k.reg)
		// The generation of the checkpoint that covers the key, or one past
		// both the key's and the newest checkpoint's (docs/protocol/forks.md §2).
		want.Generation = so.genAt[s][k.key]
		var newest *ruRow
		for _, row := range k.rows {
			if row.covered <= s && (newest == nil || row.covered > newest.covered) {
				newest = row
			}
		}
		switch {
		case pc.Covered:
			want.Generation = newest.gen
		case newest != nil:
			want.Generation = max(want.Generation, newest.gen) + 1
		default:
			want.Generation++
		}
		want.Binding, want.CheckpointRef, want.StartsSinceCheckpoint = nil, pc.CheckpointRef, 0
		if !reflect.DeepEqual(gotRes[i], &want) {
			t.Fatalf("fork resource %+v, want %+v", gotRes[i], &want)
		}
		entry := map[string]any{"covered": pc.Covered}
		if pc.CheckpointSeq != 0 {
			entry["checkpoint_ref"], entry["checkpoint_seq"] = pc.CheckpointRef, float64(pc.CheckpointSeq)
		}
		restoration[k.key] = entry
		rows := slices.Clone(k.rows)
		sort.SliceStable(rows, func(i, j int) bool { return rows[i].covered < rows[j].covered })
		var mine []*store.Checkpoint
		for _, row := range rows {
			if row.covered > s {
				continue
			}
			c := &store.Checkpoint{ExecutionID: f.ID, Key: k.key, CoveredSeq: mapSeq(row.covered), Generation: row.gen, CheckpointRef: row.ref}
			if row.inv != 0 && row.inv <= s {
				c.InvalidatedSeq = mapSeq(row.inv)
			}
			if n := len(mine); n > 0 && mine[n-1].CoveredSeq == c.CoveredSeq {
				mine[n-1] = c
				continue
			}
			mine = append(mine, c)
		}
		wantRows = append(wantRows, mine...)
	}
	var gotRestoration map[string]any
	if err := json.Unmarshal(e.Restoration, &gotRestoration); err != nil || !reflect.DeepEqual(gotRestoration, restoration) {
		t.Fatalf("restoration %s, want %v", e.Restoration, restoration)
	}
	gotRows := fx.checkpoints(f.ID)
	// Checkpoints lists by key then covered_seq; the model by registration
	// order then covered_seq.
	sort.SliceStable(wantRows, func(i, j int) bool { return wantRows[i].Key < wantRows[j].Key })
	if len(gotRows) != len(wantRows) {
		t.Fatalf("fork checkpoints %+v, want %+v", gotRows, wantRows)
	}
	for i := range gotRows {
		// The kept counts are the fork's own: none in place (it keeps no
		// marks), else marksCheck holds them against its log below.
		got := *gotRows[i]
		if f.ForkInPlace && got.CoveredKept+got.InvalidatedKept != 0 {
			t.Fatalf("fork checkpoint %d of an in-place fork: %+v, want no kept counts", i, gotRows[i])
		}
		got.CoveredKept, got.InvalidatedKept = 0, 0
		if got != *wantRows[i] {
			t.Fatalf("fork checkpoint %d: %+v, want %+v", i, gotRows[i], wantRows[i])
		}
	}

	// The log.
	evs := fx.events(f.ID)
	want := []string{wire.EventExecutionCreated, wire.EventExecutionForked}
	for _, ev := range kept {
		want = append(want, ev.Type)
	}
	for range keys {
		want = append(want, EventResourceInitialized)
	}
	for range wantRows {
		want = append(want, EventResourceCheckpointed)
	}
	want = append(want, wire.EventExecutionStarted, wire.EventDispatchQueued)
	wantTypes(t, evs, want...)
	if e.LastSeq != int64(len(evs)) {
		t.Fatalf("fork last_seq %d, log %d", e.LastSeq, len(evs))
	}
	forked := ruPayload(t, evs[1])
	if forked["source_execution_id"] != src || ruInt(forked["fork_seq"]) != s || !reflect.DeepEqual(forked["restoration"], restoration) {
		t.Fatalf("execution.forked %s", evs[1].Payload)
	}
	for i, from := range kept {
		got := evs[2+i]
		p := ruPayload(t, from)
		if id, ok := p["step_id"].(string); ok {
			p["step_id"] = byOld[id]
		}
		if !reflect.DeepEqual(ruPayload(t, got), p) || !got.OccurredAt.Equal(from.OccurredAt) {
			t.Fatalf("fork event %d %s %s, want source event %d with the copy's step id", got.Seq, got.Type, got.Payload, from.Seq)
		}
	}

	// The copied steps: narrow rows sharing the bodies of the step that
	// owns them.
	gotSteps, err := fx.k.readSteps(fx.ctx, rd, fx.view(f.ID), f.ID, nil, 0, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	if len(gotSteps) != len(copied) {
		t.Fatalf("fork has %d steps, want %d", len(gotSteps), len(copied))
	}
	for i, st := range gotSteps {
		from := copied[i]
		owner, ownerStep := from.ExecutionID, from.StepID
		if from.BodyStepID != "" {
			owner, ownerStep = from.BodyExecutionID, from.BodyStepID
		}
		want := *from
		want.ExecutionID, want.StepID, want.Order = f.ID, newID(from), int64(i+1)
		want.TerminalSeq = mapSeq(terminal[from.StepID].Seq)
		want.DispatchID, want.Attempt, want.StartInfo = "", 0, nil
		want.BodyExecutionID, want.BodyStepID = owner, ownerStep
		if !reflect.DeepEqual(st, &want) {
			t.Fatalf("fork step %d:\n got %+v\nwant %+v", i, st, &want)
		}
	}

	// Coverage: against the oracle, and docs/protocol/forks.md §3's mapping.
	fo := ruCheck(t, fx, f.ID)
	creation := int64(len(evs))
	for p := int64(1); p <= creation; p++ {
		want := true
		switch {
		case p <= 2:
		case p <= int64(2+len(kept)):
			last := s
			if i := int(p - 2); i < len(kept) {
				last = kept[i].Seq - 1
			}
			want, _ = so.point(last)
		default:
			want, _ = so.point(s)
		}
		if got, _ := fo.point(p); got != want {
			t.Fatalf("fork of %s at %d: covered at %d is %v, the source's answer is %v", src, s, p, got, want)
		}
	}
	ruInvariant(t, fx, f.ID)
	if !f.ForkInPlace {
		marksCheck(t, fx, f.ID)
	}
	return f
}

// fkExampleE builds Example E's source P (every_steps=5) through the
// kernel: B0, w1–w3 declaring workspace, an LLM call.
func fkExampleE(t *testing.T, fx *fixture) (*rsRun, []string) {
	e, del := fx.start("a1")
	r := &rsRun{fx: fx, t: t, id: e.ID, del: del}
	r.register("workspace", false, 5)
	if err := fx.k.BindResource(fx.ctx, rsAgent, r.id, "workspace", hdr(del), []byte(`{"p":1}`)); err != nil {
		t.Fatal(err)
	}
	r.publish(caps(Capture{Key: "workspace", Ref: "B0"}))
	var ids []string
	for i, target := range []string{"w1", "w2", "w3"} {
		d := r.submit(wire.KindToolCall, target, "workspace")
		if !reflect.DeepEqual(d.Resources, []ResourceEntry{{"workspace", int64(i + 1), false}}) {
			t.Fatalf("%s: %+v", target, d.Resources)
		}
		r.outcome(d.StepID, true, Captures{})
		ids = append(ids, d.StepID)
	}
	d := r.submit(wire.KindLLMCall, "gpt")
	r.outcome(d.StepID, true, Captures{})
	return r, append(ids, d.StepID)
}

// TestForkExampleE checks F = fork(P, 15)'s stored rows and log exactly as
// Example E shows them, runs F's first dispatch, and forks F at 7, 13 and 18
// (the example's numbering).
func TestForkExampleE(t *testing.T) {
	fx := newFixture(t)
	p, pSteps := fkExampleE(t, fx)
	last := fx.lastSeq(p.id) // P's 15: the LLM call's outcome
	b0 := fx.exec(p.id).LastSeq - 16
	f := fkCheck(t, fx, p.id, last)
	if string(f.Restoration) != fmt.Sprintf(`{"workspace":{"checkpoint_ref":"B0","checkpoint_seq":%d,"covered":false}}`, b0) {
		t.Fatalf("restoration %s", f.Restoration)
	}
	res := func(id string) *store.Resource {
		r, err := fx.k.store.Read().Resource(fx.ctx, id, "workspace")
		if err != nil {
			t.Fatal(err)
		}
		return r
	}
	if r := res(f.ID); r.RegisteredSeq != 3 || r.Generation != 5 || r.CheckpointRef != "B0" || r.StartsSinceCheckpoint != 0 || r.Binding != nil || r.EverySteps != 5 {
		t.Fatalf("F's resource %+v", r)
	}
	rows := fx.checkpoints(f.ID)
	// B0 covers 3 (P's 5–7) and closes at w1's copied step.executing (6).
	if len(rows) != 1 || (*rows[0] != store.Checkpoint{ExecutionID: f.ID, Key: "workspace", CoveredSeq: 3, Generation: 0, CheckpointRef: "B0", InvalidatedSeq: 6}) {
		t.Fatalf("F's checkpoints %+v", rows)
	}
	steps, _ := fx.k.readSteps(fx.ctx, fx.k.store.Read(), fx.view(f.ID), f.ID, nil, 0, 100)
	if len(steps) != len(pSteps) {
		t.Fatalf("F reads %d copies, want %d", len(steps), len(pSteps))
	}
	for i, st := range steps {
		if st.BodyExecutionID != p.id || st.BodyStepID != pSteps[i] {
			t.Fatalf("F's copy %d shares %s/%s", i, st.BodyExecutionID, st.BodyStepID)
		}
	}
	// F's first dispatch: register (uncovered, B0, generation 5), bind,
	// baseline B1, the copies replay, w4 runs with F's counter at 1.
	del := fx.claim(f.ID)
	fx.ack(del)
	r := &rsRun{fx: fx, t: t, id: f.ID, del: del}
	v := r.register("workspace", false, 2)
	if v.Covered || v.CheckpointRef != "B0" || v.Generation != 5 || v.EverySteps != 5 {
		t.Fatalf("F's view %+v", v)
	}
	if err := fx.k.BindResource(fx.ctx, rsAgent, f.ID, "workspace", hdr(del), []byte(`{"p":2}`)); err != nil {
		t.Fatal(err)
	}
	r.publish(caps(Capture{Key: "workspace", Generation: 5, Ref: "B1"}))
	at18 := fx.lastSeq(f.ID)
	for _, target := range []string{"w1", "w2", "w3"} {
		if d := r.submit(wire.KindToolCall, target, "workspace"); d.Decision != wire.DecisionReplay {
			t.Fatalf("replay of %s: %+v", target, d)
		}
	}
	if d := r.submit(wire.KindLLMCall, "gpt"); d.Decision != wire.DecisionReplay {
		t.Fatalf("replay of gpt: %+v", d)
	}
	fx.noNewEvents(f.ID, at18)
	w4 := r.submit(wire.KindToolCall, "w4", "workspace")
	if !reflect.DeepEqual(w4.Resources, []ResourceEntry{{"workspace", 6, false}}) {
		t.Fatalf("w4: %+v", w4.Resources)
	}
	r.outcome(w4.StepID, true, Captures{})
	// F's positions: 7 is w2's outcome (real seq 3+8=11), 13 the B0 copy,
	// 18 B1.
	fEvs := fx.events(f.ID)
	var real []int64
	for _, ev := range fEvs {
		if ev.Type != wire.EventStepProposed && ev.Type != wire.EventStepAllowed {
			real = append(real, ev.Seq)
		}
	}
	f7 := fkCheck(t, fx, f.ID, real[6])
	p11 := fkCheck(t, fx, p.id, 7+8) // P's w2 outcome: 7 + two steps of 4 events
	if r7, r11 := res(f7.ID), res(p11.ID); r7.Generation != 3 || r11.Generation != 3 || r7.CheckpointRef != "B0" || r11.CheckpointRef != "B0" {
		t.Fatalf("fork(F, 7) %+v, fork(P, 11) %+v", r7, r11)
	}
	f13 := fkCheck(t, fx, f.ID, real[12])
	if r := res(f13.ID); r.Generation != 6 || r.CheckpointRef != "B0" {
		t.Fatalf("fork(F, 13) %+v", r)
	}
	f18 := fkCheck(t, fx, f.ID, real[17])
	if r := res(f18.ID); r.Generation != 5 || r.CheckpointRef != "B1" {
		t.Fatalf("fork(F, 18) %+v", r)
	}
	if c, _ := coveredNow(fx.ctx, fx.k.store.Read(), res(f18.ID)); !c {
		t.Fatal("fork(F, 18) is not covered")
	}
	// Copies of copies share P's bodies directly.
	steps, _ = fx.k.readSteps(fx.ctx, fx.k.store.Read(), fx.view(f13.ID), f13.ID, nil, 0, 100)
	if len(steps) == 0 {
		t.Fatal("fork(F, 13) reads no copies")
	}
	for i, st := range steps {
		if st.BodyExecutionID != p.id || st.BodyStepID != pSteps[i] || string(st.Result) != `"v"` {
			t.Fatalf("fork(F, 13) copy %d shares %s/%s (%s)", i, st.BodyExecutionID, st.BodyStepID, st.Result)
		}
	}
	// Lineage: direct forks only, newest first.
	list, err := fx.k.ListForks(fx.ctx, Caller{}, f.ID, store.ExecutionFilter{Limit: 10})
	if err != nil {
		t.Fatal(err)
	}
	var ids []string
	for _, e := range list.Executions {
		ids = append(ids, e.ID)
	}
	if !slices.Equal(ids, []string{f18.ID, f13.ID, f7.ID}) {
		t.Fatalf("F's forks %v", ids)
	}
}

// TestForkCheckpointsWithoutKeptCounts: checkpoint rows written before
// rows kept the kept counts of their seqs (0, store.Checkpoint) are mapped
// through the marks of the runs holding those seqs, to the same fork seqs.
func TestForkCheckpointsWithoutKeptCounts(t *testing.T) {
	var path string
	fx := newFixture(t, func(o *Options) { path = o.Store.(*sqlite.Store).Path() })
	p, _ := fkExampleE(t, fx)
	last := fx.lastSeq(p.id)
	rowsOf := func(f *store.Execution) []store.Checkpoint {
		var out []store.Checkpoint
		for _, r := range fx.checkpoints(f.ID) {
			r.ExecutionID = ""
			out = append(out, *r)
		}
		return out
	}
	fork := func(at int64) *store.Execution {
		f, err := fx.k.Fork(fx.ctx, p.id, ForkRequest{AtSeq: at})
		if err != nil || !f.ForkInPlace {
			t.Fatalf("fork at %d: %v", at, err)
		}
		return f
	}
	var with [][]store.Checkpoint
	for at := int64(1); at <= last; at++ {
		with = append(with, rowsOf(fork(at)))
	}
	db, err := sql.Open("sqlite", "file:"+filepath.ToSlash(path))
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	res, err := db.Exec(`UPDATE checkpoints SET covered_kept = 0, invalidated_kept = 0 WHERE execution_id = ?`, p.id)
	if n, _ := res.RowsAffected(); err != nil || n == 0 {
		t.Fatalf("forget the kept counts: %d rows, %v", n, err)
	}
	for at := int64(1); at <= last; at++ {
		plan, err := fx.k.planFork(fx.ctx, fx.exec(p.id), at)
		if err != nil {
			t.Fatal(err)
		}
		if len(plan.checkpoints) > 0 && plan.inPlace.runReads <= len(plan.resources) {
			t.Fatalf("at %d: %d runs read for %d resources and %d checkpoints", at, plan.inPlace.runReads, len(plan.resources), len(plan.checkpoints))
		}
		if got := rowsOf(fork(at)); !reflect.DeepEqual(got, with[at-1]) {
			t.Fatalf("fork at %d without kept counts: checkpoints %+v, with them %+v", at, got, with[at-1])
		}
	}
}

// TestForkCheckpointDedupe: two checkpoints of a key that map to one
// position keep the later one (docs/protocol/forks.md §2).
func TestForkCheckpointDedupe(t *testing.T) {
	r := rsStart(t)
	r.register("w", false, 1)
	r.publish(caps(Capture{Key: "w", Ref: "first"}))
	r.publish(caps(Capture{Key: "w", Ref: "second"}))
	r.publish(caps(Capture{Key: "w", Ref: "third"}))
	f := fkCheck(t, r.fx, r.id, r.fx.lastSeq(r.id))
	rows := r.fx.checkpoints(f.ID)
	if len(rows) != 1 || rows[0].CheckpointRef != "third" || rows[0].CoveredSeq != 3 {
		t.Fatalf("rows %+v", rows)
	}
	// A fork between them restores the newest at that point.
	f2 := fkCheck(t, r.fx, r.id, r.fx.lastSeq(r.id)-1)
	if !strings.Contains(string(f2.Restoration), `"checkpoint_ref":"second"`) {
		t.Fatalf("restoration %s", f2.Restoration)
	}
}

// TestForkKeptEvents: rate-limit audits, approvals, bindings, capture
// failures and the events of steps not copied are left out (docs/protocol/forks.md §3), and a
// cancelled source's clean-up denials are not copied (docs/protocol/forks.md §2).
func TestForkKeptEvents(t *testing.T) {
	pol := policyFunc(func(_ string, f StepFacts) PolicyResult {
		switch f.Target {
		case "limited":
			return PolicyResult{Decision: PolicyAllow, RuleID: "lim", RateLimit: &policy.RateLimit{MaxCalls: 1, Window: time.Minute}}
		case "ask", "ask2":
			return PolicyResult{Decision: PolicyRequireApproval, RuleID: "ask"}
		case "rm":
			return PolicyResult{Decision: PolicyDeny, RuleID: "no", Reason: "no"}
		}
		return PolicyResult{Decision: PolicyAllow, RuleID: "ok"}
	})
	r := rsStart(t, withPolicy(pol))
	r.register("w", true, 1)
	if err := r.fx.k.BindResource(r.fx.ctx, rsAgent, r.id, "w", hdr(r.del), []byte(`1`)); err != nil {
		t.Fatal(err)
	}
	r.publish(Captures{Failures: []CaptureFailure{{Key: "w", Error: "x"}}})
	a := r.submit(wire.KindToolCall, "limited")
	r.outcome(a.StepID, true, Captures{})
	limited := req(t, wire.KindToolCall, "limited", `2`)
	if d, err := r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, hdr(r.del), limited); err != nil || d.Decision != wire.DecisionRateLimited {
		t.Fatalf("limited: %+v %v", d, err)
	}
	r.fx.clk.Advance(61 * time.Second)
	d, err := r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, hdr(r.del), limited)
	if err != nil || d.Decision != wire.DecisionProceed {
		t.Fatalf("limited later: %+v %v", d, err)
	}
	r.outcome(d.StepID, true, Captures{})
	if d := r.submit(wire.KindToolCall, "rm"); d.Decision != wire.DecisionDenied {
		t.Fatalf("rm: %+v", d)
	}
	slow := r.submit(wire.KindToolCall, "slow")
	ask := r.submit(wire.KindToolCall, "ask")
	if err := r.fx.k.DecideApproval(r.fx.ctx, ask.ApprovalID, DecideRequest{Grant: true}); err != nil {
		t.Fatal(err)
	}
	r.del = r.fx.claim(r.id)
	r.fx.ack(r.del)
	resumed := r.submit(wire.KindToolCall, "ask")
	r.outcome(resumed.StepID, true, Captures{})
	if d := r.submit(wire.KindToolCall, "ask2"); d.Decision != wire.DecisionBlocked {
		t.Fatalf("ask2: %+v", d)
	}
	for s := int64(1); s <= r.fx.lastSeq(r.id); s++ {
		fkCheck(t, r.fx, r.id, s)
	}
	f := fkCheck(t, r.fx, r.id, r.fx.lastSeq(r.id))
	for _, ev := range r.fx.events(f.ID) {
		switch {
		case ev.Type == wire.EventStepRateLimited, strings.HasPrefix(ev.Type, "approval."), ev.Type == EventResourceBound,
			ev.Type == EventResourceCheckpointFailed, ev.Type == wire.EventExecutionBlocked, ev.Type == wire.EventExecutionResumed,
			ev.Type == wire.EventDispatchAcked:
			t.Fatalf("fork kept %s", ev.Type)
		}
	}
	steps, _ := r.fx.k.readSteps(r.fx.ctx, r.fx.k.store.Read(), r.fx.view(f.ID), f.ID, nil, 0, 100)
	var targets []string
	for _, st := range steps {
		targets = append(targets, st.Target)
	}
	if !slices.Equal(targets, []string{"limited", "limited", "rm", "ask"}) {
		t.Fatalf("copied %v", targets)
	}
	// Cancel: slow is cancelled, ask2 denied by the clean-up; neither is
	// copied.
	if err := r.fx.k.CancelExecution(r.fx.ctx, r.id); err != nil {
		t.Fatal(err)
	}
	if st := r.fx.step(r.id, slow.StepID); st.Status != wire.StepCancelled {
		t.Fatalf("slow %s", st.Status)
	}
	fc := fkCheck(t, r.fx, r.id, r.fx.lastSeq(r.id))
	if n := fc.StepOrder; n != 4 {
		t.Fatalf("fork of the cancelled source copied %d steps", n)
	}
}

// TestForkLimitsNotCounted: copies count against neither of the fork's
// storage limits (docs/protocol/operations.md §2.4).
func TestForkLimitsNotCounted(t *testing.T) {
	r := rsStart(t, withConfig(func(c *Config) { c.MaxStepsPerExecution = 2 }))
	for _, target := range []string{"a", "b"} {
		d := r.submit(wire.KindToolCall, target)
		r.outcome(d.StepID, true, Captures{})
	}
	f := fkCheck(t, r.fx, r.id, r.fx.lastSeq(r.id))
	src := r.fx.exec(r.id)
	if f.StepCount != 0 || f.ByteCount >= src.ByteCount {
		t.Fatalf("fork counts %d steps and %d bytes (source %d bytes)", f.StepCount, f.ByteCount, src.ByteCount)
	}
	del := r.fx.claim(f.ID)
	fr := &rsRun{fx: r.fx, t: t, id: f.ID, del: del}
	for _, target := range []string{"a", "b"} {
		if d := fr.submit(wire.KindToolCall, target); d.Decision != wire.DecisionReplay {
			t.Fatalf("replay %s: %+v", target, d)
		}
	}
	for _, target := range []string{"c", "d"} {
		if d := fr.submit(wire.KindToolCall, target); d.Decision != wire.DecisionProceed {
			t.Fatalf("own step %s: %+v", target, d)
		}
	}
	if d := fr.submit(wire.KindToolCall, "e"); d.Decision != wire.DecisionExecutionTerminal {
		t.Fatalf("third own step: %+v", d)
	}
	if e := r.fx.exec(f.ID); e.FailureReason != wire.ReasonStorageLimitExceeded {
		t.Fatalf("fork %s %q", e.Status, e.FailureReason)
	}
}

// TestForkExecutionFields: agent, input, agent_version, parent and
// on_behalf_of are kept; the deadline is fresh; the Idempotency-Key is
// shown; errors of docs/protocol/forks.md §5.
func TestForkExecutionFields(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.DeadlineTimeout = time.Hour }))
	parent, pdel := fx.start("a1")
	if err := fx.k.CompleteExecution(fx.ctx, rsAgent, parent.ID, hdr(pdel), CompleteRequest{Output: []byte(`1`)}); err != nil {
		t.Fatal(err)
	}
	e, err := fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: "a1", Input: []byte(` {"x" : 1} `), AgentVersion: "v7",
		ParentExecutionID: parent.ID, OnBehalfOf: "user:1"})
	if err != nil {
		t.Fatal(err)
	}
	fx.clk.Advance(10 * time.Minute)
	f, err := fx.k.Fork(fx.ctx, e.ID, ForkRequest{AtSeq: 2, IdempotencyKey: "k1", BodyHash: "h1"})
	if err != nil {
		t.Fatal(err)
	}
	now := fx.clk.Now().Truncate(time.Microsecond)
	if f.AgentID != "a1" || string(f.Input) != string(e.Input) || f.AgentVersion != "v7" || f.ParentID != parent.ID || f.OnBehalfOf != "user:1" ||
		!f.DeadlineAt.Equal(now.Add(time.Hour)) || !f.CreatedAt.Equal(now) || f.IdempotencyKey != "k1" || f.Status != wire.ExecRunning {
		t.Fatalf("fork %+v", f)
	}
	if stored := fx.exec(f.ID); stored.IdempotencyKey != "k1" || !stored.DeadlineAt.Equal(f.DeadlineAt) {
		t.Fatalf("stored fork %+v", stored)
	}
	again, err := fx.k.Fork(fx.ctx, e.ID, ForkRequest{AtSeq: 2, IdempotencyKey: "k1", BodyHash: "h1"})
	if err != nil || again.ID != f.ID {
		t.Fatalf("idempotent fork: %v %v", again, err)
	}
	_, err = fx.k.Fork(fx.ctx, e.ID, ForkRequest{AtSeq: 3, IdempotencyKey: "k1", BodyHash: "h2"})
	wantMessage(t, err, wire.CodeConflict, "conflict: idempotency key reused with a different body")
	_, err = fx.k.Fork(fx.ctx, e.ID, ForkRequest{AtSeq: 2, IdempotencyKey: "a b", BodyHash: "h1"})
	wantCode(t, err, wire.CodeValidation)
	last := fx.lastSeq(e.ID)
	for _, at := range []int64{0, -1, last + 1} {
		_, err := fx.k.Fork(fx.ctx, e.ID, ForkRequest{AtSeq: at})
		wantMessage(t, err, wire.CodeValidation, fmt.Sprintf("validation error: at_seq must be between 1 and %d", last))
	}
	_, err = fx.k.Fork(fx.ctx, "0190aaaa-0000-7000-8000-000000000000", ForkRequest{AtSeq: 1})
	wantCode(t, err, wire.CodeNotFound)
	// The forks_total and fork_duration metrics moved.
	m := fx.k.metrics
	reg := prometheus.NewRegistry()
	reg.MustRegister(m.ForkDuration)
	count := func() uint64 {
		mfs, err := reg.Gather()
		if err != nil || len(mfs) != 1 {
			t.Fatalf("gather: %v", err)
		}
		return mfs[0].GetMetric()[0].GetHistogram().GetSampleCount()
	}
	n, covered := count(), metric(m.Forks.WithLabelValues("true"))
	if _, err := fx.k.Fork(fx.ctx, e.ID, ForkRequest{AtSeq: 1}); err != nil {
		t.Fatal(err)
	}
	if count() != n+1 || metric(m.Forks.WithLabelValues("true")) != covered+1 {
		t.Fatal("fork metrics did not move")
	}
	// The source's agent is gone (its executions are all terminal).
	fx.agent("solo")
	s, sdel := fx.start("solo")
	if err := fx.k.CompleteExecution(fx.ctx, Caller{Agent: "solo"}, s.ID, hdr(sdel), CompleteRequest{}); err != nil {
		t.Fatal(err)
	}
	if err := fx.k.DeleteAgent(fx.ctx, "solo"); err != nil {
		t.Fatal(err)
	}
	_, err = fx.k.Fork(fx.ctx, s.ID, ForkRequest{AtSeq: 1})
	wantMessage(t, err, wire.CodeConflict, `conflict: agent "solo" is not registered`)
}

// ---- the docs/protocol/forks.md §6 guard ----

// countingStore counts write transactions.
type countingStore struct {
	store.Store
	mu      sync.Mutex
	updates int
}

func (c *countingStore) Update(ctx context.Context, lock string, fn func(context.Context, store.Tx) error) error {
	c.mu.Lock()
	c.updates++
	c.mu.Unlock()
	return c.Store.Update(ctx, lock, fn)
}

func (c *countingStore) count() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.updates
}

// fkLarge writes, through the store, an execution of agentID with n
// succeeded tool steps whose results are bodyBytes long, the four events of
// each, one resource declared by every step (every_steps n/ckpts) and a
// checkpoint accepted with every (n/ckpts)-th step's outcome, the last one
// open. With marked, the log carries its marks and the steps their first
// seqs, as the kernel writes them, so that forks read it in place; without,
// it is an execution recorded before marks, which forks copy. It returns
// the execution id.
func fkLarge(t testing.TB, st store.Store, agentID string, n, bodyBytes, ckpts int, marked bool) string {
	t.Helper()
	ctx := context.Background()
	now := t0
	id := newID()
	e := &store.Execution{ID: id, AgentID: agentID, Input: []byte(`{"large":true}`), Status: wire.ExecRunning, CreatedAt: now,
		UpdatedAt: now, ResourceKeys: []string{"workspace"}}
	if marked {
		e.Mark = &store.Mark{}
	}
	var evs []*store.Event
	emit := func(typ string, p *jsonx.Object) {
		e.LastSeq++
		ev := &store.Event{ExecutionID: id, Seq: e.LastSeq, Type: typ, Payload: p.Bytes(), OccurredAt: now, Mark: e.Mark}
		if e.Mark != nil {
			var err error
			if e.Mark, err = advanceMark(e.Mark, ev.Type, ev.Payload); err != nil {
				t.Fatal(err)
			}
		}
		evs = append(evs, ev)
	}
	emit(wire.EventExecutionCreated, (&jsonx.Object{}).String("execution_id", id).String("status", wire.ExecPending).String("agent_id", agentID))
	emit(wire.EventExecutionStarted, (&jsonx.Object{}).String("execution_id", id).String("status", wire.ExecRunning))
	every := int64(n / ckpts)
	emit(EventResourceRegistered, (&jsonx.Object{}).String("key", "workspace").String("driver_id", "d").Raw("configuration", nil).
		Bool("coverage_reuse", false).Int("every_steps", every).Bool("on_completion", true))
	res := &store.Resource{ExecutionID: id, Key: "workspace", DriverID: "d", EverySteps: every, OnCompletion: true, RegisteredSeq: e.LastSeq}
	err := st.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertExecution(ctx, e); err != nil {
			return err
		}
		if err := tx.InsertResource(ctx, res); err != nil {
			return err
		}
		return tx.AppendEvents(ctx, evs)
	})
	if err != nil {
		t.Fatal(err)
	}
	args := []byte(`{"op":"write"}`)
	argsHash, err := identity.ArgsHashBytes(args)
	if err != nil {
		t.Fatal(err)
	}
	body := []byte(`"` + strings.Repeat("b", bodyBytes-2) + `"`)
	const chunk = 1000
	// kept is the kept count after the last event (store.Checkpoint), 0
	// without marks.
	kept := func() int64 {
		if e.Mark == nil {
			return 0
		}
		return e.Mark.Kept
	}
	var open *store.Checkpoint
	for lo := 0; lo < n; lo += chunk {
		evs = evs[:0]
		var steps []*store.Step
		var rows []*store.Checkpoint
		closeSeq, closeKept := int64(0), int64(0) // the start closing the row the previous chunk left open
		for i := lo; i < min(lo+chunk, n); i++ {
			s := &store.Step{ExecutionID: id, StepID: identity.StepID(id, wire.KindToolCall, "write", argsHash, int64(i)),
				Kind: wire.KindToolCall, Target: "write", ArgsHash: argsHash, Occurrence: int64(i), Status: wire.StepSucceeded,
				Idempotency: wire.SafeToRetry, Args: args, Result: body, Resources: []string{"workspace"}, StartedAt: now, CompletedAt: now}
			e.StepOrder++
			e.StepCount++
			s.Order = e.StepOrder
			res.Generation++
			p := func() *jsonx.Object { return stepPayload(s) }
			if marked {
				s.SubmittedSeq = e.LastSeq + 1
			}
			emit(wire.EventStepProposed, p())
			emit(wire.EventStepAllowed, p())
			emit(wire.EventStepExecuting, p().Strings("resources", []string{"workspace"}).Raw("generations",
				(&jsonx.Object{}).Int("workspace", res.Generation).Bytes()))
			if open != nil {
				open.InvalidatedSeq, open.InvalidatedKept = e.LastSeq, kept()
				open = nil
			}
			if i == lo {
				closeSeq, closeKept = e.LastSeq, kept()
			}
			emit(wire.EventStepSucceeded, p())
			s.TerminalSeq = e.LastSeq
			if int64(i+1)%every == 0 {
				open = &store.Checkpoint{ExecutionID: id, Key: "workspace", CoveredSeq: e.LastSeq, Generation: res.Generation,
					CheckpointRef: fmt.Sprintf("snap-%d", i), CoveredKept: kept()}
				emit(EventResourceCheckpointed, (&jsonx.Object{}).String("key", "workspace").Int("generation", res.Generation).
					String("checkpoint_ref", open.CheckpointRef).Int("covered_seq", open.CoveredSeq))
				rows = append(rows, open)
			}
			steps = append(steps, s)
		}
		// The row left open by the previous chunk is closed by this
		// chunk's first start; rows of this chunk are written closed
		// (but the last).
		err := st.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
			for _, s := range steps {
				if err := tx.InsertStep(ctx, s); err != nil {
					return err
				}
			}
			if err := tx.InvalidateCheckpoints(ctx, id, "workspace", closeSeq, closeKept); err != nil {
				return err
			}
			for _, c := range rows {
				if err := tx.InsertCheckpoint(ctx, c); err != nil {
					return err
				}
			}
			// A step's events at a time, as the kernel appends them: one
			// large append would be stored as runs of 256, which read faster.
			for i := 0; i < len(evs); i += 4 {
				if err := tx.AppendEvents(ctx, evs[i:min(i+4, len(evs))]); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	err = st.Update(ctx, id, func(ctx context.Context, tx store.Tx) error {
		if err := tx.UpdateResource(ctx, res); err != nil {
			return err
		}
		return tx.UpdateExecution(ctx, e)
	})
	if err != nil {
		t.Fatal(err)
	}
	return id
}

// TestForkGuard asserts what a fork writes (docs/architecture.md,
// "Forks"): a fork of an execution whose log carries marks reads its
// history in place, so it writes one transaction with its own few rows
// whatever the history's length, and reads back as docs/protocol/forks.md §3 lays it out;
// a fork of an execution recorded before marks copies as docs/protocol/forks.md §6 says, one
// narrow row per copied step and no body bytes. With REBUNO_PERF_GUARD=1
// the in-place fork of 10,000 steps with 4 KiB results (about 40,000
// events and 100 checkpoints) also fails above 100 ms, the copy above
// 1.5 s.
func TestForkGuard(t *testing.T) {
	n := 10000
	if testing.Short() && os.Getenv("REBUNO_PERF_GUARD") != "1" {
		n = 2000
	}
	t.Run("in place", func(t *testing.T) { forkGuard(t, n, true) })
	t.Run("copy of an unmarked log", func(t *testing.T) { forkGuard(t, min(n, 2000), false) })
}

func forkGuard(t *testing.T, n int, marked bool) {
	var cs *countingStore
	var path string
	fx := newFixture(t, func(o *Options) {
		path = o.Store.(*sqlite.Store).Path()
		cs = &countingStore{Store: o.Store}
		o.Store = cs
	})
	fx.agent("a1")
	built := time.Now()
	src := fkLarge(t, cs, "a1", n, 4096, 100, marked)
	t.Logf("built %d steps in %v", n, time.Since(built))
	// The source is consistent: its coverage answers match the oracle at a
	// sample of points.
	o := ruBuild(t, fx.events(src))
	last := o.last
	for _, s := range []int64{1, 3, 4, 6, 400, 401, 402, last / 2, last - 1, last} {
		got, err := fx.k.CoverageAt(fx.ctx, Caller{}, src, s)
		if wc, wp := o.point(s); err != nil || got.Covered != wc || !reflect.DeepEqual(got.Resources, wp) {
			t.Fatalf("source coverage at %d: %+v %v; oracle %v %+v", s, got, err, wc, wp)
		}
	}
	if !o.keyPoint("workspace", last).Covered {
		t.Fatal("the source is not covered at its end")
	}

	db, err := sql.Open("sqlite", "file:"+filepath.ToSlash(path)+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	size := func() int64 {
		var pages, pageSize int64
		if err := db.QueryRow(`PRAGMA page_count`).Scan(&pages); err != nil {
			t.Fatal(err)
		}
		if err := db.QueryRow(`PRAGMA page_size`).Scan(&pageSize); err != nil {
			t.Fatal(err)
		}
		return pages * pageSize
	}
	before, updates := size(), cs.count()
	started := time.Now()
	f, err := fx.k.Fork(fx.ctx, src, ForkRequest{AtSeq: last})
	took := time.Since(started)
	if err != nil {
		t.Fatal(err)
	}
	t.Logf("fork of %d steps, %d events: %v", n, last, took)
	if got := cs.count() - updates; got != 1 {
		t.Fatalf("the fork used %d write transactions, want 1", got)
	}
	if f.ForkInPlace != marked {
		t.Fatalf("fork in place = %v, want %v", f.ForkInPlace, marked)
	}
	var rows, bodyBytes, shared int64
	err = db.QueryRow(`SELECT COUNT(*), COALESCE(SUM(COALESCE(LENGTH(args),0)+COALESCE(LENGTH(result),0)+COALESCE(LENGTH(error),0)),0),
 COALESCE(SUM(CASE WHEN body_execution_id = ? THEN 1 ELSE 0 END),0) FROM steps WHERE execution_id = ?`, src, f.ID).Scan(&rows, &bodyBytes, &shared)
	if err != nil {
		t.Fatal(err)
	}
	stored, err := fx.k.store.Read().Events(fx.ctx, f.ID, 0, 1<<30)
	if err != nil {
		t.Fatal(err)
	}
	var ckptRows int64
	db.QueryRow(`SELECT COUNT(*) FROM checkpoints WHERE execution_id = ?`, f.ID).Scan(&ckptRows)
	// Created, forked, initialized, the checkpoints it writes, started,
	// queued. In place it writes only the checkpoint still open at the
	// fork point and reads the 99 closed ones from its source.
	own, ownRows := int64(2+1+1+2), int64(1)
	if !marked {
		own += 1 + 4*int64(n) + 99 // the copies: registered, each step's four, and the closed checkpoints
		ownRows += 99
		if rows != int64(n) || bodyBytes != 0 || shared != int64(n) {
			t.Fatalf("fork step rows: %d copies, %d body bytes, %d sharing the source's bodies", rows, bodyBytes, shared)
		}
	} else if rows != 0 {
		t.Fatalf("the in-place fork wrote %d step rows", rows)
	}
	if int64(len(stored)) != own || ckptRows != ownRows {
		t.Fatalf("fork stored %d events and %d checkpoint rows, want %d and %d", len(stored), ckptRows, own, ownRows)
	}
	if got := fx.checkpoints(f.ID); len(got) != 100 || got[99].InvalidatedSeq != 0 || got[98].InvalidatedSeq == 0 {
		t.Fatalf("the fork reads %d checkpoints, want 100 with the last one open", len(got))
	}
	// Read as the routes read it, the fork shows its whole log and steps.
	if events := fx.events(f.ID); int64(len(events)) != int64(2+1+4*n+1+100+2) || events[len(events)-1].Seq != int64(len(events)) {
		t.Fatalf("the fork reads %d events, want %d, numbered from 1", len(events), 2+1+4*n+1+100+2)
	}
	steps, err := fx.k.readSteps(fx.ctx, fx.k.store.Read(), fx.view(f.ID), f.ID, nil, 0, 1<<30)
	if err != nil || len(steps) != n || steps[n-1].Order != int64(n) || steps[n-1].BodyExecutionID != src {
		t.Fatalf("the fork reads %d steps (%v)", len(steps), err)
	}
	// The copies read the source's bodies.
	st := fx.step(f.ID, identity.StepID(f.ID, wire.KindToolCall, "write", argsHash(t, `{"op":"write"}`), int64(n-1)))
	if len(st.Result) != 4096 || string(st.Args) != `{"op":"write"}` || st.ExecutionID != f.ID {
		t.Fatalf("copied step: %d result bytes, args %s", len(st.Result), st.Args)
	}
	grown := size() - before
	t.Logf("database grew by %d bytes (the bodies are %d bytes)", grown, int64(n)*4096)
	// The fork's own rows (a copy of the log, narrow step rows) take less
	// than the bodies; copying the bodies would add all of them. In place,
	// the fork's rows do not grow with the history at all.
	if grown >= int64(n)*4096 || marked && grown >= 256<<10 {
		t.Fatalf("the fork grew the database by %d bytes", grown)
	}
	if guard := map[bool]time.Duration{true: 100 * time.Millisecond, false: 1500 * time.Millisecond}[marked]; os.Getenv("REBUNO_PERF_GUARD") == "1" && took > guard {
		t.Fatalf("fork took %v, the guard is %v", took, guard)
	}
}

// TestForkReadsCheckpointsInPlace: an in-place fork reads the checkpoints
// its source closed by the fork point in place and writes only the rest,
// showing them as copies would be (fkCheck's model) at every fork point,
// in log pages of any size, and to its own forks. Checkpoints closed by
// LLM calls still running at the fork point map where the one taken during
// them does, and only that one is shown.
func TestForkReadsCheckpointsInPlace(t *testing.T) {
	r := rsStart(t)
	r.register("w", false, 0)
	r.register("v", true, 0)
	gen := func(key string) int64 { return r.resource(key).Generation }
	for i := range 5 {
		r.publish(caps(Capture{Key: "w", Generation: gen("w"), Ref: fmt.Sprint("w", i)}, Capture{Key: "v", Generation: gen("v"), Ref: fmt.Sprint("v", i)}))
		if i == 2 { // two rows closed together that map to one position: the later is shown
			r.publish(caps(Capture{Key: "w", Generation: gen("w"), Ref: "w2-again"}))
		}
		s := r.submit(wire.KindToolCall, fmt.Sprint("t", i), "w", "v")
		r.outcome(s.StepID, true, Captures{})
	}
	r.publish(caps(Capture{Key: "w", Generation: gen("w"), Ref: "before-llm"}))
	llmAt := r.fx.lastSeq(r.id) + 1
	if d := r.submit(wire.KindLLMCall, "think"); d.Decision != wire.DecisionProceed {
		t.Fatalf("llm: %+v", d)
	}
	r.publish(caps(Capture{Key: "w", Generation: gen("w"), Ref: "during-llm"}))
	// A second call closes that one: the three map to one position.
	if d := r.submit(wire.KindLLMCall, "think more"); d.Decision != wire.DecisionProceed {
		t.Fatalf("second llm: %+v", d)
	}
	r.publish(caps(Capture{Key: "w", Generation: gen("w"), Ref: "during-llm-2"}))
	last := r.fx.lastSeq(r.id)
	for s := int64(1); s < last; s++ {
		fkCheck(t, r.fx, r.id, s)
	}
	f := fkCheck(t, r.fx, r.id, last)
	x, err := decodeExclusions(r.fx.exec(f.ID).ForkExcluded)
	if err != nil {
		t.Fatal(err)
	}
	if len(x.Carried) != 2 || x.Carried[0].Key != "w" || x.Carried[0].Rows != 5 || x.Carried[1].Key != "v" || x.Carried[1].Rows != 5 {
		t.Fatalf("read in place: %+v, want w0–w4 and v0–v4", x.Carried)
	}
	rows := r.fx.checkpoints(f.ID)
	var refs []string
	for _, c := range rows {
		refs = append(refs, c.CheckpointRef)
	}
	if want := []string{"v0", "v1", "v2", "v3", "v4", "w0", "w1", "w2-again", "w3", "w4", "during-llm-2"}; !slices.Equal(refs, want) {
		t.Fatalf("the fork's checkpoints %v, want %v", refs, want)
	}
	stored, err := r.fx.k.store.Read().Checkpoints(r.fx.ctx, f.ID)
	if err != nil || len(stored) != 1 || stored[0].CheckpointRef != "during-llm-2" {
		t.Fatalf("the fork stored %d checkpoint rows (%v), want during-llm-2 alone", len(stored), err)
	}

	// Pages of every size show the same log.
	whole := r.fx.events(f.ID)
	rd, v := r.fx.k.store.Read(), r.fx.view(f.ID)
	for limit := 1; limit <= len(whole)+1; limit++ {
		var got []*store.Event
		for after := int64(0); ; {
			page, err := r.fx.k.readEvents(r.fx.ctx, rd, v, f.ID, after, limit)
			if err != nil {
				t.Fatal(err)
			}
			if len(page) > limit {
				t.Fatalf("limit %d: a page of %d", limit, len(page))
			}
			got = append(got, page...)
			if len(page) < limit {
				break
			}
			after = page[len(page)-1].Seq
		}
		if !reflect.DeepEqual(got, whole) {
			t.Fatalf("pages of %d: %d events, the whole log %d", limit, len(got), len(whole))
		}
	}

	// Forks of a fork copy what it shows, the rows read in place included,
	// at every point: of the fork at the end, whose log leaves out the
	// running calls that raised w's generation (a fork of it where
	// during-llm-2 covers goes on at that checkpoint's generation), and of
	// the fork taken before the calls (w0–w4 and v0–v4 read in place,
	// before-llm written).
	for s := int64(1); s <= r.fx.lastSeq(f.ID); s++ {
		fkCheck(t, r.fx, f.ID, s)
	}
	before := fkCheck(t, r.fx, r.id, llmAt-1)
	if x, err := decodeExclusions(r.fx.exec(before.ID).ForkExcluded); err != nil || len(x.Carried) != 2 {
		t.Fatalf("read in place before the LLM call: %+v %v", x, err)
	}
	for s := int64(1); s <= r.fx.lastSeq(before.ID); s++ {
		fkCheck(t, r.fx, before.ID, s)
	}
}
