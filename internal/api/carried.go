package api

import (
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
)

// carriedField is the body member of a submit, execution complete or fail
// that carries an earlier step's outcome (docs/protocol/steps.md §13).
const carriedField = "outcome"

// parseCarried reads the carried outcome of a body; nil when absent or null.
// It holds the step id and exactly one of result or error (either may be
// null), and the capture lists of a step outcome.
func parseCarried(f *fields) (*kernel.CarriedOutcome, error) {
	v := f.get(carriedField)
	if v == nil {
		return nil, nil
	}
	if v.Kind != jsonx.KindObject {
		return nil, invalid(carriedField, "outcome must be a JSON object")
	}
	of := &fields{obj: v}
	for _, m := range v.Members {
		if !contains([]string{"step_id", "result", "error", "captures", "capture_failures"}, m.Key) {
			return nil, invalid(carriedField+"."+m.Key, "unknown field %q", m.Key)
		}
	}
	co := &kernel.CarriedOutcome{StepID: of.str("step_id")}
	if of.err != nil {
		return nil, invalid(carriedField+".step_id", "outcome.step_id must be a string")
	}
	if !validStepID(co.StepID) {
		return nil, invalid(carriedField+".step_id", "outcome.step_id must be 64 lowercase hex digits")
	}
	result, failure := v.Get("result"), v.Get("error")
	if (result == nil) == (failure == nil) {
		return nil, invalid(carriedField, "outcome must hold exactly one of result and error")
	}
	co.Succeeded = result != nil
	co.Value = of.raw("result")
	if !co.Succeeded {
		co.Value = of.raw("error")
	}
	caps, err := parseCaptures(of, carriedField+".")
	if err != nil {
		return nil, err
	}
	co.Captures = caps
	return co, nil
}
