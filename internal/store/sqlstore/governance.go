package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

const approvalCols = `id, execution_id, step_id, agent_id, kind, target, status, approvers, message, timeout_at,
 decided_by, decided_at, rationale, created_at`

func scanApproval(s Scanner) (*store.Approval, error) {
	var a store.Approval
	var approvers string
	var timeout, decided, created int64
	if err := s.Scan(&a.ID, &a.ExecutionID, &a.StepID, &a.AgentID, &a.Kind, &a.Target, &a.Status, &approvers, &a.Message,
		&timeout, &a.DecidedBy, &decided, &a.Rationale, &created); err != nil {
		return nil, err
	}
	a.TimeoutAt, a.DecidedAt, a.CreatedAt = fromTS(timeout), fromTS(decided), fromTS(created)
	var err error
	a.Approvers, err = decodeList(approvers)
	return &a, err
}

func (q *Queries) approvals(ctx context.Context, query string, args ...any) ([]*store.Approval, error) {
	return list(ctx, q, scanApproval, query, args...)
}

func (q *Queries) Approval(ctx context.Context, id string) (*store.Approval, error) {
	a, err := scanApproval(q.row(ctx, `SELECT `+approvalCols+` FROM approvals WHERE id = ?`, id))
	return a, notFound(err)
}

func (q *Queries) PendingApprovalForStep(ctx context.Context, executionID, stepID string) (*store.Approval, error) {
	a, err := scanApproval(q.row(ctx, `SELECT `+approvalCols+` FROM approvals WHERE execution_id = ? AND step_id = ? AND status = ?`,
		executionID, stepID, wire.ApprovalPending))
	return a, notFound(err)
}

func (q *Queries) PendingApprovals(ctx context.Context, executionID string) ([]*store.Approval, error) {
	return q.approvals(ctx, `SELECT `+approvalCols+` FROM approvals WHERE execution_id = ? AND status = ? ORDER BY id`,
		executionID, wire.ApprovalPending)
}

func (q *Queries) ListApprovals(ctx context.Context, f store.ApprovalFilter) ([]*store.Approval, error) {
	where := []string{"status = ?"}
	args := []any{f.Status}
	if f.ExecutionID != "" {
		where = append(where, "execution_id = ?")
		args = append(args, f.ExecutionID)
	}
	if f.After != "" {
		where = append(where, "id > ?")
		args = append(args, f.After)
	}
	args = append(args, f.Limit)
	return q.approvals(ctx, `SELECT `+approvalCols+` FROM approvals WHERE `+strings.Join(where, " AND ")+` ORDER BY id LIMIT ?`, args...)
}

func (q *Queries) ExpiredApprovals(ctx context.Context, now time.Time, limit int) ([]store.ApprovalRef, error) {
	return list(ctx, q, func(s Scanner) (store.ApprovalRef, error) {
		var r store.ApprovalRef
		err := s.Scan(&r.ID, &r.ExecutionID)
		return r, err
	}, `SELECT id, execution_id FROM approvals WHERE status = 'pending' AND timeout_at <= ?
 ORDER BY timeout_at LIMIT ?`, ts(now), limit)
}

func (q *Queries) NextApprovalTimeout(ctx context.Context) (time.Time, error) {
	return q.minTime(ctx, `SELECT MIN(timeout_at) FROM approvals WHERE status = 'pending'`)
}

func (t *Tx) InsertApproval(ctx context.Context, a *store.Approval) error {
	return t.exec(ctx, `INSERT INTO approvals (`+approvalCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		a.ID, a.ExecutionID, a.StepID, a.AgentID, a.Kind, a.Target, a.Status, encodeList(a.Approvers), a.Message,
		ts(a.TimeoutAt), a.DecidedBy, ts(a.DecidedAt), a.Rationale, ts(a.CreatedAt))
}

func (t *Tx) UpdateApproval(ctx context.Context, a *store.Approval) error {
	return t.exec(ctx, `UPDATE approvals SET status = ?, decided_by = ?, decided_at = ?, rationale = ? WHERE id = ?`,
		a.Status, a.DecidedBy, ts(a.DecidedAt), a.Rationale, a.ID)
}

func (q *Queries) RateLimitMark(ctx context.Context, executionID, stepID string) (time.Time, bool, error) {
	var at int64
	err := q.row(ctx, `SELECT audited_at FROM rate_limit_marks WHERE execution_id = ? AND step_id = ?`, executionID, stepID).Scan(&at)
	if errors.Is(err, sql.ErrNoRows) {
		return time.Time{}, false, nil
	}
	return fromTS(at), err == nil, err
}

func (t *Tx) SetRateLimitMark(ctx context.Context, executionID, stepID string, at time.Time) error {
	return t.exec(ctx, `INSERT INTO rate_limit_marks (execution_id, step_id, audited_at) VALUES (?,?,?)
 ON CONFLICT (execution_id, step_id) DO UPDATE SET audited_at = excluded.audited_at`, executionID, stepID, ts(at))
}

func (t *Tx) DeleteExecutionMarks(ctx context.Context, executionID string) error {
	return t.exec(ctx, `DELETE FROM rate_limit_marks WHERE execution_id = ?`, executionID)
}
