package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlstore"
	"github.com/rebuno/rebuno/internal/wire"
)

// TestRowCache drives the writes the writer's row cache follows, drops or
// cannot see, and after each compares what a transaction reads through the
// cache with the row as SQL returns it, and with what the writes left.
func TestRowCache(t *testing.T) {
	path := filepath.Join(t.TempDir(), "rebuno.db")
	s := openAt(t, path, nil)
	ctx := t.Context()
	const id, did, other = "exec-cached", "disp-cached", "disp-newer"
	update := func(fn func(tx *sqlstore.Tx) error) error {
		return s.Update(ctx, id, func(ctx context.Context, tx store.Tx) error { return fn(tx.(*sqlstore.Tx)) })
	}
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	// change updates the execution as the kernel does: its head read, f
	// applied, the row written.
	change := func(tx *sqlstore.Tx, f func(e *store.Execution)) error {
		e, err := tx.ExecutionHead(ctx, id)
		if err != nil {
			return err
		}
		f(e)
		return tx.UpdateExecution(ctx, e)
	}
	// read returns the execution and dispatch as a transaction reads them,
	// after checking that they equal SQL's rows; hit says whether the cache
	// held the execution when the transaction began.
	read := func(step string) (e *store.Execution, d *store.Dispatch, hit bool) {
		t.Helper()
		must(update(func(tx *sqlstore.Tx) error {
			hit = s.rows.Holds(id)
			var err error
			if e, err = tx.ExecutionHead(ctx, id); err != nil {
				return err
			}
			if d, err = tx.Dispatch(ctx, did); err != nil {
				return err
			}
			fromSQL, err := tx.Queries.ExecutionHead(ctx, id)
			if err != nil {
				return err
			}
			dispatchSQL, err := tx.Queries.Dispatch(ctx, did)
			if err != nil {
				return err
			}
			if !reflect.DeepEqual(e, fromSQL) {
				t.Errorf("%s: execution read\n %+v\nSQL has\n %+v", step, e, fromSQL)
			}
			if !reflect.DeepEqual(d, dispatchSQL) {
				t.Errorf("%s: dispatch read\n %+v\nSQL has\n %+v", step, d, dispatchSQL)
			}
			return nil
		}))
		return e, d, hit
	}

	must(update(func(tx *sqlstore.Tx) error {
		if err := tx.InsertExecution(ctx, execRow(id)); err != nil {
			return err
		}
		return tx.InsertDispatch(ctx, &store.Dispatch{ID: did, ExecutionID: id, Status: wire.DispatchInFlight, Attempt: 1,
			MaxAttempts: 3, LeaseTimeout: 30, CreatedAt: time.Now(), UpdatedAt: time.Now()})
	}))
	read("after the inserts")

	// An update as the kernel makes one: times in nanoseconds and a local
	// zone, which the row keeps in microseconds, and a field UpdateExecution
	// does not write.
	must(update(func(tx *sqlstore.Tx) error {
		return change(tx, func(e *store.Execution) {
			e.Status, e.FailureReason = wire.ExecBlocked, "waiting"
			e.UpdatedAt = time.Date(2026, 12, 3, 9, 0, 0, 123456789, time.FixedZone("X", 3600))
			e.ResourceKeys, e.Writing = []string{"b", "a"}, []string{"step-1"}
			e.DispatchID, e.LastSeq, e.StepOrder, e.StepCount, e.ByteCount = did, 7, 3, 2, 99
			e.AgentVersion = "not written by UpdateExecution"
		})
	}))
	e, _, hit := read("after an update")
	if !hit || e.Status != wire.ExecBlocked || e.LastSeq != 7 || e.AgentVersion != "" {
		t.Errorf("after an update: hit %v, status %q, last seq %d, agent version %q", hit, e.Status, e.LastSeq, e.AgentVersion)
	}

	// A transaction that fails after writing leaves nothing behind. (Its
	// writes keep the execution live: a finished one leaves the cache
	// anyway, which would hide a cache that kept undone writes.)
	err := update(func(tx *sqlstore.Tx) error {
		if err := change(tx, func(e *store.Execution) { e.Status, e.LastSeq = wire.ExecRunning, 8 }); err != nil {
			return err
		}
		return errors.New("deliberate")
	})
	if err == nil {
		t.Fatal("the failing transaction succeeded")
	}
	if e, _, _ := read("after a failed transaction"); e.Status != wire.ExecBlocked || e.LastSeq != 7 {
		t.Errorf("after a failed transaction: status %q, last seq %d; want blocked, 7", e.Status, e.LastSeq)
	}

	// In one group commit: a unit that commits, one that fails, and one that
	// reads after them sees the first's write only.
	release := holdWriter(t, s)
	results := make(chan error, 3)
	var seen *store.Execution
	go func() {
		results <- update(func(tx *sqlstore.Tx) error {
			return change(tx, func(e *store.Execution) { e.Status, e.LastSeq = wire.ExecRunning, 9 })
		})
	}()
	waitQueued(t, s, 1)
	go func() {
		results <- update(func(tx *sqlstore.Tx) error {
			if err := change(tx, func(e *store.Execution) { e.Status, e.LastSeq = wire.ExecBlocked, 10 }); err != nil {
				return err
			}
			return errors.New("deliberate")
		})
	}()
	waitQueued(t, s, 2)
	go func() {
		results <- update(func(tx *sqlstore.Tx) error {
			var err error
			seen, err = tx.ExecutionHead(ctx, id)
			return err
		})
	}()
	waitQueued(t, s, 3)
	must(release())
	failed := 0
	for range 3 {
		if <-results != nil {
			failed++
		}
	}
	if failed != 1 || seen == nil || seen.Status != wire.ExecRunning || seen.LastSeq != 9 {
		t.Errorf("in one batch: %d failed, the last unit read %+v; want one failure and status running at seq 9", failed, seen)
	}
	read("after a batch with a failed unit")

	// Retiring the cached dispatch, and updating it.
	must(update(func(tx *sqlstore.Tx) error { return tx.RetireDispatches(ctx, id, other, time.Now()) }))
	if _, d, _ := read("after retiring"); d.Status != wire.DispatchRetired {
		t.Errorf("after retiring: dispatch status %q", d.Status)
	}
	must(update(func(tx *sqlstore.Tx) error {
		d, err := tx.Dispatch(ctx, did)
		if err != nil {
			return err
		}
		d.Attempt, d.LeaseExpiresAt = 2, time.Now()
		return tx.UpdateDispatch(ctx, d)
	}))
	if _, d, _ := read("after a dispatch update"); d.Attempt != 2 {
		t.Errorf("after a dispatch update: attempt %d", d.Attempt)
	}

	// Another connection writes the row: the next transaction sees it.
	if e, _, hit := read("before a foreign write"); !hit || e.FailureReason != "waiting" {
		t.Fatalf("before a foreign write: hit %v, failure reason %q", hit, e.FailureReason)
	}
	foreign, err := sql.Open("sqlite", "file:"+path+"?_pragma=busy_timeout(5000)")
	must(err)
	defer foreign.Close()
	_, err = foreign.Exec(`UPDATE executions SET failure_reason = 'written elsewhere' WHERE id = ?`, id)
	must(err)
	if e, _, _ := read("after a foreign write"); e.FailureReason != "written elsewhere" {
		t.Errorf("after a foreign write: failure reason %q", e.FailureReason)
	}

	// A finished execution leaves the cache, and a read does not bring it
	// back: its row is rarely written again.
	must(update(func(tx *sqlstore.Tx) error {
		return change(tx, func(e *store.Execution) { e.Status = wire.ExecCompleted })
	}))
	if e, _, hit := read("after finishing"); hit || e.Status != wire.ExecCompleted || s.rows.Holds(id) {
		t.Errorf("after finishing: cached %v (still %v after a read), status %q", hit, s.rows.Holds(id), e.Status)
	}

	// Statements the cache does not follow clear it.
	must(update(func(tx *sqlstore.Tx) error { return tx.DeleteExecution(ctx, id) }))
	must(update(func(tx *sqlstore.Tx) error {
		if _, err := tx.ExecutionHead(ctx, id); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("execution after its deletion: %v", err)
		}
		if _, err := tx.Dispatch(ctx, did); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("dispatch after its execution's deletion: %v", err)
		}
		return nil
	}))
}
