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
	"runtime/debug"
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

// Batcher is a Querier that sends single-row reads, and the writes it
// holds before them, in one round trip (Postgres, where each round trip
// costs both processes a send, a receive and a wake-up). Each read still
// runs as a statement of its own, after the ones before it. Where the
// transaction's Querier is one, every single-row read goes through it.
type Batcher interface {
	QueryRows(ctx context.Context, reads ...RowQuery) []Scanner
}

// RowQuery is one read of a Batcher's round trip, its placeholders already
// in the backend's syntax.
type RowQuery struct {
	Query string
	Args  []any
}

// Scanner reads one row's columns: the answer to a single-row read (or
// sql.ErrNoRows when there is none), or the current row of many.
type Scanner interface{ Scan(dest ...any) error }

// Dialect is the seam between SQL backends: everything else is the same SQL.
type Dialect interface {
	// Rebind rewrites placeholders into the backend's syntax. Queries use
	// '?' and, to bind one value for many rows, '?1': as in SQLite, a bare
	// '?' then takes the number after the largest one used so far.
	Rebind(query string) string
	// IndexedBy follows a table name to make a query use the named index,
	// where a planner without statistics would pick one that reads rows in
	// proportion to the history; "" where the backend needs no hint.
	IndexedBy(index string) string
	// RowLock is the clause that follows a read in a write transaction to
	// lock the rows it returns (see RowLock); "" where the backend runs one
	// writer at a time and never needs one.
	RowLock(mode RowLock) string
	// KeyLock is a statement that takes a lock, held until the transaction
	// ends, on the one int64 it binds: for a name that has no row to lock
	// yet. "" where writers are serialised.
	KeyLock() string
	// Classify maps a driver error to the store's errors: a lost connection
	// or a database that cannot serve becomes store.ErrUnavailable, so that
	// callers answer "retry" rather than "bug". Other errors, nil and
	// sql.ErrNoRows come back unchanged.
	Classify(err error) error
}

// RowLock is how strongly a read in a write transaction locks its rows,
// where writers run side by side (Postgres): docs/protocol/operations.md §2.2 serialises operations on
// an execution with a row lock inside the operation's own transaction.
type RowLock int

const (
	// LockUpdate: the transaction will change the rows; others wait.
	LockUpdate RowLock = iota
	// LockUpdateSkip: as LockUpdate, but rows another transaction holds
	// are left out of the answer instead of waited for.
	LockUpdateSkip
	// LockKeyShare: the rows must not be deleted (or their key changed)
	// before the transaction ends; other readers and updates of other
	// columns go on.
	LockKeyShare
)

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
	// locked is the head LockExecution read, until the transaction writes;
	// lockedDispatch the execution's dispatch, where the lock read brought
	// it (Batcher).
	locked         *store.Execution
	lockedDispatch *store.Dispatch
}

// NewTx returns a Tx writing through q.
func NewTx(q Querier, d Dialect) *Tx { return &Tx{Queries: Queries{Q: q, D: d}} }

// NewCachedTx returns a Tx writing through q that reads and maintains c
// (see RowCache for who may use one).
func NewCachedTx(q Querier, d Dialect, c *RowCache) *Tx {
	return &Tx{Queries: Queries{Q: q, D: d}, cache: c}
}

// exec runs a write. One that may change cached rows in a way the cache does
// not follow clears it: the methods that keep it exact use write instead.
func (t *Tx) exec(ctx context.Context, query string, args ...any) error {
	if t.cache != nil && touches(query) {
		t.cache.Clear()
	}
	return t.write(ctx, query, args...)
}

// write runs a write of the transaction, leaving the row cache to its
// caller.
func (t *Tx) write(ctx context.Context, query string, args ...any) error {
	_, err := t.result(ctx, query, args...)
	return err
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

// RunUnit runs one caller's transaction function, turning a panic into an
// error so that a bug in one request rolls back its transaction instead of
// taking down the process (and, on SQLite, the writer every request shares).
func RunUnit(ctx context.Context, fn func(context.Context, store.Tx) error, tx store.Tx) (err error) {
	defer func() {
		if r := recover(); r != nil {
			err = fmt.Errorf("panic in transaction: %v\n%s", r, debug.Stack())
		}
	}()
	return fn(ctx, tx)
}

var (
	_ store.Reader = (*Queries)(nil)
	_ store.Tx     = (*Tx)(nil)
)

func (q *Queries) exec(ctx context.Context, query string, args ...any) error {
	_, err := q.result(ctx, query, args...)
	return err
}

// result runs a write of the transaction, which forgets the rows its lock
// read brought.
func (t *Tx) result(ctx context.Context, query string, args ...any) (sql.Result, error) {
	t.locked, t.lockedDispatch = nil, nil
	return t.Queries.result(ctx, query, args...)
}

// result runs a write and returns what the driver says of it.
func (q *Queries) result(ctx context.Context, query string, args ...any) (sql.Result, error) {
	res, err := q.Q.ExecContext(ctx, q.D.Rebind(query), args...)
	return res, q.D.Classify(err)
}

func (q *Queries) query(ctx context.Context, query string, args ...any) (*rows, error) {
	r, err := q.Q.QueryContext(ctx, q.D.Rebind(query), args...)
	if err != nil {
		return nil, q.D.Classify(err)
	}
	return &rows{Rows: r, d: q.D}, nil
}

func (q *Queries) row(ctx context.Context, query string, args ...any) row {
	query = q.D.Rebind(query)
	if b, ok := q.Q.(Batcher); ok {
		return row{r: b.QueryRows(ctx, RowQuery{Query: query, Args: args})[0], d: q.D}
	}
	return row{r: q.Q.QueryRowContext(ctx, query, args...), d: q.D}
}

// row and rows are the driver's, with errors classified (Dialect.Classify):
// a connection lost while reading shows as store.ErrUnavailable wherever
// it surfaces.
type row struct {
	r Scanner
	d Dialect
}

func (r row) Scan(dest ...any) error { return r.d.Classify(r.r.Scan(dest...)) }

type rows struct {
	*sql.Rows
	d Dialect
}

func (r *rows) Scan(dest ...any) error { return r.d.Classify(r.Rows.Scan(dest...)) }

func (r *rows) Err() error { return r.d.Classify(r.Rows.Err()) }

// list runs a query and scans each row; the answer is [] rather than nil
// when there are none.
func list[T any](ctx context.Context, q *Queries, scan func(Scanner) (T, error), query string, args ...any) ([]T, error) {
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
