package storetest

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// What only a store shared by several processes shows: two stores opened on
// one database play two replicas. A backend that one process owns (SQLite)
// does not run these.

// SharedBackend opens what two replicas of one database see.
type SharedBackend struct {
	// Open returns two stores on one fresh, empty database, as two
	// processes open it, each closed when the test ends (a scenario may
	// close one first: closing twice must be harmless).
	Open func(t *testing.T) (a, b store.Store)
	// Limiters returns the rate limiters two replicas of one fresh
	// database use.
	Limiters func(t *testing.T) (a, b Limiter)
}

// Limiter is the kernel's rate limiter (kernel.Limiter), as a backend that
// keeps buckets in the store provides it.
type Limiter interface {
	Check(key string, maxCalls int64, window time.Duration, now time.Time) (ok bool, retryAfter time.Duration, err error)
}

type sharedScenario struct {
	name string
	fn   func(t *testing.T, b SharedBackend)
}

var sharedScenarios = []sharedScenario{
	{"TryUpdateSkipsLockedExecution", testSharedTryUpdate},
	{"SerialisedAcrossProcesses", testSharedSerialised},
	{"WaiterReadsTheHoldersDispatch", testSharedWaiterReadsDispatch},
	{"DispatchClaimedOnce", testSharedClaimOnce},
	{"IdempotencyKeyAcrossProcesses", testSharedIdempotency},
	{"AgentDeletionWaitsForCreate", testSharedAgentDeletion},
	{"NotificationsReachTheOther", testSharedNotifications},
	{"OneLeader", testSharedLeader},
	{"LimiterSharesOneBudget", testSharedLimiter},
}

// RunShared runs every scenario of a shared store as a subtest.
func RunShared(t *testing.T, b SharedBackend) {
	t.Helper()
	for _, sc := range sharedScenarios {
		t.Run(sc.name, func(t *testing.T) { sc.fn(t, b) })
	}
}

// holdLock runs an Update of s on executionID that stays open, holding the
// execution's lock, until release is called; release returns its error.
func holdLock(t *testing.T, s store.Store, executionID string, fn func(ctx context.Context, tx store.Tx) error) (release func() error) {
	t.Helper()
	entered, proceed, done := make(chan struct{}), make(chan struct{}), make(chan error, 1)
	go func() {
		done <- s.Update(t.Context(), executionID, func(ctx context.Context, tx store.Tx) error {
			if err := fn(ctx, tx); err != nil {
				return err
			}
			close(entered)
			<-proceed
			return nil
		})
	}()
	select {
	case <-entered:
	case err := <-done:
		t.Fatalf("the transaction holding the lock ended early: %v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("the transaction holding the lock did not start")
	}
	var once sync.Once
	var result error
	release = func() error {
		once.Do(func() {
			close(proceed)
			select {
			case result = <-done:
			case <-time.After(10 * time.Second):
				result = errors.New("the transaction holding the lock did not finish")
			}
		})
		return result
	}
	t.Cleanup(func() { release() })
	return release
}

func setStatus(status string, id string) func(ctx context.Context, tx store.Tx) error {
	return func(ctx context.Context, tx store.Tx) error {
		e, err := tx.ExecutionHead(ctx, id)
		if err != nil {
			return err
		}
		e.Status = status
		return tx.UpdateExecution(ctx, e)
	}
}

// While one process holds an execution, the other's TryUpdate gives up at
// once with ErrLocked, runs nothing and writes nothing; its Update waits and
// then sees what the first committed. Other executions are not held up.
func testSharedTryUpdate(t *testing.T, sb SharedBackend) {
	a, b := sb.Open(t)
	ctx := t.Context()
	write(t, a, minimalExecution("exec-held", "agent", wire.ExecRunning), minimalExecution("exec-free", "agent", wire.ExecRunning))
	release := holdLock(t, a, "exec-held", setStatus(wire.ExecBlocked, "exec-held"))

	ran := false
	tctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	err := b.TryUpdate(tctx, "exec-held", func(ctx context.Context, tx store.Tx) error {
		ran = true
		return setStatus(wire.ExecFailed, "exec-held")(ctx, tx)
	})
	if !errors.Is(err, store.ErrLocked) {
		t.Fatalf("TryUpdate of an execution another process holds: got %v, want ErrLocked", err)
	}
	if ran {
		t.Error("TryUpdate ran its function although the execution was locked")
	}
	if err := b.TryUpdate(tctx, "exec-free", setStatus(wire.ExecBlocked, "exec-free")); err != nil {
		t.Fatalf("TryUpdate of an execution nobody holds: %v", err)
	}

	waited := make(chan error, 1)
	var seen string
	go func() {
		waited <- b.Update(ctx, "exec-held", func(ctx context.Context, tx store.Tx) error {
			e, err := tx.ExecutionHead(ctx, "exec-held")
			if err != nil {
				return err
			}
			seen = e.Status
			e.Status = wire.ExecCompleted
			return tx.UpdateExecution(ctx, e)
		})
	}()
	if err := release(); err != nil {
		t.Fatalf("the holding transaction: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("Update after the lock was released: %v", err)
	}
	if seen != wire.ExecBlocked {
		t.Errorf("the waiting Update read status %q, want %q (the holder's committed write)", seen, wire.ExecBlocked)
	}
	if got := val(a.Read().Execution(ctx, "exec-held")).get(t, "Execution"); got.Status != wire.ExecCompleted {
		t.Errorf("final status %q, want completed", got.Status)
	}
	// Free again: TryUpdate goes through.
	if err := b.TryUpdate(ctx, "exec-held", setStatus(wire.ExecFailed, "exec-held")); err != nil {
		t.Errorf("TryUpdate once the lock is free: %v", err)
	}
}

// A transaction that waited for an execution's lock reads the dispatch as
// the holder left it, even when the holder wrote only the dispatch: a read
// made with the lock's own statement would see it as it was when that
// statement began, before the lock was granted, and claim it a second time.
func testSharedWaiterReadsDispatch(t *testing.T, sb SharedBackend) {
	a, b := sb.Open(t)
	ctx := t.Context()
	e := minimalExecution("exec-waiter", "agent", wire.ExecRunning)
	e.DispatchID = "d-waiter"
	write(t, a, e, simpleDispatch("d-waiter", e.ID, wire.DispatchPending, base, time.Time{}))
	release := holdLock(t, a, e.ID, func(ctx context.Context, tx store.Tx) error {
		d, err := tx.Dispatch(ctx, "d-waiter")
		if err != nil {
			return err
		}
		d.Status, d.Attempt, d.ClaimedBy = wire.DispatchInFlight, 1, "replica-a"
		return tx.UpdateDispatch(ctx, d)
	})
	waited := make(chan error, 1)
	var seen store.Dispatch
	go func() {
		waited <- b.Update(ctx, e.ID, func(ctx context.Context, tx store.Tx) error {
			if _, err := tx.ExecutionHead(ctx, e.ID); err != nil {
				return err
			}
			d, err := tx.Dispatch(ctx, "d-waiter")
			if err == nil {
				seen = *d
			}
			return err
		})
	}()
	// Give b's lock read time to start waiting (a grant without the wait
	// would prove nothing, but never fails the test).
	time.Sleep(100 * time.Millisecond)
	if err := release(); err != nil {
		t.Fatalf("the holding transaction: %v", err)
	}
	if err := <-waited; err != nil {
		t.Fatalf("the waiting Update: %v", err)
	}
	if seen.Status != wire.DispatchInFlight || seen.Attempt != 1 || seen.ClaimedBy != "replica-a" {
		t.Errorf("the waiting transaction read the dispatch as %s, attempt %d, claimed by %q; want the holder's in_flight, 1, replica-a",
			seen.Status, seen.Attempt, seen.ClaimedBy)
	}
}

// Read-modify-write transactions on one execution from both processes at
// once lose nothing (docs/protocol/operations.md §2.2).
func testSharedSerialised(t *testing.T, sb SharedBackend) {
	a, b := sb.Open(t)
	const n = 60
	const id = "exec-shared-serial"
	write(t, a, minimalExecution(id, "agent", wire.ExecRunning))
	errs := make(chan error, n)
	for i := range n {
		s := a
		if i%2 == 1 {
			s = b
		}
		go func() {
			errs <- s.Update(t.Context(), id, func(ctx context.Context, tx store.Tx) error {
				e, err := tx.ExecutionHead(ctx, id)
				if err != nil {
					return err
				}
				e.LastSeq++
				if err := tx.AppendEvents(ctx, events(id, e.LastSeq, e.LastSeq)); err != nil {
					return err
				}
				return tx.UpdateExecution(ctx, e)
			})
		}()
	}
	for range n {
		if err := <-errs; err != nil {
			t.Errorf("Update: %v", err)
		}
	}
	e := val(b.Read().Execution(t.Context(), id)).get(t, "Execution")
	evs := val(a.Read().Events(t.Context(), id, 0, big)).get(t, "Events")
	if e.LastSeq != n || len(evs) != n {
		t.Errorf("after %d increments from two processes: last_seq %d, %d events", n, e.LastSeq, len(evs))
	}
}

// Both processes claim every due dispatch they see, as dispatchers do
// (TryUpdate, re-reading the dispatch under the lock): each is claimed
// exactly once.
func testSharedClaimOnce(t *testing.T, sb SharedBackend) {
	a, b := sb.Open(t)
	const n = 40
	now := at(time.Minute)
	var rows []any
	for i := range n {
		id := fmt.Sprintf("exec-claim-%02d", i)
		rows = append(rows, minimalExecution(id, "agent", wire.ExecRunning),
			simpleDispatch(fmt.Sprintf("d-claim-%02d", i), id, wire.DispatchPending, base, time.Time{}))
	}
	write(t, a, rows...)
	var claims [2]atomic.Int64
	claim := func(s store.Store, replica int) error {
		for {
			refs, err := s.Read().DueDispatches(t.Context(), now, n, nil)
			if err != nil || len(refs) == 0 {
				return err
			}
			for _, ref := range refs {
				err := s.TryUpdate(t.Context(), ref.ExecutionID, func(ctx context.Context, tx store.Tx) error {
					d, err := tx.Dispatch(ctx, ref.ID)
					if err != nil || d.Status != wire.DispatchPending {
						return err
					}
					d.Status, d.Attempt, d.ClaimedBy = wire.DispatchInFlight, d.Attempt+1, fmt.Sprintf("replica-%d", replica)
					d.LeaseExpiresAt = now.Add(time.Minute)
					if err := tx.UpdateDispatch(ctx, d); err != nil {
						return err
					}
					claims[replica].Add(1)
					return nil
				})
				if err != nil && !errors.Is(err, store.ErrLocked) {
					return err
				}
			}
		}
	}
	errs := make(chan error, 2)
	go func() { errs <- claim(a, 0) }()
	go func() { errs <- claim(b, 1) }()
	for range 2 {
		if err := <-errs; err != nil {
			t.Fatalf("claim: %v", err)
		}
	}
	if got := claims[0].Load() + claims[1].Load(); got != n {
		t.Errorf("%d claims committed (%d and %d), want %d", got, claims[0].Load(), claims[1].Load(), n)
	}
	for i := range n {
		d := val(a.Read().Dispatch(t.Context(), fmt.Sprintf("d-claim-%02d", i))).get(t, "Dispatch")
		if d.Status != wire.DispatchInFlight || d.Attempt != 1 || !strings.HasPrefix(d.ClaimedBy, "replica-") {
			t.Errorf("dispatch %s: status %s, attempt %d, claimed by %q; want in_flight, 1, a replica", d.ID, d.Status, d.Attempt, d.ClaimedBy)
		}
	}
}

// Two creates with one idempotency key, one on each process at once, make
// one execution: the second finds the first's record (its read of the key
// waits for the first to commit).
func testSharedIdempotency(t *testing.T, sb SharedBackend) {
	a, b := sb.Open(t)
	const rounds = 10
	for round := range rounds {
		key := fmt.Sprintf("key-%d", round)
		made := make([]string, 2)
		start := make(chan struct{})
		errs := make(chan error, 2)
		for i, s := range []store.Store{a, b} {
			go func() {
				<-start
				errs <- s.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
					rec, err := tx.Idempotency(ctx, "create", "", key)
					if err == nil {
						made[i] = rec.ExecutionID
						return nil
					}
					if !errors.Is(err, store.ErrNotFound) {
						return err
					}
					id := fmt.Sprintf("exec-%s-%d", key, i)
					made[i] = id
					if err := tx.InsertExecution(ctx, minimalExecution(id, "agent", wire.ExecPending)); err != nil {
						return err
					}
					return tx.InsertIdempotency(ctx, &store.IdempotencyRecord{Route: "create", Key: key, BodyHash: "h",
						ExecutionID: id, CreatedAt: base})
				})
			}()
		}
		close(start)
		for range 2 {
			if err := <-errs; err != nil {
				t.Fatalf("round %d: %v", round, err)
			}
		}
		if made[0] != made[1] {
			t.Errorf("round %d: the two creates answered executions %s and %s, want one", round, made[0], made[1])
		}
	}
	list := val(a.Read().ListExecutions(t.Context(), store.ExecutionFilter{Limit: 100})).get(t, "ListExecutions")
	if len(list) != rounds {
		t.Errorf("%d executions for %d keys, want one per key", len(list), rounds)
	}
}

// A deletion's check for live executions waits for a transaction that read
// the agent to create one, and then sees it: the agent of a live execution
// is never deleted.
func testSharedAgentDeletion(t *testing.T, sb SharedBackend) {
	a, b := sb.Open(t)
	write(t, a, fullAgent("agent-busy"))
	release := holdLock(t, a, "", func(ctx context.Context, tx store.Tx) error {
		if _, err := tx.Agent(ctx, "agent-busy"); err != nil {
			return err
		}
		return tx.InsertExecution(ctx, minimalExecution("exec-of-busy", "agent-busy", wire.ExecPending))
	})
	checked := make(chan bool, 1)
	deleted := make(chan error, 1)
	go func() {
		deleted <- b.Update(t.Context(), "", func(ctx context.Context, tx store.Tx) error {
			if _, err := tx.Agent(ctx, "agent-busy"); err != nil {
				return err
			}
			live, err := tx.AgentHasLiveExecutions(ctx, "agent-busy")
			if err != nil {
				return err
			}
			checked <- live
			if live {
				return nil
			}
			return tx.DeleteAgent(ctx, "agent-busy")
		})
	}()
	// Until the create commits, the check must not answer: it could only
	// answer "no live execution", which the commit makes wrong.
	select {
	case live := <-checked:
		t.Fatalf("the deletion's check answered (live=%v) while an uncommitted create held the agent", live)
	case <-time.After(500 * time.Millisecond):
	}
	if err := release(); err != nil {
		t.Fatalf("create: %v", err)
	}
	if err := <-deleted; err != nil {
		t.Fatalf("deletion: %v", err)
	}
	if live := <-checked; !live {
		t.Error("the deletion's check did not see the execution created meanwhile")
	}
	val(a.Read().Agent(t.Context(), "agent-busy")).get(t, "Agent of a live execution")
}

// heard collects what a listener hears.
type heard struct {
	mu   sync.Mutex
	msgs []store.Notification
	news chan struct{}
}

func listen(s store.Store, keyPrefix string) *heard {
	h := &heard{news: make(chan struct{}, 1)}
	s.Notifier().Listen(func(n store.Notification) {
		if !strings.HasPrefix(n.Key, keyPrefix) {
			return
		}
		h.mu.Lock()
		h.msgs = append(h.msgs, store.Notification{Topic: n.Topic, Key: n.Key, Data: append([]byte(nil), n.Data...)})
		h.mu.Unlock()
		select {
		case h.news <- struct{}{}:
		default:
		}
	})
	return h
}

// await waits until n notifications have been heard.
func (h *heard) await(t *testing.T, who string, n int) []store.Notification {
	t.Helper()
	deadline := time.After(10 * time.Second)
	for {
		h.mu.Lock()
		got := append([]store.Notification(nil), h.msgs...)
		h.mu.Unlock()
		if len(got) >= n {
			return got
		}
		select {
		case <-h.news:
		case <-deadline:
			t.Fatalf("%s heard %d notifications within 10s, want %d", who, len(got), n)
		}
	}
}

// Notifications reach the other process, each once, deltas in order and
// whatever their size: a delta of 7,000 bytes of text that escaping makes
// larger than a NOTIFY payload may be included. The sender hears its own
// once, not again as an echo.
func testSharedNotifications(t *testing.T, sb SharedBackend) {
	a, b := sb.Open(t)
	hearA, hearB := listen(a, "exec-n"), listen(b, "exec-n")

	// 7,000 bytes of UTF-8 whose JSON escaping grows it: multibyte
	// characters, quotes, backslashes and control characters.
	var text strings.Builder
	for text.Len() < 7000-8 {
		text.WriteString("é€\"\\\x01🙂")
	}
	bigData, _ := json.Marshal(map[string]any{"s": "step", "q": 1, "d": text.String()})
	if len(bigData) < 8000 {
		t.Fatalf("the large delta is %d bytes once encoded; the scenario needs more than 8000", len(bigData))
	}
	var sent []store.Notification
	sent = append(sent,
		store.Notification{Topic: store.TopicEvents, Key: "exec-n1"},
		store.Notification{Topic: store.TopicDispatch, Key: "exec-n-dispatch"},
		store.Notification{Topic: store.TopicDelta, Key: "exec-n1", Data: bigData})
	for q := range 30 {
		sent = append(sent, store.Notification{Topic: store.TopicDelta, Key: "exec-n2", Data: fmt.Appendf(nil, `{"s":"st","q":%d,"d":"δ%d"}`, q, q)})
	}
	for _, n := range sent {
		a.Notifier().Notify(n)
	}
	gotB := hearB.await(t, "the other process", len(sent))
	gotA := hearA.await(t, "the sending process", len(sent))
	for who, got := range map[string][]store.Notification{"the other process": gotB, "the sender": gotA} {
		if len(got) != len(sent) {
			t.Errorf("%s heard %d notifications, want %d", who, len(got), len(sent))
		}
		for i := range min(len(got), len(sent)) {
			if got[i].Topic != sent[i].Topic || got[i].Key != sent[i].Key || string(got[i].Data) != string(sent[i].Data) {
				t.Errorf("%s: notification %d is %s/%s (%d bytes), want %s/%s (%d bytes)", who, i,
					got[i].Topic, got[i].Key, len(got[i].Data), sent[i].Topic, sent[i].Key, len(sent[i].Data))
			}
		}
	}
	// A last one from b proves every echo of a's has arrived, and none of
	// them was delivered again.
	b.Notifier().Notify(store.Notification{Topic: store.TopicEvents, Key: "exec-n-last"})
	hearA.await(t, "the first process", len(sent)+1)
	hearB.await(t, "the second process", len(sent)+1)
	hearA.mu.Lock()
	defer hearA.mu.Unlock()
	if len(hearA.msgs) != len(sent)+1 {
		t.Errorf("the sender heard %d notifications, want %d: its own came back as echoes", len(hearA.msgs), len(sent)+1)
	}
}

// Exactly one of two processes leads; when it closes, the other takes over.
func testSharedLeader(t *testing.T, sb SharedBackend) {
	a, b := sb.Open(t)
	waitFor(t, "one process to lead", func() bool { return a.Leading() || b.Leading() })
	leader, other := a, b
	if b.Leading() {
		leader, other = b, a
	}
	// Several checks of the leader connection pass meanwhile.
	for end := time.Now().Add(1500 * time.Millisecond); time.Now().Before(end); time.Sleep(20 * time.Millisecond) {
		if a.Leading() == b.Leading() {
			t.Fatalf("leading: %v and %v, want exactly one", a.Leading(), b.Leading())
		}
	}
	if err := leader.Close(); err != nil {
		t.Fatalf("close the leader: %v", err)
	}
	waitFor(t, "the other process to lead once the leader closed", other.Leading)
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("waited 15s for %s", what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// A budget of N admits exactly N of more concurrent checks split between
// two processes; a refusal says when a token will be back.
func testSharedLimiter(t *testing.T, sb SharedBackend) {
	la, lb := sb.Limiters(t)
	const capacity, extra = 20, 12
	window := time.Hour
	var admitted, refused atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, capacity+extra)
	for i := range capacity + extra {
		l := la
		if i%2 == 1 {
			l = lb
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			ok, retry, err := l.Check("rule:global:20:3600000", capacity, window, base)
			switch {
			case err != nil:
				errs <- err
			case ok:
				admitted.Add(1)
			default:
				refused.Add(1)
				// One token comes back every window/capacity (3 minutes).
				if retry <= 0 || retry > window/capacity {
					errs <- fmt.Errorf("a refusal with an empty bucket says retry after %s, want (0, %s]", retry, window/capacity)
				}
			}
		}()
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Error(err)
	}
	if admitted.Load() != capacity || refused.Load() != extra {
		t.Errorf("admitted %d and refused %d of %d checks, want %d and %d", admitted.Load(), refused.Load(), capacity+extra, capacity, extra)
	}
	// Either process sees the refill the other's clock-time implies.
	ok, _, err := lb.Check("rule:global:20:3600000", capacity, window, base.Add(window/capacity))
	if err != nil || !ok {
		t.Errorf("a check one refill period later: %v, %v; want admitted", ok, err)
	}
	ok, _, err = la.Check("rule:global:20:3600000", capacity, window, base.Add(window/capacity))
	if err != nil || ok {
		t.Errorf("a second check at the same time: %v, %v; want refused", ok, err)
	}
}
