package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"slices"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgtype"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/rebuno/rebuno/internal/store/sqlstore"
)

// opConn is the connection one operation's transaction runs on, as the SQL
// layer's Querier. Writes are held back and sent together with whatever
// follows them, the next read or the COMMIT, in one round trip (a pgx
// batch: one write to the socket, one reply). Each statement sent alone
// costs both processes a send and a receive, which on a small machine is
// most of what a short statement costs; a step's operations write three or
// four rows and then commit, so holding the writes saves nearly half the
// round trips without changing what is written or when it is durable.
//
// A held write's failure surfaces at the flush that sends it: the read or
// the commit that follows fails, and update reports the write's error (err),
// the first one, which is what the operation would have seen at once.
type opConn struct {
	conn    *sql.Conn
	pending []*heldWrite
	err     error
}

// heldWrite is a write waiting to be sent; its result is known once it is.
type heldWrite struct {
	c     *opConn
	ctx   context.Context
	query string
	args  []any
	sent  bool
	rows  int64
	err   error
}

// LastInsertId implements sql.Result; the store never asks for it.
func (w *heldWrite) LastInsertId() (int64, error) {
	return 0, errors.New("postgres: LastInsertId is not supported")
}

// RowsAffected implements sql.Result, sending the write (and those held
// before it) first.
func (w *heldWrite) RowsAffected() (int64, error) {
	if !w.sent {
		if err := w.c.flush(w.ctx, ""); err != nil {
			return 0, err
		}
	}
	return w.rows, w.err
}

// ExecContext implements sqlstore.Querier: the write is held.
func (c *opConn) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	if c.err != nil {
		return nil, c.err
	}
	w := &heldWrite{c: c, ctx: ctx, query: query, args: args}
	c.pending = append(c.pending, w)
	return w, nil
}

// QueryContext implements sqlstore.Querier: the held writes go first.
func (c *opConn) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	if err := c.flush(ctx, ""); err != nil {
		return nil, err
	}
	roundTrip()
	return c.conn.QueryContext(ctx, query, args...)
}

// QueryRowContext implements sqlstore.Querier: the held writes go first.
// When they fail, the transaction is aborted and so is the read; update
// reports the writes' error.
func (c *opConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	c.flush(ctx, "")
	roundTrip()
	return c.conn.QueryRowContext(ctx, query, args...)
}

// QueryRows implements sqlstore.Batcher: the held writes and the reads go in
// one round trip. Each read's row is kept, undecoded, until its Scan.
func (c *opConn) QueryRows(ctx context.Context, reads ...sqlstore.RowQuery) []sqlstore.Scanner {
	out := make([]sqlstore.Scanner, len(reads))
	if c.err != nil {
		for i := range out {
			out[i] = &bufferedRow{err: c.err}
		}
		return out
	}
	held, batch := c.startBatch()
	for _, r := range reads {
		batch.Queue(r.Query, r.Args...)
	}
	err := c.conn.Raw(func(dc any) error {
		conn := dc.(*stdlib.Conn).Conn()
		results := conn.SendBatch(ctx, batch)
		first := execHeld(results, held)
		for i := range reads {
			out[i] = bufferRow(conn.TypeMap(), results)
		}
		// Each read keeps its own failure, and Close would report a read's
		// again: only a held write's failure is the transaction's.
		results.Close()
		return first
	})
	if err != nil {
		// A held write failed: the transaction is aborted, and its reads
		// answer with the write's error, which the operation would have
		// seen had it been sent alone.
		c.err = classify(err)
		for i := range out {
			out[i] = &bufferedRow{err: c.err}
		}
	}
	return out
}

// startBatch begins a round trip: a batch holding the held writes, which
// it takes.
func (c *opConn) startBatch() ([]*heldWrite, *pgx.Batch) {
	held := c.pending
	c.pending = nil
	roundTrip()
	batch := &pgx.Batch{}
	for _, w := range held {
		batch.Queue(w.query, w.args...)
	}
	return held, batch
}

// execHeld reads the answers to the held writes at the head of a batch and
// returns the first failure.
func execHeld(results pgx.BatchResults, held []*heldWrite) error {
	var first error
	for _, w := range held {
		tag, err := results.Exec()
		w.sent, w.rows, w.err = true, tag.RowsAffected(), err
		if err != nil && first == nil {
			first = err
		}
	}
	return first
}

// bufferedRow is one read's answer from a batch: the first row's columns as
// the server sent them, decoded into the caller's values by Scan.
type bufferedRow struct {
	types  *pgtype.Map
	fields []pgconn.FieldDescription
	values [][]byte
	err    error
}

// bufferRow reads the next answer of a batch into a bufferedRow, copying
// what pgx reuses for the next one.
func bufferRow(types *pgtype.Map, results pgx.BatchResults) *bufferedRow {
	rows, err := results.Query()
	if err != nil {
		return &bufferedRow{err: err}
	}
	defer rows.Close()
	if !rows.Next() {
		if err := rows.Err(); err != nil {
			return &bufferedRow{err: err}
		}
		return &bufferedRow{err: sql.ErrNoRows}
	}
	r := &bufferedRow{types: types, fields: slices.Clone(rows.FieldDescriptions())}
	r.values = make([][]byte, len(rows.RawValues()))
	for i, v := range rows.RawValues() {
		if v != nil {
			r.values[i] = slices.Clone(v)
		}
	}
	rows.Close()
	if err := rows.Err(); err != nil {
		return &bufferedRow{err: err}
	}
	return r
}

// Scan implements sqlstore.Scanner.
func (r *bufferedRow) Scan(dest ...any) error {
	if r.err != nil {
		return r.err
	}
	return pgx.ScanRow(r.types, r.fields, r.values, dest...)
}

// flush sends the held writes, then final when it is not "", in one round
// trip, and returns the first failure of this transaction.
func (c *opConn) flush(ctx context.Context, final string) error {
	if c.err != nil || (len(c.pending) == 0 && final == "") {
		return c.err
	}
	held, batch := c.startBatch()
	if final != "" {
		batch.Queue(final)
	}
	err := c.conn.Raw(func(dc any) error {
		results := dc.(*stdlib.Conn).Conn().SendBatch(ctx, batch)
		first := execHeld(results, held)
		if final != "" {
			if _, err := results.Exec(); err != nil && first == nil {
				first = err
			}
		}
		if err := results.Close(); err != nil && first == nil {
			first = err
		}
		return first
	})
	if err != nil {
		c.err = classify(err)
	}
	return c.err
}

// rollback ends a transaction that will not commit. A connection that
// cannot roll back is discarded, so that the pool never hands out one
// inside a transaction.
func (c *opConn) rollback() {
	if len(c.pending) > 0 && !c.pending[0].sent && c.pending[0].query == "BEGIN" {
		return // nothing was sent
	}
	c.pending = nil
	c.conn.Raw(func(dc any) error {
		ctx, cancel := context.WithTimeout(context.Background(), rollbackTimeout)
		defer cancel()
		if _, err := dc.(*stdlib.Conn).Conn().Exec(ctx, "ROLLBACK"); err != nil {
			return driver.ErrBadConn
		}
		return nil
	})
}

// roundTripHook, when set (by tests), is called for each round trip an
// operation's transaction makes.
var roundTripHook atomic.Pointer[func()]

func roundTrip() {
	if hook := roundTripHook.Load(); hook != nil {
		(*hook)()
	}
}

// rollbackTimeout bounds a ROLLBACK; a connection that takes longer is
// discarded instead.
const rollbackTimeout = 5 * time.Second
