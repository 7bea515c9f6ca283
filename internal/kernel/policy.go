package kernel

import (
	"context"
	"fmt"
	"log/slog"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/wire"
)

// Policy decisions a bundle can produce.
const (
	PolicyAllow           = policy.Allow
	PolicyDeny            = policy.Deny
	PolicyRequireApproval = policy.RequireApproval
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
	Decision  string
	RuleID    string
	Reason    string
	Approval  *policy.ApprovalConfig // require_approval only; nil: defaults
	RateLimit *policy.RateLimit      // allow and require_approval only
}

// Policy evaluates an agent's bundle text. It is the single decision point
// of the submit path (docs/protocol/steps.md §2 step 15); implementations do no I/O.
type Policy interface {
	Evaluate(bundle string, f StepFacts) PolicyResult
}

// Bundles is the kernel's policy: it compiles bundle texts once (an LRU keyed
// by the text's hash, docs/protocol/governance.md §2.1) and evaluates them. No bundle allows every step
// under "permissive"; a stored bundle that no longer compiles (possible only
// after an upgrade with stricter validation) denies under "bundle-error".
type Bundles struct {
	cache *policy.Cache
	log   *slog.Logger
}

// NewBundles returns the default policy.
func NewBundles(log *slog.Logger) *Bundles {
	return &Bundles{cache: policy.NewCache(policy.DefaultCacheSize), log: log}
}

// Evaluate implements Policy.
func (b *Bundles) Evaluate(text string, f StepFacts) PolicyResult {
	bundle, err := b.cache.Get(text)
	if err != nil {
		b.log.Error("stored policy bundle does not compile; denying", slog.String("agent_id", f.AgentID), slog.Any("error", err))
		return PolicyResult{Decision: PolicyDeny, RuleID: wire.RuleBundleError, Reason: wire.ReasonPolicyBundleInvalid}
	}
	r := bundle.Evaluate(policy.Facts{AgentID: f.AgentID, Kind: f.Kind, Target: f.Target, Args: f.Args})
	return PolicyResult{Decision: r.Decision, RuleID: r.RuleID, Reason: r.Reason, Approval: r.Approval, RateLimit: r.RateLimit}
}

// Permissive allows every step, whatever the bundle says. Tests use it.
type Permissive struct{}

// Evaluate implements Policy.
func (Permissive) Evaluate(string, StepFacts) PolicyResult {
	return PolicyResult{Decision: PolicyAllow, RuleID: wire.RulePermissive}
}

// validateBundle checks a bundle before it is stored (docs/protocol/governance.md §2.3).
func validateBundle(text string) error {
	if _, err := policy.Parse(text); err != nil {
		return &Error{Code: wire.CodeValidation, Field: "bundle", Message: "invalid policy bundle: " + err.Error()}
	}
	return nil
}

// agentTTL is how long the kernel reuses an agent's bundle text and secret
// without reading them again; a change made on this kernel applies at once,
// one made elsewhere within the 2 s allowed for policies
// (docs/protocol/governance.md §2.1) and agents (docs/protocol/governance.md §4.1).
const agentTTL = time.Second

// agentBundle returns the bundle text of the execution's agent.
func (o *op) agentBundle() (string, error) {
	return o.k.bundles.get(o.e.AgentID, o.now, agentTTL, func() (string, error) {
		agent, err := o.tx.Agent(o.ctx, o.e.AgentID)
		if err != nil {
			return "", fmt.Errorf("read agent policy: %w", err)
		}
		return agent.PolicyBundle, nil
	})
}

// forgetAgent drops what the kernel remembers of an agent that changed.
func (k *Kernel) forgetAgent(agentID string) {
	k.bundles.forget(agentID)
	k.secrets.forget(agentID)
}

// ExplainPolicy says which rule of an agent's stored bundle would decide a
// new step with these facts, and why the rules before it do not: the
// evaluator of the submit path, traced (docs/protocol/governance.md §2.4 and §2.6).
// Rate-limit budgets are not consulted; the report names the limit.
func (k *Kernel) ExplainPolicy(ctx context.Context, f StepFacts) (policy.Report, error) {
	if !wire.ValidKind(f.Kind) {
		return policy.Report{}, validation("kind", "kind must be tool_call, llm_call or local")
	}
	a, err := k.GetAgent(ctx, f.AgentID)
	if err != nil {
		return policy.Report{}, err
	}
	b, err := policy.Parse(a.PolicyBundle)
	if err != nil {
		// What the submit path does with a stored bundle that no longer
		// compiles (Bundles.Evaluate).
		return policy.Report{Decision: PolicyDeny, RuleID: wire.RuleBundleError, Reason: wire.ReasonPolicyBundleInvalid,
			Trace: []policy.TraceReport{}}, nil
	}
	return b.Report(policy.Facts{AgentID: f.AgentID, Kind: f.Kind, Target: f.Target, Args: f.Args}), nil
}
