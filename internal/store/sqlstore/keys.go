package sqlstore

import (
	"context"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

// ---- access: API keys, the audit log, console sessions, settings ----

const apiKeyCols = `name, role, hash, created_at, created_by, expires_at, revoked_at, last_used_at`

func scanAPIKey(s Scanner) (*store.APIKey, error) {
	var k store.APIKey
	var created, expires, revoked, used int64
	if err := s.Scan(&k.Name, &k.Role, &k.Hash, &created, &k.CreatedBy, &expires, &revoked, &used); err != nil {
		return nil, err
	}
	k.CreatedAt, k.ExpiresAt, k.RevokedAt, k.LastUsedAt = fromTS(created), fromTS(expires), fromTS(revoked), fromTS(used)
	return &k, nil
}

func (q *Queries) APIKey(ctx context.Context, name string) (*store.APIKey, error) {
	k, err := scanAPIKey(q.row(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE name = ?`, name))
	return k, notFound(err)
}

func (q *Queries) APIKeyByHash(ctx context.Context, hash string) (*store.APIKey, error) {
	k, err := scanAPIKey(q.row(ctx, `SELECT `+apiKeyCols+` FROM api_keys WHERE hash = ?`, hash))
	return k, notFound(err)
}

func (q *Queries) ListAPIKeys(ctx context.Context) ([]*store.APIKey, error) {
	return list(ctx, q, scanAPIKey, `SELECT `+apiKeyCols+` FROM api_keys ORDER BY name`)
}

func (t *Tx) InsertAPIKey(ctx context.Context, k *store.APIKey) error {
	res, err := t.Q.ExecContext(ctx, t.D.Rebind(`INSERT INTO api_keys (`+apiKeyCols+`) VALUES (?, ?, ?, ?, ?, ?, ?, ?)
 ON CONFLICT (name) DO NOTHING`), k.Name, k.Role, k.Hash, ts(k.CreatedAt), k.CreatedBy, ts(k.ExpiresAt), ts(k.RevokedAt), ts(k.LastUsedAt))
	if err != nil {
		return err
	}
	if n, err := res.RowsAffected(); err != nil || n == 0 {
		if err == nil {
			err = store.ErrExists
		}
		return err
	}
	return nil
}

func (t *Tx) UpdateAPIKey(ctx context.Context, k *store.APIKey) error {
	return t.exec(ctx, `UPDATE api_keys SET revoked_at = ?, last_used_at = ? WHERE name = ?`, ts(k.RevokedAt), ts(k.LastUsedAt), k.Name)
}

func (q *Queries) AuditLog(ctx context.Context, afterSeq int64, limit int) ([]*store.AuditEntry, error) {
	return list(ctx, q, func(s Scanner) (*store.AuditEntry, error) {
		var e store.AuditEntry
		var at int64
		var detail string
		if err := s.Scan(&e.Seq, &at, &e.Actor, &e.Action, &e.Subject, &detail); err != nil {
			return nil, err
		}
		e.At, e.Detail = fromTS(at), []byte(detail)
		return &e, nil
	}, `SELECT seq, at, actor, action, subject, detail FROM audit_log WHERE seq > ? ORDER BY seq LIMIT ?`, afterSeq, limit)
}

func (t *Tx) AppendAudit(ctx context.Context, e *store.AuditEntry) error {
	detail := string(e.Detail)
	if detail == "" {
		detail = "{}"
	}
	return t.exec(ctx, `INSERT INTO audit_log (at, actor, action, subject, detail) VALUES (?, ?, ?, ?, ?)`,
		ts(e.At), e.Actor, e.Action, e.Subject, detail)
}

func (q *Queries) Session(ctx context.Context, hash string) (*store.Session, error) {
	var s store.Session
	var created, expires int64
	err := q.row(ctx, `SELECT hash, key_name, created_at, expires_at FROM sessions WHERE hash = ?`, hash).
		Scan(&s.Hash, &s.KeyName, &created, &expires)
	if err != nil {
		return nil, notFound(err)
	}
	s.CreatedAt, s.ExpiresAt = fromTS(created), fromTS(expires)
	return &s, nil
}

func (t *Tx) InsertSession(ctx context.Context, s *store.Session) error {
	return t.exec(ctx, `INSERT INTO sessions (hash, key_name, created_at, expires_at) VALUES (?, ?, ?, ?)`,
		s.Hash, s.KeyName, ts(s.CreatedAt), ts(s.ExpiresAt))
}

func (t *Tx) DeleteSession(ctx context.Context, hash string) error {
	return t.exec(ctx, `DELETE FROM sessions WHERE hash = ?`, hash)
}

func (t *Tx) DeleteSessionsBefore(ctx context.Context, before time.Time) error {
	return t.exec(ctx, `DELETE FROM sessions WHERE expires_at < ?`, ts(before))
}

func (q *Queries) Setting(ctx context.Context, name string) (string, error) {
	var v string
	err := q.row(ctx, `SELECT value FROM settings WHERE name = ?`, name).Scan(&v)
	return v, notFound(err)
}

func (t *Tx) InsertSettingIfAbsent(ctx context.Context, name, value string) error {
	return t.exec(ctx, `INSERT INTO settings (name, value) VALUES (?, ?) ON CONFLICT (name) DO NOTHING`, name, value)
}
