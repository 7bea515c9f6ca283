package kernel

import (
	"context"
	"errors"
	"fmt"
	"time"
	"unicode/utf8"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// IdempotencyLifetime is how long a create or fork idempotency key is
// remembered (docs/protocol/executions.md §2).
const IdempotencyLifetime = 24 * time.Hour

// Idempotency routes: keys are global per route (docs/protocol/executions.md §2).
const (
	RouteCreate = "create"
	RouteFork   = "fork"
)

// CreateRequest is a parsed create body.
type CreateRequest struct {
	AgentID        string
	Input          []byte // verbatim JSON; nil when absent
	AgentVersion   string
	IdempotencyKey string
	// BodyHash identifies the request for idempotency: the hash of the body's
	// canonical JSON without idempotency_key.
	BodyHash          string
	ParentExecutionID string
	OnBehalfOf        string
}

// CreateExecution creates an execution and enqueues its first dispatch (docs/protocol/executions.md §2).
func (k *Kernel) CreateExecution(ctx context.Context, r CreateRequest) (*store.Execution, error) {
	if r.AgentID == "" {
		return nil, validation("agent_id", "agent_id is required")
	}
	if len(r.AgentVersion) > wire.MaxShortStringBytes {
		return nil, validation("agent_version", "agent_version is longer than %d bytes", wire.MaxShortStringBytes)
	}
	if len(r.OnBehalfOf) > wire.MaxShortStringBytes {
		return nil, validation("on_behalf_of", "on_behalf_of is longer than %d bytes", wire.MaxShortStringBytes)
	}
	if r.IdempotencyKey != "" {
		if err := ValidIdempotencyKey(r.IdempotencyKey); err != nil {
			return nil, err
		}
	}
	input := r.Input
	if len(input) == 0 {
		input = []byte("null")
	}
	var out *store.Execution
	err := k.store.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		o := k.newOp(ctx, tx)
		if _, err := tx.Agent(ctx, r.AgentID); err != nil {
			if errors.Is(err, store.ErrNotFound) {
				return errNotFound("agent")
			}
			return fmt.Errorf("read agent: %w", err)
		}
		if r.ParentExecutionID != "" {
			parent, err := tx.ExecutionHead(ctx, r.ParentExecutionID)
			if err != nil {
				return notFoundOr(err, "parent execution")
			}
			if parent.AgentID != r.AgentID {
				return validation("parent_execution_id", "parent execution belongs to another agent")
			}
			if parent.Status != wire.ExecCompleted {
				return errConflict("parent execution is not completed")
			}
		}
		if r.IdempotencyKey != "" {
			existing, err := k.idempotent(o, RouteCreate, "", r.IdempotencyKey, r.BodyHash)
			if err != nil || existing != nil {
				out = existing
				return err
			}
		}
		e := &store.Execution{
			ID: newID(), AgentID: r.AgentID, AgentVersion: r.AgentVersion, Input: input, Status: wire.ExecPending,
			CreatedAt: o.now, UpdatedAt: o.now, ParentID: r.ParentExecutionID, IdempotencyKey: r.IdempotencyKey,
			OnBehalfOf: r.OnBehalfOf, ResourceKeys: []string{}, Writing: []string{}, ByteCount: int64(len(input)),
			Mark: &store.Mark{},
		}
		if k.cfg.DeadlineTimeout > 0 {
			e.DeadlineAt = o.now.Add(k.cfg.DeadlineTimeout)
		}
		if err := tx.InsertExecution(ctx, e); err != nil {
			return fmt.Errorf("insert execution: %w", err)
		}
		o.e = e
		created := (&jsonx.Object{}).String("execution_id", e.ID).String("status", wire.ExecPending).String("agent_id", e.AgentID)
		started := (&jsonx.Object{}).String("execution_id", e.ID).String("status", wire.ExecRunning)
		if e.AgentVersion != "" {
			created.String("agent_version", e.AgentVersion)
		}
		if !e.DeadlineAt.IsZero() {
			created.String("deadline_at", wire.FormatTime(e.DeadlineAt))
			started.String("deadline_at", wire.FormatTime(e.DeadlineAt))
		}
		o.emit(wire.EventExecutionCreated, created)
		o.emit(wire.EventExecutionStarted, started)
		e.Status = wire.ExecRunning
		if err := o.enqueueDispatch(); err != nil {
			return err
		}
		if r.IdempotencyKey != "" {
			if err := tx.InsertIdempotency(ctx, &store.IdempotencyRecord{Route: RouteCreate, Key: r.IdempotencyKey,
				BodyHash: r.BodyHash, ExecutionID: e.ID, CreatedAt: o.now}); err != nil {
				return fmt.Errorf("record idempotency key: %w", err)
			}
		}
		if err := o.finish(); err != nil {
			return err
		}
		m := k.metrics
		tx.AfterCommit(func() { m.ExecutionsCreated.Inc() })
		out = e
		return nil
	})
	return out, err
}

// idempotent answers a keyed create or fork that was already made: the
// execution it created when the body matches, 409 when it does not, nil when
// the key is unused (or its record has outlived its lifetime).
func (k *Kernel) idempotent(o *op, route, scope, key, bodyHash string) (*store.Execution, error) {
	rec, err := o.tx.Idempotency(o.ctx, route, scope, key)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("read idempotency key: %w", err)
	}
	if o.now.Sub(rec.CreatedAt) >= IdempotencyLifetime {
		return nil, nil
	}
	if rec.BodyHash != bodyHash {
		return nil, errConflict("idempotency key reused with a different body")
	}
	e, err := o.tx.Execution(o.ctx, rec.ExecutionID)
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	return e, err
}

// ValidIdempotencyKey checks the key syntax of docs/protocol/executions.md §2.
func ValidIdempotencyKey(key string) error {
	if len(key) < 1 || len(key) > wire.MaxIdempotencyKey {
		return validation("idempotency_key", "idempotency key must be 1 to %d bytes", wire.MaxIdempotencyKey)
	}
	for i := 0; i < len(key); i++ {
		if key[i] < 0x21 || key[i] > 0x7e {
			return validation("idempotency_key", "idempotency key must be printable ASCII without spaces")
		}
	}
	return nil
}

// GetExecution reads one execution.
func (k *Kernel) GetExecution(ctx context.Context, c Caller, id string) (*store.Execution, error) {
	e, err := k.store.Read().Execution(ctx, id)
	if err != nil {
		return nil, notFoundOr(err, "execution")
	}
	if c.Agent != "" && e.AgentID != c.Agent {
		return nil, errForbidden()
	}
	return e, nil
}

// ListResult is one page of executions.
type ListResult struct {
	Executions []*store.Execution
	NextCursor string
}

// ListExecutions pages executions newest first (docs/protocol/executions.md §4).
func (k *Kernel) ListExecutions(ctx context.Context, f store.ExecutionFilter) (*ListResult, error) {
	if len(f.AgentID) > wire.MaxAgentIDBytes {
		return nil, validation("agent_id", "agent_id is longer than %d bytes", wire.MaxAgentIDBytes)
	}
	if f.Status != "" && !contains(wire.ExecutionStatuses, f.Status) {
		return nil, validation("status", "unknown status %q", f.Status)
	}
	switch {
	case f.Limit < 0:
		return nil, validation("limit", "limit must not be negative")
	case f.Limit == 0:
		f.Limit = wire.DefaultListLimit
	case f.Limit > wire.MaxListLimit:
		f.Limit = wire.MaxListLimit
	}
	want := f.Limit
	f.Limit++
	list, err := k.store.Read().ListExecutions(ctx, f)
	if err != nil {
		return nil, fmt.Errorf("list executions: %w", err)
	}
	res := &ListResult{Executions: list}
	if len(list) > want {
		res.Executions = list[:want]
		res.NextCursor = list[want-1].ID
	}
	return res, nil
}

// ListEvents reads a page of an execution's log (docs/protocol/events.md §1).
func (k *Kernel) ListEvents(ctx context.Context, c Caller, id string, afterSeq int64, limit int) ([]*store.Event, error) {
	if afterSeq < 0 {
		return nil, validation("after_seq", "after_seq must not be negative")
	}
	switch {
	case limit < 0:
		return nil, validation("limit", "limit must not be negative")
	case limit == 0:
		limit = wire.DefaultEventsLimit
	case limit > wire.MaxEventsLimit:
		limit = wire.MaxEventsLimit
	}
	rd, v, err := k.readable(ctx, c, id)
	if err != nil {
		return nil, err
	}
	evs, err := k.readEvents(ctx, rd, v, id, afterSeq, limit)
	if err != nil {
		return nil, fmt.Errorf("read events: %w", err)
	}
	return evs, nil
}

// StepStatusFilter resolves the status filter of the steps list (docs/protocol/executions.md §3).
func StepStatusFilter(filter string) ([]string, error) {
	switch filter {
	case "":
		return nil, nil
	case "terminal":
		return wire.StepTerminalStatuses, nil
	case "pending":
		return []string{wire.StepProposed, wire.StepAllowed, wire.StepAwaitingApproval, wire.StepExecuting}, nil
	}
	if contains(wire.StepStatuses, filter) {
		return []string{filter}, nil
	}
	return nil, validation("status", "unknown status filter %q", filter)
}

// EachStepPage streams the steps of an execution in recording order, one
// short read per page of at most 1,000 rows, so that no read stays open while
// the caller writes to a slow client (docs/protocol/operations.md §2.3).
func (k *Kernel) EachStepPage(ctx context.Context, c Caller, id, filter string, fn func(page []*store.Step) error) error {
	statuses, err := StepStatusFilter(filter)
	if err != nil {
		return err
	}
	_, v, err := k.readable(ctx, c, id)
	if err != nil {
		return err
	}
	var after int64
	for {
		page, err := k.readSteps(ctx, k.store.Read(), v, id, statuses, after, wire.StepsPageSize)
		if err != nil {
			return fmt.Errorf("read steps: %w", err)
		}
		if len(page) == 0 {
			return nil
		}
		if err := fn(page); err != nil {
			return err
		}
		if len(page) < wire.StepsPageSize {
			return nil
		}
		after = page[len(page)-1].Order
	}
}

// readable checks that the caller may read execution id, and returns a
// reader and its forkView (nil unless it is an in-place fork) for reading its
// events and steps.
func (k *Kernel) readable(ctx context.Context, c Caller, id string) (store.Reader, *forkView, error) {
	e, err := k.GetExecution(ctx, c, id)
	if err != nil {
		return nil, nil, err
	}
	rd := k.store.Read()
	v, err := k.viewOf(ctx, rd, e)
	return rd, v, err
}

// GetStep reads one step of an execution.
func (k *Kernel) GetStep(ctx context.Context, c Caller, id, stepID string) (*store.Step, error) {
	rd, v, err := k.readable(ctx, c, id)
	if err != nil {
		return nil, err
	}
	s, err := k.readStep(ctx, rd, v, id, stepID)
	if err != nil {
		return nil, notFoundOr(err, "step")
	}
	return s, nil
}

// Previous returns the state an execution continues from (docs/protocol/executions.md §11).
func (k *Kernel) Previous(ctx context.Context, c Caller, id string) ([]byte, error) {
	e, err := k.GetExecution(ctx, c, id)
	if err != nil {
		return nil, err
	}
	if e.ParentID == "" {
		return []byte("null"), nil
	}
	parent, err := k.store.Read().Execution(ctx, e.ParentID)
	if errors.Is(err, store.ErrNotFound) {
		return []byte("null"), nil
	}
	if err != nil {
		return nil, fmt.Errorf("read parent execution: %w", err)
	}
	if parent.State != nil {
		return parent.State, nil
	}
	if parent.Output != nil {
		return parent.Output, nil
	}
	return []byte("null"), nil
}

// CancelExecution cancels a live execution on a client's request (docs/protocol/executions.md §7).
func (k *Kernel) CancelExecution(ctx context.Context, id string) error {
	return k.update(ctx, id, func(o *op) error {
		if err := o.load(id, Caller{}); err != nil {
			return err
		}
		if wire.ExecTerminal(o.e.Status) {
			return errTerminal()
		}
		return o.terminate(wire.ExecCancelled, wire.ReasonClientCancelled, wire.CauseExecutionCancelled)
	})
}

// CompleteRequest is a parsed execution complete body.
type CompleteRequest struct {
	Output []byte // verbatim; nil when absent or null
	State  []byte // verbatim; nil when absent or null
	// Outcome is the last step's outcome, when the complete carries it
	// (docs/protocol/steps.md §13).
	Outcome *CarriedOutcome
}

// FailRequest is a parsed execution fail body.
type FailRequest struct {
	Reason  string
	Outcome *CarriedOutcome
}

// CompleteExecution records an agent's successful end (docs/protocol/executions.md §5).
func (k *Kernel) CompleteExecution(ctx context.Context, c Caller, id string, h DispatchHeaders, r CompleteRequest) error {
	return k.finishExecution(ctx, c, id, h, r.Outcome, func(o *op) error {
		out := r.Output
		if out == nil {
			out = []byte("null")
		}
		o.e.Output = out
		o.e.State = r.State
		o.e.ByteCount += int64(len(out) + len(r.State))
		if err := o.tx.SetExecutionResult(o.ctx, id, out, r.State); err != nil {
			return fmt.Errorf("store output: %w", err)
		}
		return o.terminate(wire.ExecCompleted, "", wire.CauseExecutionCompleted)
	})
}

// FailExecution records an agent's failure (docs/protocol/executions.md §6). Reasons longer than the
// limit are cut at a character boundary rather than refused, because
// refusing would leave the execution running.
func (k *Kernel) FailExecution(ctx context.Context, c Caller, id string, h DispatchHeaders, r FailRequest) error {
	reason := TruncateUTF8(r.Reason, wire.MaxFailureReasonBytes)
	return k.finishExecution(ctx, c, id, h, r.Outcome, func(o *op) error {
		return o.terminate(wire.ExecFailed, reason, wire.CauseExecutionFailed)
	})
}

// finishExecution runs an agent's complete or fail: the carried outcome
// first when there is one (docs/protocol/steps.md §13), then the checks every agent write
// makes, then end. A terminal execution is 409 execution_terminal here,
// whatever the carried outcome would have answered.
func (k *Kernel) finishExecution(ctx context.Context, c Caller, id string, h DispatchHeaders, co *CarriedOutcome, end func(o *op) error) error {
	if err := validateCarried(co); err != nil {
		return err
	}
	var refusal error
	err := k.update(ctx, id, func(o *op) error {
		refusal = nil
		if err := o.load(id, c); err != nil {
			return err
		}
		_, superseded, stop, err := o.admitCarrying(co, h)
		switch {
		case stop != nil:
			return errTerminal()
		case err != nil:
			return err
		case superseded:
			refusal = k.refuseSuperseded()
		case o.e.Status == wire.ExecBlocked:
			refusal = errConflict("execution is blocked awaiting approval")
		}
		if refusal != nil {
			// The carried outcome stands alone, as if it had been sent alone.
			if co == nil {
				return refusal
			}
			return nil
		}
		o.enforce = true
		if err := end(o); err != nil {
			return err
		}
		if co != nil && o.overLimit() {
			return errCarriedLimit
		}
		return nil
	})
	switch {
	case errors.Is(err, errStorageLimit):
		return errTerminal()
	case errors.Is(err, errCarriedLimit):
		if err := k.recordThenFail(ctx, c, id, h, co); err != nil {
			return err
		}
		return errTerminal()
	case err != nil:
		return err
	}
	return refusal
}

// TruncateUTF8 cuts s to at most n bytes without splitting a character.
func TruncateUTF8(s string, n int) string {
	if len(s) <= n {
		return s
	}
	for n > 0 && !utf8.RuneStart(s[n]) {
		n--
	}
	return s[:n]
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
