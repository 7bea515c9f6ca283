package postgres_test

import (
	"context"
	"testing"

	"github.com/jackc/pgx/v5/pgxpool"
	"github.com/jackc/pgx/v5/stdlib"

	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
)

// BenchmarkDriver compares the two ways to run the store's statements on a
// pgx pool: database/sql through pgx's stdlib adapter (what sqlstore, shared
// with SQLite, is written against) and pgx's own interface. One primary-key
// read of a row like a dispatch's, from 16 goroutines.
func BenchmarkDriver(b *testing.B) {
	url := pgtest.NewDatabase(b)
	ctx := context.Background()
	pool, err := pgxpool.New(ctx, url)
	if err != nil {
		b.Fatal(err)
	}
	defer pool.Close()
	if _, err := pool.Exec(ctx, `INSERT INTO dispatches (id, execution_id, status, attempt, max_attempts, progress_attempt,
 lease_timeout, next_attempt_at, lease_expires_at, claimed_by, created_at, updated_at) VALUES ('d1','e1','pending',1,5,0,120,1,2,'r',3,4)`); err != nil {
		b.Fatal(err)
	}
	const q = `SELECT id, execution_id, status, attempt, max_attempts, progress_attempt, lease_timeout,
 next_attempt_at, lease_expires_at, claimed_by, created_at, updated_at FROM dispatches WHERE id = $1`
	type row struct {
		id, exec, status, by                                      string
		attempt, max, progress, lease, next, expires, cr, updated int64
	}
	b.Run("database-sql", func(b *testing.B) {
		db := stdlib.OpenDBFromPool(pool)
		defer db.Close()
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			var r row
			for pb.Next() {
				if err := db.QueryRowContext(ctx, q, "d1").Scan(&r.id, &r.exec, &r.status, &r.attempt, &r.max, &r.progress, &r.lease,
					&r.next, &r.expires, &r.by, &r.cr, &r.updated); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
	b.Run("pgx", func(b *testing.B) {
		b.SetParallelism(8)
		b.RunParallel(func(pb *testing.PB) {
			var r row
			for pb.Next() {
				if err := pool.QueryRow(ctx, q, "d1").Scan(&r.id, &r.exec, &r.status, &r.attempt, &r.max, &r.progress, &r.lease,
					&r.next, &r.expires, &r.by, &r.cr, &r.updated); err != nil {
					b.Error(err)
					return
				}
			}
		})
	})
}
