// Package sqlstore implements the store interfaces once, in SQL that both
// SQLite and Postgres accept. The few places where the two differ (placeholder
// syntax, schema types, row locking) go through Dialect, so every rule of the
// data model has exactly one implementation.
package sqlstore

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// Querier is what both a connection and a transaction offer. Backends may
// wrap it with a prepared-statement cache.
type Querier interface {
	ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error)
	QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error)
	QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row
}

// Dialect is the seam between SQL backends.
type Dialect interface {
	// Rebind rewrites placeholders into the backend's syntax. Queries use
	// '?' and, to bind one value for many rows, '?1': as in SQLite, a bare
	// '?' then takes the number after the largest one used so far.
	Rebind(query string) string
	// LockSuffix is appended to the execution read that takes the per-execution
	// lock inside a write transaction ("" when the backend serialises writers).
	LockSuffix() string
	// SkipLockedSuffix is appended to scheduling reads in write transactions.
	SkipLockedSuffix() string
	// IndexedBy follows a table name to make a query use the named index,
	// where a planner without statistics would pick one that reads rows in
	// proportion to the history; "" where the backend needs no hint.
	IndexedBy(index string) string
}

// Queries implements store.Reader over a Querier.
type Queries struct {
	Q Querier
	D Dialect
}

// Tx implements store.Tx over a Querier inside an open transaction.
type Tx struct {
	Queries
	after []func()
	// The status of the execution this transaction last read or wrote.
	// UpdateExecution leaves the column alone while it is unchanged: SQLite
	// rewrites an index's entry whenever the UPDATE sets one of its columns,
	// even to the value it had, and that page would be one more WAL frame in
	// the commit of every step.
	statusOf, status string
	// cache, when the backend keeps one, answers the reads of execution
	// heads and dispatches and follows the writes of them.
	cache *RowCache
}

// NewTx returns a Tx writing through q.
func NewTx(q Querier, d Dialect) *Tx { return &Tx{Queries: Queries{Q: q, D: d}} }

// NewCachedTx returns a Tx writing through q that reads and maintains c
// (see RowCache for who may use one).
func NewCachedTx(q Querier, d Dialect, c *RowCache) *Tx {
	return &Tx{Queries: Queries{Q: q, D: d}, cache: c}
}

// exec runs a write. One that may change cached rows in a way the cache does
// not follow clears it: the methods that keep it exact write through
// t.Queries.exec instead.
func (t *Tx) exec(ctx context.Context, query string, args ...any) error {
	if t.cache != nil && touches(query) {
		t.cache.Clear()
	}
	return t.Queries.exec(ctx, query, args...)
}

// AfterCommit implements store.Tx.
func (t *Tx) AfterCommit(f func()) { t.after = append(t.after, f) }

// Committed runs the after-commit callbacks; backends call it once the
// transaction is durable.
func (t *Tx) Committed() {
	for _, f := range t.after {
		f()
	}
	t.after = nil
}

var (
	_ store.Reader = (*Queries)(nil)
	_ store.Tx     = (*Tx)(nil)
)

func (q *Queries) exec(ctx context.Context, query string, args ...any) error {
	_, err := q.Q.ExecContext(ctx, q.D.Rebind(query), args...)
	return err
}

func (q *Queries) query(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	return q.Q.QueryContext(ctx, q.D.Rebind(query), args...)
}

func (q *Queries) row(ctx context.Context, query string, args ...any) *sql.Row {
	return q.Q.QueryRowContext(ctx, q.D.Rebind(query), args...)
}

// list runs a query and scans each row; the answer is [] rather than nil
// when there are none.
func list[T any](ctx context.Context, q *Queries, scan func(scanner) (T, error), query string, args ...any) ([]T, error) {
	rows, err := q.query(ctx, query, args...)
	if err != nil {
		return nil, err
	}
	defer rows.Close()
	out := []T{}
	for rows.Next() {
		v, err := scan(rows)
		if err != nil {
			return nil, err
		}
		out = append(out, v)
	}
	return out, rows.Err()
}

// Times are stored as Unix microseconds; 0 means unset.
func ts(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixMicro()
}

func fromTS(v int64) time.Time {
	if v == 0 {
		return time.Time{}
	}
	return time.UnixMicro(v).UTC()
}

func encodeList(l []string) string {
	if len(l) == 0 {
		return "[]"
	}
	b, _ := json.Marshal(l)
	return string(b)
}

func decodeList(s string) ([]string, error) {
	var l []string
	if s == "" || s == "[]" {
		return []string{}, nil
	}
	if err := json.Unmarshal([]byte(s), &l); err != nil {
		return nil, fmt.Errorf("decode list: %w", err)
	}
	return l, nil
}

func notFound(err error) error {
	if errors.Is(err, sql.ErrNoRows) {
		return store.ErrNotFound
	}
	return err
}

// nonTerminalList and terminalList are the SQL lists of live and of
// finished execution statuses, written as the schema's partial indexes
// write them.
var (
	nonTerminalList = sqlList(slices.DeleteFunc(slices.Clone(wire.ExecutionStatuses), wire.ExecTerminal))
	terminalList    = sqlList(wire.ExecTerminalStatuses)
)

// sqlList writes constant strings as an SQL list of literals.
func sqlList(values []string) string {
	return "'" + strings.Join(values, "','") + "'"
}

// ---- executions ----

// executionCols are the columns of the execution row; the user values
// (input, output, state) live in execution_values, so that the row every
// operation rewrites stays small whatever their size.
const executionCols = `e.id, e.agent_id, e.agent_version, e.status, e.failure_reason,
 e.created_at, e.updated_at, e.deadline_at, e.parent_execution_id, e.idempotency_key, e.on_behalf_of,
 e.forked_from, e.fork_seq, e.restoration, e.resource_keys, e.dispatch_id, e.last_seq, e.step_order, e.step_count, e.byte_count,
 e.writing`

const executionValues = `, v.input, v.output, v.state FROM executions e JOIN execution_values v ON v.execution_id = e.id`

type scanner interface{ Scan(dest ...any) error }

// scanExecutionRow scans executionCols, then input, output and state when
// withValues (the query joined executionValues).
func scanExecutionRow(s scanner, withValues bool) (*store.Execution, error) {
	var e store.Execution
	var created, updated, deadline int64
	var keys, writing string
	dest := []any{&e.ID, &e.AgentID, &e.AgentVersion, &e.Status, &e.FailureReason,
		&created, &updated, &deadline, &e.ParentID, &e.IdempotencyKey, &e.OnBehalfOf,
		&e.ForkedFrom, &e.ForkSeq, &e.Restoration, &keys, &e.DispatchID, &e.LastSeq, &e.StepOrder, &e.StepCount, &e.ByteCount,
		&writing}
	if withValues {
		dest = append(dest, &e.Input, &e.Output, &e.State)
	}
	if err := s.Scan(dest...); err != nil {
		return nil, err
	}
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

func scanExecution(s scanner) (*store.Execution, error) { return scanExecutionRow(s, true) }

func scanHead(s scanner) (*store.Execution, error) { return scanExecutionRow(s, false) }

// Execution implements store.Reader.
func (q *Queries) Execution(ctx context.Context, id string) (*store.Execution, error) {
	e, err := scanExecution(q.row(ctx, `SELECT `+executionCols+executionValues+` WHERE e.id = ?`, id))
	return e, notFound(err)
}

// ExecutionHead implements store.Reader. Inside a write transaction it also
// takes the execution's row lock where the dialect needs one.
func (q *Queries) ExecutionHead(ctx context.Context, id string) (*store.Execution, error) {
	e, err := scanHead(q.row(ctx, `SELECT `+executionCols+` FROM executions e WHERE e.id = ?`+q.D.LockSuffix(), id))
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
	err := t.Queries.exec(ctx, `INSERT INTO executions (id, agent_id, agent_version, status, failure_reason,
 created_at, updated_at, deadline_at, parent_execution_id, idempotency_key, on_behalf_of,
 forked_from, fork_seq, restoration, resource_keys, dispatch_id, last_seq, step_order, step_count, byte_count, writing)
 VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		e.ID, e.AgentID, e.AgentVersion, e.Status, e.FailureReason,
		ts(e.CreatedAt), ts(e.UpdatedAt), ts(e.DeadlineAt), e.ParentID, e.IdempotencyKey, e.OnBehalfOf,
		e.ForkedFrom, e.ForkSeq, e.Restoration, encodeList(e.ResourceKeys), e.DispatchID, e.LastSeq, e.StepOrder, e.StepCount, e.ByteCount,
		encodeList(e.Writing))
	if err != nil {
		return err
	}
	t.statusOf, t.status = e.ID, e.Status
	return t.exec(ctx, `INSERT INTO execution_values (execution_id, input, output, state) VALUES (?,?,?,?)`,
		e.ID, e.Input, e.Output, e.State)
}

func (t *Tx) UpdateExecution(ctx context.Context, e *store.Execution) error {
	const rest = ` failure_reason = ?, updated_at = ?, resource_keys = ?, dispatch_id = ?,
 last_seq = ?, step_order = ?, step_count = ?, byte_count = ?, writing = ? WHERE id = ?`
	keys, writing := encodeList(e.ResourceKeys), encodeList(e.Writing)
	args := []any{e.FailureReason, ts(e.UpdatedAt), keys, e.DispatchID,
		e.LastSeq, e.StepOrder, e.StepCount, e.ByteCount, writing, e.ID}
	var err error
	if t.statusOf == e.ID && t.status == e.Status {
		err = t.Queries.exec(ctx, `UPDATE executions SET`+rest, args...)
	} else {
		err = t.Queries.exec(ctx, `UPDATE executions SET status = ?,`+rest, append([]any{e.Status}, args...)...)
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

// ExecutionHead is Queries.ExecutionHead, answered by the cache when the
// backend keeps one, remembering the status it read.
func (t *Tx) ExecutionHead(ctx context.Context, id string) (*store.Execution, error) {
	if t.cache != nil {
		if e, ok := t.cache.execution(id); ok {
			t.statusOf, t.status = e.ID, e.Status
			return e, nil
		}
	}
	e, err := t.Queries.ExecutionHead(ctx, id)
	if err == nil {
		t.statusOf, t.status = e.ID, e.Status
		if t.cache != nil {
			t.cache.keepExecution(e)
		}
	}
	return e, err
}

// Execution is Queries.Execution, remembering the status it read (and the
// head, when the backend keeps a cache).
func (t *Tx) Execution(ctx context.Context, id string) (*store.Execution, error) {
	e, err := t.Queries.Execution(ctx, id)
	if err == nil {
		t.statusOf, t.status = e.ID, e.Status
		if t.cache != nil {
			t.cache.keepExecution(e)
		}
	}
	return e, err
}

// Dispatch is Queries.Dispatch, answered by the cache when the backend keeps
// one.
func (t *Tx) Dispatch(ctx context.Context, id string) (*store.Dispatch, error) {
	if t.cache != nil {
		if d, ok := t.cache.dispatch(id); ok {
			return d, nil
		}
	}
	d, err := t.Queries.Dispatch(ctx, id)
	if err == nil && t.cache != nil {
		t.cache.keepDispatch(d)
	}
	return d, err
}

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
	return list(ctx, q, func(s scanner) ([2]string, error) {
		var r [2]string
		err := s.Scan(&r[0], &r[1])
		return r, err
	}, `SELECT DISTINCT body_execution_id, body_step_id FROM steps WHERE execution_id = ? AND body_execution_id <> ''`, executionID)
}

// ---- events ----

// AppendEvents stores events; a sequence number is never stored twice. One
// execution's events in seq order (every append the kernel makes) go into
// runs (eventruns.go), which must follow every event already stored for it,
// as the kernel's appends always do; anything else is stored a row per event.
func (t *Tx) AppendEvents(ctx context.Context, events []*store.Event) error {
	if len(events) == 0 {
		return nil
	}
	if packable(events) {
		return t.appendRuns(ctx, events)
	}
	// A row whose seq a run already holds is refused like a duplicate row:
	// runs end below the lowest seq appended to each execution.
	lowest := map[string]int64{}
	for _, ev := range events {
		if seq, ok := lowest[ev.ExecutionID]; !ok || ev.Seq < seq {
			lowest[ev.ExecutionID] = ev.Seq
		}
	}
	for id, seq := range lowest {
		var one int
		err := t.row(ctx, `SELECT 1 FROM event_runs WHERE execution_id = ? AND last_seq >= ? LIMIT 1`, id, seq).Scan(&one)
		switch {
		case err == nil:
			return fmt.Errorf("append events: seq %d of %s is already stored", seq, id)
		case !errors.Is(err, sql.ErrNoRows):
			return err
		}
	}
	return t.appendRows(ctx, events)
}

func (t *Tx) appendRows(ctx context.Context, events []*store.Event) error {
	// One statement per 1,000 events keeps each under SQLite's limit of
	// 32,766 bound variables (terminate may cancel thousands of open steps).
	for len(events) > 1000 {
		if err := t.appendRows(ctx, events[:1000]); err != nil {
			return err
		}
		events = events[1000:]
	}
	var b strings.Builder
	b.WriteString(`INSERT INTO events (execution_id, event_seq, type, payload, occurred_at) VALUES `)
	args := make([]any, 0, 5*len(events))
	for i, ev := range events {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?)")
		args = append(args, ev.ExecutionID, ev.Seq, ev.Type, ev.Payload, ts(ev.OccurredAt))
	}
	return t.exec(ctx, b.String(), args...)
}

// appendRuns stores packable events as runs, refusing them unless they
// follow everything stored for their execution. The first run's insert
// carries the check, so that an append costs one statement rather than two;
// the runs after it follow that one.
func (t *Tx) appendRuns(ctx context.Context, events []*store.Event) error {
	id, first := events[0].ExecutionID, events[0].Seq
	check := true
	for len(events) > 0 {
		n := min(len(events), runMaxEvents)
		run := events[:n]
		args := []any{id, run[n-1].Seq, run[0].Seq, encodeRun(run)}
		query := `INSERT INTO event_runs (execution_id, last_seq, first_seq, events) VALUES (?,?,?,?)`
		if check {
			query = `INSERT INTO event_runs (execution_id, last_seq, first_seq, events) SELECT ?,?,?,?
 WHERE NOT EXISTS (SELECT 1 FROM events WHERE execution_id = ? AND event_seq >= ?)
 AND NOT EXISTS (SELECT 1 FROM event_runs WHERE execution_id = ? AND last_seq >= ?)`
			args = append(args, id, first, id, first)
		}
		res, err := t.Q.ExecContext(ctx, t.D.Rebind(query), args...)
		if err != nil {
			return err
		}
		if check {
			if added, err := res.RowsAffected(); err != nil {
				return err
			} else if added == 0 {
				return fmt.Errorf("append events: %s already has events at or after seq %d", id, first)
			}
			check = false
		}
		events = events[n:]
	}
	return nil
}

// Events pages an execution's log: its rows and its runs, merged by seq.
func (q *Queries) Events(ctx context.Context, executionID string, afterSeq int64, limit int) ([]*store.Event, error) {
	rows, err := list(ctx, q, func(s scanner) (*store.Event, error) {
		ev := &store.Event{ExecutionID: executionID}
		var at int64
		err := s.Scan(&ev.Seq, &ev.Type, &ev.Payload, &at)
		ev.OccurredAt = fromTS(at)
		return ev, err
	}, `SELECT event_seq, type, payload, occurred_at FROM events
 WHERE execution_id = ? AND event_seq > ? ORDER BY event_seq LIMIT ?`, executionID, afterSeq, limit)
	if err != nil {
		return nil, err
	}
	runs, err := q.query(ctx, `SELECT first_seq, events FROM event_runs WHERE execution_id = ? AND last_seq > ? ORDER BY last_seq`,
		executionID, afterSeq)
	if err != nil {
		return nil, err
	}
	defer runs.Close()
	// rows holds every row that can be on this page; the runs' events slot
	// in between them.
	out := make([]*store.Event, 0, len(rows))
	next := 0
	take := func(ev *store.Event) bool {
		for next < len(rows) && rows[next].Seq < ev.Seq && len(out) < limit {
			out = append(out, rows[next])
			next++
		}
		if len(out) < limit {
			out = append(out, ev)
		}
		return len(out) < limit
	}
	for len(out) < limit && runs.Next() {
		var first int64
		var data sql.RawBytes
		if err := runs.Scan(&first, &data); err != nil {
			return nil, err
		}
		if err := decodeRun(executionID, first, data, afterSeq, take); err != nil {
			return nil, err
		}
	}
	if err := runs.Err(); err != nil {
		return nil, err
	}
	for next < len(rows) && len(out) < limit {
		out = append(out, rows[next])
		next++
	}
	return out, nil
}

// ---- steps ----

// stepCols are the step columns; a fork's copy reads the args, result and
// error of the step whose bodies it shares (b).
const stepCols = `s.execution_id, s.step_id, s.step_order, s.kind, s.target, s.args_hash, s.occurrence, s.status, s.idempotency,
 CASE WHEN s.body_step_id = '' THEN s.args ELSE b.args END,
 CASE WHEN s.body_step_id = '' THEN s.result ELSE b.result END,
 CASE WHEN s.body_step_id = '' THEN s.error ELSE b.error END,
 s.error_reason, s.resources, s.started_at, s.completed_at, s.dispatch_id, s.attempt, s.terminal_seq,
 s.start_info, s.body_execution_id, s.body_step_id`

const stepFrom = ` FROM steps s` + stepJoin

// stepJoin finds the row holding a copied step's bodies.
const stepJoin = ` LEFT JOIN steps b ON s.body_step_id <> '' AND b.execution_id = s.body_execution_id AND b.step_id = s.body_step_id`

const stepInsertCols = `execution_id, step_id, step_order, kind, target, args_hash, occurrence, status, idempotency,
 args, result, error, error_reason, resources, started_at, completed_at, dispatch_id, attempt, terminal_seq,
 start_info, body_execution_id, body_step_id`

func scanStep(s scanner) (*store.Step, error) {
	var st store.Step
	var started, completed int64
	var res string
	err := s.Scan(&st.ExecutionID, &st.StepID, &st.Order, &st.Kind, &st.Target, &st.ArgsHash, &st.Occurrence,
		&st.Status, &st.Idempotency, &st.Args, &st.Result, &st.Error, &st.ErrorReason, &res,
		&started, &completed, &st.DispatchID, &st.Attempt, &st.TerminalSeq,
		&st.StartInfo, &st.BodyExecutionID, &st.BodyStepID)
	if err != nil {
		return nil, err
	}
	st.StartedAt, st.CompletedAt = fromTS(started), fromTS(completed)
	if st.Resources, err = decodeList(res); err != nil {
		return nil, err
	}
	return &st, nil
}

func (q *Queries) Step(ctx context.Context, executionID, stepID string) (*store.Step, error) {
	s, err := scanStep(q.row(ctx, `SELECT `+stepCols+stepFrom+` WHERE s.execution_id = ? AND s.step_id = ?`, executionID, stepID))
	return s, notFound(err)
}

func (q *Queries) Steps(ctx context.Context, executionID string, statuses []string, afterOrder int64, limit int) ([]*store.Step, error) {
	query := `SELECT ` + stepCols + stepFrom + ` WHERE s.execution_id = ? AND s.step_order > ?`
	args := []any{executionID, afterOrder}
	if len(statuses) > 0 {
		query += " AND s.status IN (?" + strings.Repeat(",?", len(statuses)-1) + ")"
		for _, s := range statuses {
			args = append(args, s)
		}
	}
	query += " ORDER BY s.step_order LIMIT ?"
	args = append(args, limit)
	return list(ctx, q, scanStep, query, args...)
}

// FinishedStepHeads reads only what a copy keeps: every column read costs a
// call into the driver, and a fork reads thousands of rows.
func (q *Queries) FinishedStepHeads(ctx context.Context, executionID string, upTo, afterOrder int64, limit int) ([]*store.Step, error) {
	return list(ctx, q, func(s scanner) (*store.Step, error) {
		st := &store.Step{ExecutionID: executionID}
		var started, completed int64
		var res string
		err := s.Scan(&st.StepID, &st.Order, &st.Kind, &st.Target, &st.ArgsHash, &st.Occurrence, &st.Status, &st.Idempotency,
			&st.ErrorReason, &res, &started, &completed, &st.TerminalSeq, &st.BodyExecutionID, &st.BodyStepID)
		if err != nil {
			return nil, err
		}
		st.StartedAt, st.CompletedAt = fromTS(started), fromTS(completed)
		if st.Resources, err = decodeList(res); err != nil {
			return nil, err
		}
		return st, nil
	}, `SELECT step_id, step_order, kind, target, args_hash, occurrence, status, idempotency, error_reason, resources,
 started_at, completed_at, terminal_seq, body_execution_id, body_step_id FROM steps WHERE execution_id = ? AND step_order > ?
 AND status IN ('succeeded','failed','denied') AND terminal_seq BETWEEN 1 AND ? ORDER BY step_order LIMIT ?`,
		executionID, afterOrder, upTo, limit)
}

func (q *Queries) OpenSteps(ctx context.Context, executionID string) ([]*store.Step, error) {
	// Only a terminal transition asks, once per execution, so the scan of the
	// execution's steps in recording order costs less than an index that
	// every step would have to maintain twice.
	return list(ctx, q, scanStep, `SELECT `+stepCols+stepFrom+` WHERE s.execution_id = ? AND s.status IN ('allowed','executing') ORDER BY s.step_order`, executionID)
}

func (q *Queries) MaxOccurrence(ctx context.Context, executionID, kind, target, argsHash string) (int64, bool, error) {
	var occ sql.NullInt64
	err := q.row(ctx, `SELECT MAX(occurrence) FROM steps WHERE execution_id = ? AND kind = ? AND target = ? AND args_hash = ?`,
		executionID, kind, target, argsHash).Scan(&occ)
	if err != nil {
		return 0, false, err
	}
	return occ.Int64, occ.Valid, nil
}

func (q *Queries) HasIndeterminate(ctx context.Context, executionID, kind, target, argsHash string) (bool, error) {
	var one int
	err := q.row(ctx, `SELECT 1 FROM steps WHERE execution_id = ? AND kind = ? AND target = ? AND args_hash = ?
 AND status = ? AND error_reason = ? LIMIT 1`, executionID, kind, target, argsHash, wire.StepFailed, wire.ReasonIndeterminate).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

func (t *Tx) InsertStep(ctx context.Context, s *store.Step) error {
	return t.InsertSteps(ctx, []*store.Step{s})
}

// stepsPerInsert keeps one multi-row insert under SQLite's limit of 32,766
// bound variables (22 per step).
const stepsPerInsert = 1000

// InsertSteps inserts steps with as few statements as it can: a fork copies
// thousands at once.
func (t *Tx) InsertSteps(ctx context.Context, steps []*store.Step) error {
	for len(steps) > 0 {
		n := min(len(steps), stepsPerInsert)
		var err error
		if areCopies(steps[:n]) {
			err = t.insertCopies(ctx, steps[:n])
		} else {
			err = t.insertSteps(ctx, steps[:n])
		}
		if err != nil {
			return err
		}
		steps = steps[n:]
	}
	return nil
}

func (t *Tx) insertSteps(ctx context.Context, steps []*store.Step) error {
	var b strings.Builder
	b.WriteString(`INSERT INTO steps (` + stepInsertCols + `) VALUES `)
	args := make([]any, 0, 22*len(steps))
	for i, s := range steps {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
		// A copy stores no bodies of its own.
		body, result, errBody := s.Args, s.Result, s.Error
		if s.BodyStepID != "" {
			body, result, errBody = nil, nil, nil
		}
		args = append(args, s.ExecutionID, s.StepID, s.Order, s.Kind, s.Target, s.ArgsHash, s.Occurrence, s.Status,
			s.Idempotency, body, result, errBody, s.ErrorReason, encodeList(s.Resources), ts(s.StartedAt),
			ts(s.CompletedAt), s.DispatchID, s.Attempt, s.TerminalSeq, s.StartInfo, s.BodyExecutionID, s.BodyStepID)
	}
	return t.exec(ctx, b.String(), args...)
}

// areCopies reports whether steps are a fork's copies, all of one execution:
// sharing their bodies, never started in it.
func areCopies(steps []*store.Step) bool {
	for _, s := range steps {
		if s.BodyStepID == "" || s.ExecutionID != steps[0].ExecutionID || s.DispatchID != "" || s.Attempt != 0 || s.StartInfo != nil {
			return false
		}
	}
	return true
}

// insertCopies writes what copies leave empty as literals and their one
// execution id once (?1): two thirds of the values a row would otherwise
// bind, on the statement that makes most of a fork's cost.
func (t *Tx) insertCopies(ctx context.Context, steps []*store.Step) error {
	var b strings.Builder
	b.WriteString(`INSERT INTO steps (` + stepInsertCols + `) VALUES `)
	args := make([]any, 0, 1+15*len(steps))
	args = append(args, steps[0].ExecutionID)
	for i, s := range steps {
		if i > 0 {
			b.WriteByte(',')
		}
		// A bare ? after ?1 takes the number after the largest one used so
		// far, so every row's own values follow in order (see Dialect.Rebind).
		b.WriteString("(?1,?,?,?,?,?,?,?,?,NULL,NULL,NULL,?,?,?,?,'',0,?,NULL,?,?)")
		args = append(args, s.StepID, s.Order, s.Kind, s.Target, s.ArgsHash, s.Occurrence, s.Status, s.Idempotency,
			s.ErrorReason, encodeList(s.Resources), ts(s.StartedAt), ts(s.CompletedAt), s.TerminalSeq,
			s.BodyExecutionID, s.BodyStepID)
	}
	return t.exec(ctx, b.String(), args...)
}

func (t *Tx) UpdateStep(ctx context.Context, s *store.Step) error {
	return t.exec(ctx, `UPDATE steps SET status = ?, idempotency = ?, result = ?, error = ?, error_reason = ?,
 started_at = ?, completed_at = ?, dispatch_id = ?, attempt = ?, terminal_seq = ?, start_info = ? WHERE execution_id = ? AND step_id = ?`,
		s.Status, s.Idempotency, s.Result, s.Error, s.ErrorReason, ts(s.StartedAt), ts(s.CompletedAt),
		s.DispatchID, s.Attempt, s.TerminalSeq, s.StartInfo, s.ExecutionID, s.StepID)
}

// ---- dispatches ----

const dispatchCols = `id, execution_id, status, attempt, max_attempts, progress_attempt, lease_timeout,
 next_attempt_at, lease_expires_at, claimed_by, created_at, updated_at`

func (q *Queries) Dispatch(ctx context.Context, id string) (*store.Dispatch, error) {
	var d store.Dispatch
	var next, lease, created, updated int64
	err := q.row(ctx, `SELECT `+dispatchCols+` FROM dispatches WHERE id = ?`, id).Scan(&d.ID, &d.ExecutionID, &d.Status,
		&d.Attempt, &d.MaxAttempts, &d.ProgressAttempt, &d.LeaseTimeout, &next, &lease, &d.ClaimedBy, &created, &updated)
	if err != nil {
		return nil, notFound(err)
	}
	d.NextAttemptAt, d.LeaseExpiresAt, d.CreatedAt, d.UpdatedAt = fromTS(next), fromTS(lease), fromTS(created), fromTS(updated)
	return &d, nil
}

func (t *Tx) InsertDispatch(ctx context.Context, d *store.Dispatch) error {
	if t.cache != nil {
		delete(t.cache.dispatches, d.ID) // read back when next needed
	}
	return t.Queries.exec(ctx, `INSERT INTO dispatches (`+dispatchCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)`,
		d.ID, d.ExecutionID, d.Status, d.Attempt, d.MaxAttempts, d.ProgressAttempt, d.LeaseTimeout,
		ts(d.NextAttemptAt), ts(d.LeaseExpiresAt), d.ClaimedBy, ts(d.CreatedAt), ts(d.UpdatedAt))
}

func (t *Tx) UpdateDispatch(ctx context.Context, d *store.Dispatch) error {
	if t.cache != nil {
		delete(t.cache.dispatches, d.ID) // read back when next needed
	}
	return t.Queries.exec(ctx, `UPDATE dispatches SET status = ?, attempt = ?, progress_attempt = ?, lease_timeout = ?,
 next_attempt_at = ?, lease_expires_at = ?, claimed_by = ?, updated_at = ? WHERE id = ?`,
		d.Status, d.Attempt, d.ProgressAttempt, d.LeaseTimeout, ts(d.NextAttemptAt), ts(d.LeaseExpiresAt),
		d.ClaimedBy, ts(d.UpdatedAt), d.ID)
}

func (t *Tx) RetireDispatches(ctx context.Context, executionID, keepID string, now time.Time) error {
	if t.cache != nil {
		t.cache.retired(executionID, keepID)
	}
	return t.Queries.exec(ctx, `UPDATE dispatches SET status = ?, updated_at = ? WHERE execution_id = ? AND id <> ? AND status <> ?`,
		wire.DispatchRetired, ts(now), executionID, keepID, wire.DispatchRetired)
}

func (q *Queries) dispatchRefs(ctx context.Context, query string, args ...any) ([]store.DispatchRef, error) {
	return list(ctx, q, func(s scanner) (store.DispatchRef, error) {
		var r store.DispatchRef
		err := s.Scan(&r.ID, &r.ExecutionID)
		return r, err
	}, query, args...)
}

func (q *Queries) DueDispatches(ctx context.Context, now time.Time, limit int, skipAgents []string) ([]store.DispatchRef, error) {
	skip, args := skipAgentsClause(skipAgents, wire.DispatchPending, wire.DispatchFailed, ts(now))
	return list(ctx, q, func(s scanner) (store.DispatchRef, error) {
		var r store.DispatchRef
		err := s.Scan(&r.ID, &r.ExecutionID, &r.AgentID)
		return r, err
	}, `SELECT d.id, d.execution_id, e.agent_id FROM dispatches d JOIN executions e ON e.id = d.execution_id
 WHERE d.status IN (?, ?) AND d.next_attempt_at <= ?`+skip+` ORDER BY d.next_attempt_at LIMIT ?`, append(args, limit)...)
}

// skipAgentsClause leaves the dispatches of some agents out of a query on
// dispatches d joined with their executions e; args are the query's other
// arguments, which come first.
func skipAgentsClause(skipAgents []string, args ...any) (string, []any) {
	if len(skipAgents) == 0 {
		return "", args
	}
	for _, a := range skipAgents {
		args = append(args, a)
	}
	return " AND e.agent_id NOT IN (?" + strings.Repeat(", ?", len(skipAgents)-1) + ")", args
}

func (q *Queries) ExpiredLeases(ctx context.Context, now time.Time, limit int) ([]store.DispatchRef, error) {
	return q.dispatchRefs(ctx, `SELECT id, execution_id FROM dispatches WHERE status = ? AND lease_expires_at <= ?
 ORDER BY lease_expires_at LIMIT ?`, wire.DispatchInFlight, ts(now), limit)
}

func (q *Queries) NextDue(ctx context.Context, skipAgents []string) (time.Time, error) {
	skip, args := skipAgentsClause(skipAgents, wire.DispatchPending, wire.DispatchFailed)
	return q.minTime(ctx, `SELECT MIN(d.next_attempt_at) FROM dispatches d JOIN executions e ON e.id = d.execution_id
 WHERE d.status IN (?, ?)`+skip, args...)
}

func (q *Queries) NextLeaseExpiry(ctx context.Context) (time.Time, error) {
	return q.minTime(ctx, `SELECT MIN(lease_expires_at) FROM dispatches WHERE status = ?`, wire.DispatchInFlight)
}

// minTime reads a MIN() over a time column; zero when there are no rows.
func (q *Queries) minTime(ctx context.Context, query string, args ...any) (time.Time, error) {
	var v sql.NullInt64
	if err := q.row(ctx, query, args...).Scan(&v); err != nil {
		return time.Time{}, err
	}
	return fromTS(v.Int64), nil
}

func (q *Queries) QueueDepth(ctx context.Context, now time.Time) (int64, error) {
	var n int64
	err := q.row(ctx, `SELECT COUNT(*) FROM dispatches WHERE status IN (?, ?) AND next_attempt_at <= ?`,
		wire.DispatchPending, wire.DispatchFailed, ts(now)).Scan(&n)
	return n, err
}

// ---- occurrence counters ----

func (q *Queries) Counter(ctx context.Context, executionID, dispatchID, kind, target, argsHash string) (int64, bool, error) {
	var v int64
	err := q.row(ctx, `SELECT consumed FROM counters
 WHERE execution_id = ? AND dispatch_id = ? AND kind = ? AND target = ? AND args_hash = ?`,
		executionID, dispatchID, kind, target, argsHash).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, false, nil
	}
	return v, err == nil, err
}

func (t *Tx) RaiseCounter(ctx context.Context, executionID, dispatchID, kind, target, argsHash string, consumed int64) error {
	return t.exec(ctx, `INSERT INTO counters (execution_id, dispatch_id, kind, target, args_hash, consumed) VALUES (?,?,?,?,?,?)
 ON CONFLICT (execution_id, dispatch_id, kind, target, args_hash) DO UPDATE SET consumed = excluded.consumed
 WHERE excluded.consumed > counters.consumed`,
		executionID, dispatchID, kind, target, argsHash, consumed)
}

func (t *Tx) DeleteDispatchCounters(ctx context.Context, executionID, dispatchID string) error {
	return t.exec(ctx, `DELETE FROM counters WHERE execution_id = ? AND dispatch_id = ?`, executionID, dispatchID)
}

func (t *Tx) DeleteExecutionCounters(ctx context.Context, executionID string) error {
	return t.exec(ctx, `DELETE FROM counters WHERE execution_id = ?`, executionID)
}

// ---- agents ----

const agentCols = `id, webhook_url, secret, policy_bundle, lease_timeout_seconds, description, input_schema,
 output_schema, registered_at, updated_at`

func scanAgent(s scanner) (*store.Agent, error) {
	var a store.Agent
	var reg, upd int64
	if err := s.Scan(&a.ID, &a.WebhookURL, &a.Secret, &a.PolicyBundle, &a.LeaseTimeoutSeconds, &a.Description,
		&a.InputSchema, &a.OutputSchema, &reg, &upd); err != nil {
		return nil, err
	}
	a.RegisteredAt, a.UpdatedAt = fromTS(reg), fromTS(upd)
	return &a, nil
}

func (q *Queries) Agent(ctx context.Context, id string) (*store.Agent, error) {
	a, err := scanAgent(q.row(ctx, `SELECT `+agentCols+` FROM agents WHERE id = ?`, id))
	return a, notFound(err)
}

func (q *Queries) ListAgents(ctx context.Context) ([]*store.Agent, error) {
	return list(ctx, q, scanAgent, `SELECT `+agentCols+` FROM agents ORDER BY id`)
}

func (q *Queries) AgentHasLiveExecutions(ctx context.Context, agentID string) (bool, error) {
	var one int
	// Through the live executions, which are few, rather than through all of
	// the agent's, which grow with its history.
	err := q.row(ctx, `SELECT 1 FROM executions`+q.D.IndexedBy("executions_by_status")+`
 WHERE status IN (`+nonTerminalList+`) AND agent_id = ? LIMIT 1`, agentID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// UpsertAgent creates the agent or updates its webhook URL, secret and lease
// timeout, keeping the policy, metadata and registration time (§21.1). The
// policy bundle of a is written only on insert.
func (t *Tx) UpsertAgent(ctx context.Context, a *store.Agent) error {
	return t.exec(ctx, `INSERT INTO agents (`+agentCols+`) VALUES (?,?,?,?,?,?,?,?,?,?)
 ON CONFLICT (id) DO UPDATE SET webhook_url = excluded.webhook_url, secret = excluded.secret,
 lease_timeout_seconds = excluded.lease_timeout_seconds, updated_at = excluded.updated_at`,
		a.ID, a.WebhookURL, a.Secret, a.PolicyBundle, a.LeaseTimeoutSeconds, a.Description, a.InputSchema, a.OutputSchema,
		ts(a.RegisteredAt), ts(a.UpdatedAt))
}

func (t *Tx) UpdateAgentMetadata(ctx context.Context, id, description string, in, out []byte, now time.Time) error {
	res, err := t.Q.ExecContext(ctx, t.D.Rebind(`UPDATE agents SET description = ?, input_schema = ?, output_schema = ?, updated_at = ? WHERE id = ?`),
		description, in, out, ts(now), id)
	return affected(res, err)
}

func (t *Tx) SetAgentPolicy(ctx context.Context, id, bundle string, now time.Time) error {
	res, err := t.Q.ExecContext(ctx, t.D.Rebind(`UPDATE agents SET policy_bundle = ?, updated_at = ? WHERE id = ?`), bundle, ts(now), id)
	return affected(res, err)
}

func (t *Tx) DeleteAgent(ctx context.Context, id string) error {
	res, err := t.Q.ExecContext(ctx, t.D.Rebind(`DELETE FROM agents WHERE id = ?`), id)
	return affected(res, err)
}

func affected(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}

// ---- idempotency keys ----

func (q *Queries) Idempotency(ctx context.Context, route, scope, key string) (*store.IdempotencyRecord, error) {
	r := store.IdempotencyRecord{Route: route, Scope: scope, Key: key}
	var at int64
	err := q.row(ctx, `SELECT body_hash, execution_id, created_at FROM idempotency_keys WHERE route = ? AND scope = ? AND idem_key = ?`,
		route, scope, key).Scan(&r.BodyHash, &r.ExecutionID, &at)
	if err != nil {
		return nil, notFound(err)
	}
	r.CreatedAt = fromTS(at)
	return &r, nil
}

func (t *Tx) InsertIdempotency(ctx context.Context, r *store.IdempotencyRecord) error {
	// A record past its lifetime may still be present until the sweep runs;
	// a new use of the key replaces it.
	return t.exec(ctx, `INSERT INTO idempotency_keys (route, scope, idem_key, body_hash, execution_id, created_at) VALUES (?,?,?,?,?,?)
 ON CONFLICT (route, scope, idem_key) DO UPDATE SET body_hash = excluded.body_hash, execution_id = excluded.execution_id, created_at = excluded.created_at`,
		r.Route, r.Scope, r.Key, r.BodyHash, r.ExecutionID, ts(r.CreatedAt))
}

func (t *Tx) DeleteIdempotencyBefore(ctx context.Context, before time.Time) error {
	return t.exec(ctx, `DELETE FROM idempotency_keys WHERE created_at < ?`, ts(before))
}

// ---- deadlines and retention ----

func (q *Queries) stringCol(ctx context.Context, query string, args ...any) ([]string, error) {
	return list(ctx, q, func(s scanner) (string, error) {
		var v string
		err := s.Scan(&v)
		return v, err
	}, query, args...)
}

// The deadline and retention reads go through the partial indexes made for
// them (executions_live_deadline, executions_terminal_age). Their WHERE
// repeats the index's own, literals included, which is what makes the index
// usable; the hint keeps SQLite from preferring executions_by_status, which
// would read every live (or every finished) execution and sort them.

func (q *Queries) DeadlinesDue(ctx context.Context, now time.Time, limit int) ([]string, error) {
	return q.stringCol(ctx, `SELECT id FROM executions`+q.D.IndexedBy("executions_live_deadline")+`
 WHERE deadline_at > 0 AND deadline_at <= ? AND status IN (`+nonTerminalList+`) ORDER BY deadline_at LIMIT ?`, ts(now), limit)
}

func (q *Queries) NextDeadline(ctx context.Context) (time.Time, error) {
	return q.minTime(ctx, `SELECT MIN(deadline_at) FROM executions`+q.D.IndexedBy("executions_live_deadline")+`
 WHERE deadline_at > 0 AND status IN (`+nonTerminalList+`)`)
}

func (q *Queries) RetentionCandidates(ctx context.Context, updatedBefore time.Time, limit int) ([]string, error) {
	return q.stringCol(ctx, `SELECT id FROM executions`+q.D.IndexedBy("executions_terminal_age")+`
 WHERE status IN (`+terminalList+`) AND updated_at < ? ORDER BY updated_at LIMIT ?`, ts(updatedBefore), limit)
}
