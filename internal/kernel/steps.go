package kernel

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/rebuno/rebuno/internal/events"
	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// SubmitRequest is a parsed submit body plus its occurrence header.
type SubmitRequest struct {
	Kind        string
	Target      string
	Args        []byte       // verbatim JSON; nil when absent or null
	ArgsValue   *jsonx.Value // parsed args; nil when absent or null
	Idempotency string
	Resources   []string
	// Occurrence is the Rebuno-Step-Occurrence header, when HasOccurrence.
	Occurrence    int64
	HasOccurrence bool
	// Outcome is an earlier step's outcome the submit carries (docs/protocol/steps.md §13).
	Outcome *CarriedOutcome
}

// ResourceEntry is one entry of a proceed decision's resources (docs/protocol/steps.md §3).
type ResourceEntry struct {
	Key        string
	Generation int64
	Due        bool
}

// Decision is the 200 answer of submit and of step complete/fail.
type Decision struct {
	Decision     string
	StepID       string
	Result       []byte // present when non-nil
	Error        []byte // present when non-nil
	ApprovalID   string
	Reason       string
	RuleID       string
	RetryAfterMS int64 // present when > 0
	// Resources is sent on proceed only (always, [] when empty).
	Resources []ResourceEntry
	// Occurrence is echoed in the Rebuno-Step-Occurrence header when the
	// decision names a step.
	Occurrence int64
}

func terminalDecision() *Decision { return &Decision{Decision: wire.DecisionExecutionTerminal} }

// validateSubmit applies the value rules of docs/protocol/steps.md §1.
func validateSubmit(r *SubmitRequest) error {
	if !wire.ValidKind(r.Kind) {
		if r.Kind == "" {
			return validation("kind", "kind is required")
		}
		return validation("kind", "unknown kind %q", r.Kind)
	}
	if len(r.Target) > wire.MaxTargetBytes {
		return validation("target", "target is longer than %d bytes", wire.MaxTargetBytes)
	}
	for i := 0; i < len(r.Target); i++ {
		if c := r.Target[i]; c < 0x20 || c == 0x7f {
			return validation("target", "target contains a control character")
		}
	}
	switch r.Idempotency {
	case "":
		r.Idempotency = wire.SafeToRetry
	case wire.SafeToRetry, wire.AtMostOnce:
	default:
		return validation("idempotency", "unknown idempotency %q", r.Idempotency)
	}
	if len(r.Resources) > 0 {
		if r.Kind == wire.KindLLMCall {
			return validation("resources", "resources are not allowed on an llm_call step")
		}
		seen := make(map[string]bool, len(r.Resources))
		keys := r.Resources[:0:0]
		for _, key := range r.Resources {
			if !ValidResourceKey(key) {
				return validation("resources", "invalid resource key %q", key)
			}
			if !seen[key] {
				seen[key] = true
				keys = append(keys, key)
			}
		}
		if len(keys) > wire.MaxResourcesPerStep {
			return validation("resources", "more than %d resource keys", wire.MaxResourcesPerStep)
		}
		r.Resources = keys
	}
	if r.HasOccurrence && r.Occurrence < 0 {
		return validation(wire.HeaderStepOccurrence, "occurrence must not be negative")
	}
	return nil
}

// ValidResourceKey checks the key syntax of docs/protocol/resources.md §1.
func ValidResourceKey(key string) bool {
	if len(key) < 1 || len(key) > wire.MaxResourceKeyBytes || key == "." || key == ".." {
		return false
	}
	for i := 0; i < len(key); i++ {
		c := key[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// SubmitStep is the heart of the protocol (docs/protocol/steps.md §2): it names the step, replays
// what is recorded, and records what is new. A submit may carry the outcome
// of an earlier step, which is recorded first, in the same transaction
// (docs/protocol/steps.md §13).
func (k *Kernel) SubmitStep(ctx context.Context, c Caller, id string, h DispatchHeaders, r SubmitRequest) (*Decision, error) {
	if h.ID == "" {
		return nil, MissingDispatchID()
	}
	if err := validateSubmit(&r); err != nil {
		return nil, err
	}
	if err := validateCarried(r.Outcome); err != nil {
		return nil, err
	}
	args := r.Args
	if len(args) == 0 {
		args = []byte("null")
	}
	argsHash := identity.ArgsHash(r.ArgsValue)

	var dec *Decision
	var refusal error
	err := k.update(ctx, id, func(o *op) error {
		dec, refusal = nil, nil
		if err := o.load(id, c); err != nil {
			return err
		}
		d, superseded, stop, err := o.admitCarrying(r.Outcome, h)
		if stop != nil || err != nil {
			dec = stop
			return err
		}
		plan, err := o.planSubmit(d, superseded, &r, argsHash)
		if err != nil {
			// A refused submit writes nothing; a carried outcome still
			// stands, as if it had come alone (docs/protocol/steps.md §13).
			refusal = err
			if r.Outcome != nil && isRefusal(err) {
				return nil
			}
			return err
		}
		if dec, err = o.decideSubmit(plan, d, h, &r, args); err != nil {
			return err
		}
		if r.Outcome != nil && o.overLimit() {
			return errCarriedLimit
		}
		return nil
	})
	switch {
	case errors.Is(err, errStorageLimit):
		return terminalDecision(), nil
	case errors.Is(err, errCarriedLimit):
		return terminalDecision(), k.recordThenFail(ctx, c, id, h, r.Outcome)
	case err != nil:
		return nil, err
	case refusal != nil:
		return nil, refusal
	}
	return dec, nil
}

// submitPlan is what a submit's admission decided: the step it names and
// whether that step can already exist.
type submitPlan struct {
	stepID     string
	argsHash   string
	occ        int64
	consumed   int64
	hasCounter bool
	mayExist   bool
}

// planSubmit applies the checks of docs/protocol/steps.md §2 steps 9–11 once the request is
// admitted. It writes nothing: every refusal of a submit comes from here, so
// that a carried outcome can commit alone when the submit is refused.
func (o *op) planSubmit(d *store.Dispatch, superseded bool, r *SubmitRequest, argsHash string) (*submitPlan, error) {
	if superseded {
		return nil, o.k.refuseSuperseded()
	}
	for _, key := range r.Resources {
		if !contains(o.e.ResourceKeys, key) {
			return nil, validation("resources", "unknown resource key %q", key)
		}
	}
	// The occurrence is the next of this dispatch's counter, or the
	// agent's when it names one. A named occurrence has two bounds: at
	// most one past the highest recorded for the identity, and at most
	// the counter's next, so that it can only be the call the agent makes
	// next or a retry of one it made. mayExist says whether a step with
	// the resulting id can be recorded already: not when the agent names
	// the occurrence after the highest one, which spares each new step of
	// such an agent a read.
	p := &submitPlan{argsHash: argsHash, mayExist: true}
	var n store.Occurrences
	var err error
	if r.HasOccurrence {
		// Both bounds in one query.
		if n, err = o.tx.Occurrences(o.ctx, o.e.ID, d.ID, r.Kind, r.Target, argsHash); err != nil {
			return nil, fmt.Errorf("read counter and occurrences: %w", err)
		}
	} else if n.Consumed, n.HasCounter, err = o.tx.Counter(o.ctx, o.e.ID, d.ID, r.Kind, r.Target, argsHash); err != nil {
		return nil, fmt.Errorf("read counter: %w", err)
	}
	p.consumed, p.hasCounter = n.Consumed, n.HasCounter
	if p.hasCounter {
		p.occ = p.consumed + 1
	}
	if r.HasOccurrence {
		v, err := o.view()
		if err != nil {
			return nil, err
		}
		highest, found, err := o.k.withCopiedOccurrences(o.ctx, o.tx, v, r.Kind, r.Target, argsHash, n.Highest, n.HasHighest)
		if err != nil {
			return nil, fmt.Errorf("read occurrences: %w", err)
		}
		limit := int64(0)
		if found {
			limit = highest + 1
		}
		if r.Occurrence > limit || r.Occurrence > p.occ {
			return nil, &Error{Code: wire.CodeValidation, Field: wire.HeaderStepOccurrence,
				Message: "validation error: occurrence is ahead of the kernel"}
		}
		p.occ = r.Occurrence
		p.mayExist = p.occ < limit
	}
	p.stepID = identity.StepID(o.e.ID, r.Kind, r.Target, argsHash, p.occ)
	return p, nil
}

// decideSubmit answers an admitted submit (docs/protocol/steps.md §2 steps 12–17).
func (o *op) decideSubmit(p *submitPlan, d *store.Dispatch, h DispatchHeaders, r *SubmitRequest, args []byte) (*Decision, error) {
	existing, err := (*store.Step)(nil), error(store.ErrNotFound)
	if p.mayExist {
		var v *forkView
		if v, err = o.view(); err != nil {
			return nil, err
		}
		existing, err = o.k.stepForSubmit(o.ctx, o.tx, v, o.e.ID, p.stepID, r.Kind, r.Target, p.argsHash, p.occ)
	}
	m := o.k.metrics
	var dec *Decision
	switch {
	case err == nil:
		dec, err = o.replayStep(existing, d, h, *r)
		o.tx.AfterCommit(func() { m.ReplayTotal.WithLabelValues("true").Inc() })
	case !errors.Is(err, store.ErrNotFound):
		return nil, fmt.Errorf("read step: %w", err)
	case o.e.Status == wire.ExecBlocked:
		dec, err = &Decision{Decision: wire.DecisionExecutionBlocked}, nil
	default:
		dec, err = o.recordNewStep(p.stepID, p.occ, p.argsHash, args, d, h, *r)
		o.tx.AfterCommit(func() { m.ReplayTotal.WithLabelValues("false").Inc() })
	}
	if err != nil {
		return nil, err
	}
	if dec.StepID != "" {
		dec.Occurrence = p.occ
		if !p.hasCounter || p.occ > p.consumed {
			if err := o.tx.RaiseCounter(o.ctx, o.e.ID, d.ID, r.Kind, r.Target, p.argsHash, p.occ); err != nil {
				return nil, fmt.Errorf("advance counter: %w", err)
			}
		}
	}
	// A blocked execution has no live dispatch to renew: the submit that
	// blocked it released the dispatch, and d still holds its old row.
	if dec.Decision != wire.DecisionExecutionTerminal && o.e.Status != wire.ExecBlocked {
		if err := o.renew(d, h); err != nil {
			return nil, err
		}
	}
	return dec, nil
}

// replayStep answers a submit of a step that already exists (docs/protocol/steps.md §5).
func (o *op) replayStep(s *store.Step, d *store.Dispatch, h DispatchHeaders, r SubmitRequest) (*Decision, error) {
	switch s.Status {
	case wire.StepSucceeded:
		return &Decision{Decision: wire.DecisionReplay, StepID: s.StepID, Result: nullIfEmpty(s.Result)}, nil
	case wire.StepFailed, wire.StepCancelled:
		return &Decision{Decision: wire.DecisionReplay, StepID: s.StepID, Error: nullIfEmpty(s.Error)}, nil
	case wire.StepDenied:
		return deniedDecision(s), nil
	case wire.StepAwaitingApproval:
		approvalID, err := o.k.pendingApprovalID(o, s)
		if err != nil {
			return nil, err
		}
		return &Decision{Decision: wire.DecisionBlocked, StepID: s.StepID, ApprovalID: approvalID}, nil
	case wire.StepAllowed, wire.StepProposed:
		o.enforce = true
		if s.StartedAt.IsZero() {
			s.StartedAt = o.now
		}
		return o.start(s, d, h, false)
	case wire.StepExecuting:
		if r.HasOccurrence && h.Attempt > 0 && s.DispatchID == d.ID && s.Attempt == h.Attempt {
			// The proceed of this very attempt was lost; its body never ran.
			entries, err := o.restartEntries(s)
			if err != nil {
				return nil, err
			}
			return &Decision{Decision: wire.DecisionProceed, StepID: s.StepID, Resources: entries}, nil
		}
		o.enforce = true
		if s.Idempotency == wire.AtMostOnce || r.Idempotency == wire.AtMostOnce {
			errJSON := indeterminateError()
			s.Status = wire.StepFailed
			o.stopWriting(s)
			s.Error = errJSON
			s.ErrorReason = wire.ReasonIndeterminate
			s.CompletedAt = o.now
			o.e.ByteCount += int64(len(errJSON))
			o.emit(wire.EventStepFailed, stepPayload(s).Raw("error", errJSON))
			s.TerminalSeq = o.e.LastSeq
			if err := o.tx.UpdateStep(o.ctx, s); err != nil {
				return nil, fmt.Errorf("fail orphan step: %w", err)
			}
			return &Decision{Decision: wire.DecisionReplay, StepID: s.StepID, Error: errJSON}, nil
		}
		return o.start(s, d, h, true)
	}
	return nil, fmt.Errorf("step %s has unknown status %q", s.StepID, s.Status)
}

// start makes s executing under the requesting attempt and appends its live
// start (docs/protocol/steps.md §5, docs/protocol/resources.md §3.1).
func (o *op) start(s *store.Step, d *store.Dispatch, h DispatchHeaders, retry bool) (*Decision, error) {
	s.Status = wire.StepExecuting
	o.startWriting(s)
	s.DispatchID = d.ID
	s.Attempt = requestAttempt(d, h)
	p := stepPayload(s)
	if retry {
		p.Bool("retry", true)
	}
	entries, err := o.liveStart(s, p)
	if err != nil {
		return nil, err
	}
	o.emit(wire.EventStepExecuting, p)
	if err := o.tx.UpdateStep(o.ctx, s); err != nil {
		return nil, fmt.Errorf("start step: %w", err)
	}
	return &Decision{Decision: wire.DecisionProceed, StepID: s.StepID, Resources: entries}, nil
}

// requestAttempt is the attempt a request acts for: its header, else the
// dispatch's current attempt.
func requestAttempt(d *store.Dispatch, h DispatchHeaders) int64 {
	if h.Attempt > 0 {
		return h.Attempt
	}
	return d.Attempt
}

func deniedDecision(s *store.Step) *Decision {
	reason, ruleID := wire.ReasonPolicyDenied, ""
	if v, err := jsonx.Parse(s.Error, wire.MaxNesting); err == nil && v.Kind == jsonx.KindObject {
		if r := v.Get("reason"); r != nil && r.Kind == jsonx.KindString && r.Str != "" {
			reason = r.Str
		}
		if r := v.Get("rule_id"); r != nil && r.Kind == jsonx.KindString {
			ruleID = r.Str
		}
	}
	return &Decision{Decision: wire.DecisionDenied, StepID: s.StepID, Reason: reason, RuleID: ruleID}
}

func indeterminateError() []byte {
	return (&jsonx.Object{}).String("message", wire.IndeterminateMessage).String("reason", wire.ReasonIndeterminate).Bytes()
}

func nullIfEmpty(b []byte) []byte {
	if len(b) == 0 {
		return []byte("null")
	}
	return b
}

// recordNewStep records a step never seen before (docs/protocol/steps.md §2 steps 14–16, docs/protocol/steps.md §4).
func (o *op) recordNewStep(stepID string, occ int64, argsHash string, args []byte, d *store.Dispatch, h DispatchHeaders, r SubmitRequest) (*Decision, error) {
	o.enforce = true
	s := &store.Step{
		ExecutionID: o.e.ID, StepID: stepID, Kind: r.Kind, Target: r.Target, ArgsHash: argsHash, Occurrence: occ,
		Idempotency: r.Idempotency, Args: args, Resources: r.Resources, DispatchID: d.ID, Attempt: requestAttempt(d, h),
	}
	if s.Resources == nil {
		s.Resources = []string{}
	}
	o.e.StepOrder++
	o.e.StepCount++
	o.e.ByteCount += int64(len(args))
	s.Order = o.e.StepOrder

	if r.Idempotency == wire.AtMostOnce {
		v, err := o.view()
		if err != nil {
			return nil, err
		}
		refused, err := o.k.hasIndeterminate(o.ctx, o.tx, v, o.e.ID, r.Kind, r.Target, argsHash)
		if err != nil {
			return nil, fmt.Errorf("look up indeterminate predecessor: %w", err)
		}
		if refused {
			return o.recordDenied(s, wire.ReasonIndeterminateRefused, wire.RuleIndeterminateRetry)
		}
	}

	bundle, err := o.agentBundle()
	if err != nil {
		return nil, err
	}
	start := time.Now()
	res := o.k.policy.Evaluate(bundle, StepFacts{AgentID: o.e.AgentID, Kind: r.Kind, Target: r.Target, Args: r.ArgsValue})
	m := o.k.metrics
	m.PolicyLatency.Observe(time.Since(start).Seconds())
	if res.RateLimit != nil && res.Decision != PolicyDeny {
		limited, err := o.rateLimit(s, res)
		if err != nil || limited != nil {
			return limited, err
		}
	}
	kind := r.Kind
	o.tx.AfterCommit(func() {
		m.StepsSubmitted.WithLabelValues(kind).Inc()
		m.PolicyDecisions.WithLabelValues(res.Decision).Inc()
	})
	switch res.Decision {
	case PolicyDeny:
		reason := res.Reason
		if reason == "" {
			reason = wire.ReasonPolicyDenied
		}
		return o.recordDenied(s, reason, res.RuleID)
	case PolicyRequireApproval:
		return o.recordAwaitingApproval(s, res)
	case PolicyAllow:
		s.Status = wire.StepExecuting
		o.startWriting(s)
		s.StartedAt = o.now
		o.propose(s)
		allowed := stepPayload(s)
		if res.RuleID != "" {
			allowed.String("rule_id", res.RuleID)
		}
		o.emit(wire.EventStepAllowed, allowed)
		executing := stepPayload(s)
		entries, err := o.liveStart(s, executing)
		if err != nil {
			return nil, err
		}
		o.emit(wire.EventStepExecuting, executing)
		if err := o.tx.InsertStep(o.ctx, s); err != nil {
			return nil, fmt.Errorf("insert step: %w", err)
		}
		return &Decision{Decision: wire.DecisionProceed, StepID: s.StepID, Resources: entries}, nil
	}
	return nil, fmt.Errorf("policy returned unknown decision %q", res.Decision)
}

// rateLimit consults the limiter for a new step whose winning rule carries a
// rate limit (docs/protocol/governance.md §3). A refusal records no step and leaves the occurrence
// counter alone, so an identical retry names the same step; it is audited
// at most once per step id per window. It returns nil when the step may go
// on.
func (o *op) rateLimit(s *store.Step, res PolicyResult) (*Decision, error) {
	rl, m := res.RateLimit, o.k.metrics
	key := bucketKey(res.RuleID, rl, o.e.ID, o.e.AgentID)
	ok, retryAfter, err := o.k.limiter.Check(key, rl.MaxCalls, rl.Window, o.now)
	dec := &Decision{Decision: wire.DecisionRateLimited, Reason: wire.ReasonRateLimitExceeded}
	switch {
	case err != nil && rl.OnLimiterError != PolicyDeny:
		o.k.log.Warn("rate limiter failed; admitting the step", "rule_id", res.RuleID, "error", err)
		o.tx.AfterCommit(func() { m.RateLimitDecisions.WithLabelValues("error_allowed").Inc() })
		return nil, nil
	case err != nil:
		o.k.log.Warn("rate limiter failed; refusing the step", "rule_id", res.RuleID, "error", err)
		o.tx.AfterCommit(func() { m.RateLimitDecisions.WithLabelValues("error_denied").Inc() })
		dec.Reason = wire.ReasonRateLimiterUnavail
	case ok:
		return nil, nil
	default:
		o.tx.AfterCommit(func() { m.RateLimitDecisions.WithLabelValues("limited").Inc() })
		dec.RetryAfterMS = max(retryAfter.Milliseconds(), 1)
	}
	// The refusal is the answer; the step the submit named is not recorded.
	o.e.StepOrder--
	o.e.StepCount--
	o.e.ByteCount -= int64(len(s.Args))
	last, found, err := o.tx.RateLimitMark(o.ctx, o.e.ID, s.StepID)
	if err != nil {
		return nil, fmt.Errorf("read rate-limit mark: %w", err)
	}
	if !found || o.now.Sub(last) >= rl.Window {
		p := stepPayload(s).String("rule_id", res.RuleID).String("reason", dec.Reason)
		if dec.RetryAfterMS > 0 {
			p.Int("retry_after_ms", dec.RetryAfterMS)
		}
		o.emit(wire.EventStepRateLimited, p)
		if err := o.tx.SetRateLimitMark(o.ctx, o.e.ID, s.StepID, o.now); err != nil {
			return nil, fmt.Errorf("write rate-limit mark: %w", err)
		}
	}
	return dec, nil
}

func (o *op) recordDenied(s *store.Step, reason, ruleID string) (*Decision, error) {
	errObj := (&jsonx.Object{}).String("reason", reason)
	if ruleID != "" {
		errObj.String("rule_id", ruleID)
	}
	errJSON := errObj.Bytes()
	s.Status = wire.StepDenied
	s.Error = errJSON
	s.ErrorReason = reason
	s.CompletedAt = o.now
	o.e.ByteCount += int64(len(errJSON))
	o.propose(s)
	p := stepPayload(s).Raw("error", errJSON)
	if ruleID != "" {
		p.String("rule_id", ruleID)
	}
	o.emit(wire.EventStepDenied, p)
	s.TerminalSeq = o.e.LastSeq
	if err := o.tx.InsertStep(o.ctx, s); err != nil {
		return nil, fmt.Errorf("insert step: %w", err)
	}
	return &Decision{Decision: wire.DecisionDenied, StepID: s.StepID, Reason: reason, RuleID: ruleID}, nil
}

// OutcomeRequest is a parsed step complete or fail body.
type OutcomeRequest struct {
	Succeeded bool
	Value     []byte // result or error, verbatim; nil when absent or null
	// Captures travel with the outcome and are processed only when it is
	// recorded (docs/protocol/resources.md §4).
	Captures Captures
}

// RecordOutcome completes or fails a step (docs/protocol/steps.md §10).
func (k *Kernel) RecordOutcome(ctx context.Context, c Caller, id, stepID string, h DispatchHeaders, r OutcomeRequest) (*Decision, error) {
	if err := validateCaptures(r.Captures); err != nil {
		return nil, err
	}
	var dec *Decision
	err := k.update(ctx, id, func(o *op) error {
		dec = nil
		if err := o.load(id, c); err != nil {
			return err
		}
		v, err := o.view()
		if err != nil {
			return err
		}
		s, err := o.k.readStep(o.ctx, o.tx, v, id, stepID)
		if err != nil {
			return notFoundOr(err, "step")
		}
		d, superseded, err := o.admit(h)
		if isCode(err, wire.CodeExecutionTerminal) {
			dec = terminalDecision()
			return nil
		}
		if err != nil {
			return err
		}
		dec, err = o.applyOutcome(s, d, superseded, h, r)
		if err == nil && dec.Decision == wire.DecisionRecorded {
			m := k.metrics
			o.tx.AfterCommit(func() { m.StepOutcomes.WithLabelValues("separate").Inc() })
		}
		return err
	})
	if errors.Is(err, errStorageLimit) {
		return terminalDecision(), nil
	}
	return dec, err
}

// applyOutcome applies docs/protocol/steps.md §10 steps 4–7 to an admitted request: it
// records the outcome of an executing step, or answers what is recorded.
func (o *op) applyOutcome(s *store.Step, d *store.Dispatch, superseded bool, h DispatchHeaders, r OutcomeRequest) (*Decision, error) {
	switch {
	case s.Status == wire.StepExecuting:
		o.enforce = true
		value := nullIfEmpty(r.Value)
		o.e.ByteCount += int64(len(value))
		s.CompletedAt = o.now
		if r.Succeeded {
			s.Status = wire.StepSucceeded
			s.Result = value
			o.emit(wire.EventStepSucceeded, stepPayload(s))
		} else {
			s.Status = wire.StepFailed
			s.Error = value
			s.ErrorReason = errorReason(value)
			o.emit(wire.EventStepFailed, stepPayload(s).Raw("error", value))
		}
		s.TerminalSeq = o.e.LastSeq
		o.stopWriting(s)
		if err := o.tx.UpdateStep(o.ctx, s); err != nil {
			return nil, fmt.Errorf("record step outcome: %w", err)
		}
		if err := o.processCaptures(r.Captures, s); err != nil {
			return nil, err
		}
		if !superseded {
			if err := o.progress(d, h); err != nil {
				return nil, err
			}
		}
		return &Decision{Decision: wire.DecisionRecorded}, nil
	case superseded:
		return nil, o.k.refuseSuperseded()
	case s.Status == wire.StepSucceeded:
		return &Decision{Decision: wire.DecisionReplay, Result: nullIfEmpty(s.Result)}, nil
	case wire.StepTerminal(s.Status):
		return &Decision{Decision: wire.DecisionReplay, Error: nullIfEmpty(s.Error)}, nil
	}
	return nil, errConflict("step is not executing")
}

// errorReason extracts error.reason for the indeterminate lookup (docs/protocol/steps.md §8).
func errorReason(errJSON []byte) string {
	v, err := jsonx.Parse(errJSON, wire.MaxNesting)
	if err != nil || v.Kind != jsonx.KindObject {
		return ""
	}
	if r := v.Get("reason"); r != nil && r.Kind == jsonx.KindString {
		return r.Str
	}
	return ""
}

// Heartbeat renews the lease of the requesting attempt (docs/protocol/dispatch.md §9).
func (k *Kernel) Heartbeat(ctx context.Context, c Caller, id string, h DispatchHeaders) error {
	return k.update(ctx, id, func(o *op) error {
		d, err := o.agentWrite(id, c, h)
		if err != nil {
			return err
		}
		return o.renew(d, h)
	})
}

// StreamDelta offers a live delta of a running step to this execution's
// consumers (docs/protocol/events.md §5). It changes no state, so it needs no write transaction.
func (k *Kernel) StreamDelta(ctx context.Context, c Caller, id, stepID string, h DispatchHeaders, seq int64, data string) error {
	if seq < 0 {
		return validation("seq", "seq must not be negative")
	}
	if len(data) > wire.MaxDeltaBytes {
		return validation("data", "data is longer than %d bytes", wire.MaxDeltaBytes)
	}
	if !utf8.ValidString(data) {
		return validation("data", "data is not valid UTF-8")
	}
	r := k.store.Read()
	e, err := r.ExecutionHead(ctx, id)
	if err != nil {
		return notFoundOr(err, "execution")
	}
	if c.Agent != "" && e.AgentID != c.Agent {
		return errForbidden()
	}
	v, err := k.viewOf(ctx, r, e)
	if err != nil {
		return err
	}
	if _, err := k.readStep(ctx, r, v, id, stepID); err != nil {
		return notFoundOr(err, "step")
	}
	if _, err := validateDispatch(ctx, r, e, h, k.cfg.RequireDispatchHeaders); err != nil {
		return err
	}
	k.notifier.Notify(store.Notification{Topic: store.TopicDelta, Key: id,
		Data: encodeDelta(events.Delta{StepID: stepID, Seq: seq, Data: data})})
	return nil
}
