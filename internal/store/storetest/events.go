package storetest

import (
	"context"
	"fmt"
	"slices"
	"testing"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// eventScenarios are the scenarios of the event log.
var eventScenarios = []scenario{
	{"Events", testEvents},
	{"EventRuns", testEventRuns},
}

func testEvents(t *testing.T, s store.Store) {
	ctx := t.Context()
	a, b := minimalExecution("exec-a", "agent", wire.ExecRunning), minimalExecution("exec-b", "agent", wire.ExecRunning)
	write(t, s, a, b, events("exec-a", 1, 3), events("exec-b", 1, 2))
	// A second batch in its own transaction, and an empty batch.
	update(t, s, "exec-a", func(ctx context.Context, tx store.Tx) error {
		if err := tx.AppendEvents(ctx, nil); err != nil {
			return err
		}
		return tx.AppendEvents(ctx, events("exec-a", 4, 7))
	})

	all := events("exec-a", 1, 7)
	sameList(t, "Events after 0", val(s.Read().Events(ctx, "exec-a", 0, 100)).get(t, "Events"), all)
	sameList(t, "Events after 2 limit 3", val(s.Read().Events(ctx, "exec-a", 2, 3)).get(t, "Events"), all[2:5])
	sameList(t, "Events after 6", val(s.Read().Events(ctx, "exec-a", 6, 100)).get(t, "Events"), all[6:])
	sameList(t, "Events after the last", val(s.Read().Events(ctx, "exec-a", 7, 100)).get(t, "Events"), []*store.Event{})
	sameList(t, "Events of the other execution", val(s.Read().Events(ctx, "exec-b", 0, 100)).get(t, "Events"), events("exec-b", 1, 2))
	sameList(t, "Events of an unknown execution", val(s.Read().Events(ctx, "exec-none", 0, 100)).get(t, "Events"), []*store.Event{})

	// Paging by after_seq visits every event once.
	var seqs []int64
	var after int64
	for range 10 {
		page := val(s.Read().Events(ctx, "exec-a", after, 2)).get(t, "Events")
		seqs = append(seqs, eventSeqs(page)...)
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Seq
	}
	if !slices.Equal(seqs, []int64{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("paged event seqs: got %v, want 1..7", seqs)
	}

	// One call may append more events than a single SQL statement can bind
	// (a terminate that cancels thousands of open steps).
	const many = 7000
	write(t, s, minimalExecution("exec-many", "agent", wire.ExecRunning), events("exec-many", 1, many))
	got := val(s.Read().Events(ctx, "exec-many", 0, big)).get(t, "Events")
	if len(got) != many || got[0].Seq != 1 || got[many-1].Seq != many {
		t.Errorf("Events after appending %d at once: got %d", many, len(got))
	} else {
		same(t, "event 5000 of a large append", got[4999], events("exec-many", 5000, 5000)[0])
	}

	// A sequence number is never stored twice.
	err := s.Update(ctx, "exec-a", func(ctx context.Context, tx store.Tx) error {
		return tx.AppendEvents(ctx, events("exec-a", 7, 8))
	})
	if err == nil {
		t.Error("appending an event with an existing seq succeeded")
	}
	sameList(t, "Events after a refused duplicate", val(s.Read().Events(ctx, "exec-a", 0, 100)).get(t, "Events"), all)
}

// testEventRuns mixes the ways a store may keep a log (the SQL stores keep
// one execution's append in runs of events, and any other append a row per
// event): the same events come back, in seq order, paged across every
// boundary between them.
func testEventRuns(t *testing.T, s store.Store) {
	ctx := t.Context()
	const id, other = "exec-runs", "exec-runs-other"
	write(t, s, minimalExecution(id, "agent", wire.ExecRunning), minimalExecution(other, "agent", wire.ExecRunning))
	mixed := func(evs ...[]*store.Event) []*store.Event { return slices.Concat(evs...) }
	update(t, s, id, func(ctx context.Context, tx store.Tx) error {
		return tx.AppendEvents(ctx, mixed(events(id, 1, 3), events(other, 1, 1)))
	})
	update(t, s, id, func(ctx context.Context, tx store.Tx) error { return tx.AppendEvents(ctx, events(id, 4, 600)) })
	update(t, s, id, func(ctx context.Context, tx store.Tx) error {
		return tx.AppendEvents(ctx, mixed(events(other, 2, 2), events(id, 601, 603)))
	})
	all := events(id, 1, 603)
	r := s.Read()
	sameList(t, "Events of rows and a large append", val(r.Events(ctx, id, 0, big)).get(t, "Events"), all)
	for _, c := range []struct{ after, limit int64 }{
		{0, 1}, {2, 5}, {3, 1}, {100, 3}, {255, 10}, {259, 300}, {590, 20}, {599, 2}, {600, 10}, {602, 5}, {603, 5},
	} {
		want := all[c.after:min(c.after+c.limit, int64(len(all)))]
		sameList(t, fmt.Sprintf("Events after %d limit %d", c.after, c.limit),
			val(r.Events(ctx, id, c.after, int(c.limit))).get(t, "Events"), want)
	}
	var seqs []int64
	for after := int64(0); ; {
		page := val(r.Events(ctx, id, after, 7)).get(t, "Events")
		seqs = append(seqs, eventSeqs(page)...)
		if len(page) < 7 {
			break
		}
		after = page[len(page)-1].Seq
	}
	if len(seqs) != len(all) || seqs[0] != 1 || seqs[len(seqs)-1] != 603 || !slices.IsSorted(seqs) {
		t.Errorf("paging by 7 visited %d events", len(seqs))
	}

	// No seq is stored twice, whichever way it was stored.
	for _, c := range []struct {
		what   string
		events []*store.Event
	}{
		{"a row inside a large append", events(id, 100, 100)},
		{"a large append over rows", events(id, 603, 700)},
		{"a large append over a large append", events(id, 500, 700)},
		{"an event of two executions' append inside a large append", mixed(events(other, 3, 3), events(id, 200, 200))},
		{"a small append inside a large append", events(id, 300, 301)},
	} {
		err := s.Update(ctx, id, func(ctx context.Context, tx store.Tx) error { return tx.AppendEvents(ctx, c.events) })
		if err == nil {
			t.Errorf("%s succeeded", c.what)
		}
	}
	sameList(t, "Events after refused duplicates", val(r.Events(ctx, id, 0, big)).get(t, "Events"), all)
	sameList(t, "Events of the other execution after a refused append", val(r.Events(ctx, other, 0, big)).get(t, "Events"),
		events(other, 1, 2))

	update(t, s, id, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, id) })
	sameList(t, "Events of a deleted execution", val(r.Events(ctx, id, 0, big)).get(t, "Events"), []*store.Event{})
}
