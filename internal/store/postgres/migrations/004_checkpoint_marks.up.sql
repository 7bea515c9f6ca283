-- The kept count after each checkpoint's covered and invalidated seqs
-- (docs/architecture.md, "Forks"): a fork reading its source in place maps
-- them to its numbering without reading the log. 0 on rows written before.
ALTER TABLE checkpoints ADD COLUMN covered_kept BIGINT NOT NULL DEFAULT 0;
ALTER TABLE checkpoints ADD COLUMN invalidated_kept BIGINT NOT NULL DEFAULT 0;
