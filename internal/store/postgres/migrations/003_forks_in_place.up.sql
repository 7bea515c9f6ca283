-- Forks that read their source in place (docs/architecture.md, "Forks"):
-- the log's running mark on the execution row and the mark before each
-- run's first event (NULL on rows written before marks), the seq of each
-- step's first event, and a fork's place in its source.
ALTER TABLE executions ADD COLUMN mark_kept BIGINT;
ALTER TABLE executions ADD COLUMN mark_closed BIGINT;
ALTER TABLE executions ADD COLUMN mark_generations BYTEA;
ALTER TABLE executions ADD COLUMN fork_in_place BIGINT NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN fork_kept BIGINT NOT NULL DEFAULT 0;
ALTER TABLE executions ADD COLUMN fork_steps BIGINT NOT NULL DEFAULT 0;
ALTER TABLE execution_values ADD COLUMN fork_excluded BYTEA;
ALTER TABLE event_runs ADD COLUMN mark_kept BIGINT;
ALTER TABLE event_runs ADD COLUMN mark_closed BIGINT;
ALTER TABLE event_runs ADD COLUMN mark_generations BYTEA;
ALTER TABLE steps ADD COLUMN submitted_seq BIGINT NOT NULL DEFAULT 0;
CREATE INDEX executions_read_in_place ON executions (forked_from) WHERE fork_in_place = 1;
