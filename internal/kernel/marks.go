package kernel

import (
	"sort"
	"strings"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// Marks let a fork read its source in place (docs/architecture.md,
// "Forks"): the mark before an event counts what a fork at any seq needs to
// know of the log before it, so that no fork has to pass over the history.

// keepable reports whether a fork's log keeps events of this type when they
// belong to a copied step or resource (docs/protocol/forks.md §3).
func keepable(typ string) bool {
	if strings.HasPrefix(typ, "step.") {
		return typ != wire.EventStepRateLimited
	}
	return typ == EventResourceRegistered || typ == EventResourceInitialized
}

// closesCopyably reports whether an event closes its step in a way a fork
// copies: succeeded, failed, or denied other than by a terminal clean-up
// (docs/protocol/forks.md §2).
func closesCopyably(typ string, payload []byte) bool {
	switch typ {
	case wire.EventStepSucceeded, wire.EventStepFailed:
		return true
	case wire.EventStepDenied:
		return !cleanupReasons[string(textField(jsonx.Field(payload, "error"), "reason"))]
	}
	return false
}

// NextMark returns the mark after an event, given the mark before it: the
// kernel's own rule, for tools that write a store directly (the benchmarks'
// long histories) and must mark it as the kernel would. A mark is never
// changed in place: runs and events share them.
func NextMark(m *store.Mark, typ string, payload []byte) (*store.Mark, error) {
	return advanceMark(m, typ, payload)
}

func advanceMark(m *store.Mark, typ string, payload []byte) (*store.Mark, error) {
	keep := keepable(typ)
	closes := closesCopyably(typ, payload)
	sets, err := generationsSet(typ, payload)
	if err != nil || !keep && !closes && sets == nil {
		return m, err
	}
	next := *m
	if keep {
		next.Kept++
	}
	if closes {
		next.Closed++
	}
	if sets != nil {
		next.Generations = mergeGenerations(m.Generations, sets)
	}
	return &next, nil
}

// generationsSet is what an event sets of the generations
// (docs/protocol/forks.md §2, "the generation of k at s"): a step.executing's
// `generations`, a resource.initialized's key and generation; nil for any
// other event. The payloads were written by the kernel, so members are read
// in place.
func generationsSet(typ string, payload []byte) ([]jsonx.Member, error) {
	switch typ {
	case wire.EventStepExecuting:
		raw := jsonx.Field(payload, "generations")
		if raw == nil {
			return nil, nil
		}
		g, err := jsonx.Parse(raw, wire.MaxNesting)
		if err != nil {
			return nil, err
		}
		return g.Members, nil
	case EventResourceInitialized:
		key := textField(payload, "key")
		raw := jsonx.Field(payload, "generation")
		if key == nil || raw == nil {
			return nil, nil
		}
		v, err := jsonx.Parse(raw, wire.MaxNesting)
		if err != nil {
			return nil, err
		}
		return []jsonx.Member{{Key: string(key), Value: v}}, nil
	}
	return nil, nil
}

// mergeGenerations returns the generations object with sets applied, its
// keys in the order they first appeared.
func mergeGenerations(old []byte, sets []jsonx.Member) []byte {
	var members []jsonx.Member
	if old != nil {
		if v, err := jsonx.Parse(old, wire.MaxNesting); err == nil {
			members = v.Members
		}
	}
	for _, s := range sets {
		found := false
		for i := range members {
			if members[i].Key == s.Key {
				members[i].Value, found = s.Value, true
			}
		}
		if !found {
			members = append(members, s)
		}
	}
	o := &jsonx.Object{}
	for _, m := range members {
		o.Raw(m.Key, m.Value.Raw)
	}
	return o.Bytes()
}

// generationOf reads one key's generation from a generations object (0 when
// absent).
func generationOf(generations []byte, key string) int64 {
	if generations == nil {
		return 0
	}
	n, _ := intValue(jsonx.Field(generations, key))
	return n
}

// markThrough advances a run's mark through its events up to and including
// seq, and returns the mark after seq.
func markThrough(run *store.EventRun, seq int64) (*store.Mark, error) {
	m := run.Mark
	for _, ev := range run.Events {
		if ev.Seq > seq {
			break
		}
		var err error
		if m, err = advanceMark(m, ev.Type, ev.Payload); err != nil {
			return nil, err
		}
	}
	return m, nil
}

// keptAfter is the Kept of the execution's mark after its event at seq, one
// this operation appended: what a checkpoint row keeps of its seqs
// (store.Checkpoint). 0 when unknown: the execution keeps no marks, or the
// event at seq is not one of this operation's.
func (o *op) keptAfter(seq int64) int64 {
	i := sort.Search(len(o.events), func(i int) bool { return o.events[i].Seq >= seq })
	if i == len(o.events) || o.events[i].Seq != seq || o.events[i].Mark == nil {
		return 0
	}
	ev := o.events[i]
	m, err := advanceMark(ev.Mark, ev.Type, ev.Payload)
	if err != nil {
		return 0
	}
	return m.Kept
}
