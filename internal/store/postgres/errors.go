package postgres

import (
	"context"
	"database/sql/driver"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"syscall"

	"github.com/jackc/pgx/v5/pgconn"
	"github.com/jackc/puddle/v2"

	"github.com/rebuno/rebuno/internal/store"
)

// classify wraps the errors that mean "the database cannot serve now" in
// store.ErrUnavailable, which the HTTP layer answers with 503 and
// Retry-After: a connection that failed or was lost, a server shutting down
// or out of resources, a transaction that lost a deadlock. A transaction
// that fails so is rolled back whole (or, when the connection died during
// COMMIT, its outcome is unknown and the client's retry finds out), so
// nothing is ever half-written. Other errors come back unchanged.
func classify(err error) error {
	if err == nil || errors.Is(err, store.ErrUnavailable) || !unavailable(err) {
		return err
	}
	return fmt.Errorf("%w: %w", store.ErrUnavailable, err)
}

func unavailable(err error) bool {
	// The caller's own deadline or cancellation is not the database's
	// fault, and callers already recognise it.
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return false
	}
	// Any failure to connect, whatever the server said while refusing.
	var connectErr *pgconn.ConnectError
	if errors.As(err, &connectErr) {
		return true
	}
	var pgErr *pgconn.PgError
	if errors.As(err, &pgErr) {
		return unavailableState(pgErr.Code)
	}
	var netErr net.Error
	switch {
	case errors.As(err, &netErr):
		return true
	case errors.Is(err, driver.ErrBadConn), errors.Is(err, pgconn.ErrConnClosed), errors.Is(err, puddle.ErrClosedPool),
		errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF), errors.Is(err, net.ErrClosed),
		errors.Is(err, syscall.ECONNREFUSED), errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return true
	}
	return pgconn.SafeToRetry(err)
}

// unavailableState recognises the SQLSTATEs of a server that cannot serve
// now but may soon: connection exceptions (08), insufficient resources such
// as too many connections or a full disk (53), shutdown and restart (57P),
// system I/O errors (58), a deadlock or serialisation failure (40001, 40P01;
// the transaction was rolled back and a retry may succeed) and a read-only
// server, which is what a replica promoted away from looks like (25006).
func unavailableState(code string) bool {
	switch {
	case strings.HasPrefix(code, "08"), strings.HasPrefix(code, "53"), strings.HasPrefix(code, "57P"),
		strings.HasPrefix(code, "58"):
		return true
	}
	switch code {
	case "40001", "40P01", "25006":
		return true
	}
	return false
}
