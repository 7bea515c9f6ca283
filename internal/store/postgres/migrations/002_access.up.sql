-- Access: scoped API keys (only the hash of each token), the audit log of
-- what they did, console sessions, and deployment-wide settings such as the
-- id that keys carry. The same tables as SQLite's migration 8.

CREATE TABLE api_keys (
  name TEXT COLLATE "C" PRIMARY KEY,
  role TEXT NOT NULL,
  hash TEXT COLLATE "C" NOT NULL UNIQUE,
  created_at BIGINT NOT NULL,
  created_by TEXT NOT NULL,
  expires_at BIGINT NOT NULL DEFAULT 0,
  revoked_at BIGINT NOT NULL DEFAULT 0,
  last_used_at BIGINT NOT NULL DEFAULT 0
);

CREATE TABLE audit_log (
  seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
  at BIGINT NOT NULL,
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  subject TEXT NOT NULL,
  detail TEXT NOT NULL
);

CREATE TABLE sessions (
  hash TEXT COLLATE "C" PRIMARY KEY,
  key_name TEXT COLLATE "C" NOT NULL,
  created_at BIGINT NOT NULL,
  expires_at BIGINT NOT NULL
);
CREATE INDEX sessions_by_expiry ON sessions (expires_at);

CREATE TABLE settings (
  name TEXT COLLATE "C" PRIMARY KEY,
  value TEXT NOT NULL
);
