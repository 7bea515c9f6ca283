package sqlstore

import (
	"context"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

const dispatchCols = `id, execution_id, status, attempt, max_attempts, progress_attempt, lease_timeout,
 next_attempt_at, lease_expires_at, claimed_by, created_at, updated_at`

func (q *Queries) Dispatch(ctx context.Context, id string) (*store.Dispatch, error) {
	d, err := scanDispatch(q.row(ctx, `SELECT `+dispatchCols+` FROM dispatches WHERE id = ?`, id))
	return d, notFound(err)
}

func scanDispatch(s Scanner) (*store.Dispatch, error) {
	var d store.Dispatch
	var next, lease, created, updated int64
	if err := s.Scan(&d.ID, &d.ExecutionID, &d.Status, &d.Attempt, &d.MaxAttempts, &d.ProgressAttempt,
		&d.LeaseTimeout, &next, &lease, &d.ClaimedBy, &created, &updated); err != nil {
		return nil, err
	}
	d.NextAttemptAt, d.LeaseExpiresAt, d.CreatedAt, d.UpdatedAt = fromTS(next), fromTS(lease), fromTS(created), fromTS(updated)
	return &d, nil
}

func (t *Tx) InsertDispatch(ctx context.Context, d *store.Dispatch) error {
	if t.cache != nil {
		delete(t.cache.dispatches, d.ID) // read back when next needed
	}
	return t.write(ctx, `INSERT INTO dispatches (`+dispatchCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)`,
		d.ID, d.ExecutionID, d.Status, d.Attempt, d.MaxAttempts, d.ProgressAttempt, d.LeaseTimeout,
		ts(d.NextAttemptAt), ts(d.LeaseExpiresAt), d.ClaimedBy, ts(d.CreatedAt), ts(d.UpdatedAt))
}

func (t *Tx) UpdateDispatch(ctx context.Context, d *store.Dispatch) error {
	if t.cache != nil {
		delete(t.cache.dispatches, d.ID) // read back when next needed
	}
	return t.write(ctx, `UPDATE dispatches SET status = ?, attempt = ?, progress_attempt = ?, lease_timeout = ?,
 next_attempt_at = ?, lease_expires_at = ?, claimed_by = ?, updated_at = ? WHERE id = ?`,
		d.Status, d.Attempt, d.ProgressAttempt, d.LeaseTimeout, ts(d.NextAttemptAt), ts(d.LeaseExpiresAt),
		d.ClaimedBy, ts(d.UpdatedAt), d.ID)
}

func (t *Tx) RetireDispatches(ctx context.Context, executionID, keepID string, now time.Time) error {
	if t.cache != nil {
		t.cache.retired(executionID, keepID)
	}
	return t.write(ctx, `UPDATE dispatches SET status = ?, updated_at = ? WHERE execution_id = ? AND id <> ? AND status <> ?`,
		wire.DispatchRetired, ts(now), executionID, keepID, wire.DispatchRetired)
}

// one.
func (t *Tx) Dispatch(ctx context.Context, id string) (*store.Dispatch, error) {
	if d := t.lockedDispatch; d != nil && d.ID == id {
		t.lockedDispatch = nil
		return d, nil
	}
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
