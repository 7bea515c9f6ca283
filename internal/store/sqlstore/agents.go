package sqlstore

import (
	"context"
	"database/sql"
	"errors"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

const agentCols = `id, webhook_url, secret, policy_bundle, lease_timeout_seconds, description, input_schema,
 output_schema, registered_at, updated_at`

func scanAgent(s Scanner) (*store.Agent, error) {
	var a store.Agent
	var reg, upd int64
	if err := s.Scan(&a.ID, &a.WebhookURL, &a.Secret, &a.PolicyBundle, &a.LeaseTimeoutSeconds, &a.Description,
		&a.InputSchema, &a.OutputSchema, &reg, &upd); err != nil {
		return nil, err
	}
	a.RegisteredAt, a.UpdatedAt = fromTS(reg), fromTS(upd)
	return &a, nil
}

func (q *Queries) Agent(ctx context.Context, id string) (*store.Agent, error) {
	return q.agent(ctx, id, "")
}

// agent reads an agent, its row locked by lock when it is not "".
func (q *Queries) agent(ctx context.Context, id, lock string) (*store.Agent, error) {
	a, err := scanAgent(q.row(ctx, `SELECT `+agentCols+` FROM agents WHERE id = ?`+lock, id))
	return a, notFound(err)
}

func (q *Queries) ListAgents(ctx context.Context) ([]*store.Agent, error) {
	return list(ctx, q, scanAgent, `SELECT `+agentCols+` FROM agents ORDER BY id`)
}

func (q *Queries) AgentHasLiveExecutions(ctx context.Context, agentID string) (bool, error) {
	var one int
	// Through the live executions, which are few, rather than through all of
	// the agent's, which grow with its history.
	err := q.row(ctx, `SELECT 1 FROM executions`+q.D.IndexedBy("executions_by_status")+`
 WHERE status IN (`+nonTerminalList+`) AND agent_id = ? LIMIT 1`, agentID).Scan(&one)
	if errors.Is(err, sql.ErrNoRows) {
		return false, nil
	}
	return err == nil, err
}

// UpsertAgent creates the agent or updates its webhook URL, secret and lease
// timeout, keeping the policy, metadata and registration time (docs/protocol/governance.md §4.1). The
// policy bundle of a is written only on insert.
func (t *Tx) UpsertAgent(ctx context.Context, a *store.Agent) error {
	return t.exec(ctx, `INSERT INTO agents (`+agentCols+`) VALUES (?,?,?,?,?,?,?,?,?,?)
 ON CONFLICT (id) DO UPDATE SET webhook_url = excluded.webhook_url, secret = excluded.secret,
 lease_timeout_seconds = excluded.lease_timeout_seconds, updated_at = excluded.updated_at`,
		a.ID, a.WebhookURL, a.Secret, a.PolicyBundle, a.LeaseTimeoutSeconds, a.Description, a.InputSchema, a.OutputSchema,
		ts(a.RegisteredAt), ts(a.UpdatedAt))
}

func (t *Tx) UpdateAgentMetadata(ctx context.Context, id, description string, in, out []byte, now time.Time) error {
	res, err := t.result(ctx, `UPDATE agents SET description = ?, input_schema = ?, output_schema = ?, updated_at = ? WHERE id = ?`,
		description, in, out, ts(now), id)
	return affected(res, err)
}

func (t *Tx) SetAgentPolicy(ctx context.Context, id, bundle string, now time.Time) error {
	res, err := t.result(ctx, `UPDATE agents SET policy_bundle = ?, updated_at = ? WHERE id = ?`, bundle, ts(now), id)
	return affected(res, err)
}

func (t *Tx) DeleteAgent(ctx context.Context, id string) error {
	res, err := t.result(ctx, `DELETE FROM agents WHERE id = ?`, id)
	return affected(res, err)
}

func affected(res sql.Result, err error) error {
	if err != nil {
		return err
	}
	n, err := res.RowsAffected()
	if err != nil {
		return err
	}
	if n == 0 {
		return store.ErrNotFound
	}
	return nil
}
