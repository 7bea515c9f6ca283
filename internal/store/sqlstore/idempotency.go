package sqlstore

import (
	"context"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

func (q *Queries) Idempotency(ctx context.Context, route, scope, key string) (*store.IdempotencyRecord, error) {
	r := store.IdempotencyRecord{Route: route, Scope: scope, Key: key}
	var at int64
	err := q.row(ctx, `SELECT body_hash, execution_id, created_at FROM idempotency_keys WHERE route = ? AND scope = ? AND idem_key = ?`,
		route, scope, key).Scan(&r.BodyHash, &r.ExecutionID, &at)
	if err != nil {
		return nil, notFound(err)
	}
	r.CreatedAt = fromTS(at)
	return &r, nil
}

func (t *Tx) InsertIdempotency(ctx context.Context, r *store.IdempotencyRecord) error {
	// A record past its lifetime may still be present until the sweep runs;
	// a new use of the key replaces it.
	return t.exec(ctx, `INSERT INTO idempotency_keys (route, scope, idem_key, body_hash, execution_id, created_at) VALUES (?,?,?,?,?,?)
 ON CONFLICT (route, scope, idem_key) DO UPDATE SET body_hash = excluded.body_hash, execution_id = excluded.execution_id, created_at = excluded.created_at`,
		r.Route, r.Scope, r.Key, r.BodyHash, r.ExecutionID, ts(r.CreatedAt))
}

func (t *Tx) DeleteIdempotencyBefore(ctx context.Context, before time.Time) error {
	return t.exec(ctx, `DELETE FROM idempotency_keys WHERE created_at < ?`, ts(before))
}
