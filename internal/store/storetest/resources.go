package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/rebuno/rebuno/internal/store"
)

// resourceScenarios are the scenarios of resources and checkpoints.
var resourceScenarios = []scenario{
	{"Resources", testResources},
	{"Checkpoints", testCheckpoints},
}

func insertAll[T any](t *testing.T, s store.Store, rows []T, insert func(ctx context.Context, tx store.Tx, row T) error) {
	t.Helper()
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		for _, r := range rows {
			if err := insert(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
}

func insertResource(ctx context.Context, tx store.Tx, r *store.Resource) error {
	return tx.InsertResource(ctx, r)
}

func insertCheckpoint(ctx context.Context, tx store.Tx, c *store.Checkpoint) error {
	return tx.InsertCheckpoint(ctx, c)
}

func testResources(t *testing.T, s store.Store) {
	ctx := t.Context()
	full := &store.Resource{ExecutionID: "exec-r", Key: "zeta", Position: 0, DriverID: "example.e2b.v1",
		Configuration: []byte(`{"timeout":600}`), CoverageReuse: true, EverySteps: 5, OnCompletion: true, RegisteredSeq: 5,
		Generation: 3, Binding: []byte(`{"sandbox_id":"i8x"}`), CheckpointRef: "snap_c1", StartsSinceCheckpoint: 2}
	bare := &store.Resource{ExecutionID: "exec-r", Key: "alpha", Position: 1, DriverID: "d", RegisteredSeq: 9}
	other := &store.Resource{ExecutionID: "exec-o", Key: "zeta", Position: 0, DriverID: "other", RegisteredSeq: 1}
	insertAll(t, s, []*store.Resource{full, bare, other}, insertResource)
	r := s.Read()
	same(t, "resource zeta", val(r.Resource(ctx, "exec-r", "zeta")).get(t, "Resource"), full)
	same(t, "resource alpha (no configuration, no binding)", val(r.Resource(ctx, "exec-r", "alpha")).get(t, "Resource"), bare)
	sameList(t, "resources in registration order", val(r.Resources(ctx, "exec-r")).get(t, "Resources"), []*store.Resource{full, bare})
	sameList(t, "another execution's resources", val(r.Resources(ctx, "exec-o")).get(t, "Resources"), []*store.Resource{other})
	if l := val(r.Resources(ctx, "exec-none")).get(t, "Resources"); len(l) != 0 {
		t.Errorf("resources of an execution without any: %d", len(l))
	}
	_, err := r.Resource(ctx, "exec-r", "nope")
	wantNotFound(t, "Resource of an unknown key", err)
	_, err = r.Resource(ctx, "exec-none", "zeta")
	wantNotFound(t, "Resource of another execution", err)
	err = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertResource(ctx, &store.Resource{ExecutionID: "exec-r", Key: "zeta", Position: 2, DriverID: "x"})
	})
	if err == nil {
		t.Error("a second resource with the same key was stored")
	}
	same(t, "resource zeta after a refused duplicate", val(r.Resource(ctx, "exec-r", "zeta")).get(t, "Resource"), full)

	// UpdateResource writes generation, binding and the start counter, and
	// nothing else.
	changed := *bare
	changed.Generation, changed.Binding, changed.StartsSinceCheckpoint = 7, []byte(` {"p" : 1} `), 4
	changed.DriverID, changed.EverySteps, changed.CheckpointRef, changed.Position, changed.RegisteredSeq = "ignored", 99, "ignored", 5, 99
	changed.Configuration, changed.CoverageReuse, changed.OnCompletion = []byte(`1`), true, true
	var inTx *store.Resource
	update(t, s, "exec-r", func(ctx context.Context, tx store.Tx) error {
		if err := tx.UpdateResource(ctx, &changed); err != nil {
			return err
		}
		var err error
		inTx, err = tx.Resource(ctx, "exec-r", "alpha")
		return err
	})
	want := *bare
	want.Generation, want.Binding, want.StartsSinceCheckpoint = 7, []byte(` {"p" : 1} `), 4
	same(t, "resource alpha read in its update", inTx, &want)
	same(t, "updated resource alpha", val(r.Resource(ctx, "exec-r", "alpha")).get(t, "Resource"), &want)
	same(t, "resource zeta after updating alpha", val(r.Resource(ctx, "exec-r", "zeta")).get(t, "Resource"), full)
	same(t, "another execution's zeta", val(r.Resource(ctx, "exec-o", "zeta")).get(t, "Resource"), other)
}

func testCheckpoints(t *testing.T, s store.Store) {
	ctx := t.Context()
	// The kept counts round-trip as written; 0 is a row that knows none.
	b0 := &store.Checkpoint{ExecutionID: "exec-c", Key: "b", CoveredSeq: 7, Generation: 0, CheckpointRef: "B0", InvalidatedSeq: 10,
		CoveredKept: 5, InvalidatedKept: 8}
	c1 := &store.Checkpoint{ExecutionID: "exec-c", Key: "b", CoveredSeq: 15, Generation: 2, CheckpointRef: "C1", CoveredKept: 11}
	a1 := &store.Checkpoint{ExecutionID: "exec-c", Key: "a", CoveredSeq: 12, Generation: 1, CheckpointRef: "A1"}
	ob := &store.Checkpoint{ExecutionID: "exec-o", Key: "b", CoveredSeq: 3, Generation: 0, CheckpointRef: "other"}
	insertAll(t, s, []*store.Checkpoint{c1, ob, b0, a1}, insertCheckpoint)
	r := s.Read()
	sameList(t, "checkpoints by key, then covered_seq", val(r.Checkpoints(ctx, "exec-c")).get(t, "Checkpoints"), []*store.Checkpoint{a1, b0, c1})
	if l := val(r.Checkpoints(ctx, "exec-none")).get(t, "Checkpoints"); len(l) != 0 {
		t.Errorf("checkpoints of an execution without any: %d", len(l))
	}
	// CheckpointAt: the newest row of the key with covered_seq <= seq.
	for _, c := range []struct {
		exec, key string
		seq       int64
		want      *store.Checkpoint
	}{
		{"exec-c", "b", 6, nil}, {"exec-c", "b", 7, b0}, {"exec-c", "b", 14, b0}, {"exec-c", "b", 15, c1},
		{"exec-c", "b", 1 << 62, c1}, {"exec-c", "a", 11, nil}, {"exec-c", "a", 12, a1}, {"exec-c", "z", 100, nil},
		{"exec-o", "b", 100, ob}, {"exec-none", "b", 100, nil},
	} {
		got, err := r.CheckpointAt(ctx, c.exec, c.key, c.seq)
		what := fmt.Sprintf("CheckpointAt(%s, %s, %d)", c.exec, c.key, c.seq)
		if c.want == nil {
			wantNotFound(t, what, err)
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		same(t, what, got, c.want)
	}
	// InvalidateCheckpoints closes the open rows of one key of one
	// execution with the seq and its kept count, and leaves closed rows as
	// they are.
	update(t, s, "exec-c", func(ctx context.Context, tx store.Tx) error {
		return tx.InvalidateCheckpoints(ctx, "exec-c", "b", 19, 14)
	})
	closed := *c1
	closed.InvalidatedSeq, closed.InvalidatedKept = 19, 14
	sameList(t, "checkpoints after closing b", val(r.Checkpoints(ctx, "exec-c")).get(t, "Checkpoints"), []*store.Checkpoint{a1, b0, &closed})
	same(t, "another execution's open row", val(r.CheckpointAt(ctx, "exec-o", "b", 100)).get(t, "CheckpointAt"), ob)
	b2 := &store.Checkpoint{ExecutionID: "exec-c", Key: "b", CoveredSeq: 20, Generation: 3, CheckpointRef: "C1", CoveredKept: 15}
	var seen []*store.Checkpoint
	update(t, s, "exec-c", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertCheckpoint(ctx, b2); err != nil {
			return err
		}
		if err := tx.InvalidateCheckpoints(ctx, "exec-c", "b", 25, 20); err != nil {
			return err
		}
		var err error
		seen, err = tx.Checkpoints(ctx, "exec-c")
		return err
	})
	closed2 := *b2
	closed2.InvalidatedSeq, closed2.InvalidatedKept = 25, 20
	sameList(t, "checkpoints read in the transaction that closed them", seen, []*store.Checkpoint{a1, b0, &closed, &closed2})
	sameList(t, "checkpoints after closing b again", val(r.Checkpoints(ctx, "exec-c")).get(t, "Checkpoints"), []*store.Checkpoint{a1, b0, &closed, &closed2})
	// (execution, key, covered_seq) is unique; equal refs are separate rows.
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertCheckpoint(ctx, &store.Checkpoint{ExecutionID: "exec-c", Key: "a", CoveredSeq: 12, CheckpointRef: "dup"})
	})
	if err == nil {
		t.Error("a second checkpoint with the same covered_seq was stored")
	}
	same(t, "checkpoint a after a refused duplicate", val(r.CheckpointAt(ctx, "exec-c", "a", 12)).get(t, "CheckpointAt"), a1)

	// CheckpointRange and CountCheckpoints, over rows of b with a repeated
	// kept count (b3) and a closed row without its invalidation's (b4).
	b3 := &store.Checkpoint{ExecutionID: "exec-c", Key: "b", CoveredSeq: 22, Generation: 4, CheckpointRef: "B3", CoveredKept: 15}
	b4 := &store.Checkpoint{ExecutionID: "exec-c", Key: "b", CoveredSeq: 30, Generation: 5, CheckpointRef: "B4", CoveredKept: 16, InvalidatedSeq: 31}
	insertAll(t, s, []*store.Checkpoint{b4, b3}, insertCheckpoint)
	for _, c := range []struct {
		key         string
		after, upTo int64
		want        []*store.Checkpoint
	}{
		{"b", 7, 22, []*store.Checkpoint{&closed, &closed2, b3}}, {"b", 0, 7, []*store.Checkpoint{b0}}, {"b", 6, 6, nil},
		{"b", 22, 1 << 62, []*store.Checkpoint{b4}}, {"a", 0, 100, []*store.Checkpoint{a1}}, {"z", 0, 100, nil},
	} {
		what := fmt.Sprintf("CheckpointRange(exec-c, %s, %d, %d)", c.key, c.after, c.upTo)
		sameList(t, what, val(r.CheckpointRange(ctx, "exec-c", c.key, c.after, c.upTo)).get(t, what), c.want)
	}
	for _, c := range []struct {
		exec, key string
		upTo      int64
		want      store.CheckpointCount
	}{
		{"exec-c", "b", 6, store.CheckpointCount{}}, {"exec-c", "b", 7, store.CheckpointCount{Rows: 1, KeptCounts: 1}},
		{"exec-c", "b", 22, store.CheckpointCount{Rows: 4, KeptCounts: 3}},
		{"exec-c", "b", 1 << 62, store.CheckpointCount{Rows: 5, KeptCounts: 4, Unmarked: 1}},
		{"exec-c", "a", 100, store.CheckpointCount{Rows: 1, KeptCounts: 1, Unmarked: 1}},
		{"exec-none", "b", 100, store.CheckpointCount{}},
	} {
		got, err := r.CountCheckpoints(ctx, c.exec, c.key, c.upTo)
		if err != nil || got != c.want {
			t.Errorf("CountCheckpoints(%s, %s, %d) = %+v, %v; want %+v", c.exec, c.key, c.upTo, got, err, c.want)
		}
	}
}
