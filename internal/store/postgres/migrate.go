package postgres

import (
	"context"
	"crypto/sha256"
	"embed"
	"errors"
	"fmt"
	"io/fs"
	"regexp"
	"sort"
	"strconv"

	"github.com/jackc/pgx/v5"
)

// The schema is a numbered series of migrations embedded in the binary,
// migrations/NNN_name.up.sql, applied in order, each in a transaction of its
// own that also records it in schema_migrations. Once released, a migration
// never changes: a change to the schema is a new file.

//go:embed migrations/*.up.sql
var migrationFiles embed.FS

type migration struct {
	Version int
	Name    string
	SQL     string
}

var migrationName = regexp.MustCompile(`^(\d{3})_([a-z0-9_]+)\.up\.sql$`)

// migrations reads the embedded migrations in order. Their numbers run from
// 1 without a gap (a test holds it).
func migrations() ([]migration, error) {
	entries, err := fs.ReadDir(migrationFiles, "migrations")
	if err != nil {
		return nil, err
	}
	var out []migration
	for _, e := range entries {
		m := migrationName.FindStringSubmatch(e.Name())
		if m == nil {
			return nil, fmt.Errorf("migration file %s is not named NNN_name.up.sql", e.Name())
		}
		text, err := migrationFiles.ReadFile("migrations/" + e.Name())
		if err != nil {
			return nil, err
		}
		v, _ := strconv.Atoi(m[1])
		out = append(out, migration{Version: v, Name: m[2], SQL: string(text)})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Version < out[j].Version })
	for i, m := range out {
		if m.Version != i+1 {
			return nil, fmt.Errorf("migration %03d_%s: want version %d (versions run from 1 without gaps)", m.Version, m.Name, i+1)
		}
	}
	return out, nil
}

// SchemaVersion is the version of the schema this binary knows: the number
// of its last migration.
func SchemaVersion() int {
	ms, err := migrations()
	if err != nil {
		panic(err) // the embedded files are fixed at build time and tested
	}
	return len(ms)
}

// ErrSchemaNewer is a database whose schema a newer rebuno has migrated:
// this binary does not know it and refuses to start.
var ErrSchemaNewer = errors.New("the database schema is newer than this rebuno knows")

// ErrSchemaOlder is a database that needs migrations this binary was told
// not to apply (Options.Migrate false).
var ErrSchemaOlder = errors.New("the database schema is older than this rebuno needs")

// migrateLock is the advisory lock held while migrating, so that replicas
// starting together migrate one after the other.
var migrateLock = lockID("rebuno_migrate")

const versionTable = `CREATE TABLE IF NOT EXISTS schema_migrations (
  version INTEGER PRIMARY KEY,
  name TEXT NOT NULL,
  applied_at TIMESTAMPTZ NOT NULL DEFAULT now()
)`

// Migration describes what Migrate did.
type Migration struct {
	From, To int
}

// migrate brings the schema on conn up to this binary's version under the
// migration lock, or, with apply false, only checks that it is there. A
// schema newer than the binary is refused either way.
func migrate(ctx context.Context, conn *pgx.Conn, apply bool) (Migration, error) {
	ms, err := migrations()
	if err != nil {
		return Migration{}, err
	}
	known := len(ms)
	if !apply {
		v, err := currentVersion(ctx, conn)
		if err != nil {
			return Migration{}, err
		}
		return Migration{From: v, To: v}, checkVersion(v, known, false)
	}
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock($1)`, migrateLock); err != nil {
		return Migration{}, fmt.Errorf("take the migration lock: %w", err)
	}
	defer conn.Exec(context.WithoutCancel(ctx), `SELECT pg_advisory_unlock($1)`, migrateLock)
	if _, err := conn.Exec(ctx, versionTable); err != nil {
		return Migration{}, fmt.Errorf("create schema_migrations: %w", err)
	}
	v, err := currentVersion(ctx, conn)
	if err != nil {
		return Migration{}, err
	}
	if err := checkVersion(v, known, true); err != nil {
		return Migration{From: v, To: v}, err
	}
	for _, m := range ms[v:] {
		err := pgx.BeginFunc(ctx, conn, func(tx pgx.Tx) error {
			if _, err := tx.Exec(ctx, m.SQL); err != nil {
				return err
			}
			_, err := tx.Exec(ctx, `INSERT INTO schema_migrations (version, name) VALUES ($1, $2)`, m.Version, m.Name)
			return err
		})
		if err != nil {
			return Migration{From: v, To: m.Version - 1}, fmt.Errorf("migration %03d_%s: %w", m.Version, m.Name, err)
		}
	}
	return Migration{From: v, To: known}, nil
}

// currentVersion reads the highest applied migration; 0 on a database that
// has none.
func currentVersion(ctx context.Context, conn *pgx.Conn) (int, error) {
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT to_regclass('schema_migrations') IS NOT NULL`).Scan(&exists); err != nil {
		return 0, fmt.Errorf("read the schema version: %w", err)
	}
	if !exists {
		return 0, nil
	}
	var v int
	if err := conn.QueryRow(ctx, `SELECT COALESCE(MAX(version), 0) FROM schema_migrations`).Scan(&v); err != nil {
		return 0, fmt.Errorf("read the schema version: %w", err)
	}
	return v, nil
}

func checkVersion(have, known int, applying bool) error {
	switch {
	case have > known:
		return fmt.Errorf("%w: the database is at schema version %d, this rebuno knows versions up to %d; run a rebuno at least as new as the one that migrated it",
			ErrSchemaNewer, have, known)
	case have < known && !applying:
		return fmt.Errorf("%w: the database is at schema version %d, this rebuno needs %d; run `rebuno migrate` (or start with --migrate=true)",
			ErrSchemaOlder, have, known)
	}
	return nil
}

// SchemaID identifies the schema this binary makes, by version and by the
// text of its migrations: tests keep a migrated template database per
// SchemaID and copy it for each test.
func SchemaID() string {
	ms, err := migrations()
	if err != nil {
		panic(err)
	}
	h := sha256.New()
	for _, m := range ms {
		h.Write([]byte(m.SQL))
	}
	return fmt.Sprintf("v%d_%x", len(ms), h.Sum(nil)[:6])
}
