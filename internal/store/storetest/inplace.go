package storetest

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// What a fork that reads its source in place needs of the store: marks kept
// on the execution row and with each event run, the first seq of each step,
// and the reads a fork's view makes.
var inPlaceScenarios = []scenario{
	{"MarksRoundTrip", testMarksRoundTrip},
	{"EventRunsKeepMarks", testEventRunsKeepMarks},
	{"StepReadsForForks", testStepReadsForForks},
	{"RetentionKeepsSourcesReadInPlace", testRetentionKeepsSourcesReadInPlace},
}

func testMarksRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := minimalExecution("exec-marked", "agent-a", wire.ExecRunning)
	e.Mark = &store.Mark{Kept: 3, Closed: 1, Generations: []byte(`{"ws":2}`)}
	f := minimalExecution("exec-inplace", "agent-a", wire.ExecRunning)
	f.ForkedFrom, f.ForkSeq, f.ForkInPlace, f.ForkKept, f.ForkSteps = e.ID, 7, true, 4, 1
	f.ForkExcluded = []byte(`{"seqs":[5]}`)
	legacy := minimalExecution("exec-unmarked", "agent-a", wire.ExecRunning)
	write(t, s, e, f, legacy)

	for _, read := range []func(string) (*store.Execution, error){
		func(id string) (*store.Execution, error) { return s.Read().Execution(ctx, id) },
		func(id string) (*store.Execution, error) { return s.Read().ExecutionHead(ctx, id) },
	} {
		got := val(read(e.ID)).get(t, "read marked")
		if !reflect.DeepEqual(got.Mark, e.Mark) {
			t.Errorf("mark = %+v, want %+v", got.Mark, e.Mark)
		}
		if got := val(read(legacy.ID)).get(t, "read unmarked"); got.Mark != nil {
			t.Errorf("unmarked execution reads mark %+v", got.Mark)
		}
		got = val(read(f.ID)).get(t, "read in-place fork")
		if !got.ForkInPlace || got.ForkKept != 4 || got.ForkSteps != 1 || got.Mark != nil {
			t.Errorf("in-place fork = %+v", got)
		}
	}
	if got := val(s.Read().Execution(ctx, f.ID)).get(t, "Execution"); string(got.ForkExcluded) != `{"seqs":[5]}` {
		t.Errorf("ForkExcluded = %s", got.ForkExcluded)
	}
	// UpdateExecution writes the mark, and an unmarked row stays unmarked.
	update(t, s, e.ID, func(ctx context.Context, tx store.Tx) error {
		head, err := tx.ExecutionHead(ctx, e.ID)
		if err != nil {
			return err
		}
		head.Mark = &store.Mark{Kept: 9, Closed: 4}
		return tx.UpdateExecution(ctx, head)
	})
	if got := val(s.Read().ExecutionHead(ctx, e.ID)).get(t, "ExecutionHead"); !reflect.DeepEqual(got.Mark, &store.Mark{Kept: 9, Closed: 4}) {
		t.Errorf("mark after update = %+v", got.Mark)
	}
	// A second read in one transaction sees the row as the update left it
	// (backends that keep rows in memory between operations must too).
	update(t, s, e.ID, func(ctx context.Context, tx store.Tx) error {
		head, err := tx.ExecutionHead(ctx, e.ID)
		if err != nil {
			return err
		}
		if head.Mark == nil || head.Mark.Kept != 9 {
			return fmt.Errorf("mark in the next transaction = %+v", head.Mark)
		}
		return nil
	})
}

func testEventRunsKeepMarks(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := "exec-runs"
	write(t, s, minimalExecution(id, "agent-a", wire.ExecRunning))
	// 300 marked events in one append: two runs, each keeping the mark
	// before its first event.
	first := events(id, 1, 300)
	for i, ev := range first {
		ev.Mark = &store.Mark{Kept: int64(i), Closed: int64(i / 4), Generations: []byte(fmt.Sprintf(`{"k":%d}`, i))}
	}
	// Then an append without marks, as an execution recorded before them.
	write(t, s, first, events(id, 301, 305))
	rd := s.Read()
	for _, c := range []struct {
		seq, first, last int64
		mark             *store.Mark
	}{
		{1, 1, 256, first[0].Mark},
		{256, 1, 256, first[0].Mark},
		{257, 257, 300, first[256].Mark},
		{300, 257, 300, first[256].Mark},
		{303, 301, 305, nil},
	} {
		run := val(rd.EventRun(ctx, id, c.seq)).get(t, "EventRun")
		if run.FirstSeq != c.first || run.LastSeq != c.last || !reflect.DeepEqual(run.Mark, c.mark) {
			t.Errorf("EventRun(%d) = [%d, %d] %+v, want [%d, %d] %+v", c.seq, run.FirstSeq, run.LastSeq, run.Mark, c.first, c.last, c.mark)
		}
		if n := int64(len(run.Events)); n != c.last-c.first+1 || run.Events[0].Seq != c.first || run.Events[n-1].Type == "" {
			t.Errorf("EventRun(%d) has %d events from %d", c.seq, n, run.Events[0].Seq)
		}
	}
	if _, err := rd.EventRun(ctx, id, 306); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("EventRun past the log: %v, want ErrNotFound", err)
	}
	// Events stored a row each (not one execution's, in order) are in no run.
	other := "exec-rows"
	write(t, s, minimalExecution(other, "agent-a", wire.ExecRunning))
	rows := events(other, 1, 3)
	rows[0], rows[2] = rows[2], rows[0]
	write(t, s, rows)
	if _, err := rd.EventRun(ctx, other, 2); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("EventRun of a row-per-event log: %v, want ErrNotFound", err)
	}
}

func testStepReadsForForks(t *testing.T, s store.Store) {
	ctx := t.Context()
	id := "exec-steps"
	write(t, s, minimalExecution(id, "agent-a", wire.ExecRunning))
	var steps []*store.Step
	for i := int64(1); i <= 5; i++ {
		st := fullStep(id, fmt.Sprintf("step-%d", i))
		st.Order, st.Occurrence, st.SubmittedSeq, st.TerminalSeq = i, i%2, 10*i, 10*i+3
		st.ArgsHash = map[bool]string{true: "h-even", false: "h-odd"}[i%2 == 0]
		steps = append(steps, st)
	}
	steps[4].Status, steps[4].TerminalSeq = wire.StepExecuting, 0
	write(t, s, steps)
	rd := s.Read()
	for _, want := range steps {
		got := val(rd.StepByOrder(ctx, id, want.Order)).get(t, "StepByOrder")
		if got.StepID != want.StepID || got.SubmittedSeq != want.SubmittedSeq || got.Status != want.Status ||
			got.TerminalSeq != want.TerminalSeq || got.ArgsHash != want.ArgsHash || got.Occurrence != want.Occurrence {
			t.Errorf("StepByOrder(%d) = %+v", want.Order, got)
		}
	}
	if _, err := rd.StepByOrder(ctx, id, 6); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("StepByOrder past the last: %v", err)
	}
	heads := val(rd.FinishedStepHeads(ctx, id, 100, 0, big)).get(t, "FinishedStepHeads")
	if len(heads) != 4 || heads[3].SubmittedSeq != 40 {
		t.Errorf("FinishedStepHeads: %d heads, the last submitted at %d", len(heads), heads[len(heads)-1].SubmittedSeq)
	}
	byID := val(rd.StepsByID(ctx, id, []string{"step-4", "nope", "step-2"})).get(t, "StepsByID")
	var ids []string
	for _, st := range byID {
		ids = append(ids, st.StepID)
		if st.Kind != wire.KindToolCall || st.Target == "" || st.ArgsHash == "" {
			t.Errorf("StepsByID row %+v lacks its identity", st)
		}
	}
	sameStrings(t, "StepsByID", sorted(ids), []string{"step-2", "step-4"})
	if got := val(rd.StepsByID(ctx, "exec-none", []string{"step-1"})).get(t, "StepsByID"); len(got) != 0 {
		t.Errorf("StepsByID of another execution: %d rows", len(got))
	}
	odd := val(rd.StepsByIdentity(ctx, id, wire.KindToolCall, steps[0].Target, "h-odd")).get(t, "StepsByIdentity")
	if len(odd) != 3 || odd[0].Occurrence > odd[1].Occurrence || odd[1].Occurrence > odd[2].Occurrence ||
		!slices.Equal(odd[0].Args, steps[0].Args) {
		t.Errorf("StepsByIdentity: %d steps", len(odd))
	}
}

func testRetentionKeepsSourcesReadInPlace(t *testing.T, s store.Store) {
	ctx := t.Context()
	cutoff := at(24 * time.Hour)
	old := func(id string) *store.Execution {
		e := minimalExecution(id, "agent-a", wire.ExecCompleted)
		e.UpdatedAt = cutoff.Add(-time.Hour)
		return e
	}
	src, copied := old("exec-src-inplace"), old("exec-src-copied")
	inPlace := minimalExecution("exec-f-inplace", "agent-a", wire.ExecRunning)
	inPlace.ForkedFrom, inPlace.ForkSeq, inPlace.ForkInPlace = src.ID, 3, true
	copy := minimalExecution("exec-f-copy", "agent-a", wire.ExecRunning)
	copy.ForkedFrom, copy.ForkSeq = copied.ID, 3
	write(t, s, src, copied, inPlace, copy)
	rd := s.Read()
	sameStrings(t, "RetentionCandidates", val(rd.RetentionCandidates(ctx, cutoff, 100)).get(t, "RetentionCandidates"), []string{copied.ID})
	if !val(rd.HasForksInPlace(ctx, src.ID)).get(t, "HasForksInPlace") {
		t.Error("HasForksInPlace(source) = false")
	}
	if val(rd.HasForksInPlace(ctx, copied.ID)).get(t, "HasForksInPlace") {
		t.Error("HasForksInPlace(source of a copy) = true")
	}
	// Once the fork is gone, so is what kept its source.
	update(t, s, inPlace.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, inPlace.ID) })
	sameStrings(t, "RetentionCandidates after the fork", sorted(val(rd.RetentionCandidates(ctx, cutoff, 100)).get(t, "RetentionCandidates")),
		sorted([]string{src.ID, copied.ID}))
}
