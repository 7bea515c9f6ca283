package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// executionScenarios are the scenarios of executions: rows, updates, listing, deletion, idempotency records.
var executionScenarios = []scenario{
	{"ExecutionRoundTrip", testExecutionRoundTrip},
	{"ExecutionTimes", testExecutionTimes},
	{"ExecutionUpdate", testExecutionUpdate},
	{"ExecutionStatusChanges", testExecutionStatusChanges},
	{"ExecutionDuplicateID", testExecutionDuplicateID},
	{"ListExecutions", testListExecutions},
	{"DeleteExecution", testDeleteExecution},
	{"Idempotency", testIdempotency},
}

func testExecutionRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	full := fullExecution("exec-full")
	minimal := minimalExecution("exec-min", "agent-m", wire.ExecPending)
	large := minimalExecution("exec-large", "agent-m", wire.ExecPending)
	var lb bytes.Buffer
	lb.WriteString(`{"blob":"`)
	for i := 0; lb.Len() < 1<<20; i++ {
		fmt.Fprintf(&lb, "%08x", i*2654435761)
	}
	lb.WriteString("\"}\n")
	large.Input = lb.Bytes()

	var inTx *store.Execution
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		if err := writeRows(ctx, tx, full, minimal, large); err != nil {
			return err
		}
		var err error
		inTx, err = tx.Execution(ctx, full.ID)
		return err
	})
	same(t, "execution read inside its transaction", inTx, full)
	same(t, "full execution", val(s.Read().Execution(ctx, full.ID)).get(t, "Execution"), full)

	got := val(s.Read().Execution(ctx, minimal.ID)).get(t, "Execution")
	same(t, "minimal execution", got, minimal)
	if got.State != nil || got.Output != nil || got.Restoration != nil {
		t.Errorf("absent JSON values read back as state %q, output %q, restoration %q; want nil", got.State, got.Output, got.Restoration)
	}
	if len(got.ResourceKeys) != 0 || len(got.Writing) != 0 {
		t.Errorf("resource keys %q and writers %q; want none", got.ResourceKeys, got.Writing)
	}
	if !got.DeadlineAt.IsZero() {
		t.Errorf("deadline: got %v, want zero", got.DeadlineAt)
	}

	got = val(s.Read().Execution(ctx, large.ID)).get(t, "Execution")
	if !bytes.Equal(got.Input, large.Input) {
		t.Errorf("1 MiB input: got %d bytes, want %d, equal=%v", len(got.Input), len(large.Input), bytes.Equal(got.Input, large.Input))
	}

	_, err := s.Read().Execution(ctx, "exec-missing")
	wantNotFound(t, "Execution of an unknown id", err)
}

func testExecutionTimes(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := minimalExecution("exec-times", "agent", wire.ExecRunning)
	// Microsecond precision, a non-UTC location, and nanoseconds that a
	// backend may drop.
	paris := time.FixedZone("UTC+1", 3600)
	e.CreatedAt = time.Date(2027, 1, 31, 23, 59, 59, 999999000, time.UTC)
	e.UpdatedAt = time.Date(2027, 2, 1, 1, 0, 0, 1000, paris)
	e.DeadlineAt = time.Date(2027, 2, 1, 0, 0, 1, 123456789, time.UTC)
	write(t, s, e)
	got := val(s.Read().Execution(ctx, e.ID)).get(t, "Execution")
	if !got.CreatedAt.Equal(e.CreatedAt) {
		t.Errorf("created_at: got %v, want %v", got.CreatedAt, e.CreatedAt)
	}
	if !got.UpdatedAt.Equal(e.UpdatedAt) {
		t.Errorf("updated_at in another zone: got %v, want the instant %v", got.UpdatedAt, e.UpdatedAt)
	}
	if d := got.DeadlineAt.Sub(e.DeadlineAt); d <= -time.Microsecond || d >= time.Microsecond {
		t.Errorf("deadline with nanoseconds: got %v, want %v within a microsecond", got.DeadlineAt, e.DeadlineAt)
	}
	if got.DeadlineAt.Nanosecond()%1000 != 0 {
		t.Errorf("deadline: got %v, finer than the microsecond the store keeps", got.DeadlineAt)
	}
}

func testExecutionUpdate(t *testing.T, s store.Store) {
	ctx := t.Context()
	orig := fullExecution("exec-upd")
	write(t, s, orig)

	// Every mutable field changes; nil clears a JSON value.
	want := *orig
	want.Status = wire.ExecCompleted
	want.Output = []byte("  [1,\n2]")
	want.State = nil
	want.FailureReason = ""
	want.UpdatedAt = at(time.Minute + 5*time.Microsecond)
	want.ResourceKeys = []string{"b", "a"}
	want.Writing = []string{"step-c"}
	want.DispatchID = "dispatch-2"
	want.LastSeq = 20
	want.StepOrder = 11
	want.StepCount = 10
	want.ByteCount = 99999
	update(t, s, want.ID, func(ctx context.Context, tx store.Tx) error {
		if err := tx.UpdateExecution(ctx, &want); err != nil {
			return err
		}
		return tx.SetExecutionResult(ctx, want.ID, want.Output, want.State)
	})
	same(t, "updated execution", val(s.Read().Execution(ctx, orig.ID)).get(t, "Execution"), &want)

	// The head is the execution without its user values.
	head := want
	head.Input, head.Output, head.State = nil, nil, nil
	same(t, "execution head", val(s.Read().ExecutionHead(ctx, orig.ID)).get(t, "ExecutionHead"), &head)

	// Fields that never change after creation are not written, nor output
	// and state, which only SetExecutionResult writes.
	changed := want
	changed.Output = []byte(`"other output"`)
	changed.State = []byte(`{"other":"state"}`)
	changed.AgentID = "another-agent"
	changed.AgentVersion = "v9"
	changed.Input = []byte(`"other"`)
	changed.CreatedAt = at(50 * time.Hour)
	changed.ParentID = "other-parent"
	changed.IdempotencyKey = "other-key"
	changed.OnBehalfOf = "other-user"
	changed.ForkedFrom = "other-source"
	changed.ForkSeq = 99
	changed.Restoration = []byte(`{"other":true}`)
	update(t, s, want.ID, func(ctx context.Context, tx store.Tx) error { return tx.UpdateExecution(ctx, &changed) })
	same(t, "execution after an update carrying other immutable fields", val(s.Read().Execution(ctx, orig.ID)).get(t, "Execution"), &want)

	// Empty resource keys and writers, and a state set again.
	want.ResourceKeys = nil
	want.Writing = nil
	want.State = []byte(`{"again" : 1}`)
	update(t, s, want.ID, func(ctx context.Context, tx store.Tx) error {
		if err := tx.UpdateExecution(ctx, &want); err != nil {
			return err
		}
		return tx.SetExecutionResult(ctx, want.ID, want.Output, want.State)
	})
	got := val(s.Read().Execution(ctx, orig.ID)).get(t, "Execution")
	same(t, "execution with keys cleared", got, &want)
}

// testExecutionStatusChanges updates an execution's status back and forth,
// with and without a change, within transactions that read the row in
// different ways, and checks the row and the listing by status after each.
// (A backend may skip writing a status it knows to be unchanged; it must
// never skip one that changed, however the transaction learnt the old one.)
func testExecutionStatusChanges(t *testing.T, s store.Store) {
	ctx := t.Context()
	e := minimalExecution("exec-status", "agent", wire.ExecRunning)
	write(t, s, e)
	check := func(what, want string) {
		t.Helper()
		if got := val(s.Read().ExecutionHead(ctx, e.ID)).get(t, "ExecutionHead"); got.Status != want {
			t.Errorf("%s: status %q, want %q", what, got.Status, want)
		}
		for _, status := range []string{wire.ExecRunning, wire.ExecBlocked, wire.ExecCompleted} {
			listed := val(s.Read().ListExecutions(ctx, store.ExecutionFilter{Status: status, Limit: 10})).get(t, "ListExecutions")
			if found := len(listed) == 1 && listed[0].ID == e.ID; found != (status == want) || len(listed) > 1 {
				t.Errorf("%s: listing by status %q gives %d executions, want it only under %q", what, status, len(listed), want)
			}
		}
	}
	type read func(ctx context.Context, tx store.Tx) (*store.Execution, error)
	head := func(ctx context.Context, tx store.Tx) (*store.Execution, error) { return tx.ExecutionHead(ctx, e.ID) }
	full := func(ctx context.Context, tx store.Tx) (*store.Execution, error) { return tx.Execution(ctx, e.ID) }
	for _, c := range []struct {
		name     string
		read     read
		statuses []string // set one after the other in one transaction
		want     string
	}{
		{"unchanged", head, []string{wire.ExecRunning}, wire.ExecRunning},
		{"changed", head, []string{wire.ExecBlocked}, wire.ExecBlocked},
		{"changed and back", full, []string{wire.ExecRunning, wire.ExecBlocked}, wire.ExecBlocked},
		{"changed, then unchanged", full, []string{wire.ExecRunning, wire.ExecRunning}, wire.ExecRunning},
		{"changed twice", head, []string{wire.ExecBlocked, wire.ExecCompleted}, wire.ExecCompleted},
		{"without a read", nil, []string{wire.ExecRunning}, wire.ExecRunning},
	} {
		update(t, s, e.ID, func(ctx context.Context, tx store.Tx) error {
			cur := *e
			if c.read != nil {
				got, err := c.read(ctx, tx)
				if err != nil {
					return err
				}
				cur = *got
			}
			for i, status := range c.statuses {
				cur.Status = status
				cur.LastSeq = int64(i + 1)
				if err := tx.UpdateExecution(ctx, &cur); err != nil {
					return err
				}
			}
			return nil
		})
		check(c.name, c.want)
	}
	// Another execution read in the same transaction does not stand in for
	// this one's status.
	other := minimalExecution("exec-other", "agent", wire.ExecBlocked)
	write(t, s, other)
	update(t, s, e.ID, func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.ExecutionHead(ctx, other.ID); err != nil {
			return err
		}
		cur := *e
		cur.Status = wire.ExecBlocked
		return tx.UpdateExecution(ctx, &cur)
	})
	if got := val(s.Read().ExecutionHead(ctx, e.ID)).get(t, "ExecutionHead"); got.Status != wire.ExecBlocked {
		t.Errorf("after reading another execution: status %q, want %q", got.Status, wire.ExecBlocked)
	}
}

func testExecutionDuplicateID(t *testing.T, s store.Store) {
	ctx := t.Context()
	first := minimalExecution("exec-dup", "agent-1", wire.ExecPending)
	write(t, s, first)
	second := fullExecution("exec-dup")
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error { return tx.InsertExecution(ctx, second) })
	if err == nil {
		t.Fatal("inserting an execution with an existing id succeeded")
	}
	same(t, "execution after a refused duplicate", val(s.Read().Execution(ctx, first.ID)).get(t, "Execution"), first)
}

func testListExecutions(t *testing.T, s store.Store) {
	ctx := t.Context()
	type row struct{ id, agent, status string }
	rows := []row{
		{"exec-05", "agent-a", wire.ExecRunning},
		{"exec-02", "agent-b", wire.ExecCompleted},
		{"exec-08", "agent-a", wire.ExecPending},
		{"exec-01", "agent-a", wire.ExecCompleted},
		{"exec-07", "agent-b", wire.ExecRunning},
		{"exec-03", "agent-a", wire.ExecRunning},
		{"exec-06", "agent-b", wire.ExecFailed},
		{"exec-04", "agent-a", wire.ExecBlocked},
	}
	var all []any
	full := fullExecution("exec-09")
	full.AgentID = "agent-c"
	for _, r := range rows {
		all = append(all, minimalExecution(r.id, r.agent, r.status))
	}
	all = append(all, full)
	write(t, s, all...)

	list := func(f store.ExecutionFilter) []string {
		t.Helper()
		return executionIDs(val(s.Read().ListExecutions(ctx, f)).get(t, "ListExecutions"))
	}
	cases := []struct {
		name string
		f    store.ExecutionFilter
		want []string
	}{
		{"all", store.ExecutionFilter{Limit: 100}, []string{"exec-09", "exec-08", "exec-07", "exec-06", "exec-05", "exec-04", "exec-03", "exec-02", "exec-01"}},
		{"limit", store.ExecutionFilter{Limit: 3}, []string{"exec-09", "exec-08", "exec-07"}},
		{"agent", store.ExecutionFilter{AgentID: "agent-b", Limit: 100}, []string{"exec-07", "exec-06", "exec-02"}},
		{"status", store.ExecutionFilter{Status: wire.ExecRunning, Limit: 100}, []string{"exec-09", "exec-07", "exec-05", "exec-03"}},
		{"agent and status", store.ExecutionFilter{AgentID: "agent-a", Status: wire.ExecRunning, Limit: 100}, []string{"exec-05", "exec-03"}},
		{"cursor", store.ExecutionFilter{Cursor: "exec-05", Limit: 100}, []string{"exec-04", "exec-03", "exec-02", "exec-01"}},
		{"cursor between ids", store.ExecutionFilter{Cursor: "exec-055", Limit: 2}, []string{"exec-05", "exec-04"}},
		{"agent, cursor and limit", store.ExecutionFilter{AgentID: "agent-a", Cursor: "exec-08", Limit: 2}, []string{"exec-05", "exec-04"}},
		{"cursor below everything", store.ExecutionFilter{Cursor: "exec-01", Limit: 100}, []string{}},
		{"unknown agent", store.ExecutionFilter{AgentID: "nobody", Limit: 100}, []string{}},
	}
	for _, c := range cases {
		sameStrings(t, "ListExecutions "+c.name, list(c.f), c.want)
	}

	// Keyset paging visits every execution once, newest first.
	var paged []string
	cursor := ""
	for range 10 {
		page := list(store.ExecutionFilter{Cursor: cursor, Limit: 4})
		paged = append(paged, page...)
		if len(page) < 4 {
			break
		}
		cursor = page[len(page)-1]
	}
	sameStrings(t, "paged ListExecutions", paged, cases[0].want)

	// Rows come back whole.
	got := val(s.Read().ListExecutions(ctx, store.ExecutionFilter{AgentID: "agent-c", Limit: 10})).get(t, "ListExecutions")
	sameList(t, "listed full execution", got, []*store.Execution{full})
}

func testDeleteExecution(t *testing.T, s store.Store) {
	ctx := t.Context()
	a, b := newGraph("exec-del"), newGraph("exec-keep")
	agent := fullAgent("agent-α")
	write(t, s, append(append(a.rows(), b.rows()...), agent)...)
	a.checkPresent(t, s.Read())
	b.checkPresent(t, s.Read())

	var absentInTx bool
	update(t, s, "exec-del", func(ctx context.Context, tx store.Tx) error {
		if err := tx.DeleteExecution(ctx, "exec-del"); err != nil {
			return err
		}
		_, err := tx.Execution(ctx, "exec-del")
		absentInTx = errors.Is(err, store.ErrNotFound)
		return nil
	})
	if !absentInTx {
		t.Error("Execution inside the transaction that deleted it: not ErrNotFound")
	}
	a.checkAbsent(t, s.Read())
	b.checkPresent(t, s.Read())
	same(t, "agent of the deleted execution", val(s.Read().Agent(ctx, agent.ID)).get(t, "Agent"), agent)
	if live := val(s.Read().AgentHasLiveExecutions(ctx, agent.ID)).get(t, "AgentHasLiveExecutions"); !live {
		t.Error("AgentHasLiveExecutions: the kept running execution no longer counts")
	}
	got := val(s.Read().ListExecutions(ctx, store.ExecutionFilter{Limit: 100})).get(t, "ListExecutions")
	sameStrings(t, "executions after delete", executionIDs(got), []string{"exec-keep"})
}

func testIdempotency(t *testing.T, s store.Store) {
	ctx := t.Context()
	recs := []*store.IdempotencyRecord{
		{Route: "create", Scope: "", Key: "k1", BodyHash: "h1", ExecutionID: "e1", CreatedAt: base},
		{Route: "fork", Scope: "src-1", Key: "k1", BodyHash: "h2", ExecutionID: "e2", CreatedAt: at(time.Microsecond)},
		{Route: "create", Scope: "", Key: "k2", BodyHash: "h3", ExecutionID: "e3", CreatedAt: at(30 * time.Minute)},
		{Route: "create", Scope: "", Key: "k3", BodyHash: "h4", ExecutionID: "e4", CreatedAt: at(2 * time.Hour)},
	}
	var rows []any
	for _, r := range recs {
		rows = append(rows, r)
	}
	write(t, s, rows...)
	read := func(route, scope, key string) (*store.IdempotencyRecord, error) {
		return s.Read().Idempotency(ctx, route, scope, key)
	}
	for _, r := range recs {
		same(t, "idempotency record "+r.Route+"/"+r.Scope+"/"+r.Key, val(read(r.Route, r.Scope, r.Key)).get(t, "Idempotency"), r)
	}
	for _, k := range [][3]string{{"fork", "", "k1"}, {"create", "src-1", "k1"}, {"create", "", "k9"}, {"fork", "src-2", "k1"}} {
		_, err := read(k[0], k[1], k[2])
		wantNotFound(t, fmt.Sprintf("Idempotency%q", k), err)
	}

	// A new use of a key replaces the old record.
	repl := &store.IdempotencyRecord{Route: "create", Scope: "", Key: "k1", BodyHash: "h9", ExecutionID: "e9", CreatedAt: at(time.Hour)}
	write(t, s, repl)
	same(t, "replaced record", val(read("create", "", "k1")).get(t, "Idempotency"), repl)
	same(t, "record with the same key on another route", val(read("fork", "src-1", "k1")).get(t, "Idempotency"), recs[1])

	// Records created strictly before the cutoff go.
	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.DeleteIdempotencyBefore(ctx, at(time.Hour)) })
	same(t, "record created at the cutoff", val(read("create", "", "k1")).get(t, "Idempotency"), repl)
	same(t, "record created after the cutoff", val(read("create", "", "k3")).get(t, "Idempotency"), recs[3])
	_, err := read("fork", "src-1", "k1")
	wantNotFound(t, "record older than the cutoff", err)
	_, err = read("create", "", "k2")
	wantNotFound(t, "record older than the cutoff", err)
}
