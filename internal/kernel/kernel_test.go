package kernel

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"path/filepath"
	"slices"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/events"
	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

// t0 is where every fixture's manual clock starts. It is a whole second so
// that stored microsecond times compare equal to computed ones.
var t0 = time.Date(2026, 12, 2, 9, 0, 0, 0, time.UTC)

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

// fixture is one kernel over a fresh SQLite file and a manual clock.
type fixture struct {
	t   *testing.T
	k   *Kernel
	clk *clock.Manual
	ctx context.Context
}

// policyFunc adapts a function to the Policy interface.
type policyFunc func(bundle string, f StepFacts) PolicyResult

func (p policyFunc) Evaluate(bundle string, f StepFacts) PolicyResult { return p(bundle, f) }

// newFixture starts a kernel; setup may change its options (config, policy)
// before it is built.
func newFixture(t *testing.T, setup ...func(o *Options)) *fixture {
	t.Helper()
	st, err := sqlite.Open(sqlite.Options{Path: filepath.Join(t.TempDir(), "k.db"), Logger: quiet})
	if err != nil {
		t.Fatalf("open store: %v", err)
	}
	t.Cleanup(func() { st.Close() })
	clk := clock.NewManual(t0)
	o := Options{Store: st, Clock: clk, Config: DefaultConfig(), Logger: quiet}
	for _, f := range setup {
		f(&o)
	}
	return &fixture{t: t, k: New(o), clk: clk, ctx: context.Background()}
}

func withConfig(f func(c *Config)) func(o *Options) {
	return func(o *Options) { f(&o.Config) }
}

func withPolicy(p Policy) func(o *Options) {
	return func(o *Options) { o.Policy = p }
}

// denyTarget is a policy that denies one target and allows the rest.
func denyTarget(target, ruleID, reason string) Policy {
	return policyFunc(func(_ string, f StepFacts) PolicyResult {
		if f.Target == target {
			return PolicyResult{Decision: PolicyDeny, RuleID: ruleID, Reason: reason}
		}
		return PolicyResult{Decision: PolicyAllow, RuleID: "allow-rest"}
	})
}

const testSecret = "0123456789abcdef-secret"

func (fx *fixture) agent(id string) *store.Agent {
	fx.t.Helper()
	a, err := fx.k.RegisterAgent(fx.ctx, AgentSpec{ID: id, WebhookURL: "http://127.0.0.1:9/hook/" + id, Secret: testSecret})
	if err != nil {
		fx.t.Fatalf("register %s: %v", id, err)
	}
	return a
}

func (fx *fixture) create(agentID string) *store.Execution {
	fx.t.Helper()
	e, err := fx.k.CreateExecution(fx.ctx, CreateRequest{AgentID: agentID, Input: []byte(`{"q": 1}`)})
	if err != nil {
		fx.t.Fatalf("create: %v", err)
	}
	return e
}

// claim claims the due dispatch of execution id.
func (fx *fixture) claim(id string) *Delivery {
	fx.t.Helper()
	refs, err := fx.k.store.Read().DueDispatches(fx.ctx, fx.clk.Now(), 1000, nil)
	if err != nil {
		fx.t.Fatalf("due dispatches: %v", err)
	}
	for _, ref := range refs {
		if ref.ExecutionID != id {
			continue
		}
		del, err := fx.k.ClaimDispatch(fx.ctx, ref)
		if err != nil {
			fx.t.Fatalf("claim: %v", err)
		}
		if del == nil {
			fx.t.Fatalf("claim of due dispatch %s returned nothing", ref.ID)
		}
		return del
	}
	fx.t.Fatalf("no due dispatch for execution %s at %v", id, fx.clk.Now())
	return nil
}

func (fx *fixture) ack(del *Delivery) {
	fx.t.Helper()
	if err := fx.k.RecordDelivery(fx.ctx, del, DeliveryOutcome{Acked: true, HTTPStatus: 200}); err != nil {
		fx.t.Fatalf("record ack: %v", err)
	}
}

// start creates an execution of agentID (registering it first if needed),
// claims its dispatch and acks the delivery.
func (fx *fixture) start(agentID string) (*store.Execution, *Delivery) {
	fx.t.Helper()
	if _, err := fx.k.store.Read().Agent(fx.ctx, agentID); errors.Is(err, store.ErrNotFound) {
		fx.agent(agentID)
	}
	e := fx.create(agentID)
	del := fx.claim(e.ID)
	fx.ack(del)
	return fx.exec(e.ID), del
}

// reclaim lets the lease of del expire, reclaims it and claims the next
// attempt of the same dispatch.
func (fx *fixture) reclaim(del *Delivery) *Delivery {
	fx.t.Helper()
	d := fx.dispatch(del.DispatchID)
	fx.clk.Advance(d.LeaseExpiresAt.Sub(fx.clk.Now()) + time.Second)
	if err := fx.k.ReclaimLease(fx.ctx, store.DispatchRef{ID: del.DispatchID, ExecutionID: del.ExecutionID}); err != nil {
		fx.t.Fatalf("reclaim: %v", err)
	}
	next := fx.claim(del.ExecutionID)
	if next.DispatchID != del.DispatchID || next.Attempt != del.Attempt+1 {
		fx.t.Fatalf("reclaimed delivery is %s/%d, want %s/%d", next.DispatchID, next.Attempt, del.DispatchID, del.Attempt+1)
	}
	return next
}

func hdr(del *Delivery) DispatchHeaders {
	return DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}
}

// req builds a submit request; args is JSON text or "" for absent args.
func req(t *testing.T, kind, target, args string) SubmitRequest {
	t.Helper()
	r := SubmitRequest{Kind: kind, Target: target}
	if args != "" {
		v, err := jsonx.Parse([]byte(args), wire.MaxNesting)
		if err != nil {
			t.Fatalf("parse args %s: %v", args, err)
		}
		r.Args, r.ArgsValue = v.Raw, v
	}
	return r
}

func argsHash(t *testing.T, args string) string {
	t.Helper()
	h, err := identity.ArgsHashBytes([]byte(args))
	if err != nil {
		t.Fatal(err)
	}
	return h
}

func (fx *fixture) submitReq(id string, h DispatchHeaders, r SubmitRequest) *Decision {
	fx.t.Helper()
	dec, err := fx.k.SubmitStep(fx.ctx, Caller{Agent: fx.exec(id).AgentID}, id, h, r)
	if err != nil {
		fx.t.Fatalf("submit %s %q: %v", r.Kind, r.Target, err)
	}
	return dec
}

func (fx *fixture) submit(e *store.Execution, del *Delivery, kind, target, args string) *Decision {
	fx.t.Helper()
	return fx.submitReq(e.ID, hdr(del), req(fx.t, kind, target, args))
}

// proceed submits a new tool call that must be allowed and returns its id.
func (fx *fixture) proceed(e *store.Execution, del *Delivery, target, args string) string {
	fx.t.Helper()
	dec := fx.submit(e, del, wire.KindToolCall, target, args)
	if dec.Decision != wire.DecisionProceed || dec.StepID == "" {
		fx.t.Fatalf("submit %s: decision %+v, want proceed", target, dec)
	}
	return dec.StepID
}

func (fx *fixture) outcome(e *store.Execution, del *Delivery, stepID string, ok bool, value string) *Decision {
	fx.t.Helper()
	var v []byte
	if value != "" {
		v = []byte(value)
	}
	dec, err := fx.k.RecordOutcome(fx.ctx, Caller{Agent: e.AgentID}, e.ID, stepID, hdr(del), OutcomeRequest{Succeeded: ok, Value: v})
	if err != nil {
		fx.t.Fatalf("record outcome: %v", err)
	}
	return dec
}

func (fx *fixture) exec(id string) *store.Execution {
	fx.t.Helper()
	e, err := fx.k.store.Read().Execution(fx.ctx, id)
	if err != nil {
		fx.t.Fatalf("read execution %s: %v", id, err)
	}
	return e
}

func (fx *fixture) step(execID, stepID string) *store.Step {
	fx.t.Helper()
	rd := fx.k.store.Read()
	s, err := fx.k.readStep(fx.ctx, rd, fx.view(execID), execID, stepID)
	if err != nil {
		fx.t.Fatalf("read step %s: %v", stepID, err)
	}
	return s
}

// checkpoints are an execution's checkpoint rows as the kernel reads them,
// an in-place fork's read in place included.
func (fx *fixture) checkpoints(id string) []*store.Checkpoint {
	fx.t.Helper()
	rows, err := fx.k.checkpointRows(fx.ctx, fx.k.store.Read(), fx.view(id), id)
	if err != nil {
		fx.t.Fatalf("read checkpoints of %s: %v", id, err)
	}
	return rows
}

// view is the forkView of an execution: the fixture reads every
// execution as the kernel's routes do, an in-place fork included.
func (fx *fixture) view(id string) *forkView {
	fx.t.Helper()
	v, err := fx.k.viewByID(fx.ctx, fx.k.store.Read(), id)
	if err != nil {
		fx.t.Fatalf("read execution %s: %v", id, err)
	}
	return v
}

func (fx *fixture) dispatch(id string) *store.Dispatch {
	fx.t.Helper()
	d, err := fx.k.store.Read().Dispatch(fx.ctx, id)
	if err != nil {
		fx.t.Fatalf("read dispatch %s: %v", id, err)
	}
	return d
}

func (fx *fixture) counter(del *Delivery, kind, target, args string) (int64, bool) {
	fx.t.Helper()
	v, found, err := fx.k.store.Read().Counter(fx.ctx, del.ExecutionID, del.DispatchID, kind, target, argsHash(fx.t, args))
	if err != nil {
		fx.t.Fatalf("read counter: %v", err)
	}
	return v, found
}

func (fx *fixture) events(id string) []*store.Event {
	fx.t.Helper()
	evs, err := fx.k.readEvents(fx.ctx, fx.k.store.Read(), fx.view(id), id, 0, 100000)
	if err != nil {
		fx.t.Fatalf("read events: %v", err)
	}
	return evs
}

// eventsAfter returns the events appended after seq.
func (fx *fixture) eventsAfter(id string, seq int64) []*store.Event {
	fx.t.Helper()
	evs, err := fx.k.readEvents(fx.ctx, fx.k.store.Read(), fx.view(id), id, seq, 100000)
	if err != nil {
		fx.t.Fatalf("read events: %v", err)
	}
	return evs
}

func (fx *fixture) lastSeq(id string) int64 { return fx.exec(id).LastSeq }

func types(evs []*store.Event) []string {
	out := make([]string, len(evs))
	for i, ev := range evs {
		out[i] = ev.Type
	}
	return out
}

func wantTypes(t *testing.T, evs []*store.Event, want ...string) {
	t.Helper()
	if got := types(evs); !slices.Equal(got, want) {
		t.Fatalf("event types = %v, want %v", got, want)
	}
}

func wantPayload(t *testing.T, ev *store.Event, want string) {
	t.Helper()
	if string(ev.Payload) != want {
		t.Fatalf("%s payload = %s, want %s", ev.Type, ev.Payload, want)
	}
}

// noNewEvents fails when the execution's log grew past seq.
func (fx *fixture) noNewEvents(id string, seq int64) {
	fx.t.Helper()
	if evs := fx.eventsAfter(id, seq); len(evs) > 0 {
		fx.t.Fatalf("unexpected events appended: %v", types(evs))
	}
}

func (fx *fixture) mutateStep(execID, stepID string, f func(s *store.Step)) {
	fx.t.Helper()
	err := fx.k.store.Update(fx.ctx, execID, func(ctx context.Context, tx store.Tx) error {
		s, err := tx.Step(ctx, execID, stepID)
		if err != nil {
			return err
		}
		f(s)
		return tx.UpdateStep(ctx, s)
	})
	if err != nil {
		fx.t.Fatalf("mutate step: %v", err)
	}
}

func (fx *fixture) mutateExec(id string, f func(e *store.Execution)) {
	fx.t.Helper()
	err := fx.k.store.Update(fx.ctx, id, func(ctx context.Context, tx store.Tx) error {
		e, err := tx.Execution(ctx, id)
		if err != nil {
			return err
		}
		f(e)
		return tx.UpdateExecution(ctx, e)
	})
	if err != nil {
		fx.t.Fatalf("mutate execution: %v", err)
	}
}

// enqueue enqueues a newer dispatch for the execution the way grant, deny
// and approval expiry do.
func (fx *fixture) enqueue(id string) string {
	fx.t.Helper()
	err := fx.k.update(fx.ctx, id, func(o *op) error {
		if err := o.load(id, Caller{}); err != nil {
			return err
		}
		return o.enqueueDispatch()
	})
	if err != nil {
		fx.t.Fatalf("enqueue: %v", err)
	}
	return fx.exec(id).DispatchID
}

func wantCode(t *testing.T, err error, code string) *Error {
	t.Helper()
	var ke *Error
	if !errors.As(err, &ke) {
		t.Fatalf("error = %v (%T), want a kernel error with code %s", err, err, code)
	}
	if ke.Code != code {
		t.Fatalf("error code = %s (%q), want %s", ke.Code, ke.Message, code)
	}
	return ke
}

func wantMessage(t *testing.T, err error, code, message string) {
	t.Helper()
	if ke := wantCode(t, err, code); ke.Message != message {
		t.Fatalf("error message = %q, want %q", ke.Message, message)
	}
}

func metric(c prometheus.Collector) float64 { return testutil.ToFloat64(c) }

func payloadField(t *testing.T, ev *store.Event, key string) *jsonx.Value {
	t.Helper()
	v, err := jsonx.Parse(ev.Payload, wire.MaxNesting)
	if err != nil {
		t.Fatalf("%s payload is not JSON: %v", ev.Type, err)
	}
	return v.Get(key)
}

func TestFixtureSanity(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	if e.Status != wire.ExecRunning || del.Attempt != 1 {
		t.Fatalf("started execution is %s at attempt %d", e.Status, del.Attempt)
	}
	if fx.k.store == nil || fx.k.Clock() != clock.Clock(fx.clk) || fx.k.hub == nil || fx.k.Metrics() == nil {
		t.Fatal("accessors do not return the kernel's collaborators")
	}
	if fx.k.Config().DispatchMaxAttempts != 5 {
		t.Fatalf("Config() = %+v", fx.k.Config())
	}
}

func TestNewDefaults(t *testing.T) {
	st, err := sqlite.Open(sqlite.Options{Path: filepath.Join(t.TempDir(), "k.db"), Logger: quiet})
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	k := New(Options{Store: st, Config: DefaultConfig()})
	if _, ok := k.Clock().(clock.Real); !ok {
		t.Fatalf("default clock is %T, want clock.Real", k.Clock())
	}
	if k.hub == nil || k.Metrics() == nil || k.log == nil {
		t.Fatal("New leaves a collaborator nil")
	}
	if k.policy == nil {
		t.Fatal("New leaves the policy nil")
	}
	// The wake channel holds one pending signal; more coalesce.
	k.WakeDispatcher()
	k.WakeDispatcher()
	select {
	case <-k.DispatchWake():
	default:
		t.Fatal("WakeDispatcher did not signal")
	}
	select {
	case <-k.DispatchWake():
		t.Fatal("two wake-ups did not coalesce")
	default:
	}
}

func TestDefaultConfigMatchesSpec(t *testing.T) {
	c := DefaultConfig()
	want := Config{DispatchMaxAttempts: 5, DispatchTimeout: 30 * time.Second, DispatchLeaseTimeout: 2 * time.Minute,
		BackoffBase: time.Second, BackoffMax: 30 * time.Second, ApprovalTimeout: 15 * time.Minute,
		CleanupInterval: 10 * time.Minute, MaxStepsPerExecution: 100000, MaxExecutionBytes: 1 << 30, ReplicaID: c.ReplicaID}
	if c != want {
		t.Fatalf("DefaultConfig() = %+v, want %+v", c, want)
	}
	if c.DeadlineTimeout != 0 || c.Retention != 0 || c.RequireDispatchHeaders {
		t.Fatal("deadline and retention default to off, dispatch headers to optional")
	}
}

// Whatever sends them (this process's commits, or another process through
// the store's notifier), notifications reach the tails, the delta consumers
// and the dispatcher of this process.
func TestNotificationsReachWaiters(t *testing.T) {
	fx := newFixture(t)
	n := fx.k.store.Notifier()
	tail := fx.k.SubscribeTail("exec-x")
	defer tail.Close()
	deltas := fx.k.SubscribeDeltas("exec-x")
	defer deltas.Close()
	select { // drain a wake-up left by the fixture's own work
	case <-fx.k.DispatchWake():
	default:
	}

	n.Notify(store.Notification{Topic: store.TopicEvents, Key: "exec-x"})
	select {
	case <-tail.C:
	default:
		t.Fatal("an events notification did not wake the tail")
	}
	n.Notify(store.Notification{Topic: store.TopicDelta, Key: "exec-x",
		Data: encodeDelta(events.Delta{StepID: "s1", Seq: 7, Data: "tok"})})
	select {
	case d := <-deltas.C:
		if d.StepID != "s1" || d.Seq != 7 || d.Data != "tok" {
			t.Fatalf("delta = %+v", d)
		}
	default:
		t.Fatal("a delta notification did not reach the consumer")
	}
	n.Notify(store.Notification{Topic: store.TopicDispatch})
	select {
	case <-fx.k.DispatchWake():
	default:
		t.Fatal("a dispatch notification did not wake the dispatcher")
	}
	// A delta that does not decode is dropped, never delivered half-read.
	n.Notify(store.Notification{Topic: store.TopicDelta, Key: "exec-x", Data: []byte("{")})
	select {
	case d := <-deltas.C:
		t.Fatalf("a malformed delta was delivered: %+v", d)
	default:
	}
}
