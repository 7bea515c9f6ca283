package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

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
		occ, err := r.Occurrences(ctx, id, "", st.Kind, st.Target, st.ArgsHash)
		if err != nil || occ.HasHighest {
			t.Errorf("highest occurrence of deleted step %s: got %+v, %v, want none", st.StepID, occ, err)
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
