package store

import "time"

// APIKey is a scoped bearer key. Only the hash of its token is stored.
type APIKey struct {
	Name       string
	Role       string
	Hash       string // hex SHA-256 of the token
	CreatedAt  time.Time
	CreatedBy  string
	ExpiresAt  time.Time // zero: never
	RevokedAt  time.Time // zero: live
	LastUsedAt time.Time // zero: never used
}

// AuditEntry is one entry of the access audit log: who did what to which
// subject (a key's name, an approval id), with details as a JSON object.
type AuditEntry struct {
	Seq     int64
	At      time.Time
	Actor   string
	Action  string
	Subject string
	Detail  []byte
}

// Session is a console sign-in: a random token (stored as its hash) that
// stands for the key it was exchanged for, until it expires or the key
// stops being valid.
type Session struct {
	Hash      string
	KeyName   string
	CreatedAt time.Time
	ExpiresAt time.Time
}
