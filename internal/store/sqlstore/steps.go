package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"strings"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

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
 start_info, body_execution_id, body_step_id, submitted_seq`

func scanStep(s Scanner) (*store.Step, error) {
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
	return list(ctx, q, func(s Scanner) (*store.Step, error) {
		st := &store.Step{ExecutionID: executionID}
		var started, completed int64
		var res string
		err := s.Scan(&st.StepID, &st.Order, &st.Kind, &st.Target, &st.ArgsHash, &st.Occurrence, &st.Status, &st.Idempotency,
			&st.ErrorReason, &res, &started, &completed, &st.TerminalSeq, &st.BodyExecutionID, &st.BodyStepID, &st.SubmittedSeq)
		if err != nil {
			return nil, err
		}
		st.StartedAt, st.CompletedAt = fromTS(started), fromTS(completed)
		if st.Resources, err = decodeList(res); err != nil {
			return nil, err
		}
		return st, nil
	}, `SELECT step_id, step_order, kind, target, args_hash, occurrence, status, idempotency, error_reason, resources,
 started_at, completed_at, terminal_seq, body_execution_id, body_step_id, submitted_seq FROM steps WHERE execution_id = ? AND step_order > ?
 AND status IN ('succeeded','failed','denied') AND terminal_seq BETWEEN 1 AND ? ORDER BY step_order LIMIT ?`,
		executionID, afterOrder, upTo, limit)
}

func (q *Queries) OpenSteps(ctx context.Context, executionID string) ([]*store.Step, error) {
	// Only a terminal transition asks, once per execution, so the scan of the
	// execution's steps in recording order costs less than an index that
	// every step would have to maintain twice.
	return list(ctx, q, scanStep, `SELECT `+stepCols+stepFrom+` WHERE s.execution_id = ? AND s.status IN ('allowed','executing') ORDER BY s.step_order`, executionID)
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
// bound variables (23 per step).
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
	args := make([]any, 0, 23*len(steps))
	for i, s := range steps {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString("(?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?,?)")
		// A copy stores no bodies of its own.
		body, result, errBody := s.Args, s.Result, s.Error
		if s.BodyStepID != "" {
			body, result, errBody = nil, nil, nil
		}
		args = append(args, s.ExecutionID, s.StepID, s.Order, s.Kind, s.Target, s.ArgsHash, s.Occurrence, s.Status,
			s.Idempotency, body, result, errBody, s.ErrorReason, encodeList(s.Resources), ts(s.StartedAt),
			ts(s.CompletedAt), s.DispatchID, s.Attempt, s.TerminalSeq, s.StartInfo, s.BodyExecutionID, s.BodyStepID, s.SubmittedSeq)
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
	args := make([]any, 0, 1+16*len(steps))
	args = append(args, steps[0].ExecutionID)
	for i, s := range steps {
		if i > 0 {
			b.WriteByte(',')
		}
		// A bare ? after ?1 takes the number after the largest one used so
		// far, so every row's own values follow in order (see Dialect.Rebind).
		b.WriteString("(?1,?,?,?,?,?,?,?,?,NULL,NULL,NULL,?,?,?,?,'',0,?,NULL,?,?,?)")
		args = append(args, s.StepID, s.Order, s.Kind, s.Target, s.ArgsHash, s.Occurrence, s.Status, s.Idempotency,
			s.ErrorReason, encodeList(s.Resources), ts(s.StartedAt), ts(s.CompletedAt), s.TerminalSeq,
			s.BodyExecutionID, s.BodyStepID, s.SubmittedSeq)
	}
	return t.exec(ctx, b.String(), args...)
}

func (t *Tx) UpdateStep(ctx context.Context, s *store.Step) error {
	return t.exec(ctx, `UPDATE steps SET status = ?, idempotency = ?, result = ?, error = ?, error_reason = ?,
 started_at = ?, completed_at = ?, dispatch_id = ?, attempt = ?, terminal_seq = ?, start_info = ? WHERE execution_id = ? AND step_id = ?`,
		s.Status, s.Idempotency, s.Result, s.Error, s.ErrorReason, ts(s.StartedAt), ts(s.CompletedAt),
		s.DispatchID, s.Attempt, s.TerminalSeq, s.StartInfo, s.ExecutionID, s.StepID)
}
