package kernel

import (
	"encoding/json"
	"maps"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/wire"
)

// marksCheck holds the marks the store keeps for an execution's log against
// a pass over the log written here from docs/protocol/forks.md alone: at
// every seq, the mark after it counts the keepable events and the copyable
// closes up to it, and holds each key's generation there (docs/protocol/forks.md §2, "the
// generation of k at s"). Every checkpoint row keeps the kept count after
// its covered and invalidated seqs (store.Checkpoint), never 0 here.
func marksCheck(t *testing.T, fx *fixture, id string) {
	t.Helper()
	evs := fx.events(id)
	if fx.exec(id).Mark == nil {
		t.Fatalf("%s has no mark", id)
	}
	var kept, closed int64
	keptAfter := map[int64]int64{}
	gens := map[string]int64{}
	for _, ev := range evs {
		var p struct {
			Error       json.RawMessage  `json:"error"`
			Generations map[string]int64 `json:"generations"`
			Key         string           `json:"key"`
			Generation  *int64           `json:"generation"`
		}
		if err := json.Unmarshal(ev.Payload, &p); err != nil {
			t.Fatalf("event %d: %v", ev.Seq, err)
		}
		if strings.HasPrefix(ev.Type, "step.") && ev.Type != wire.EventStepRateLimited ||
			ev.Type == EventResourceRegistered || ev.Type == EventResourceInitialized {
			kept++
		}
		keptAfter[ev.Seq] = kept
		switch ev.Type {
		case wire.EventStepSucceeded, wire.EventStepFailed:
			closed++
		case wire.EventStepDenied:
			var e struct{ Reason string }
			json.Unmarshal(p.Error, &e)
			if !fkCleanup[e.Reason] {
				closed++
			}
		case wire.EventStepExecuting:
			maps.Copy(gens, p.Generations)
		case EventResourceInitialized:
			gens[p.Key] = *p.Generation
		}
		m, ok, err := markAfter(fx.ctx, fx.k.store.Read(), id, ev.Seq)
		if err != nil || !ok {
			t.Fatalf("mark after %d: %v (found %v)", ev.Seq, err, ok)
		}
		if m.Kept != kept || m.Closed != closed {
			t.Fatalf("mark after %d: kept %d closed %d, the log says %d and %d", ev.Seq, m.Kept, m.Closed, kept, closed)
		}
		for key, g := range gens {
			if got := generationOf(m.Generations, key); got != g {
				t.Fatalf("mark after %d: generation of %s %d, the log says %d (%s)", ev.Seq, key, got, g, m.Generations)
			}
		}
	}
	if m := fx.exec(id).Mark; m.Kept != kept || m.Closed != closed {
		t.Fatalf("the execution's mark %+v, the log says kept %d closed %d", m, kept, closed)
	}
	rows, err := fx.k.store.Read().Checkpoints(fx.ctx, id)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range rows {
		want := [2]int64{keptAfter[c.CoveredSeq], keptAfter[c.InvalidatedSeq]} // keptAfter[0] is 0: open
		if got := [2]int64{c.CoveredKept, c.InvalidatedKept}; got != want || c.CoveredKept == 0 || c.InvalidatedSeq != 0 && c.InvalidatedKept == 0 {
			t.Fatalf("checkpoint %+v: kept counts %v, the log says %v", c, got, want)
		}
	}
}
