package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// stepScenarios are the scenarios of steps and the reads of the submit path.
var stepScenarios = []scenario{
	{"StepRoundTrip", testStepRoundTrip},
	{"StepsListing", testStepsListing},
	{"OpenSteps", testOpenSteps},
	{"Occurrences", testOccurrences},
	{"HasIndeterminate", testHasIndeterminate},
}

func testStepRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	full := fullStep("exec-s", "step-full")
	bare := simpleStep("exec-s", "step-bare", 8, wire.StepProposed)
	write(t, s, minimalExecution("exec-s", "agent", wire.ExecRunning), full, bare)
	same(t, "full step", val(s.Read().Step(ctx, "exec-s", full.StepID)).get(t, "Step"), full)
	got := val(s.Read().Step(ctx, "exec-s", bare.StepID)).get(t, "Step")
	same(t, "bare step", got, bare)
	if got.Result != nil || got.Error != nil || len(got.Resources) != 0 || !got.StartedAt.IsZero() || !got.CompletedAt.IsZero() {
		t.Errorf("bare step: got result %q, error %q, resources %q, started %v, completed %v; want none",
			got.Result, got.Error, got.Resources, got.StartedAt, got.CompletedAt)
	}

	_, err := s.Read().Step(ctx, "exec-s", "step-missing")
	wantNotFound(t, "Step of an unknown id", err)
	_, err = s.Read().Step(ctx, "exec-other", full.StepID)
	wantNotFound(t, "Step of another execution", err)

	// UpdateStep writes the fields that change as a step runs.
	want := *bare
	want.Status = wire.StepSucceeded
	want.Idempotency = wire.AtMostOnce
	want.Result = []byte(" {\"ok\" : true}\n")
	want.Error = []byte(`{"reason":"indeterminate"}`)
	want.ErrorReason = wire.ReasonIndeterminate
	want.StartedAt = at(4 * time.Second)
	want.CompletedAt = at(5*time.Second + time.Microsecond)
	want.DispatchID = "dispatch-9"
	want.Attempt = 4
	want.TerminalSeq = 77
	update(t, s, "exec-s", func(ctx context.Context, tx store.Tx) error { return tx.UpdateStep(ctx, &want) })
	same(t, "updated step", val(s.Read().Step(ctx, "exec-s", bare.StepID)).get(t, "Step"), &want)

	// The identity, order and arguments stay as recorded.
	changed := want
	changed.Order = 99
	changed.Kind = wire.KindLLMCall
	changed.Target = "other"
	changed.ArgsHash = "other"
	changed.Occurrence = 5
	changed.Args = []byte(`[]`)
	update(t, s, "exec-s", func(ctx context.Context, tx store.Tx) error { return tx.UpdateStep(ctx, &changed) })
	same(t, "step after an update carrying another identity", val(s.Read().Step(ctx, "exec-s", bare.StepID)).get(t, "Step"), &want)
	same(t, "the other step", val(s.Read().Step(ctx, "exec-s", full.StepID)).get(t, "Step"), full)

	err = s.Update(ctx, "exec-s", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertStep(ctx, simpleStep("exec-s", "step-full", 9, wire.StepProposed))
	})
	if err == nil {
		t.Error("inserting a step with an existing id succeeded")
	}
	same(t, "step after a refused duplicate", val(s.Read().Step(ctx, "exec-s", full.StepID)).get(t, "Step"), full)
}

// stepsFixture records steps out of order, with ids that do not sort like
// their recording order.
func stepsFixture() []*store.Step {
	return []*store.Step{
		simpleStep("exec-x", "s-f", 3, wire.StepExecuting),
		simpleStep("exec-x", "s-a", 6, wire.StepAllowed),
		simpleStep("exec-x", "s-z", 1, wire.StepSucceeded),
		simpleStep("exec-x", "s-m", 5, wire.StepFailed),
		simpleStep("exec-x", "s-b", 2, wire.StepAllowed),
		simpleStep("exec-x", "s-q", 4, wire.StepAwaitingApproval),
		simpleStep("exec-x", "s-c", 7, wire.StepProposed),
		simpleStep("exec-y", "s-y1", 1, wire.StepAllowed),
		simpleStep("exec-y", "s-y2", 2, wire.StepExecuting),
	}
}

func testStepsListing(t *testing.T, s store.Store) {
	ctx := t.Context()
	write(t, s, minimalExecution("exec-x", "agent", wire.ExecRunning), minimalExecution("exec-y", "agent", wire.ExecRunning), stepsFixture())

	steps := func(statuses []string, after int64, limit int) []string {
		t.Helper()
		return stepIDs(val(s.Read().Steps(ctx, "exec-x", statuses, after, limit)).get(t, "Steps"))
	}
	sameStrings(t, "Steps all", steps(nil, 0, 100), []string{"s-z", "s-b", "s-f", "s-q", "s-m", "s-a", "s-c"})
	sameStrings(t, "Steps empty filter", steps([]string{}, 0, 100), []string{"s-z", "s-b", "s-f", "s-q", "s-m", "s-a", "s-c"})
	sameStrings(t, "Steps after 2 limit 3", steps(nil, 2, 3), []string{"s-f", "s-q", "s-m"})
	sameStrings(t, "Steps after the last", steps(nil, 7, 100), []string{})
	sameStrings(t, "Steps one status", steps([]string{wire.StepAllowed}, 0, 100), []string{"s-b", "s-a"})
	sameStrings(t, "Steps terminal statuses", steps([]string{wire.StepSucceeded, wire.StepFailed, wire.StepDenied, wire.StepCancelled}, 0, 100), []string{"s-z", "s-m"})
	sameStrings(t, "Steps statuses after 2 limit 2", steps([]string{wire.StepAllowed, wire.StepExecuting, wire.StepProposed}, 2, 2), []string{"s-f", "s-a"})
	sameStrings(t, "Steps unmatched status", steps([]string{wire.StepDenied}, 0, 100), []string{})

	var paged []string
	var after int64
	for range 10 {
		page := val(s.Read().Steps(ctx, "exec-x", nil, after, 3)).get(t, "Steps")
		paged = append(paged, stepIDs(page)...)
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].Order
	}
	sameStrings(t, "paged Steps", paged, []string{"s-z", "s-b", "s-f", "s-q", "s-m", "s-a", "s-c"})

	got := val(s.Read().Steps(ctx, "exec-y", nil, 0, 100)).get(t, "Steps")
	sameList(t, "Steps of the other execution", got, stepsFixture()[7:])
}

func testOpenSteps(t *testing.T, s store.Store) {
	ctx := t.Context()
	write(t, s, minimalExecution("exec-x", "agent", wire.ExecRunning), minimalExecution("exec-y", "agent", wire.ExecRunning), stepsFixture())
	open := func(id string) []string {
		t.Helper()
		return stepIDs(val(s.Read().OpenSteps(ctx, id)).get(t, "OpenSteps"))
	}
	sameStrings(t, "OpenSteps", open("exec-x"), []string{"s-b", "s-f", "s-a"})
	sameStrings(t, "OpenSteps of the other execution", open("exec-y"), []string{"s-y1", "s-y2"})
	sameStrings(t, "OpenSteps of an unknown execution", open("exec-none"), []string{})

	// Steps leave and enter the open set as their status changes.
	var inTx []string
	update(t, s, "exec-x", func(ctx context.Context, tx store.Tx) error {
		for _, st := range stepsFixture() {
			switch st.StepID {
			case "s-f":
				st.Status = wire.StepSucceeded
			case "s-c":
				st.Status = wire.StepAllowed
			default:
				continue
			}
			if err := tx.UpdateStep(ctx, st); err != nil {
				return err
			}
		}
		open, err := tx.OpenSteps(ctx, "exec-x")
		inTx = stepIDs(open)
		return err
	})
	sameStrings(t, "OpenSteps inside the transaction that changed them", inTx, []string{"s-b", "s-a", "s-c"})
	sameStrings(t, "OpenSteps after status changes", open("exec-x"), []string{"s-b", "s-a", "s-c"})
	got := val(s.Read().OpenSteps(ctx, "exec-y")).get(t, "OpenSteps")
	sameList(t, "open steps come back whole", got, stepsFixture()[7:])
}

// testOccurrences: the highest occurrence recorded for an identity, and
// the counter of one dispatch for it, read together.
func testOccurrences(t *testing.T, s store.Store) {
	ctx := t.Context()
	occ := func(exec, stepID string, kind, target, hash string, n int64) *store.Step {
		st := simpleStep(exec, stepID, n, wire.StepSucceeded)
		st.Kind, st.Target, st.ArgsHash, st.Occurrence = kind, target, hash, n
		st.Order = int64(len(stepID)) * 10 * n
		return st
	}
	write(t, s, minimalExecution("exec-a", "agent", wire.ExecRunning), minimalExecution("exec-b", "agent", wire.ExecRunning),
		occ("exec-a", "a1", wire.KindToolCall, "search", "h1", 1),
		occ("exec-a", "a3", wire.KindToolCall, "search", "h1", 3),
		occ("exec-a", "a2", wire.KindToolCall, "search", "h1", 2),
		occ("exec-a", "other-hash", wire.KindToolCall, "search", "h2", 1),
		occ("exec-a", "other-kind", wire.KindLLMCall, "search", "h1", 6),
		occ("exec-b", "b9", wire.KindToolCall, "search", "h1", 9),
		counterRow{"exec-a", "d1", wire.KindToolCall, "search", "h1", 3},
		counterRow{"exec-a", "d2", wire.KindToolCall, "search", "h1", 1},
		counterRow{"exec-a", "d1", wire.KindToolCall, "fetch", "h1", 4},
	)
	cases := []struct {
		exec, dispatch, kind, target, hash string
		want                               store.Occurrences
	}{
		{"exec-a", "d1", wire.KindToolCall, "search", "h1", store.Occurrences{Consumed: 3, HasCounter: true, Highest: 3, HasHighest: true}},
		{"exec-a", "d2", wire.KindToolCall, "search", "h1", store.Occurrences{Consumed: 1, HasCounter: true, Highest: 3, HasHighest: true}},
		{"exec-a", "d3", wire.KindToolCall, "search", "h1", store.Occurrences{Highest: 3, HasHighest: true}},
		{"exec-a", "d1", wire.KindToolCall, "search", "h2", store.Occurrences{Highest: 1, HasHighest: true}},
		{"exec-a", "d1", wire.KindLLMCall, "search", "h1", store.Occurrences{Highest: 6, HasHighest: true}},
		{"exec-b", "d1", wire.KindToolCall, "search", "h1", store.Occurrences{Highest: 9, HasHighest: true}},
		{"exec-a", "d1", wire.KindToolCall, "search", "h3", store.Occurrences{}},
		{"exec-a", "d1", wire.KindToolCall, "fetch", "h1", store.Occurrences{Consumed: 4, HasCounter: true}},
		{"exec-b", "d1", wire.KindToolCall, "search", "h2", store.Occurrences{}},
		{"exec-none", "d1", wire.KindToolCall, "search", "h1", store.Occurrences{}},
	}
	for _, c := range cases {
		got, err := s.Read().Occurrences(ctx, c.exec, c.dispatch, c.kind, c.target, c.hash)
		if err != nil || got != c.want {
			t.Errorf("Occurrences(%s, %s, %s, %s, %s) = %+v, %v; want %+v", c.exec, c.dispatch, c.kind, c.target, c.hash, got, err, c.want)
		}
	}
}

func testHasIndeterminate(t *testing.T, s store.Store) {
	ctx := t.Context()
	mk := func(exec, id, hash, status, reason string) *store.Step {
		st := simpleStep(exec, id, int64(id[len(id)-1]-'0'), status)
		st.ArgsHash, st.ErrorReason = hash, reason
		if reason != "" {
			st.Error = fmt.Appendf(nil, `{"reason":%q}`, reason)
		}
		return st
	}
	write(t, s, minimalExecution("exec-a", "agent", wire.ExecRunning), minimalExecution("exec-b", "agent", wire.ExecRunning),
		mk("exec-a", "s1", "h-indet", wire.StepSucceeded, ""),
		mk("exec-a", "s2", "h-indet", wire.StepFailed, wire.ReasonIndeterminate),
		mk("exec-a", "s3", "h-timeout", wire.StepFailed, wire.ReasonTimeout),
		mk("exec-a", "s4", "h-cancelled", wire.StepCancelled, wire.ReasonIndeterminate),
		mk("exec-a", "s5", "h-denied", wire.StepDenied, wire.ReasonIndeterminate),
		mk("exec-a", "s6", "h-ok", wire.StepSucceeded, ""),
		mk("exec-b", "s7", "h-b", wire.StepFailed, wire.ReasonIndeterminate),
	)
	cases := []struct {
		exec, kind, target, hash string
		want                     bool
	}{
		{"exec-a", wire.KindToolCall, "tool", "h-indet", true},
		{"exec-a", wire.KindToolCall, "tool", "h-timeout", false},
		{"exec-a", wire.KindToolCall, "tool", "h-cancelled", false},
		{"exec-a", wire.KindToolCall, "tool", "h-denied", false},
		{"exec-a", wire.KindToolCall, "tool", "h-ok", false},
		{"exec-a", wire.KindToolCall, "tool", "h-b", false},
		{"exec-a", wire.KindLLMCall, "tool", "h-indet", false},
		{"exec-a", wire.KindToolCall, "other", "h-indet", false},
		{"exec-b", wire.KindToolCall, "tool", "h-indet", false},
		{"exec-b", wire.KindToolCall, "tool", "h-b", true},
	}
	for _, c := range cases {
		got, err := s.Read().HasIndeterminate(ctx, c.exec, c.kind, c.target, c.hash)
		if err != nil {
			t.Fatalf("HasIndeterminate: %v", err)
		}
		if got != c.want {
			t.Errorf("HasIndeterminate(%s, %s, %s, %s): got %v, want %v", c.exec, c.kind, c.target, c.hash, got, c.want)
		}
	}

	// A later failure of the identity with reason indeterminate shows at once.
	update(t, s, "exec-a", func(ctx context.Context, tx store.Tx) error {
		st := mk("exec-a", "s3", "h-timeout", wire.StepFailed, wire.ReasonIndeterminate)
		return tx.UpdateStep(ctx, st)
	})
	if got := val(s.Read().HasIndeterminate(ctx, "exec-a", wire.KindToolCall, "tool", "h-timeout")).get(t, "HasIndeterminate"); !got {
		t.Error("HasIndeterminate after the step's reason became indeterminate: got false")
	}
}
