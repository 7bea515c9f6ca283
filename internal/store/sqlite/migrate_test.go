package sqlite

import (
	"bytes"
	"context"
	"database/sql"
	"fmt"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// openAtVersion creates a database holding the schema of the first n
// migrations, as a binary of that version left it.
func openAtVersion(t *testing.T, path string, n int) *sql.DB {
	t.Helper()
	db, err := sql.Open("sqlite", "file:"+path)
	if err != nil {
		t.Fatalf("sql.Open: %v", err)
	}
	t.Cleanup(func() { db.Close() })
	stmts := append([]string{`CREATE TABLE schema_version (version INTEGER NOT NULL)`}, migrations[:n]...)
	stmts = append(stmts, fmt.Sprintf(`INSERT INTO schema_version (version) VALUES (%d)`, n))
	for _, s := range stmts {
		if _, err := db.Exec(s); err != nil {
			t.Fatalf("schema %d: %v", n, err)
		}
	}
	return db
}

// TestMigrationFiveKeepsCountersAndRuns upgrades a version 4 database, whose
// counters and event runs were rowid tables, and reads back every row it
// held through the store.
func TestMigrationFiveKeepsCountersAndRuns(t *testing.T) {
	ctx := t.Context()
	now := time.Unix(1_700_000_000, 0)

	// Real runs, as the store encodes them, to plant in the old database.
	donor := openAt(t, filepath.Join(t.TempDir(), "donor.db"), nil)
	evs := []*store.Event{
		{ExecutionID: "e1", Seq: 1, Type: wire.EventExecutionCreated, Payload: []byte(`{"a":1}`), OccurredAt: now},
		{ExecutionID: "e1", Seq: 2, Type: wire.EventStepProposed, Payload: []byte(`{"b":2}`), OccurredAt: now},
		{ExecutionID: "e1", Seq: 3, Type: wire.EventStepExecuting, Payload: []byte(`{"c":3}`), OccurredAt: now},
	}
	for _, part := range [][]*store.Event{evs[:2], evs[2:]} {
		if err := donor.Update(ctx, "e1", func(ctx context.Context, tx store.Tx) error { return tx.AppendEvents(ctx, part) }); err != nil {
			t.Fatalf("append: %v", err)
		}
	}
	type run struct {
		last, first int64
		blob        []byte
	}
	var runs []run
	rows, err := donor.read.Query(`SELECT last_seq, first_seq, events FROM event_runs WHERE execution_id = 'e1' ORDER BY last_seq`)
	if err != nil {
		t.Fatal(err)
	}
	for rows.Next() {
		var r run
		if err := rows.Scan(&r.last, &r.first, &r.blob); err != nil {
			t.Fatal(err)
		}
		runs = append(runs, r)
	}
	rows.Close()
	if len(runs) != 2 {
		t.Fatalf("donor runs: %d, want 2", len(runs))
	}

	path := filepath.Join(t.TempDir(), "rebuno.db")
	old := openAtVersion(t, path, 4)
	for _, r := range runs {
		if _, err := old.Exec(`INSERT INTO event_runs (execution_id, last_seq, first_seq, events) VALUES ('e1', ?, ?, ?)`, r.last, r.first, r.blob); err != nil {
			t.Fatal(err)
		}
	}
	for _, c := range []struct {
		exec, dispatch, hash string
		consumed             int64
	}{{"e1", "d1", "h1", 4}, {"e1", "d2", "h1", 7}, {"e2", "d3", "h2", 9}} {
		if _, err := old.Exec(`INSERT INTO counters (dispatch_id, kind, target, args_hash, execution_id, consumed) VALUES (?, 'tool', 't', ?, ?, ?)`,
			c.dispatch, c.hash, c.exec, c.consumed); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()

	s := openAt(t, path, nil)
	if got := schemaVersions(t, path); len(got) != 1 || got[0] != len(migrations) {
		t.Fatalf("schema_version %v, want [%d]", got, len(migrations))
	}
	got, err := s.Read().Events(ctx, "e1", 0, 10)
	if err != nil || len(got) != 3 {
		t.Fatalf("Events after the migration: %d events, %v; want 3", len(got), err)
	}
	for i, e := range got {
		if e.Seq != evs[i].Seq || e.Type != evs[i].Type || !bytes.Equal(e.Payload, evs[i].Payload) {
			t.Errorf("event %d after the migration: %+v, want %+v", i, e, evs[i])
		}
	}
	for _, c := range []struct {
		exec, dispatch, hash string
		want                 int64
	}{{"e1", "d1", "h1", 4}, {"e1", "d2", "h1", 7}, {"e2", "d3", "h2", 9}} {
		v, found, err := s.Read().Counter(ctx, c.exec, c.dispatch, "tool", "t", c.hash)
		if err != nil || !found || v != c.want {
			t.Errorf("Counter(%s, %s) after the migration: (%d, %v, %v), want %d", c.exec, c.dispatch, v, found, err, c.want)
		}
	}
	// The new layout: both tables keyed by their primary key, and no index
	// left over from the old counters table.
	for _, table := range []string{"counters", "event_runs"} {
		var ddl string
		if err := s.read.QueryRow(`SELECT sql FROM sqlite_schema WHERE type = 'table' AND name = ?`, table).Scan(&ddl); err != nil {
			t.Fatalf("%s: %v", table, err)
		}
		if !strings.HasSuffix(ddl, "WITHOUT ROWID") {
			t.Errorf("%s is not a WITHOUT ROWID table: %s", table, ddl)
		}
	}
	var indexes int
	if err := s.read.QueryRow(`SELECT count(*) FROM sqlite_schema WHERE type = 'index' AND tbl_name IN ('counters', 'event_runs')`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 0 {
		t.Errorf("%d indexes on counters and event_runs, want none", indexes)
	}
}

// TestMigrationSevenListsWriters upgrades a version 6 database, whose
// executing tool and local steps were found through a partial index, and
// checks that each execution's row lists exactly those steps.
func TestMigrationSevenListsWriters(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "rebuno.db")
	old := openAtVersion(t, path, 6)
	for _, id := range []string{"busy", "idle"} {
		if _, err := old.Exec(`INSERT INTO executions (id, agent_id, agent_version, status, failure_reason, created_at, updated_at,
 deadline_at, parent_execution_id, idempotency_key, on_behalf_of, forked_from, fork_seq, resource_keys, dispatch_id,
 last_seq, step_order, step_count, byte_count) VALUES (?, 'a', '', 'running', '', 1, 1, 0, '', '', '', '', 0, '[]', '', 0, 0, 0, 0)`, id); err != nil {
			t.Fatal(err)
		}
	}
	for _, s := range []struct{ execution, id, kind, status string }{
		{"busy", "tool-running", wire.KindToolCall, wire.StepExecuting},
		{"busy", "local-running", wire.KindLocal, wire.StepExecuting},
		{"busy", "llm-running", wire.KindLLMCall, wire.StepExecuting},
		{"busy", "tool-done", wire.KindToolCall, wire.StepSucceeded},
		{"idle", "idle-done", wire.KindToolCall, wire.StepSucceeded},
	} {
		if _, err := old.Exec(`INSERT INTO steps (execution_id, step_id, step_order, kind, target, args_hash, occurrence, status, idempotency)
 VALUES (?, ?, 1, ?, 't', ?, 0, ?, 'safe_to_retry')`, s.execution, s.id, s.kind, "h-"+s.id, s.status); err != nil {
			t.Fatal(err)
		}
	}
	old.Close()

	s := openAt(t, path, nil)
	busy, err := s.Read().ExecutionHead(ctx, "busy")
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(busy.Writing)
	if !slices.Equal(busy.Writing, []string{"local-running", "tool-running"}) {
		t.Errorf("busy execution's writers after the upgrade: %q", busy.Writing)
	}
	idle, err := s.Read().ExecutionHead(ctx, "idle")
	if err != nil {
		t.Fatal(err)
	}
	if idle.Writing == nil || len(idle.Writing) != 0 {
		t.Errorf("idle execution's writers after the upgrade: %#v, want []", idle.Writing)
	}
	var indexes int
	if err := s.read.QueryRow(`SELECT COUNT(*) FROM sqlite_master WHERE type = 'index' AND name = 'steps_writing'`).Scan(&indexes); err != nil {
		t.Fatal(err)
	}
	if indexes != 0 {
		t.Error("steps_writing is still there")
	}
}

// TestMigrationTenKeepsCheckpoints upgrades a version 9 database, whose
// checkpoint rows kept no kept counts: each reads back as it was, with both
// counts 0 (unknown, store.Checkpoint), and a new row keeps its own.
func TestMigrationTenKeepsCheckpoints(t *testing.T) {
	ctx := t.Context()
	path := filepath.Join(t.TempDir(), "rebuno.db")
	old := openAtVersion(t, path, 9)
	if _, err := old.Exec(`INSERT INTO checkpoints (execution_id, key, covered_seq, generation, checkpoint_ref, invalidated_seq)
 VALUES ('e1', 'w', 7, 2, 'B0', 10), ('e1', 'w', 12, 3, 'B1', 0)`); err != nil {
		t.Fatal(err)
	}
	old.Close()

	s := openAt(t, path, nil)
	fresh := &store.Checkpoint{ExecutionID: "e1", Key: "w", CoveredSeq: 20, Generation: 4, CheckpointRef: "B2", CoveredKept: 15}
	if err := s.Update(ctx, "e1", func(ctx context.Context, tx store.Tx) error { return tx.InsertCheckpoint(ctx, fresh) }); err != nil {
		t.Fatal(err)
	}
	rows, err := s.Read().Checkpoints(ctx, "e1")
	if err != nil {
		t.Fatal(err)
	}
	want := []store.Checkpoint{
		{ExecutionID: "e1", Key: "w", CoveredSeq: 7, Generation: 2, CheckpointRef: "B0", InvalidatedSeq: 10},
		{ExecutionID: "e1", Key: "w", CoveredSeq: 12, Generation: 3, CheckpointRef: "B1"},
		*fresh,
	}
	if len(rows) != len(want) {
		t.Fatalf("%d checkpoints after the upgrade, want %d", len(rows), len(want))
	}
	for i, r := range rows {
		if *r != want[i] {
			t.Errorf("checkpoint %d after the upgrade: %+v, want %+v", i, r, want[i])
		}
	}
}
