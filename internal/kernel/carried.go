package kernel

import (
	"bytes"
	"context"
	"errors"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// CarriedOutcome is the outcome of an earlier step that a submit, an
// execution complete or an execution fail carries (docs/protocol/steps.md §13), so
// that a step costs the agent one request instead of two.
type CarriedOutcome struct {
	StepID string
	OutcomeRequest
}

// errCarriedLimit aborts a transaction whose own request, not its carried
// outcome, would cross a storage limit: the outcome is then recorded alone
// before the execution fails, as with two requests.
var errCarriedLimit = errors.New("storage limit exceeded after a carried outcome")

func validateCarried(co *CarriedOutcome) error {
	if co == nil {
		return nil
	}
	return validateCaptures(co.Captures)
}

// isRefusal reports whether err is an answer to the client rather than a
// failure of the kernel.
func isRefusal(err error) bool {
	var ke *Error
	return errors.As(err, &ke)
}

// admitCarrying admits an agent write on the loaded execution. When the
// request carries an outcome, the outcome is applied first (docs/protocol/steps.md §10 on its
// step) and must stand as sent for the request to go on. stop is the
// answer when the execution is terminal; an error ends the request with
// nothing written.
func (o *op) admitCarrying(co *CarriedOutcome, h DispatchHeaders) (d *store.Dispatch, superseded bool, stop *Decision, err error) {
	var s *store.Step
	if co != nil {
		var v *forkView
		if v, err = o.view(); err != nil {
			return nil, false, nil, err
		}
		if s, err = o.k.readStep(o.ctx, o.tx, v, o.e.ID, co.StepID); err != nil {
			return nil, false, nil, notFoundOr(err, "step")
		}
	}
	d, superseded, err = o.admit(h)
	if isCode(err, wire.CodeExecutionTerminal) {
		return nil, false, terminalDecision(), nil
	}
	if err != nil || co == nil {
		return d, superseded, nil, err
	}
	dec, err := o.applyOutcome(s, d, superseded, h, co.OutcomeRequest)
	if err != nil {
		return nil, false, nil, err
	}
	switch {
	case dec.Decision == wire.DecisionRecorded:
		m := o.k.metrics
		o.tx.AfterCommit(func() { m.StepOutcomes.WithLabelValues("carried").Inc() })
	case !sameOutcome(dec, co):
		// The code went on with a value the log does not hold (another
		// attempt recorded this step first): nothing of this request may
		// be recorded on top of it.
		return nil, false, nil, errConflict("the step's outcome was recorded differently")
	}
	if o.overLimit() {
		return nil, false, nil, errStorageLimit
	}
	return d, superseded, nil, nil
}

// sameOutcome reports whether a replayed outcome is the one the request
// carries: the same kind, and values equal as canonical JSON.
func sameOutcome(replay *Decision, co *CarriedOutcome) bool {
	stored := replay.Error
	if co.Succeeded {
		stored = replay.Result
	}
	if stored == nil {
		return false
	}
	return sameJSON(stored, nullIfEmpty(co.Value))
}

func sameJSON(a, b []byte) bool {
	if bytes.Equal(a, b) {
		return true
	}
	va, erra := jsonx.Parse(a, wire.MaxNesting)
	vb, errb := jsonx.Parse(b, wire.MaxNesting)
	return erra == nil && errb == nil && bytes.Equal(jsonx.Canonical(va), jsonx.Canonical(vb))
}

// recordThenFail ends a request whose own writes would cross a storage limit
// after its carried outcome: the outcome is recorded alone, then the
// execution fails (docs/protocol/operations.md §2.4), exactly as two requests would have left it.
func (k *Kernel) recordThenFail(ctx context.Context, c Caller, id string, h DispatchHeaders, co *CarriedOutcome) error {
	if _, err := k.RecordOutcome(ctx, c, id, co.StepID, h, co.OutcomeRequest); err != nil {
		return err
	}
	return k.failForStorage(ctx, id)
}
