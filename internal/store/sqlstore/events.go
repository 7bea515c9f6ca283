package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"strings"

	"github.com/rebuno/rebuno/internal/store"
)

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
		m := run[0].Mark
		args := []any{id, run[n-1].Seq, run[0].Seq, encodeRun(run), markKept(m), markClosed(m), markGenerations(m)}
		query := `INSERT INTO event_runs (execution_id, last_seq, first_seq, events, mark_kept, mark_closed, mark_generations) VALUES (?,?,?,?,?,?,?)`
		if check {
			// The highest seq stored, each read from its index's end: a
			// planner that misjudges how many of a table's rows are this
			// execution's (Postgres's generic plans, made while one
			// execution fills the table) cannot turn it into a scan.
			query = `INSERT INTO event_runs (execution_id, last_seq, first_seq, events, mark_kept, mark_closed, mark_generations) SELECT ?,?,?,?,?,?,?
 WHERE COALESCE((SELECT MAX(event_seq) FROM events WHERE execution_id = ?), 0) < ?
 AND COALESCE((SELECT MAX(last_seq) FROM event_runs WHERE execution_id = ?), 0) < ?`
			args = append(args, id, first, id, first)
		}
		res, err := t.result(ctx, query, args...)
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
	rows, err := list(ctx, q, func(s Scanner) (*store.Event, error) {
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
	// Each run holds at least one event after afterSeq, so limit runs
	// fill the page. Without the bound a server that sends a result whole
	// (Postgres) would send every run after afterSeq for every page.
	runs, err := q.query(ctx, `SELECT first_seq, events FROM event_runs WHERE execution_id = ? AND last_seq > ? ORDER BY last_seq LIMIT ?`,
		executionID, afterSeq, limit)
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
