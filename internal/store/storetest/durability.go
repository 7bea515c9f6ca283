package storetest

import (
	"context"
	"errors"
	"fmt"
	"testing"

	"github.com/rebuno/rebuno/internal/store"
)

func testAcknowledgedWritesSurvive(t *testing.T, s store.Store, reopen func(*testing.T, store.Store) store.Store) {
	const n = 40
	graphs := make([]graph, n)
	errs := make(chan error, n)
	for i := range n {
		graphs[i] = newGraph(fmt.Sprintf("exec-d%02d", i))
		go func() {
			errs <- s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
				if err := writeRows(ctx, tx, graphs[i].rows()...); err != nil {
					return err
				}
				if i%5 == 4 {
					return errDeliberate
				}
				return nil
			})
		}()
	}
	for range n {
		if err := <-errs; err != nil && !errors.Is(err, errDeliberate) {
			t.Fatalf("Update: %v", err)
		}
	}
	write(t, s, fullAgent("agent-durable"))
	var w world
	for _, g := range graphs {
		w = w.merge(g.world())
	}
	before := dump(t, s.Read(), w)

	s = reopen(t, s)
	sameDump(t, "after reopening", dump(t, s.Read(), w), before)
	for i, g := range graphs {
		if i%5 == 4 {
			g.checkAbsent(t, s.Read())
		} else {
			g.checkPresent(t, s.Read())
		}
	}
	same(t, "agent after reopening", val(s.Read().Agent(t.Context(), "agent-durable")).get(t, "Agent"), fullAgent("agent-durable"))
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("Ping after reopening: %v", err)
	}
}

func testReopenIsIdempotent(t *testing.T, s store.Store, reopen func(*testing.T, store.Store) store.Store) {
	var gs []graph
	for round := range 4 {
		g := newGraph(fmt.Sprintf("exec-round%d", round))
		write(t, s, g.rows()...)
		gs = append(gs, g)
		s = reopen(t, s)
		for _, g := range gs {
			g.checkPresent(t, s.Read())
		}
	}
	list := val(s.Read().ListExecutions(t.Context(), store.ExecutionFilter{Limit: 100})).get(t, "ListExecutions")
	sameStrings(t, "executions after four reopenings", executionIDs(list), []string{"exec-round3", "exec-round2", "exec-round1", "exec-round0"})
}

func testFinalStateSurvives(t *testing.T, s store.Store, reopen func(*testing.T, store.Store) store.Store) {
	n, p, w := rollbackWorld(t, s)
	update(t, s, p.execution.ID, func(ctx context.Context, tx store.Tx) error {
		_, err := writeEverywhere(ctx, tx, n, p)
		return err
	})
	// A rolled back change after the committed ones leaves no trace either.
	err := s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.DeleteExecution(ctx, n.execution.ID); err != nil {
			return err
		}
		return errDeliberate
	})
	if !errors.Is(err, errDeliberate) {
		t.Fatalf("Update: got %v, want the function's error", err)
	}
	before := dump(t, s.Read(), w)
	s = reopen(t, s)
	sameDump(t, "after reopening", dump(t, s.Read(), w), before)
	n.checkPresent(t, s.Read())
	_, err = s.Read().Execution(t.Context(), "exec-q")
	wantNotFound(t, "deleted execution after reopening", err)
	_, err = s.Read().Agent(t.Context(), "india")
	wantNotFound(t, "deleted agent after reopening", err)
}
