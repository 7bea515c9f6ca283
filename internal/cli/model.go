package cli

import (
	"encoding/json"
	"time"

	"github.com/rebuno/rebuno/internal/wire"
)

// Execution is the resource of docs/protocol/executions.md §1 as the client reads it.
type Execution struct {
	ID            string          `json:"id"`
	AgentID       string          `json:"agent_id"`
	AgentVersion  string          `json:"agent_version"`
	Input         json.RawMessage `json:"input"`
	Status        string          `json:"status"`
	Output        json.RawMessage `json:"output"`
	FailureReason string          `json:"failure_reason"`
	CreatedAt     time.Time       `json:"created_at"`
	UpdatedAt     time.Time       `json:"updated_at"`
	DeadlineAt    *time.Time      `json:"deadline_at"`
	Parent        string          `json:"parent_execution_id"`
	Idempotency   string          `json:"idempotency_key"`
	OnBehalfOf    string          `json:"on_behalf_of"`
	ForkedFrom    string          `json:"forked_from"`
	ForkSeq       *int64          `json:"fork_seq"`
	Restoration   json.RawMessage `json:"restoration"`
	ResourceKeys  []string        `json:"resource_keys"`
}

// Page is the list answer of docs/protocol/executions.md §1, with each execution's bytes kept.
type Page struct {
	Executions []json.RawMessage `json:"executions"`
	NextCursor string            `json:"next_cursor"`
}

// Event is the event of docs/protocol/events.md §1.
type Event struct {
	ExecutionID string          `json:"execution_id"`
	Seq         int64           `json:"event_seq"`
	Type        string          `json:"type"`
	Payload     json.RawMessage `json:"payload"`
	OccurredAt  time.Time       `json:"occurred_at"`
}

// Step is the step of docs/protocol/steps.md §11.
type Step struct {
	StepID      string          `json:"step_id"`
	Kind        string          `json:"kind"`
	Target      string          `json:"target"`
	Occurrence  int64           `json:"occurrence"`
	Status      string          `json:"status"`
	Idempotency string          `json:"idempotency"`
	Args        json.RawMessage `json:"args"`
	Result      json.RawMessage `json:"result"`
	Error       json.RawMessage `json:"error"`
	StartedAt   *time.Time      `json:"started_at"`
	CompletedAt *time.Time      `json:"completed_at"`
}

// Agent is the agent of docs/protocol/governance.md §4.1.
type Agent struct {
	ID                  string          `json:"id"`
	WebhookURL          string          `json:"webhook_url"`
	PolicyBundle        string          `json:"policy_bundle"`
	LeaseTimeoutSeconds *int64          `json:"lease_timeout_seconds"`
	Description         string          `json:"description"`
	InputSchema         json.RawMessage `json:"input_schema"`
	OutputSchema        json.RawMessage `json:"output_schema"`
	RegisteredAt        time.Time       `json:"registered_at"`
	UpdatedAt           time.Time       `json:"updated_at"`
}

func isTerminal(status string) bool { return wire.ExecTerminal(status) }
