package sqlstore

import (
	"context"

	"github.com/rebuno/rebuno/internal/store"
)

const resourceCols = `execution_id, key, position, driver_id, configuration, coverage_reuse, every_steps, on_completion,
 registered_seq, generation, binding, checkpoint_ref, starts_since_checkpoint`

func scanResource(s Scanner) (*store.Resource, error) {
	var r store.Resource
	var reuse, onCompletion int
	if err := s.Scan(&r.ExecutionID, &r.Key, &r.Position, &r.DriverID, &r.Configuration, &reuse, &r.EverySteps, &onCompletion,
		&r.RegisteredSeq, &r.Generation, &r.Binding, &r.CheckpointRef, &r.StartsSinceCheckpoint); err != nil {
		return nil, err
	}
	r.CoverageReuse, r.OnCompletion = reuse != 0, onCompletion != 0
	return &r, nil
}

func boolInt(b bool) int {
	if b {
		return 1
	}
	return 0
}

func (q *Queries) Resources(ctx context.Context, executionID string) ([]*store.Resource, error) {
	return list(ctx, q, scanResource, `SELECT `+resourceCols+` FROM resources WHERE execution_id = ? ORDER BY position`, executionID)
}

func (q *Queries) Resource(ctx context.Context, executionID, key string) (*store.Resource, error) {
	r, err := scanResource(q.row(ctx, `SELECT `+resourceCols+` FROM resources WHERE execution_id = ? AND key = ?`, executionID, key))
	return r, notFound(err)
}

func (t *Tx) InsertResource(ctx context.Context, r *store.Resource) error {
	return t.exec(ctx, `INSERT INTO resources (`+resourceCols+`) VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)`,
		r.ExecutionID, r.Key, r.Position, r.DriverID, r.Configuration, boolInt(r.CoverageReuse), r.EverySteps,
		boolInt(r.OnCompletion), r.RegisteredSeq, r.Generation, r.Binding, r.CheckpointRef, r.StartsSinceCheckpoint)
}

func (t *Tx) UpdateResource(ctx context.Context, r *store.Resource) error {
	return t.exec(ctx, `UPDATE resources SET generation = ?, binding = ?, starts_since_checkpoint = ? WHERE execution_id = ? AND key = ?`,
		r.Generation, r.Binding, r.StartsSinceCheckpoint, r.ExecutionID, r.Key)
}

const checkpointCols = `execution_id, key, covered_seq, generation, checkpoint_ref, invalidated_seq, covered_kept, invalidated_kept`

func scanCheckpoint(s Scanner) (*store.Checkpoint, error) {
	var c store.Checkpoint
	err := s.Scan(&c.ExecutionID, &c.Key, &c.CoveredSeq, &c.Generation, &c.CheckpointRef, &c.InvalidatedSeq, &c.CoveredKept, &c.InvalidatedKept)
	return &c, err
}

func (q *Queries) Checkpoints(ctx context.Context, executionID string) ([]*store.Checkpoint, error) {
	return list(ctx, q, scanCheckpoint, `SELECT `+checkpointCols+` FROM checkpoints WHERE execution_id = ? ORDER BY key, covered_seq`, executionID)
}

func (q *Queries) CheckpointAt(ctx context.Context, executionID, key string, seq int64) (*store.Checkpoint, error) {
	c, err := scanCheckpoint(q.row(ctx, `SELECT `+checkpointCols+` FROM checkpoints WHERE execution_id = ? AND key = ? AND covered_seq <= ?
 ORDER BY covered_seq DESC LIMIT 1`, executionID, key, seq))
	if err != nil {
		return nil, notFound(err)
	}
	return c, nil
}

func (q *Queries) CheckpointRange(ctx context.Context, executionID, key string, after, upTo int64) ([]*store.Checkpoint, error) {
	return list(ctx, q, scanCheckpoint, `SELECT `+checkpointCols+` FROM checkpoints WHERE execution_id = ? AND key = ? AND covered_seq > ?
 AND covered_seq <= ? ORDER BY covered_seq`, executionID, key, after, upTo)
}

func (q *Queries) CountCheckpoints(ctx context.Context, executionID, key string, upTo int64) (store.CheckpointCount, error) {
	var c store.CheckpointCount
	err := q.row(ctx, `SELECT COUNT(*), COUNT(DISTINCT covered_kept),
 COALESCE(SUM(CASE WHEN covered_kept = 0 OR (invalidated_seq <> 0 AND invalidated_kept = 0) THEN 1 ELSE 0 END), 0)
 FROM checkpoints WHERE execution_id = ? AND key = ? AND covered_seq <= ?`, executionID, key, upTo).Scan(&c.Rows, &c.KeptCounts, &c.Unmarked)
	return c, err
}

func (t *Tx) InsertCheckpoint(ctx context.Context, c *store.Checkpoint) error {
	return t.exec(ctx, `INSERT INTO checkpoints (`+checkpointCols+`) VALUES (?,?,?,?,?,?,?,?)`,
		c.ExecutionID, c.Key, c.CoveredSeq, c.Generation, c.CheckpointRef, c.InvalidatedSeq, c.CoveredKept, c.InvalidatedKept)
}

func (t *Tx) InvalidateCheckpoints(ctx context.Context, executionID, key string, seq, kept int64) error {
	return t.exec(ctx, `UPDATE checkpoints SET invalidated_seq = ?, invalidated_kept = ? WHERE execution_id = ? AND key = ? AND invalidated_seq = 0`,
		seq, kept, executionID, key)
}
