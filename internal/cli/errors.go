package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/wire"
)

// Exit codes (docs/protocol/configuration.md §6.2).
const (
	ExitOK          = 0
	ExitKernelError = 1
	ExitUsage       = 2
	ExitUnreachable = 3
	ExitEndedBadly  = 4
)

// UsageError is a mistake in the command line: exit 2.
type UsageError struct {
	Msg string
	// Cmd is the command path whose --help explains the usage.
	Cmd string
}

func (e *UsageError) Error() string { return e.Msg }

func usagef(cmd *cobra.Command, format string, args ...any) error {
	path := ""
	if cmd != nil {
		path = cmd.CommandPath()
	}
	return &UsageError{Msg: fmt.Sprintf(format, args...), Cmd: path}
}

// APIError is an error answer of the kernel (docs/protocol/errors.md): exit 1.
type APIError struct {
	Status  int
	Code    string
	Message string
	Details map[string]any
	// Hint tells a person what to do about it ("" when there is nothing
	// useful to say).
	Hint string
}

func (e *APIError) Error() string { return e.Code + ": " + e.Message }

// UnreachableError means no kernel answered at the URL: exit 3.
type UnreachableError struct {
	URL   string
	Cause string
	Hint  string
}

func (e *UnreachableError) Error() string {
	return fmt.Sprintf("cannot reach the kernel at %s: %s", e.URL, e.Cause)
}

// EndedError reports that a watched or awaited execution ended failed or
// cancelled: exit 4. After a watch the timeline has already said why, so
// nothing more is printed; Explain asks Report to say it.
type EndedError struct {
	ID     string
	Status string
	// Reason is the execution's failure_reason, printed with Explain.
	Reason  string
	Explain bool
}

func (e *EndedError) Error() string {
	if e.Reason == "" {
		return "execution " + e.ID + " ended " + e.Status
	}
	return "execution " + e.ID + " ended " + e.Status + ": " + e.Reason
}

// ExitCode maps an error to the exit code of docs/protocol/configuration.md §6.2.
func ExitCode(err error) int {
	var ue *UsageError
	var ae *APIError
	var ne *UnreachableError
	var ee *EndedError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue):
		return ExitUsage
	case errors.As(err, &ne):
		return ExitUnreachable
	case errors.As(err, &ee):
		return ExitEndedBadly
	case errors.As(err, &ae):
		return ExitKernelError
	}
	return ExitKernelError
}

// Report prints err for a person on w and returns its exit code. Kernel
// errors are printed as `error: <code>: <message>` (docs/protocol/configuration.md §6.2), followed by a
// hint when there is an action to suggest.
func Report(w io.Writer, err error) int {
	if err == nil {
		return ExitOK
	}
	var ue *UsageError
	var ae *APIError
	var ne *UnreachableError
	var ee *EndedError
	switch {
	case errors.As(err, &ee):
		// After a watch the timeline already shows the failure or cancellation.
		if ee.Explain {
			fmt.Fprintf(w, "error: %s\n", ee.Error())
		}
	case errors.As(err, &ue):
		fmt.Fprintf(w, "error: %s\n", ue.Msg)
		if ue.Cmd != "" {
			fmt.Fprintf(w, "Run '%s --help' for usage.\n", ue.Cmd)
		}
	case errors.As(err, &ne):
		fmt.Fprintf(w, "error: %s\n", ne.Error())
		if ne.Hint != "" {
			fmt.Fprintf(w, "hint: %s\n", ne.Hint)
		}
	case errors.As(err, &ae):
		fmt.Fprintf(w, "error: %s\n", ae.Error())
		if f, ok := ae.Details["field"].(string); ok && f != "" && !strings.Contains(ae.Message, f) {
			fmt.Fprintf(w, "field: %s\n", f)
		}
		if rid, ok := ae.Details["request_id"].(string); ok && rid != "" {
			fmt.Fprintf(w, "request id: %s (the kernel's log has the detail)\n", rid)
		}
		if ae.Hint != "" {
			fmt.Fprintf(w, "hint: %s\n", ae.Hint)
		}
	default:
		fmt.Fprintf(w, "error: %s\n", err)
	}
	return ExitCode(err)
}

// notFound is a client-side "not found" in the kernel's words.
func notFound(msg, hint string) *APIError {
	return &APIError{Status: 404, Code: wire.CodeNotFound, Message: msg, Hint: hint}
}
