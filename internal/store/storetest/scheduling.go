package storetest

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// schedulingScenarios are the scenarios of the reads of the deadline and retention workers.
var schedulingScenarios = []scenario{
	{"Deadlines", testDeadlines},
	{"RetentionCandidates", testRetentionCandidates},
}

func testDeadlines(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := at(time.Hour)
	mk := func(id, status string, deadline time.Time) *store.Execution {
		e := minimalExecution(id, "agent", status)
		e.DeadlineAt = deadline
		return e
	}
	if got := val(s.Read().NextDeadline(ctx)).get(t, "NextDeadline"); !got.IsZero() {
		t.Errorf("NextDeadline of an empty store: got %v, want zero", got)
	}
	write(t, s,
		mk("x1", wire.ExecPending, now.Add(-3*time.Second)),
		mk("x2", wire.ExecRunning, now.Add(-2*time.Second)),
		mk("x3", wire.ExecBlocked, now),
		mk("x4", wire.ExecCompleted, now.Add(-10*time.Second)),
		mk("x5", wire.ExecFailed, now.Add(-9*time.Second)),
		mk("x6", wire.ExecCancelled, now.Add(-8*time.Second)),
		mk("x7", wire.ExecRunning, time.Time{}),
		mk("x8", wire.ExecPending, now.Add(5*time.Second)),
	)
	due := val(s.Read().DeadlinesDue(ctx, now, 100)).get(t, "DeadlinesDue")
	sameStrings(t, "DeadlinesDue", sorted(due), []string{"x1", "x2", "x3"})
	two := val(s.Read().DeadlinesDue(ctx, now, 2)).get(t, "DeadlinesDue")
	if len(two) != 2 || !slices.Contains(due, two[0]) || !slices.Contains(due, two[1]) || two[0] == two[1] {
		t.Errorf("DeadlinesDue limit 2: got %q, want two of %q", two, due)
	}
	sameStrings(t, "DeadlinesDue earlier", val(s.Read().DeadlinesDue(ctx, now.Add(-3*time.Second), 100)).get(t, "DeadlinesDue"), []string{"x1"})
	if got := val(s.Read().NextDeadline(ctx)).get(t, "NextDeadline"); !got.Equal(now.Add(-3 * time.Second)) {
		t.Errorf("NextDeadline: got %v, want %v", got, now.Add(-3*time.Second))
	}

	finish := func(ids ...string) {
		t.Helper()
		update(t, s, "", func(ctx context.Context, tx store.Tx) error {
			for _, id := range ids {
				e, err := tx.Execution(ctx, id)
				if err != nil {
					return err
				}
				e.Status = wire.ExecFailed
				if err := tx.UpdateExecution(ctx, e); err != nil {
					return err
				}
			}
			return nil
		})
	}
	finish("x1", "x2", "x3")
	sameStrings(t, "DeadlinesDue once they are terminal", val(s.Read().DeadlinesDue(ctx, now.Add(time.Hour), 100)).get(t, "DeadlinesDue"), []string{"x8"})
	if got := val(s.Read().NextDeadline(ctx)).get(t, "NextDeadline"); !got.Equal(now.Add(5 * time.Second)) {
		t.Errorf("NextDeadline: got %v, want %v", got, now.Add(5*time.Second))
	}
	finish("x8")
	if got := val(s.Read().NextDeadline(ctx)).get(t, "NextDeadline"); !got.IsZero() {
		t.Errorf("NextDeadline with no live deadline: got %v, want zero", got)
	}
}

func testRetentionCandidates(t *testing.T, s store.Store) {
	ctx := t.Context()
	cutoff := at(24 * time.Hour)
	mk := func(id, status string, updated time.Time) *store.Execution {
		e := minimalExecution(id, "agent", status)
		e.UpdatedAt = updated
		return e
	}
	write(t, s,
		mk("r1", wire.ExecCompleted, cutoff.Add(-3*time.Hour)),
		mk("r2", wire.ExecFailed, cutoff.Add(-2*time.Hour)),
		mk("r3", wire.ExecCancelled, cutoff.Add(-time.Microsecond)),
		mk("r4", wire.ExecCompleted, cutoff),
		mk("r5", wire.ExecCompleted, cutoff.Add(time.Hour)),
		mk("r6", wire.ExecRunning, cutoff.Add(-10*time.Hour)),
		mk("r7", wire.ExecPending, cutoff.Add(-10*time.Hour)),
		mk("r8", wire.ExecBlocked, cutoff.Add(-10*time.Hour)),
	)
	got := val(s.Read().RetentionCandidates(ctx, cutoff, 100)).get(t, "RetentionCandidates")
	sameStrings(t, "RetentionCandidates", sorted(got), []string{"r1", "r2", "r3"})
	two := val(s.Read().RetentionCandidates(ctx, cutoff, 2)).get(t, "RetentionCandidates")
	if len(two) != 2 || !slices.Contains(got, two[0]) || !slices.Contains(got, two[1]) || two[0] == two[1] {
		t.Errorf("RetentionCandidates limit 2: got %q, want two of %q", two, got)
	}
	sameStrings(t, "RetentionCandidates far in the future", sorted(val(s.Read().RetentionCandidates(ctx, at(1000*time.Hour), 100)).get(t, "RetentionCandidates")),
		[]string{"r1", "r2", "r3", "r4", "r5"})
	sameStrings(t, "RetentionCandidates in the past", val(s.Read().RetentionCandidates(ctx, base, 100)).get(t, "RetentionCandidates"), []string{})
}
