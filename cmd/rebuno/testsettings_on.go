//go:build rebuno_test

package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/kernel"
)

// testSettings reads the test-only settings of docs/protocol/configuration.md §4: a manual clock when
// REBUNO_TEST_CLOCK=manual, and a failing limiter when
// REBUNO_TEST_LIMITER_FAULT is error or timeout.
func testSettings(*slog.Logger) (*clock.Manual, kernel.Limiter, error) {
	var manual *clock.Manual
	switch v := os.Getenv("REBUNO_TEST_CLOCK"); v {
	case "":
	case "manual":
		manual = clock.NewManual(clock.Real{}.Now())
	default:
		return nil, nil, fmt.Errorf("invalid REBUNO_TEST_CLOCK: must be manual")
	}
	var limiter kernel.Limiter
	switch v := os.Getenv("REBUNO_TEST_LIMITER_FAULT"); v {
	case "":
	case "error":
		limiter = kernel.FaultyLimiter{}
	case "timeout":
		limiter = kernel.FaultyLimiter{Timeout: true}
	default:
		return nil, nil, fmt.Errorf("invalid REBUNO_TEST_LIMITER_FAULT: must be error or timeout")
	}
	return manual, limiter, nil
}
