package kernel

import (
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/wire"
)

// Policy decisions a bundle can produce.
const (
	PolicyAllow           = "allow"
	PolicyDeny            = "deny"
	PolicyRequireApproval = "require_approval"
)

// StepFacts is what policy sees of a new step.
type StepFacts struct {
	AgentID string
	Kind    string
	Target  string
	Args    *jsonx.Value
}

// PolicyResult is the outcome of evaluating a bundle for one new step.
type PolicyResult struct {
	Decision string
	RuleID   string
	Reason   string
}

// Policy evaluates an agent's bundle. It is the single decision point of the
// submit path (§10.2 step 15); implementations do no I/O.
type Policy interface {
	Evaluate(bundle string, f StepFacts) PolicyResult
}

// Permissive allows every step: the behaviour of an agent without a bundle
// (§19.1), and of this kernel until policy bundles are evaluated.
type Permissive struct{}

// Evaluate implements Policy.
func (Permissive) Evaluate(string, StepFacts) PolicyResult {
	return PolicyResult{Decision: PolicyAllow, RuleID: wire.RulePermissive}
}
