package kernel

import (
	"errors"
	"fmt"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// Error is a refusal the client can act on. Code is a wire error code; the
// HTTP layer maps codes to statuses in one table.
type Error struct {
	Code    string
	Message string
	// Field names the offending field or parameter of a validation error.
	Field string
	// Details carries extra structured context (for example a conflict's
	// stored and requested values).
	Details map[string]any
}

func (e *Error) Error() string { return e.Message }

func validation(field, format string, args ...any) *Error {
	return &Error{Code: wire.CodeValidation, Field: field, Message: "validation error: " + fmt.Sprintf(format, args...)}
}

// Validation builds a validation error; the HTTP layer uses it for the
// syntax rules it checks before calling a verb.
func Validation(field, format string, args ...any) *Error { return validation(field, format, args...) }

func errNotFound(what string) *Error {
	return &Error{Code: wire.CodeNotFound, Message: what + " not found"}
}

func errForbidden() *Error { return &Error{Code: wire.CodeForbidden, Message: "forbidden"} }

func errConflict(detail string) *Error {
	return &Error{Code: wire.CodeConflict, Message: "conflict: " + detail}
}

func errTerminal() *Error {
	return &Error{Code: wire.CodeExecutionTerminal, Message: "execution terminal"}
}

func errSuperseded() *Error {
	return &Error{Code: wire.CodeLeaseSuperseded, Message: "lease superseded"}
}

// MissingDispatchID is the refusal of an agent write that must name its
// dispatch and does not (docs/protocol/steps.md §2 step 3); the HTTP layer raises it before
// reading the body of a submit.
func MissingDispatchID() *Error {
	return &Error{Code: wire.CodeValidation, Field: wire.HeaderDispatchID, Message: "validation error: missing dispatch_id"}
}

// isCode reports whether err is a refusal with the given code.
func isCode(err error, code string) bool {
	var ke *Error
	return errors.As(err, &ke) && ke.Code == code
}

// notFoundOr turns store.ErrNotFound into a 404 for what, and wraps anything
// else.
func notFoundOr(err error, what string) error {
	if errors.Is(err, store.ErrNotFound) {
		return errNotFound(what)
	}
	return fmt.Errorf("read %s: %w", what, err)
}
