package sqlite

// migrations are applied in order; the index of each entry plus one is the
// schema version it produces. Append only once released: a shipped migration
// never changes. Until the first release (CHANGELOG's "Unreleased") the
// entries below are still shaped in place, so a database written by an
// earlier development build must be recreated.
var migrations = []string{
	`
CREATE TABLE agents (
  id TEXT PRIMARY KEY,
  webhook_url TEXT NOT NULL,
  secret TEXT NOT NULL,
  policy_bundle TEXT NOT NULL DEFAULT '',
  lease_timeout_seconds INTEGER NOT NULL DEFAULT 0,
  description TEXT NOT NULL DEFAULT '',
  input_schema BLOB,
  output_schema BLOB,
  registered_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);

CREATE TABLE executions (
  id TEXT PRIMARY KEY,
  agent_id TEXT NOT NULL,
  agent_version TEXT NOT NULL DEFAULT '',
  status TEXT NOT NULL,
  failure_reason TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL,
  deadline_at INTEGER NOT NULL DEFAULT 0,
  parent_execution_id TEXT NOT NULL DEFAULT '',
  idempotency_key TEXT NOT NULL DEFAULT '',
  on_behalf_of TEXT NOT NULL DEFAULT '',
  forked_from TEXT NOT NULL DEFAULT '',
  fork_seq INTEGER NOT NULL DEFAULT 0,
  restoration BLOB,
  resource_keys TEXT NOT NULL DEFAULT '[]',
  dispatch_id TEXT NOT NULL DEFAULT '',
  last_seq INTEGER NOT NULL DEFAULT 0,
  step_order INTEGER NOT NULL DEFAULT 0,
  step_count INTEGER NOT NULL DEFAULT 0,
  byte_count INTEGER NOT NULL DEFAULT 0
);
CREATE INDEX executions_by_agent ON executions (agent_id, id);

-- The user values of an execution live apart from its row: every operation
-- rewrites the row, and SQLite rewrites a whole row, large values included.
CREATE TABLE execution_values (
  execution_id TEXT PRIMARY KEY,
  input BLOB NOT NULL,
  output BLOB,
  state BLOB
);
CREATE INDEX executions_by_status ON executions (status, id);
CREATE INDEX executions_live_deadline ON executions (deadline_at)
  WHERE deadline_at > 0 AND status IN ('pending','running','blocked');
CREATE INDEX executions_terminal_age ON executions (updated_at)
  WHERE status IN ('completed','failed','cancelled');

CREATE TABLE events (
  execution_id TEXT NOT NULL,
  event_seq INTEGER NOT NULL,
  type TEXT NOT NULL,
  payload BLOB NOT NULL,
  occurred_at INTEGER NOT NULL,
  PRIMARY KEY (execution_id, event_seq)
) WITHOUT ROWID;

CREATE TABLE steps (
  execution_id TEXT NOT NULL,
  step_id TEXT NOT NULL,
  step_order INTEGER NOT NULL,
  kind TEXT NOT NULL,
  target TEXT NOT NULL,
  args_hash TEXT NOT NULL,
  occurrence INTEGER NOT NULL,
  status TEXT NOT NULL,
  idempotency TEXT NOT NULL,
  error_reason TEXT NOT NULL DEFAULT '',
  resources TEXT NOT NULL DEFAULT '[]',
  started_at INTEGER NOT NULL DEFAULT 0,
  completed_at INTEGER NOT NULL DEFAULT 0,
  dispatch_id TEXT NOT NULL DEFAULT '',
  attempt INTEGER NOT NULL DEFAULT 0,
  terminal_seq INTEGER NOT NULL DEFAULT 0,
  body_execution_id TEXT NOT NULL DEFAULT '',
  body_step_id TEXT NOT NULL DEFAULT '',
  -- Bodies last: SQLite reads a row's columns in order, and a large body
  -- spills into overflow pages that reading any later column would walk.
  start_info BLOB,
  args BLOB,
  result BLOB,
  error BLOB,
  PRIMARY KEY (execution_id, step_id)
);
CREATE INDEX steps_by_identity ON steps (execution_id, kind, target, args_hash, occurrence);
CREATE INDEX steps_by_order ON steps (execution_id, step_order);

CREATE TABLE dispatches (
  id TEXT PRIMARY KEY,
  execution_id TEXT NOT NULL,
  status TEXT NOT NULL,
  attempt INTEGER NOT NULL,
  max_attempts INTEGER NOT NULL,
  progress_attempt INTEGER NOT NULL,
  lease_timeout INTEGER NOT NULL,
  next_attempt_at INTEGER NOT NULL,
  lease_expires_at INTEGER NOT NULL,
  claimed_by TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL,
  updated_at INTEGER NOT NULL
);
CREATE INDEX dispatches_due ON dispatches (status, next_attempt_at);
CREATE INDEX dispatches_lease ON dispatches (status, lease_expires_at);
CREATE INDEX dispatches_by_execution ON dispatches (execution_id);

CREATE TABLE counters (
  dispatch_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  target TEXT NOT NULL,
  args_hash TEXT NOT NULL,
  execution_id TEXT NOT NULL,
  consumed INTEGER NOT NULL,
  PRIMARY KEY (dispatch_id, kind, target, args_hash)
);
CREATE INDEX counters_by_execution ON counters (execution_id);

CREATE TABLE idempotency_keys (
  route TEXT NOT NULL,
  scope TEXT NOT NULL,
  idem_key TEXT NOT NULL,
  body_hash TEXT NOT NULL,
  execution_id TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  PRIMARY KEY (route, scope, idem_key)
);
CREATE INDEX idempotency_by_execution ON idempotency_keys (execution_id);
CREATE INDEX idempotency_by_age ON idempotency_keys (created_at);
`,
	`
CREATE TABLE approvals (
  id TEXT PRIMARY KEY,
  execution_id TEXT NOT NULL,
  step_id TEXT NOT NULL,
  agent_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  target TEXT NOT NULL,
  status TEXT NOT NULL,
  approvers TEXT NOT NULL DEFAULT '[]',
  message TEXT NOT NULL DEFAULT '',
  timeout_at INTEGER NOT NULL,
  decided_by TEXT NOT NULL DEFAULT '',
  decided_at INTEGER NOT NULL DEFAULT 0,
  rationale TEXT NOT NULL DEFAULT '',
  created_at INTEGER NOT NULL
);
CREATE INDEX approvals_pending_timeout ON approvals (timeout_at) WHERE status = 'pending';
CREATE INDEX approvals_by_step ON approvals (execution_id, step_id);
CREATE INDEX approvals_by_status ON approvals (status, id);
CREATE INDEX approvals_by_execution ON approvals (execution_id, id);

CREATE TABLE rate_limit_marks (
  execution_id TEXT NOT NULL,
  step_id TEXT NOT NULL,
  audited_at INTEGER NOT NULL,
  PRIMARY KEY (execution_id, step_id)
);
`,
	`
CREATE TABLE resources (
  execution_id TEXT NOT NULL,
  key TEXT NOT NULL,
  position INTEGER NOT NULL,
  driver_id TEXT NOT NULL,
  configuration BLOB,
  coverage_reuse INTEGER NOT NULL,
  every_steps INTEGER NOT NULL,
  on_completion INTEGER NOT NULL,
  registered_seq INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  binding BLOB,
  checkpoint_ref TEXT NOT NULL DEFAULT '',
  starts_since_checkpoint INTEGER NOT NULL,
  PRIMARY KEY (execution_id, key)
);

CREATE TABLE checkpoints (
  execution_id TEXT NOT NULL,
  key TEXT NOT NULL,
  covered_seq INTEGER NOT NULL,
  generation INTEGER NOT NULL,
  checkpoint_ref TEXT NOT NULL,
  invalidated_seq INTEGER NOT NULL DEFAULT 0,
  PRIMARY KEY (execution_id, key, covered_seq)
);
CREATE INDEX checkpoints_open ON checkpoints (execution_id, key) WHERE invalidated_seq = 0;

CREATE INDEX steps_executing ON steps (execution_id) WHERE status = 'executing';
-- One column: a fork's thousands of copies share one key, so they append to
-- one place instead of scattering, and retention asks per source execution.
CREATE INDEX steps_by_body ON steps (body_execution_id) WHERE body_execution_id <> '';
CREATE INDEX executions_by_source ON executions (forked_from, id) WHERE forked_from <> '';
`,
	`
-- An execution's log is stored as runs of events, a row per append of up to
-- 256 events instead of a row per event: the store decodes them (sqlstore's
-- eventruns.go); the events table keeps older rows. Keyed by the last seq, so
-- that the runs after a seq are one range.
CREATE TABLE event_runs (
  execution_id TEXT NOT NULL,
  last_seq INTEGER NOT NULL,
  first_seq INTEGER NOT NULL,
  events BLOB NOT NULL,
  PRIMARY KEY (execution_id, last_seq)
);
`,
	// Every page a step's transactions touch is a WAL frame its commit
	// writes and then waits for. Keyed by their primary keys (WITHOUT
	// ROWID), counters and event runs are one B-tree each instead of a
	// table plus one or two indexes. The counters' key leads with the
	// execution, so that one execution's counters share pages and are
	// deleted by a key prefix.
	`
CREATE TABLE counters_by_key (
  execution_id TEXT NOT NULL,
  dispatch_id TEXT NOT NULL,
  kind TEXT NOT NULL,
  target TEXT NOT NULL,
  args_hash TEXT NOT NULL,
  consumed INTEGER NOT NULL,
  PRIMARY KEY (execution_id, dispatch_id, kind, target, args_hash)
) WITHOUT ROWID;
INSERT INTO counters_by_key SELECT execution_id, dispatch_id, kind, target, args_hash, consumed FROM counters;
DROP TABLE counters;
ALTER TABLE counters_by_key RENAME TO counters;

CREATE TABLE event_runs_by_key (
  execution_id TEXT NOT NULL,
  last_seq INTEGER NOT NULL,
  first_seq INTEGER NOT NULL,
  events BLOB NOT NULL,
  PRIMARY KEY (execution_id, last_seq)
) WITHOUT ROWID;
INSERT INTO event_runs_by_key SELECT execution_id, last_seq, first_seq, events FROM event_runs;
DROP TABLE event_runs;
ALTER TABLE event_runs_by_key RENAME TO event_runs;
`,
	// The executing steps a capture checks for writers (docs/protocol/resources.md §3) are tool and
	// local steps only; leaving LLM calls out of the index spares each of
	// them the two pages its entry would cost.
	`
DROP INDEX steps_executing;
CREATE INDEX steps_writing ON steps (execution_id) WHERE status = 'executing' AND kind <> 'llm_call';
`,
	// The tool and local steps a capture must find at work are listed on
	// their execution's row, which every operation rewrites anyway, instead
	// of in an index that cost each of them an entry at its start and its
	// removal at its end: two of a tool step's sixteen pages.
	`
ALTER TABLE executions ADD COLUMN writing TEXT NOT NULL DEFAULT '[]';
UPDATE executions SET writing = (SELECT json_group_array(step_id) FROM steps
 WHERE steps.execution_id = executions.id AND steps.status = 'executing' AND steps.kind <> 'llm_call')
 WHERE EXISTS (SELECT 1 FROM steps WHERE steps.execution_id = executions.id AND steps.status = 'executing' AND steps.kind <> 'llm_call');
DROP INDEX steps_writing;
`,
	// Access: scoped API keys (only their hashes), the audit log of what
	// they did, console sessions, and deployment-wide settings such as the
	// id that keys carry.
	`
CREATE TABLE api_keys (
  name TEXT PRIMARY KEY,
  role TEXT NOT NULL,
  hash TEXT NOT NULL UNIQUE,
  created_at INTEGER NOT NULL,
  created_by TEXT NOT NULL,
  expires_at INTEGER NOT NULL DEFAULT 0,
  revoked_at INTEGER NOT NULL DEFAULT 0,
  last_used_at INTEGER NOT NULL DEFAULT 0
);
CREATE TABLE audit_log (
  seq INTEGER PRIMARY KEY AUTOINCREMENT,
  at INTEGER NOT NULL,
  actor TEXT NOT NULL,
  action TEXT NOT NULL,
  subject TEXT NOT NULL,
  detail TEXT NOT NULL
);
CREATE TABLE sessions (
  hash TEXT PRIMARY KEY,
  key_name TEXT NOT NULL,
  created_at INTEGER NOT NULL,
  expires_at INTEGER NOT NULL
) WITHOUT ROWID;
CREATE INDEX sessions_by_expiry ON sessions (expires_at);
CREATE TABLE settings (
  name TEXT PRIMARY KEY,
  value TEXT NOT NULL
) WITHOUT ROWID;
`,
	// Forks that read their source in place (docs/architecture.md, "Forks"):
	// the log's running mark on the execution row and the mark before each
	// run's first event (NULL on rows written before marks), the seq of each
	// step's first event (after the bodies: only a fork's planning reads
	// it), and a fork's place in its source.
	`
ALTER TABLE executions ADD COLUMN mark_kept INTEGER;
ALTER TABLE executions ADD COLUMN mark_closed INTEGER;
ALTER TABLE executions ADD COLUMN mark_generations BLOB;
ALTER TABLE executions ADD COLUMN fork_in_place INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN fork_kept INTEGER NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN fork_steps INTEGER NOT NULL DEFAULT 0;
ALTER TABLE execution_values ADD COLUMN fork_excluded BLOB;
ALTER TABLE event_runs ADD COLUMN mark_kept INTEGER;
ALTER TABLE event_runs ADD COLUMN mark_closed INTEGER;
ALTER TABLE event_runs ADD COLUMN mark_generations BLOB;
ALTER TABLE steps ADD COLUMN submitted_seq INTEGER NOT NULL DEFAULT 0;
CREATE INDEX executions_read_in_place ON executions (forked_from) WHERE fork_in_place = 1;
`,
	// The kept count after each checkpoint's covered and invalidated seqs
	// (docs/architecture.md, "Forks"): a fork reading its source in place
	// maps them to its numbering without reading the log. 0 on rows written
	// before.
	`
ALTER TABLE checkpoints ADD COLUMN covered_kept INTEGER NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN invalidated_kept INTEGER NOT NULL DEFAULT 0;
`,
	// Forks read the checkpoints their source closed in place, sized by a
	// count of the rows' kept counts that this index answers alone. The
	// version also keeps older binaries, which cannot show such a fork's
	// checkpoints, from opening the database.
	`
CREATE INDEX checkpoints_kept ON checkpoints (execution_id, key, covered_seq, covered_kept, invalidated_seq, invalidated_kept);
`,
}
