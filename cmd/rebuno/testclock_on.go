//go:build rebuno_test

package main

import (
	"fmt"
	"log/slog"
	"os"

	"github.com/rebuno/rebuno/internal/clock"
)

// testClock returns a manual clock when REBUNO_TEST_CLOCK=manual (§24.4).
func testClock(*slog.Logger) (*clock.Manual, error) {
	switch v := os.Getenv("REBUNO_TEST_CLOCK"); v {
	case "":
		return nil, nil
	case "manual":
		return clock.NewManual(clock.Real{}.Now()), nil
	default:
		return nil, fmt.Errorf("invalid REBUNO_TEST_CLOCK: must be manual")
	}
}
