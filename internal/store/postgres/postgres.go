// Package postgres is the store behind `rebuno server`: one Postgres
// database shared by any number of stateless kernel replicas.
//
// The SQL is store/sqlstore's, the same that SQLite runs, over database/sql
// on a pgx connection pool; this package adds what sharing a database
// needs:
//   - each operation is one transaction on one pooled connection, and
//     operations on one execution are serialised by a row lock on it taken
//     first in the transaction (TryUpdate skips a locked execution);
//   - the schema is migrated at start under an advisory lock (migrate.go);
//   - notifications reach the other replicas through LISTEN/NOTIFY
//     (notify.go), the singleton duties run on the replica holding the
//     leader lock (leader.go), and rate-limit buckets are shared rows
//     (limiter.go);
//   - a lost database surfaces as store.ErrUnavailable (errors.go) and the
//     pools reconnect by themselves when it returns.
//
// Postgres already shares one WAL flush among the commits that wait for it
// at the same moment, which is the group commit the SQLite store has to
// build itself.
package postgres

import (
	"context"
	"database/sql"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"
	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlstore"
)

// Connection budget of one process. Besides the pool its operations use, a
// process keeps one connection for LISTEN, one for the leader lock, and a
// side pool of sideConns for the work that must never queue behind
// operations: rate-limit checks (asked while the operation's transaction
// holds a pooled connection) and sending notifications (a live event must
// reach the other replicas promptly, however busy the pool is).
const (
	// DefaultMaxConns lets three replicas, and a fourth during a rolling
	// upgrade, share a stock Postgres (max_connections 100, 3 of them
	// reserved for superusers) with room left for psql and backups.
	DefaultMaxConns = 20
	// MinMaxConns leaves the pool two connections: an operation may read
	// outside its transaction while it holds one.
	MinMaxConns   = 6
	dedicatedConn = 2 // LISTEN and the leader lock
	sideConns     = 2
)

// DefaultLeaderLockKey names the advisory lock of the leader.
const DefaultLeaderLockKey = "rebuno_scheduler_leader"

// DefaultConnectTimeout bounds each connection attempt when the URL does
// not set connect_timeout.
const DefaultConnectTimeout = 5 * time.Second

// Observer receives commit measurements (the metrics package implements it).
type Observer interface {
	ObserveCommit(batchSize int, d time.Duration)
}

// Options configure Open.
type Options struct {
	// URL is the database, postgres://user:password@host:port/db?….
	URL string
	// MaxConns bounds every connection the process opens, the dedicated
	// ones included; 0 means DefaultMaxConns. MinConns is how many pooled
	// connections are kept open while idle.
	MaxConns, MinConns int
	// LeaderLockKey names the leader's advisory lock; replicas that share
	// it elect one leader. "" means DefaultLeaderLockKey.
	LeaderLockKey string
	// Migrate applies pending migrations at Open; without it Open refuses a
	// database whose schema is not exactly this binary's.
	Migrate  bool
	Observer Observer
	Logger   *slog.Logger
}

// Store is the Postgres implementation of store.Store.
type Store struct {
	pool     *pgxpool.Pool
	side     *pgxpool.Pool // see sideConns
	db       *sql.DB
	read     *sqlstore.Queries
	notifier *notifier
	leader   *leader
	limiter  *Limiter
	obs      Observer
	log      *slog.Logger
	cancel   context.CancelFunc
	workers  sync.WaitGroup
	closed   sync.Once
}

// PoolSize is how many of maxConns (0: DefaultMaxConns) connections the
// pool of operations gets, the dedicated ones set aside.
func PoolSize(maxConns int) int {
	if maxConns == 0 {
		maxConns = DefaultMaxConns
	}
	return maxConns - dedicatedConn - sideConns
}

// config is a parsed Options.URL with the connection settings the store
// applies to every connection it opens.
func config(url string) (*pgxpool.Config, error) {
	cfg, err := pgxpool.ParseConfig(url)
	if err != nil {
		return nil, fmt.Errorf("invalid database URL: %w", err)
	}
	if !strings.Contains(url, "connect_timeout") {
		cfg.ConnConfig.ConnectTimeout = DefaultConnectTimeout
	}
	// Operators may name each replica's connections in the URL
	// (application_name=…) to tell them apart in pg_stat_activity.
	if cfg.ConnConfig.RuntimeParams["application_name"] == "" {
		cfg.ConnConfig.RuntimeParams["application_name"] = "rebuno"
	}
	return cfg, nil
}

// Open connects, migrates (or checks) the schema, and starts the listener
// and the leader election. A database that cannot be reached fails within
// the connect timeout, with the reason.
func Open(ctx context.Context, opt Options) (*Store, error) {
	if opt.Logger == nil {
		opt.Logger = slog.Default()
	}
	if opt.MaxConns != 0 && opt.MaxConns < MinMaxConns {
		return nil, fmt.Errorf("at least %d database connections are needed, %d allowed", MinMaxConns, opt.MaxConns)
	}
	pooled := PoolSize(opt.MaxConns)
	if opt.MinConns > pooled {
		return nil, fmt.Errorf("%d idle connections asked for, but the pool holds at most %d", opt.MinConns, pooled)
	}
	cfg, err := config(opt.URL)
	if err != nil {
		return nil, err
	}
	if _, err := migrateURL(ctx, cfg.ConnConfig, opt.Migrate); err != nil {
		return nil, err
	}

	cfg.MaxConns, cfg.MinConns = int32(pooled), int32(opt.MinConns)
	pool, err := pgxpool.NewWithConfig(ctx, cfg)
	if err != nil {
		return nil, classify(err)
	}
	sideCfg := cfg.Copy()
	sideCfg.MaxConns, sideCfg.MinConns = sideConns, 0
	side, err := pgxpool.NewWithConfig(ctx, sideCfg)
	if err != nil {
		pool.Close()
		return nil, classify(err)
	}
	runCtx, cancel := context.WithCancel(context.Background())
	s := &Store{pool: pool, side: side, db: stdlib.OpenDBFromPool(pool), limiter: &Limiter{pool: side, log: opt.Logger},
		obs: opt.Observer, log: opt.Logger, cancel: cancel}
	s.read = &sqlstore.Queries{Q: s.db, D: dialect{}}
	s.notifier = newNotifier(side, cfg.ConnConfig, opt.Logger)
	key := opt.LeaderLockKey
	if key == "" {
		key = DefaultLeaderLockKey
	}
	s.leader = newLeader(cfg.ConnConfig, lockID(key), opt.Logger)
	// The first LISTEN is in place before Open returns, so that nothing
	// sent after it is missed.
	if err := s.notifier.listen(ctx); err != nil {
		s.Close()
		return nil, err
	}
	s.spawn(func() { s.notifier.receive(runCtx) })
	s.spawn(func() { s.notifier.send(runCtx) })
	s.spawn(func() { s.leader.run(runCtx) })
	return s, nil
}

func (s *Store) spawn(f func()) {
	s.workers.Add(1)
	go func() { defer s.workers.Done(); f() }()
}

// Migrate brings the schema of the database at url to this binary's
// version, for `rebuno migrate`.
func Migrate(ctx context.Context, url string) (Migration, error) {
	cfg, err := config(url)
	if err != nil {
		return Migration{}, err
	}
	return migrateURL(ctx, cfg.ConnConfig, true)
}

func migrateURL(ctx context.Context, cfg *pgx.ConnConfig, apply bool) (Migration, error) {
	conn, err := pgx.ConnectConfig(ctx, cfg)
	if err != nil {
		return Migration{}, fmt.Errorf("cannot reach the database: %s", oneLine(err))
	}
	defer conn.Close(context.WithoutCancel(ctx))
	m, err := migrate(ctx, conn, apply)
	if err != nil && !errors.Is(err, ErrSchemaNewer) && !errors.Is(err, ErrSchemaOlder) {
		return m, classify(err)
	}
	return m, err
}

// oneLine is a connection error on one line: pgx lists every attempt (per
// address, with and without TLS) on lines of its own, often the same.
func oneLine(err error) string {
	var ce *pgconn.ConnectError
	if errors.As(err, &ce) {
		if joined, ok := ce.Unwrap().(interface{ Unwrap() []error }); ok {
			var parts []string
			for _, e := range joined.Unwrap() {
				if msg := strings.Join(strings.Fields(e.Error()), " "); !slices.Contains(parts, msg) {
					parts = append(parts, msg)
				}
			}
			return strings.Join(parts, "; ")
		}
	}
	return strings.Join(strings.Fields(err.Error()), " ")
}

// lockID is the 64-bit advisory lock key of a name.
func lockID(name string) int64 {
	h := fnv.New64a()
	h.Write([]byte(name))
	return int64(h.Sum64())
}

// Update implements store.Store: one transaction on one connection, which
// first locks lockExecutionID's row (docs/protocol/operations.md §2.2). Postgres groups the WAL flushes
// of concurrent commits by itself.
func (s *Store) Update(ctx context.Context, lockExecutionID string, fn func(ctx context.Context, tx store.Tx) error) error {
	return s.update(ctx, lockExecutionID, false, fn)
}

// TryUpdate implements store.Store: the lock is taken with SKIP LOCKED, and
// a locked execution gives store.ErrLocked at once.
func (s *Store) TryUpdate(ctx context.Context, lockExecutionID string, fn func(ctx context.Context, tx store.Tx) error) error {
	return s.update(ctx, lockExecutionID, true, fn)
}

func (s *Store) update(ctx context.Context, lockID string, skipLocked bool, fn func(ctx context.Context, tx store.Tx) error) error {
	start := time.Now()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return classify(err)
	}
	// BEGIN is held like a write (conn.go): it goes with the first
	// statement that needs an answer.
	c := &opConn{conn: conn}
	c.ExecContext(ctx, "BEGIN")
	tx := sqlstore.NewTx(c, dialect{})
	if lockID != "" {
		err = tx.LockExecution(ctx, lockID, skipLocked)
	}
	if err == nil {
		err = sqlstore.RunUnit(ctx, fn, tx)
	}
	if err == nil {
		err = c.flush(ctx, "COMMIT")
	}
	if err != nil {
		c.rollback()
	}
	// The connection goes back before the after-commit work, which may
	// need one of its own.
	conn.Close()
	if err != nil {
		if c.err != nil {
			return c.err // a held write's failure, which the operation saw as its consequence
		}
		return err
	}
	if s.obs != nil {
		s.obs.ObserveCommit(1, time.Since(start))
	}
	tx.Committed()
	return nil
}

// Read implements store.Store: each read is its own statement.
func (s *Store) Read() store.Reader { return s.read }

// Ping implements store.Store.
func (s *Store) Ping(ctx context.Context) error {
	var one int
	if err := s.pool.QueryRow(ctx, `SELECT 1`).Scan(&one); err != nil {
		return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
	}
	return nil
}

// Notifier implements store.Store (notify.go).
func (s *Store) Notifier() store.Notifier { return s.notifier }

// Leading implements store.Store (leader.go).
func (s *Store) Leading() bool { return s.leader.holding() }

// Limiter returns the rate limiter whose buckets every replica shares.
func (s *Store) Limiter() *Limiter { return s.limiter }

// Close stops the listener and the leader (releasing the leader lock) and
// closes every connection.
func (s *Store) Close() error {
	var err error
	s.closed.Do(func() {
		s.cancel()
		s.workers.Wait()
		err = s.db.Close()
		s.side.Close()
		s.pool.Close()
	})
	return err
}
