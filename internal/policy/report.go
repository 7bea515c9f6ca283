package policy

import (
	"strings"
	"time"
)

// Report is an explanation as data: what `rebuno policy explain --json`
// prints and the kernel's explain route answers, so that both show one
// shape.
type Report struct {
	Decision string `json:"decision"`
	RuleID   string `json:"rule_id"`
	Reason   string `json:"reason"`
	// Priority and Line locate the winning rule; absent when no rule won
	// (a default, local steps, or no bundle).
	Priority  *int32           `json:"priority,omitempty"`
	Line      int              `json:"line,omitempty"`
	Approval  *ApprovalReport  `json:"approval,omitempty"`
	RateLimit *RateLimitReport `json:"rate_limit,omitempty"`
	// Trace lists the rules tried, lowest priority first; NotTried counts
	// the rules after the winner.
	Trace    []TraceReport `json:"trace"`
	NotTried int           `json:"not_tried"`
}

// ApprovalReport is the approval a require_approval decision asks for.
type ApprovalReport struct {
	Approvers []string `json:"approvers"`
	Timeout   string   `json:"timeout,omitempty"`
	Message   string   `json:"message,omitempty"`
}

// RateLimitReport is the rate limit the winning rule applies.
type RateLimitReport struct {
	MaxCalls       int64  `json:"max_calls"`
	Window         string `json:"window"`
	PerWhat        string `json:"per_what"`
	OnLimiterError string `json:"on_limiter_error"`
}

// TraceReport is one rule's part in the evaluation.
type TraceReport struct {
	RuleID   string `json:"rule_id"`
	Priority int32  `json:"priority"`
	Line     int    `json:"line"`
	Matched  bool   `json:"matched"`
	Failed   string `json:"failed,omitempty"`
}

// Report explains the decision for f. A nil bundle is "no policy".
func (b *Bundle) Report(f Facts) Report {
	res, trace := b.Explain(f)
	out := Report{Decision: res.Decision, RuleID: res.RuleID, Reason: res.Reason, Trace: []TraceReport{}}
	if b != nil {
		out.NotTried = len(b.Rules) - len(trace)
	}
	for _, t := range trace {
		out.Trace = append(out.Trace, TraceReport{RuleID: t.RuleID, Priority: t.Priority, Line: t.Line, Matched: t.Matched, Failed: t.Failed})
		if t.Matched {
			p := t.Priority
			out.Priority, out.Line = &p, t.Line
		}
	}
	if res.Decision == RequireApproval {
		cfg := res.Approval
		if cfg == nil {
			cfg = &ApprovalConfig{}
		}
		a := &ApprovalReport{Approvers: append([]string{}, cfg.Approvers...), Message: cfg.Message}
		if cfg.Timeout > 0 {
			a.Timeout = ShortDuration(cfg.Timeout)
		}
		out.Approval = a
	}
	if r := res.RateLimit; r != nil {
		out.RateLimit = &RateLimitReport{MaxCalls: r.MaxCalls, Window: ShortDuration(r.Window), PerWhat: r.PerWhat, OnLimiterError: r.OnLimiterError}
	}
	return out
}

// ShortDuration spells a duration as a bundle would: 30s, 5m, 1h30m.
func ShortDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = strings.TrimSuffix(s, "0s")
	}
	if strings.HasSuffix(s, "h0m") {
		s = strings.TrimSuffix(s, "0m")
	}
	return s
}
