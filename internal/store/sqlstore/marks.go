package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"slices"
	"strings"

	"github.com/rebuno/rebuno/internal/store"
)

// Marks and the reads of a fork that reads its source in place
// (docs/architecture.md, "Forks").

func markOf(kept, closed sql.NullInt64, generations []byte) *store.Mark {
	if !kept.Valid || !closed.Valid {
		return nil
	}
	return &store.Mark{Kept: kept.Int64, Closed: closed.Int64, Generations: generations}
}

func markKept(m *store.Mark) any {
	if m == nil {
		return nil
	}
	return m.Kept
}

func markClosed(m *store.Mark) any {
	if m == nil {
		return nil
	}
	return m.Closed
}

func markGenerations(m *store.Mark) any {
	if m == nil || m.Generations == nil {
		return nil
	}
	return m.Generations
}

func cloneMark(m *store.Mark) *store.Mark {
	if m == nil {
		return nil
	}
	cp := *m
	cp.Generations = slices.Clone(m.Generations)
	return &cp
}

// EventRun implements store.Reader: one seek on the runs' key.
func (q *Queries) EventRun(ctx context.Context, executionID string, seq int64) (*store.EventRun, error) {
	r := &store.EventRun{}
	var kept, closed sql.NullInt64
	var generations, data []byte
	err := q.row(ctx, `SELECT first_seq, last_seq, mark_kept, mark_closed, mark_generations, events FROM event_runs
 WHERE execution_id = ? AND last_seq >= ? ORDER BY last_seq LIMIT 1`, executionID, seq).
		Scan(&r.FirstSeq, &r.LastSeq, &kept, &closed, &generations, &data)
	if errors.Is(err, sql.ErrNoRows) || err == nil && r.FirstSeq > seq {
		return nil, store.ErrNotFound
	}
	if err != nil {
		return nil, err
	}
	r.Mark = markOf(kept, closed, generations)
	err = decodeRun(executionID, r.FirstSeq, data, 0, func(ev *store.Event) bool {
		r.Events = append(r.Events, ev)
		return true
	})
	return r, err
}

func (q *Queries) StepByOrder(ctx context.Context, executionID string, order int64) (*store.Step, error) {
	s := &store.Step{ExecutionID: executionID}
	err := q.row(ctx, `SELECT step_id, step_order, kind, target, args_hash, occurrence, status, error_reason, terminal_seq, submitted_seq
 FROM steps WHERE execution_id = ? AND step_order = ?`, executionID, order).
		Scan(&s.StepID, &s.Order, &s.Kind, &s.Target, &s.ArgsHash, &s.Occurrence, &s.Status, &s.ErrorReason, &s.TerminalSeq, &s.SubmittedSeq)
	return s, notFound(err)
}

func (q *Queries) StepsByID(ctx context.Context, executionID string, ids []string) ([]*store.Step, error) {
	var out []*store.Step
	// Pages of 500 keep each statement well under SQLite's bound variables.
	for start := 0; start < len(ids); start += 500 {
		part := ids[start:min(len(ids), start+500)]
		args := make([]any, 0, len(part)+1)
		args = append(args, executionID)
		for _, id := range part {
			args = append(args, id)
		}
		page, err := list(ctx, q, func(s Scanner) (*store.Step, error) {
			st := &store.Step{ExecutionID: executionID}
			err := s.Scan(&st.StepID, &st.Order, &st.Kind, &st.Target, &st.ArgsHash, &st.Occurrence, &st.Status, &st.TerminalSeq)
			return st, err
		}, `SELECT step_id, step_order, kind, target, args_hash, occurrence, status, terminal_seq FROM steps
 WHERE execution_id = ? AND step_id IN (?`+strings.Repeat(",?", len(part)-1)+`)`, args...)
		if err != nil {
			return nil, err
		}
		out = append(out, page...)
	}
	return out, nil
}

func (q *Queries) StepsByIdentity(ctx context.Context, executionID, kind, target, argsHash string) ([]*store.Step, error) {
	return list(ctx, q, scanStep, `SELECT `+stepCols+stepFrom+`
 WHERE s.execution_id = ? AND s.kind = ? AND s.target = ? AND s.args_hash = ? ORDER BY s.occurrence`,
		executionID, kind, target, argsHash)
}

func (q *Queries) HasForksInPlace(ctx context.Context, executionID string) (bool, error) {
	var one int
	err := q.row(ctx, `SELECT 1 FROM executions WHERE forked_from = ? AND fork_in_place = 1 LIMIT 1`, executionID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}
