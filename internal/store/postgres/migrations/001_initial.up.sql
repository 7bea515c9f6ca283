-- The schema of server mode. It holds the same rows as the SQLite schema
-- (internal/store/sqlite/schema.go), so that one set of SQL (store/sqlstore)
-- reads and writes both, with Postgres types:
--   * ids and keys are TEXT COLLATE "C": ordered by their bytes, as SQLite
--     orders them and as the keyset pages expect, whatever the database's
--     default collation;
--   * user JSON kept verbatim (inputs, arguments, results, payloads) is
--     BYTEA, never jsonb, which would rewrite it (docs/protocol docs/protocol/README.md §3);
--   * times are BIGINT Unix microseconds, 0 when unset.
-- Tables rewritten by every step leave room on each page (fillfactor) so
-- that an update can stay on its page and skip the indexes (a HOT update).

CREATE TABLE agents (
  id TEXT COLLATE "C" PRIMARY KEY,
  webhook_url TEXT NOT NULL,
  secret TEXT NOT NULL,
  policy_bundle TEXT NOT NULL DEFAULT '',
  lease_timeout_seconds BIGINT NOT NULL DEFAULT 0,
  description TEXT NOT NULL DEFAULT '',
  input_schema BYTEA,
  output_schema BYTEA,
  registered_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
);

CREATE TABLE executions (
  id TEXT COLLATE "C" PRIMARY KEY,
  agent_id TEXT COLLATE "C" NOT NULL,
  agent_version TEXT NOT NULL DEFAULT '',
  status TEXT COLLATE "C" NOT NULL,
  failure_reason TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL,
  deadline_at BIGINT NOT NULL DEFAULT 0,
  parent_execution_id TEXT COLLATE "C" NOT NULL DEFAULT '',
  idempotency_key TEXT NOT NULL DEFAULT '',
  on_behalf_of TEXT NOT NULL DEFAULT '',
  forked_from TEXT COLLATE "C" NOT NULL DEFAULT '',
  fork_seq BIGINT NOT NULL DEFAULT 0,
  restoration BYTEA,
  resource_keys TEXT NOT NULL DEFAULT '[]',
  dispatch_id TEXT COLLATE "C" NOT NULL DEFAULT '',
  last_seq BIGINT NOT NULL DEFAULT 0,
  step_order BIGINT NOT NULL DEFAULT 0,
  step_count BIGINT NOT NULL DEFAULT 0,
  byte_count BIGINT NOT NULL DEFAULT 0,
  writing TEXT NOT NULL DEFAULT '[]'
) WITH (fillfactor = 70);
CREATE INDEX executions_by_agent ON executions (agent_id, id);
CREATE INDEX executions_by_status ON executions (status, id);
CREATE INDEX executions_live_deadline ON executions (deadline_at)
  WHERE deadline_at > 0 AND status IN ('pending','running','blocked');
CREATE INDEX executions_terminal_age ON executions (updated_at)
  WHERE status IN ('completed','failed','cancelled');
CREATE INDEX executions_by_source ON executions (forked_from, id) WHERE forked_from <> '';

CREATE TABLE execution_values (
  execution_id TEXT COLLATE "C" PRIMARY KEY,
  input BYTEA NOT NULL,
  output BYTEA,
  state BYTEA
);

-- Rows of events written one by one; the kernel's appends go to event_runs.
CREATE TABLE events (
  execution_id TEXT COLLATE "C" NOT NULL,
  event_seq BIGINT NOT NULL,
  type TEXT NOT NULL,
  payload BYTEA NOT NULL,
  occurred_at BIGINT NOT NULL,
  PRIMARY KEY (execution_id, event_seq)
);

-- An execution's log as runs of up to 256 events (store/sqlstore/eventruns.go),
-- keyed by the last seq of each so that the runs after a seq are one range.
CREATE TABLE event_runs (
  execution_id TEXT COLLATE "C" NOT NULL,
  last_seq BIGINT NOT NULL,
  first_seq BIGINT NOT NULL,
  events BYTEA NOT NULL,
  PRIMARY KEY (execution_id, last_seq)
);

CREATE TABLE steps (
  execution_id TEXT COLLATE "C" NOT NULL,
  step_id TEXT COLLATE "C" NOT NULL,
  step_order BIGINT NOT NULL,
  kind TEXT COLLATE "C" NOT NULL,
  target TEXT COLLATE "C" NOT NULL,
  args_hash TEXT COLLATE "C" NOT NULL,
  occurrence BIGINT NOT NULL,
  status TEXT NOT NULL,
  idempotency TEXT NOT NULL,
  error_reason TEXT NOT NULL DEFAULT '',
  resources TEXT NOT NULL DEFAULT '[]',
  started_at BIGINT NOT NULL DEFAULT 0,
  completed_at BIGINT NOT NULL DEFAULT 0,
  dispatch_id TEXT NOT NULL DEFAULT '',
  attempt BIGINT NOT NULL DEFAULT 0,
  terminal_seq BIGINT NOT NULL DEFAULT 0,
  body_execution_id TEXT COLLATE "C" NOT NULL DEFAULT '',
  body_step_id TEXT COLLATE "C" NOT NULL DEFAULT '',
  start_info BYTEA,
  args BYTEA,
  result BYTEA,
  error BYTEA,
  PRIMARY KEY (execution_id, step_id)
) WITH (fillfactor = 80);
CREATE INDEX steps_by_identity ON steps (execution_id, kind, target, args_hash, occurrence);
CREATE INDEX steps_by_order ON steps (execution_id, step_order);
CREATE INDEX steps_by_body ON steps (body_execution_id) WHERE body_execution_id <> '';

CREATE TABLE dispatches (
  id TEXT COLLATE "C" PRIMARY KEY,
  execution_id TEXT COLLATE "C" NOT NULL,
  status TEXT COLLATE "C" NOT NULL,
  attempt BIGINT NOT NULL,
  max_attempts BIGINT NOT NULL,
  progress_attempt BIGINT NOT NULL,
  lease_timeout BIGINT NOT NULL,
  next_attempt_at BIGINT NOT NULL,
  lease_expires_at BIGINT NOT NULL,
  claimed_by TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL,
  updated_at BIGINT NOT NULL
) WITH (fillfactor = 70);
CREATE INDEX dispatches_due ON dispatches (status, next_attempt_at);
CREATE INDEX dispatches_lease ON dispatches (status, lease_expires_at);
CREATE INDEX dispatches_by_execution ON dispatches (execution_id);

CREATE TABLE counters (
  execution_id TEXT COLLATE "C" NOT NULL,
  dispatch_id TEXT COLLATE "C" NOT NULL,
  kind TEXT COLLATE "C" NOT NULL,
  target TEXT COLLATE "C" NOT NULL,
  args_hash TEXT COLLATE "C" NOT NULL,
  consumed BIGINT NOT NULL,
  PRIMARY KEY (execution_id, dispatch_id, kind, target, args_hash)
);

CREATE TABLE idempotency_keys (
  route TEXT COLLATE "C" NOT NULL,
  scope TEXT COLLATE "C" NOT NULL,
  idem_key TEXT COLLATE "C" NOT NULL,
  body_hash TEXT NOT NULL,
  execution_id TEXT COLLATE "C" NOT NULL,
  created_at BIGINT NOT NULL,
  PRIMARY KEY (route, scope, idem_key)
);
CREATE INDEX idempotency_by_execution ON idempotency_keys (execution_id);
CREATE INDEX idempotency_by_age ON idempotency_keys (created_at);

CREATE TABLE approvals (
  id TEXT COLLATE "C" PRIMARY KEY,
  execution_id TEXT COLLATE "C" NOT NULL,
  step_id TEXT COLLATE "C" NOT NULL,
  agent_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  target TEXT NOT NULL,
  status TEXT COLLATE "C" NOT NULL,
  approvers TEXT NOT NULL DEFAULT '[]',
  message TEXT NOT NULL DEFAULT '',
  timeout_at BIGINT NOT NULL,
  decided_by TEXT NOT NULL DEFAULT '',
  decided_at BIGINT NOT NULL DEFAULT 0,
  rationale TEXT NOT NULL DEFAULT '',
  created_at BIGINT NOT NULL
);
CREATE INDEX approvals_pending_timeout ON approvals (timeout_at) WHERE status = 'pending';
CREATE INDEX approvals_by_step ON approvals (execution_id, step_id);
CREATE INDEX approvals_by_status ON approvals (status, id);
CREATE INDEX approvals_by_execution ON approvals (execution_id, id);

CREATE TABLE rate_limit_marks (
  execution_id TEXT COLLATE "C" NOT NULL,
  step_id TEXT COLLATE "C" NOT NULL,
  audited_at BIGINT NOT NULL,
  PRIMARY KEY (execution_id, step_id)
);

CREATE TABLE resources (
  execution_id TEXT COLLATE "C" NOT NULL,
  key TEXT COLLATE "C" NOT NULL,
  position BIGINT NOT NULL,
  driver_id TEXT NOT NULL,
  configuration BYTEA,
  coverage_reuse INTEGER NOT NULL,
  every_steps BIGINT NOT NULL,
  on_completion INTEGER NOT NULL,
  registered_seq BIGINT NOT NULL,
  generation BIGINT NOT NULL,
  binding BYTEA,
  checkpoint_ref TEXT NOT NULL DEFAULT '',
  starts_since_checkpoint BIGINT NOT NULL,
  PRIMARY KEY (execution_id, key)
);

CREATE TABLE checkpoints (
  execution_id TEXT COLLATE "C" NOT NULL,
  key TEXT COLLATE "C" NOT NULL,
  covered_seq BIGINT NOT NULL,
  generation BIGINT NOT NULL,
  checkpoint_ref TEXT NOT NULL,
  invalidated_seq BIGINT NOT NULL DEFAULT 0,
  PRIMARY KEY (execution_id, key, covered_seq)
);
CREATE INDEX checkpoints_open ON checkpoints (execution_id, key) WHERE invalidated_seq = 0;

-- Server mode only: the rate-limit buckets every replica shares
-- (docs/protocol docs/protocol/governance.md §3), one row per bucket. touched_at is the latest check's
-- time; a bucket untouched for longer than its window is full and deleted.
CREATE TABLE rate_buckets (
  bucket_key TEXT COLLATE "C" PRIMARY KEY,
  tokens DOUBLE PRECISION NOT NULL,
  admitted BOOLEAN NOT NULL,
  touched_at BIGINT NOT NULL,
  window_us BIGINT NOT NULL
) WITH (fillfactor = 70);

-- Server mode only: notifications too large for a NOTIFY payload travel
-- here, named by the notification; senders delete rows older than a minute
-- when they store new ones, so the table holds about a minute of them.
CREATE TABLE notification_payloads (
  id TEXT COLLATE "C" PRIMARY KEY,
  data BYTEA NOT NULL,
  created_at BIGINT NOT NULL
);
CREATE INDEX notification_payloads_by_age ON notification_payloads (created_at);
