package kernel

import (
	"context"
	"errors"
	"fmt"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// recordAwaitingApproval records a step a rule holds for a human (docs/protocol/steps.md §4,
// docs/protocol/governance.md §1.1): the step waits, an approval is created, the execution blocks and
// its live dispatch is released.
func (o *op) recordAwaitingApproval(s *store.Step, res PolicyResult) (*Decision, error) {
	cfg := res.Approval
	if cfg == nil {
		cfg = &policy.ApprovalConfig{}
	}
	timeout := cfg.Timeout
	if timeout <= 0 {
		timeout = o.k.cfg.ApprovalTimeout
	}
	approvers := cfg.Approvers
	if approvers == nil {
		approvers = []string{}
	}
	a := &store.Approval{
		ID: newID(), ExecutionID: o.e.ID, StepID: s.StepID, AgentID: o.e.AgentID, Kind: s.Kind, Target: s.Target,
		Status: wire.ApprovalPending, Approvers: approvers, Message: cfg.Message, TimeoutAt: o.now.Add(timeout), CreatedAt: o.now,
	}
	s.Status = wire.StepAwaitingApproval
	o.propose(s) // before the insert, which keeps the seq of the step's first event
	if err := o.tx.InsertStep(o.ctx, s); err != nil {
		return nil, fmt.Errorf("insert step: %w", err)
	}
	if err := o.tx.InsertApproval(o.ctx, a); err != nil {
		return nil, fmt.Errorf("insert approval: %w", err)
	}
	o.emit(wire.EventStepAwaitingApproval, stepPayload(s).String("rule_id", res.RuleID))
	o.emit(wire.EventApprovalRequested, approvalPayload(a))
	o.e.Status = wire.ExecBlocked
	o.e.UpdatedAt = o.now
	o.emit(wire.EventExecutionBlocked, (&jsonx.Object{}).String("execution_id", o.e.ID).String("status", wire.ExecBlocked))
	// The dispatch is released, not superseded: it stays the newest, so a
	// handler still running gets the ordinary answers of a blocked execution.
	if err := o.tx.RetireDispatches(o.ctx, o.e.ID, "", o.now); err != nil {
		return nil, fmt.Errorf("release dispatch: %w", err)
	}
	return &Decision{Decision: wire.DecisionBlocked, StepID: s.StepID, ApprovalID: a.ID}, nil
}

func approvalPayload(a *store.Approval) *jsonx.Object {
	p := (&jsonx.Object{}).String("approval_id", a.ID).String("step_id", a.StepID).
		String("execution_id", a.ExecutionID).String("status", a.Status)
	if a.Status == wire.ApprovalPending {
		return p
	}
	if a.Status == wire.ApprovalExpired {
		return p.String("rationale", a.Rationale)
	}
	if a.DecidedBy != "" {
		p.String("decided_by", a.DecidedBy)
	}
	if a.Rationale != "" {
		p.String("rationale", a.Rationale)
	}
	return p
}

// pendingApprovalID finds the approval a step awaits, through the index on
// (execution, step).
func (k *Kernel) pendingApprovalID(o *op, s *store.Step) (string, error) {
	a, err := o.tx.PendingApprovalForStep(o.ctx, o.e.ID, s.StepID)
	if err != nil {
		return "", fmt.Errorf("read approval of step %s: %w", s.StepID, err)
	}
	return a.ID, nil
}

// closeApprovals expires the pending approvals of a terminating execution
// and denies their steps (docs/protocol/executions.md §9 step 1).
func (o *op) closeApprovals(cause string) error {
	pending, err := o.tx.PendingApprovals(o.ctx, o.e.ID)
	if err != nil {
		return fmt.Errorf("read pending approvals: %w", err)
	}
	for _, a := range pending {
		if err := o.resolve(a, wire.ApprovalExpired, "", cause, cause); err != nil {
			return err
		}
	}
	return nil
}

// resolve decides a pending approval and its step in the current
// transaction: granted → the step may start; denied or expired → the step is
// denied with stepReason.
func (o *op) resolve(a *store.Approval, status, decidedBy, rationale, stepReason string) error {
	a.Status, a.DecidedBy, a.DecidedAt, a.Rationale = status, decidedBy, o.now, rationale
	if err := o.tx.UpdateApproval(o.ctx, a); err != nil {
		return fmt.Errorf("update approval: %w", err)
	}
	typ := map[string]string{wire.ApprovalGranted: wire.EventApprovalGranted, wire.ApprovalDenied: wire.EventApprovalDenied,
		wire.ApprovalExpired: wire.EventApprovalExpired}[status]
	o.emit(typ, approvalPayload(a))
	s, err := o.tx.Step(o.ctx, a.ExecutionID, a.StepID)
	if err != nil {
		return fmt.Errorf("read step of approval: %w", err)
	}
	if status == wire.ApprovalGranted {
		s.Status = wire.StepAllowed
		o.emit(wire.EventStepAllowed, stepPayload(s).String("approval_id", a.ID))
	} else {
		errJSON := (&jsonx.Object{}).String("reason", stepReason).Bytes()
		s.Status = wire.StepDenied
		s.Error = errJSON
		s.ErrorReason = stepReason
		s.CompletedAt = o.now
		o.emit(wire.EventStepDenied, stepPayload(s).Raw("error", errJSON))
		s.TerminalSeq = o.e.LastSeq
	}
	if err := o.tx.UpdateStep(o.ctx, s); err != nil {
		return fmt.Errorf("update step of approval: %w", err)
	}
	m, wait := o.k.metrics, o.now.Sub(a.CreatedAt).Seconds()
	o.tx.AfterCommit(func() {
		m.ApprovalOutcomes.WithLabelValues(status).Inc()
		m.ApprovalWait.Observe(wait)
	})
	return nil
}

// resume unblocks the execution after its approval was decided and asks the
// agent to run again (docs/protocol/governance.md §1.5).
func (o *op) resume() error {
	o.e.Status = wire.ExecRunning
	o.e.UpdatedAt = o.now
	o.emit(wire.EventExecutionResumed, (&jsonx.Object{}).String("execution_id", o.e.ID).String("status", wire.ExecRunning))
	return o.enqueueDispatch()
}

// DecideRequest is a parsed grant or deny body.
type DecideRequest struct {
	Grant     bool
	DecidedBy string
	Rationale string
	// By is who asks. A scoped key's name is the decider whatever DecidedBy
	// claims; the bootstrap token carries no identity, so DecidedBy stands.
	By Principal
}

// DecideApproval grants or denies a pending approval (docs/protocol/governance.md §1.3). Concurrent
// grants, denials, cancels and expiries are serialised by the execution
// lock: exactly one wins and the others see a non-pending approval. The
// decision is written to the audit log with the caller and the decider.
func (k *Kernel) DecideApproval(ctx context.Context, id string, r DecideRequest) error {
	if r.By.Key {
		r.DecidedBy = r.By.Name
	}
	if len(r.DecidedBy) > wire.MaxShortStringBytes {
		return validation("decided_by", "decided_by is longer than %d bytes", wire.MaxShortStringBytes)
	}
	if len(r.Rationale) > wire.MaxRationaleBytes {
		return validation("rationale", "rationale is longer than %d bytes", wire.MaxRationaleBytes)
	}
	first, err := k.store.Read().Approval(ctx, id)
	if err != nil {
		return notFoundOr(err, "approval")
	}
	return k.update(ctx, first.ExecutionID, func(o *op) error {
		a, err := o.tx.Approval(o.ctx, id)
		if err != nil {
			return notFoundOr(err, "approval")
		}
		if a.Status != wire.ApprovalPending {
			return errConflict("approval is not pending")
		}
		if len(a.Approvers) > 0 && !contains(a.Approvers, r.DecidedBy) {
			return &Error{Code: wire.CodeForbidden, Message: fmt.Sprintf("forbidden: %q is not an approver for this approval", r.DecidedBy)}
		}
		if err := o.load(a.ExecutionID, Caller{}); err != nil {
			return err
		}
		if wire.ExecTerminal(o.e.Status) {
			return errTerminal()
		}
		action := AuditApprovalDenied
		if r.Grant {
			action = AuditApprovalGranted
		}
		detail := (&jsonx.Object{}).String("execution_id", a.ExecutionID).String("step_id", a.StepID)
		if r.DecidedBy != "" {
			detail.String("decided_by", r.DecidedBy)
		}
		if err := o.tx.AppendAudit(o.ctx, &store.AuditEntry{At: o.now, Actor: r.By.Actor(), Action: action, Subject: a.ID,
			Detail: detail.Bytes()}); err != nil {
			return fmt.Errorf("audit the decision: %w", err)
		}
		if r.Grant {
			err = o.resolve(a, wire.ApprovalGranted, r.DecidedBy, r.Rationale, "")
		} else {
			reason := r.Rationale
			if reason == "" {
				reason = wire.ReasonApprovalDenied
			}
			err = o.resolve(a, wire.ApprovalDenied, r.DecidedBy, r.Rationale, reason)
		}
		if err != nil {
			return err
		}
		return o.resume()
	})
}

// ExpireApproval expires a pending approval whose timeout has passed (docs/protocol/governance.md §1.4):
// the step is denied and the execution resumes.
func (k *Kernel) ExpireApproval(ctx context.Context, ref store.ApprovalRef) error {
	return k.update(ctx, ref.ExecutionID, func(o *op) error {
		a, err := o.tx.Approval(o.ctx, ref.ID)
		if errors.Is(err, store.ErrNotFound) {
			return nil
		}
		if err != nil {
			return fmt.Errorf("read approval: %w", err)
		}
		if a.Status != wire.ApprovalPending || a.TimeoutAt.After(o.now) {
			return nil
		}
		if err := o.load(a.ExecutionID, Caller{}); err != nil {
			return err
		}
		if err := o.resolve(a, wire.ApprovalExpired, "", wire.ReasonTimeout, wire.ReasonApprovalTimeout); err != nil {
			return err
		}
		return o.resume()
	})
}

// GetApproval reads one approval.
func (k *Kernel) GetApproval(ctx context.Context, id string) (*store.Approval, error) {
	a, err := k.store.Read().Approval(ctx, id)
	if err != nil {
		return nil, notFoundOr(err, "approval")
	}
	return a, nil
}

// ListApprovals lists approvals oldest first (docs/protocol/governance.md §1.2).
func (k *Kernel) ListApprovals(ctx context.Context, f store.ApprovalFilter) ([]*store.Approval, error) {
	switch f.Status {
	case "":
		f.Status = wire.ApprovalPending
	case wire.ApprovalPending, wire.ApprovalGranted, wire.ApprovalDenied, wire.ApprovalExpired:
	default:
		return nil, validation("status", "unknown status %q", f.Status)
	}
	switch {
	case f.Limit < 0:
		return nil, validation("limit", "limit must not be negative")
	case f.Limit == 0, f.Limit > wire.MaxApprovalsLimit:
		f.Limit = wire.MaxApprovalsLimit
	}
	list, err := k.store.Read().ListApprovals(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("list approvals: %w", err)
	}
	return list, nil
}
