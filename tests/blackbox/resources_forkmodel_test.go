package blackbox

import (
	"bytes"
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/identity"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- the fork model (docs/protocol/forks.md §2–§3, from the source's log and steps) ----

type rfStep map[string]json.RawMessage

func (s rfStep) str(key string) string {
	var v string
	json.Unmarshal(s[key], &v)
	return v
}

func (s rfStep) num(key string) int64 {
	var v int64
	json.Unmarshal(s[key], &v)
	return v
}

func rfSteps(t *testing.T, k *kt.Kernel, id string) []rfStep {
	t.Helper()
	var out []rfStep
	k.Must(200, k.Do("GET", "/v0/executions/"+id+"/steps", nil, nil)).JSON(t, &out)
	return out
}

var rfCleanupCauses = map[string]bool{"execution_completed": true, "execution_failed": true,
	"execution_cancelled": true, "deadline_exceeded": true}

// rfFork is a fork as created, with what the model expected of it.
type rfFork struct {
	id          string
	exec        map[string]any
	evs         []kt.Event // its log once its first delivery was acked
	o           *rfOracle
	targets     []string // targets of the copied steps, in order
	stepIDs     map[string]string
	gen         map[string]int64 // generation of each copied key
	restoration map[string]any
	kept        int // number of kept source events
}

// rfForkAt forks src at s (201 expected) and checks the fork against the model.
func rfForkAt(t *testing.T, k *kt.Kernel, src string, s int64) *rfFork {
	t.Helper()
	before := len(k.Events(src))
	resp := k.Do("POST", "/v0/executions/"+src+"/fork", fmt.Appendf(nil, `{"at_seq":%d}`, s), nil)
	if resp.Status != 201 {
		t.Fatalf("fork %s at %d: %s", src, s, resp)
	}
	f := rfCheckFork(t, k, src, s, resp.Map(t))
	if after := len(k.Events(src)); after != before {
		t.Fatalf("forking appended %d events to the source", after-before)
	}
	return f
}

func rfCheckFork(t *testing.T, k *kt.Kernel, src string, s int64, exec map[string]any) *rfFork {
	t.Helper()
	f := &rfFork{id: exec["id"].(string), exec: exec, stepIDs: map[string]string{}, gen: map[string]int64{}}
	srcExec := k.Execution(src)
	srcEvs := k.Events(src)
	so := rfBuildOracle(t, srcEvs)
	srcSteps := rfSteps(t, k, src)

	// Copied steps: terminal (succeeded, failed, denied) at s, except
	// denials of a terminal clean-up.
	terminal := map[string]int64{}
	for _, ev := range srcEvs {
		switch ev.Type {
		case "step.succeeded", "step.failed", "step.denied", "step.cancelled":
			terminal[ev.Payload["step_id"].(string)] = ev.Seq
		}
	}
	var copied []rfStep
	isCopied := map[string]bool{}
	for _, st := range srcSteps {
		id, status := st.str("step_id"), st.str("status")
		if status != "succeeded" && status != "failed" && status != "denied" {
			continue
		}
		if ts := terminal[id]; ts == 0 || ts > s {
			continue
		}
		if status == "denied" {
			var e struct{ Reason string }
			json.Unmarshal(st["error"], &e)
			if rfCleanupCauses[e.Reason] {
				continue
			}
		}
		copied = append(copied, st)
		isCopied[id] = true
		f.stepIDs[id] = identity.StepID(f.id, st.str("kind"), st.str("target"), st.str("args_hash"), st.num("occurrence"))
		f.targets = append(f.targets, st.str("target"))
	}
	// Copied keys and kept events.
	var keys []string
	var kept []kt.Event
	for _, ev := range srcEvs[:s] {
		if ev.Type == "resource.registered" {
			keys = append(keys, ev.Payload["key"].(string))
		}
	}
	for _, ev := range srcEvs[:s] {
		switch {
		case ev.Type == "resource.registered" || ev.Type == "resource.initialized":
			if slices.Contains(keys, ev.Payload["key"].(string)) {
				kept = append(kept, ev)
			}
		case strings.HasPrefix(ev.Type, "step.") && ev.Type != "step.rate_limited":
			if id, _ := ev.Payload["step_id"].(string); isCopied[id] {
				kept = append(kept, ev)
			}
		}
	}
	f.kept = len(kept)
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
	// Restoration, initialization and checkpoint copies.
	_, points := so.point(s)
	restoration := map[string]any{}
	var inits, ckpts []map[string]any
	for _, key := range keys {
		var pt rfPoint
		for _, p := range points {
			if p.Key == key {
				pt = p
			}
		}
		entry := map[string]any{"covered": pt.Covered}
		init := map[string]any{"key": key}
		gen := so.genAt[s][key]
		if !pt.Covered {
			gen++
		}
		init["generation"] = float64(gen)
		f.gen[key] = gen
		if pt.Seq != 0 {
			entry["checkpoint_ref"], entry["checkpoint_seq"] = pt.Ref, float64(pt.Seq)
			init["checkpoint_ref"] = pt.Ref
		}
		restoration[key] = entry
		inits = append(inits, init)
		rows := slices.Clone(so.byKey[key].rows)
		sort.SliceStable(rows, func(i, j int) bool { return rows[i].covered < rows[j].covered })
		var mine []map[string]any
		for _, row := range rows {
			if row.covered > s {
				continue
			}
			c := map[string]any{"key": key, "generation": float64(row.gen), "checkpoint_ref": row.ref,
				"covered_seq": float64(mapSeq(row.covered))}
			if row.inv != 0 && row.inv <= s {
				c["invalidated_seq"] = float64(mapSeq(row.inv))
			}
			if n := len(mine); n > 0 && mine[n-1]["covered_seq"] == c["covered_seq"] {
				mine[n-1] = c
				continue
			}
			mine = append(mine, c)
		}
		ckpts = append(ckpts, mine...)
	}
	f.restoration = restoration

	// The fork's Execution.
	if exec["status"] != "running" || exec["forked_from"] != src || rfNum(exec["fork_seq"]) != s ||
		!reflect.DeepEqual(exec["restoration"], restoration) || exec["agent_id"] != srcExec["agent_id"] ||
		!reflect.DeepEqual(exec["input"], srcExec["input"]) || exec["agent_version"] != srcExec["agent_version"] ||
		exec["parent_execution_id"] != srcExec["parent_execution_id"] || exec["on_behalf_of"] != srcExec["on_behalf_of"] {
		t.Fatalf("fork execution %v (source %v, restoration %v)", exec, srcExec, restoration)
	}
	if got := rfStrings(exec["resource_keys"]); !slices.Equal(got, append([]string{}, keys...)) {
		t.Fatalf("fork resource_keys %v, want %v", got, keys)
	}
	if !reflect.DeepEqual(k.Execution(f.id)["restoration"], restoration) {
		t.Fatalf("fork read back: restoration %v", k.Execution(f.id)["restoration"])
	}

	// The fork's log, once its first delivery is acked.
	rfWaitEvent(t, k, f.id, "fork ack", func(ev kt.Event) bool { return ev.Type == "dispatch.acked" })
	evs := k.Events(f.id)
	f.evs = evs
	n := 2 + len(kept) + len(inits) + len(ckpts) + 2
	if len(evs) != n+1 || evs[n].Type != "dispatch.acked" {
		t.Fatalf("fork log has %d events %v, want %d and the ack", len(evs), rfTypes(evs), n)
	}
	if evs[0].Type != "execution.created" || evs[0].Payload["execution_id"] != f.id || evs[0].Payload["status"] != "pending" {
		t.Fatalf("fork event 1: %s %v", evs[0].Type, evs[0].Payload)
	}
	forked := map[string]any{"source_execution_id": src, "fork_seq": float64(s), "restoration": restoration}
	if evs[1].Type != "execution.forked" || !reflect.DeepEqual(evs[1].Payload, forked) {
		t.Fatalf("fork event 2: %s %v, want %v", evs[1].Type, evs[1].Payload, forked)
	}
	for i, src := range kept {
		got := evs[2+i]
		want := map[string]any{}
		for k, v := range src.Payload {
			want[k] = v
		}
		if id, ok := want["step_id"].(string); ok {
			want["step_id"] = f.stepIDs[id]
		}
		if got.Type != src.Type || got.OccurredAt != src.OccurredAt || !reflect.DeepEqual(got.Payload, want) {
			t.Fatalf("fork event %d: %s %v at %s; want the source's %d: %s %v at %s", got.Seq, got.Type, got.Payload,
				got.OccurredAt, src.Seq, src.Type, want, src.OccurredAt)
		}
	}
	at := 2 + len(kept)
	for _, init := range inits {
		if evs[at].Type != "resource.initialized" || !reflect.DeepEqual(evs[at].Payload, init) {
			t.Fatalf("fork event %d: %s %v, want resource.initialized %v", at+1, evs[at].Type, evs[at].Payload, init)
		}
		at++
	}
	for _, c := range ckpts {
		if evs[at].Type != "resource.checkpointed" || !reflect.DeepEqual(evs[at].Payload, c) {
			t.Fatalf("fork event %d: %s %v, want resource.checkpointed %v", at+1, evs[at].Type, evs[at].Payload, c)
		}
		at++
	}
	if evs[at].Type != "execution.started" || evs[at+1].Type != "dispatch.queued" || evs[at+1].Payload["execution_id"] != f.id {
		t.Fatalf("fork events %d–%d: %v", at+1, at+2, rfTypes(evs[at:]))
	}

	// The copied steps: same rows under new ids, sharing the bodies.
	steps := rfSteps(t, k, f.id)
	if len(steps) != len(copied) {
		t.Fatalf("fork has %d steps, want %d copies", len(steps), len(copied))
	}
	for i, st := range steps {
		from := copied[i]
		if st.str("step_id") != f.stepIDs[from.str("step_id")] || st.str("execution_id") != f.id {
			t.Fatalf("fork step %d: id %s, want %s", i, st.str("step_id"), f.stepIDs[from.str("step_id")])
		}
		for _, field := range []string{"kind", "target", "args_hash", "occurrence", "status", "idempotency", "args",
			"resources", "result", "error", "started_at", "completed_at"} {
			if !bytes.Equal(st[field], from[field]) {
				t.Fatalf("fork step %d %s: %s, source %s", i, field, st[field], from[field])
			}
		}
	}

	// Coverage: the fork's own answers against the oracle, and docs/protocol/forks.md §3's
	// mapping: a copied position answers as the last source seq it stands
	// for, and the rest of the creation transaction as s.
	f.o, _ = rfCheckCoverage(t, k, f.id)
	for p := int64(1); p <= int64(n); p++ {
		want := true
		switch {
		case p <= 2:
		case p <= int64(2+len(kept)):
			last := s
			if i := int(p - 2); i < len(kept) {
				last = kept[i].Seq - 1
			}
			want = so.covered(last)
		default:
			want = so.covered(s)
		}
		if got := f.o.covered(p); got != want {
			t.Fatalf("fork of %s at %d: covered at %d is %v, the source's answer is %v", src, s, p, got, want)
		}
	}
	return f
}
