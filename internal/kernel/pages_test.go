package kernel

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

// maxPagesPerStep bounds the pages a step's two commits write, by kind.
// Every page is a WAL frame that a durable commit writes and then waits for
// (about 0.02 ms each on the reference VM, see docs/performance.md), so an
// index or a column layout that adds pages to every step shows up here
// before it shows up in P1. Measured at 14.06 for tool calls and 13.88 for
// LLM calls since schema 7 listed the executing writers on their execution's
// row (15.8–16.0 and 13.97 before, with an index of them); raise a bound
// only knowingly.
var maxPagesPerStep = map[string]float64{wire.KindToolCall: 15, wire.KindLLMCall: 15}

// walFrame is the size of a WAL frame: a 24-byte header and a 4 KiB page.
const walFrame = 24 + 4096

// TestPagesPerStep counts, from the growth of the write-ahead log with
// checkpoints off, the pages that a new step's submit and complete write.
func TestPagesPerStep(t *testing.T) {
	for kind, bound := range maxPagesPerStep {
		t.Run(kind, func(t *testing.T) { testPagesPerStep(t, kind, bound) })
	}
}

func testPagesPerStep(t *testing.T, kind string, bound float64) {
	const steps = 300
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "pages.db")
	k, _, e, h := benchExecutionOn(t, sqlite.Options{Path: path, CheckpointEvery: -1})
	walSize := func() int64 {
		t.Helper()
		st, err := os.Stat(path + "-wal")
		if err != nil {
			t.Fatal(err)
		}
		return st.Size()
	}
	step := func(i int) {
		if err := roundTrip(ctx, k, e.ID, h, kind, i, okResult); err != nil {
			t.Fatal(err)
		}
	}
	// A few steps first, so that the log has its header and the B-trees
	// their first pages.
	for i := range 20 {
		step(i)
	}
	before := walSize()
	for i := range steps {
		step(20 + i)
	}
	grown := walSize() - before
	if grown%walFrame != 0 {
		t.Fatalf("the log grew by %d bytes, not a whole number of %d-byte frames: was it checkpointed?", grown, walFrame)
	}
	perStep := float64(grown/walFrame) / steps
	t.Logf("%.2f pages per step (%d frames over %d steps)", perStep, grown/walFrame, steps)
	// A step writes at least its row, its events and the execution's row in
	// each commit; less means the log was reset and reused while counting.
	if perStep < 6 {
		t.Fatalf("%.2f pages per step is too few to be a count: was the log checkpointed?", perStep)
	}
	if perStep > bound {
		t.Errorf("a step writes %.2f pages, more than %.0f", perStep, bound)
	}
}
