package kernel

import (
	"fmt"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

func TestClaimDispatch(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.ReplicaID = "replica-7" }))
	a := fx.agent("a1")
	fx.clk.Advance(3 * time.Second)
	e := fx.create("a1")
	created := fx.clk.Now()
	fx.clk.Advance(2 * time.Second)
	ref := store.DispatchRef{ID: e.DispatchID, ExecutionID: e.ID}
	seq := fx.lastSeq(e.ID)

	del, err := fx.k.ClaimDispatch(fx.ctx, ref)
	if err != nil || del == nil {
		t.Fatalf("claim = %+v, %v", del, err)
	}
	want := Delivery{DispatchID: e.DispatchID, ExecutionID: e.ID, AgentID: "a1", WebhookURL: a.WebhookURL, Secret: testSecret,
		Attempt: 1, LeaseTimeout: 120}
	got := *del
	got.DueAt = time.Time{}
	if got != want || !del.DueAt.Equal(created) {
		t.Fatalf("delivery = %+v, want %+v due at %v", *del, want, created)
	}
	d := fx.dispatch(e.DispatchID)
	if d.Status != wire.DispatchInFlight || d.Attempt != 1 || d.ClaimedBy != "replica-7" || d.LeaseTimeout != 120 ||
		!d.LeaseExpiresAt.Equal(fx.clk.Now().Add(2*time.Minute)) || !d.UpdatedAt.Equal(fx.clk.Now()) {
		t.Fatalf("claimed dispatch = %+v", d)
	}
	fx.noNewEvents(e.ID, seq) // a claim appends nothing

	// In flight: not claimable again, not due.
	if again, err := fx.k.ClaimDispatch(fx.ctx, ref); err != nil || again != nil {
		t.Fatalf("second claim = %+v, %v", again, err)
	}
	if refs, _ := fx.k.store.Read().DueDispatches(fx.ctx, fx.clk.Now(), 10, nil); len(refs) != 0 {
		t.Fatalf("due while in flight: %v", refs)
	}
	// Unknown dispatch: nothing.
	if none, err := fx.k.ClaimDispatch(fx.ctx, store.DispatchRef{ID: "0190aaaa-0000-7000-8000-000000000000", ExecutionID: e.ID}); err != nil || none != nil {
		t.Fatalf("claim of an unknown dispatch = %+v, %v", none, err)
	}

	t.Run("not yet due after a failed attempt", func(t *testing.T) {
		if err := fx.k.RecordDelivery(fx.ctx, del, DeliveryOutcome{HTTPStatus: 500}); err != nil {
			t.Fatal(err)
		}
		if next, err := fx.k.ClaimDispatch(fx.ctx, ref); err != nil || next != nil {
			t.Fatalf("claim before next_attempt_at = %+v, %v", next, err)
		}
		fx.clk.Advance(2 * time.Second)
		next, err := fx.k.ClaimDispatch(fx.ctx, ref)
		if err != nil || next == nil || next.Attempt != 2 {
			t.Fatalf("claim once due = %+v, %v", next, err)
		}
	})
	t.Run("retired by a newer dispatch", func(t *testing.T) {
		newer := fx.enqueue(e.ID)
		if d := fx.dispatch(e.DispatchID); d.Status != wire.DispatchRetired {
			t.Fatalf("the older dispatch is %s", d.Status)
		}
		if old, err := fx.k.ClaimDispatch(fx.ctx, ref); err != nil || old != nil {
			t.Fatalf("claim of a retired dispatch = %+v, %v", old, err)
		}
		if newer <= e.DispatchID {
			t.Fatalf("newer dispatch id %s is not greater than %s", newer, e.DispatchID)
		}
		refs, _ := fx.k.store.Read().DueDispatches(fx.ctx, fx.clk.Now(), 10, nil)
		if len(refs) != 1 || refs[0].ID != newer {
			t.Fatalf("due dispatches = %v, want only the newer one", refs)
		}
	})
	t.Run("terminal execution", func(t *testing.T) {
		e2 := fx.create("a1")
		if err := fx.k.CancelExecution(fx.ctx, e2.ID); err != nil {
			t.Fatal(err)
		}
		if del, err := fx.k.ClaimDispatch(fx.ctx, store.DispatchRef{ID: e2.DispatchID, ExecutionID: e2.ID}); err != nil || del != nil {
			t.Fatalf("claim for a cancelled execution = %+v, %v", del, err)
		}
	})
}

func TestClaimResetsCounters(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	fx.proceed(e, del, "x", `{}`)
	if _, ok := fx.counter(del, wire.KindToolCall, "x", `{}`); !ok {
		t.Fatal("setup: no counter")
	}
	if err := fx.k.RecordDelivery(fx.ctx, &Delivery{DispatchID: del.DispatchID, ExecutionID: e.ID, Attempt: 1}, DeliveryOutcome{HTTPStatus: 503}); err != nil {
		t.Fatal(err)
	}
	fx.clk.Advance(time.Minute)
	fx.claim(e.ID)
	if _, ok := fx.counter(del, wire.KindToolCall, "x", `{}`); ok {
		t.Fatal("a claim after a failed delivery kept the occurrence counters")
	}
}

func TestRecordDeliveryAck(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	e := fx.create("a1")
	del := fx.claim(e.ID)
	successes := metric(fx.k.metrics.DispatchOutcomes.WithLabelValues("success"))
	fx.clk.Advance(7 * time.Second)
	seq := fx.lastSeq(e.ID)
	fx.ack(del)
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventDispatchAcked)
	wantPayload(t, evs[0], fmt.Sprintf(`{"attempt":1,"dispatch_id":%q,"execution_id":%q,"status":"acked"}`, del.DispatchID, e.ID))
	d := fx.dispatch(del.DispatchID)
	if d.Status != wire.DispatchInFlight || !d.LeaseExpiresAt.Equal(fx.clk.Now().Add(2*time.Minute)) {
		t.Fatalf("dispatch after ack = %+v", d)
	}
	if metric(fx.k.metrics.DispatchOutcomes.WithLabelValues("success")) != successes+1 {
		t.Fatal("dispatch_outcomes_total{success} did not move")
	}
	// An outcome naming another attempt is discarded.
	seq = fx.lastSeq(e.ID)
	stale := *del
	stale.Attempt = 2
	if err := fx.k.RecordDelivery(fx.ctx, &stale, DeliveryOutcome{Acked: true}); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)
}

func TestRecordDeliveryFailure(t *testing.T) {
	cases := []struct {
		name      string
		out       DeliveryOutcome
		payload   string // the optional members, in canonical order around "attempt"
		delayFrom time.Duration
		delayTo   time.Duration // exclusive
	}{
		{"500", DeliveryOutcome{HTTPStatus: 500, Error: "webhook answered 500 Internal Server Error"},
			`"error":"webhook answered 500 Internal Server Error","execution_id":%q,"http_status":500`, time.Second, 1250 * time.Millisecond},
		{"connection refused", DeliveryOutcome{Error: "dial tcp: connection refused"},
			`"error":"dial tcp: connection refused","execution_id":%q`, time.Second, 1250 * time.Millisecond},
		{"no detail", DeliveryOutcome{HTTPStatus: 404},
			`"execution_id":%q,"http_status":404`, time.Second, 1250 * time.Millisecond},
		{"429 with Retry-After", DeliveryOutcome{HTTPStatus: 429, RetryAfter: 10 * time.Second},
			`"execution_id":%q,"http_status":429`, 10 * time.Second, 10*time.Second + 1},
		{"503 with a huge Retry-After is capped at 60 s", DeliveryOutcome{HTTPStatus: 503, RetryAfter: time.Hour},
			`"execution_id":%q,"http_status":503`, 60 * time.Second, 60*time.Second + 1},
		{"Retry-After below the backoff", DeliveryOutcome{HTTPStatus: 503, RetryAfter: time.Millisecond},
			`"execution_id":%q,"http_status":503`, time.Second, 1250 * time.Millisecond},
		{"Retry-After ignored on 500", DeliveryOutcome{HTTPStatus: 500, RetryAfter: 10 * time.Second},
			`"execution_id":%q,"http_status":500`, time.Second, 1250 * time.Millisecond},
		{"Retry-After ignored on 302", DeliveryOutcome{HTTPStatus: 302, RetryAfter: 10 * time.Second},
			`"execution_id":%q,"http_status":302`, time.Second, 1250 * time.Millisecond},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fx := newFixture(t)
			fx.agent("a1")
			e := fx.create("a1")
			del := fx.claim(e.ID)
			rejected := metric(fx.k.metrics.DispatchOutcomes.WithLabelValues("rejected"))
			seq := fx.lastSeq(e.ID)
			fx.drainWake()
			if err := fx.k.RecordDelivery(fx.ctx, del, tc.out); err != nil {
				t.Fatal(err)
			}
			evs := fx.eventsAfter(e.ID, seq)
			wantTypes(t, evs, wire.EventDispatchFailed)
			wantPayload(t, evs[0], fmt.Sprintf(`{"attempt":1,"dispatch_id":%q,`+tc.payload+`,"status":"failed"}`, del.DispatchID, e.ID))
			d := fx.dispatch(del.DispatchID)
			delay := d.NextAttemptAt.Sub(fx.clk.Now())
			if d.Status != wire.DispatchFailed || !d.LeaseExpiresAt.IsZero() || delay < tc.delayFrom || delay >= tc.delayTo {
				t.Fatalf("dispatch = %s, lease %v, next attempt in %v; want failed, no lease, delay in [%v, %v)",
					d.Status, d.LeaseExpiresAt, delay, tc.delayFrom, tc.delayTo)
			}
			if metric(fx.k.metrics.DispatchOutcomes.WithLabelValues("rejected")) != rejected+1 {
				t.Fatal("dispatch_outcomes_total{rejected} did not move")
			}
			select {
			case <-fx.k.DispatchWake():
			default:
				t.Fatal("a rescheduled dispatch did not wake the dispatcher")
			}
			if fx.exec(e.ID).Status != wire.ExecRunning {
				t.Fatal("one failed attempt ended the execution")
			}
		})
	}
}

func TestRecordDeliveryErrorTruncated(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	e := fx.create("a1")
	del := fx.claim(e.ID)
	long := strings.Repeat("a", 255) + "é" + strings.Repeat("b", 100)
	if err := fx.k.RecordDelivery(fx.ctx, del, DeliveryOutcome{Error: long}); err != nil {
		t.Fatal(err)
	}
	evs := fx.events(e.ID)
	got := payloadField(t, evs[len(evs)-1], "error").Str
	if got != strings.Repeat("a", 255) || !utf8.ValidString(got) {
		t.Fatalf("error has %d bytes (%q…), want the 255-byte prefix before é", len(got), got[:min(10, len(got))])
	}
}

func TestRecordDeliveryDiscardsStaleOutcomes(t *testing.T) {
	fx := newFixture(t)
	fx.agent("a1")
	e := fx.create("a1")
	del := fx.claim(e.ID)
	del2 := fx.reclaim(del)
	seq := fx.lastSeq(e.ID)
	// Attempt 1's outcome arrives after attempt 2 was claimed.
	for _, out := range []DeliveryOutcome{{Acked: true}, {HTTPStatus: 500}} {
		if err := fx.k.RecordDelivery(fx.ctx, del, out); err != nil {
			t.Fatal(err)
		}
	}
	fx.noNewEvents(e.ID, seq)
	if d := fx.dispatch(del.DispatchID); d.Status != wire.DispatchInFlight || d.Attempt != 2 {
		t.Fatalf("dispatch = %+v", d)
	}
	// Attempt 2's outcome after a failure moved it out of flight.
	if err := fx.k.RecordDelivery(fx.ctx, del2, DeliveryOutcome{HTTPStatus: 500}); err != nil {
		t.Fatal(err)
	}
	seq = fx.lastSeq(e.ID)
	if err := fx.k.RecordDelivery(fx.ctx, del2, DeliveryOutcome{Acked: true}); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)
	// Outcome of a retired dispatch.
	fx.clk.Advance(time.Minute)
	del3 := fx.claim(e.ID)
	fx.enqueue(e.ID)
	seq = fx.lastSeq(e.ID)
	if err := fx.k.RecordDelivery(fx.ctx, del3, DeliveryOutcome{Acked: true}); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)
	// Unknown dispatch.
	if err := fx.k.RecordDelivery(fx.ctx, &Delivery{DispatchID: "0190aaaa-0000-7000-8000-000000000000", ExecutionID: e.ID, Attempt: 1}, DeliveryOutcome{Acked: true}); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)
}

func TestDeliveryExhaustion(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.DispatchMaxAttempts = 2 }))
	e, del := fx.start("a1")
	s := fx.proceed(e, del, "x", `{}`)
	exhausted := metric(fx.k.metrics.DispatchOutcomes.WithLabelValues("exhausted"))

	if err := fx.k.RecordDelivery(fx.ctx, del, DeliveryOutcome{HTTPStatus: 500}); err != nil {
		t.Fatal(err)
	}
	fx.clk.Advance(2 * time.Second)
	del2 := fx.claim(e.ID)
	seq := fx.lastSeq(e.ID)
	if err := fx.k.RecordDelivery(fx.ctx, del2, DeliveryOutcome{HTTPStatus: 500, Error: "boom"}); err != nil {
		t.Fatal(err)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventDispatchFailed, wire.EventExecutionFailed, wire.EventStepCancelled)
	wantPayload(t, evs[0], fmt.Sprintf(`{"attempt":2,"dispatch_id":%q,"error":"boom","execution_id":%q,"http_status":500,"status":"failed"}`, del.DispatchID, e.ID))
	wantPayload(t, evs[1], fmt.Sprintf(`{"execution_id":%q,"reason":"dispatch_exhausted","status":"failed"}`, e.ID))
	wantPayload(t, evs[2], `{"error":{"reason":"execution_failed"},`+stepJSON(s, wire.KindToolCall, "x")+"}")
	ex := fx.exec(e.ID)
	if ex.Status != wire.ExecFailed || ex.FailureReason != wire.ReasonDispatchExhausted {
		t.Fatalf("execution = %s %q", ex.Status, ex.FailureReason)
	}
	if d := fx.dispatch(del.DispatchID); d.Status != wire.DispatchRetired {
		t.Fatalf("dispatch = %s, want retired", d.Status)
	}
	if metric(fx.k.metrics.DispatchOutcomes.WithLabelValues("exhausted")) != exhausted+1 {
		t.Fatal("dispatch_outcomes_total{exhausted} did not move")
	}
	if metric(fx.k.metrics.ExecutionsCompleted.WithLabelValues(wire.ExecFailed)) != 1 {
		t.Fatal("executions_completed_total{failed} did not move")
	}
}

// TestAttemptBudgetCountsSinceProgress: the budget is spent when
// attempt − progress_attempt ≥ max_attempts (docs/protocol/dispatch.md §7); a recorded outcome of
// the current attempt resets it, and delay(n) restarts from the base.
func TestAttemptBudgetCountsSinceProgress(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.DispatchMaxAttempts = 2 }))
	e, del := fx.start("a1")
	fail := func(del *Delivery) *store.Dispatch {
		t.Helper()
		if err := fx.k.RecordDelivery(fx.ctx, del, DeliveryOutcome{HTTPStatus: 500}); err != nil {
			t.Fatal(err)
		}
		return fx.dispatch(del.DispatchID)
	}
	delayOf := func(d *store.Dispatch) time.Duration { return d.NextAttemptAt.Sub(fx.clk.Now()) }

	d := fail(del) // attempt 1, no progress: 1 − 0 < 2
	if d.Status != wire.DispatchFailed || delayOf(d) < time.Second || delayOf(d) >= 1250*time.Millisecond {
		t.Fatalf("after attempt 1: %s, delay %v", d.Status, delayOf(d))
	}
	fx.clk.Advance(2 * time.Second)
	del2 := fx.claim(e.ID)
	s := fx.proceed(e, del2, "x", `{}`)
	fx.outcome(e, del2, s, true, `1`)
	if d := fx.dispatch(del.DispatchID); d.ProgressAttempt != 2 {
		t.Fatalf("progress_attempt = %d after attempt 2 recorded an outcome", d.ProgressAttempt)
	}
	d = fail(del2) // 2 − 2 = 0
	if d.Status != wire.DispatchFailed || delayOf(d) < time.Second || delayOf(d) >= 1250*time.Millisecond {
		t.Fatalf("after attempt 2: %s, delay %v (the backoff starts again at the base)", d.Status, delayOf(d))
	}
	fx.clk.Advance(2 * time.Second)
	d = fail(fx.claim(e.ID)) // attempt 3: 3 − 2 = 1
	if d.Status != wire.DispatchFailed || d.Attempt != 3 {
		t.Fatalf("after attempt 3: %+v", d)
	}
	fx.clk.Advance(2 * time.Second)
	d = fail(fx.claim(e.ID)) // attempt 4: 4 − 2 = 2, spent
	if d.Status != wire.DispatchRetired || fx.exec(e.ID).FailureReason != wire.ReasonDispatchExhausted {
		t.Fatalf("after attempt 4: dispatch %s, execution %+v", d.Status, fx.exec(e.ID))
	}
}

func TestBackoffDoublesWithoutProgress(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.DispatchMaxAttempts = 10 }))
	fx.agent("a1")
	e := fx.create("a1")
	for attempt, base := range []time.Duration{time.Second, 2 * time.Second, 4 * time.Second, 8 * time.Second, 16 * time.Second, 30 * time.Second, 30 * time.Second} {
		del := fx.claim(e.ID)
		if del.Attempt != int64(attempt+1) {
			t.Fatalf("claimed attempt %d, want %d", del.Attempt, attempt+1)
		}
		if err := fx.k.RecordDelivery(fx.ctx, del, DeliveryOutcome{HTTPStatus: 500}); err != nil {
			t.Fatal(err)
		}
		d := fx.dispatch(del.DispatchID)
		if delay := d.NextAttemptAt.Sub(fx.clk.Now()); delay < base || delay >= base+base/4 {
			t.Fatalf("after attempt %d the delay is %v, want [%v, %v)", del.Attempt, delay, base, base+base/4)
		}
		fx.clk.Advance(d.NextAttemptAt.Sub(fx.clk.Now()))
	}
}

func TestReclaimLease(t *testing.T) {
	fx := newFixture(t, withConfig(func(c *Config) { c.DispatchMaxAttempts = 2 }))
	e, del := fx.start("a1")
	ref := store.DispatchRef{ID: del.DispatchID, ExecutionID: e.ID}
	reclaimed := metric(fx.k.metrics.DispatchesReclaimed)
	seq := fx.lastSeq(e.ID)

	fx.clk.Advance(2*time.Minute - time.Millisecond)
	if refs, _ := fx.k.store.Read().ExpiredLeases(fx.ctx, fx.clk.Now(), 10); len(refs) != 0 {
		t.Fatalf("expired before the lease ends: %v", refs)
	}
	if err := fx.k.ReclaimLease(fx.ctx, ref); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)

	fx.clk.Advance(time.Millisecond)
	if refs, _ := fx.k.store.Read().ExpiredLeases(fx.ctx, fx.clk.Now(), 10); len(refs) != 1 || refs[0] != ref {
		t.Fatalf("expired leases = %v, want %v", refs, ref)
	}
	fx.drainWake()
	if err := fx.k.ReclaimLease(fx.ctx, ref); err != nil {
		t.Fatal(err)
	}
	evs := fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventDispatchLeaseExpired)
	wantPayload(t, evs[0], fmt.Sprintf(`{"attempt":1,"dispatch_id":%q,"execution_id":%q,"status":"pending"}`, del.DispatchID, e.ID))
	d := fx.dispatch(del.DispatchID)
	if d.Status != wire.DispatchPending || !d.NextAttemptAt.Equal(fx.clk.Now()) || !d.LeaseExpiresAt.IsZero() || d.Attempt != 1 {
		t.Fatalf("dispatch after reclaim = %+v", d)
	}
	if metric(fx.k.metrics.DispatchesReclaimed) != reclaimed+1 {
		t.Fatal("dispatches_reclaimed_total did not move")
	}
	select {
	case <-fx.k.DispatchWake():
	default:
		t.Fatal("a reclaimed dispatch did not wake the dispatcher")
	}
	// Redelivered at once under the same id with the next attempt.
	del2 := fx.claim(e.ID)
	if del2.DispatchID != del.DispatchID || del2.Attempt != 2 {
		t.Fatalf("redelivery = %s/%d", del2.DispatchID, del2.Attempt)
	}
	// A reclaim of a lease that is no longer expired does nothing.
	seq = fx.lastSeq(e.ID)
	if err := fx.k.ReclaimLease(fx.ctx, ref); err != nil {
		t.Fatal(err)
	}
	fx.noNewEvents(e.ID, seq)

	// The second expiry spends the budget.
	fx.clk.Advance(2 * time.Minute)
	if err := fx.k.ReclaimLease(fx.ctx, ref); err != nil {
		t.Fatal(err)
	}
	evs = fx.eventsAfter(e.ID, seq)
	wantTypes(t, evs, wire.EventDispatchLeaseExpired, wire.EventExecutionFailed)
	wantPayload(t, evs[0], fmt.Sprintf(`{"attempt":2,"dispatch_id":%q,"execution_id":%q,"status":"exhausted"}`, del.DispatchID, e.ID))
	wantPayload(t, evs[1], fmt.Sprintf(`{"execution_id":%q,"reason":"dispatch_exhausted","status":"failed"}`, e.ID))
	if metric(fx.k.metrics.DispatchesReclaimed) != reclaimed+2 || metric(fx.k.metrics.DispatchOutcomes.WithLabelValues("exhausted")) != 1 {
		t.Fatal("reclaim and exhaustion metrics did not move")
	}
	if err := fx.k.ReclaimLease(fx.ctx, store.DispatchRef{ID: "0190aaaa-0000-7000-8000-000000000000", ExecutionID: e.ID}); err != nil {
		t.Fatalf("reclaim of an unknown dispatch: %v", err)
	}
}

func TestEnqueueRetiresAndIncreases(t *testing.T) {
	fx := newFixture(t)
	e, del := fx.start("a1")
	ids := []string{del.DispatchID}
	for i := 0; i < 5; i++ {
		seq := fx.lastSeq(e.ID)
		id := fx.enqueue(e.ID)
		if id <= ids[len(ids)-1] {
			t.Fatalf("dispatch %d id %s is not greater than %s", i, id, ids[len(ids)-1])
		}
		evs := fx.eventsAfter(e.ID, seq)
		wantTypes(t, evs, wire.EventDispatchQueued)
		wantPayload(t, evs[0], fmt.Sprintf(`{"attempt":0,"dispatch_id":%q,"execution_id":%q,"status":"pending"}`, id, e.ID))
		ids = append(ids, id)
	}
	live := 0
	for _, id := range ids {
		if d := fx.dispatch(id); d.Status != wire.DispatchRetired {
			live++
			if id != ids[len(ids)-1] {
				t.Fatalf("dispatch %s is %s, want retired", id, d.Status)
			}
		}
	}
	if live != 1 || fx.exec(e.ID).DispatchID != ids[len(ids)-1] {
		t.Fatalf("%d live dispatches", live)
	}
	// Even when the newest id was made by a replica whose clock is ahead.
	future := newDispatchID("", fx.clk.Now().Add(time.Hour))
	fx.mutateExec(e.ID, func(x *store.Execution) { x.DispatchID = future })
	if id := fx.enqueue(e.ID); id <= future {
		t.Fatalf("dispatch id %s is not greater than the future id %s", id, future)
	}
}

// drainWake empties the dispatcher's wake channel.
func (fx *fixture) drainWake() {
	select {
	case <-fx.k.DispatchWake():
	default:
	}
}
