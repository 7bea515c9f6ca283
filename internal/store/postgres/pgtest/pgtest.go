// Package pgtest gives tests a fresh Postgres database each. It finds the
// server in REBUNO_TEST_POSTGRES_URL (`make test` starts a throwaway cluster
// and sets it, see tests/postgres/cluster.sh). Without it a test is
// skipped, except under CI=true, where it fails: CI must run every backend.
//
// A database is a copy of a template migrated once per schema (CREATE
// DATABASE … TEMPLATE), which takes a few tens of milliseconds, and is
// dropped when its test ends.
package pgtest

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rebuno/rebuno/internal/store/postgres"
)

// EnvURL names the variable holding the test server's URL (any database on
// it: tests create their own).
const EnvURL = "REBUNO_TEST_POSTGRES_URL"

// URL returns the test server's URL, or skips the test (fails it under
// CI=true) when none is configured.
func URL(tb testing.TB) string {
	tb.Helper()
	u := os.Getenv(EnvURL)
	if u != "" {
		return u
	}
	const how = "set " + EnvURL + " to a Postgres server (tests/postgres/cluster.sh start prints one), or run make test"
	if os.Getenv("CI") == "true" {
		tb.Fatalf("no Postgres for the tests under CI: %s", how)
	}
	tb.Skipf("no Postgres configured: %s", how)
	return ""
}

// NewDatabase creates a database holding this binary's schema for the test
// and returns its URL; it is dropped when the test ends.
func NewDatabase(tb testing.TB) string {
	tb.Helper()
	server := URL(tb)
	template := "rebuno_tmpl_" + postgres.SchemaID()
	ensureTemplate(tb, server, template)
	return create(tb, server, template)
}

// NewEmptyDatabase creates an empty database for the test (no schema) and
// returns its URL; it is dropped when the test ends.
func NewEmptyDatabase(tb testing.TB) string {
	tb.Helper()
	return create(tb, URL(tb), "template0")
}

// Admin runs a statement on the server's maintenance database, for tests
// that act on a database from outside (drop its connections, refuse new
// ones).
func Admin(tb testing.TB, sql string, args ...any) {
	tb.Helper()
	Exec(tb, URL(tb), sql, args...)
}

// Exec runs a statement on the database at dbURL.
func Exec(tb testing.TB, dbURL, sql string, args ...any) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		tb.Fatalf("connect to the test server: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, sql, args...); err != nil {
		tb.Fatalf("%s: %v", sql, err)
	}
}

// Name is the database a URL names.
func Name(tb testing.TB, dbURL string) string {
	tb.Helper()
	u, err := url.Parse(dbURL)
	if err != nil {
		tb.Fatal(err)
	}
	return u.Path[1:]
}

// Cut makes the database unreachable: it refuses new connections and drops
// the open ones, as a database that went away would. Restore undoes it.
func Cut(tb testing.TB, dbURL string) {
	tb.Helper()
	name := Name(tb, dbURL)
	Admin(tb, fmt.Sprintf(`ALTER DATABASE %s WITH ALLOW_CONNECTIONS false`, pgx.Identifier{name}.Sanitize()))
	// pg_terminate_backend only signals the backends: until each has
	// exited, a pooled connection to it still answers. Cut returns once none
	// is left, so that the caller sees the database gone.
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, URL(tb))
	if err != nil {
		tb.Fatalf("connect to the test server: %v", err)
	}
	defer conn.Close(context.Background())
	for {
		var left int
		err := conn.QueryRow(ctx, `SELECT count(pg_terminate_backend(pid)) FROM pg_stat_activity
 WHERE datname = $1 AND pid <> pg_backend_pid()`, name).Scan(&left)
		if err != nil {
			tb.Fatalf("terminate the connections to %s: %v", name, err)
		}
		if left == 0 {
			return
		}
		select {
		case <-ctx.Done():
			tb.Fatalf("%d connections to %s still open 30 s after they were terminated", left, name)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// Restore lets a cut database accept connections again.
func Restore(tb testing.TB, dbURL string) {
	tb.Helper()
	Admin(tb, fmt.Sprintf(`ALTER DATABASE %s WITH ALLOW_CONNECTIONS true`, pgx.Identifier{Name(tb, dbURL)}.Sanitize()))
}

func create(tb testing.TB, server, template string) string {
	tb.Helper()
	name := "rebuno_t_" + randomHex(8)
	Admin(tb, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE %s`, pgx.Identifier{name}.Sanitize(), pgx.Identifier{template}.Sanitize()))
	tb.Cleanup(func() {
		Admin(tb, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, pgx.Identifier{name}.Sanitize()))
	})
	return withDatabase(tb, server, name)
}

// ensureTemplate creates and migrates the template once per server and
// schema, under an advisory lock that test processes running side by side
// share.
func ensureTemplate(tb testing.TB, server, template string) {
	tb.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		tb.Fatalf("connect to the test server: %v", err)
	}
	defer conn.Close(context.Background())
	if _, err := conn.Exec(ctx, `SELECT pg_advisory_lock(hashtextextended('rebuno_test_template', 0))`); err != nil {
		tb.Fatal(err)
	}
	defer conn.Exec(context.Background(), `SELECT pg_advisory_unlock(hashtextextended('rebuno_test_template', 0))`)
	var exists bool
	if err := conn.QueryRow(ctx, `SELECT EXISTS (SELECT 1 FROM pg_database WHERE datname = $1)`, template).Scan(&exists); err != nil {
		tb.Fatal(err)
	}
	if exists {
		return
	}
	// Built under another name and renamed when complete, so that a
	// process that dies halfway leaves no template that looks finished.
	building := template + "_building"
	if _, err := conn.Exec(ctx, fmt.Sprintf(`DROP DATABASE IF EXISTS %s WITH (FORCE)`, pgx.Identifier{building}.Sanitize())); err != nil {
		tb.Fatal(err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`CREATE DATABASE %s TEMPLATE template0`, pgx.Identifier{building}.Sanitize())); err != nil {
		tb.Fatal(err)
	}
	if _, err := postgres.Migrate(ctx, withDatabase(tb, server, building)); err != nil {
		tb.Fatalf("migrate the template database: %v", err)
	}
	if _, err := conn.Exec(ctx, fmt.Sprintf(`ALTER DATABASE %s RENAME TO %s`, pgx.Identifier{building}.Sanitize(), pgx.Identifier{template}.Sanitize())); err != nil {
		tb.Fatal(err)
	}
}

func withDatabase(tb testing.TB, server, name string) string {
	tb.Helper()
	u, err := url.Parse(server)
	if err != nil {
		tb.Fatalf("invalid %s: %v", EnvURL, err)
	}
	u.Path = "/" + name
	return u.String()
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

// Cluster is a Postgres server of the test's own, for tests that crash and
// restart the server itself (which the shared one must never do).
type Cluster struct {
	tb    testing.TB
	state string
	// URL is the cluster's maintenance database; a server-mode kernel may
	// use it directly.
	URL string
}

// NewCluster starts a throwaway cluster with tests/postgres/cluster.sh and
// stops it when the test ends. Like NewDatabase it needs the tests' Postgres
// (REBUNO_TEST_POSTGRES_URL): where the shared server is not configured, the
// binaries may be missing too, and the test is skipped (failed under CI).
func NewCluster(tb testing.TB) *Cluster {
	tb.Helper()
	URL(tb)
	c := &Cluster{tb: tb, state: tb.TempDir()}
	c.URL = strings.TrimSpace(c.run("start"))
	tb.Cleanup(func() { c.run("stop") })
	return c
}

// Crash stops the server as a crash would: pg_ctl stop -m immediate, so
// the next start recovers from the WAL.
func (c *Cluster) Crash() { c.tb.Helper(); c.run("crash") }

// Restart starts the server again after Crash, on the same port.
func (c *Cluster) Restart() { c.tb.Helper(); c.run("restart") }

func (c *Cluster) run(verb string) string {
	c.tb.Helper()
	_, file, _, _ := runtime.Caller(0)
	script := filepath.Join(filepath.Dir(file), "..", "..", "..", "..", "tests", "postgres", "cluster.sh")
	cmd := exec.Command(script, verb)
	cmd.Env = append(os.Environ(), "REBUNO_PG_STATE="+c.state)
	var stderr strings.Builder
	cmd.Stderr = &stderr
	out, err := cmd.Output()
	if err != nil {
		c.tb.Fatalf("cluster.sh %s: %v\n%s", verb, err, stderr.String())
	}
	return string(out)
}
