package kernel

// Unit and property tests of resources, captures and coverage
// (docs/protocol/resources.md). The coverage oracle here reads an execution's
// log back from the store and applies docs/protocol/resources.md §5.1; it never asks the kernel's
// coverage code. The property test drives random registrations, starts,
// outcomes, captures, reclaims and re-runs against a model of docs/protocol/resources.md §3–§4 and
// checks every answer, every appended event, the stored rows and every
// coverage answer.

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// ---- helpers ----

// rsRun is one started execution of agent "a1" and its current delivery.
type rsRun struct {
	fx  *fixture
	t   *testing.T
	id  string
	del *Delivery
}

func rsStart(t *testing.T, setup ...func(o *Options)) *rsRun {
	t.Helper()
	fx := newFixture(t, setup...)
	e, del := fx.start("a1")
	return &rsRun{fx: fx, t: t, id: e.ID, del: del}
}

var rsAgent = Caller{Agent: "a1"}

func (r *rsRun) registerReq(req RegisterRequest) (*ResourceView, error) {
	return r.fx.k.RegisterResource(r.fx.ctx, rsAgent, r.id, hdr(r.del), req)
}

func (r *rsRun) register(key string, reuse bool, every int64) *ResourceView {
	r.t.Helper()
	v, err := r.registerReq(RegisterRequest{Key: key, DriverID: "d", CoverageReuse: reuse, EverySteps: every, OnCompletion: true})
	if err != nil {
		r.t.Fatalf("register %s: %v", key, err)
	}
	return v
}

func (r *rsRun) publish(caps Captures) {
	r.t.Helper()
	if err := r.fx.k.PublishCheckpoints(r.fx.ctx, rsAgent, r.id, hdr(r.del), caps); err != nil {
		r.t.Fatalf("publish: %v", err)
	}
}

func (r *rsRun) submit(kind, target string, res ...string) *Decision {
	r.t.Helper()
	dec, err := r.fx.k.SubmitStep(r.fx.ctx, rsAgent, r.id, hdr(r.del), SubmitRequest{Kind: kind, Target: target, Resources: res})
	if err != nil {
		r.t.Fatalf("submit %s: %v", target, err)
	}
	return dec
}

func (r *rsRun) outcome(stepID string, ok bool, caps Captures) *Decision {
	r.t.Helper()
	dec, err := r.fx.k.RecordOutcome(r.fx.ctx, rsAgent, r.id, stepID, hdr(r.del), OutcomeRequest{Succeeded: ok, Value: []byte(`"v"`), Captures: caps})
	if err != nil {
		r.t.Fatalf("outcome of %s: %v", stepID, err)
	}
	return dec
}

func (r *rsRun) resource(key string) *store.Resource {
	r.t.Helper()
	res, err := r.fx.k.store.Read().Resource(r.fx.ctx, r.id, key)
	if err != nil {
		r.t.Fatalf("read resource %s: %v", key, err)
	}
	return res
}

func caps(cs ...Capture) Captures { return Captures{Captures: cs} }

// ---- the oracle (docs/protocol/resources.md §5.1, from the stored log alone) ----

type ruRow struct {
	covered, inv, gen int64
	ref               string
}

type ruKey struct {
	key   string
	reg   int64
	reuse bool
	gen   int64
	rows  []*ruRow
}

type ruOracle struct {
	last  int64
	keys  []*ruKey
	byKey map[string]*ruKey
	genAt []map[string]int64 // after each seq
	evs   []*store.Event
}

func ruPayload(t *testing.T, ev *store.Event) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(ev.Payload, &m); err != nil {
		t.Fatalf("event %d payload: %v", ev.Seq, err)
	}
	return m
}

func ruInt(v any) int64 {
	f, _ := v.(float64)
	return int64(f)
}

// ruBuild replays a log, checking the generations each step.executing
// carries (docs/protocol/resources.md §3) and that each checkpoint the execution accepted itself was
// at the current generation.
func ruBuild(t *testing.T, evs []*store.Event) *ruOracle {
	t.Helper()
	o := &ruOracle{byKey: map[string]*ruKey{}, genAt: []map[string]int64{{}}, evs: evs}
	copying := false
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i+1, ev.Seq)
		}
		p := ruPayload(t, ev)
		key, _ := p["key"].(string)
		k := o.byKey[key]
		switch ev.Type {
		case wire.EventExecutionForked:
			copying = true
		case wire.EventExecutionStarted:
			copying = false
		case EventResourceRegistered:
			k = &ruKey{key: key, reg: ev.Seq, reuse: p["coverage_reuse"] == true}
			o.keys = append(o.keys, k)
			o.byKey[key] = k
		case EventResourceInitialized:
			k.gen = ruInt(p["generation"])
		case wire.EventStepExecuting:
			var declared []string
			if l, ok := p["resources"].([]any); ok {
				for _, x := range l {
					declared = append(declared, x.(string))
				}
			}
			llm := p["step_type"] == wire.KindLLMCall
			gens, has := p["generations"].(map[string]any)
			want := map[string]any{}
			for _, k := range o.keys {
				if !k.reuse || (!llm && slices.Contains(declared, k.key)) {
					k.gen++
					if g := ruInt(gens[k.key]); copying && g >= k.gen {
						k.gen = g
					}
					want[k.key] = float64(k.gen)
					for _, row := range k.rows {
						if row.inv == 0 {
							row.inv = ev.Seq
						}
					}
				}
			}
			if has != (len(want) > 0) || (has && !reflect.DeepEqual(gens, want)) {
				t.Fatalf("seq %d: generations %v, want %v", ev.Seq, p["generations"], want)
			}
		case EventResourceCheckpointed:
			ref, _ := p["checkpoint_ref"].(string)
			row := &ruRow{covered: ruInt(p["covered_seq"]), inv: ruInt(p["invalidated_seq"]), gen: ruInt(p["generation"]), ref: ref}
			if !copying && (row.gen != k.gen || row.inv != 0 || row.covered > ev.Seq || row.covered < 1) {
				t.Fatalf("seq %d: accepted %v at generation %d", ev.Seq, p, k.gen)
			}
			k.rows = append(k.rows, row)
		}
		gens := map[string]int64{}
		for _, k := range o.keys {
			gens[k.key] = k.gen
		}
		o.genAt = append(o.genAt, gens)
	}
	o.last = int64(len(evs))
	return o
}

// point is docs/protocol/resources.md §5.1 at s: per key registered at or before s, in registration
// order.
func (o *ruOracle) point(s int64) (bool, []PointCoverage) {
	all, out := true, []PointCoverage{}
	for _, k := range o.keys {
		if k.reg > s {
			continue
		}
		pc := PointCoverage{Key: k.key, Reason: CoverageNoCheckpoint}
		var c *ruRow
		for _, row := range k.rows {
			if row.covered <= s && (c == nil || row.covered > c.covered) {
				c = row
			}
		}
		if c != nil {
			pc.CheckpointRef, pc.CheckpointSeq = c.ref, c.covered
			pc.Covered = c.inv == 0 || c.inv > s
			pc.Reason = CoverageStepStarted
			if pc.Covered {
				pc.Reason = CoverageCovered
			}
		}
		all = all && pc.Covered
		out = append(out, pc)
	}
	return all, out
}

func (o *ruOracle) keyPoint(key string, s int64) PointCoverage {
	_, pcs := o.point(s)
	for _, pc := range pcs {
		if pc.Key == key {
			return pc
		}
	}
	return PointCoverage{Key: key}
}

func ruRanges(points []bool) []Range {
	out := []Range{}
	for i, c := range points {
		s := int64(i + 1)
		switch {
		case !c:
		case len(out) > 0 && out[len(out)-1][1] == s-1:
			out[len(out)-1][1] = s
		default:
			out = append(out, Range{s, s})
		}
	}
	return out
}

// ruCheck compares the kernel's point answer at every seq and its ranges
// answer with the oracle, and returns the oracle.
func ruCheck(t *testing.T, fx *fixture, id string) *ruOracle {
	t.Helper()
	o := ruBuild(t, fx.events(id))
	for s := int64(1); s <= o.last; s++ {
		wc, wp := o.point(s)
		got, err := fx.k.CoverageAt(fx.ctx, Caller{}, id, s)
		if err != nil {
			t.Fatalf("coverage at %d: %v", s, err)
		}
		if got.Covered != wc || got.AtSeq != s || got.ExecutionID != id || !reflect.DeepEqual(got.Resources, wp) {
			t.Fatalf("coverage of %s at %d: %+v; oracle %v %+v", id, s, got, wc, wp)
		}
	}
	for _, bad := range []int64{0, o.last + 1} {
		_, err := fx.k.CoverageAt(fx.ctx, Caller{}, id, bad)
		wantMessage(t, err, wire.CodeValidation, fmt.Sprintf("validation error: at_seq must be between 1 and %d", o.last))
	}
	rg, err := fx.k.CoverageRangesOf(fx.ctx, Caller{}, id)
	if err != nil {
		t.Fatal(err)
	}
	all := make([]bool, o.last)
	for s := range all {
		all[s], _ = o.point(int64(s + 1))
	}
	if rg.LastEventSeq != o.last || !reflect.DeepEqual(rg.Ranges, ruRanges(all)) || len(rg.Resources) != len(o.keys) {
		t.Fatalf("ranges of %s: %+v; oracle %v", id, rg, ruRanges(all))
	}
	for i, k := range o.keys {
		per := make([]bool, o.last)
		for s := k.reg; s <= o.last; s++ {
			per[s-1] = o.keyPoint(k.key, s).Covered
		}
		if got := rg.Resources[i]; got.Key != k.key || got.RegisteredSeq != k.reg || !reflect.DeepEqual(got.Ranges, ruRanges(per)) {
			t.Fatalf("ranges of %s key %s: %+v; oracle %v", id, k.key, got, ruRanges(per))
		}
	}
	return o
}

// ruInvariant checks docs/protocol/resources.md §5.2's invariant on the stored rows: the view's covered
// equals the point query at the last seq, and a key has an open checkpoint
// iff it has one whose generation equals its current generation.
func ruInvariant(t *testing.T, fx *fixture, id string) {
	t.Helper()
	rd := fx.k.store.Read()
	e := fx.exec(id)
	resources, err := rd.Resources(fx.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	rows := fx.checkpoints(id)
	for _, r := range resources {
		open, current := false, false
		for _, row := range rows {
			if row.Key != r.Key {
				continue
			}
			open = open || row.InvalidatedSeq == 0
			current = current || row.Generation == r.Generation
			if row.InvalidatedSeq != 0 && row.InvalidatedSeq <= row.CoveredSeq && e.ForkedFrom == "" {
				t.Fatalf("key %s: row %+v closes before it covers", r.Key, row)
			}
		}
		if open != current {
			t.Fatalf("key %s at generation %d: open checkpoint %v, checkpoint of the current generation %v (%+v)", r.Key, r.Generation, open, current, rows)
		}
		covered, err := coveredNow(fx.ctx, rd, r)
		if err != nil {
			t.Fatal(err)
		}
		if pc, _, _ := fx.k.pointCoverage(fx.ctx, rd, fx.view(id), r, e.LastSeq); covered != pc.Covered && r.RegisteredSeq <= e.LastSeq {
			t.Fatalf("key %s: view covered %v, point query at %d %v", r.Key, covered, e.LastSeq, pc.Covered)
		}
	}
}

// ---- unit tests ----

// TestRegisterResourceRules: new, identical and conflicting registrations,
// the 32 limit, validation before anything is read, and no writes for
// identical or refused ones.
func TestRegisterResourceRules(t *testing.T) {
	r := rsStart(t)
	v := r.register("workspace", false, 5)
	if v.Generation != 0 || v.Covered || v.Binding != nil || v.CheckpointRef != "" || v.RegisteredSeq != r.fx.lastSeq(r.id) || v.Position != 0 {
		t.Fatalf("view %+v", v)
	}
	seq := r.fx.lastSeq(r.id)
	v2, err := r.registerReq(RegisterRequest{Key: "workspace", DriverID: "d", EverySteps: 9})
	if err != nil || v2.EverySteps != 5 || !v2.OnCompletion {
		t.Fatalf("identical register: %+v %v", v2, err)
	}
	_, err = r.registerReq(RegisterRequest{Key: "workspace", DriverID: "d", Configuration: []byte(`{"a":1}`)})
	ke := wantCode(t, err, wire.CodeConflict)
	if string(ke.Details["stored"].([]byte)) != `{"configuration":null,"coverage_reuse":false,"driver_id":"d"}` ||
		string(ke.Details["requested"].([]byte)) != `{"configuration":{"a":1},"coverage_reuse":false,"driver_id":"d"}` {
		t.Fatalf("details %s / %s", ke.Details["stored"], ke.Details["requested"])
	}
	_, err = r.registerReq(RegisterRequest{Key: "workspace", DriverID: "d", CoverageReuse: true})
	wantCode(t, err, wire.CodeConflict)
	_, err = r.registerReq(RegisterRequest{Key: "workspace", DriverID: "e"})
	wantCode(t, err, wire.CodeConflict)
	for _, bad := range []RegisterRequest{
		{Key: "", DriverID: "d"}, {Key: "..", DriverID: "d"}, {Key: strings.Repeat("k", 129), DriverID: "d"},
		{Key: "x", DriverID: ""}, {Key: "x", DriverID: strings.Repeat("d", 257)},
		{Key: "x", DriverID: "d", EverySteps: -1}, {Key: "x", DriverID: "d", EverySteps: 1_000_001},
		{Key: "x", DriverID: "d", Configuration: []byte(`"` + strings.Repeat("c", 64*1024) + `"`)},
	} {
		// Validation comes first: even on an unknown execution.
		_, err := r.fx.k.RegisterResource(r.fx.ctx, rsAgent, "0190aaaa-0000-7000-8000-000000000000", hdr(r.del), bad)
		wantCode(t, err, wire.CodeValidation)
	}
	_, err = r.fx.k.RegisterResource(r.fx.ctx, rsAgent, r.id, DispatchHeaders{}, RegisterRequest{Key: "x", DriverID: "d"})
	wantMessage(t, err, wire.CodeValidation, "validation error: missing dispatch_id")
	r.fx.noNewEvents(r.id, seq)
	for i := 1; i < MaxResources; i++ {
		r.register(fmt.Sprintf("k%d", i), false, 0)
	}
	_, err = r.registerReq(RegisterRequest{Key: "k99", DriverID: "d"})
	wantMessage(t, err, wire.CodeValidation, "validation error: an execution has at most 32 resources")
	if e := r.fx.exec(r.id); len(e.ResourceKeys) != 32 || e.ResourceKeys[0] != "workspace" || e.ResourceKeys[31] != "k31" {
		t.Fatalf("resource keys %v", e.ResourceKeys)
	}
	for i, key := range r.fx.exec(r.id).ResourceKeys {
		if p := r.resource(key).Position; p != int64(i) {
			t.Fatalf("key %s at position %d, want %d", key, p, i)
		}
	}
}

// TestResourceRoutesRenewTheLease: accepted register, bind and publish
// renew the lease (docs/protocol/resources.md §4, docs/protocol/dispatch.md §8); refused ones do not.
func TestResourceRoutesRenewTheLease(t *testing.T) {
	r := rsStart(t)
	step := func(f func() error) time.Time {
		t.Helper()
		r.fx.clk.Advance(90 * time.Second)
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return r.fx.dispatch(r.del.DispatchID).LeaseExpiresAt
	}
	lease := r.fx.k.Config().DispatchLeaseTimeout
	for _, c := range []struct {
		name string
		f    func() error
	}{
		{"register", func() error {
			_, err := r.registerReq(RegisterRequest{Key: "w", DriverID: "d"})
			return err
		}},
		{"bind", func() error { return r.fx.k.BindResource(r.fx.ctx, rsAgent, r.id, "w", hdr(r.del), []byte(`{"p":1}`)) }},
		{"publish", func() error {
			return r.fx.k.PublishCheckpoints(r.fx.ctx, rsAgent, r.id, hdr(r.del), caps(Capture{Key: "w", Ref: "x"}))
		}},
	} {
		if got := step(c.f); !got.Equal(r.fx.clk.Now().Truncate(time.Microsecond).Add(lease)) {
			t.Fatalf("%s: lease expires at %v, want now + %v", c.name, got, lease)
		}
	}
	before := r.fx.dispatch(r.del.DispatchID).LeaseExpiresAt
	r.fx.clk.Advance(10 * time.Second)
	_, err := r.registerReq(RegisterRequest{Key: "w", DriverID: "other"})
	wantCode(t, err, wire.CodeConflict)
	if got := r.fx.dispatch(r.del.DispatchID).LeaseExpiresAt; !got.Equal(before) {
		t.Fatal("a refused register renewed the lease")
	}
}

// TestResourceStorageLimit: a register, bind or publish whose writes would
// cross --max-execution-bytes fails the execution instead (docs/protocol/operations.md §2.4).
func TestResourceStorageLimit(t *testing.T) {
	for _, route := range []string{"register", "bind", "publish"} {
		t.Run(route, func(t *testing.T) {
			r := rsStart(t, withConfig(func(c *Config) { c.MaxExecutionBytes = 2000 }))
			r.register("w", false, 1)
			big := []byte(`"` + strings.Repeat("x", 1500) + `"`)
			var err error
			switch route {
			case "register":
				_, err = r.registerReq(RegisterRequest{Key: "big", DriverID: "d", Configuration: big})
			case "bind":
				err = r.fx.k.BindResource(r.fx.ctx, rsAgent, r.id, "w", hdr(r.del), big)
			case "publish":
				err = r.fx.k.PublishCheckpoints(r.fx.ctx, rsAgent, r.id, hdr(r.del), caps(Capture{Key: "w", Ref: strings.Repeat("r", 1000)},
					Capture{Key: "w", Ref: strings.Repeat("s", 1000)}))
				if err == nil {
					// The first capture fits; a second publish crosses.
					err = r.fx.k.PublishCheckpoints(r.fx.ctx, rsAgent, r.id, hdr(r.del), caps(Capture{Key: "w", Ref: strings.Repeat("t", 1000)}))
				}
			}
			wantCode(t, err, wire.CodeExecutionTerminal)
			e := r.fx.exec(r.id)
			if e.Status != wire.ExecFailed || e.FailureReason != wire.ReasonStorageLimitExceeded {
				t.Fatalf("execution %s %q", e.Status, e.FailureReason)
			}
			if evs := r.fx.events(r.id); evs[len(evs)-1].Type != wire.EventExecutionFailed {
				t.Fatalf("last event %s", evs[len(evs)-1].Type)
			}
		})
	}
}
