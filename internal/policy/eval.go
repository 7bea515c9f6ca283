package policy

import (
	"fmt"
	"regexp"
	"slices"
	"strconv"
	"strings"

	"github.com/rebuno/rebuno/internal/jsonx"
)

// Facts is what a rule sees of a new step.
type Facts struct {
	// AgentID is the execution's agent. Empty (as in `policy explain`
	// without --agent) never matches agent_id or agent_ids, since the
	// bundle cannot name an empty agent.
	AgentID string
	Kind    string // tool_call, llm_call or local
	Target  string
	Args    *jsonx.Value // nil: absent or null
}

// Result is the winning decision.
type Result struct {
	Decision string // Allow, Deny or RequireApproval
	RuleID   string
	// Reason is the rule's reason, or the default's (docs/protocol/governance.md §2.4). A deny rule
	// without one yields ReasonPolicyDenied, the text docs/protocol/steps.md §4 records, so
	// that the result is exactly what the kernel stores and shows.
	Reason    string
	Approval  *ApprovalConfig // shared with the Bundle: read only
	RateLimit *RateLimit      // shared with the Bundle: read only
}

// Trace is one rule's part in an evaluation.
type Trace struct {
	RuleID   string
	Priority int32
	Line     int
	Matched  bool
	// Failed names the first condition, in the rule's own order, that the
	// step did not meet; empty when Matched.
	Failed string
}

// Evaluate decides a new step (docs/protocol/governance.md §2.4): rules in ascending priority, the
// first whose conditions all hold wins. A nil bundle is "no policy" and
// allows everything under rule id RulePermissive.
func (b *Bundle) Evaluate(f Facts) Result {
	if b == nil {
		return Result{Decision: Allow, RuleID: RulePermissive}
	}
	for i := range b.Rules {
		if b.Rules[i].When.match(&f, nil) {
			return b.Rules[i].result()
		}
	}
	return b.fallback(&f)
}

// Explain evaluates like Evaluate and also traces every rule tried, in the
// order tried: each rule before the winner with the condition it failed,
// then the winner (Matched). Without a winner every rule is traced.
func (b *Bundle) Explain(f Facts) (Result, []Trace) {
	if b == nil {
		return Result{Decision: Allow, RuleID: RulePermissive}, nil
	}
	var traces []Trace
	for i := range b.Rules {
		r := &b.Rules[i]
		t := Trace{RuleID: r.ID, Priority: r.Priority, Line: r.Line}
		if r.When.match(&f, &t.Failed) {
			t.Matched = true
			return r.result(), append(traces, t)
		}
		traces = append(traces, t)
	}
	return b.fallback(&f), traces
}

func (r *Rule) result() Result {
	reason := r.Then.Reason
	if reason == "" && r.Then.Decision == Deny {
		reason = ReasonPolicyDenied
	}
	return Result{
		Decision:  r.Then.Decision,
		RuleID:    r.ID,
		Reason:    reason,
		Approval:  r.Then.Approval,
		RateLimit: r.Then.RateLimit,
	}
}

func (b *Bundle) fallback(f *Facts) Result {
	switch {
	case f.Kind == "local":
		// Local steps are the agent's own code; only an explicit rule
		// governs them (docs/protocol/steps.md §9).
		return Result{Decision: Allow, RuleID: RuleLocal, Reason: ReasonLocalStep}
	case b.DefaultAction == Allow:
		return Result{Decision: Allow, RuleID: RuleDefault, Reason: ReasonDefaultAllow}
	}
	return Result{Decision: Deny, RuleID: RuleDefault, Reason: ReasonDefaultDeny}
}

type condKind uint8

const (
	condTarget condKind = iota
	condTargets
	condAgentID
	condAgentIDs
	condStepKind
	condArguments
)

type cond struct {
	kind  condKind
	globs []glob    // condTarget (one), condTargets
	strs  []string  // condAgentID (one), condAgentIDs, condStepKind (one)
	args  []argPred // condArguments
}

// match reports whether every condition holds. When why is non-nil a
// failure is also described there; evaluation proper passes nil and
// formats nothing.
func (w *Conditions) match(f *Facts, why *string) bool {
	for i := range w.conds {
		if !w.conds[i].match(f, why) {
			return false
		}
	}
	return true
}

func (c *cond) match(f *Facts, why *string) bool {
	switch c.kind {
	case condTarget, condTargets:
		for i := range c.globs {
			if c.globs[i].match(f.Target) {
				return true
			}
		}
		if why != nil {
			if c.kind == condTarget {
				*why = fmt.Sprintf("target %q does not match %q", f.Target, c.globs[0].pattern)
			} else {
				pats := make([]string, len(c.globs))
				for i := range c.globs {
					pats[i] = c.globs[i].pattern
				}
				*why = fmt.Sprintf("target %q matches none of %s", f.Target, quoteList(pats))
			}
		}
		return false
	case condAgentID, condAgentIDs:
		if slices.Contains(c.strs, f.AgentID) {
			return true
		}
		if why != nil {
			if c.kind == condAgentID {
				*why = fmt.Sprintf("agent_id %q is not %q", f.AgentID, c.strs[0])
			} else {
				*why = fmt.Sprintf("agent_id %q is not one of %s", f.AgentID, quoteList(c.strs))
			}
		}
		return false
	case condStepKind:
		if f.Kind == c.strs[0] {
			return true
		}
		if why != nil {
			*why = fmt.Sprintf("step_kind %q is not %q", f.Kind, c.strs[0])
		}
		return false
	case condArguments:
		return matchArguments(c.args, f.Args, why)
	}
	return false
}

// argPred is one argument's predicate. An empty string, a nil list or a nil
// regexp is an absent constraint (docs/protocol/governance.md §2.3 rule 8).
type argPred struct {
	name     string
	equals   string
	contains string
	oneOf    []string
	regex    *regexp.Regexp
}

func matchArguments(preds []argPred, args *jsonx.Value, why *string) bool {
	if args == nil || args.Kind != jsonx.KindObject {
		if why != nil {
			what := "null or absent"
			if args != nil && args.Kind != jsonx.KindNull {
				what = "a JSON " + args.Kind.String()
			}
			*why = "arguments: args are " + what + ", not a JSON object"
		}
		return false
	}
	for i := range preds {
		p := &preds[i]
		v, ok := member(args, p.name)
		if !ok {
			if why != nil {
				*why = fmt.Sprintf("argument %q is missing", p.name)
			}
			return false
		}
		if !p.match(jsonx.Stringify(v), why) {
			return false
		}
	}
	return true
}

// member looks up a top-level key. Unlike Value.Get it tells a member whose
// value is null (nil in a hand-built Value) from a missing one, and it
// takes the last of repeated keys, as canonical JSON does (docs/protocol/identity.md §2).
func member(obj *jsonx.Value, key string) (*jsonx.Value, bool) {
	var v *jsonx.Value
	found := false
	for i := range obj.Members {
		if obj.Members[i].Key == key {
			v, found = obj.Members[i].Value, true
		}
	}
	return v, found
}

func (p *argPred) match(s string, why *string) bool {
	var failed string
	switch {
	case p.equals != "" && s != p.equals:
		failed = fmt.Sprintf("does not equal %q", p.equals)
	case p.contains != "" && !strings.Contains(s, p.contains):
		failed = fmt.Sprintf("does not contain %q", p.contains)
	case p.oneOf != nil && !slices.Contains(p.oneOf, s):
		failed = "is not one of " + quoteList(p.oneOf)
	case p.regex != nil && !p.regex.MatchString(s):
		failed = fmt.Sprintf("does not match regex %q", p.regex.String())
	default:
		return true
	}
	if why != nil {
		*why = fmt.Sprintf("argument %q = %s %s", p.name, clip(s), failed)
	}
	return false
}

func quoteList(ss []string) string {
	var b strings.Builder
	b.WriteByte('[')
	for i, s := range ss {
		if i > 0 {
			b.WriteString(", ")
		}
		b.WriteString(strconv.Quote(s))
	}
	b.WriteByte(']')
	return b.String()
}

// clip quotes an argument for an explanation, shortened so that a large
// argument (a whole prompt) does not bury the reason.
func clip(s string) string {
	const max = 80
	if len(s) <= max {
		return strconv.Quote(s)
	}
	cut := max
	for cut > 0 && !isRuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}

func isRuneStart(b byte) bool { return b&0xC0 != 0x80 }
