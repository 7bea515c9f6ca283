package storetest

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// transactionScenarios are the scenarios of transactions: atomicity, callbacks, concurrency and isolation.
var transactionScenarios = []scenario{
	{"RollbackOnError", testRollbackOnError},
	{"RollbackOnPanic", testRollbackOnPanic},
	{"RollbackOnFailedStatement", testRollbackOnFailedStatement},
	{"AfterCommit", testAfterCommit},
	{"CancelledContext", testCancelledContext},
	{"ConcurrentUpdates", testConcurrentUpdates},
	{"SerialisedPerExecution", testSerialisedPerExecution},
	{"ReadAfterUpdate", testReadAfterUpdate},
	{"ReadDuringUpdate", testReadDuringUpdate},
	{"Ping", testPing},
	{"TryUpdate", testTryUpdate},
}

func testRollbackOnError(t *testing.T, s store.Store) {
	n, p, w := rollbackWorld(t, s)
	before := dump(t, s.Read(), w)
	var wrong []string
	var wrote bool
	err := s.Update(t.Context(), p.execution.ID, func(ctx context.Context, tx store.Tx) error {
		var err error
		if wrong, err = writeEverywhere(ctx, tx, n, p); err != nil {
			return err
		}
		wrote = true
		return fmt.Errorf("wrapped: %w", errDeliberate)
	})
	if !wrote {
		t.Fatalf("the transaction failed before returning its own error: %v", err)
	}
	if !errors.Is(err, errDeliberate) {
		t.Fatalf("Update returned %v, want the function's error", err)
	}
	for _, wr := range wrong {
		t.Errorf("read inside the transaction: %s", wr)
	}
	sameDump(t, "after a failed transaction", dump(t, s.Read(), w), before)

	// The store goes on working, and the same writes commit when nothing fails.
	update(t, s, p.execution.ID, func(ctx context.Context, tx store.Tx) error {
		_, err := writeEverywhere(ctx, tx, n, p)
		return err
	})
	after := dump(t, s.Read(), w)
	if after == before {
		t.Error("the committed writes changed nothing the dump shows")
	}
	n.checkPresent(t, s.Read())
}

func testRollbackOnPanic(t *testing.T, s store.Store) {
	n, p, w := rollbackWorld(t, s)
	before := dump(t, s.Read(), w)
	var wrote bool
	err := s.Update(t.Context(), p.execution.ID, func(ctx context.Context, tx store.Tx) error {
		if _, err := writeEverywhere(ctx, tx, n, p); err != nil {
			return err
		}
		wrote = true
		panic(panicMessage)
	})
	if !wrote {
		t.Fatalf("the transaction failed before panicking: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), panicMessage) {
		t.Fatalf("Update after a panic returned %v, want an error naming the panic", err)
	}
	sameDump(t, "after a panicking transaction", dump(t, s.Read(), w), before)

	// A panic with an error value is reported too, and the store still works.
	err = s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertExecution(ctx, minimalExecution("exec-after-panic", "a", wire.ExecPending)); err != nil {
			return err
		}
		panic(errDeliberate)
	})
	if err == nil {
		t.Fatal("Update after a panic with an error value returned nil")
	}
	_, err = s.Read().Execution(t.Context(), "exec-after-panic")
	wantNotFound(t, "execution written before a panic", err)
	write(t, s, minimalExecution("exec-after-panic", "a", wire.ExecPending))
	val(s.Read().Execution(t.Context(), "exec-after-panic")).get(t, "Execution")
}

// testRollbackOnFailedStatement fails a transaction with the store's own
// error after earlier statements succeeded.
func testRollbackOnFailedStatement(t *testing.T, s store.Store) {
	ctx := t.Context()
	existing := minimalExecution("exec-existing", "agent", wire.ExecRunning)
	write(t, s, existing)
	n := newGraph("exec-new")
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := writeRows(ctx, tx, n.rows()...); err != nil {
			return err
		}
		return tx.InsertExecution(ctx, fullExecution("exec-existing"))
	})
	if err == nil {
		t.Fatal("a transaction inserting a duplicate execution succeeded")
	}
	n.checkAbsent(t, s.Read())
	same(t, "existing execution", val(s.Read().Execution(ctx, existing.ID)).get(t, "Execution"), existing)
	write(t, s, n.rows()...)
	n.checkPresent(t, s.Read())
}

func testAfterCommit(t *testing.T, s store.Store) {
	ctx := t.Context()
	type seen struct {
		order   []int
		visible bool
		err     error
	}
	var got seen
	done := make(chan struct{})
	e := minimalExecution("exec-ac", "agent", wire.ExecPending)
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(func() {
			got.order = append(got.order, 1)
			// Runs once the write is committed: another reader sees it.
			_, got.err = s.Read().Execution(context.Background(), e.ID)
			got.visible = got.err == nil
		})
		if err := tx.InsertExecution(ctx, e); err != nil {
			return err
		}
		tx.AfterCommit(func() { got.order = append(got.order, 2) })
		tx.AfterCommit(func() { got.order = append(got.order, 3); close(done) })
		return nil
	})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterCommit callbacks did not run")
	}
	if !slices.Equal(got.order, []int{1, 2, 3}) {
		t.Errorf("AfterCommit callbacks ran as %v, want [1 2 3] once each", got.order)
	}
	if !got.visible {
		t.Errorf("AfterCommit callback could not read the committed row: %v", got.err)
	}

	// Callbacks of transactions that roll back never run.
	var mu sync.Mutex
	var ran []string
	mark := func(name string) func() {
		return func() {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, name)
		}
	}
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(mark("failed"))
		return errDeliberate
	})
	if !errors.Is(err, errDeliberate) {
		t.Fatalf("Update: got %v, want the function's error", err)
	}
	err = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(mark("panicked"))
		panic(panicMessage)
	})
	if err == nil {
		t.Fatal("Update of a panicking function returned nil")
	}
	err = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(mark("duplicate"))
		return tx.InsertExecution(ctx, minimalExecution("exec-ac", "agent", wire.ExecPending))
	})
	if err == nil {
		t.Fatal("Update inserting a duplicate execution returned nil")
	}
	fence := make(chan struct{})
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(mark("committed"))
		tx.AfterCommit(func() { close(fence) })
		return nil
	})
	select {
	case <-fence:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterCommit callback of a committed transaction did not run")
	}
	mu.Lock()
	defer mu.Unlock()
	sameStrings(t, "AfterCommit callbacks that ran", ran, []string{"committed"})
}

func testCancelledContext(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertExecution(ctx, minimalExecution("exec-cancelled", "agent", wire.ExecPending))
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Update with a cancelled context: got %v, want context.Canceled", err)
	}
	_, err = s.Read().Execution(t.Context(), "exec-cancelled")
	wantNotFound(t, "execution written under a cancelled context", err)
}

// testConcurrentUpdates runs many transactions at once, some failing in each
// of the three ways, and checks that each one is all or nothing.
func testConcurrentUpdates(t *testing.T, s store.Store) {
	const n = 200
	ctx := t.Context()
	pre := minimalExecution("exec-pre", "agent", wire.ExecRunning)
	write(t, s, pre)

	type outcome int
	const (
		succeeds outcome = iota
		returnsError
		panics
		failsInStore
	)
	plan := func(i int) outcome {
		switch {
		case i%25 == 7:
			return panics
		case i%10 == 5:
			return failsInStore
		case i%4 == 3:
			return returnsError
		}
		return succeeds
	}
	graphs := make([]graph, n)
	errs := make([]error, n)
	visible := make([]chan bool, n)
	start := make(chan struct{})
	finished := make(chan int, n)
	for i := range n {
		graphs[i] = newGraph(fmt.Sprintf("exec-c%03d", i))
		visible[i] = make(chan bool, 1)
		go func() {
			<-start
			g := graphs[i]
			errs[i] = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
				if err := writeRows(ctx, tx, g.rows()...); err != nil {
					return err
				}
				tx.AfterCommit(func() {
					_, err := s.Read().Execution(context.Background(), g.execution.ID)
					visible[i] <- err == nil
				})
				switch plan(i) {
				case returnsError:
					return errDeliberate
				case panics:
					panic(panicMessage)
				case failsInStore:
					return tx.InsertExecution(ctx, minimalExecution(pre.ID, "agent", wire.ExecPending))
				}
				return nil
			})
			finished <- i
		}()
	}
	close(start)
	for range n {
		select {
		case <-finished:
		case <-time.After(60 * time.Second):
			t.Fatal("concurrent updates did not finish")
		}
	}

	wantListed := []string{pre.ID}
	counts := map[outcome]int{}
	for i := range n {
		g := graphs[i]
		counts[plan(i)]++
		switch plan(i) {
		case succeeds:
			if errs[i] != nil {
				t.Errorf("update %d: %v", i, errs[i])
				continue
			}
			g.checkPresent(t, s.Read())
			select {
			case ok := <-visible[i]:
				if !ok {
					t.Errorf("update %d: AfterCommit callback could not read the committed execution", i)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("update %d: AfterCommit callback did not run", i)
			}
			wantListed = append(wantListed, g.execution.ID)
		default:
			if errs[i] == nil {
				t.Errorf("update %d (outcome %d): returned nil", i, plan(i))
			}
			if plan(i) == returnsError && !errors.Is(errs[i], errDeliberate) {
				t.Errorf("update %d: got %v, want the function's error", i, errs[i])
			}
			g.checkAbsent(t, s.Read())
			select {
			case <-visible[i]:
				t.Errorf("update %d: AfterCommit callback of a rolled back transaction ran", i)
			default:
			}
		}
	}
	if counts[succeeds] == 0 || counts[returnsError] == 0 || counts[panics] == 0 || counts[failsInStore] == 0 {
		t.Fatalf("the plan does not cover every outcome: %v", counts)
	}
	list := val(s.Read().ListExecutions(ctx, store.ExecutionFilter{Limit: 10 * n})).get(t, "ListExecutions")
	sameStrings(t, "executions after concurrent updates", sorted(executionIDs(list)), sorted(wantListed))
	same(t, "execution that failing transactions tried to duplicate", val(s.Read().Execution(ctx, pre.ID)).get(t, "Execution"), pre)
}

// testSerialisedPerExecution runs read-modify-write transactions on one
// execution at once: none may see a stale row (docs/protocol/operations.md §2.2).
func testSerialisedPerExecution(t *testing.T, s store.Store) {
	const n = 100
	ctx := t.Context()
	const id = "exec-serial"
	write(t, s, minimalExecution(id, "agent", wire.ExecRunning))
	errs := make(chan error, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			errs <- s.Update(ctx, id, func(ctx context.Context, tx store.Tx) error {
				e, err := tx.Execution(ctx, id)
				if err != nil {
					return err
				}
				e.LastSeq++
				e.StepOrder++
				st := simpleStep(id, fmt.Sprintf("step-%03d", e.StepOrder), e.StepOrder, wire.StepSucceeded)
				if err := tx.InsertStep(ctx, st); err != nil {
					return err
				}
				if err := tx.AppendEvents(ctx, events(id, e.LastSeq, e.LastSeq)); err != nil {
					return err
				}
				return tx.UpdateExecution(ctx, e)
			})
		}()
	}
	close(start)
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("Update: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("updates did not finish")
		}
	}
	e := val(s.Read().Execution(ctx, id)).get(t, "Execution")
	if e.LastSeq != n || e.StepOrder != n {
		t.Errorf("after %d increments: last_seq %d, step_order %d", n, e.LastSeq, e.StepOrder)
	}
	evs := val(s.Read().Events(ctx, id, 0, big)).get(t, "Events")
	if len(evs) != n || evs[0].Seq != 1 || evs[n-1].Seq != n {
		t.Errorf("events: got %d (%v...), want seqs 1..%d", len(evs), eventSeqs(evs[:min(len(evs), 5)]), n)
	}
	steps := val(s.Read().Steps(ctx, id, nil, 0, big)).get(t, "Steps")
	if len(steps) != n {
		t.Errorf("steps: got %d, want %d", len(steps), n)
	}
}

// testReadAfterUpdate checks that a write is visible to Read as soon as
// Update returns, from several writers at once.
func testReadAfterUpdate(t *testing.T, s store.Store) {
	const writers, each = 8, 25
	ctx := t.Context()
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			errs <- func() error {
				for i := range each {
					id := fmt.Sprintf("exec-w%d-%02d", w, i)
					err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
						return writeRows(ctx, tx, minimalExecution(id, "agent", wire.ExecRunning), events(id, 1, 2))
					})
					if err != nil {
						return fmt.Errorf("Update %s: %w", id, err)
					}
					if _, err := s.Read().Execution(ctx, id); err != nil {
						return fmt.Errorf("Read of %s right after its Update: %w", id, err)
					}
					evs, err := s.Read().Events(ctx, id, 0, 10)
					if err != nil || len(evs) != 2 {
						return fmt.Errorf("events of %s right after its Update: %d, %v", id, len(evs), err)
					}
					// An update of the row is visible as well.
					err = s.Update(ctx, id, func(ctx context.Context, tx store.Tx) error {
						e, err := tx.Execution(ctx, id)
						if err != nil {
							return err
						}
						e.Status = wire.ExecCompleted
						return tx.UpdateExecution(ctx, e)
					})
					if err != nil {
						return fmt.Errorf("Update %s: %w", id, err)
					}
					if e, err := s.Read().Execution(ctx, id); err != nil || e.Status != wire.ExecCompleted {
						return fmt.Errorf("Read of %s right after its status change: %v, %v", id, e, err)
					}
				}
				return nil
			}()
		}()
	}
	for range writers {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("writers did not finish")
		}
	}
}

// testReadDuringUpdate reads while a write transaction is open: the read is
// not blocked by it and does not see what it has not committed.
func testReadDuringUpdate(t *testing.T, s store.Store) {
	ctx := t.Context()
	orig := fullExecution("exec-open")
	write(t, s, orig)
	entered, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Update(ctx, orig.ID, func(ctx context.Context, tx store.Tx) error {
			e, err := tx.Execution(ctx, orig.ID)
			if err != nil {
				return err
			}
			e.Status, e.LastSeq = wire.ExecCompleted, 10
			if err := tx.UpdateExecution(ctx, e); err != nil {
				return err
			}
			if err := writeRows(ctx, tx, minimalExecution("exec-uncommitted", "agent", wire.ExecPending), events(orig.ID, 10, 10)); err != nil {
				return err
			}
			close(entered)
			<-proceed
			return nil
		})
	}()
	released := false
	release := func() {
		if !released {
			released = true
			close(proceed)
		}
	}
	defer release()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the write transaction ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the write transaction did not start")
	}

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := s.Read().Execution(rctx, orig.ID)
	if err != nil {
		t.Fatalf("Read during an open write transaction: %v", err)
	}
	same(t, "execution read during an uncommitted change", got, orig)
	_, err = s.Read().Execution(rctx, "exec-uncommitted")
	wantNotFound(t, "execution inserted by an uncommitted transaction", err)
	if evs := val(s.Read().Events(rctx, orig.ID, 9, 10)).get(t, "Events"); len(evs) != 0 {
		t.Errorf("events of an uncommitted transaction: got %d, want none", len(evs))
	}

	release()
	if err := <-done; err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got := val(s.Read().Execution(ctx, orig.ID)).get(t, "Execution"); got.Status != wire.ExecCompleted || got.LastSeq != 10 {
		t.Errorf("after commit: status %s, last_seq %d; want completed, 10", got.Status, got.LastSeq)
	}
	val(s.Read().Execution(ctx, "exec-uncommitted")).get(t, "Execution after commit")
}

func testPing(t *testing.T, s store.Store) {
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// A TryUpdate that finds its execution free commits exactly like Update,
// and rolls back like it too.
func testTryUpdate(t *testing.T, s store.Store) {
	ctx := t.Context()
	write(t, s, minimalExecution("exec-try", "agent", wire.ExecRunning))
	err := s.TryUpdate(ctx, "exec-try", func(ctx context.Context, tx store.Tx) error {
		e, err := tx.ExecutionHead(ctx, "exec-try")
		if err != nil {
			return err
		}
		e.Status = wire.ExecBlocked
		return tx.UpdateExecution(ctx, e)
	})
	if err != nil {
		t.Fatalf("TryUpdate: %v", err)
	}
	if got := val(s.Read().Execution(ctx, "exec-try")).get(t, "Execution"); got.Status != wire.ExecBlocked {
		t.Fatalf("after TryUpdate: status %s, want blocked", got.Status)
	}
	boom := errors.New("boom")
	err = s.TryUpdate(ctx, "exec-try", func(ctx context.Context, tx store.Tx) error {
		e, err := tx.ExecutionHead(ctx, "exec-try")
		if err != nil {
			return err
		}
		e.Status = wire.ExecRunning
		if err := tx.UpdateExecution(ctx, e); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("TryUpdate returning an error: got %v, want it back", err)
	}
	if got := val(s.Read().Execution(ctx, "exec-try")).get(t, "Execution"); got.Status != wire.ExecBlocked {
		t.Fatalf("after a failed TryUpdate: status %s, want blocked (rolled back)", got.Status)
	}
}
