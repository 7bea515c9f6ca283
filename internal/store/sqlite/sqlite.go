// Package sqlite is the embedded store behind `rebuno dev`: one SQLite file in
// WAL mode with synchronous commits.
//
// Throughput comes from group commit. A single writer goroutine owns the only
// write connection; it takes every transaction that is waiting, runs each in
// a savepoint of one shared SQLite transaction, and commits them with one
// fsync. A transaction that fails rolls back to its savepoint without
// touching the others, and no caller is answered before the shared commit is
// durable, so atomicity and durability per request are what they would be
// with one commit each.
package sqlite

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	moderncsqlite "modernc.org/sqlite" // also registers the "sqlite" driver

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlstore"
)

// checkpointEvery is how often the checkpointer runs while there are writes;
// walSafetyPages is where the writer checkpoints itself if the checkpointer
// falls behind (4 KiB pages).
const (
	checkpointEvery = 500 * time.Millisecond
	walSafetyPages  = 16384
)

// largeCommitPages is the size of a commit (pages it wrote to the WAL) after
// which the checkpointer runs at once rather than at its next tick. A fork of
// a long history writes thousands of pages in one commit; copied into the
// database on the next tick, they would share the core with whatever request
// came next (often the next fork). Commits of steps write tens of pages, and
// a busy group commit a few hundred, so only such bulk writes trigger it.
const largeCommitPages = 1024

// MaxBatch bounds how many transactions share one commit, so that one commit
// never holds the first caller for long.
const MaxBatch = 256

// Observer receives commit measurements (the metrics package implements it).
type Observer interface {
	ObserveCommit(batchSize int, d time.Duration)
}

// Options configure Open.
type Options struct {
	// Path is the database file, or ":memory:" for a throwaway database kept
	// in a temporary file that is removed on Close.
	Path     string
	Observer Observer
	Logger   *slog.Logger
	// CheckpointEvery is how often the background checkpointer copies the
	// write-ahead log into the database while there are writes; 0 means the
	// default (500 ms). A negative value turns it off and leaves checkpoints
	// to the writer at walSafetyPages, so that tests can count the pages
	// commits write from the log's growth.
	CheckpointEvery time.Duration
	// NoRowCache makes the writer read execution and dispatch rows from SQL
	// every time (for measurements and tests of the cache).
	NoRowCache bool
}

// Store is the SQLite implementation of store.Store.
type Store struct {
	write    *sql.DB
	read     *sql.DB
	readQ    *sqlstore.Queries
	jobs     chan *job
	stop     chan struct{}
	stopped  chan struct{}
	obs      Observer
	log      *slog.Logger
	tempDir  string
	path     string
	Durable  bool
	closeMux sync.Once

	ckpt         *sql.DB
	wrote        atomic.Bool
	checkpointed chan struct{}
	soon         chan struct{} // a large commit asks for a checkpoint now
	soonAsked    atomic.Int64  // how many times (for tests)

	// rows caches execution heads and dispatches for the writer's
	// transactions (nil when turned off); dataVersion is SQLite's count of
	// other connections' commits when the writer last looked.
	rows        *sqlstore.RowCache
	dataVersion int64

	notifier store.LocalNotifier
	lock     *fileLock
}

type job struct {
	ctx  context.Context
	fn   func(ctx context.Context, tx store.Tx) error
	done chan error
	tx   *sqlstore.Tx
	err  error
}

// dialect is SQLite's side of the SQL seam. One writer runs at a time, so
// transactions need no locks; the writer wraps failures of its own
// transaction in store.ErrUnavailable (runBatch), which is where SQLite's
// I/O errors surface.
type dialect struct{}

func (dialect) Rebind(q string) string          { return q }
func (dialect) RowLock(sqlstore.RowLock) string { return "" }
func (dialect) KeyLock() string                 { return "" }
func (dialect) Classify(err error) error        { return err }

// IndexedBy uses SQLite's own clause, which also refuses to prepare a query
// that cannot use the index: a mistake shows up as an error, not as a scan.
func (dialect) IndexedBy(index string) string { return " INDEXED BY " + index }

// Open opens (creating if needed) the database and starts the writer.
func Open(opt Options) (*Store, error) {
	s := &Store{jobs: make(chan *job, 4*MaxBatch), stop: make(chan struct{}), stopped: make(chan struct{}),
		obs: opt.Observer, log: opt.Logger, Durable: true}
	if !opt.NoRowCache {
		s.rows = sqlstore.NewRowCache()
	}
	if s.log == nil {
		s.log = slog.Default()
	}
	path := opt.Path
	syncMode := "FULL"
	if path == ":memory:" {
		dir, err := os.MkdirTemp("", "rebuno-mem-")
		if err != nil {
			return nil, fmt.Errorf("create temporary database folder: %w", err)
		}
		s.tempDir = dir
		path = filepath.Join(dir, "rebuno.db")
		syncMode = "OFF"
		s.Durable = false
	}
	if err := prepareFile(path, s.log); err != nil {
		s.removeTemp()
		return nil, err
	}
	lock, err := acquire(path)
	if err != nil {
		s.removeTemp()
		return nil, err
	}
	s.lock = lock
	opened := false
	defer func() {
		if !opened {
			lock.release()
		}
	}()
	s.path = path
	base := "file:" + (&url.URL{Path: path}).EscapedPath() + "?_pragma=journal_mode(WAL)&_pragma=busy_timeout(5000)&_pragma=foreign_keys(0)"
	// Savepoint journals stay in memory (they never need to survive a crash:
	// the WAL does), and a larger page cache saves re-reading hot pages.
	// The writer never checkpoints below walSafetyPages; the checkpointer
	// does it sooner, off the writer's path.
	writeDSN := base + "&_pragma=synchronous(" + syncMode + ")&_pragma=temp_store(MEMORY)&_pragma=cache_size(-8192)" +
		"&_pragma=wal_autocheckpoint(" + strconv.Itoa(walSafetyPages) + ")"
	if s.write, err = sql.Open("sqlite", writeDSN); err != nil {
		s.removeTemp()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	s.write.SetMaxOpenConns(1)
	s.write.SetMaxIdleConns(1)
	s.write.SetConnMaxLifetime(0)
	if err := migrate(s.write); err != nil {
		s.write.Close()
		s.removeTemp()
		return nil, err
	}
	if s.read, err = sql.Open("sqlite", base+"&_pragma=query_only(1)"); err != nil {
		s.write.Close()
		s.removeTemp()
		return nil, fmt.Errorf("open database %s: %w", path, err)
	}
	s.read.SetMaxOpenConns(8)
	s.read.SetMaxIdleConns(8)
	s.readQ = &sqlstore.Queries{Q: newStmtCache(s.read.PrepareContext, s.read), D: dialect{}}

	if s.ckpt, err = sql.Open("sqlite", base); err != nil {
		close(s.stopped) // no writer runs yet
		s.Close()
		return nil, fmt.Errorf("open checkpoint connection: %w", err)
	}
	s.ckpt.SetMaxOpenConns(1)
	s.checkpointed = make(chan struct{})
	s.soon = make(chan struct{}, 1)
	every := opt.CheckpointEvery
	if every == 0 {
		every = checkpointEvery
	}
	go s.checkpointer(s.ckpt, every)

	conn, err := s.write.Conn(context.Background())
	if err != nil {
		close(s.stopped) // no writer runs yet
		s.Close()
		return nil, fmt.Errorf("open write connection: %w", err)
	}
	go s.writer(conn)
	opened = true
	return s, nil
}

// prepareFile creates the folder (0700) and the file (0600) before SQLite
// does, because agent secrets are stored in it (docs/protocol/configuration.md §3).
func prepareFile(path string, log *slog.Logger) error {
	dir := filepath.Dir(path)
	if _, err := os.Stat(dir); errors.Is(err, os.ErrNotExist) {
		if err := os.MkdirAll(dir, 0o700); err != nil {
			return fmt.Errorf("create database folder %s: %w", dir, err)
		}
	}
	// Create it, or find it there: one call, so that two kernels started
	// together on a new file cannot both see it missing and one fail to
	// create it (the file lock decides which of them keeps it).
	f, err := os.OpenFile(path, os.O_CREATE|os.O_EXCL|os.O_RDWR, 0o600)
	if err == nil {
		return f.Close()
	}
	if !errors.Is(err, os.ErrExist) {
		return fmt.Errorf("create database %s: %w", path, err)
	}
	st, err := os.Stat(path)
	switch {
	case err != nil:
		return fmt.Errorf("stat database %s: %w", path, err)
	case st.IsDir():
		return fmt.Errorf("database path %s is a folder", path)
	case st.Mode().Perm()&0o077 != 0:
		log.Warn("database file is readable by other users; it holds agent secrets", "path", path, "mode", st.Mode().Perm().String())
	}
	return nil
}

func migrate(db *sql.DB) error {
	ctx := context.Background()
	if _, err := db.ExecContext(ctx, `CREATE TABLE IF NOT EXISTS schema_version (version INTEGER NOT NULL)`); err != nil {
		return fmt.Errorf("migrate: %w", err)
	}
	var v int
	err := db.QueryRowContext(ctx, `SELECT version FROM schema_version`).Scan(&v)
	if errors.Is(err, sql.ErrNoRows) {
		if _, err := db.ExecContext(ctx, `INSERT INTO schema_version (version) VALUES (0)`); err != nil {
			return fmt.Errorf("migrate: %w", err)
		}
	} else if err != nil {
		return fmt.Errorf("migrate: read schema version: %w", err)
	}
	if v > len(migrations) {
		return fmt.Errorf("database schema version %d is newer than this binary knows (%d); use a newer rebuno", v, len(migrations))
	}
	for i := v; i < len(migrations); i++ {
		tx, err := db.BeginTx(ctx, nil)
		if err != nil {
			return fmt.Errorf("migrate to %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate to %d: %w", i+1, err)
		}
		if _, err := tx.ExecContext(ctx, `UPDATE schema_version SET version = ?`, i+1); err != nil {
			tx.Rollback()
			return fmt.Errorf("migrate to %d: %w", i+1, err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("migrate to %d: %w", i+1, err)
		}
	}
	return nil
}

// Path is the database file in use.
func (s *Store) Path() string { return s.path }

// Read implements store.Store.
func (s *Store) Read() store.Reader { return s.readQ }

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.read.QueryRowContext(ctx, `SELECT 1`).Scan(&one); err != nil {
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	return nil
}

// Notifier implements store.Store: one process owns the file (Open takes an
// exclusive lock on it), so notifications stay in process.
func (s *Store) Notifier() store.Notifier { return &s.notifier }

// Leading implements store.Store: the only process on the file leads.
func (s *Store) Leading() bool { return true }

// TryUpdate implements store.Store. The single writer never leaves a lock
// held between transactions, so this is Update.
func (s *Store) TryUpdate(ctx context.Context, lockExecutionID string, fn func(ctx context.Context, tx store.Tx) error) error {
	return s.Update(ctx, lockExecutionID, fn)
}

// Update implements store.Store. The lock argument is not needed: the single
// writer serialises every transaction.
func (s *Store) Update(ctx context.Context, _ string, fn func(ctx context.Context, tx store.Tx) error) error {
	j := &job{ctx: ctx, fn: fn, done: make(chan error, 1)}
	select {
	case s.jobs <- j:
	case <-ctx.Done():
		return ctx.Err()
	case <-s.stop:
		return fmt.Errorf("%w: store closed", store.ErrUnavailable)
	}
	// Once queued, wait for the outcome even if the caller gives up: the
	// transaction may commit, and the caller must not report otherwise.
	select {
	case err := <-j.done:
		return err
	case <-s.stopped:
		select {
		case err := <-j.done:
			return err
		default:
			return fmt.Errorf("%w: store closed", store.ErrUnavailable)
		}
	}
}

func (s *Store) writer(conn *sql.Conn) {
	defer close(s.stopped)
	defer conn.Close()
	q := newStmtCache(conn.PrepareContext, conn)
	defer q.close()
	ctx := context.Background()
	batch := make([]*job, 0, MaxBatch)
	for {
		batch = batch[:0]
		// Queued transactions go before a stop, as Close promises.
		select {
		case j := <-s.jobs:
			batch = append(batch, j)
		default:
			select {
			case j := <-s.jobs:
				batch = append(batch, j)
			case <-s.stop:
				return
			}
		}
		// Yield before draining: a send to s.jobs hands the CPU straight to
		// this goroutine, so with GOMAXPROCS=1 the other requests never got
		// to enqueue and every batch held one transaction (no group commit).
		runtime.Gosched()
	drain:
		for len(batch) < MaxBatch {
			select {
			case j := <-s.jobs:
				batch = append(batch, j)
			default:
				break drain
			}
		}
		s.runBatch(ctx, conn, q, batch)
	}
}

func (s *Store) runBatch(ctx context.Context, conn *sql.Conn, q *stmtCache, batch []*job) {
	start := time.Now()
	fail := func(err error) { // the whole transaction is rolled back
		s.forgetRows()
		for _, j := range batch {
			if j.err == nil {
				j.err = err
			}
			j.done <- j.err
		}
	}
	if _, err := q.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		fail(fmt.Errorf("%w: begin: %v", store.ErrUnavailable, err))
		return
	}
	if err := s.checkRowCache(ctx, q); err != nil {
		q.ExecContext(ctx, "ROLLBACK")
		fail(fmt.Errorf("%w: begin: %v", store.ErrUnavailable, err))
		return
	}
	// A transaction alone in its batch needs no savepoint: rolling back the
	// whole SQLite transaction undoes exactly its writes.
	alone := len(batch) == 1
	committed := 0
	for _, j := range batch {
		if err := j.ctx.Err(); err != nil {
			j.err = err
			continue
		}
		if !alone {
			if _, err := q.ExecContext(ctx, "SAVEPOINT unit"); err != nil {
				q.ExecContext(ctx, "ROLLBACK")
				fail(fmt.Errorf("%w: savepoint: %v", store.ErrUnavailable, err))
				return
			}
		}
		tx := sqlstore.NewCachedTx(q, dialect{}, s.rows)
		err := sqlstore.RunUnit(ctx, j.fn, tx)
		if err != nil {
			s.forgetRows() // its writes are undone
		}
		switch {
		case err != nil && alone:
			j.err = err
		case err != nil:
			if _, rerr := q.ExecContext(ctx, "ROLLBACK TO unit"); rerr != nil {
				q.ExecContext(ctx, "ROLLBACK")
				fail(fmt.Errorf("%w: rollback to savepoint: %v", store.ErrUnavailable, rerr))
				return
			}
			j.err = err
		default:
			j.tx = tx
			committed++
		}
		if !alone {
			if _, err := q.ExecContext(ctx, "RELEASE unit"); err != nil {
				q.ExecContext(ctx, "ROLLBACK")
				fail(fmt.Errorf("%w: release savepoint: %v", store.ErrUnavailable, err))
				return
			}
		}
	}
	end := "COMMIT"
	if committed == 0 {
		end = "ROLLBACK"
	}
	if _, err := q.ExecContext(ctx, end); err != nil {
		q.ExecContext(ctx, "ROLLBACK")
		fail(fmt.Errorf("%w: commit: %v", store.ErrUnavailable, err))
		return
	}
	if committed > 0 {
		s.wrote.Store(true)
		if walPagesWritten(conn) >= largeCommitPages {
			s.soonAsked.Add(1)
			select {
			case s.soon <- struct{}{}:
			default: // one is pending already
			}
		}
	}
	if s.obs != nil {
		s.obs.ObserveCommit(len(batch), time.Since(start))
	}
	for _, j := range batch {
		if j.err == nil {
			j.tx.Committed()
		}
		j.done <- j.err
	}
}

// checkRowCache clears the row cache when another connection has
// committed since the writer last looked: only the writer writes rows, but a
// second process opened on the same file would.
func (s *Store) checkRowCache(ctx context.Context, q *stmtCache) error {
	if s.rows == nil {
		return nil
	}
	var v int64
	if err := q.QueryRowContext(ctx, "PRAGMA data_version").Scan(&v); err != nil {
		return err
	}
	if v != s.dataVersion {
		s.rows.Clear()
		s.dataVersion = v
	}
	return nil
}

func (s *Store) forgetRows() {
	if s.rows != nil {
		s.rows.Clear()
	}
}

// checkpointer copies the write-ahead log into the database file from its own
// connection, off the writer's path. SQLite would otherwise checkpoint inside
// a commit, holding every caller of that batch; checkpointing on a timer also
// copies a page rewritten by many commits once instead of once per 1,000
// frames.
func (s *Store) checkpointer(db *sql.DB, every time.Duration) {
	defer close(s.checkpointed)
	if every < 0 {
		<-s.stop
		return
	}
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-s.stop:
			return
		case <-s.soon:
			s.wrote.Store(false)
		case <-t.C:
			if !s.wrote.Swap(false) {
				continue
			}
		}
		if _, err := db.Exec("PRAGMA wal_checkpoint(PASSIVE)"); err != nil {
			s.log.Warn("checkpoint failed", "error", err)
		}
		if checkpointHook != nil {
			checkpointHook()
		}
	}
}

// walPagesWritten is how many pages the connection has written to the WAL
// since the last call: SQLite's own count, so nothing is measured twice.
func walPagesWritten(conn *sql.Conn) int {
	n := 0
	_ = conn.Raw(func(dc any) error {
		if st, ok := dc.(moderncsqlite.DBStatus); ok {
			n, _, _ = st.Status(moderncsqlite.DBStatusCacheWrite, true)
		}
		return nil
	})
	return n
}

// Close stops the writer after the transactions already queued and closes the
// database.
func (s *Store) Close() error {
	var err error
	s.closeMux.Do(func() {
		close(s.stop)
		<-s.stopped
		if s.checkpointed != nil {
			<-s.checkpointed
			s.ckpt.Close()
		}
		s.readQ.Q.(*stmtCache).close()
		err = errors.Join(s.read.Close(), s.write.Close())
		s.lock.release()
		s.removeTemp()
	})
	return err
}

func (s *Store) removeTemp() {
	if s.tempDir != "" {
		os.RemoveAll(s.tempDir)
	}
}

// stmtCache prepares each distinct query once per connection pool.
type stmtCache struct {
	mu      sync.Mutex
	prepare func(ctx context.Context, query string) (*sql.Stmt, error)
	direct  sqlstore.Querier
	stmts   map[string]*sql.Stmt
}

// maxCached bounds the cache: queries built with a variable number of
// placeholders beyond it run unprepared.
const maxCached = 512

type preparer interface {
	sqlstore.Querier
}

func newStmtCache(prepare func(ctx context.Context, query string) (*sql.Stmt, error), direct preparer) *stmtCache {
	return &stmtCache{prepare: prepare, direct: direct, stmts: map[string]*sql.Stmt{}}
}

// checkpointHook, when set (by tests), runs after each background checkpoint.
var checkpointHook func()

// preparedHook, when set (by tests), sees every query the store prepares
// or runs for the first time.
var preparedHook func(query string)

func (c *stmtCache) stmt(ctx context.Context, query string) (*sql.Stmt, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if st, ok := c.stmts[query]; ok {
		return st, nil
	}
	if preparedHook != nil {
		preparedHook(query)
	}
	if len(c.stmts) >= maxCached {
		return nil, nil
	}
	st, err := c.prepare(ctx, query)
	if err != nil {
		return nil, err
	}
	c.stmts[query] = st
	return st, nil
}

func (c *stmtCache) ExecContext(ctx context.Context, query string, args ...any) (sql.Result, error) {
	st, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return c.direct.ExecContext(ctx, query, args...)
	}
	return st.ExecContext(ctx, args...)
}

func (c *stmtCache) QueryContext(ctx context.Context, query string, args ...any) (*sql.Rows, error) {
	st, err := c.stmt(ctx, query)
	if err != nil {
		return nil, err
	}
	if st == nil {
		return c.direct.QueryContext(ctx, query, args...)
	}
	return st.QueryContext(ctx, args...)
}

func (c *stmtCache) QueryRowContext(ctx context.Context, query string, args ...any) *sql.Row {
	st, err := c.stmt(ctx, query)
	if err != nil || st == nil {
		// A failed prepare resurfaces from the direct query with the same error.
		return c.direct.QueryRowContext(ctx, query, args...)
	}
	return st.QueryRowContext(ctx, args...)
}

func (c *stmtCache) close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, st := range c.stmts {
		st.Close()
	}
	c.stmts = map[string]*sql.Stmt{}
}
