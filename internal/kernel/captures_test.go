package kernel

// Tests of live starts, captures and the writers a capture waits for, and
// a property test of coverage against a model.

import (
	"fmt"
	"math/rand/v2"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/wire"
)

// TestLiveStartsOnly: denials, blocks, rate limits, replays and answers to a
// blocked execution never start; a resume after a grant does (docs/protocol/resources.md §3.1).
func TestLiveStartsOnly(t *testing.T) {
	pol := policyFunc(func(_ string, f StepFacts) PolicyResult {
		switch {
		case strings.HasPrefix(f.Target, "deny"):
			return PolicyResult{Decision: PolicyDeny, RuleID: "no", Reason: "no"}
		case strings.HasPrefix(f.Target, "ask"):
			return PolicyResult{Decision: PolicyRequireApproval, RuleID: "ask"}
		case strings.HasPrefix(f.Target, "limited"):
			return PolicyResult{Decision: PolicyAllow, RuleID: "lim", RateLimit: &policy.RateLimit{MaxCalls: 1, Window: time.Hour}}
		}
		return PolicyResult{Decision: PolicyAllow, RuleID: "ok"}
	})
	r := rsStart(t, withPolicy(pol))
	r.register("w", false, 1)
	gen := func() int64 { return r.resource("w").Generation }
	if d := r.submit(wire.KindToolCall, "deny-1", "w"); d.Decision != wire.DecisionDenied || d.Resources != nil || gen() != 0 {
		t.Fatalf("denied: %+v, generation %d", d, gen())
	}
	l1 := r.submit(wire.KindToolCall, "limited", "w")
	if l1.Decision != wire.DecisionProceed || gen() != 1 {
		t.Fatalf("first limited: %+v", l1)
	}
	r.outcome(l1.StepID, true, Captures{})
	again := req(t, wire.KindToolCall, "limited", `1`)
	again.Resources = []string{"w"}
	if d, err := r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, hdr(r.del), again); err != nil || d.Decision != wire.DecisionRateLimited || gen() != 1 {
		t.Fatalf("rate limited: %+v %v, generation %d", d, err, gen())
	}
	if d, err := r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, hdr(r.del), SubmitRequest{Kind: wire.KindToolCall, Target: "limited",
		Resources: []string{"w"}, HasOccurrence: true}); err != nil || d.Decision != wire.DecisionReplay || gen() != 1 {
		t.Fatalf("replay: %+v %v", d, err)
	}
	if r.resource("w").StartsSinceCheckpoint != 1 {
		t.Fatalf("counter %d", r.resource("w").StartsSinceCheckpoint)
	}
	ask := r.submit(wire.KindToolCall, "ask-1", "w")
	if ask.Decision != wire.DecisionBlocked || gen() != 1 {
		t.Fatalf("blocked: %+v", ask)
	}
	if d := r.submit(wire.KindToolCall, "other", "w"); d.Decision != wire.DecisionExecutionBlocked || gen() != 1 {
		t.Fatalf("while blocked: %+v", d)
	}
	// While blocked, the released dispatch still gets the ordinary answers
	// on the resource routes.
	if _, err := r.registerReq(RegisterRequest{Key: "w2", DriverID: "d", CoverageReuse: true}); err != nil {
		t.Fatalf("register while blocked: %v", err)
	}
	if err := r.fx.k.DecideApproval(r.fx.ctx, ask.ApprovalID, DecideRequest{Grant: true, DecidedBy: "ops"}); err != nil {
		t.Fatal(err)
	}
	r.del = r.fx.claim(r.id)
	r.fx.ack(r.del)
	seq := r.fx.lastSeq(r.id)
	d := r.submit(wire.KindToolCall, "ask-1", "w")
	if d.Decision != wire.DecisionProceed || !reflect.DeepEqual(d.Resources, []ResourceEntry{{Key: "w", Generation: 2, Due: true}}) {
		t.Fatalf("resume: %+v", d)
	}
	evs := r.fx.eventsAfter(r.id, seq)
	wantTypes(t, evs, wire.EventStepExecuting)
	wantPayload(t, evs[0], fmt.Sprintf(`{"generations":{"w":2},"resources":["w"],"step_id":%q,"step_type":"tool_call","target":"ask-1"}`, d.StepID))
}

// TestCaptureMetrics: rebuno_checkpoints_total and
// rebuno_checkpoint_failures_total{error} (docs/protocol/resources.md §6).
func TestCaptureMetrics(t *testing.T) {
	r := rsStart(t)
	r.register("w", false, 1)
	m := r.fx.k.metrics
	before := map[string]float64{}
	for _, l := range []string{"reported", refusalUnknown, refusalMissingRef, refusalDuplicate, refusalStale} {
		before[l] = metric(m.CheckpointFailures.WithLabelValues(l))
	}
	accepted := metric(m.Checkpoints)
	r.publish(Captures{
		Captures: []Capture{{Key: "w", Ref: "a"}, {Key: "w", Ref: "b"}, {Key: "x", Ref: "c"}, {Key: "w", Generation: 0}},
		Failures: []CaptureFailure{{Key: "w", Error: "e1"}, {Key: "w", Error: "e2"}},
	})
	r.publish(caps(Capture{Key: "w", Generation: 3, Ref: "s"}))
	if got := metric(m.Checkpoints) - accepted; got != 1 {
		t.Fatalf("checkpoints_total moved by %v", got)
	}
	for l, want := range map[string]float64{"reported": 2, refusalUnknown: 1, refusalMissingRef: 1, refusalDuplicate: 1, refusalStale: 1} {
		if got := metric(m.CheckpointFailures.WithLabelValues(l)) - before[l]; got != want {
			t.Errorf("checkpoint_failures_total{error=%q} moved by %v, want %v", l, got, want)
		}
	}
	// The failures come first, then the captures in order; the fourth is
	// missing_checkpoint_ref, which comes before duplicate_capture.
	var tokens []string
	for _, ev := range r.fx.events(r.id) {
		if ev.Type == EventResourceCheckpointFailed {
			tokens = append(tokens, payloadField(t, ev, "error").Str)
		}
	}
	if !slices.Equal(tokens, []string{"e1", "e2", refusalDuplicate, refusalUnknown, refusalMissingRef, refusalStale}) {
		t.Fatalf("tokens %v", tokens)
	}
}

// TestCaptureOrderAndCoveredSeq: failures first, then captures in order; a
// publish's checkpoints cover from its first event, an outcome's from the
// outcome (docs/protocol/resources.md §4).
func TestCaptureOrderAndCoveredSeq(t *testing.T) {
	r := rsStart(t)
	r.register("a", false, 1)
	r.register("b", false, 1)
	seq := r.fx.lastSeq(r.id)
	r.publish(Captures{Captures: []Capture{{Key: "b", Ref: "rb"}, {Key: "a", Ref: "ra"}}, Failures: []CaptureFailure{{Key: "a", Error: "x"}}})
	evs := r.fx.eventsAfter(r.id, seq)
	wantTypes(t, evs, EventResourceCheckpointFailed, EventResourceCheckpointed, EventResourceCheckpointed)
	wantPayload(t, evs[1], fmt.Sprintf(`{"checkpoint_ref":"rb","covered_seq":%d,"generation":0,"key":"b"}`, seq+1))
	wantPayload(t, evs[2], fmt.Sprintf(`{"checkpoint_ref":"ra","covered_seq":%d,"generation":0,"key":"a"}`, seq+1))
	s := r.submit(wire.KindToolCall, "t", "a")
	seq = r.fx.lastSeq(r.id)
	if d := r.outcome(s.StepID, false, caps(Capture{Key: "a", Generation: 1, Ref: "r1"}, Capture{Key: "b", Generation: 1, Ref: "r2"})); d.Decision != wire.DecisionRecorded {
		t.Fatalf("fail: %+v", d)
	}
	evs = r.fx.eventsAfter(r.id, seq)
	wantTypes(t, evs, wire.EventStepFailed, EventResourceCheckpointed, EventResourceCheckpointed)
	for _, ev := range evs[1:] {
		if c := payloadField(t, ev, "covered_seq"); string(c.Raw) != fmt.Sprint(seq+1) {
			t.Fatalf("covered_seq %s, want the outcome %d", c.Raw, seq+1)
		}
	}
	rows, _ := r.fx.k.store.Read().Checkpoints(r.fx.ctx, r.id)
	if len(rows) != 4 || rows[0].Key != "a" || rows[0].InvalidatedSeq != seq || rows[1].CoveredSeq != seq+1 || rows[1].InvalidatedSeq != 0 {
		t.Fatalf("rows %+v", rows)
	}
	if r.resource("a").StartsSinceCheckpoint != 0 || r.resource("b").StartsSinceCheckpoint != 0 {
		t.Fatal("accepted captures did not reset the counters")
	}
	ruCheck(t, r.fx, r.id)
	ruInvariant(t, r.fx, r.id)
}

// TestSameAttemptRetryEntries: the retry answers the stored keys and
// generations of the step's latest start, due read now, and writes nothing
// (docs/protocol/resources.md §3, docs/protocol/identity.md §7).
func TestSameAttemptRetryEntries(t *testing.T) {
	r := rsStart(t)
	r.register("w", false, 2)
	r.register("ro", true, 1)
	x := r.submit(wire.KindLocal, "x", "ro", "w")
	if !reflect.DeepEqual(x.Resources, []ResourceEntry{{"ro", 1, true}, {"w", 1, false}}) {
		t.Fatalf("x: %+v", x.Resources)
	}
	// x is a writer of both: a capture of ro is refused and leaves its
	// counter; y raises w's to 2.
	seq := r.fx.lastSeq(r.id)
	r.publish(caps(Capture{Key: "ro", Generation: 1, Ref: "r"}))
	if got := payloadField(t, r.fx.eventsAfter(r.id, seq)[0], "error").Str; got != refusalWritersAlive {
		t.Fatalf("capture during x: %s", got)
	}
	y := r.submit(wire.KindToolCall, "y", "w")
	if !reflect.DeepEqual(y.Resources, []ResourceEntry{{"w", 2, true}}) {
		t.Fatalf("y: %+v", y.Resources)
	}
	seq = r.fx.lastSeq(r.id)
	again, err := r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, hdr(r.del), SubmitRequest{Kind: wire.KindLocal, Target: "x", HasOccurrence: true})
	if err != nil || again.Decision != wire.DecisionProceed || again.StepID != x.StepID ||
		!reflect.DeepEqual(again.Resources, []ResourceEntry{{"ro", 1, true}, {"w", 1, true}}) {
		t.Fatalf("retry: %+v %v", again, err)
	}
	r.fx.noNewEvents(r.id, seq)
	// Without the attempt header it is a re-run of the step, a new start.
	again, err = r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, DispatchHeaders{ID: r.del.DispatchID}, SubmitRequest{Kind: wire.KindLocal, Target: "x", HasOccurrence: true})
	if err != nil || again.Decision != wire.DecisionProceed || !reflect.DeepEqual(again.Resources, []ResourceEntry{{"ro", 2, true}, {"w", 3, true}}) {
		t.Fatalf("re-run: %+v %v", again, err)
	}
	evs := r.fx.eventsAfter(r.id, seq)
	wantTypes(t, evs, wire.EventStepExecuting)
	if v := payloadField(t, evs[0], "retry"); v == nil || !v.Bool {
		t.Fatalf("re-run payload %s", evs[0].Payload)
	}
	// A step started without resources answers [] on a retry.
	r2 := rsStart(t)
	z := r2.submit(wire.KindToolCall, "z")
	zz, err := r2.fx.k.SubmitStep(r2.fx.ctx, rsAgent, r2.id, hdr(r2.del), SubmitRequest{Kind: wire.KindToolCall, Target: "z", HasOccurrence: true})
	if err != nil || zz.StepID != z.StepID || zz.Resources == nil || len(zz.Resources) != 0 {
		t.Fatalf("retry without resources: %+v %v", zz, err)
	}
}

// TestWritersAcrossDispatches: after a grant enqueues a newer dispatch, a
// step still executing under the released one is no longer a writer.
func TestWritersAcrossDispatches(t *testing.T) {
	pol := policyFunc(func(_ string, f StepFacts) PolicyResult {
		if f.Target == "ask" {
			return PolicyResult{Decision: PolicyRequireApproval, RuleID: "ask"}
		}
		return PolicyResult{Decision: PolicyAllow, RuleID: "ok"}
	})
	r := rsStart(t, withPolicy(pol))
	r.register("w", false, 1)
	r.submit(wire.KindToolCall, "slow")
	ask := r.submit(wire.KindToolCall, "ask")
	// Blocked: slow still runs under the released (newest) dispatch.
	seq := r.fx.lastSeq(r.id)
	r.publish(caps(Capture{Key: "w", Generation: 1, Ref: "x"}))
	if got := payloadField(t, r.fx.eventsAfter(r.id, seq)[0], "error").Str; got != refusalWritersAlive {
		t.Fatalf("while blocked: %s", got)
	}
	if err := r.fx.k.DecideApproval(r.fx.ctx, ask.ApprovalID, DecideRequest{Grant: true}); err != nil {
		t.Fatal(err)
	}
	r.del = r.fx.claim(r.id)
	seq = r.fx.lastSeq(r.id)
	r.publish(caps(Capture{Key: "w", Generation: 1, Ref: "y"}))
	wantTypes(t, r.fx.eventsAfter(r.id, seq), EventResourceCheckpointed)

	// The approved step starts when the agent submits it again (a recorded
	// step's start, not a new step's): it is a writer until its outcome.
	started := r.submit(wire.KindToolCall, "ask")
	if started.Decision != wire.DecisionProceed || started.StepID != ask.StepID {
		t.Fatalf("the approved step: %+v", started)
	}
	gen := r.resource("w").Generation
	seq = r.fx.lastSeq(r.id)
	r.publish(caps(Capture{Key: "w", Generation: gen, Ref: "z"}))
	if got := payloadField(t, r.fx.eventsAfter(r.id, seq)[0], "error").Str; got != refusalWritersAlive {
		t.Fatalf("while the approved step runs: %s", got)
	}
	r.outcome(started.StepID, true, Captures{})
	seq = r.fx.lastSeq(r.id)
	r.publish(caps(Capture{Key: "w", Generation: gen, Ref: "z"}))
	wantTypes(t, r.fx.eventsAfter(r.id, seq), EventResourceCheckpointed)
}

// ---- the property test ----

type pmKey struct {
	key      string
	reuse    bool
	every    int64
	gen, ctr int64
}

type pmStep struct {
	id, kind, target string
	res              []string
	del              *Delivery // the delivery that last started it
	open             bool
	lastStart        []ResourceEntry // keys and generations of its latest start
}

type pmModel struct {
	t     *testing.T
	r     *rsRun
	rng   *rand.Rand
	keys  []*pmKey
	byKey map[string]*pmKey
	steps []*pmStep
	n     int
	log   []string
	tally map[string]int // operations and capture outcomes seen, for the log
}

func (m *pmModel) fail(format string, args ...any) {
	m.t.Helper()
	m.t.Fatalf("%s\nops:\n  %s", fmt.Sprintf(format, args...), strings.Join(m.log, "\n  "))
}

func (m *pmModel) current(s *pmStep) bool {
	return s.del.DispatchID == m.r.del.DispatchID && s.del.Attempt == m.r.del.Attempt
}

// start applies docs/protocol/resources.md §3 to a live start of s and returns the proceed entries.
func (m *pmModel) start(s *pmStep) []ResourceEntry {
	affecting := s.kind != wire.KindLLMCall
	raised := map[string]bool{}
	for _, k := range m.keys {
		declared := affecting && slices.Contains(s.res, k.key)
		if !k.reuse || declared {
			k.gen++
			raised[k.key] = true
		}
		if declared {
			k.ctr++
		}
	}
	out := []ResourceEntry{}
	for _, key := range s.res {
		if k := m.byKey[key]; raised[key] {
			out = append(out, ResourceEntry{key, k.gen, k.every > 0 && k.ctr >= k.every})
		}
	}
	for _, k := range m.keys {
		if raised[k.key] && !(affecting && slices.Contains(s.res, k.key)) {
			out = append(out, ResourceEntry{k.key, k.gen, false})
		}
	}
	s.lastStart = out
	return out
}

// captures evaluates a capture list (docs/protocol/resources.md §4) and returns the expected events
// after the outcome's: "ckpt key gen ref" or "fail key gen token".
func (m *pmModel) captures(c Captures, recording *pmStep) []string {
	var out []string
	for _, f := range c.Failures {
		out = append(out, fmt.Sprintf("fail %s %d %s", f.Key, f.Generation, f.Error))
	}
	seen := map[string]bool{}
	for _, cp := range c.Captures {
		k := m.byKey[cp.Key]
		token := ""
		switch {
		case k == nil:
			token = refusalUnknown
		case cp.Ref == "":
			token = refusalMissingRef
		case len(cp.Ref) > MaxCheckpointRef:
			token = refusalRefTooLong
		case seen[cp.Key]:
			token = refusalDuplicate
		case cp.Generation != k.gen:
			token = refusalStale
		default:
			for _, s := range m.steps {
				if s.open && s != recording && s.kind != wire.KindLLMCall && m.current(s) && (!k.reuse || slices.Contains(s.res, k.key)) {
					token = refusalWritersAlive
				}
			}
		}
		seen[cp.Key] = true
		if token != "" {
			out = append(out, fmt.Sprintf("fail %s %d %s", cp.Key, cp.Generation, token))
			continue
		}
		k.ctr = 0
		out = append(out, fmt.Sprintf("ckpt %s %d %s", cp.Key, cp.Generation, cp.Ref))
	}
	return out
}

func (m *pmModel) randomCaptures() Captures {
	var c Captures
	for range m.rng.IntN(3) {
		key := "ghost"
		gen := int64(m.rng.IntN(4))
		if len(m.keys) > 0 && m.rng.IntN(10) > 0 {
			k := m.keys[m.rng.IntN(len(m.keys))]
			key = k.key
			if m.rng.IntN(4) > 0 {
				gen = k.gen
			}
		}
		ref := fmt.Sprintf("ref-%d", m.n)
		switch m.rng.IntN(12) {
		case 0:
			ref = ""
		case 1:
			ref = strings.Repeat("r", MaxCheckpointRef+1)
		case 2:
			ref = strings.Repeat("r", MaxCheckpointRef)
		}
		m.n++
		c.Captures = append(c.Captures, Capture{Key: key, Generation: gen, Ref: ref})
	}
	if m.rng.IntN(5) == 0 {
		c.Failures = append(c.Failures, CaptureFailure{Key: "any", Generation: int64(m.rng.IntN(3)), Error: "driver said no"})
	}
	return c
}

// observed renders the events after seq as the model writes them.
func (m *pmModel) observed(seq int64) (string, []string) {
	evs := m.r.fx.eventsAfter(m.r.id, seq)
	var out []string
	first := ""
	for i, ev := range evs {
		p := ruPayload(m.t, ev)
		switch ev.Type {
		case EventResourceCheckpointed:
			m.tally["accepted"]++
			if ruInt(p["covered_seq"]) != evs[0].Seq {
				m.fail("checkpoint covers from %v, want the transaction's first event %d", p["covered_seq"], evs[0].Seq)
			}
			out = append(out, fmt.Sprintf("ckpt %s %d %s", p["key"], ruInt(p["generation"]), p["checkpoint_ref"]))
		case EventResourceCheckpointFailed:
			m.tally[fmt.Sprint(p["error"])]++
			out = append(out, fmt.Sprintf("fail %s %d %s", p["key"], ruInt(p["generation"]), p["error"]))
		default:
			if i != 0 {
				m.fail("unexpected %s after the first event", ev.Type)
			}
			first = ev.Type
		}
	}
	return first, out
}

func (m *pmModel) check(all bool) {
	m.t.Helper()
	for _, k := range m.keys {
		got := m.r.resource(k.key)
		if got.Generation != k.gen || got.StartsSinceCheckpoint != k.ctr {
			m.fail("key %s: stored generation %d counter %d, model %d %d", k.key, got.Generation, got.StartsSinceCheckpoint, k.gen, k.ctr)
		}
	}
	ruInvariant(m.t, m.r.fx, m.r.id)
	o := ruBuild(m.t, m.r.fx.events(m.r.id))
	// The view of one key per operation (re-registering is a write
	// transaction; every key is checked at the end of a run).
	keys := m.keys
	if !all && len(keys) > 1 {
		keys = keys[m.rng.IntN(len(keys)):][:1]
	}
	for _, k := range keys {
		v, err := m.r.registerReq(RegisterRequest{Key: k.key, DriverID: "d", CoverageReuse: k.reuse, EverySteps: 99})
		if err != nil {
			m.fail("re-register %s: %v", k.key, err)
		}
		if pc := o.keyPoint(k.key, o.last); v.Covered != pc.Covered || v.Generation != k.gen || v.EverySteps != k.every {
			m.fail("view of %s: %+v; oracle covered %v", k.key, v, pc.Covered)
		}
	}
}

func (m *pmModel) step() {
	m.t.Helper()
	r := m.r
	var open, orphans, mine []*pmStep
	for _, s := range m.steps {
		if s.open {
			open = append(open, s)
			if m.current(s) {
				mine = append(mine, s)
			} else {
				orphans = append(orphans, s)
			}
		}
	}
	seq := r.fx.lastSeq(r.id)
	switch op := m.rng.IntN(20); {
	case op < 2 && len(m.keys) < 4:
		k := &pmKey{key: fmt.Sprintf("k%d", len(m.keys)), reuse: m.rng.IntN(2) == 0, every: int64(m.rng.IntN(4))}
		m.log = append(m.log, fmt.Sprintf("register %s reuse=%v every=%d", k.key, k.reuse, k.every))
		v := r.register(k.key, k.reuse, k.every)
		if v.Covered || v.Generation != 0 {
			m.fail("new view %+v", v)
		}
		m.keys = append(m.keys, k)
		m.byKey[k.key] = k
	case op < 9 && len(open) < 4:
		s := &pmStep{target: fmt.Sprintf("t%d", len(m.steps)), del: r.del, open: true}
		s.kind = []string{wire.KindToolCall, wire.KindToolCall, wire.KindLocal, wire.KindLLMCall}[m.rng.IntN(4)]
		if s.kind != wire.KindLLMCall {
			for _, k := range m.keys {
				if m.rng.IntN(2) == 0 {
					s.res = append(s.res, k.key)
				}
			}
			m.rng.Shuffle(len(s.res), func(i, j int) { s.res[i], s.res[j] = s.res[j], s.res[i] })
		}
		m.log = append(m.log, fmt.Sprintf("start %s %s %v", s.kind, s.target, s.res))
		d := r.submit(s.kind, s.target, s.res...)
		want := m.start(s)
		if d.Decision != wire.DecisionProceed || !reflect.DeepEqual(d.Resources, want) {
			m.fail("start %s: %+v, want %+v", s.target, d, want)
		}
		s.id = d.StepID
		m.steps = append(m.steps, s)
	case op < 14 && len(open) > 0:
		s := open[m.rng.IntN(len(open))]
		c := m.randomCaptures()
		ok := m.rng.IntN(3) > 0
		m.log = append(m.log, fmt.Sprintf("outcome %s ok=%v (attempt %d) %+v", s.target, ok, s.del.Attempt, c))
		s.open = false // no longer a writer while its own captures are judged
		want := m.captures(c, s)
		dec, err := r.fx.k.RecordOutcome(r.fx.ctx, rsAgent, r.id, s.id, hdr(s.del), OutcomeRequest{Succeeded: ok, Value: []byte(`1`), Captures: c})
		if err != nil || dec.Decision != wire.DecisionRecorded {
			m.fail("outcome: %+v %v", dec, err)
		}
		first, got := m.observed(seq)
		if wantFirst := map[bool]string{true: wire.EventStepSucceeded, false: wire.EventStepFailed}[ok]; first != wantFirst || !slices.Equal(got, want) {
			m.fail("outcome events %s %v, want %v", first, got, want)
		}
		// A replayed outcome carries captures that are ignored.
		seq = r.fx.lastSeq(r.id)
		if dec, err := r.fx.k.RecordOutcome(r.fx.ctx, rsAgent, r.id, s.id, hdr(r.del), OutcomeRequest{Succeeded: ok, Captures: c}); err != nil || dec.Decision != wire.DecisionReplay {
			m.fail("second outcome: %+v %v", dec, err)
		}
		r.fx.noNewEvents(r.id, seq)
	case op < 16:
		c := m.randomCaptures()
		m.log = append(m.log, fmt.Sprintf("publish %+v", c))
		want := m.captures(c, nil)
		if err := r.fx.k.PublishCheckpoints(r.fx.ctx, rsAgent, r.id, hdr(r.del), c); err != nil {
			m.fail("publish: %v", err)
		}
		if first, got := m.observed(seq); first != "" || !slices.Equal(got, want) {
			m.fail("publish events %s %v, want %v", first, got, want)
		}
	case op == 16 && len(open) > 0:
		m.log = append(m.log, "reclaim")
		r.del = r.fx.reclaim(r.del)
		r.fx.ack(r.del)
	case op == 17 && len(orphans) > 0:
		s := orphans[m.rng.IntN(len(orphans))]
		m.log = append(m.log, "re-run "+s.target)
		d := r.submit(s.kind, s.target, s.res...)
		s.del = r.del
		want := m.start(s)
		if d.Decision != wire.DecisionProceed || d.StepID != s.id || !reflect.DeepEqual(d.Resources, want) {
			m.fail("re-run %s: %+v, want %+v", s.target, d, want)
		}
		evs := r.fx.eventsAfter(r.id, seq)
		if len(evs) != 1 || evs[0].Type != wire.EventStepExecuting || ruPayload(m.t, evs[0])["retry"] != true {
			m.fail("re-run events %v", types(evs))
		}
	case op == 18 && len(mine) > 0:
		s := mine[m.rng.IntN(len(mine))]
		m.log = append(m.log, "same-attempt retry "+s.target)
		d, err := r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, hdr(r.del), SubmitRequest{Kind: s.kind, Target: s.target, Resources: s.res, HasOccurrence: true})
		want := []ResourceEntry{}
		for _, e := range s.lastStart {
			k := m.byKey[e.Key]
			want = append(want, ResourceEntry{e.Key, e.Generation, slices.Contains(s.res, e.Key) && k.every > 0 && k.ctr >= k.every})
		}
		if err != nil || d.Decision != wire.DecisionProceed || d.StepID != s.id || !reflect.DeepEqual(d.Resources, want) {
			m.fail("same-attempt retry: %+v %v, want %+v", d, err, want)
		}
		r.fx.noNewEvents(r.id, seq)
	default:
		return
	}
	m.tally[strings.Fields(m.log[len(m.log)-1])[0]]++
	m.check(false)
}

// TestCoverageProperty drives random histories against the model and checks
// every coverage answer against the oracle, then forks each history at
// random points (fork_test.go's checker).
func TestCoverageProperty(t *testing.T) {
	runs, ops := 20, 70
	if testing.Short() {
		runs = 5
	}
	total := map[string]int{}
	for seed := 1; seed <= runs; seed++ {
		t.Run(fmt.Sprint("seed=", seed), func(t *testing.T) {
			r := rsStart(t)
			m := &pmModel{t: t, r: r, rng: rand.New(rand.NewPCG(uint64(seed), 7)), byKey: map[string]*pmKey{}, tally: total}
			for range ops {
				m.step()
			}
			m.check(true)
			ruCheck(t, r.fx, r.id)
			marksCheck(t, r.fx, r.id)
			last := r.fx.lastSeq(r.id)
			for _, s := range []int64{1 + m.rng.Int64N(last), 1 + m.rng.Int64N(last), last} {
				fkCheck(t, r.fx, r.id, s)
			}
		})
	}
	// Every refusal and every kind of operation must have happened, or
	// the test proves less than it claims.
	t.Logf("tally: %v", total)
	for _, want := range []string{"register", "start", "outcome", "publish", "reclaim", "re-run", "same-attempt", "accepted",
		refusalUnknown, refusalMissingRef, refusalRefTooLong, refusalDuplicate, refusalStale, refusalWritersAlive, "driver said no"} {
		if total[want] == 0 {
			t.Errorf("no %q in %d runs", want, runs)
		}
	}
}
