-- Forks read the checkpoints their source closed in place, sized by a count
-- of the rows' kept counts that this index answers alone (docs/architecture.md,
-- "Forks"). The version also keeps older binaries, which cannot show such a
-- fork's checkpoints, from starting on the database.
CREATE INDEX checkpoints_kept ON checkpoints (execution_id, key, covered_seq) INCLUDE (covered_kept, invalidated_seq, invalidated_kept);
