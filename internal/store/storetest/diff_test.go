package storetest

import (
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

// TestDiff checks the comparison every scenario relies on: if it missed a
// difference, the suite would pass any backend.
func TestDiff(t *testing.T) {
	want := fullExecution("e")
	if d := diff(fullExecution("e"), want); len(d) != 0 {
		t.Fatalf("equal executions differ: %v", d)
	}
	// The same instant in another zone, and a copy of every slice, are equal.
	other := fullExecution("e")
	other.CreatedAt = want.CreatedAt.In(time.FixedZone("X", 7200))
	other.Input = append([]byte(nil), want.Input...)
	other.ResourceKeys = append([]string(nil), want.ResourceKeys...)
	if d := diff(other, want); len(d) != 0 {
		t.Fatalf("equal executions in another zone differ: %v", d)
	}
	noKeys := fullExecution("e")
	noKeys.ResourceKeys = nil
	emptyKeys := fullExecution("e")
	emptyKeys.ResourceKeys = []string{}
	if d := diff(emptyKeys, noKeys); len(d) != 0 {
		t.Fatalf("nil and empty resource keys differ: %v", d)
	}

	cases := []struct {
		field  string
		change func(e *store.Execution)
	}{
		{"ID", func(e *store.Execution) { e.ID = "f" }},
		{"Input", func(e *store.Execution) { e.Input = append(e.Input, ' ') }},
		{"State", func(e *store.Execution) { e.State = nil }},
		{"UpdatedAt", func(e *store.Execution) { e.UpdatedAt = e.UpdatedAt.Add(time.Microsecond) }},
		{"DeadlineAt", func(e *store.Execution) { e.DeadlineAt = time.Time{} }},
		{"ResourceKeys", func(e *store.Execution) { e.ResourceKeys[0], e.ResourceKeys[1] = e.ResourceKeys[1], e.ResourceKeys[0] }},
		{"ByteCount", func(e *store.Execution) { e.ByteCount++ }},
	}
	for _, c := range cases {
		got := fullExecution("e")
		c.change(got)
		d := diff(got, want)
		if len(d) != 1 || !strings.HasPrefix(d[0], c.field+":") {
			t.Errorf("changing %s: diff %q, want one line about %s", c.field, d, c.field)
		}
	}

	// A value where none is wanted differs, and so does the reverse.
	noState := fullExecution("e")
	noState.State = nil
	emptyState := fullExecution("e")
	emptyState.State = []byte{}
	if d := diff(emptyState, noState); len(d) != 1 {
		t.Errorf("empty state where nil is wanted: diff %q, want one line", d)
	}
	if d := diff(noState, want); len(d) != 1 {
		t.Errorf("nil state where a value is wanted: diff %q, want one line", d)
	}
	var none *store.Execution
	if d := diff(none, want); len(d) != 1 {
		t.Errorf("nil execution: diff %q, want one line", d)
	}
}
