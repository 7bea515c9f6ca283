// Package storetest is the contract every store.Store backend must pass
// unchanged (PROTOCOL §23.1). A backend's own test calls Run with a function
// that opens a fresh, empty store, and RunDurability when its stores can be
// closed and opened again on the same data.
//
// The scenarios never call t.Fatal (or anything else of t) inside an Update
// function or an AfterCommit callback: a backend may run those on a goroutine
// of its own. They record what they see and the test goroutine asserts it.
package storetest

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// base is the reference instant of every scenario. It has microsecond
// precision, the finest that every backend keeps.
var base = time.Date(2026, 12, 2, 9, 37, 43, 629821000, time.UTC)

func at(d time.Duration) time.Time { return base.Add(d) }

// errDeliberate is what scenarios return from a transaction they want rolled
// back.
var errDeliberate = errors.New("storetest: deliberate failure")

// panicMessage is what scenarios panic with inside a transaction.
const panicMessage = "storetest: deliberate panic"

// big is a limit larger than any scenario's row count.
const big = 1 << 20

type scenario struct {
	name string
	fn   func(t *testing.T, s store.Store)
}

var scenarios = []scenario{
	{"ExecutionRoundTrip", testExecutionRoundTrip},
	{"ExecutionTimes", testExecutionTimes},
	{"ExecutionUpdate", testExecutionUpdate},
	{"ExecutionStatusChanges", testExecutionStatusChanges},
	{"ExecutionDuplicateID", testExecutionDuplicateID},
	{"ListExecutions", testListExecutions},
	{"Events", testEvents},
	{"EventRuns", testEventRuns},
	{"StepRoundTrip", testStepRoundTrip},
	{"StepsListing", testStepsListing},
	{"OpenSteps", testOpenSteps},
	{"MaxOccurrence", testMaxOccurrence},
	{"HasIndeterminate", testHasIndeterminate},
	{"DispatchRoundTrip", testDispatchRoundTrip},
	{"RetireDispatches", testRetireDispatches},
	{"DispatchScheduling", testDispatchScheduling},
	{"NextDueAndLeaseExpiry", testNextWake},
	{"Counters", testCounters},
	{"Agents", testAgents},
	{"AgentHasLiveExecutions", testAgentHasLiveExecutions},
	{"Idempotency", testIdempotency},
	{"Deadlines", testDeadlines},
	{"RetentionCandidates", testRetentionCandidates},
	{"DeleteExecution", testDeleteExecution},
	{"RollbackOnError", testRollbackOnError},
	{"RollbackOnPanic", testRollbackOnPanic},
	{"RollbackOnFailedStatement", testRollbackOnFailedStatement},
	{"AfterCommit", testAfterCommit},
	{"CancelledContext", testCancelledContext},
	{"ConcurrentUpdates", testConcurrentUpdates},
	{"SerialisedPerExecution", testSerialisedPerExecution},
	{"ReadAfterUpdate", testReadAfterUpdate},
	{"ReadDuringUpdate", testReadDuringUpdate},
	{"Ping", testPing},
	{"TryUpdate", testTryUpdate},
	{"NotifierHearsItself", testNotifierHearsItself},
	{"APIKeys", testAPIKeys},
	{"AuditLog", testAuditLog},
	{"SessionsAndSettings", testSessionsAndSettings},
	{"Resources", testResources},
	{"Checkpoints", testCheckpoints},
	{"SharedBodies", testSharedBodies},
	{"StepCopiesInBulk", testStepCopiesInBulk},
	{"ListForks", testListForks},
	{"DeleteExecutionKeepsSharedBodies", testDeleteExecutionKeepsSharedBodies},
}

// Run runs every contract scenario as a subtest, each against a fresh store
// from open. open must return an empty store and arrange for it to be closed
// when the subtest ends (t.Cleanup); scenarios never close it themselves.
func Run(t *testing.T, open func(t *testing.T) store.Store) {
	t.Helper()
	for _, sc := range scenarios {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, open(t)) })
	}
}

type durabilityScenario struct {
	name string
	fn   func(t *testing.T, s store.Store, reopen func(t *testing.T, s store.Store) store.Store)
}

var durabilityScenarios = []durabilityScenario{
	{"AcknowledgedWritesSurvive", testAcknowledgedWritesSurvive},
	{"ReopenIsIdempotent", testReopenIsIdempotent},
	{"FinalStateSurvives", testFinalStateSurvives},
}

// RunDurability runs the scenarios that close a store and open it again.
// open is as for Run; reopen closes s and returns a store on the same data,
// arranging for the new store to be closed when the subtest ends.
func RunDurability(t *testing.T, open func(t *testing.T) store.Store, reopen func(t *testing.T, s store.Store) store.Store) {
	t.Helper()
	for _, sc := range durabilityScenarios {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, open(t), reopen) })
	}
}

// ---- helpers ----

func update(t *testing.T, s store.Store, lock string, fn func(ctx context.Context, tx store.Tx) error) {
	t.Helper()
	if err := s.Update(t.Context(), lock, fn); err != nil {
		t.Fatalf("Update: %v", err)
	}
}

// write stores rows (see writeRows) in one transaction.
func write(t *testing.T, s store.Store, rows ...any) {
	t.Helper()
	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return writeRows(ctx, tx, rows...) })
}

// counterRow is a RaiseCounter call.
type counterRow struct {
	ExecutionID, DispatchID, Kind, Target, ArgsHash string
	Consumed                                        int64
}

func (c counterRow) key() counterKey {
	return counterKey{c.ExecutionID, c.DispatchID, c.Kind, c.Target, c.ArgsHash}
}

type counterKey struct{ ExecutionID, DispatchID, Kind, Target, ArgsHash string }

func writeRows(ctx context.Context, tx store.Tx, rows ...any) error {
	for _, r := range rows {
		var err error
		switch r := r.(type) {
		case *store.Execution:
			err = tx.InsertExecution(ctx, r)
		case []*store.Event:
			err = tx.AppendEvents(ctx, r)
		case *store.Step:
			err = tx.InsertStep(ctx, r)
		case []*store.Step:
			for _, st := range r {
				if err = tx.InsertStep(ctx, st); err != nil {
					break
				}
			}
		case *store.Dispatch:
			err = tx.InsertDispatch(ctx, r)
		case counterRow:
			err = tx.RaiseCounter(ctx, r.ExecutionID, r.DispatchID, r.Kind, r.Target, r.ArgsHash, r.Consumed)
		case *store.Agent:
			err = tx.UpsertAgent(ctx, r)
		case *store.IdempotencyRecord:
			err = tx.InsertIdempotency(ctx, r)
		default:
			err = fmt.Errorf("storetest: cannot write %T", r)
		}
		if err != nil {
			return fmt.Errorf("write %T: %w", r, err)
		}
	}
	return nil
}

// result carries a read's outcome to get, which fails the test on error:
// val(r.Execution(ctx, id)).get(t, "Execution").
type result[T any] struct {
	v   T
	err error
}

func val[T any](v T, err error) result[T] { return result[T]{v, err} }

func (r result[T]) get(t *testing.T, what string) T {
	t.Helper()
	if r.err != nil {
		t.Fatalf("%s: %v", what, r.err)
	}
	return r.v
}

func wantNotFound(t *testing.T, what string, err error) {
	t.Helper()
	if !errors.Is(err, store.ErrNotFound) {
		t.Errorf("%s: got error %v, want store.ErrNotFound", what, err)
	}
}

var (
	timeType  = reflect.TypeFor[time.Time]()
	bytesType = reflect.TypeFor[[]byte]()
	listType  = reflect.TypeFor[[]string]()
)

// diff lists the fields in which got differs from want (both pointers to, or
// values of, the same struct type). Times compare as instants and zero only
// equals zero; byte slices compare byte for byte, and a nil want (no value)
// needs a nil got; string lists compare element by element in order, nil
// equal to empty.
func diff(got, want any) []string {
	gv, wv := reflect.ValueOf(got), reflect.ValueOf(want)
	if gv.Kind() == reflect.Pointer {
		if gv.IsNil() || wv.IsNil() {
			if gv.IsNil() != wv.IsNil() {
				return []string{fmt.Sprintf("got %v, want %v", got, want)}
			}
			return nil
		}
		gv, wv = gv.Elem(), wv.Elem()
	}
	var out []string
	for i := range gv.NumField() {
		f := gv.Type().Field(i)
		g, w := gv.Field(i), wv.Field(i)
		ok := true
		switch f.Type {
		case timeType:
			gt, wt := g.Interface().(time.Time), w.Interface().(time.Time)
			ok = gt.IsZero() == wt.IsZero() && gt.Equal(wt)
		case bytesType:
			gb, wb := g.Bytes(), w.Bytes()
			ok = bytes.Equal(gb, wb) && (wb != nil || gb == nil)
		case listType:
			ok = slices.Equal(g.Interface().([]string), w.Interface().([]string))
		default:
			ok = reflect.DeepEqual(g.Interface(), w.Interface())
		}
		if !ok {
			out = append(out, fmt.Sprintf("%s: got %s, want %s", f.Name, show(g), show(w)))
		}
	}
	return out
}

func show(v reflect.Value) string {
	switch v.Type() {
	case timeType:
		tm := v.Interface().(time.Time)
		if tm.IsZero() {
			return "zero time"
		}
		return tm.Format(time.RFC3339Nano)
	case bytesType:
		b := v.Bytes()
		if b == nil {
			return "nil"
		}
		if len(b) > 80 {
			return fmt.Sprintf("%q... (%d bytes)", b[:80], len(b))
		}
		return fmt.Sprintf("%q", b)
	}
	return fmt.Sprintf("%#v", v.Interface())
}

// same reports every field in which got differs from want.
func same(t *testing.T, what string, got, want any) {
	t.Helper()
	if d := diff(got, want); len(d) > 0 {
		t.Errorf("%s differs:\n  %s", what, strings.Join(d, "\n  "))
	}
}

func sameList[T any](t *testing.T, what string, got, want []T) {
	t.Helper()
	if len(got) != len(want) {
		t.Errorf("%s: got %d rows, want %d", what, len(got), len(want))
		return
	}
	for i := range got {
		same(t, fmt.Sprintf("%s[%d]", what, i), got[i], want[i])
	}
}

func sameStrings(t *testing.T, what string, got, want []string) {
	t.Helper()
	if !slices.Equal(got, want) {
		t.Errorf("%s: got %q, want %q", what, got, want)
	}
}

func refIDs(refs []store.DispatchRef) []string {
	out := make([]string, len(refs))
	for i, r := range refs {
		out[i] = r.ID
	}
	return out
}

func executionIDs(l []*store.Execution) []string {
	out := make([]string, len(l))
	for i, e := range l {
		out[i] = e.ID
	}
	return out
}

func stepIDs(l []*store.Step) []string {
	out := make([]string, len(l))
	for i, s := range l {
		out[i] = s.StepID
	}
	return out
}

func eventSeqs(l []*store.Event) []int64 {
	out := make([]int64, len(l))
	for i, e := range l {
		out[i] = e.Seq
	}
	return out
}

func sorted(l []string) []string {
	c := slices.Clone(l)
	slices.Sort(c)
	return c
}

// ---- fixtures ----

// fullExecution sets every field to a distinct, non-zero value, so that a
// swapped or dropped column shows.
func fullExecution(id string) *store.Execution {
	return &store.Execution{
		ID:             id,
		AgentID:        "agent-α",
		AgentVersion:   "v1.2.3",
		Input:          []byte(" {\"b\" : 1,\n\t\"a\":[ 1 , 2.50 ], \"u\":\"\\u00e9é🙂\"}  "),
		Status:         wire.ExecRunning,
		Output:         []byte("\n\"ok\"\t"),
		State:          []byte(`{ "k" :  "v" , "n":null }`),
		FailureReason:  "failure reason kept verbatim",
		CreatedAt:      base,
		UpdatedAt:      at(1500 * time.Microsecond),
		DeadlineAt:     at(time.Hour + 7*time.Microsecond),
		ParentID:       "parent-" + id,
		IdempotencyKey: "idem-" + id,
		OnBehalfOf:     "user:42",
		ForkedFrom:     "source-" + id,
		ForkSeq:        17,
		Restoration:    []byte(`{"steps" : [ ] ,"x":1}`),
		ResourceKeys:   []string{"zeta", "alpha", "mid"},
		Writing:        []string{"step-b", "step-a"},
		DispatchID:     "dispatch-" + id,
		LastSeq:        9,
		StepOrder:      4,
		StepCount:      3,
		ByteCount:      12345,
	}
}

// minimalExecution sets only what every execution has.
func minimalExecution(id, agentID, status string) *store.Execution {
	return &store.Execution{ID: id, AgentID: agentID, Input: []byte("null"), Status: status, CreatedAt: base, UpdatedAt: base}
}

// events makes events from..to of an execution.
func events(executionID string, from, to int64) []*store.Event {
	var out []*store.Event
	for seq := from; seq <= to; seq++ {
		typ := wire.EventStepProposed
		if seq%2 == 0 {
			typ = wire.EventStepSucceeded
		}
		out = append(out, &store.Event{
			ExecutionID: executionID,
			Seq:         seq,
			Type:        typ,
			Payload:     fmt.Appendf(nil, " { \"execution\" : %q,\n \"seq\":%d }\n", executionID, seq),
			OccurredAt:  at(time.Duration(seq)*time.Millisecond + time.Duration(seq)*time.Microsecond),
		})
	}
	return out
}

func fullStep(executionID, stepID string) *store.Step {
	return &store.Step{
		ExecutionID: executionID,
		StepID:      stepID,
		Order:       7,
		Kind:        wire.KindToolCall,
		Target:      "web.search",
		ArgsHash:    "sha256:0123abcd",
		Occurrence:  2,
		Status:      wire.StepFailed,
		Idempotency: wire.AtMostOnce,
		Args:        []byte(" { \"q\" : \"rebuno\" ,\n\"n\":[1, 2] } "),
		Result:      []byte(`  {"hits":  3}`),
		Error:       []byte(`{"reason" : "timeout", "message":"slow"}`),
		ErrorReason: wire.ReasonTimeout,
		Resources:   []string{"res-b", "res-a"},
		StartedAt:   at(2 * time.Second),
		CompletedAt: at(3*time.Second + 11*time.Microsecond),
		DispatchID:  "dispatch-" + executionID,
		Attempt:     3,
		TerminalSeq: 41,
	}
}

// simpleStep is a step whose identity is (tool_call, "tool", "h-"+stepID).
func simpleStep(executionID, stepID string, order int64, status string) *store.Step {
	return &store.Step{
		ExecutionID: executionID, StepID: stepID, Order: order, Kind: wire.KindToolCall, Target: "tool",
		ArgsHash: "h-" + stepID, Occurrence: 1, Status: status, Idempotency: wire.SafeToRetry, Args: []byte(`{}`),
	}
}

func fullDispatch(id, executionID string) *store.Dispatch {
	return &store.Dispatch{
		ID: id, ExecutionID: executionID, Status: wire.DispatchInFlight, Attempt: 2, MaxAttempts: 5,
		ProgressAttempt: 1, LeaseTimeout: 120, NextAttemptAt: at(10 * time.Second),
		LeaseExpiresAt: at(130*time.Second + 3*time.Microsecond), ClaimedBy: "replica-1",
		CreatedAt: at(time.Second), UpdatedAt: at(9 * time.Second),
	}
}

func simpleDispatch(id, executionID, status string, next, lease time.Time) *store.Dispatch {
	return &store.Dispatch{
		ID: id, ExecutionID: executionID, Status: status, MaxAttempts: 5, LeaseTimeout: 60,
		NextAttemptAt: next, LeaseExpiresAt: lease, CreatedAt: base, UpdatedAt: base,
	}
}

func fullAgent(id string) *store.Agent {
	return &store.Agent{
		ID: id, WebhookURL: "http://127.0.0.1:9/hook?x=1", Secret: "s3cr3t-" + id,
		PolicyBundle: "rules:\n  - allow: \"*\"\n", LeaseTimeoutSeconds: 45, Description: "Résumé agent",
		InputSchema: []byte(`{"type" : "object"}`), OutputSchema: []byte(`{ "type":"string" }`),
		RegisteredAt: at(time.Second), UpdatedAt: at(2 * time.Second),
	}
}

// ---- executions ----

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

// ---- events ----

func testEvents(t *testing.T, s store.Store) {
	ctx := t.Context()
	a, b := minimalExecution("exec-a", "agent", wire.ExecRunning), minimalExecution("exec-b", "agent", wire.ExecRunning)
	write(t, s, a, b, events("exec-a", 1, 3), events("exec-b", 1, 2))
	// A second batch in its own transaction, and an empty batch.
	update(t, s, "exec-a", func(ctx context.Context, tx store.Tx) error {
		if err := tx.AppendEvents(ctx, nil); err != nil {
			return err
		}
		return tx.AppendEvents(ctx, events("exec-a", 4, 7))
	})

	all := events("exec-a", 1, 7)
	sameList(t, "Events after 0", val(s.Read().Events(ctx, "exec-a", 0, 100)).get(t, "Events"), all)
	sameList(t, "Events after 2 limit 3", val(s.Read().Events(ctx, "exec-a", 2, 3)).get(t, "Events"), all[2:5])
	sameList(t, "Events after 6", val(s.Read().Events(ctx, "exec-a", 6, 100)).get(t, "Events"), all[6:])
	sameList(t, "Events after the last", val(s.Read().Events(ctx, "exec-a", 7, 100)).get(t, "Events"), []*store.Event{})
	sameList(t, "Events of the other execution", val(s.Read().Events(ctx, "exec-b", 0, 100)).get(t, "Events"), events("exec-b", 1, 2))
	sameList(t, "Events of an unknown execution", val(s.Read().Events(ctx, "exec-none", 0, 100)).get(t, "Events"), []*store.Event{})

	// Paging by after_seq visits every event once.
	var seqs []int64
	var after int64
	for range 10 {
		page := val(s.Read().Events(ctx, "exec-a", after, 2)).get(t, "Events")
		seqs = append(seqs, eventSeqs(page)...)
		if len(page) < 2 {
			break
		}
		after = page[len(page)-1].Seq
	}
	if !slices.Equal(seqs, []int64{1, 2, 3, 4, 5, 6, 7}) {
		t.Errorf("paged event seqs: got %v, want 1..7", seqs)
	}

	// One call may append more events than a single SQL statement can bind
	// (a terminate that cancels thousands of open steps).
	const many = 7000
	write(t, s, minimalExecution("exec-many", "agent", wire.ExecRunning), events("exec-many", 1, many))
	got := val(s.Read().Events(ctx, "exec-many", 0, big)).get(t, "Events")
	if len(got) != many || got[0].Seq != 1 || got[many-1].Seq != many {
		t.Errorf("Events after appending %d at once: got %d", many, len(got))
	} else {
		same(t, "event 5000 of a large append", got[4999], events("exec-many", 5000, 5000)[0])
	}

	// A sequence number is never stored twice.
	err := s.Update(ctx, "exec-a", func(ctx context.Context, tx store.Tx) error {
		return tx.AppendEvents(ctx, events("exec-a", 7, 8))
	})
	if err == nil {
		t.Error("appending an event with an existing seq succeeded")
	}
	sameList(t, "Events after a refused duplicate", val(s.Read().Events(ctx, "exec-a", 0, 100)).get(t, "Events"), all)
}

// testEventRuns mixes the ways a store may keep a log (the SQL stores keep
// one execution's append in runs of events, and any other append a row per
// event): the same events come back, in seq order, paged across every
// boundary between them.
func testEventRuns(t *testing.T, s store.Store) {
	ctx := t.Context()
	const id, other = "exec-runs", "exec-runs-other"
	write(t, s, minimalExecution(id, "agent", wire.ExecRunning), minimalExecution(other, "agent", wire.ExecRunning))
	mixed := func(evs ...[]*store.Event) []*store.Event { return slices.Concat(evs...) }
	update(t, s, id, func(ctx context.Context, tx store.Tx) error {
		return tx.AppendEvents(ctx, mixed(events(id, 1, 3), events(other, 1, 1)))
	})
	update(t, s, id, func(ctx context.Context, tx store.Tx) error { return tx.AppendEvents(ctx, events(id, 4, 600)) })
	update(t, s, id, func(ctx context.Context, tx store.Tx) error {
		return tx.AppendEvents(ctx, mixed(events(other, 2, 2), events(id, 601, 603)))
	})
	all := events(id, 1, 603)
	r := s.Read()
	sameList(t, "Events of rows and a large append", val(r.Events(ctx, id, 0, big)).get(t, "Events"), all)
	for _, c := range []struct{ after, limit int64 }{
		{0, 1}, {2, 5}, {3, 1}, {100, 3}, {255, 10}, {259, 300}, {590, 20}, {599, 2}, {600, 10}, {602, 5}, {603, 5},
	} {
		want := all[c.after:min(c.after+c.limit, int64(len(all)))]
		sameList(t, fmt.Sprintf("Events after %d limit %d", c.after, c.limit),
			val(r.Events(ctx, id, c.after, int(c.limit))).get(t, "Events"), want)
	}
	var seqs []int64
	for after := int64(0); ; {
		page := val(r.Events(ctx, id, after, 7)).get(t, "Events")
		seqs = append(seqs, eventSeqs(page)...)
		if len(page) < 7 {
			break
		}
		after = page[len(page)-1].Seq
	}
	if len(seqs) != len(all) || seqs[0] != 1 || seqs[len(seqs)-1] != 603 || !slices.IsSorted(seqs) {
		t.Errorf("paging by 7 visited %d events", len(seqs))
	}

	// No seq is stored twice, whichever way it was stored.
	for _, c := range []struct {
		what   string
		events []*store.Event
	}{
		{"a row inside a large append", events(id, 100, 100)},
		{"a large append over rows", events(id, 603, 700)},
		{"a large append over a large append", events(id, 500, 700)},
		{"an event of two executions' append inside a large append", mixed(events(other, 3, 3), events(id, 200, 200))},
		{"a small append inside a large append", events(id, 300, 301)},
	} {
		err := s.Update(ctx, id, func(ctx context.Context, tx store.Tx) error { return tx.AppendEvents(ctx, c.events) })
		if err == nil {
			t.Errorf("%s succeeded", c.what)
		}
	}
	sameList(t, "Events after refused duplicates", val(r.Events(ctx, id, 0, big)).get(t, "Events"), all)
	sameList(t, "Events of the other execution after a refused append", val(r.Events(ctx, other, 0, big)).get(t, "Events"),
		events(other, 1, 2))

	update(t, s, id, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, id) })
	sameList(t, "Events of a deleted execution", val(r.Events(ctx, id, 0, big)).get(t, "Events"), []*store.Event{})
}

// ---- steps ----

func testStepRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	full := fullStep("exec-s", "step-full")
	bare := simpleStep("exec-s", "step-bare", 8, wire.StepProposed)
	write(t, s, minimalExecution("exec-s", "agent", wire.ExecRunning), full, bare)
	same(t, "full step", val(s.Read().Step(ctx, "exec-s", full.StepID)).get(t, "Step"), full)
	got := val(s.Read().Step(ctx, "exec-s", bare.StepID)).get(t, "Step")
	same(t, "bare step", got, bare)
	if got.Result != nil || got.Error != nil || len(got.Resources) != 0 || !got.StartedAt.IsZero() || !got.CompletedAt.IsZero() {
		t.Errorf("bare step: got result %q, error %q, resources %q, started %v, completed %v; want none",
			got.Result, got.Error, got.Resources, got.StartedAt, got.CompletedAt)
	}

	_, err := s.Read().Step(ctx, "exec-s", "step-missing")
	wantNotFound(t, "Step of an unknown id", err)
	_, err = s.Read().Step(ctx, "exec-other", full.StepID)
	wantNotFound(t, "Step of another execution", err)

	// UpdateStep writes the fields that change as a step runs.
	want := *bare
	want.Status = wire.StepSucceeded
	want.Idempotency = wire.AtMostOnce
	want.Result = []byte(" {\"ok\" : true}\n")
	want.Error = []byte(`{"reason":"indeterminate"}`)
	want.ErrorReason = wire.ReasonIndeterminate
	want.StartedAt = at(4 * time.Second)
	want.CompletedAt = at(5*time.Second + time.Microsecond)
	want.DispatchID = "dispatch-9"
	want.Attempt = 4
	want.TerminalSeq = 77
	update(t, s, "exec-s", func(ctx context.Context, tx store.Tx) error { return tx.UpdateStep(ctx, &want) })
	same(t, "updated step", val(s.Read().Step(ctx, "exec-s", bare.StepID)).get(t, "Step"), &want)

	// The identity, order and arguments stay as recorded.
	changed := want
	changed.Order = 99
	changed.Kind = wire.KindLLMCall
	changed.Target = "other"
	changed.ArgsHash = "other"
	changed.Occurrence = 5
	changed.Args = []byte(`[]`)
	update(t, s, "exec-s", func(ctx context.Context, tx store.Tx) error { return tx.UpdateStep(ctx, &changed) })
	same(t, "step after an update carrying another identity", val(s.Read().Step(ctx, "exec-s", bare.StepID)).get(t, "Step"), &want)
	same(t, "the other step", val(s.Read().Step(ctx, "exec-s", full.StepID)).get(t, "Step"), full)

	err = s.Update(ctx, "exec-s", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertStep(ctx, simpleStep("exec-s", "step-full", 9, wire.StepProposed))
	})
	if err == nil {
		t.Error("inserting a step with an existing id succeeded")
	}
	same(t, "step after a refused duplicate", val(s.Read().Step(ctx, "exec-s", full.StepID)).get(t, "Step"), full)
}

// stepsFixture records steps out of order, with ids that do not sort like
// their recording order.
func stepsFixture() []*store.Step {
	return []*store.Step{
		simpleStep("exec-x", "s-f", 3, wire.StepExecuting),
		simpleStep("exec-x", "s-a", 6, wire.StepAllowed),
		simpleStep("exec-x", "s-z", 1, wire.StepSucceeded),
		simpleStep("exec-x", "s-m", 5, wire.StepFailed),
		simpleStep("exec-x", "s-b", 2, wire.StepAllowed),
		simpleStep("exec-x", "s-q", 4, wire.StepAwaitingApproval),
		simpleStep("exec-x", "s-c", 7, wire.StepProposed),
		simpleStep("exec-y", "s-y1", 1, wire.StepAllowed),
		simpleStep("exec-y", "s-y2", 2, wire.StepExecuting),
	}
}

func testStepsListing(t *testing.T, s store.Store) {
	ctx := t.Context()
	write(t, s, minimalExecution("exec-x", "agent", wire.ExecRunning), minimalExecution("exec-y", "agent", wire.ExecRunning), stepsFixture())

	steps := func(statuses []string, after int64, limit int) []string {
		t.Helper()
		return stepIDs(val(s.Read().Steps(ctx, "exec-x", statuses, after, limit)).get(t, "Steps"))
	}
	sameStrings(t, "Steps all", steps(nil, 0, 100), []string{"s-z", "s-b", "s-f", "s-q", "s-m", "s-a", "s-c"})
	sameStrings(t, "Steps empty filter", steps([]string{}, 0, 100), []string{"s-z", "s-b", "s-f", "s-q", "s-m", "s-a", "s-c"})
	sameStrings(t, "Steps after 2 limit 3", steps(nil, 2, 3), []string{"s-f", "s-q", "s-m"})
	sameStrings(t, "Steps after the last", steps(nil, 7, 100), []string{})
	sameStrings(t, "Steps one status", steps([]string{wire.StepAllowed}, 0, 100), []string{"s-b", "s-a"})
	sameStrings(t, "Steps terminal statuses", steps([]string{wire.StepSucceeded, wire.StepFailed, wire.StepDenied, wire.StepCancelled}, 0, 100), []string{"s-z", "s-m"})
	sameStrings(t, "Steps statuses after 2 limit 2", steps([]string{wire.StepAllowed, wire.StepExecuting, wire.StepProposed}, 2, 2), []string{"s-f", "s-a"})
	sameStrings(t, "Steps unmatched status", steps([]string{wire.StepDenied}, 0, 100), []string{})

	var paged []string
	var after int64
	for range 10 {
		page := val(s.Read().Steps(ctx, "exec-x", nil, after, 3)).get(t, "Steps")
		paged = append(paged, stepIDs(page)...)
		if len(page) < 3 {
			break
		}
		after = page[len(page)-1].Order
	}
	sameStrings(t, "paged Steps", paged, []string{"s-z", "s-b", "s-f", "s-q", "s-m", "s-a", "s-c"})

	got := val(s.Read().Steps(ctx, "exec-y", nil, 0, 100)).get(t, "Steps")
	sameList(t, "Steps of the other execution", got, stepsFixture()[7:])
}

func testOpenSteps(t *testing.T, s store.Store) {
	ctx := t.Context()
	write(t, s, minimalExecution("exec-x", "agent", wire.ExecRunning), minimalExecution("exec-y", "agent", wire.ExecRunning), stepsFixture())
	open := func(id string) []string {
		t.Helper()
		return stepIDs(val(s.Read().OpenSteps(ctx, id)).get(t, "OpenSteps"))
	}
	sameStrings(t, "OpenSteps", open("exec-x"), []string{"s-b", "s-f", "s-a"})
	sameStrings(t, "OpenSteps of the other execution", open("exec-y"), []string{"s-y1", "s-y2"})
	sameStrings(t, "OpenSteps of an unknown execution", open("exec-none"), []string{})

	// Steps leave and enter the open set as their status changes.
	var inTx []string
	update(t, s, "exec-x", func(ctx context.Context, tx store.Tx) error {
		for _, st := range stepsFixture() {
			switch st.StepID {
			case "s-f":
				st.Status = wire.StepSucceeded
			case "s-c":
				st.Status = wire.StepAllowed
			default:
				continue
			}
			if err := tx.UpdateStep(ctx, st); err != nil {
				return err
			}
		}
		open, err := tx.OpenSteps(ctx, "exec-x")
		inTx = stepIDs(open)
		return err
	})
	sameStrings(t, "OpenSteps inside the transaction that changed them", inTx, []string{"s-b", "s-a", "s-c"})
	sameStrings(t, "OpenSteps after status changes", open("exec-x"), []string{"s-b", "s-a", "s-c"})
	got := val(s.Read().OpenSteps(ctx, "exec-y")).get(t, "OpenSteps")
	sameList(t, "open steps come back whole", got, stepsFixture()[7:])
}

func testMaxOccurrence(t *testing.T, s store.Store) {
	ctx := t.Context()
	occ := func(exec, stepID string, kind, target, hash string, n int64) *store.Step {
		st := simpleStep(exec, stepID, n, wire.StepSucceeded)
		st.Kind, st.Target, st.ArgsHash, st.Occurrence = kind, target, hash, n
		st.Order = int64(len(stepID)) * 10 * n
		return st
	}
	write(t, s, minimalExecution("exec-a", "agent", wire.ExecRunning), minimalExecution("exec-b", "agent", wire.ExecRunning),
		occ("exec-a", "a1", wire.KindToolCall, "search", "h1", 1),
		occ("exec-a", "a3", wire.KindToolCall, "search", "h1", 3),
		occ("exec-a", "a2", wire.KindToolCall, "search", "h1", 2),
		occ("exec-a", "other-hash", wire.KindToolCall, "search", "h2", 1),
		occ("exec-a", "other-kind", wire.KindLLMCall, "search", "h1", 6),
		occ("exec-b", "b9", wire.KindToolCall, "search", "h1", 9),
	)
	cases := []struct {
		exec, kind, target, hash string
		want                     int64
		found                    bool
	}{
		{"exec-a", wire.KindToolCall, "search", "h1", 3, true},
		{"exec-a", wire.KindToolCall, "search", "h2", 1, true},
		{"exec-a", wire.KindLLMCall, "search", "h1", 6, true},
		{"exec-b", wire.KindToolCall, "search", "h1", 9, true},
		{"exec-a", wire.KindToolCall, "search", "h3", 0, false},
		{"exec-a", wire.KindToolCall, "fetch", "h1", 0, false},
		{"exec-b", wire.KindToolCall, "search", "h2", 0, false},
		{"exec-none", wire.KindToolCall, "search", "h1", 0, false},
	}
	for _, c := range cases {
		got, found, err := s.Read().MaxOccurrence(ctx, c.exec, c.kind, c.target, c.hash)
		if err != nil {
			t.Fatalf("MaxOccurrence: %v", err)
		}
		if got != c.want || found != c.found {
			t.Errorf("MaxOccurrence(%s, %s, %s, %s): got (%d, %v), want (%d, %v)", c.exec, c.kind, c.target, c.hash, got, found, c.want, c.found)
		}
	}
}

func testHasIndeterminate(t *testing.T, s store.Store) {
	ctx := t.Context()
	mk := func(exec, id, hash, status, reason string) *store.Step {
		st := simpleStep(exec, id, int64(id[len(id)-1]-'0'), status)
		st.ArgsHash, st.ErrorReason = hash, reason
		if reason != "" {
			st.Error = fmt.Appendf(nil, `{"reason":%q}`, reason)
		}
		return st
	}
	write(t, s, minimalExecution("exec-a", "agent", wire.ExecRunning), minimalExecution("exec-b", "agent", wire.ExecRunning),
		mk("exec-a", "s1", "h-indet", wire.StepSucceeded, ""),
		mk("exec-a", "s2", "h-indet", wire.StepFailed, wire.ReasonIndeterminate),
		mk("exec-a", "s3", "h-timeout", wire.StepFailed, wire.ReasonTimeout),
		mk("exec-a", "s4", "h-cancelled", wire.StepCancelled, wire.ReasonIndeterminate),
		mk("exec-a", "s5", "h-denied", wire.StepDenied, wire.ReasonIndeterminate),
		mk("exec-a", "s6", "h-ok", wire.StepSucceeded, ""),
		mk("exec-b", "s7", "h-b", wire.StepFailed, wire.ReasonIndeterminate),
	)
	cases := []struct {
		exec, kind, target, hash string
		want                     bool
	}{
		{"exec-a", wire.KindToolCall, "tool", "h-indet", true},
		{"exec-a", wire.KindToolCall, "tool", "h-timeout", false},
		{"exec-a", wire.KindToolCall, "tool", "h-cancelled", false},
		{"exec-a", wire.KindToolCall, "tool", "h-denied", false},
		{"exec-a", wire.KindToolCall, "tool", "h-ok", false},
		{"exec-a", wire.KindToolCall, "tool", "h-b", false},
		{"exec-a", wire.KindLLMCall, "tool", "h-indet", false},
		{"exec-a", wire.KindToolCall, "other", "h-indet", false},
		{"exec-b", wire.KindToolCall, "tool", "h-indet", false},
		{"exec-b", wire.KindToolCall, "tool", "h-b", true},
	}
	for _, c := range cases {
		got, err := s.Read().HasIndeterminate(ctx, c.exec, c.kind, c.target, c.hash)
		if err != nil {
			t.Fatalf("HasIndeterminate: %v", err)
		}
		if got != c.want {
			t.Errorf("HasIndeterminate(%s, %s, %s, %s): got %v, want %v", c.exec, c.kind, c.target, c.hash, got, c.want)
		}
	}

	// A later failure of the identity with reason indeterminate shows at once.
	update(t, s, "exec-a", func(ctx context.Context, tx store.Tx) error {
		st := mk("exec-a", "s3", "h-timeout", wire.StepFailed, wire.ReasonIndeterminate)
		return tx.UpdateStep(ctx, st)
	})
	if got := val(s.Read().HasIndeterminate(ctx, "exec-a", wire.KindToolCall, "tool", "h-timeout")).get(t, "HasIndeterminate"); !got {
		t.Error("HasIndeterminate after the step's reason became indeterminate: got false")
	}
}

// ---- dispatches ----

func testDispatchRoundTrip(t *testing.T, s store.Store) {
	ctx := t.Context()
	full := fullDispatch("disp-1", "exec-d")
	fresh := simpleDispatch("disp-2", "exec-d", wire.DispatchPending, at(time.Second), time.Time{})
	write(t, s, minimalExecution("exec-d", "agent", wire.ExecRunning), full, fresh)
	same(t, "full dispatch", val(s.Read().Dispatch(ctx, full.ID)).get(t, "Dispatch"), full)
	got := val(s.Read().Dispatch(ctx, fresh.ID)).get(t, "Dispatch")
	same(t, "fresh dispatch", got, fresh)
	if !got.LeaseExpiresAt.IsZero() {
		t.Errorf("lease of an unclaimed dispatch: got %v, want zero", got.LeaseExpiresAt)
	}
	_, err := s.Read().Dispatch(ctx, "disp-missing")
	wantNotFound(t, "Dispatch of an unknown id", err)

	want := *fresh
	want.Status = wire.DispatchInFlight
	want.Attempt = 1
	want.ProgressAttempt = 1
	want.LeaseTimeout = 300
	want.NextAttemptAt = at(20 * time.Second)
	want.LeaseExpiresAt = at(320*time.Second + 9*time.Microsecond)
	want.ClaimedBy = "replica-2"
	want.UpdatedAt = at(20*time.Second + time.Microsecond)
	update(t, s, "exec-d", func(ctx context.Context, tx store.Tx) error { return tx.UpdateDispatch(ctx, &want) })
	same(t, "updated dispatch", val(s.Read().Dispatch(ctx, fresh.ID)).get(t, "Dispatch"), &want)

	// What is fixed at enqueue stays.
	changed := want
	changed.ExecutionID = "exec-other"
	changed.MaxAttempts = 1
	changed.CreatedAt = at(time.Hour)
	update(t, s, "exec-d", func(ctx context.Context, tx store.Tx) error { return tx.UpdateDispatch(ctx, &changed) })
	same(t, "dispatch after an update carrying other fixed fields", val(s.Read().Dispatch(ctx, fresh.ID)).get(t, "Dispatch"), &want)
	same(t, "the other dispatch", val(s.Read().Dispatch(ctx, full.ID)).get(t, "Dispatch"), full)

	err = s.Update(ctx, "exec-d", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertDispatch(ctx, fullDispatch("disp-1", "exec-d"))
	})
	if err == nil {
		t.Error("inserting a dispatch with an existing id succeeded")
	}
}

func testRetireDispatches(t *testing.T, s store.Store) {
	ctx := t.Context()
	old := at(-time.Hour)
	mk := func(id, exec, status string) *store.Dispatch {
		d := simpleDispatch(id, exec, status, at(time.Second), at(time.Minute))
		d.UpdatedAt = old
		return d
	}
	ds := []*store.Dispatch{
		mk("d1", "exec-r", wire.DispatchPending),
		mk("d2", "exec-r", wire.DispatchInFlight),
		mk("d3", "exec-r", wire.DispatchFailed),
		mk("d4", "exec-r", wire.DispatchRetired),
		mk("d5", "exec-r", wire.DispatchPending),
		mk("d6", "exec-o", wire.DispatchPending),
	}
	rows := []any{minimalExecution("exec-r", "agent", wire.ExecRunning), minimalExecution("exec-o", "agent", wire.ExecRunning)}
	for _, d := range ds {
		rows = append(rows, d)
	}
	write(t, s, rows...)
	now := at(time.Hour + 3*time.Microsecond)
	update(t, s, "exec-r", func(ctx context.Context, tx store.Tx) error { return tx.RetireDispatches(ctx, "exec-r", "d5", now) })

	for _, d := range ds {
		want := *d
		switch d.ID {
		case "d1", "d2", "d3":
			want.Status, want.UpdatedAt = wire.DispatchRetired, now
		}
		same(t, "dispatch "+d.ID+" after RetireDispatches", val(s.Read().Dispatch(ctx, d.ID)).get(t, "Dispatch"), &want)
	}

	// With no dispatch to keep, every one is retired.
	update(t, s, "exec-r", func(ctx context.Context, tx store.Tx) error { return tx.RetireDispatches(ctx, "exec-r", "", now) })
	if got := val(s.Read().Dispatch(ctx, "d5")).get(t, "Dispatch"); got.Status != wire.DispatchRetired || !got.UpdatedAt.Equal(now) {
		t.Errorf("kept dispatch after retiring all: got status %s updated %v, want retired at %v", got.Status, got.UpdatedAt, now)
	}
	if got := val(s.Read().Dispatch(ctx, "d6")).get(t, "Dispatch"); got.Status != wire.DispatchPending {
		t.Errorf("other execution's dispatch: got status %s, want pending", got.Status)
	}
}

func testDispatchScheduling(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := at(100 * time.Second)
	sec := func(n int) time.Time { return now.Add(time.Duration(n) * time.Second) }
	ds := []*store.Dispatch{
		simpleDispatch("dA", "exec-1", wire.DispatchPending, sec(-30), time.Time{}),
		simpleDispatch("dB", "exec-2", wire.DispatchFailed, sec(-10), sec(-40)),
		simpleDispatch("dC", "exec-3", wire.DispatchPending, now, time.Time{}),
		simpleDispatch("dD", "exec-4", wire.DispatchPending, now.Add(time.Microsecond), time.Time{}),
		simpleDispatch("dE", "exec-5", wire.DispatchInFlight, sec(-50), sec(60)),
		simpleDispatch("dF", "exec-6", wire.DispatchRetired, sec(-60), sec(-70)),
		simpleDispatch("dG", "exec-7", wire.DispatchFailed, sec(-20), time.Time{}),
		simpleDispatch("dH", "exec-8", wire.DispatchInFlight, sec(-45), sec(-5)),
		simpleDispatch("dI", "exec-9", wire.DispatchInFlight, sec(-44), now),
		simpleDispatch("dJ", "exec-10", wire.DispatchPending, sec(500), sec(-100)),
	}
	// Each dispatch's execution belongs to an agent: DueDispatches names it
	// and can leave out the dispatches of agents the dispatcher is full for.
	agentOf := map[string]string{"exec-1": "alpha", "exec-2": "beta", "exec-3": "alpha", "exec-7": "gamma"}
	var rows []any
	for _, d := range ds {
		agent := agentOf[d.ExecutionID]
		if agent == "" {
			agent = "other"
		}
		rows = append(rows, minimalExecution(d.ExecutionID, agent, wire.ExecRunning), d)
	}
	write(t, s, rows...)
	r := s.Read()

	due := val(r.DueDispatches(ctx, now, 100, nil)).get(t, "DueDispatches")
	sameStrings(t, "DueDispatches", refIDs(due), []string{"dA", "dG", "dB", "dC"})
	wantExec := map[string]string{}
	for _, d := range ds {
		wantExec[d.ID] = d.ExecutionID
	}
	for _, ref := range due {
		if ref.ExecutionID != wantExec[ref.ID] || ref.AgentID != agentOf[ref.ExecutionID] {
			t.Errorf("DueDispatches: %s has execution %q of agent %q, want %q of %q", ref.ID, ref.ExecutionID, ref.AgentID,
				wantExec[ref.ID], agentOf[wantExec[ref.ID]])
		}
	}
	sameStrings(t, "DueDispatches limit 2", refIDs(val(r.DueDispatches(ctx, now, 2, nil)).get(t, "DueDispatches")), []string{"dA", "dG"})
	sameStrings(t, "DueDispatches earlier", refIDs(val(r.DueDispatches(ctx, sec(-25), 100, nil)).get(t, "DueDispatches")), []string{"dA"})
	sameStrings(t, "DueDispatches before everything", refIDs(val(r.DueDispatches(ctx, sec(-1000), 100, nil)).get(t, "DueDispatches")), []string{})
	sameStrings(t, "DueDispatches skipping alpha", refIDs(val(r.DueDispatches(ctx, now, 100, []string{"alpha"})).get(t, "DueDispatches")),
		[]string{"dG", "dB"})
	sameStrings(t, "DueDispatches skipping alpha and gamma, limit 1",
		refIDs(val(r.DueDispatches(ctx, now, 1, []string{"alpha", "gamma"})).get(t, "DueDispatches")), []string{"dB"})
	sameStrings(t, "DueDispatches skipping every agent",
		refIDs(val(r.DueDispatches(ctx, now, 100, []string{"alpha", "beta", "gamma"})).get(t, "DueDispatches")), []string{})

	expired := val(r.ExpiredLeases(ctx, now, 100)).get(t, "ExpiredLeases")
	sameStrings(t, "ExpiredLeases", refIDs(expired), []string{"dH", "dI"})
	for _, ref := range expired {
		if ref.ExecutionID != wantExec[ref.ID] {
			t.Errorf("ExpiredLeases: %s has execution %q, want %q", ref.ID, ref.ExecutionID, wantExec[ref.ID])
		}
	}
	sameStrings(t, "ExpiredLeases limit 1", refIDs(val(r.ExpiredLeases(ctx, now, 1)).get(t, "ExpiredLeases")), []string{"dH"})
	sameStrings(t, "ExpiredLeases later", refIDs(val(r.ExpiredLeases(ctx, sec(60), 100)).get(t, "ExpiredLeases")), []string{"dH", "dI", "dE"})

	if got := val(r.QueueDepth(ctx, now)).get(t, "QueueDepth"); got != 4 {
		t.Errorf("QueueDepth(now): got %d, want 4", got)
	}
	if got := val(r.QueueDepth(ctx, sec(-25))).get(t, "QueueDepth"); got != 1 {
		t.Errorf("QueueDepth(now-25s): got %d, want 1", got)
	}
	if got := val(r.QueueDepth(ctx, sec(1000))).get(t, "QueueDepth"); got != 6 {
		t.Errorf("QueueDepth(now+1000s): got %d, want 6", got)
	}
	// Pending and failed dispatches are due by next_attempt_at, in-flight ones
	// expire by lease_expires_at; retired ones do neither.
	if got := val(r.NextDue(ctx, nil)).get(t, "NextDue"); !got.Equal(sec(-30)) {
		t.Errorf("NextDue: got %v, want %v", got, sec(-30))
	}
	if got := val(r.NextDue(ctx, []string{"alpha"})).get(t, "NextDue"); !got.Equal(sec(-20)) {
		t.Errorf("NextDue skipping alpha: got %v, want %v", got, sec(-20))
	}
	if got := val(r.NextDue(ctx, []string{"alpha", "beta", "gamma"})).get(t, "NextDue"); !got.Equal(now.Add(time.Microsecond)) {
		t.Errorf("NextDue skipping alpha, beta and gamma: got %v, want %v", got, now.Add(time.Microsecond))
	}
	if got := val(r.NextDue(ctx, []string{"alpha", "beta", "gamma", "other"})).get(t, "NextDue"); !got.IsZero() {
		t.Errorf("NextDue skipping every agent: got %v, want zero", got)
	}
	if got := val(r.NextLeaseExpiry(ctx)).get(t, "NextLeaseExpiry"); !got.Equal(sec(-5)) {
		t.Errorf("NextLeaseExpiry: got %v, want %v", got, sec(-5))
	}
}

func testNextWake(t *testing.T, s store.Store) {
	ctx := t.Context()
	check := func(what string, wantDue, wantLease time.Time) {
		t.Helper()
		if got := val(s.Read().NextDue(ctx, nil)).get(t, "NextDue"); !got.Equal(wantDue) {
			t.Errorf("NextDue %s: got %v, want %v", what, got, wantDue)
		}
		if got := val(s.Read().NextLeaseExpiry(ctx)).get(t, "NextLeaseExpiry"); !got.Equal(wantLease) {
			t.Errorf("NextLeaseExpiry %s: got %v, want %v", what, got, wantLease)
		}
	}
	check("of an empty store", time.Time{}, time.Time{})
	for i := 1; i <= 4; i++ {
		write(t, s, minimalExecution(fmt.Sprintf("exec-%d", i), "agent", wire.ExecRunning))
	}
	write(t, s, simpleDispatch("retired", "exec-1", wire.DispatchRetired, at(time.Second), at(time.Second)))
	check("with only a retired dispatch", time.Time{}, time.Time{})
	write(t, s, simpleDispatch("flying", "exec-2", wire.DispatchInFlight, at(-time.Hour), at(60*time.Second)))
	check("with one lease", time.Time{}, at(60*time.Second))
	write(t, s, simpleDispatch("pending", "exec-3", wire.DispatchPending, at(90*time.Second), at(time.Second)))
	check("with a pending dispatch", at(90*time.Second), at(60*time.Second))
	write(t, s, simpleDispatch("failed", "exec-4", wire.DispatchFailed, at(30*time.Second+time.Microsecond), time.Time{}))
	check("with an earlier failed dispatch", at(30*time.Second+time.Microsecond), at(60*time.Second))
}

// ---- counters ----

func testCounters(t *testing.T, s store.Store) {
	ctx := t.Context()
	counter := func(k counterKey) (int64, bool) {
		t.Helper()
		v, found, err := s.Read().Counter(ctx, k.ExecutionID, k.DispatchID, k.Kind, k.Target, k.ArgsHash)
		if err != nil {
			t.Fatalf("Counter: %v", err)
		}
		return v, found
	}
	if v, found := counter(counterKey{"exec-a", "d1", wire.KindToolCall, "t", "h"}); v != 0 || found {
		t.Errorf("Counter of nothing: got (%d, %v), want (0, false)", v, found)
	}
	rows := []counterRow{
		{"exec-a", "d1", wire.KindToolCall, "t", "h", 2},
		{"exec-a", "d1", wire.KindToolCall, "t", "h2", 5},
		{"exec-a", "d1", wire.KindLLMCall, "t", "h", 7},
		{"exec-a", "d2", wire.KindToolCall, "t", "h", 11},
		{"exec-b", "d3", wire.KindToolCall, "t", "h", 13},
		// The same dispatch and identity under another execution is another
		// counter (dispatch ids are unique in practice; the key does not rely
		// on it).
		{"exec-b", "d1", wire.KindToolCall, "t", "h", 17},
	}
	var anyRows []any
	for _, r := range rows {
		anyRows = append(anyRows, r)
	}
	write(t, s, anyRows...)
	check := func(what string, want map[counterKey]int64) {
		t.Helper()
		for _, r := range rows {
			v, found := counter(r.key())
			w, ok := want[r.key()]
			if v != w || found != ok {
				t.Errorf("%s: Counter%v got (%d, %v), want (%d, %v)", what, r.key(), v, found, w, ok)
			}
		}
	}
	initial := map[counterKey]int64{}
	for _, r := range rows {
		initial[r.key()] = r.Consumed
	}
	check("after RaiseCounter", initial)

	// RaiseCounter raises the value of an existing key, and never lowers it.
	write(t, s, counterRow{"exec-a", "d1", wire.KindToolCall, "t", "h", 3})
	initial[rows[0].key()] = 3
	check("after a higher RaiseCounter", initial)
	write(t, s, counterRow{"exec-a", "d1", wire.KindToolCall, "t", "h", 1}, counterRow{"exec-a", "d1", wire.KindToolCall, "t", "h2", 5})
	check("after a lower and an equal RaiseCounter", initial)

	update(t, s, "exec-a", func(ctx context.Context, tx store.Tx) error { return tx.DeleteDispatchCounters(ctx, "exec-a", "d1") })
	check("after DeleteDispatchCounters(exec-a, d1)",
		map[counterKey]int64{rows[3].key(): 11, rows[4].key(): 13, rows[5].key(): 17})

	update(t, s, "exec-a", func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecutionCounters(ctx, "exec-a") })
	check("after DeleteExecutionCounters(exec-a)", map[counterKey]int64{rows[4].key(): 13, rows[5].key(): 17})

	// A deleted counter can be set again.
	write(t, s, counterRow{"exec-a", "d1", wire.KindToolCall, "t", "h", 1})
	check("after setting a deleted counter", map[counterKey]int64{rows[0].key(): 1, rows[4].key(): 13, rows[5].key(): 17})
}

// ---- agents ----

func testAgents(t *testing.T, s store.Store) {
	ctx := t.Context()
	orig := fullAgent("bravo")
	bare := &store.Agent{ID: "alpha", WebhookURL: "http://h/a", Secret: "x", RegisteredAt: base, UpdatedAt: base}
	write(t, s, orig, bare, &store.Agent{ID: "delta", WebhookURL: "http://h/d", Secret: "d", RegisteredAt: base, UpdatedAt: base},
		&store.Agent{ID: "charlie", WebhookURL: "http://h/c", Secret: "c", RegisteredAt: base, UpdatedAt: base})
	same(t, "agent", val(s.Read().Agent(ctx, "bravo")).get(t, "Agent"), orig)
	gotBare := val(s.Read().Agent(ctx, "alpha")).get(t, "Agent")
	same(t, "bare agent", gotBare, bare)
	if gotBare.InputSchema != nil || gotBare.OutputSchema != nil {
		t.Errorf("bare agent schemas: got %q and %q, want nil", gotBare.InputSchema, gotBare.OutputSchema)
	}
	_, err := s.Read().Agent(ctx, "missing")
	wantNotFound(t, "Agent of an unknown id", err)

	// Registering again replaces the endpoint, secret and lease timeout and
	// keeps the policy, metadata and registration time.
	again := &store.Agent{ID: "bravo", WebhookURL: "https://example.test/new", Secret: "rotated", PolicyBundle: "other policy",
		LeaseTimeoutSeconds: 90, Description: "other", InputSchema: []byte(`{"other":1}`), OutputSchema: nil,
		RegisteredAt: at(10 * time.Hour), UpdatedAt: at(3 * time.Second)}
	write(t, s, again)
	want := *orig
	want.WebhookURL, want.Secret, want.LeaseTimeoutSeconds, want.UpdatedAt = again.WebhookURL, again.Secret, 90, again.UpdatedAt
	same(t, "agent registered again", val(s.Read().Agent(ctx, "bravo")).get(t, "Agent"), &want)

	var errPolicy, errMeta, errDelete, errPolicyAgain error
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.SetAgentPolicy(ctx, "bravo", "bundle 2", at(4*time.Second)); err != nil {
			return err
		}
		// Writing the same policy again is not "not found".
		errPolicyAgain = tx.SetAgentPolicy(ctx, "bravo", "bundle 2", at(4*time.Second))
		if err := tx.UpdateAgentMetadata(ctx, "bravo", "desc 3", []byte(` {"in" : 3} `), nil, at(5*time.Second)); err != nil {
			return err
		}
		errPolicy = tx.SetAgentPolicy(ctx, "missing", "p", at(time.Hour))
		errMeta = tx.UpdateAgentMetadata(ctx, "missing", "d", nil, nil, at(time.Hour))
		errDelete = tx.DeleteAgent(ctx, "missing")
		return nil
	})
	if errPolicyAgain != nil {
		t.Errorf("SetAgentPolicy with an unchanged bundle: %v", errPolicyAgain)
	}
	wantNotFound(t, "SetAgentPolicy of an unknown agent", errPolicy)
	wantNotFound(t, "UpdateAgentMetadata of an unknown agent", errMeta)
	wantNotFound(t, "DeleteAgent of an unknown agent", errDelete)
	want.PolicyBundle = "bundle 2"
	want.Description = "desc 3"
	want.InputSchema = []byte(` {"in" : 3} `)
	want.OutputSchema = nil
	want.UpdatedAt = at(5 * time.Second)
	same(t, "agent after policy and metadata", val(s.Read().Agent(ctx, "bravo")).get(t, "Agent"), &want)

	// Registering again still keeps what SetAgentPolicy and
	// UpdateAgentMetadata wrote.
	again.UpdatedAt = at(6 * time.Second)
	write(t, s, again)
	want.UpdatedAt = again.UpdatedAt
	same(t, "agent registered a third time", val(s.Read().Agent(ctx, "bravo")).get(t, "Agent"), &want)

	list := val(s.Read().ListAgents(ctx)).get(t, "ListAgents")
	ids := make([]string, len(list))
	for i, a := range list {
		ids[i] = a.ID
	}
	sameStrings(t, "ListAgents", ids, []string{"alpha", "bravo", "charlie", "delta"})
	if len(list) == 4 {
		same(t, "listed agent", list[1], &want)
	}

	update(t, s, "", func(ctx context.Context, tx store.Tx) error { return tx.DeleteAgent(ctx, "charlie") })
	_, err = s.Read().Agent(ctx, "charlie")
	wantNotFound(t, "Agent after DeleteAgent", err)
	err = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error { return tx.DeleteAgent(ctx, "charlie") })
	wantNotFound(t, "DeleteAgent a second time", err)
	list = val(s.Read().ListAgents(ctx)).get(t, "ListAgents")
	ids = ids[:0]
	for _, a := range list {
		ids = append(ids, a.ID)
	}
	sameStrings(t, "ListAgents after delete", ids, []string{"alpha", "bravo", "delta"})
}

func testAgentHasLiveExecutions(t *testing.T, s store.Store) {
	ctx := t.Context()
	write(t, s,
		minimalExecution("e1", "done-agent", wire.ExecCompleted),
		minimalExecution("e2", "done-agent", wire.ExecFailed),
		minimalExecution("e3", "done-agent", wire.ExecCancelled),
		minimalExecution("e4", "pending-agent", wire.ExecPending),
		minimalExecution("e5", "pending-agent", wire.ExecCompleted),
		minimalExecution("e6", "running-agent", wire.ExecRunning),
		minimalExecution("e7", "blocked-agent", wire.ExecBlocked),
	)
	live := func(agent string) bool {
		t.Helper()
		return val(s.Read().AgentHasLiveExecutions(ctx, agent)).get(t, "AgentHasLiveExecutions")
	}
	for agent, want := range map[string]bool{
		"done-agent": false, "pending-agent": true, "running-agent": true, "blocked-agent": true, "idle-agent": false,
	} {
		if got := live(agent); got != want {
			t.Errorf("AgentHasLiveExecutions(%s): got %v, want %v", agent, got, want)
		}
	}
	// The answer follows status changes.
	update(t, s, "e6", func(ctx context.Context, tx store.Tx) error {
		e, err := tx.Execution(ctx, "e6")
		if err != nil {
			return err
		}
		e.Status = wire.ExecCompleted
		return tx.UpdateExecution(ctx, e)
	})
	if live("running-agent") {
		t.Error("AgentHasLiveExecutions after its only live execution completed: got true")
	}
}

// ---- idempotency ----

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

// ---- deadlines and retention ----

func testDeadlines(t *testing.T, s store.Store) {
	ctx := t.Context()
	now := at(time.Hour)
	mk := func(id, status string, deadline time.Time) *store.Execution {
		e := minimalExecution(id, "agent", status)
		e.DeadlineAt = deadline
		return e
	}
	if got := val(s.Read().NextDeadline(ctx)).get(t, "NextDeadline"); !got.IsZero() {
		t.Errorf("NextDeadline of an empty store: got %v, want zero", got)
	}
	write(t, s,
		mk("x1", wire.ExecPending, now.Add(-3*time.Second)),
		mk("x2", wire.ExecRunning, now.Add(-2*time.Second)),
		mk("x3", wire.ExecBlocked, now),
		mk("x4", wire.ExecCompleted, now.Add(-10*time.Second)),
		mk("x5", wire.ExecFailed, now.Add(-9*time.Second)),
		mk("x6", wire.ExecCancelled, now.Add(-8*time.Second)),
		mk("x7", wire.ExecRunning, time.Time{}),
		mk("x8", wire.ExecPending, now.Add(5*time.Second)),
	)
	due := val(s.Read().DeadlinesDue(ctx, now, 100)).get(t, "DeadlinesDue")
	sameStrings(t, "DeadlinesDue", sorted(due), []string{"x1", "x2", "x3"})
	two := val(s.Read().DeadlinesDue(ctx, now, 2)).get(t, "DeadlinesDue")
	if len(two) != 2 || !slices.Contains(due, two[0]) || !slices.Contains(due, two[1]) || two[0] == two[1] {
		t.Errorf("DeadlinesDue limit 2: got %q, want two of %q", two, due)
	}
	sameStrings(t, "DeadlinesDue earlier", val(s.Read().DeadlinesDue(ctx, now.Add(-3*time.Second), 100)).get(t, "DeadlinesDue"), []string{"x1"})
	if got := val(s.Read().NextDeadline(ctx)).get(t, "NextDeadline"); !got.Equal(now.Add(-3 * time.Second)) {
		t.Errorf("NextDeadline: got %v, want %v", got, now.Add(-3*time.Second))
	}

	finish := func(ids ...string) {
		t.Helper()
		update(t, s, "", func(ctx context.Context, tx store.Tx) error {
			for _, id := range ids {
				e, err := tx.Execution(ctx, id)
				if err != nil {
					return err
				}
				e.Status = wire.ExecFailed
				if err := tx.UpdateExecution(ctx, e); err != nil {
					return err
				}
			}
			return nil
		})
	}
	finish("x1", "x2", "x3")
	sameStrings(t, "DeadlinesDue once they are terminal", val(s.Read().DeadlinesDue(ctx, now.Add(time.Hour), 100)).get(t, "DeadlinesDue"), []string{"x8"})
	if got := val(s.Read().NextDeadline(ctx)).get(t, "NextDeadline"); !got.Equal(now.Add(5 * time.Second)) {
		t.Errorf("NextDeadline: got %v, want %v", got, now.Add(5*time.Second))
	}
	finish("x8")
	if got := val(s.Read().NextDeadline(ctx)).get(t, "NextDeadline"); !got.IsZero() {
		t.Errorf("NextDeadline with no live deadline: got %v, want zero", got)
	}
}

func testRetentionCandidates(t *testing.T, s store.Store) {
	ctx := t.Context()
	cutoff := at(24 * time.Hour)
	mk := func(id, status string, updated time.Time) *store.Execution {
		e := minimalExecution(id, "agent", status)
		e.UpdatedAt = updated
		return e
	}
	write(t, s,
		mk("r1", wire.ExecCompleted, cutoff.Add(-3*time.Hour)),
		mk("r2", wire.ExecFailed, cutoff.Add(-2*time.Hour)),
		mk("r3", wire.ExecCancelled, cutoff.Add(-time.Microsecond)),
		mk("r4", wire.ExecCompleted, cutoff),
		mk("r5", wire.ExecCompleted, cutoff.Add(time.Hour)),
		mk("r6", wire.ExecRunning, cutoff.Add(-10*time.Hour)),
		mk("r7", wire.ExecPending, cutoff.Add(-10*time.Hour)),
		mk("r8", wire.ExecBlocked, cutoff.Add(-10*time.Hour)),
	)
	got := val(s.Read().RetentionCandidates(ctx, cutoff, 100)).get(t, "RetentionCandidates")
	sameStrings(t, "RetentionCandidates", sorted(got), []string{"r1", "r2", "r3"})
	two := val(s.Read().RetentionCandidates(ctx, cutoff, 2)).get(t, "RetentionCandidates")
	if len(two) != 2 || !slices.Contains(got, two[0]) || !slices.Contains(got, two[1]) || two[0] == two[1] {
		t.Errorf("RetentionCandidates limit 2: got %q, want two of %q", two, got)
	}
	sameStrings(t, "RetentionCandidates far in the future", sorted(val(s.Read().RetentionCandidates(ctx, at(1000*time.Hour), 100)).get(t, "RetentionCandidates")),
		[]string{"r1", "r2", "r3", "r4", "r5"})
	sameStrings(t, "RetentionCandidates in the past", val(s.Read().RetentionCandidates(ctx, base, 100)).get(t, "RetentionCandidates"), []string{})
}

// ---- whole executions ----

// graph is every kind of row that belongs to one execution.
type graph struct {
	execution  *store.Execution
	events     []*store.Event
	steps      []*store.Step
	dispatches []*store.Dispatch
	counters   []counterRow
	idem       []*store.IdempotencyRecord
}

func newGraph(id string) graph {
	g := graph{execution: fullExecution(id), events: events(id, 1, 4)}
	s1 := fullStep(id, id+"-s1")
	s2 := simpleStep(id, id+"-s2", 9, wire.StepAllowed)
	g.steps = []*store.Step{s1, s2}
	g.dispatches = []*store.Dispatch{fullDispatch(id+"-d1", id), simpleDispatch(id+"-d2", id, wire.DispatchPending, at(time.Second), time.Time{})}
	g.counters = []counterRow{
		{id, id + "-d1", wire.KindToolCall, "web.search", "sha256:0123abcd", 2},
		{id, id + "-d2", wire.KindToolCall, "tool", "h-x", 1},
	}
	g.idem = []*store.IdempotencyRecord{
		{Route: "create", Key: "key-" + id, BodyHash: "b", ExecutionID: id, CreatedAt: base},
		{Route: "fork", Scope: "src", Key: "key-" + id, BodyHash: "c", ExecutionID: id, CreatedAt: base},
	}
	return g
}

func (g graph) rows() []any {
	rows := []any{g.execution, g.events, g.steps}
	for _, d := range g.dispatches {
		rows = append(rows, d)
	}
	for _, c := range g.counters {
		rows = append(rows, c)
	}
	for _, r := range g.idem {
		rows = append(rows, r)
	}
	return rows
}

func (g graph) world() world {
	w := world{executions: []string{g.execution.ID}}
	for _, d := range g.dispatches {
		w.dispatches = append(w.dispatches, d.ID)
	}
	for _, c := range g.counters {
		w.counters = append(w.counters, c.key())
	}
	for _, r := range g.idem {
		w.idem = append(w.idem, [3]string{r.Route, r.Scope, r.Key})
	}
	return w
}

// checkPresent asserts that every row of g is stored as written.
func (g graph) checkPresent(t *testing.T, r store.Reader) {
	t.Helper()
	ctx := t.Context()
	id := g.execution.ID
	same(t, "execution "+id, val(r.Execution(ctx, id)).get(t, "Execution"), g.execution)
	sameList(t, "events of "+id, val(r.Events(ctx, id, 0, big)).get(t, "Events"), g.events)
	sameList(t, "steps of "+id, val(r.Steps(ctx, id, nil, 0, big)).get(t, "Steps"), []*store.Step{g.steps[0], g.steps[1]})
	for _, st := range g.steps {
		same(t, "step "+st.StepID, val(r.Step(ctx, id, st.StepID)).get(t, "Step"), st)
	}
	for _, d := range g.dispatches {
		same(t, "dispatch "+d.ID, val(r.Dispatch(ctx, d.ID)).get(t, "Dispatch"), d)
	}
	for _, c := range g.counters {
		v, found, err := r.Counter(ctx, c.ExecutionID, c.DispatchID, c.Kind, c.Target, c.ArgsHash)
		if err != nil || !found || v != c.Consumed {
			t.Errorf("counter %v: got (%d, %v, %v), want (%d, true, nil)", c.key(), v, found, err, c.Consumed)
		}
	}
	for _, rec := range g.idem {
		same(t, "idempotency record of "+id, val(r.Idempotency(ctx, rec.Route, rec.Scope, rec.Key)).get(t, "Idempotency"), rec)
	}
}

// checkAbsent asserts that no row of g is stored.
func (g graph) checkAbsent(t *testing.T, r store.Reader) {
	t.Helper()
	ctx := t.Context()
	id := g.execution.ID
	_, err := r.Execution(ctx, id)
	wantNotFound(t, "Execution "+id, err)
	if evs := val(r.Events(ctx, id, 0, big)).get(t, "Events"); len(evs) != 0 {
		t.Errorf("events of %s: got %d, want none", id, len(evs))
	}
	if steps := val(r.Steps(ctx, id, nil, 0, big)).get(t, "Steps"); len(steps) != 0 {
		t.Errorf("steps of %s: got %d, want none", id, len(steps))
	}
	if steps := val(r.OpenSteps(ctx, id)).get(t, "OpenSteps"); len(steps) != 0 {
		t.Errorf("open steps of %s: got %d, want none", id, len(steps))
	}
	for _, st := range g.steps {
		_, err := r.Step(ctx, id, st.StepID)
		wantNotFound(t, "Step "+st.StepID, err)
		occ, found, err := r.MaxOccurrence(ctx, id, st.Kind, st.Target, st.ArgsHash)
		if err != nil || found {
			t.Errorf("MaxOccurrence of deleted step %s: got (%d, %v, %v), want not found", st.StepID, occ, found, err)
		}
	}
	for _, d := range g.dispatches {
		_, err := r.Dispatch(ctx, d.ID)
		wantNotFound(t, "Dispatch "+d.ID, err)
	}
	for _, c := range g.counters {
		v, found, err := r.Counter(ctx, c.ExecutionID, c.DispatchID, c.Kind, c.Target, c.ArgsHash)
		if err != nil || found {
			t.Errorf("counter %v: got (%d, %v, %v), want not found", c.key(), v, found, err)
		}
	}
	for _, rec := range g.idem {
		_, err := r.Idempotency(ctx, rec.Route, rec.Scope, rec.Key)
		wantNotFound(t, "Idempotency record of "+id, err)
	}
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

// ---- transactions ----

// world names rows whose state dump captures.
type world struct {
	executions []string
	dispatches []string
	counters   []counterKey
	idem       [][3]string
}

func (w world) merge(o world) world {
	return world{
		executions: append(slices.Clone(w.executions), o.executions...),
		dispatches: append(slices.Clone(w.dispatches), o.dispatches...),
		counters:   append(slices.Clone(w.counters), o.counters...),
		idem:       append(slices.Clone(w.idem), o.idem...),
	}
}

// dump renders everything stored about w, and every agent, as text, so that
// two states can be compared exactly.
func dump(t *testing.T, r store.Reader, w world) string {
	t.Helper()
	ctx := t.Context()
	var b strings.Builder
	line := func(what string, v any, err error) {
		switch {
		case errors.Is(err, store.ErrNotFound):
			fmt.Fprintf(&b, "%s: not found\n", what)
		case err != nil:
			t.Fatalf("dump %s: %v", what, err)
		default:
			j, err := json.Marshal(v)
			if err != nil {
				t.Fatalf("dump %s: %v", what, err)
			}
			fmt.Fprintf(&b, "%s: %s\n", what, j)
		}
	}
	for _, id := range w.executions {
		e, err := r.Execution(ctx, id)
		line("execution "+id, e, err)
		evs, err := r.Events(ctx, id, 0, big)
		line("events "+id, evs, err)
		steps, err := r.Steps(ctx, id, nil, 0, big)
		line("steps "+id, steps, err)
		open, err := r.OpenSteps(ctx, id)
		line("open steps "+id, open, err)
	}
	for _, id := range w.dispatches {
		d, err := r.Dispatch(ctx, id)
		line("dispatch "+id, d, err)
	}
	for _, k := range w.counters {
		v, found, err := r.Counter(ctx, k.ExecutionID, k.DispatchID, k.Kind, k.Target, k.ArgsHash)
		line(fmt.Sprintf("counter %v", k), []any{v, found}, err)
	}
	for _, k := range w.idem {
		rec, err := r.Idempotency(ctx, k[0], k[1], k[2])
		line(fmt.Sprintf("idempotency %q", k), rec, err)
	}
	agents, err := r.ListAgents(ctx)
	line("agents", agents, err)
	return b.String()
}

func sameDump(t *testing.T, what, got, want string) {
	t.Helper()
	if got == want {
		return
	}
	gl, wl := strings.Split(got, "\n"), strings.Split(want, "\n")
	for i := range max(len(gl), len(wl)) {
		var g, w string
		if i < len(gl) {
			g = gl[i]
		}
		if i < len(wl) {
			w = wl[i]
		}
		if g != w {
			t.Errorf("%s: stored state differs\n got: %s\nwant: %s", what, g, w)
		}
	}
}

// writeEverywhere changes every table inside tx: it inserts graph n and agent
// "hotel", and changes what graph p, execution q and agents "golf" and
// "india" hold. It returns what reads inside tx saw wrong.
func writeEverywhere(ctx context.Context, tx store.Tx, n, p graph) ([]string, error) {
	var wrong []string
	if err := tx.UpsertAgent(ctx, fullAgent("hotel")); err != nil {
		return nil, err
	}
	pid := p.execution.ID
	e, err := tx.Execution(ctx, pid)
	if err != nil {
		return nil, err
	}
	e.Status, e.Output, e.LastSeq, e.UpdatedAt = wire.ExecCompleted, []byte(`"done"`), 6, at(time.Hour)
	if err := tx.UpdateExecution(ctx, e); err != nil {
		return nil, err
	}
	if err := tx.SetExecutionResult(ctx, pid, e.Output, e.State); err != nil {
		return nil, err
	}
	if err := tx.AppendEvents(ctx, events(pid, 5, 6)); err != nil {
		return nil, err
	}
	st := *p.steps[1]
	st.Status, st.Result = wire.StepSucceeded, []byte(`1`)
	if err := tx.UpdateStep(ctx, &st); err != nil {
		return nil, err
	}
	if err := tx.InsertStep(ctx, simpleStep(pid, pid+"-s3", 10, wire.StepExecuting)); err != nil {
		return nil, err
	}
	d := *p.dispatches[1]
	d.Status, d.Attempt = wire.DispatchInFlight, 1
	if err := tx.UpdateDispatch(ctx, &d); err != nil {
		return nil, err
	}
	if err := tx.RetireDispatches(ctx, pid, "", at(time.Hour)); err != nil {
		return nil, err
	}
	c := p.counters[0]
	if err := tx.RaiseCounter(ctx, c.ExecutionID, c.DispatchID, c.Kind, c.Target, c.ArgsHash, 99); err != nil {
		return nil, err
	}
	if err := tx.DeleteDispatchCounters(ctx, p.counters[1].ExecutionID, p.counters[1].DispatchID); err != nil {
		return nil, err
	}
	if err := tx.DeleteExecutionCounters(ctx, pid); err != nil {
		return nil, err
	}
	if err := tx.RaiseCounter(ctx, pid, c.DispatchID, wire.KindToolCall, "new", "new", 5); err != nil {
		return nil, err
	}
	if err := tx.InsertIdempotency(ctx, &store.IdempotencyRecord{Route: p.idem[0].Route, Key: p.idem[0].Key, BodyHash: "new", ExecutionID: n.execution.ID, CreatedAt: at(time.Hour)}); err != nil {
		return nil, err
	}
	// p's first record was just replaced with a newer one; its second goes.
	if err := tx.DeleteIdempotencyBefore(ctx, at(time.Minute)); err != nil {
		return nil, err
	}
	if err := writeRows(ctx, tx, n.rows()...); err != nil {
		return nil, err
	}
	if err := tx.UpsertAgent(ctx, &store.Agent{ID: "golf", WebhookURL: "http://new", Secret: "new", RegisteredAt: base, UpdatedAt: at(time.Hour)}); err != nil {
		return nil, err
	}
	if err := tx.SetAgentPolicy(ctx, "golf", "new policy", at(time.Hour)); err != nil {
		return nil, err
	}
	if err := tx.UpdateAgentMetadata(ctx, "golf", "new", []byte(`{}`), []byte(`{}`), at(time.Hour)); err != nil {
		return nil, err
	}
	if err := tx.DeleteAgent(ctx, "india"); err != nil {
		return nil, err
	}
	if err := tx.DeleteExecution(ctx, "exec-q"); err != nil {
		return nil, err
	}

	// The transaction reads its own writes.
	if _, err := tx.Execution(ctx, n.execution.ID); err != nil {
		wrong = append(wrong, fmt.Sprintf("inserted execution: %v", err))
	}
	if e, err := tx.Execution(ctx, pid); err != nil || e.Status != wire.ExecCompleted {
		wrong = append(wrong, fmt.Sprintf("updated execution: %v, %v", e, err))
	}
	if evs, err := tx.Events(ctx, pid, 0, 100); err != nil || len(evs) != 6 {
		wrong = append(wrong, fmt.Sprintf("appended events: %d, %v", len(evs), err))
	}
	if _, err := tx.Execution(ctx, "exec-q"); !errors.Is(err, store.ErrNotFound) {
		wrong = append(wrong, fmt.Sprintf("deleted execution: %v", err))
	}
	if _, err := tx.Agent(ctx, "india"); !errors.Is(err, store.ErrNotFound) {
		wrong = append(wrong, fmt.Sprintf("deleted agent: %v", err))
	}
	if a, err := tx.Agent(ctx, "golf"); err != nil || a.PolicyBundle != "new policy" {
		wrong = append(wrong, fmt.Sprintf("agent policy: %v, %v", a, err))
	}
	if v, found, err := tx.Counter(ctx, c.ExecutionID, c.DispatchID, c.Kind, c.Target, c.ArgsHash); err != nil || found {
		wrong = append(wrong, fmt.Sprintf("deleted counter: %d %v %v", v, found, err))
	}
	if d, err := tx.Dispatch(ctx, p.dispatches[0].ID); err != nil || d.Status != wire.DispatchRetired {
		wrong = append(wrong, fmt.Sprintf("retired dispatch: %v, %v", d, err))
	}
	return wrong, nil
}

// rollbackWorld loads the rows writeEverywhere changes and returns graph p,
// graph n (not written) and the world covering both.
func rollbackWorld(t *testing.T, s store.Store) (n, p graph, w world) {
	t.Helper()
	n, p = newGraph("exec-n"), newGraph("exec-p")
	q := minimalExecution("exec-q", "agent", wire.ExecRunning)
	rows := append(p.rows(), q, events("exec-q", 1, 2), fullAgent("golf"), fullAgent("india"))
	write(t, s, rows...)
	w = n.world().merge(p.world()).merge(world{executions: []string{"exec-q"}})
	w.counters = append(w.counters, counterKey{"exec-p", "exec-p-d1", wire.KindToolCall, "new", "new"})
	return n, p, w
}

func testRollbackOnError(t *testing.T, s store.Store) {
	n, p, w := rollbackWorld(t, s)
	before := dump(t, s.Read(), w)
	var wrong []string
	var wrote bool
	err := s.Update(t.Context(), p.execution.ID, func(ctx context.Context, tx store.Tx) error {
		var err error
		if wrong, err = writeEverywhere(ctx, tx, n, p); err != nil {
			return err
		}
		wrote = true
		return fmt.Errorf("wrapped: %w", errDeliberate)
	})
	if !wrote {
		t.Fatalf("the transaction failed before returning its own error: %v", err)
	}
	if !errors.Is(err, errDeliberate) {
		t.Fatalf("Update returned %v, want the function's error", err)
	}
	for _, wr := range wrong {
		t.Errorf("read inside the transaction: %s", wr)
	}
	sameDump(t, "after a failed transaction", dump(t, s.Read(), w), before)

	// The store goes on working, and the same writes commit when nothing fails.
	update(t, s, p.execution.ID, func(ctx context.Context, tx store.Tx) error {
		_, err := writeEverywhere(ctx, tx, n, p)
		return err
	})
	after := dump(t, s.Read(), w)
	if after == before {
		t.Error("the committed writes changed nothing the dump shows")
	}
	n.checkPresent(t, s.Read())
}

func testRollbackOnPanic(t *testing.T, s store.Store) {
	n, p, w := rollbackWorld(t, s)
	before := dump(t, s.Read(), w)
	var wrote bool
	err := s.Update(t.Context(), p.execution.ID, func(ctx context.Context, tx store.Tx) error {
		if _, err := writeEverywhere(ctx, tx, n, p); err != nil {
			return err
		}
		wrote = true
		panic(panicMessage)
	})
	if !wrote {
		t.Fatalf("the transaction failed before panicking: %v", err)
	}
	if err == nil || !strings.Contains(err.Error(), panicMessage) {
		t.Fatalf("Update after a panic returned %v, want an error naming the panic", err)
	}
	sameDump(t, "after a panicking transaction", dump(t, s.Read(), w), before)

	// A panic with an error value is reported too, and the store still works.
	err = s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertExecution(ctx, minimalExecution("exec-after-panic", "a", wire.ExecPending)); err != nil {
			return err
		}
		panic(errDeliberate)
	})
	if err == nil {
		t.Fatal("Update after a panic with an error value returned nil")
	}
	_, err = s.Read().Execution(t.Context(), "exec-after-panic")
	wantNotFound(t, "execution written before a panic", err)
	write(t, s, minimalExecution("exec-after-panic", "a", wire.ExecPending))
	val(s.Read().Execution(t.Context(), "exec-after-panic")).get(t, "Execution")
}

// testRollbackOnFailedStatement fails a transaction with the store's own
// error after earlier statements succeeded.
func testRollbackOnFailedStatement(t *testing.T, s store.Store) {
	ctx := t.Context()
	existing := minimalExecution("exec-existing", "agent", wire.ExecRunning)
	write(t, s, existing)
	n := newGraph("exec-new")
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := writeRows(ctx, tx, n.rows()...); err != nil {
			return err
		}
		return tx.InsertExecution(ctx, fullExecution("exec-existing"))
	})
	if err == nil {
		t.Fatal("a transaction inserting a duplicate execution succeeded")
	}
	n.checkAbsent(t, s.Read())
	same(t, "existing execution", val(s.Read().Execution(ctx, existing.ID)).get(t, "Execution"), existing)
	write(t, s, n.rows()...)
	n.checkPresent(t, s.Read())
}

func testAfterCommit(t *testing.T, s store.Store) {
	ctx := t.Context()
	type seen struct {
		order   []int
		visible bool
		err     error
	}
	var got seen
	done := make(chan struct{})
	e := minimalExecution("exec-ac", "agent", wire.ExecPending)
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(func() {
			got.order = append(got.order, 1)
			// Runs once the write is committed: another reader sees it.
			_, got.err = s.Read().Execution(context.Background(), e.ID)
			got.visible = got.err == nil
		})
		if err := tx.InsertExecution(ctx, e); err != nil {
			return err
		}
		tx.AfterCommit(func() { got.order = append(got.order, 2) })
		tx.AfterCommit(func() { got.order = append(got.order, 3); close(done) })
		return nil
	})
	select {
	case <-done:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterCommit callbacks did not run")
	}
	if !slices.Equal(got.order, []int{1, 2, 3}) {
		t.Errorf("AfterCommit callbacks ran as %v, want [1 2 3] once each", got.order)
	}
	if !got.visible {
		t.Errorf("AfterCommit callback could not read the committed row: %v", got.err)
	}

	// Callbacks of transactions that roll back never run.
	var mu sync.Mutex
	var ran []string
	mark := func(name string) func() {
		return func() {
			mu.Lock()
			defer mu.Unlock()
			ran = append(ran, name)
		}
	}
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(mark("failed"))
		return errDeliberate
	})
	if !errors.Is(err, errDeliberate) {
		t.Fatalf("Update: got %v, want the function's error", err)
	}
	err = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(mark("panicked"))
		panic(panicMessage)
	})
	if err == nil {
		t.Fatal("Update of a panicking function returned nil")
	}
	err = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(mark("duplicate"))
		return tx.InsertExecution(ctx, minimalExecution("exec-ac", "agent", wire.ExecPending))
	})
	if err == nil {
		t.Fatal("Update inserting a duplicate execution returned nil")
	}
	fence := make(chan struct{})
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		tx.AfterCommit(mark("committed"))
		tx.AfterCommit(func() { close(fence) })
		return nil
	})
	select {
	case <-fence:
	case <-time.After(10 * time.Second):
		t.Fatal("AfterCommit callback of a committed transaction did not run")
	}
	mu.Lock()
	defer mu.Unlock()
	sameStrings(t, "AfterCommit callbacks that ran", ran, []string{"committed"})
}

func testCancelledContext(t *testing.T, s store.Store) {
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertExecution(ctx, minimalExecution("exec-cancelled", "agent", wire.ExecPending))
	})
	if !errors.Is(err, context.Canceled) {
		t.Errorf("Update with a cancelled context: got %v, want context.Canceled", err)
	}
	_, err = s.Read().Execution(t.Context(), "exec-cancelled")
	wantNotFound(t, "execution written under a cancelled context", err)
}

// testConcurrentUpdates runs many transactions at once, some failing in each
// of the three ways, and checks that each one is all or nothing.
func testConcurrentUpdates(t *testing.T, s store.Store) {
	const n = 200
	ctx := t.Context()
	pre := minimalExecution("exec-pre", "agent", wire.ExecRunning)
	write(t, s, pre)

	type outcome int
	const (
		succeeds outcome = iota
		returnsError
		panics
		failsInStore
	)
	plan := func(i int) outcome {
		switch {
		case i%25 == 7:
			return panics
		case i%10 == 5:
			return failsInStore
		case i%4 == 3:
			return returnsError
		}
		return succeeds
	}
	graphs := make([]graph, n)
	errs := make([]error, n)
	visible := make([]chan bool, n)
	start := make(chan struct{})
	finished := make(chan int, n)
	for i := range n {
		graphs[i] = newGraph(fmt.Sprintf("exec-c%03d", i))
		visible[i] = make(chan bool, 1)
		go func() {
			<-start
			g := graphs[i]
			errs[i] = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
				if err := writeRows(ctx, tx, g.rows()...); err != nil {
					return err
				}
				tx.AfterCommit(func() {
					_, err := s.Read().Execution(context.Background(), g.execution.ID)
					visible[i] <- err == nil
				})
				switch plan(i) {
				case returnsError:
					return errDeliberate
				case panics:
					panic(panicMessage)
				case failsInStore:
					return tx.InsertExecution(ctx, minimalExecution(pre.ID, "agent", wire.ExecPending))
				}
				return nil
			})
			finished <- i
		}()
	}
	close(start)
	for range n {
		select {
		case <-finished:
		case <-time.After(60 * time.Second):
			t.Fatal("concurrent updates did not finish")
		}
	}

	wantListed := []string{pre.ID}
	counts := map[outcome]int{}
	for i := range n {
		g := graphs[i]
		counts[plan(i)]++
		switch plan(i) {
		case succeeds:
			if errs[i] != nil {
				t.Errorf("update %d: %v", i, errs[i])
				continue
			}
			g.checkPresent(t, s.Read())
			select {
			case ok := <-visible[i]:
				if !ok {
					t.Errorf("update %d: AfterCommit callback could not read the committed execution", i)
				}
			case <-time.After(10 * time.Second):
				t.Errorf("update %d: AfterCommit callback did not run", i)
			}
			wantListed = append(wantListed, g.execution.ID)
		default:
			if errs[i] == nil {
				t.Errorf("update %d (outcome %d): returned nil", i, plan(i))
			}
			if plan(i) == returnsError && !errors.Is(errs[i], errDeliberate) {
				t.Errorf("update %d: got %v, want the function's error", i, errs[i])
			}
			g.checkAbsent(t, s.Read())
			select {
			case <-visible[i]:
				t.Errorf("update %d: AfterCommit callback of a rolled back transaction ran", i)
			default:
			}
		}
	}
	if counts[succeeds] == 0 || counts[returnsError] == 0 || counts[panics] == 0 || counts[failsInStore] == 0 {
		t.Fatalf("the plan does not cover every outcome: %v", counts)
	}
	list := val(s.Read().ListExecutions(ctx, store.ExecutionFilter{Limit: 10 * n})).get(t, "ListExecutions")
	sameStrings(t, "executions after concurrent updates", sorted(executionIDs(list)), sorted(wantListed))
	same(t, "execution that failing transactions tried to duplicate", val(s.Read().Execution(ctx, pre.ID)).get(t, "Execution"), pre)
}

// testSerialisedPerExecution runs read-modify-write transactions on one
// execution at once: none may see a stale row (§23.2).
func testSerialisedPerExecution(t *testing.T, s store.Store) {
	const n = 100
	ctx := t.Context()
	const id = "exec-serial"
	write(t, s, minimalExecution(id, "agent", wire.ExecRunning))
	errs := make(chan error, n)
	start := make(chan struct{})
	for range n {
		go func() {
			<-start
			errs <- s.Update(ctx, id, func(ctx context.Context, tx store.Tx) error {
				e, err := tx.Execution(ctx, id)
				if err != nil {
					return err
				}
				e.LastSeq++
				e.StepOrder++
				st := simpleStep(id, fmt.Sprintf("step-%03d", e.StepOrder), e.StepOrder, wire.StepSucceeded)
				if err := tx.InsertStep(ctx, st); err != nil {
					return err
				}
				if err := tx.AppendEvents(ctx, events(id, e.LastSeq, e.LastSeq)); err != nil {
					return err
				}
				return tx.UpdateExecution(ctx, e)
			})
		}()
	}
	close(start)
	for range n {
		select {
		case err := <-errs:
			if err != nil {
				t.Errorf("Update: %v", err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("updates did not finish")
		}
	}
	e := val(s.Read().Execution(ctx, id)).get(t, "Execution")
	if e.LastSeq != n || e.StepOrder != n {
		t.Errorf("after %d increments: last_seq %d, step_order %d", n, e.LastSeq, e.StepOrder)
	}
	evs := val(s.Read().Events(ctx, id, 0, big)).get(t, "Events")
	if len(evs) != n || evs[0].Seq != 1 || evs[n-1].Seq != n {
		t.Errorf("events: got %d (%v...), want seqs 1..%d", len(evs), eventSeqs(evs[:min(len(evs), 5)]), n)
	}
	steps := val(s.Read().Steps(ctx, id, nil, 0, big)).get(t, "Steps")
	if len(steps) != n {
		t.Errorf("steps: got %d, want %d", len(steps), n)
	}
}

// testReadAfterUpdate checks that a write is visible to Read as soon as
// Update returns, from several writers at once.
func testReadAfterUpdate(t *testing.T, s store.Store) {
	const writers, each = 8, 25
	ctx := t.Context()
	errs := make(chan error, writers)
	for w := range writers {
		go func() {
			errs <- func() error {
				for i := range each {
					id := fmt.Sprintf("exec-w%d-%02d", w, i)
					err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
						return writeRows(ctx, tx, minimalExecution(id, "agent", wire.ExecRunning), events(id, 1, 2))
					})
					if err != nil {
						return fmt.Errorf("Update %s: %w", id, err)
					}
					if _, err := s.Read().Execution(ctx, id); err != nil {
						return fmt.Errorf("Read of %s right after its Update: %w", id, err)
					}
					evs, err := s.Read().Events(ctx, id, 0, 10)
					if err != nil || len(evs) != 2 {
						return fmt.Errorf("events of %s right after its Update: %d, %v", id, len(evs), err)
					}
					// An update of the row is visible as well.
					err = s.Update(ctx, id, func(ctx context.Context, tx store.Tx) error {
						e, err := tx.Execution(ctx, id)
						if err != nil {
							return err
						}
						e.Status = wire.ExecCompleted
						return tx.UpdateExecution(ctx, e)
					})
					if err != nil {
						return fmt.Errorf("Update %s: %w", id, err)
					}
					if e, err := s.Read().Execution(ctx, id); err != nil || e.Status != wire.ExecCompleted {
						return fmt.Errorf("Read of %s right after its status change: %v, %v", id, e, err)
					}
				}
				return nil
			}()
		}()
	}
	for range writers {
		select {
		case err := <-errs:
			if err != nil {
				t.Error(err)
			}
		case <-time.After(60 * time.Second):
			t.Fatal("writers did not finish")
		}
	}
}

// testReadDuringUpdate reads while a write transaction is open: the read is
// not blocked by it and does not see what it has not committed.
func testReadDuringUpdate(t *testing.T, s store.Store) {
	ctx := t.Context()
	orig := fullExecution("exec-open")
	write(t, s, orig)
	entered, proceed := make(chan struct{}), make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- s.Update(ctx, orig.ID, func(ctx context.Context, tx store.Tx) error {
			e, err := tx.Execution(ctx, orig.ID)
			if err != nil {
				return err
			}
			e.Status, e.LastSeq = wire.ExecCompleted, 10
			if err := tx.UpdateExecution(ctx, e); err != nil {
				return err
			}
			if err := writeRows(ctx, tx, minimalExecution("exec-uncommitted", "agent", wire.ExecPending), events(orig.ID, 10, 10)); err != nil {
				return err
			}
			close(entered)
			<-proceed
			return nil
		})
	}()
	released := false
	release := func() {
		if !released {
			released = true
			close(proceed)
		}
	}
	defer release()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the write transaction ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the write transaction did not start")
	}

	rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	got, err := s.Read().Execution(rctx, orig.ID)
	if err != nil {
		t.Fatalf("Read during an open write transaction: %v", err)
	}
	same(t, "execution read during an uncommitted change", got, orig)
	_, err = s.Read().Execution(rctx, "exec-uncommitted")
	wantNotFound(t, "execution inserted by an uncommitted transaction", err)
	if evs := val(s.Read().Events(rctx, orig.ID, 9, 10)).get(t, "Events"); len(evs) != 0 {
		t.Errorf("events of an uncommitted transaction: got %d, want none", len(evs))
	}

	release()
	if err := <-done; err != nil {
		t.Fatalf("Update: %v", err)
	}
	if got := val(s.Read().Execution(ctx, orig.ID)).get(t, "Execution"); got.Status != wire.ExecCompleted || got.LastSeq != 10 {
		t.Errorf("after commit: status %s, last_seq %d; want completed, 10", got.Status, got.LastSeq)
	}
	val(s.Read().Execution(ctx, "exec-uncommitted")).get(t, "Execution after commit")
}

func testPing(t *testing.T, s store.Store) {
	if err := s.Ping(t.Context()); err != nil {
		t.Fatalf("Ping: %v", err)
	}
}

// A TryUpdate that finds its execution free commits exactly like Update,
// and rolls back like it too.
func testTryUpdate(t *testing.T, s store.Store) {
	ctx := t.Context()
	write(t, s, minimalExecution("exec-try", "agent", wire.ExecRunning))
	err := s.TryUpdate(ctx, "exec-try", func(ctx context.Context, tx store.Tx) error {
		e, err := tx.ExecutionHead(ctx, "exec-try")
		if err != nil {
			return err
		}
		e.Status = wire.ExecBlocked
		return tx.UpdateExecution(ctx, e)
	})
	if err != nil {
		t.Fatalf("TryUpdate: %v", err)
	}
	if got := val(s.Read().Execution(ctx, "exec-try")).get(t, "Execution"); got.Status != wire.ExecBlocked {
		t.Fatalf("after TryUpdate: status %s, want blocked", got.Status)
	}
	boom := errors.New("boom")
	err = s.TryUpdate(ctx, "exec-try", func(ctx context.Context, tx store.Tx) error {
		e, err := tx.ExecutionHead(ctx, "exec-try")
		if err != nil {
			return err
		}
		e.Status = wire.ExecRunning
		if err := tx.UpdateExecution(ctx, e); err != nil {
			return err
		}
		return boom
	})
	if !errors.Is(err, boom) {
		t.Fatalf("TryUpdate returning an error: got %v, want it back", err)
	}
	if got := val(s.Read().Execution(ctx, "exec-try")).get(t, "Execution"); got.Status != wire.ExecBlocked {
		t.Fatalf("after a failed TryUpdate: status %s, want blocked (rolled back)", got.Status)
	}
}

// A process hears its own notifications, whatever else carries them to the
// other processes.
func testNotifierHearsItself(t *testing.T, s store.Store) {
	heard := make(chan store.Notification, 4)
	s.Notifier().Listen(func(n store.Notification) {
		if n.Key == "exec-notified" {
			heard <- n
		}
	})
	want := store.Notification{Topic: store.TopicDelta, Key: "exec-notified", Data: []byte(`{"s":"x","q":1,"d":"hi"}`)}
	s.Notifier().Notify(want)
	select {
	case got := <-heard:
		if got.Topic != want.Topic || string(got.Data) != string(want.Data) {
			t.Fatalf("heard %+v, want %+v", got, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the notification was not heard by its own process")
	}
}

// ---- durability ----

func testAcknowledgedWritesSurvive(t *testing.T, s store.Store, reopen func(*testing.T, store.Store) store.Store) {
	const n = 40
	graphs := make([]graph, n)
	errs := make(chan error, n)
	for i := range n {
		graphs[i] = newGraph(fmt.Sprintf("exec-d%02d", i))
		go func() {
			errs <- s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
				if err := writeRows(ctx, tx, graphs[i].rows()...); err != nil {
					return err
				}
				if i%5 == 4 {
					return errDeliberate
				}
				return nil
			})
		}()
	}
	for range n {
		if err := <-errs; err != nil && !errors.Is(err, errDeliberate) {
			t.Fatalf("Update: %v", err)
		}
	}
	write(t, s, fullAgent("agent-durable"))
	var w world
	for _, g := range graphs {
		w = w.merge(g.world())
	}
	before := dump(t, s.Read(), w)

	s = reopen(t, s)
	sameDump(t, "after reopening", dump(t, s.Read(), w), before)
	for i, g := range graphs {
		if i%5 == 4 {
			g.checkAbsent(t, s.Read())
		} else {
			g.checkPresent(t, s.Read())
		}
	}
	same(t, "agent after reopening", val(s.Read().Agent(t.Context(), "agent-durable")).get(t, "Agent"), fullAgent("agent-durable"))
	if err := s.Ping(t.Context()); err != nil {
		t.Errorf("Ping after reopening: %v", err)
	}
}

func testReopenIsIdempotent(t *testing.T, s store.Store, reopen func(*testing.T, store.Store) store.Store) {
	var gs []graph
	for round := range 4 {
		g := newGraph(fmt.Sprintf("exec-round%d", round))
		write(t, s, g.rows()...)
		gs = append(gs, g)
		s = reopen(t, s)
		for _, g := range gs {
			g.checkPresent(t, s.Read())
		}
	}
	list := val(s.Read().ListExecutions(t.Context(), store.ExecutionFilter{Limit: 100})).get(t, "ListExecutions")
	sameStrings(t, "executions after four reopenings", executionIDs(list), []string{"exec-round3", "exec-round2", "exec-round1", "exec-round0"})
}

func testFinalStateSurvives(t *testing.T, s store.Store, reopen func(*testing.T, store.Store) store.Store) {
	n, p, w := rollbackWorld(t, s)
	update(t, s, p.execution.ID, func(ctx context.Context, tx store.Tx) error {
		_, err := writeEverywhere(ctx, tx, n, p)
		return err
	})
	// A rolled back change after the committed ones leaves no trace either.
	err := s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.DeleteExecution(ctx, n.execution.ID); err != nil {
			return err
		}
		return errDeliberate
	})
	if !errors.Is(err, errDeliberate) {
		t.Fatalf("Update: got %v, want the function's error", err)
	}
	before := dump(t, s.Read(), w)
	s = reopen(t, s)
	sameDump(t, "after reopening", dump(t, s.Read(), w), before)
	n.checkPresent(t, s.Read())
	_, err = s.Read().Execution(t.Context(), "exec-q")
	wantNotFound(t, "deleted execution after reopening", err)
	_, err = s.Read().Agent(t.Context(), "india")
	wantNotFound(t, "deleted agent after reopening", err)
}

// ---- resources, checkpoints and forks (RESOURCES-AND-FORKS §3.1, §5.2) ----

func insertAll[T any](t *testing.T, s store.Store, rows []T, insert func(ctx context.Context, tx store.Tx, row T) error) {
	t.Helper()
	update(t, s, "", func(ctx context.Context, tx store.Tx) error {
		for _, r := range rows {
			if err := insert(ctx, tx, r); err != nil {
				return err
			}
		}
		return nil
	})
}

func insertResource(ctx context.Context, tx store.Tx, r *store.Resource) error {
	return tx.InsertResource(ctx, r)
}

func insertCheckpoint(ctx context.Context, tx store.Tx, c *store.Checkpoint) error {
	return tx.InsertCheckpoint(ctx, c)
}

func testResources(t *testing.T, s store.Store) {
	ctx := t.Context()
	full := &store.Resource{ExecutionID: "exec-r", Key: "zeta", Position: 0, DriverID: "example.e2b.v1",
		Configuration: []byte(`{"timeout":600}`), CoverageReuse: true, EverySteps: 5, OnCompletion: true, RegisteredSeq: 5,
		Generation: 3, Binding: []byte(`{"sandbox_id":"i8x"}`), CheckpointRef: "snap_c1", StartsSinceCheckpoint: 2}
	bare := &store.Resource{ExecutionID: "exec-r", Key: "alpha", Position: 1, DriverID: "d", RegisteredSeq: 9}
	other := &store.Resource{ExecutionID: "exec-o", Key: "zeta", Position: 0, DriverID: "other", RegisteredSeq: 1}
	insertAll(t, s, []*store.Resource{full, bare, other}, insertResource)
	r := s.Read()
	same(t, "resource zeta", val(r.Resource(ctx, "exec-r", "zeta")).get(t, "Resource"), full)
	same(t, "resource alpha (no configuration, no binding)", val(r.Resource(ctx, "exec-r", "alpha")).get(t, "Resource"), bare)
	sameList(t, "resources in registration order", val(r.Resources(ctx, "exec-r")).get(t, "Resources"), []*store.Resource{full, bare})
	sameList(t, "another execution's resources", val(r.Resources(ctx, "exec-o")).get(t, "Resources"), []*store.Resource{other})
	if l := val(r.Resources(ctx, "exec-none")).get(t, "Resources"); len(l) != 0 {
		t.Errorf("resources of an execution without any: %d", len(l))
	}
	_, err := r.Resource(ctx, "exec-r", "nope")
	wantNotFound(t, "Resource of an unknown key", err)
	_, err = r.Resource(ctx, "exec-none", "zeta")
	wantNotFound(t, "Resource of another execution", err)
	err = s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertResource(ctx, &store.Resource{ExecutionID: "exec-r", Key: "zeta", Position: 2, DriverID: "x"})
	})
	if err == nil {
		t.Error("a second resource with the same key was stored")
	}
	same(t, "resource zeta after a refused duplicate", val(r.Resource(ctx, "exec-r", "zeta")).get(t, "Resource"), full)

	// UpdateResource writes generation, binding and the start counter, and
	// nothing else.
	changed := *bare
	changed.Generation, changed.Binding, changed.StartsSinceCheckpoint = 7, []byte(` {"p" : 1} `), 4
	changed.DriverID, changed.EverySteps, changed.CheckpointRef, changed.Position, changed.RegisteredSeq = "ignored", 99, "ignored", 5, 99
	changed.Configuration, changed.CoverageReuse, changed.OnCompletion = []byte(`1`), true, true
	var inTx *store.Resource
	update(t, s, "exec-r", func(ctx context.Context, tx store.Tx) error {
		if err := tx.UpdateResource(ctx, &changed); err != nil {
			return err
		}
		var err error
		inTx, err = tx.Resource(ctx, "exec-r", "alpha")
		return err
	})
	want := *bare
	want.Generation, want.Binding, want.StartsSinceCheckpoint = 7, []byte(` {"p" : 1} `), 4
	same(t, "resource alpha read in its update", inTx, &want)
	same(t, "updated resource alpha", val(r.Resource(ctx, "exec-r", "alpha")).get(t, "Resource"), &want)
	same(t, "resource zeta after updating alpha", val(r.Resource(ctx, "exec-r", "zeta")).get(t, "Resource"), full)
	same(t, "another execution's zeta", val(r.Resource(ctx, "exec-o", "zeta")).get(t, "Resource"), other)
}

func testCheckpoints(t *testing.T, s store.Store) {
	ctx := t.Context()
	b0 := &store.Checkpoint{ExecutionID: "exec-c", Key: "b", CoveredSeq: 7, Generation: 0, CheckpointRef: "B0", InvalidatedSeq: 10}
	c1 := &store.Checkpoint{ExecutionID: "exec-c", Key: "b", CoveredSeq: 15, Generation: 2, CheckpointRef: "C1"}
	a1 := &store.Checkpoint{ExecutionID: "exec-c", Key: "a", CoveredSeq: 12, Generation: 1, CheckpointRef: "A1"}
	ob := &store.Checkpoint{ExecutionID: "exec-o", Key: "b", CoveredSeq: 3, Generation: 0, CheckpointRef: "other"}
	insertAll(t, s, []*store.Checkpoint{c1, ob, b0, a1}, insertCheckpoint)
	r := s.Read()
	sameList(t, "checkpoints by key, then covered_seq", val(r.Checkpoints(ctx, "exec-c")).get(t, "Checkpoints"), []*store.Checkpoint{a1, b0, c1})
	if l := val(r.Checkpoints(ctx, "exec-none")).get(t, "Checkpoints"); len(l) != 0 {
		t.Errorf("checkpoints of an execution without any: %d", len(l))
	}
	// CheckpointAt: the newest row of the key with covered_seq <= seq.
	for _, c := range []struct {
		exec, key string
		seq       int64
		want      *store.Checkpoint
	}{
		{"exec-c", "b", 6, nil}, {"exec-c", "b", 7, b0}, {"exec-c", "b", 14, b0}, {"exec-c", "b", 15, c1},
		{"exec-c", "b", 1 << 62, c1}, {"exec-c", "a", 11, nil}, {"exec-c", "a", 12, a1}, {"exec-c", "z", 100, nil},
		{"exec-o", "b", 100, ob}, {"exec-none", "b", 100, nil},
	} {
		got, err := r.CheckpointAt(ctx, c.exec, c.key, c.seq)
		what := fmt.Sprintf("CheckpointAt(%s, %s, %d)", c.exec, c.key, c.seq)
		if c.want == nil {
			wantNotFound(t, what, err)
			continue
		}
		if err != nil {
			t.Errorf("%s: %v", what, err)
			continue
		}
		same(t, what, got, c.want)
	}
	// InvalidateCheckpoints closes the open rows of one key of one
	// execution, and leaves closed rows as they are.
	update(t, s, "exec-c", func(ctx context.Context, tx store.Tx) error {
		return tx.InvalidateCheckpoints(ctx, "exec-c", "b", 19)
	})
	closed := *c1
	closed.InvalidatedSeq = 19
	sameList(t, "checkpoints after closing b", val(r.Checkpoints(ctx, "exec-c")).get(t, "Checkpoints"), []*store.Checkpoint{a1, b0, &closed})
	same(t, "another execution's open row", val(r.CheckpointAt(ctx, "exec-o", "b", 100)).get(t, "CheckpointAt"), ob)
	b2 := &store.Checkpoint{ExecutionID: "exec-c", Key: "b", CoveredSeq: 20, Generation: 3, CheckpointRef: "C1"}
	var seen []*store.Checkpoint
	update(t, s, "exec-c", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertCheckpoint(ctx, b2); err != nil {
			return err
		}
		if err := tx.InvalidateCheckpoints(ctx, "exec-c", "b", 25); err != nil {
			return err
		}
		var err error
		seen, err = tx.Checkpoints(ctx, "exec-c")
		return err
	})
	closed2 := *b2
	closed2.InvalidatedSeq = 25
	sameList(t, "checkpoints read in the transaction that closed them", seen, []*store.Checkpoint{a1, b0, &closed, &closed2})
	sameList(t, "checkpoints after closing b again", val(r.Checkpoints(ctx, "exec-c")).get(t, "Checkpoints"), []*store.Checkpoint{a1, b0, &closed, &closed2})
	// (execution, key, covered_seq) is unique; equal refs are separate rows.
	err := s.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		return tx.InsertCheckpoint(ctx, &store.Checkpoint{ExecutionID: "exec-c", Key: "a", CoveredSeq: 12, CheckpointRef: "dup"})
	})
	if err == nil {
		t.Error("a second checkpoint with the same covered_seq was stored")
	}
	same(t, "checkpoint a after a refused duplicate", val(r.CheckpointAt(ctx, "exec-c", "a", 12)).get(t, "CheckpointAt"), a1)
}

// copyOf is a fork's copy of st in execution forkID: a narrow row that names
// the step whose bodies it shares. The bodies it carries must not be stored.
func copyOf(st *store.Step, forkID, stepID string, order int64) *store.Step {
	c := *st
	c.ExecutionID, c.StepID, c.Order = forkID, stepID, order
	c.DispatchID, c.Attempt, c.StartInfo = "", 0, nil
	c.BodyExecutionID, c.BodyStepID = st.ExecutionID, st.StepID
	c.Args, c.Result, c.Error = []byte(`"not stored"`), []byte(`"not stored"`), []byte(`"not stored"`)
	return &c
}

// asRead is how a copy reads: with the bodies of the step it shares.
func asRead(c *store.Step, owner *store.Step) *store.Step {
	r := *c
	r.Args, r.Result, r.Error = owner.Args, owner.Result, owner.Error
	return &r
}

func testSharedBodies(t *testing.T, s store.Store) {
	ctx := t.Context()
	s1 := fullStep("exec-src", "src-s1")
	s2 := simpleStep("exec-src", "src-s2", 8, wire.StepSucceeded)
	s2.Result = []byte(` [ "r" , 1.0 ] `)
	write(t, s, minimalExecution("exec-src", "agent-α", wire.ExecCompleted), []*store.Step{s1, s2})
	c1, c2 := copyOf(s1, "exec-fork", "fork-c1", 1), copyOf(s2, "exec-fork", "fork-c2", 2)
	write(t, s, minimalExecution("exec-fork", "agent-α", wire.ExecRunning), []*store.Step{c1, c2})
	r := s.Read()
	same(t, "copy of s1", val(r.Step(ctx, "exec-fork", "fork-c1")).get(t, "Step"), asRead(c1, s1))
	sameList(t, "copies listed", val(r.Steps(ctx, "exec-fork", nil, 0, big)).get(t, "Steps"), []*store.Step{asRead(c1, s1), asRead(c2, s2)})
	sameList(t, "copies listed by status", val(r.Steps(ctx, "exec-fork", []string{wire.StepSucceeded}, 0, big)).get(t, "Steps"),
		[]*store.Step{asRead(c2, s2)})
	same(t, "the source's own step", val(r.Step(ctx, "exec-src", "src-s1")).get(t, "Step"), s1)
	refs := val(r.CopyRefs(ctx, "exec-fork")).get(t, "CopyRefs")
	got := []string{}
	for _, ref := range refs {
		got = append(got, ref[0]+"/"+ref[1])
	}
	sameStrings(t, "CopyRefs of the fork", sorted(got), []string{"exec-src/src-s1", "exec-src/src-s2"})
	if l := val(r.CopyRefs(ctx, "exec-src")).get(t, "CopyRefs"); len(l) != 0 {
		t.Errorf("CopyRefs of an execution without copies: %v", l)
	}
	// Two copies of one step (two forks) give one reference per fork.
	write(t, s, minimalExecution("exec-fork2", "agent-α", wire.ExecRunning), copyOf(s1, "exec-fork2", "fork2-c1", 1),
		copyOf(s1, "exec-fork2", "fork2-c1b", 2))
	refs = val(r.CopyRefs(ctx, "exec-fork2")).get(t, "CopyRefs")
	if len(refs) != 1 || refs[0] != [2]string{"exec-src", "src-s1"} {
		t.Errorf("CopyRefs of two copies of one step: %v", refs)
	}
}

// testStepCopiesInBulk writes a fork's copies with one InsertSteps call
// larger than one statement holds, and reads the heads a fork copies.
func testStepCopiesInBulk(t *testing.T, s store.Store) {
	ctx := t.Context()
	const n = 2345
	var src, copies []*store.Step
	for i := 1; i <= n; i++ {
		st := fullStep("exec-bulk", fmt.Sprintf("bulk-%04d", i))
		st.Order, st.TerminalSeq, st.Occurrence = int64(i), int64(10*i), int64(i)
		st.Status = []string{wire.StepSucceeded, wire.StepFailed, wire.StepDenied, wire.StepExecuting}[i%4]
		if st.Status == wire.StepExecuting {
			st.TerminalSeq = 0
		}
		src = append(src, st)
		copies = append(copies, copyOf(st, "exec-bulk-fork", fmt.Sprintf("copy-%04d", i), int64(i)))
	}
	write(t, s, minimalExecution("exec-bulk", "agent-α", wire.ExecRunning), src,
		minimalExecution("exec-bulk-fork", "agent-α", wire.ExecRunning))
	update(t, s, "exec-bulk-fork", func(ctx context.Context, tx store.Tx) error { return tx.InsertSteps(ctx, copies) })
	r := s.Read()
	var want []*store.Step
	for i, c := range copies {
		want = append(want, asRead(c, src[i]))
	}
	sameList(t, "copies written in bulk", val(r.Steps(ctx, "exec-bulk-fork", nil, 0, big)).get(t, "Steps"), want)

	// A mixed batch (a live step among copies) is written as given too.
	live := fullStep("exec-bulk-fork", "live-1")
	live.Order = n + 2
	mixed := []*store.Step{copyOf(src[0], "exec-bulk-fork", "copy-again", n+1), live}
	update(t, s, "exec-bulk-fork", func(ctx context.Context, tx store.Tx) error { return tx.InsertSteps(ctx, mixed) })
	sameList(t, "a mixed batch", val(r.Steps(ctx, "exec-bulk-fork", nil, n, big)).get(t, "Steps"),
		[]*store.Step{asRead(mixed[0], src[0]), live})

	// Heads: finished by the seq, in order, paged, without bodies, dispatch
	// or start details.
	const upTo = 10 * 2000
	var heads []*store.Step
	for after := int64(0); ; {
		page := val(r.FinishedStepHeads(ctx, "exec-bulk", upTo, after, 500)).get(t, "FinishedStepHeads")
		heads = append(heads, page...)
		if len(page) < 500 {
			break
		}
		after = page[len(page)-1].Order
	}
	want = nil
	for _, st := range src[:2000] {
		if st.Status == wire.StepExecuting {
			continue
		}
		h := *st
		h.Args, h.Result, h.Error, h.DispatchID, h.Attempt, h.StartInfo = nil, nil, nil, "", 0, nil
		want = append(want, &h)
	}
	sameList(t, "finished step heads", heads, want)
}

func testListForks(t *testing.T, s store.Store) {
	ctx := t.Context()
	root := minimalExecution("exec-1root", "agent-a", wire.ExecCompleted)
	mk := func(id, agent, from string) *store.Execution {
		e := minimalExecution(id, agent, wire.ExecRunning)
		e.ForkedFrom, e.ForkSeq, e.Restoration = from, 3, []byte(`{}`)
		return e
	}
	f1, f2, f3 := mk("exec-2f1", "agent-a", root.ID), mk("exec-3f2", "agent-b", root.ID), mk("exec-4f3", "agent-a", root.ID)
	g := mk("exec-5g", "agent-a", f1.ID)
	plain := minimalExecution("exec-6plain", "agent-a", wire.ExecRunning)
	write(t, s, root, f1, f2, f3, g, plain)
	r := s.Read()
	list := func(f store.ExecutionFilter) []string {
		t.Helper()
		return executionIDs(val(r.ListExecutions(ctx, f)).get(t, "ListExecutions"))
	}
	sameStrings(t, "direct forks, newest first", list(store.ExecutionFilter{ForkedFrom: root.ID, Limit: 10}), []string{f3.ID, f2.ID, f1.ID})
	sameStrings(t, "forks, first page", list(store.ExecutionFilter{ForkedFrom: root.ID, Limit: 2}), []string{f3.ID, f2.ID})
	sameStrings(t, "forks, after a cursor", list(store.ExecutionFilter{ForkedFrom: root.ID, Cursor: f2.ID, Limit: 2}), []string{f1.ID})
	sameStrings(t, "forks of one agent", list(store.ExecutionFilter{ForkedFrom: root.ID, AgentID: "agent-b", Limit: 10}), []string{f2.ID})
	sameStrings(t, "forks of a fork", list(store.ExecutionFilter{ForkedFrom: f1.ID, Limit: 10}), []string{g.ID})
	sameStrings(t, "forks of an execution without any", list(store.ExecutionFilter{ForkedFrom: plain.ID, Limit: 10}), []string{})
	sameStrings(t, "every execution", list(store.ExecutionFilter{Limit: 10}), []string{plain.ID, g.ID, f3.ID, f2.ID, f1.ID, root.ID})
	same(t, "a fork read back", val(r.Execution(ctx, f2.ID)).get(t, "Execution"), f2)
}

func testDeleteExecutionKeepsSharedBodies(t *testing.T, s store.Store) {
	ctx := t.Context()
	src := minimalExecution("exec-src", "agent-α", wire.ExecCompleted)
	s1 := fullStep("exec-src", "src-s1")
	s2 := simpleStep("exec-src", "src-s2", 8, wire.StepSucceeded)
	s2.Result = []byte(`"only the source has me"`)
	fork := minimalExecution("exec-fork", "agent-α", wire.ExecCompleted)
	fork2 := minimalExecution("exec-fork2", "agent-α", wire.ExecRunning)
	c1, c2 := copyOf(s1, fork.ID, "fork-c1", 1), copyOf(s1, fork2.ID, "fork2-c1", 1)
	write(t, s, src, events(src.ID, 1, 5), []*store.Step{s1, s2}, fork, events(fork.ID, 1, 3), c1, fork2, c2)
	insertAll(t, s, []*store.Resource{{ExecutionID: src.ID, Key: "w", DriverID: "d", RegisteredSeq: 2}}, insertResource)
	insertAll(t, s, []*store.Checkpoint{{ExecutionID: src.ID, Key: "w", CoveredSeq: 3, CheckpointRef: "B0"}}, insertCheckpoint)
	r := s.Read()

	// Deleting the source keeps the body its forks share, and nothing else.
	update(t, s, src.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, src.ID) })
	_, err := r.Execution(ctx, src.ID)
	wantNotFound(t, "deleted source", err)
	_, err = r.Step(ctx, src.ID, s2.StepID)
	wantNotFound(t, "the source's unshared step", err)
	if evs := val(r.Events(ctx, src.ID, 0, big)).get(t, "Events"); len(evs) != 0 {
		t.Errorf("events of the deleted source: %d", len(evs))
	}
	if l := val(r.Resources(ctx, src.ID)).get(t, "Resources"); len(l) != 0 {
		t.Errorf("resources of the deleted source: %d", len(l))
	}
	if l := val(r.Checkpoints(ctx, src.ID)).get(t, "Checkpoints"); len(l) != 0 {
		t.Errorf("checkpoints of the deleted source: %d", len(l))
	}
	same(t, "copy after its source was deleted", val(r.Step(ctx, fork.ID, c1.StepID)).get(t, "Step"), asRead(c1, s1))
	same(t, "another fork's copy", val(r.Step(ctx, fork2.ID, c2.StepID)).get(t, "Step"), asRead(c2, s1))
	sameList(t, "the fork's events", val(r.Events(ctx, fork.ID, 0, big)).get(t, "Events"), events(fork.ID, 1, 3))

	// Deleting one fork keeps the body the other still shares.
	update(t, s, fork.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, fork.ID) })
	_, err = r.Step(ctx, fork.ID, c1.StepID)
	wantNotFound(t, "the deleted fork's copy", err)
	same(t, "the last copy", val(r.Step(ctx, fork2.ID, c2.StepID)).get(t, "Step"), asRead(c2, s1))

	// Deleting the last copy drops the kept body: nothing leaks.
	update(t, s, fork2.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, fork2.ID) })
	_, err = r.Step(ctx, src.ID, s1.StepID)
	wantNotFound(t, "the shared body after its last copy was deleted", err)
	if steps := val(r.Steps(ctx, src.ID, nil, 0, big)).get(t, "Steps"); len(steps) != 0 {
		t.Errorf("steps of the source after every copy was deleted: %d", len(steps))
	}

	// A fork deleted before its source leaves the source's steps alone.
	src2 := minimalExecution("exec-src2", "agent-α", wire.ExecCompleted)
	t1 := simpleStep(src2.ID, "src2-s1", 1, wire.StepSucceeded)
	t1.Result = []byte(`{"k" : 1}`)
	fork3 := minimalExecution("exec-fork3", "agent-α", wire.ExecCompleted)
	c3 := copyOf(t1, fork3.ID, "fork3-c1", 1)
	write(t, s, src2, t1, fork3, c3)
	update(t, s, fork3.ID, func(ctx context.Context, tx store.Tx) error { return tx.DeleteExecution(ctx, fork3.ID) })
	same(t, "the source's step after its fork was deleted", val(r.Step(ctx, src2.ID, t1.StepID)).get(t, "Step"), t1)
}
