package postgres_test

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
	"github.com/rebuno/rebuno/internal/wire"
)

// What operating server mode needs beyond the contract: migrations, a
// database that goes away and comes back, the schema's column types.

func query(t *testing.T, url, sql string, args ...any) pgx.Rows {
	t.Helper()
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { conn.Close(context.Background()) })
	rows, err := conn.Query(t.Context(), sql, args...)
	if err != nil {
		t.Fatalf("%s: %v", sql, err)
	}
	return rows
}

func exec(t *testing.T, url, sql string, args ...any) {
	t.Helper()
	query(t, url, sql, args...).Close()
}

func schemaVersion(t *testing.T, url string) int {
	t.Helper()
	rows := query(t, url, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`)
	defer rows.Close()
	var v int
	rows.Next()
	if err := rows.Scan(&v); err != nil {
		t.Fatal(err)
	}
	return v
}

func TestMigrateFreshDatabase(t *testing.T) {
	url := pgtest.NewEmptyDatabase(t)
	m, err := postgres.Migrate(t.Context(), url)
	if err != nil {
		t.Fatalf("Migrate: %v", err)
	}
	if m.From != 0 || m.To != postgres.SchemaVersion() || schemaVersion(t, url) != postgres.SchemaVersion() {
		t.Fatalf("Migrate: %+v, database at %d; want 0 → %d", m, schemaVersion(t, url), postgres.SchemaVersion())
	}
	again, err := postgres.Migrate(t.Context(), url)
	if err != nil || again.From != again.To || again.To != postgres.SchemaVersion() {
		t.Fatalf("a second Migrate: %+v, %v; want nothing to do", again, err)
	}
}

// Replicas starting together on an empty database migrate it once.
func TestConcurrentMigrations(t *testing.T) {
	url := pgtest.NewEmptyDatabase(t)
	const n = 4
	errs := make(chan error, n)
	stores := make(chan *postgres.Store, n)
	for range n {
		go func() {
			s, err := postgres.Open(t.Context(), postgres.Options{URL: url, Migrate: true, MaxConns: 8})
			if err == nil {
				stores <- s
			}
			errs <- err
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("Open: %v", err)
		}
	}
	close(stores)
	for s := range stores {
		s.Close()
	}
	rows := query(t, url, `SELECT count(*) FROM schema_migrations`)
	defer rows.Close()
	var count int
	rows.Next()
	rows.Scan(&count)
	if count != postgres.SchemaVersion() {
		t.Errorf("schema_migrations holds %d rows, want one per migration (%d)", count, postgres.SchemaVersion())
	}
}

func TestOpenRefusesOtherSchemas(t *testing.T) {
	empty := pgtest.NewEmptyDatabase(t)
	_, err := postgres.Open(t.Context(), postgres.Options{URL: empty, Migrate: false})
	if !errors.Is(err, postgres.ErrSchemaOlder) || !strings.Contains(err.Error(), "rebuno migrate") {
		t.Errorf("Open without migrating an empty database: %v; want ErrSchemaOlder naming rebuno migrate", err)
	}
	current := pgtest.NewDatabase(t)
	openAt(t, current, func(o *postgres.Options) { o.Migrate = false })

	newer := pgtest.NewDatabase(t)
	next := postgres.SchemaVersion() + 1
	exec(t, newer, `INSERT INTO schema_migrations (version, name) VALUES ($1, 'from_the_future')`, next)
	for _, migrate := range []bool{true, false} {
		_, err := postgres.Open(t.Context(), postgres.Options{URL: newer, Migrate: migrate})
		want := fmt.Sprintf("schema version %d, this rebuno knows versions up to %d", next, postgres.SchemaVersion())
		if !errors.Is(err, postgres.ErrSchemaNewer) || !strings.Contains(err.Error(), want) {
			t.Errorf("Open (migrate %v) on a newer schema: %v; want ErrSchemaNewer saying %q", migrate, err, want)
		}
	}
	if _, err := postgres.Migrate(t.Context(), newer); !errors.Is(err, postgres.ErrSchemaNewer) {
		t.Errorf("Migrate on a newer schema: %v; want ErrSchemaNewer", err)
	}
}

// Open fails fast, with the reason on one line, when nothing listens.
func TestOpenUnreachable(t *testing.T) {
	start := time.Now()
	_, err := postgres.Open(t.Context(), postgres.Options{URL: "postgres://nobody@127.0.0.1:1/none?connect_timeout=2", Migrate: true})
	if err == nil || !strings.Contains(err.Error(), "cannot reach the database") || strings.Contains(err.Error(), "\n") {
		t.Fatalf("Open of an unreachable database: %v; want one line saying it cannot be reached", err)
	}
	if d := time.Since(start); d > 3*time.Second {
		t.Errorf("Open took %s to fail, beyond the connect timeout", d)
	}
}

// User JSON is stored as bytes: no column of the schema is json or jsonb,
// which would rewrite it.
func TestNoJSONColumns(t *testing.T) {
	url := pgtest.NewDatabase(t)
	rows := query(t, url, `SELECT table_name, column_name, data_type FROM information_schema.columns
 WHERE table_schema = 'public' AND data_type IN ('json', 'jsonb')`)
	defer rows.Close()
	for rows.Next() {
		var table, column, typ string
		rows.Scan(&table, &column, &typ)
		t.Errorf("%s.%s is %s", table, column, typ)
	}
}

// A database that goes away makes operations fail with ErrUnavailable,
// writing nothing; when it is back, the store serves again by itself, its
// leader election and its listener included.
func TestDatabaseLostAndBack(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := openAt(t, url)
	peer := openAt(t, url)
	ctx := t.Context()
	insert := func(id string) error {
		return s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
			return tx.InsertExecution(ctx, &store.Execution{ID: id, AgentID: "a", Input: []byte("null"), Status: wire.ExecPending})
		})
	}
	if err := insert("exec-before"); err != nil {
		t.Fatal(err)
	}

	pgtest.Cut(t, url)
	if err := insert("exec-during"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Update while the database is gone: %v, want ErrUnavailable", err)
	}
	if err := s.Ping(ctx); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Ping while the database is gone: %v, want ErrUnavailable", err)
	}
	if _, err := s.Read().Execution(ctx, "exec-before"); !errors.Is(err, store.ErrUnavailable) {
		t.Errorf("Read while the database is gone: %v, want ErrUnavailable", err)
	}
	waitFor(t, "no replica to lead while the database is gone", func() bool { return !s.Leading() && !peer.Leading() })

	pgtest.Restore(t, url)
	waitFor(t, "the store to serve again", func() bool { return s.Ping(ctx) == nil })
	if err := insert("exec-after"); err != nil {
		t.Errorf("Update once the database is back: %v", err)
	}
	if _, err := s.Read().Execution(ctx, "exec-during"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the execution written while the database was gone: %v, want not found", err)
	}
	waitFor(t, "a replica to lead again", func() bool { return s.Leading() || peer.Leading() })
	heard := make(chan struct{}, 1)
	peer.Notifier().Listen(func(n store.Notification) {
		if n.Key == "exec-after" {
			select {
			case heard <- struct{}{}:
			default:
			}
		}
	})
	// The listener reconnects on its own schedule; until it has, a
	// notification is lost (best effort), so keep sending.
	deadline := time.After(20 * time.Second)
	for done := false; !done; {
		s.Notifier().Notify(store.Notification{Topic: store.TopicEvents, Key: "exec-after"})
		select {
		case <-heard:
			done = true
		case <-time.After(200 * time.Millisecond):
		case <-deadline:
			t.Fatal("notifications did not reach the other store once the database was back")
		}
	}
}

// A transaction whose connection dies halfway leaves nothing behind.
func TestConnectionLostMidTransaction(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := openAt(t, url)
	ctx := t.Context()
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertExecution(ctx, &store.Execution{ID: "exec-half", AgentID: "a", Input: []byte("null"), Status: wire.ExecPending}); err != nil {
			return err
		}
		// Every connection of the database, this transaction's included.
		pgtest.Admin(t, `SELECT pg_terminate_backend(pid) FROM pg_stat_activity WHERE datname = $1 AND pid <> pg_backend_pid()`, pgtest.Name(t, url))
		return tx.AppendEvents(ctx, []*store.Event{{ExecutionID: "exec-half", Seq: 1, Type: "execution.created", Payload: []byte("{}")}})
	})
	if !errors.Is(err, store.ErrUnavailable) {
		t.Fatalf("Update whose connection died: %v, want ErrUnavailable", err)
	}
	waitFor(t, "the store to serve again", func() bool { return s.Ping(ctx) == nil })
	if _, err := s.Read().Execution(ctx, "exec-half"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("the half-written execution: %v, want not found", err)
	}
}

// A check that cannot finish within the budget fails with
// ErrLimiterTimeout rather than holding up the step.
func TestLimiterBudget(t *testing.T) {
	url := pgtest.NewDatabase(t)
	l := openAt(t, url).Limiter()
	now := time.Now()
	if ok, _, err := l.Check("held", 5, time.Minute, now); err != nil || !ok {
		t.Fatalf("first check: %v %v", ok, err)
	}
	conn, err := pgx.Connect(t.Context(), url)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close(context.Background())
	tx, err := conn.Begin(t.Context())
	if err != nil {
		t.Fatal(err)
	}
	defer tx.Rollback(context.Background())
	if _, err := tx.Exec(t.Context(), `SELECT 1 FROM rate_buckets WHERE bucket_key = 'held' FOR UPDATE`); err != nil {
		t.Fatal(err)
	}
	start := time.Now()
	_, _, err = l.Check("held", 5, time.Minute, now)
	if !errors.Is(err, store.ErrLimiterTimeout) {
		t.Errorf("check of a bucket locked elsewhere: %v, want ErrLimiterTimeout", err)
	}
	// The lock is held until the test ends: without the budget the check
	// would wait that long.
	if d := time.Since(start); d < store.LimiterBudget || d > 3*time.Second {
		t.Errorf("the check gave up after %s, want after its budget of %s", d, store.LimiterBudget)
	}
}

// Buckets untouched for longer than their window go; the others stay.
func TestLimiterPrune(t *testing.T) {
	l := openAt(t, pgtest.NewDatabase(t)).Limiter()
	base := time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)
	var wg sync.WaitGroup
	for i := range 50 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			window := time.Minute
			if i%2 == 0 {
				window = time.Hour
			}
			if _, _, err := l.Check(fmt.Sprintf("k%d", i), 3, window, base); err != nil {
				t.Error(err)
			}
		}()
	}
	wg.Wait()
	n, err := l.Prune(t.Context(), base.Add(30*time.Minute))
	if err != nil || n != 25 {
		t.Fatalf("Prune after 30 minutes: %d, %v; want the 25 one-minute buckets", n, err)
	}
	if n, err := l.Prune(t.Context(), base.Add(30*time.Minute)); err != nil || n != 0 {
		t.Fatalf("Prune again: %d, %v; want none", n, err)
	}
	// A pruned bucket starts full again.
	for range 3 {
		if ok, _, err := l.Check("k1", 3, time.Minute, base.Add(30*time.Minute)); err != nil || !ok {
			t.Fatalf("check of a pruned bucket: %v %v", ok, err)
		}
	}
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 20s for %s", what)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// When its listening connection breaks, a store listens again and raises
// TopicResync in process: what the other replicas announced meanwhile is
// lost, so everything waiting here must re-read the store at once.
func TestListenerBreakRaisesResync(t *testing.T) {
	url := pgtest.NewDatabase(t)
	s := openAt(t, url)
	resync := make(chan struct{}, 1)
	s.Notifier().Listen(func(n store.Notification) {
		if n.Topic == store.TopicResync {
			select {
			case resync <- struct{}{}:
			default:
			}
		}
	})
	rows := query(t, url, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
 WHERE datname = $1 AND query = 'LISTEN rebuno'`, pgtest.Name(t, url))
	var cut int
	rows.Next()
	if err := rows.Scan(&cut); err != nil || cut != 1 {
		t.Fatalf("terminated %d listening connections (%v), want 1", cut, err)
	}
	rows.Close()
	select {
	case <-resync:
	case <-time.After(20 * time.Second):
		t.Fatal("no resync within 20s of the listening connection's loss")
	}
}
