package postgres

import (
	"context"
	"database/sql"
	"database/sql/driver"
	"errors"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/stdlib"
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
	return c.conn.QueryContext(ctx, query, args...)
}

// QueryRowContext implements sqlstore.Querier: the held writes go first.
// When they fail, the transaction is aborted and so is the read; update
// reports the writes' error.
func (c *opConn) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	c.flush(ctx, "")
	return c.conn.QueryRowContext(ctx, query, args...)
}

// flush sends the held writes, then final when it is not "", in one round
// trip, and returns the first failure of this transaction.
func (c *opConn) flush(ctx context.Context, final string) error {
	if c.err != nil || (len(c.pending) == 0 && final == "") {
		return c.err
	}
	held := c.pending
	c.pending = nil
	batch := &pgx.Batch{}
	for _, w := range held {
		batch.Queue(w.query, w.args...)
	}
	if final != "" {
		batch.Queue(final)
	}
	err := c.conn.Raw(func(dc any) error {
		results := dc.(*stdlib.Conn).Conn().SendBatch(ctx, batch)
		var first error
		for _, w := range held {
			tag, err := results.Exec()
			w.sent, w.rows, w.err = true, tag.RowsAffected(), err
			if err != nil && first == nil {
				first = err
			}
		}
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

// rollbackTimeout bounds a ROLLBACK; a connection that takes longer is
// discarded instead.
const rollbackTimeout = 5 * time.Second
