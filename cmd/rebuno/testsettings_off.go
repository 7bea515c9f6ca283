//go:build !rebuno_test

package main

import (
	"log/slog"
	"os"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/kernel"
)

// testSettings: release builds never honour the test-only settings (docs/protocol/configuration.md §4).
func testSettings(log *slog.Logger) (*clock.Manual, kernel.Limiter, error) {
	for _, name := range []string{"REBUNO_TEST_CLOCK", "REBUNO_TEST_LIMITER_FAULT"} {
		if _, ok := os.LookupEnv(name); ok {
			log.Warn("ignoring a test-only setting in a release build", slog.String("variable", name))
		}
	}
	return nil, nil, nil
}
