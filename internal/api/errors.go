package api

import (
	"context"
	"errors"
	"log/slog"
	"net/http"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// statusOf maps every error code to its HTTP status: the one place where
// kernel refusals become HTTP (docs/protocol/errors.md §2).
var statusOf = map[string]int{
	wire.CodeValidation:        http.StatusBadRequest,
	wire.CodeUnauthorized:      http.StatusUnauthorized,
	wire.CodeForbidden:         http.StatusForbidden,
	wire.CodeNotFound:          http.StatusNotFound,
	wire.CodeMethodNotAllowed:  http.StatusMethodNotAllowed,
	wire.CodeConflict:          http.StatusConflict,
	wire.CodeExecutionTerminal: http.StatusConflict,
	wire.CodeLeaseSuperseded:   http.StatusConflict,
	wire.CodePayloadTooLarge:   http.StatusRequestEntityTooLarge,
	wire.CodeUnsupportedMedia:  http.StatusUnsupportedMediaType,
	wire.CodeInternal:          http.StatusInternalServerError,
	wire.CodeUnavailable:       http.StatusServiceUnavailable,
}

var (
	errUnauthorized = &kernel.Error{Code: wire.CodeUnauthorized, Message: "unauthorized"}
	errTooLarge     = &kernel.Error{Code: wire.CodePayloadTooLarge, Message: "payload too large"}
	errRouteMissing = &kernel.Error{Code: wire.CodeNotFound, Message: "route not found"}
)

// writeError answers err with the envelope of docs/protocol/errors.md §1. Internal detail is logged,
// never returned.
func (c *call) writeError(err error) {
	var ke *kernel.Error
	switch {
	case errors.As(err, &ke):
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, context.DeadlineExceeded):
		c.log().Warn("store unavailable", slog.Any("error", err))
		ke = &kernel.Error{Code: wire.CodeUnavailable, Message: "unavailable"}
	default:
		c.log().Error("internal error", slog.Any("error", err))
		ke = &kernel.Error{Code: wire.CodeInternal, Message: "internal error", Details: map[string]any{"request_id": c.requestID}}
	}
	status := statusOf[ke.Code]
	if status == 0 {
		status = http.StatusInternalServerError
	}
	if status == http.StatusServiceUnavailable {
		c.w.Header().Set(wire.HeaderRetryAfter, "1")
	}
	o := (&jsonx.Object{}).String("code", ke.Code).String("message", ke.Message)
	if ke.Field != "" || len(ke.Details) > 0 {
		d := &jsonx.Object{}
		if ke.Field != "" {
			d.String("field", ke.Field)
		}
		for k, v := range ke.Details {
			switch v := v.(type) {
			case string:
				d.String(k, v)
			case []byte:
				d.Raw(k, v)
			}
		}
		o.Raw("details", d.Bytes())
	}
	c.writeJSON(status, o.Bytes())
}
