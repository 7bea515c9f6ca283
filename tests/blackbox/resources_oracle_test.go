package blackbox

import (
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- the coverage oracle (docs/protocol/resources.md §5.1, from the log alone) ----

type rfRow struct {
	covered, inv, gen int64
	ref               string
}

type rfRes struct {
	key   string
	reg   int64
	reuse bool
	gen   int64
	rows  []*rfRow
}

type rfOracle struct {
	last  int64
	res   []*rfRes
	byKey map[string]*rfRes
	// genAt[s] is each registered key's generation after event s.
	genAt []map[string]int64
}

func rfStrings(v any) []string {
	l, _ := v.([]any)
	out := []string{}
	for _, x := range l {
		s, _ := x.(string)
		out = append(out, s)
	}
	return out
}

// rfBuildOracle replays a log. Along the way it checks what docs/protocol/resources.md §3 and §4
// say the log must look like: each step.executing raises exactly the
// generations of the resources without coverage_reuse plus those a tool or
// local step declares, by one (in a fork's copied events, to its source's
// value, which is higher when the source's log had starts the fork did not
// copy); each checkpoint accepted by the execution itself is at the current
// generation and covers from the first event of its transaction.
func rfBuildOracle(t *testing.T, evs []kt.Event) *rfOracle {
	t.Helper()
	o := &rfOracle{byKey: map[string]*rfRes{}, genAt: []map[string]int64{{}}}
	copying := false
	for i, ev := range evs {
		if ev.Seq != int64(i+1) {
			t.Fatalf("event %d has seq %d", i+1, ev.Seq)
		}
		p := ev.Payload
		key, _ := p["key"].(string)
		r := o.byKey[key]
		switch ev.Type {
		case "execution.forked":
			copying = true
		case "execution.started":
			copying = false
		case "resource.registered":
			if r != nil {
				t.Fatalf("seq %d: %q registered twice", ev.Seq, key)
			}
			r = &rfRes{key: key, reg: ev.Seq, reuse: p["coverage_reuse"] == true}
			o.res = append(o.res, r)
			o.byKey[key] = r
		case "resource.initialized":
			if r == nil {
				t.Fatalf("seq %d: initialized unregistered %q", ev.Seq, key)
			}
			r.gen = rfNum(p["generation"])
		case "step.executing":
			declared := rfStrings(p["resources"])
			llm := p["step_type"] == "llm_call"
			if _, has := p["resources"]; has && (len(declared) == 0 || llm) {
				t.Fatalf("seq %d: step.executing resources %v on a %v step", ev.Seq, p["resources"], p["step_type"])
			}
			got, has := p["generations"]
			gens, _ := got.(map[string]any)
			want := map[string]any{}
			for _, r := range o.res {
				if !r.reuse || (!llm && slices.Contains(declared, r.key)) {
					r.gen++
					if g := rfNum(gens[r.key]); copying && g >= r.gen {
						// A fork's copy keeps its source's value; the
						// starts of steps it did not copy are not in its
						// log.
						r.gen = g
					}
					want[r.key] = float64(r.gen)
					for _, row := range r.rows {
						if row.inv == 0 {
							row.inv = ev.Seq
						}
					}
				}
			}
			if has != (len(want) > 0) || (has && !reflect.DeepEqual(got, want)) {
				t.Fatalf("seq %d: step.executing generations %v, want %v", ev.Seq, got, want)
			}
		case "resource.checkpointed":
			if r == nil {
				t.Fatalf("seq %d: checkpoint of unregistered %q", ev.Seq, key)
			}
			ref, _ := p["checkpoint_ref"].(string)
			row := &rfRow{covered: rfNum(p["covered_seq"]), gen: rfNum(p["generation"]), ref: ref, inv: rfNum(p["invalidated_seq"])}
			if !copying {
				if row.gen != r.gen || row.inv != 0 || row.ref == "" || row.covered < 1 || row.covered > ev.Seq {
					t.Fatalf("seq %d: accepted checkpoint %v at generation %d", ev.Seq, p, r.gen)
				}
				for x := row.covered; x < ev.Seq; x++ {
					typ := evs[x-1].Type
					first := x == row.covered && (typ == "step.succeeded" || typ == "step.failed")
					if !first && typ != "resource.checkpointed" && typ != "resource.checkpoint_failed" {
						t.Fatalf("seq %d: checkpoint covers from %d, but %d is %s", ev.Seq, row.covered, x, typ)
					}
				}
			}
			r.rows = append(r.rows, row)
		}
		gens := map[string]int64{}
		for _, r := range o.res {
			gens[r.key] = r.gen
		}
		o.genAt = append(o.genAt, gens)
	}
	o.last = int64(len(evs))
	return o
}

// rfPoint is one resource's coverage at one seq.
type rfPoint struct {
	Key     string
	Covered bool
	Reason  string
	Ref     string // "" with no checkpoint
	Seq     int64  // 0 with no checkpoint
}

// point applies docs/protocol/resources.md §5.1 at s.
func (o *rfOracle) point(s int64) (bool, []rfPoint) {
	all, out := true, []rfPoint{}
	for _, r := range o.res {
		if r.reg > s {
			continue
		}
		pt := rfPoint{Key: r.key, Reason: "no_checkpoint"}
		var c *rfRow
		for _, row := range r.rows {
			if row.covered <= s && (c == nil || row.covered > c.covered) {
				c = row
			}
		}
		if c != nil {
			pt.Ref, pt.Seq = c.ref, c.covered
			pt.Covered = c.inv == 0 || c.inv > s
			pt.Reason = "step_started"
			if pt.Covered {
				pt.Reason = "covered"
			}
		}
		all = all && pt.Covered
		out = append(out, pt)
	}
	return all, out
}

func (o *rfOracle) covered(s int64) bool {
	c, _ := o.point(s)
	return c
}

// keyCovered is one key's coverage at s (false before it is registered).
func (o *rfOracle) keyCovered(key string, s int64) bool {
	_, pts := o.point(s)
	for _, p := range pts {
		if p.Key == key {
			return p.Covered
		}
	}
	return false
}

// rfRanges turns per-seq booleans (index 0 is seq 1) into inclusive ranges.
func rfRanges(points []bool) [][2]int64 {
	out := [][2]int64{}
	for i, c := range points {
		s := int64(i + 1)
		switch {
		case !c:
		case len(out) > 0 && out[len(out)-1][1] == s-1:
			out[len(out)-1][1] = s
		default:
			out = append(out, [2]int64{s, s})
		}
	}
	return out
}

type rfRangesAnswer struct {
	ExecutionID  string     `json:"execution_id"`
	LastEventSeq int64      `json:"last_event_seq"`
	Ranges       [][2]int64 `json:"covered_ranges"`
	Resources    []struct {
		Key           string     `json:"key"`
		RegisteredSeq int64      `json:"registered_seq"`
		Ranges        [][2]int64 `json:"covered_ranges"`
	} `json:"resources"`
}

type rfPointAnswer struct {
	ExecutionID string `json:"execution_id"`
	AtSeq       int64  `json:"at_seq"`
	Covered     bool   `json:"covered"`
	Resources   []struct {
		Key     string  `json:"key"`
		Covered bool    `json:"covered"`
		Reason  string  `json:"reason"`
		Ref     *string `json:"checkpoint_ref"`
		Seq     *int64  `json:"checkpoint_seq"`
	} `json:"resources"`
}

func rfGetPoint(t *testing.T, k *kt.Kernel, id string, s int64) (bool, []rfPoint) {
	t.Helper()
	var a rfPointAnswer
	k.Must(200, k.Do("GET", fmt.Sprintf("/v0/executions/%s/coverage?at_seq=%d", id, s), nil, nil)).JSON(t, &a)
	if a.ExecutionID != id || a.AtSeq != s || a.Resources == nil {
		t.Fatalf("point answer at %d: %+v", s, a)
	}
	out := []rfPoint{}
	for _, r := range a.Resources {
		p := rfPoint{Key: r.Key, Covered: r.Covered, Reason: r.Reason}
		if (r.Ref == nil) != (r.Seq == nil) {
			t.Fatalf("point answer at %d: checkpoint_ref and checkpoint_seq not both present or absent", s)
		}
		if r.Ref != nil {
			p.Ref, p.Seq = *r.Ref, *r.Seq
			if p.Seq < 1 {
				t.Fatalf("point answer at %d: checkpoint_seq %d", s, p.Seq)
			}
		}
		out = append(out, p)
	}
	return a.Covered, out
}

// rfCheckCoverage compares the kernel's ranges answer and its point answer at
// every seq with the oracle, and returns the oracle and the log it read.
// The log must not grow meanwhile.
func rfCheckCoverage(t *testing.T, k *kt.Kernel, id string) (*rfOracle, []kt.Event) {
	t.Helper()
	evs := k.Events(id)
	o := rfBuildOracle(t, evs)
	var ra rfRangesAnswer
	resp := k.Must(200, k.Do("GET", "/v0/executions/"+id+"/coverage", nil, nil))
	resp.JSON(t, &ra)
	all := make([]bool, o.last)
	for s := int64(1); s <= o.last; s++ {
		all[s-1] = o.covered(s)
	}
	if ra.ExecutionID != id || ra.LastEventSeq != o.last || ra.Ranges == nil || !reflect.DeepEqual(ra.Ranges, rfRanges(all)) {
		t.Fatalf("ranges of %s: %s; oracle: last %d, %v", id, resp.Body, o.last, rfRanges(all))
	}
	if len(ra.Resources) != len(o.res) {
		t.Fatalf("ranges of %s: resources %s, oracle %d keys", id, resp.Body, len(o.res))
	}
	for i, r := range o.res {
		per := make([]bool, o.last)
		for s := r.reg; s <= o.last; s++ {
			per[s-1] = o.keyCovered(r.key, s)
		}
		got := ra.Resources[i]
		if got.Key != r.key || got.RegisteredSeq != r.reg || got.Ranges == nil || !reflect.DeepEqual(got.Ranges, rfRanges(per)) {
			t.Fatalf("ranges of %s, key %s: %s; oracle: registered %d, %v", id, r.key, resp.Body, r.reg, rfRanges(per))
		}
	}
	for s := int64(1); s <= o.last; s++ {
		wc, wp := o.point(s)
		gc, gp := rfGetPoint(t, k, id, s)
		if gc != wc || !reflect.DeepEqual(gp, wp) {
			t.Fatalf("point answer of %s at %d: %v %+v; oracle: %v %+v", id, s, gc, gp, wc, wp)
		}
	}
	for _, bad := range []int64{0, o.last + 1} {
		r := k.Do("GET", fmt.Sprintf("/v0/executions/%s/coverage?at_seq=%d", id, bad), nil, nil)
		want := fmt.Sprintf("validation error: at_seq must be between 1 and %d", o.last)
		if r.Status != 400 || r.Code() != "validation_error" || !strings.Contains(string(r.Body), want) {
			t.Fatalf("coverage at_seq=%d: %s", bad, r)
		}
	}
	return o, evs
}
