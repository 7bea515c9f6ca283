package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"hash/fnv"

	"github.com/rebuno/rebuno/internal/store"
)

// Where writers run side by side (Postgres), a write transaction locks what
// it relies on; where one writer runs at a time (SQLite), the Dialect has no
// lock clauses and these cost nothing.

// LockExecution takes the lock that serialises operations on an execution
// (docs/protocol/operations.md §2.2): a row lock on it, held until the transaction ends. With
// skipLocked it does not wait: it returns store.ErrLocked when another
// transaction holds the lock. An execution that does not exist is not an
// error here; the operation finds that out itself.
//
// The lock is taken by reading the execution's head, which the
// transaction's first ExecutionHead of it then answers without another
// statement: nobody else can change the row while the lock is held, and
// any write of this transaction forgets it (exec).
func (t *Tx) LockExecution(ctx context.Context, id string, skipLocked bool) error {
	mode := LockUpdate
	if skipLocked {
		mode = LockUpdateSkip
	}
	clause := t.D.RowLock(mode)
	if clause == "" {
		return nil
	}
	lockRead := `SELECT ` + executionCols + ` FROM executions e WHERE e.id = ?` + clause
	var e *store.Execution
	var err error
	if b, ok := t.Q.(Batcher); ok {
		// The execution's dispatch comes in the same round trip, read by a
		// statement of its own: it runs once the lock is granted, and so
		// sees what the lock's previous holder committed. A join in the
		// locking read would see the dispatch as of that statement's start.
		answers := b.QueryRows(ctx, RowQuery{Query: t.D.Rebind(lockRead), Args: []any{id}},
			RowQuery{Query: t.D.Rebind(`SELECT ` + dispatchCols + ` FROM dispatches
 WHERE id = (SELECT dispatch_id FROM executions WHERE id = ?)`), Args: []any{id}})
		e, err = scanHead(row{r: answers[0], d: t.D})
		if err == nil {
			if d, derr := scanDispatch(row{r: answers[1], d: t.D}); derr == nil {
				t.lockedDispatch = d
			}
		}
	} else {
		e, err = scanHead(t.row(ctx, lockRead, id))
	}
	switch {
	case err == nil:
		t.locked = e
		return nil
	case !errors.Is(err, sql.ErrNoRows):
		return err
	case !skipLocked:
		return nil
	}
	// Skipped: the row is locked, or there is none.
	var one int
	err = t.row(ctx, `SELECT 1 FROM executions WHERE id = ?`, id).Scan(&one)
	switch {
	case err == nil:
		return store.ErrLocked
	case errors.Is(err, sql.ErrNoRows):
		return nil
	}
	return err
}

// lockKey takes the transaction's lock on a name that has no row to lock
// yet (Dialect.KeyLock).
func (t *Tx) lockKey(ctx context.Context, parts ...string) error {
	stmt := t.D.KeyLock()
	if stmt == "" {
		return nil
	}
	h := fnv.New64a()
	for _, p := range parts {
		h.Write([]byte(p))
		h.Write([]byte{0})
	}
	return t.exec(ctx, stmt, int64(h.Sum64()))
}

// Idempotency is Queries.Idempotency after locking the key: of two creates
// with one key on two replicas, the second waits for the first to commit and
// then finds its record, instead of both missing it and making two
// executions.
func (t *Tx) Idempotency(ctx context.Context, route, scope, key string) (*store.IdempotencyRecord, error) {
	if err := t.lockKey(ctx, "idempotency", route, scope, key); err != nil {
		return nil, err
	}
	return t.Queries.Idempotency(ctx, route, scope, key)
}

// Agent is Queries.Agent keeping the agent from being deleted until the
// transaction ends: an execution created for it cannot slip past a
// concurrent deletion's check for live executions.
func (t *Tx) Agent(ctx context.Context, id string) (*store.Agent, error) {
	return t.agent(ctx, id, t.D.RowLock(LockKeyShare))
}

// AgentHasLiveExecutions locks the agent before it looks, so that it waits
// for the transactions creating executions for the agent (Agent) and sees
// what they made; a deletion that follows cannot leave live executions
// without their agent.
func (t *Tx) AgentHasLiveExecutions(ctx context.Context, agentID string) (bool, error) {
	if clause := t.D.RowLock(LockUpdate); clause != "" {
		var one int
		err := t.row(ctx, `SELECT 1 FROM agents WHERE id = ?`+clause, agentID).Scan(&one)
		if err != nil && !errors.Is(err, sql.ErrNoRows) {
			return false, err
		}
	}
	return t.Queries.AgentHasLiveExecutions(ctx, agentID)
}
