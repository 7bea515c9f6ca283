package sqlstore

import (
	"context"
	"database/sql"
	"errors"

	"github.com/rebuno/rebuno/internal/store"
)

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

func (q *Queries) Occurrences(ctx context.Context, executionID, dispatchID, kind, target, argsHash string) (store.Occurrences, error) {
	var consumed, highest sql.NullInt64
	err := q.row(ctx, `SELECT
 (SELECT consumed FROM counters WHERE execution_id = ? AND dispatch_id = ? AND kind = ? AND target = ? AND args_hash = ?),
 (SELECT MAX(occurrence) FROM steps WHERE execution_id = ? AND kind = ? AND target = ? AND args_hash = ?)`,
		executionID, dispatchID, kind, target, argsHash, executionID, kind, target, argsHash).Scan(&consumed, &highest)
	return store.Occurrences{Consumed: consumed.Int64, HasCounter: consumed.Valid, Highest: highest.Int64, HasHighest: highest.Valid}, err
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
