// Package policy compiles and evaluates per-agent policy bundles (docs/protocol/governance.md §2): the
// YAML text an operator stores with an agent, strictly validated so that a
// misspelt key can never silently widen a rule, and evaluated against every
// new step to decide allow, deny or require_approval.
//
// The package does no I/O and reads no clock. It also does not apply rate
// limits: it only validates and carries the rule's rate_limit block (docs/protocol/governance.md §3),
// which the kernel's limiter consumes.
package policy

import "time"

// Decisions a rule or a default can yield.
const (
	Allow           = "allow"
	Deny            = "deny"
	RequireApproval = "require_approval"
)

// Special rule ids (docs/protocol/README.md §6). No bundle may use them as a rule id, so a
// recorded rule id always tells where a decision came from.
const (
	RuleDefault     = "default"
	RuleLocal       = "local"
	RulePermissive  = "permissive"
	RuleBundleError = "bundle-error"
)

// Reasons this package or its caller attach to decisions (docs/protocol/README.md §6).
const (
	ReasonPolicyDenied  = "policy_denied"
	ReasonDefaultDeny   = "no explicit allow rule matched"
	ReasonDefaultAllow  = "default allow"
	ReasonLocalStep     = "local step"
	ReasonBundleInvalid = "policy_bundle_invalid"
)

// Bundle is a compiled, validated policy bundle. It is immutable once
// compiled and safe to share between goroutines; callers must not modify
// it, nor anything a Result points into.
type Bundle struct {
	// DefaultAction is Allow or Deny (Deny when the bundle omits it).
	DefaultAction string
	// Rules are in ascending priority, the order Evaluate tries them.
	Rules []Rule
}

// Rule is one compiled rule.
type Rule struct {
	ID       string
	Priority int32
	// Line is the YAML line where the rule starts, so that explanations can
	// point an operator at the text.
	Line int
	When Conditions
	Then Then
}

// Then is what a rule yields when it wins.
type Then struct {
	Decision string // Allow, Deny or RequireApproval
	// Reason is the bundle's text verbatim, possibly empty.
	Reason string
	// Approval is set only on RequireApproval rules that give an
	// approval_config; nil means no approvers, the kernel's default timeout
	// and no message.
	Approval *ApprovalConfig
	// RateLimit is set only on Allow and RequireApproval rules that give one.
	RateLimit *RateLimit
}

// ApprovalConfig is a rule's approval_config block.
type ApprovalConfig struct {
	Approvers []string      // empty: anyone may decide (docs/protocol/governance.md §1.3)
	Timeout   time.Duration // 0: the kernel's --approval-timeout
	Message   string
}

// RateLimit is a rule's rate_limit block, with its defaults filled in.
type RateLimit struct {
	MaxCalls       int64
	Window         time.Duration
	PerWhat        string // "execution", "agent" or "global"
	OnLimiterError string // "allow" or "deny"
}

// Conditions is a rule's compiled when block. The zero value matches every
// step, as an absent or empty when does.
type Conditions struct {
	// conds keep the order the bundle lists them in, so that an explanation
	// names the first failing condition as the operator reads the rule.
	conds []cond
}
