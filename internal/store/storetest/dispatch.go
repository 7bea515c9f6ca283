package storetest

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// dispatchScenarios are the scenarios of dispatches, their scheduling and their occurrence counters.
var dispatchScenarios = []scenario{
	{"DispatchRoundTrip", testDispatchRoundTrip},
	{"RetireDispatches", testRetireDispatches},
	{"DispatchScheduling", testDispatchScheduling},
	{"NextDueAndLeaseExpiry", testNextWake},
	{"Counters", testCounters},
}

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
		// Occurrences reads the same counter.
		if n, err := s.Read().Occurrences(ctx, k.ExecutionID, k.DispatchID, k.Kind, k.Target, k.ArgsHash); err != nil ||
			n.Consumed != v || n.HasCounter != found {
			t.Errorf("Occurrences%v: %+v, %v; Counter says (%d, %v)", k, n, err, v, found)
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
