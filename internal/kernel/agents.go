package kernel

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"regexp"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

var agentIDPattern = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._-]{0,127}$`)

// ValidAgentID checks the agent id syntax of docs/protocol/governance.md §4.2.
func ValidAgentID(id string) bool { return agentIDPattern.MatchString(id) }

// AgentSpec is an agent registration (admin API or manifest).
type AgentSpec struct {
	ID                  string
	WebhookURL          string
	Secret              string
	LeaseTimeoutSeconds int64 // 0: the kernel default
	// Policy is applied only when SetPolicy is true: a manifest that names no
	// policy keeps the stored one.
	Policy    string
	SetPolicy bool
}

// ValidateAgent applies the rules of docs/protocol/governance.md §4.2.
func (k *Kernel) ValidateAgent(a AgentSpec) error {
	if !ValidAgentID(a.ID) {
		return validation("id", "id must match %s", agentIDPattern.String())
	}
	if len(a.WebhookURL) > wire.MaxURLBytes {
		return validation("webhook_url", "webhook_url is longer than %d bytes", wire.MaxURLBytes)
	}
	u, err := url.Parse(a.WebhookURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return validation("webhook_url", "webhook_url must be an absolute http or https URL")
	}
	if len(a.Secret) < 1 || len(a.Secret) > wire.MaxSecretBytes {
		return validation("secret", "secret must be 1 to %d bytes", wire.MaxSecretBytes)
	}
	if a.LeaseTimeoutSeconds != 0 {
		if a.LeaseTimeoutSeconds < 1 || a.LeaseTimeoutSeconds > wire.MaxLeaseSeconds {
			return validation("lease_timeout_seconds", "lease_timeout_seconds must be 1 to %d", wire.MaxLeaseSeconds)
		}
		if time.Duration(a.LeaseTimeoutSeconds)*time.Second <= k.cfg.DispatchTimeout {
			return validation("lease_timeout_seconds", "lease_timeout_seconds must be greater than the dispatch timeout (%s)", k.cfg.DispatchTimeout)
		}
	}
	return k.validatePolicy(a)
}

// validatePolicy checks the bundle a registration sets, if any.
func (k *Kernel) validatePolicy(a AgentSpec) error {
	if !a.SetPolicy {
		return nil
	}
	return validateBundle(a.Policy)
}

// RegisterAgent creates an agent or updates its URL, secret and lease,
// keeping its policy, metadata and registration time (docs/protocol/governance.md §4.1).
func (k *Kernel) RegisterAgent(ctx context.Context, a AgentSpec) (*store.Agent, error) {
	if err := k.ValidateAgent(a); err != nil {
		return nil, err
	}
	var out *store.Agent
	err := k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		var err error
		out, err = k.upsertAgent(ctx, tx, a)
		return err
	})
	if err == nil {
		k.warnShortSecret(a)
	}
	return out, err
}

func (k *Kernel) upsertAgent(ctx context.Context, tx store.Tx, a AgentSpec) (*store.Agent, error) {
	now := k.clock.Now()
	row := &store.Agent{ID: a.ID, WebhookURL: a.WebhookURL, Secret: a.Secret, LeaseTimeoutSeconds: a.LeaseTimeoutSeconds,
		PolicyBundle: a.Policy, RegisteredAt: now, UpdatedAt: now}
	if err := tx.UpsertAgent(ctx, row); err != nil {
		return nil, fmt.Errorf("upsert agent: %w", err)
	}
	if a.SetPolicy {
		if err := tx.SetAgentPolicy(ctx, a.ID, a.Policy, now); err != nil {
			return nil, fmt.Errorf("set policy: %w", err)
		}
	}
	tx.AfterCommit(func() { k.forgetAgent(a.ID) })
	stored, err := tx.Agent(ctx, a.ID)
	if err != nil {
		return nil, fmt.Errorf("read agent: %w", err)
	}
	return stored, nil
}

func (k *Kernel) warnShortSecret(a AgentSpec) {
	if len(a.Secret) < 16 {
		k.log.Warn("agent secret is shorter than 16 bytes", slog.String("agent_id", a.ID))
	}
}

// Provision validates every agent of a manifest, then upserts them all in one
// transaction: either every agent is written or none is (docs/protocol/configuration.md §5).
func (k *Kernel) Provision(ctx context.Context, specs []AgentSpec) error {
	for _, a := range specs {
		if err := k.ValidateAgent(a); err != nil {
			return fmt.Errorf("agent %q: %w", a.ID, err)
		}
	}
	err := k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		for _, a := range specs {
			if _, err := k.upsertAgent(ctx, tx, a); err != nil {
				return err
			}
		}
		return nil
	})
	if err == nil {
		for _, a := range specs {
			k.warnShortSecret(a)
		}
	}
	return err
}

// GetAgent reads one agent.
func (k *Kernel) GetAgent(ctx context.Context, id string) (*store.Agent, error) {
	a, err := k.store.Read().Agent(ctx, id)
	if err != nil {
		return nil, notFoundOr(err, "agent")
	}
	return a, nil
}

// ListAgents lists agents by id.
func (k *Kernel) ListAgents(ctx context.Context) ([]*store.Agent, error) {
	list, err := k.store.Read().ListAgents(ctx)
	if err != nil {
		return nil, fmt.Errorf("list agents: %w", err)
	}
	return list, nil
}

// DeleteAgent removes an agent that has no live execution (docs/protocol/governance.md §4.1); the
// history of its terminal executions stays readable.
func (k *Kernel) DeleteAgent(ctx context.Context, id string) error {
	return k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Agent(ctx, id); err != nil {
			return notFoundOr(err, "agent")
		}
		live, err := tx.AgentHasLiveExecutions(ctx, id)
		if err != nil {
			return fmt.Errorf("check live executions: %w", err)
		}
		if live {
			return errConflict("agent has executions that are not terminal")
		}
		tx.AfterCommit(func() { k.forgetAgent(id) })
		return tx.DeleteAgent(ctx, id)
	})
}

// SetPolicy stores an agent's bundle; "" removes it (docs/protocol/governance.md §4.3).
func (k *Kernel) SetPolicy(ctx context.Context, agentID, bundle string) error {
	if err := k.validatePolicy(AgentSpec{ID: agentID, Policy: bundle, SetPolicy: true}); err != nil {
		return err
	}
	return k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		err := tx.SetAgentPolicy(ctx, agentID, bundle, k.clock.Now())
		if errors.Is(err, store.ErrNotFound) {
			return errNotFound("agent")
		}
		tx.AfterCommit(func() { k.forgetAgent(agentID) })
		return err
	})
}

// MetadataRequest is a parsed agent metadata body.
type MetadataRequest struct {
	Description  string
	InputSchema  []byte // verbatim JSON object; nil clears
	OutputSchema []byte
}

// SetMetadata replaces an agent's published description and schemas (docs/protocol/governance.md §4.4).
func (k *Kernel) SetMetadata(ctx context.Context, c Caller, agentID string, m MetadataRequest) error {
	if c.Agent != agentID {
		return errForbidden()
	}
	if len(m.Description) > wire.MaxDescriptionBytes {
		return validation("description", "description is longer than %d bytes", wire.MaxDescriptionBytes)
	}
	if len(m.InputSchema) > wire.MaxSchemaBytes {
		return validation("input_schema", "input_schema is larger than %d bytes", wire.MaxSchemaBytes)
	}
	if len(m.OutputSchema) > wire.MaxSchemaBytes {
		return validation("output_schema", "output_schema is larger than %d bytes", wire.MaxSchemaBytes)
	}
	return k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		err := tx.UpdateAgentMetadata(ctx, agentID, m.Description, m.InputSchema, m.OutputSchema, k.clock.Now())
		if errors.Is(err, store.ErrNotFound) {
			return errNotFound("agent")
		}
		return err
	})
}

// AgentSecret returns the secret of an agent for request verification,
// remembered for agentTTL so that a signed request costs no read.
func (k *Kernel) AgentSecret(ctx context.Context, id string) (string, error) {
	return k.secrets.get(id, time.Now(), agentTTL, func() (string, error) {
		a, err := k.store.Read().Agent(ctx, id)
		if err != nil {
			return "", err
		}
		return a.Secret, nil
	})
}
