package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
	"github.com/rebuno/rebuno/internal/wire"
)

// TestRoundTripsPerStep counts the round trips between the kernel and
// Postgres that a step's operations make, as TestPagesPerStep counts
// SQLite's pages: on a small machine each one costs both processes a send,
// a receive and a wake-up, so one more on every step is a regression to
// notice here rather than in the benchmark. The lock read brings the
// execution's dispatch, and every single-row read travels with the writes
// held before it (conn.go).
func TestRoundTripsPerStep(t *testing.T) {
	ctx := context.Background()
	s, err := postgres.Open(ctx, postgres.Options{URL: pgtest.NewDatabase(t), Migrate: true, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	k := kernel.New(kernel.Options{Store: s, Config: kernel.DefaultConfig(), Limiter: s.Limiter(), Logger: slog.New(slog.DiscardHandler)})
	if _, err := k.RegisterAgent(ctx, kernel.AgentSpec{ID: "a", WebhookURL: "http://127.0.0.1:1/w", Secret: "a-secret-of-16-bytes"}); err != nil {
		t.Fatal(err)
	}
	if _, err := k.CreateExecution(ctx, kernel.CreateRequest{AgentID: "a"}); err != nil {
		t.Fatal(err)
	}
	refs, err := s.Read().DueDispatches(ctx, time.Now(), 2, nil)
	if err != nil || len(refs) != 1 {
		t.Fatalf("%d due dispatches (%v), want 1", len(refs), err)
	}
	del, err := k.ClaimDispatch(ctx, refs[0])
	if err != nil || del == nil {
		t.Fatalf("claim: %v", err)
	}
	h := kernel.DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}
	c := kernel.Caller{Agent: "a"}

	var trips atomic.Int64
	postgres.SetRoundTripHook(func() { trips.Add(1) })
	defer postgres.SetRoundTripHook(nil)
	count := func(f func() error) int64 {
		t.Helper()
		trips.Store(0)
		if err := f(); err != nil {
			t.Fatal(err)
		}
		return trips.Load()
	}
	step := 0
	submit := func(carried string) (string, error) {
		raw := fmt.Appendf(nil, `{"q":%d}`, step)
		step++
		v, _ := jsonx.Parse(raw, 128)
		r := kernel.SubmitRequest{Kind: wire.KindToolCall, Target: "t", Args: raw, ArgsValue: v, HasOccurrence: true}
		if carried != "" {
			r.Outcome = &kernel.CarriedOutcome{StepID: carried, OutcomeRequest: kernel.OutcomeRequest{Succeeded: true, Value: []byte(`{"ok":true}`)}}
		}
		d, err := k.SubmitStep(ctx, c, del.ExecutionID, h, r)
		if err == nil && d.Decision != wire.DecisionProceed {
			err = fmt.Errorf("submit: %s, want proceed", d.Decision)
		}
		if err != nil {
			return "", err
		}
		return d.StepID, nil
	}

	// Warm: the first operations of a connection prepare their statements.
	prev := ""
	for range 3 {
		if prev, err = submit(prev); err != nil {
			t.Fatal(err)
		}
	}
	var id string
	carried := count(func() (err error) { id, err = submit(prev); return err })
	complete := count(func() error {
		out, err := k.RecordOutcome(ctx, c, del.ExecutionID, id, h, kernel.OutcomeRequest{Succeeded: true, Value: []byte(`{"ok":true}`)})
		if err == nil && out.Decision != wire.DecisionRecorded {
			err = fmt.Errorf("complete: %s, want recorded", out.Decision)
		}
		return err
	})
	alone := count(func() (err error) { _, err = submit(""); return err })
	t.Logf("round trips: carried submit %d, submit %d, complete %d", carried, alone, complete)
	for _, op := range []struct {
		what      string
		got, want int64
	}{{"a submit carrying the previous outcome", carried, 5}, {"a submit", alone, 4}, {"a complete", complete, 4}} {
		if op.got > op.want {
			t.Errorf("%s made %d round trips, want at most %d", op.what, op.got, op.want)
		}
	}
}
