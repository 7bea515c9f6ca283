package sqlstore

import (
	"context"
	"database/sql"
	"strings"

	"github.com/rebuno/rebuno/internal/store"
)

// executionCols are the columns of the execution row; the user values
// (input, output, state) live in execution_values, so that the row every
// operation rewrites stays small whatever their size.
const executionCols = `e.id, e.agent_id, e.agent_version, e.status, e.failure_reason,
 e.created_at, e.updated_at, e.deadline_at, e.parent_execution_id, e.idempotency_key, e.on_behalf_of,
 e.forked_from, e.fork_seq, e.restoration, e.resource_keys, e.dispatch_id, e.last_seq, e.step_order, e.step_count, e.byte_count,
 e.writing, e.mark_kept, e.mark_closed, e.mark_generations, e.fork_in_place, e.fork_kept, e.fork_steps`

const executionValues = `, v.input, v.output, v.state, v.fork_excluded FROM executions e JOIN execution_values v ON v.execution_id = e.id`

// scanExecutionRow scans executionCols, then input, output and state when
// withValues (the query joined executionValues).
func scanExecutionRow(s Scanner, withValues bool) (*store.Execution, error) {
	var e store.Execution
	var created, updated, deadline int64
	var keys, writing string
	var kept, closed sql.NullInt64
	var generations []byte
	var inPlace int64
	dest := []any{&e.ID, &e.AgentID, &e.AgentVersion, &e.Status, &e.FailureReason,
		&created, &updated, &deadline, &e.ParentID, &e.IdempotencyKey, &e.OnBehalfOf,
		&e.ForkedFrom, &e.ForkSeq, &e.Restoration, &keys, &e.DispatchID, &e.LastSeq, &e.StepOrder, &e.StepCount, &e.ByteCount,
		&writing, &kept, &closed, &generations, &inPlace, &e.ForkKept, &e.ForkSteps}
	if withValues {
		dest = append(dest, &e.Input, &e.Output, &e.State, &e.ForkExcluded)
	}
	if err := s.Scan(dest...); err != nil {
		return nil, err
	}
	e.Mark = markOf(kept, closed, generations)
	e.ForkInPlace = inPlace == 1
	e.CreatedAt, e.UpdatedAt, e.DeadlineAt = fromTS(created), fromTS(updated), fromTS(deadline)
	var err error
	if e.ResourceKeys, err = decodeList(keys); err != nil {
		return nil, err
	}
	if e.Writing, err = decodeList(writing); err != nil {
		return nil, err
	}
	return &e, nil
}

func scanExecution(s Scanner) (*store.Execution, error) { return scanExecutionRow(s, true) }

func scanHead(s Scanner) (*store.Execution, error) { return scanExecutionRow(s, false) }

// Execution implements store.Reader.
func (q *Queries) Execution(ctx context.Context, id string) (*store.Execution, error) {
	e, err := scanExecution(q.row(ctx, `SELECT `+executionCols+executionValues+` WHERE e.id = ?`, id))
	return e, notFound(err)
}

// ExecutionHead implements store.Reader.
func (q *Queries) ExecutionHead(ctx context.Context, id string) (*store.Execution, error) {
	e, err := scanHead(q.row(ctx, `SELECT `+executionCols+` FROM executions e WHERE e.id = ?`, id))
	return e, notFound(err)
}

func (q *Queries) ListExecutions(ctx context.Context, f store.ExecutionFilter) ([]*store.Execution, error) {
	var where []string
	var args []any
	if f.AgentID != "" {
		where = append(where, "e.agent_id = ?")
		args = append(args, f.AgentID)
	}
	if f.ForkedFrom != "" {
		where = append(where, "e.forked_from = ?")
		args = append(args, f.ForkedFrom)
	}
	if f.Status != "" {
		where = append(where, "e.status = ?")
		args = append(args, f.Status)
	}
	if f.Cursor != "" {
		where = append(where, "e.id < ?")
		args = append(args, f.Cursor)
	}
	query := `SELECT ` + executionCols + executionValues
	if len(where) > 0 {
		query += " WHERE " + strings.Join(where, " AND ")
	}
	query += " ORDER BY e.id DESC LIMIT ?"
	args = append(args, f.Limit)
	return list(ctx, q, scanExecution, query, args...)
}

func (t *Tx) InsertExecution(ctx context.Context, e *store.Execution) error {
	if t.cache != nil {
		delete(t.cache.executions, e.ID) // read back when next needed
	}
	err := t.write(ctx, `INSERT INTO executions (id, agent_id, agent_version, status, failure_reason,
 created_at, updated_at, deadline_at, parent_execution_id, idempotency_key, on_behalf_of,
 forked_from, fork_seq, restoration, resource_keys, dispatch_id, last_seq, step_order, step_count, byte_count, writing,
 mark_kept, mark_closed, mark_generations, fork_in_place, fork_kept, fork_steps)
 VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		e.ID, e.AgentID, e.AgentVersion, e.Status, e.FailureReason,
		ts(e.CreatedAt), ts(e.UpdatedAt), ts(e.DeadlineAt), e.ParentID, e.IdempotencyKey, e.OnBehalfOf,
		e.ForkedFrom, e.ForkSeq, e.Restoration, encodeList(e.ResourceKeys), e.DispatchID, e.LastSeq, e.StepOrder, e.StepCount, e.ByteCount,
		encodeList(e.Writing), markKept(e.Mark), markClosed(e.Mark), markGenerations(e.Mark), boolInt(e.ForkInPlace), e.ForkKept, e.ForkSteps)
	if err != nil {
		return err
	}
	t.statusOf, t.status = e.ID, e.Status
	return t.exec(ctx, `INSERT INTO execution_values (execution_id, input, output, state, fork_excluded) VALUES (?,?,?,?,?)`,
		e.ID, e.Input, e.Output, e.State, e.ForkExcluded)
}

func (t *Tx) UpdateExecution(ctx context.Context, e *store.Execution) error {
	const rest = ` failure_reason = ?, updated_at = ?, resource_keys = ?, dispatch_id = ?,
 last_seq = ?, step_order = ?, step_count = ?, byte_count = ?, writing = ?,
 mark_kept = ?, mark_closed = ?, mark_generations = ? WHERE id = ?`
	keys, writing := encodeList(e.ResourceKeys), encodeList(e.Writing)
	args := []any{e.FailureReason, ts(e.UpdatedAt), keys, e.DispatchID,
		e.LastSeq, e.StepOrder, e.StepCount, e.ByteCount, writing,
		markKept(e.Mark), markClosed(e.Mark), markGenerations(e.Mark), e.ID}
	var err error
	if t.statusOf == e.ID && t.status == e.Status {
		err = t.write(ctx, `UPDATE executions SET`+rest, args...)
	} else {
		err = t.write(ctx, `UPDATE executions SET status = ?,`+rest, append([]any{e.Status}, args...)...)
	}
	if err != nil {
		if t.cache != nil {
			delete(t.cache.executions, e.ID)
		}
		return err
	}
	t.statusOf, t.status = e.ID, e.Status
	if t.cache != nil {
		t.cache.updatedExecution(e, keys, writing)
	}
	return nil
}

// ExecutionHead is Queries.ExecutionHead, answered by the head the
// transaction's lock read (LockExecution) or by the cache when the backend
// keeps one, remembering the status it read.
func (t *Tx) ExecutionHead(ctx context.Context, id string) (*store.Execution, error) {
	if e := t.locked; e != nil && e.ID == id {
		t.locked = nil
		t.statusOf, t.status = e.ID, e.Status
		return e, nil
	}
	if t.cache != nil {
		if e, ok := t.cache.execution(id); ok {
			t.statusOf, t.status = e.ID, e.Status
			return e, nil
		}
	}
	e, err := t.Queries.ExecutionHead(ctx, id)
	if err == nil {
		t.remember(e)
	}
	return e, err
}

// remember keeps the status of the execution just read (and its head,
// when the backend keeps a cache).
func (t *Tx) remember(e *store.Execution) {
	t.statusOf, t.status = e.ID, e.Status
	if t.cache != nil {
		t.cache.keepExecution(e)
	}
}

// Execution is Queries.Execution, remembering the status it read (and the
// head, when the backend keeps a cache).
func (t *Tx) Execution(ctx context.Context, id string) (*store.Execution, error) {
	e, err := t.Queries.Execution(ctx, id)
	if err == nil {
		t.remember(e)
	}
	return e, err
}

// Dispatch is Queries.Dispatch, answered by the cache when the backend keeps
// one.

func (t *Tx) SetExecutionResult(ctx context.Context, id string, output, state []byte) error {
	return t.exec(ctx, `UPDATE execution_values SET output = ?, state = ? WHERE execution_id = ?`, output, state, id)
}

// DeleteExecution removes an execution and everything that belongs to it.
// Step rows whose bodies a fork's copy still shares are kept (detached from
// the deleted execution) until the last copy goes; the bodies a deleted
// fork's copies shared are dropped once nothing references them.
func (t *Tx) DeleteExecution(ctx context.Context, id string) error {
	refs, err := t.CopyRefs(ctx, id)
	if err != nil {
		return err
	}
	if err := t.exec(ctx, sharedBodiesKept, id, id); err != nil {
		return err
	}
	for _, stmt := range []string{
		`DELETE FROM events WHERE execution_id = ?`,
		`DELETE FROM event_runs WHERE execution_id = ?`,
		`DELETE FROM counters WHERE execution_id = ?`,
		`DELETE FROM dispatches WHERE execution_id = ?`,
		`DELETE FROM idempotency_keys WHERE execution_id = ?`,
		`DELETE FROM approvals WHERE execution_id = ?`,
		`DELETE FROM rate_limit_marks WHERE execution_id = ?`,
		`DELETE FROM resources WHERE execution_id = ?`,
		`DELETE FROM checkpoints WHERE execution_id = ?`,
		`DELETE FROM execution_values WHERE execution_id = ?`,
		`DELETE FROM executions WHERE id = ?`,
	} {
		if err := t.exec(ctx, stmt, id); err != nil {
			return err
		}
	}
	// The bodies the deleted copies shared go too once their execution is
	// gone and no other copy shares them.
	sources := map[string]bool{}
	for _, r := range refs {
		sources[r[0]] = true
	}
	for source := range sources {
		if err := t.exec(ctx, sharedBodiesKept+` AND NOT EXISTS (SELECT 1 FROM executions WHERE id = ?)`,
			source, source, source); err != nil {
			return err
		}
	}
	return nil
}

// sharedBodiesKept deletes an execution's step rows except those whose
// bodies a fork's copy still shares. The subquery repeats the partial index's
// condition (a non-empty body_execution_id), without which SQLite cannot use
// steps_by_body and reads every step of every execution.
const sharedBodiesKept = `DELETE FROM steps WHERE execution_id = ? AND step_id NOT IN
 (SELECT body_step_id FROM steps WHERE body_execution_id = ? AND body_execution_id <> '')`

func (q *Queries) CopyRefs(ctx context.Context, executionID string) ([][2]string, error) {
	return list(ctx, q, func(s Scanner) ([2]string, error) {
		var r [2]string
		err := s.Scan(&r[0], &r[1])
		return r, err
	}, `SELECT DISTINCT body_execution_id, body_step_id FROM steps WHERE execution_id = ? AND body_execution_id <> ''`, executionID)
}
