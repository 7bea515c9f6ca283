package sqlstore

import (
	"context"
	"database/sql"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

func (q *Queries) dispatchRefs(ctx context.Context, query string, args ...any) ([]store.DispatchRef, error) {
	return list(ctx, q, func(s Scanner) (store.DispatchRef, error) {
		var r store.DispatchRef
		err := s.Scan(&r.ID, &r.ExecutionID)
		return r, err
	}, query, args...)
}

func (q *Queries) DueDispatches(ctx context.Context, now time.Time, limit int, skipAgents []string) ([]store.DispatchRef, error) {
	skip, args := skipAgentsClause(skipAgents, wire.DispatchPending, wire.DispatchFailed, ts(now))
	return list(ctx, q, func(s Scanner) (store.DispatchRef, error) {
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

func (q *Queries) stringCol(ctx context.Context, query string, args ...any) ([]string, error) {
	return list(ctx, q, func(s Scanner) (string, error) {
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

// RetentionCandidates leaves out the executions an in-place fork reads. The
// OFFSET in the subquery keeps Postgres from turning it into an anti-join,
// which its generic plan makes read every in-place fork; so each candidate
// asks the partial index for its own forks.
func (q *Queries) RetentionCandidates(ctx context.Context, updatedBefore time.Time, limit int) ([]string, error) {
	return q.stringCol(ctx, `SELECT id FROM executions`+q.D.IndexedBy("executions_terminal_age")+`
 WHERE status IN (`+terminalList+`) AND updated_at < ?
 AND NOT EXISTS (SELECT 1 FROM executions f WHERE f.forked_from = executions.id AND f.fork_in_place = 1 LIMIT 1 OFFSET 0)
 ORDER BY updated_at LIMIT ?`, ts(updatedBefore), limit)
}
