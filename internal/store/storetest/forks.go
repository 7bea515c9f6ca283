package storetest

import (
	"context"
	"fmt"
	"testing"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// forkScenarios are the scenarios of forks: copied steps that share their source's bodies.
var forkScenarios = []scenario{
	{"SharedBodies", testSharedBodies},
	{"StepCopiesInBulk", testStepCopiesInBulk},
	{"ListForks", testListForks},
	{"DeleteExecutionKeepsSharedBodies", testDeleteExecutionKeepsSharedBodies},
}

// copyOf is a fork's copy of st in execution forkID: a narrow row that names
// the step whose bodies it shares. The bodies it carries must not be stored.
func copyOf(st *store.Step, forkID, stepID string, order int64) *store.Step {
	c := *st
	c.ExecutionID, c.StepID, c.Order = forkID, stepID, order
	c.DispatchID, c.Attempt, c.StartInfo = "", 0, nil
	c.BodyExecutionID, c.BodyStepID = st.ExecutionID, st.StepID
	c.Args, c.Result, c.Error = []byte(`"not stored"`), []byte(`"not stored"`), []byte(`"not stored"`)
	return &c
}

// asRead is how a copy reads: with the bodies of the step it shares.
func asRead(c *store.Step, owner *store.Step) *store.Step {
	r := *c
	r.Args, r.Result, r.Error = owner.Args, owner.Result, owner.Error
	return &r
}

func testSharedBodies(t *testing.T, s store.Store) {
	ctx := t.Context()
	s1 := fullStep("exec-src", "src-s1")
	s2 := simpleStep("exec-src", "src-s2", 8, wire.StepSucceeded)
	s2.Result = []byte(` [ "r" , 1.0 ] `)
	write(t, s, minimalExecution("exec-src", "agent-α", wire.ExecCompleted), []*store.Step{s1, s2})
	c1, c2 := copyOf(s1, "exec-fork", "fork-c1", 1), copyOf(s2, "exec-fork", "fork-c2", 2)
	write(t, s, minimalExecution("exec-fork", "agent-α", wire.ExecRunning), []*store.Step{c1, c2})
	r := s.Read()
	same(t, "copy of s1", val(r.Step(ctx, "exec-fork", "fork-c1")).get(t, "Step"), asRead(c1, s1))
	sameList(t, "copies listed", val(r.Steps(ctx, "exec-fork", nil, 0, big)).get(t, "Steps"), []*store.Step{asRead(c1, s1), asRead(c2, s2)})
	sameList(t, "copies listed by status", val(r.Steps(ctx, "exec-fork", []string{wire.StepSucceeded}, 0, big)).get(t, "Steps"),
		[]*store.Step{asRead(c2, s2)})
	same(t, "the source's own step", val(r.Step(ctx, "exec-src", "src-s1")).get(t, "Step"), s1)
	refs := val(r.CopyRefs(ctx, "exec-fork")).get(t, "CopyRefs")
	got := []string{}
	for _, ref := range refs {
		got = append(got, ref[0]+"/"+ref[1])
	}
	sameStrings(t, "CopyRefs of the fork", sorted(got), []string{"exec-src/src-s1", "exec-src/src-s2"})
	if l := val(r.CopyRefs(ctx, "exec-src")).get(t, "CopyRefs"); len(l) != 0 {
		t.Errorf("CopyRefs of an execution without copies: %v", l)
	}
	// Two copies of one step (two forks) give one reference per fork.
	write(t, s, minimalExecution("exec-fork2", "agent-α", wire.ExecRunning), copyOf(s1, "exec-fork2", "fork2-c1", 1),
		copyOf(s1, "exec-fork2", "fork2-c1b", 2))
	refs = val(r.CopyRefs(ctx, "exec-fork2")).get(t, "CopyRefs")
	if len(refs) != 1 || refs[0] != [2]string{"exec-src", "src-s1"} {
		t.Errorf("CopyRefs of two copies of one step: %v", refs)
	}
}

// testStepCopiesInBulk writes a fork's copies with one InsertSteps call
// larger than one statement holds, and reads the heads a fork copies.
func testStepCopiesInBulk(t *testing.T, s store.Store) {
	ctx := t.Context()
	const n = 2345
	var src, copies []*store.Step
	for i := 1; i <= n; i++ {
		st := fullStep("exec-bulk", fmt.Sprintf("bulk-%04d", i))
		st.Order, st.TerminalSeq, st.Occurrence = int64(i), int64(10*i), int64(i)
		st.Status = []string{wire.StepSucceeded, wire.StepFailed, wire.StepDenied, wire.StepExecuting}[i%4]
		if st.Status == wire.StepExecuting {
			st.TerminalSeq = 0
		}
		src = append(src, st)
		copies = append(copies, copyOf(st, "exec-bulk-fork", fmt.Sprintf("copy-%04d", i), int64(i)))
	}
	write(t, s, minimalExecution("exec-bulk", "agent-α", wire.ExecRunning), src,
		minimalExecution("exec-bulk-fork", "agent-α", wire.ExecRunning))
	update(t, s, "exec-bulk-fork", func(ctx context.Context, tx store.Tx) error { return tx.InsertSteps(ctx, copies) })
	r := s.Read()
	var want []*store.Step
	for i, c := range copies {
		want = append(want, asRead(c, src[i]))
	}
	sameList(t, "copies written in bulk", val(r.Steps(ctx, "exec-bulk-fork", nil, 0, big)).get(t, "Steps"), want)

	// A mixed batch (a live step among copies) is written as given too.
	live := fullStep("exec-bulk-fork", "live-1")
	live.Order = n + 2
	mixed := []*store.Step{copyOf(src[0], "exec-bulk-fork", "copy-again", n+1), live}
	update(t, s, "exec-bulk-fork", func(ctx context.Context, tx store.Tx) error { return tx.InsertSteps(ctx, mixed) })
	sameList(t, "a mixed batch", val(r.Steps(ctx, "exec-bulk-fork", nil, n, big)).get(t, "Steps"),
		[]*store.Step{asRead(mixed[0], src[0]), live})

	// Heads: finished by the seq, in order, paged, without bodies, dispatch
	// or start details.
	const upTo = 10 * 2000
	var heads []*store.Step
	for after := int64(0); ; {
		page := val(r.FinishedStepHeads(ctx, "exec-bulk", upTo, after, 500)).get(t, "FinishedStepHeads")
		heads = append(heads, page...)
		if len(page) < 500 {
			break
		}
		after = page[len(page)-1].Order
	}
	want = nil
	for _, st := range src[:2000] {
		if st.Status == wire.StepExecuting {
			continue
		}
		h := *st
		h.Args, h.Result, h.Error, h.DispatchID, h.Attempt, h.StartInfo = nil, nil, nil, "", 0, nil
		want = append(want, &h)
	}
	sameList(t, "finished step heads", heads, want)
}

func testListForks(t *testing.T, s store.Store) {
	ctx := t.Context()
	root := minimalExecution("exec-1root", "agent-a", wire.ExecCompleted)
	mk := func(id, agent, from string) *store.Execution {
		e := minimalExecution(id, agent, wire.ExecRunning)
		e.ForkedFrom, e.ForkSeq, e.Restoration = from, 3, []byte(`{}`)
		return e
	}
	f1, f2, f3 := mk("exec-2f1", "agent-a", root.ID), mk("exec-3f2", "agent-b", root.ID), mk("exec-4f3", "agent-a", root.ID)
	g := mk("exec-5g", "agent-a", f1.ID)
	plain := minimalExecution("exec-6plain", "agent-a", wire.ExecRunning)
	write(t, s, root, f1, f2, f3, g, plain)
	r := s.Read()
	list := func(f store.ExecutionFilter) []string {
		t.Helper()
		return executionIDs(val(r.ListExecutions(ctx, f)).get(t, "ListExecutions"))
	}
	sameStrings(t, "direct forks, newest first", list(store.ExecutionFilter{ForkedFrom: root.ID, Limit: 10}), []string{f3.ID, f2.ID, f1.ID})
	sameStrings(t, "forks, first page", list(store.ExecutionFilter{ForkedFrom: root.ID, Limit: 2}), []string{f3.ID, f2.ID})
	sameStrings(t, "forks, after a cursor", list(store.ExecutionFilter{ForkedFrom: root.ID, Cursor: f2.ID, Limit: 2}), []string{f1.ID})
	sameStrings(t, "forks of one agent", list(store.ExecutionFilter{ForkedFrom: root.ID, AgentID: "agent-b", Limit: 10}), []string{f2.ID})
	sameStrings(t, "forks of a fork", list(store.ExecutionFilter{ForkedFrom: f1.ID, Limit: 10}), []string{g.ID})
	sameStrings(t, "forks of an execution without any", list(store.ExecutionFilter{ForkedFrom: plain.ID, Limit: 10}), []string{})
	sameStrings(t, "every execution", list(store.ExecutionFilter{Limit: 10}), []string{plain.ID, g.ID, f3.ID, f2.ID, f1.ID, root.ID})
	same(t, "a fork read back", val(r.Execution(ctx, f2.ID)).get(t, "Execution"), f2)
}

func testDeleteExecutionKeepsSharedBodies(t *testing.T, s store.Store) {
	ctx := t.Context()
	src := minimalExecution("exec-src", "agent-α", wire.ExecCompleted)
	s1 := fullStep("exec-src", "src-s1")
	s2 := simpleStep("exec-src", "src-s2", 8, wire.StepSucceeded)
	s2.Result = []byte(`"only the source has me"`)
	fork := minimalExecution("exec-fork", "agent-α", wire.ExecCompleted)
	fork2 := minimalExecution("exec-fork2", "agent-α", wire.ExecRunning)
	c1, c2 := copyOf(s1, fork.ID, "fork-c1", 1), copyOf(s1, fork2.ID, "fork2-c1", 1)
	write(t, s, src, events(src.ID, 1, 5), []*store.Step{s1, s2}, fork, events(fork.ID, 1, 3), c1, fork2, c2)
	insertAll(t, s, []*store.Resource{{ExecutionID: src.ID, Key: "w", DriverID: "d", RegisteredSeq: 2}}, insertResource)
	insertAll(t, s, []*store.Checkpoint{{ExecutionID: src.ID, Key: "w", CoveredSeq: 3, CheckpointRef: "B0"}}, insertCheckpoint)
	r := s.Read()

	// Deleting the source keeps the body its forks share, and nothing else.
	update(t, s, src.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, src.ID) })
	_, err := r.Execution(ctx, src.ID)
	wantNotFound(t, "deleted source", err)
	_, err = r.Step(ctx, src.ID, s2.StepID)
	wantNotFound(t, "the source's unshared step", err)
	if evs := val(r.Events(ctx, src.ID, 0, big)).get(t, "Events"); len(evs) != 0 {
		t.Errorf("events of the deleted source: %d", len(evs))
	}
	if l := val(r.Resources(ctx, src.ID)).get(t, "Resources"); len(l) != 0 {
		t.Errorf("resources of the deleted source: %d", len(l))
	}
	if l := val(r.Checkpoints(ctx, src.ID)).get(t, "Checkpoints"); len(l) != 0 {
		t.Errorf("checkpoints of the deleted source: %d", len(l))
	}
	same(t, "copy after its source was deleted", val(r.Step(ctx, fork.ID, c1.StepID)).get(t, "Step"), asRead(c1, s1))
	same(t, "another fork's copy", val(r.Step(ctx, fork2.ID, c2.StepID)).get(t, "Step"), asRead(c2, s1))
	sameList(t, "the fork's events", val(r.Events(ctx, fork.ID, 0, big)).get(t, "Events"), events(fork.ID, 1, 3))

	// Deleting one fork keeps the body the other still shares.
	update(t, s, fork.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, fork.ID) })
	_, err = r.Step(ctx, fork.ID, c1.StepID)
	wantNotFound(t, "the deleted fork's copy", err)
	same(t, "the last copy", val(r.Step(ctx, fork2.ID, c2.StepID)).get(t, "Step"), asRead(c2, s1))

	// Deleting the last copy drops the kept body: nothing leaks.
	update(t, s, fork2.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, fork2.ID) })
	_, err = r.Step(ctx, src.ID, s1.StepID)
	wantNotFound(t, "the shared body after its last copy was deleted", err)
	if steps := val(r.Steps(ctx, src.ID, nil, 0, big)).get(t, "Steps"); len(steps) != 0 {
		t.Errorf("steps of the source after every copy was deleted: %d", len(steps))
	}

	// A fork deleted before its source leaves the source's steps alone.
	src2 := minimalExecution("exec-src2", "agent-α", wire.ExecCompleted)
	t1 := simpleStep(src2.ID, "src2-s1", 1, wire.StepSucceeded)
	t1.Result = []byte(`{"k" : 1}`)
	fork3 := minimalExecution("exec-fork3", "agent-α", wire.ExecCompleted)
	c3 := copyOf(t1, fork3.ID, "fork3-c1", 1)
	write(t, s, src2, t1, fork3, c3)
	update(t, s, fork3.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, fork3.ID) })
	same(t, "the source's step after its fork was deleted", val(r.Step(ctx, src2.ID, t1.StepID)).get(t, "Step"), t1)
}
