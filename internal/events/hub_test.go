package events

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

func pending(c chan struct{}) int { return len(c) }

func TestNotifyCoalesces(t *testing.T) {
	h := NewHub()
	tail := h.SubscribeTail("e1")
	defer tail.Close()
	for i := 0; i < 5; i++ {
		h.Notify("e1")
	}
	if n := pending(tail.C); n != 1 {
		t.Fatalf("after 5 notifications the tail holds %d signals, want 1", n)
	}
	<-tail.C
	select {
	case <-tail.C:
		t.Fatal("a second signal was pending after five coalesced notifications")
	default:
	}
	h.Notify("e1")
	select {
	case <-tail.C:
	default:
		t.Fatal("a notification after the reader drained the channel was lost")
	}
}

func TestNotifyReachesOnlyItsExecution(t *testing.T) {
	h := NewHub()
	a1, a2, b := h.SubscribeTail("a"), h.SubscribeTail("a"), h.SubscribeTail("b")
	da, db := h.SubscribeDeltas("a"), h.SubscribeDeltas("b")
	defer func() { a1.Close(); a2.Close(); b.Close(); da.Close(); db.Close() }()

	h.Notify("a")
	if pending(a1.C) != 1 || pending(a2.C) != 1 {
		t.Fatal("every tail of the execution must be signalled")
	}
	if pending(b.C) != 0 {
		t.Fatal("a tail of another execution was signalled")
	}
	if pending(da.Wake) != 1 {
		t.Fatal("a delta consumer of the execution was not woken (it must check for a terminal status)")
	}
	if pending(db.Wake) != 0 {
		t.Fatal("a delta consumer of another execution was woken")
	}
	h.Notify("a")
	if pending(da.Wake) != 1 {
		t.Fatal("delta wake-ups must coalesce too")
	}
	// Nobody listens: nothing happens and nothing is created.
	h.Notify("nobody")
	if tails, _, deltas := h.Counts(); tails != 2 || deltas != 2 {
		t.Fatalf("Counts() = %d, %d after notifying an unwatched execution, want 2, 2", tails, deltas)
	}
}

// A subscription to all executions hears every execution's news, coalesced,
// and leaves nothing behind when closed.
func TestSubscribeAll(t *testing.T) {
	h := NewHub()
	all := h.SubscribeAll()
	h.Notify("a")
	h.Notify("b")
	if pending(all.C) != 1 {
		t.Fatalf("the subscription to all holds %d signals after two notifications, want 1", pending(all.C))
	}
	<-all.C
	h.Notify("c")
	if pending(all.C) != 1 {
		t.Fatal("a notification after the reader drained the channel was lost")
	}
	all.Close()
	if tails, _, _ := h.Counts(); tails != 0 {
		t.Fatalf("Counts() = %d tails after closing, want 0", tails)
	}
}

func TestCloseRemovesEntries(t *testing.T) {
	h := NewHub()
	if tails, _, deltas := h.Counts(); tails != 0 || deltas != 0 {
		t.Fatalf("a new hub counts %d, %d", tails, deltas)
	}
	t1, t2, t3 := h.SubscribeTail("a"), h.SubscribeTail("a"), h.SubscribeTail("b")
	d1, d2 := h.SubscribeDeltas("a"), h.SubscribeDeltas("c")
	if tails, _, deltas := h.Counts(); tails != 2 || deltas != 2 {
		t.Fatalf("Counts() = %d, %d, want 2 executions with tails and 2 with delta consumers", tails, deltas)
	}
	t1.Close()
	if tails, _, _ := h.Counts(); tails != 2 {
		t.Fatalf("closing one of two tails of an execution removed its entry (tails = %d)", tails)
	}
	t2.Close()
	t3.Close()
	d1.Close()
	d2.Close()
	if tails, _, deltas := h.Counts(); tails != 0 || deltas != 0 {
		t.Fatalf("Counts() = %d, %d after every Close, want 0, 0", tails, deltas)
	}
	// Closing twice is harmless and does not disturb newer subscribers.
	t4 := h.SubscribeTail("a")
	t1.Close()
	d1.Close()
	if tails, _, _ := h.Counts(); tails != 1 {
		t.Fatalf("a repeated Close removed another subscriber (tails = %d)", tails)
	}
	h.Notify("a")
	if pending(t4.C) != 1 {
		t.Fatal("the remaining subscriber was not signalled")
	}
	if pending(t1.C) != 0 {
		t.Fatal("a closed tail was still signalled")
	}
	t4.Close()
	if tails, _, deltas := h.Counts(); tails != 0 || deltas != 0 {
		t.Fatalf("Counts() = %d, %d, want 0, 0", tails, deltas)
	}
}

func TestPublishDeltaDelivers(t *testing.T) {
	h := NewHub()
	a1, a2, b := h.SubscribeDeltas("a"), h.SubscribeDeltas("a"), h.SubscribeDeltas("b")
	defer func() { a1.Close(); a2.Close(); b.Close() }()
	for i := int64(0); i < 3; i++ {
		h.PublishDelta("a", Delta{StepID: "s", Seq: i, Data: fmt.Sprint("chunk", i)})
	}
	for _, sub := range []*DeltaSub{a1, a2} {
		for i := int64(0); i < 3; i++ {
			d := <-sub.C
			if d.StepID != "s" || d.Seq != i || d.Data != fmt.Sprint("chunk", i) {
				t.Fatalf("delta %d = %+v", i, d)
			}
		}
	}
	if len(b.C) != 0 {
		t.Fatal("a consumer of another execution received a delta")
	}
	// A delta published with nobody listening is simply dropped.
	h.PublishDelta("nobody", Delta{StepID: "x"})
	if tails, _, deltas := h.Counts(); tails != 0 || deltas != 2 {
		t.Fatalf("Counts() = %d, %d", tails, deltas)
	}
	a1.Close()
	h.PublishDelta("a", Delta{StepID: "s", Seq: 9})
	if len(a1.C) != 0 {
		t.Fatal("a closed consumer still received a delta")
	}
	if len(a2.C) != 1 {
		t.Fatal("the open consumer did not receive the delta")
	}
}

func TestFullDeltaBufferDropsWithoutBlocking(t *testing.T) {
	h := NewHub()
	slow := h.SubscribeDeltas("a")
	fast := h.SubscribeDeltas("a")
	defer slow.Close()
	defer fast.Close()

	const total = DeltaBuffer + 36
	fastSeqs := make(chan []int64, 1)
	go func() {
		// The fast consumer reads each delta right after it is published;
		// the slow one never reads, so only its buffer fills.
		var seqs []int64
		for i := int64(0); i < total; i++ {
			h.PublishDelta("a", Delta{StepID: "s", Seq: i})
			seqs = append(seqs, (<-fast.C).Seq)
		}
		fastSeqs <- seqs
	}()
	select {
	case seqs := <-fastSeqs:
		for i, s := range seqs {
			if s != int64(i) {
				t.Fatalf("the fast consumer saw seq %d at position %d", s, i)
			}
		}
	case <-time.After(5 * time.Second):
		t.Fatal("PublishDelta blocked on a full consumer buffer")
	}
	if n := len(slow.C); n != DeltaBuffer {
		t.Fatalf("the slow consumer holds %d deltas, want its buffer of %d", n, DeltaBuffer)
	}
	for i := int64(0); i < DeltaBuffer; i++ {
		if d := <-slow.C; d.Seq != i {
			t.Fatalf("the slow consumer's delta %d has seq %d: the oldest ones must be kept, new ones dropped", i, d.Seq)
		}
	}
	if len(slow.C) != 0 {
		t.Fatal("the slow consumer holds more than its buffer")
	}
}

func TestHubConcurrentUse(t *testing.T) {
	h := NewHub()
	var wg sync.WaitGroup
	for g := 0; g < 8; g++ {
		wg.Add(1)
		go func(g int) {
			defer wg.Done()
			id := fmt.Sprint("e", g%3)
			for i := 0; i < 200; i++ {
				tail := h.SubscribeTail(id)
				end := h.SubscribeEnd(id)
				sub := h.SubscribeDeltas(id)
				h.Notify(id)
				h.NotifyEnd(id)
				h.PublishDelta(id, Delta{Seq: int64(i)})
				tail.Close()
				end.Close()
				sub.Close()
			}
		}(g)
	}
	wg.Wait()
	if tails, ends, deltas := h.Counts(); tails != 0 || ends != 0 || deltas != 0 {
		t.Fatalf("Counts() = %d, %d, %d after concurrent subscribe/close, want 0, 0, 0", tails, ends, deltas)
	}
}

// End subscriptions hear only of ends, and tails only of log growth: a
// waiting read is not woken by every step of the execution it waits for.
func TestEndsAreSeparateFromTails(t *testing.T) {
	h := NewHub()
	tail, end, other := h.SubscribeTail("a"), h.SubscribeEnd("a"), h.SubscribeEnd("b")
	h.Notify("a")
	if pending(end.C) != 0 || pending(tail.C) != 1 {
		t.Fatalf("after Notify: end %d, tail %d signals; want 0, 1", pending(end.C), pending(tail.C))
	}
	h.NotifyEnd("a")
	h.NotifyEnd("a")
	if pending(end.C) != 1 || pending(other.C) != 0 || pending(tail.C) != 1 {
		t.Fatalf("after NotifyEnd twice: end %d, other execution's end %d, tail %d signals; want 1, 0, 1",
			pending(end.C), pending(other.C), pending(tail.C))
	}
	if tails, ends, _ := h.Counts(); tails != 1 || ends != 2 {
		t.Fatalf("Counts() = %d tails, %d ends; want 1, 2", tails, ends)
	}
	end.Close()
	other.Close()
	tail.Close()
	if tails, ends, _ := h.Counts(); tails != 0 || ends != 0 {
		t.Fatalf("Counts() = %d tails, %d ends after Close; want 0, 0", tails, ends)
	}
}

func TestNotifyAllWakesEverySubscriber(t *testing.T) {
	h := NewHub()
	a, b := h.SubscribeTail("a"), h.SubscribeTail("b")
	da, dc := h.SubscribeDeltas("a"), h.SubscribeDeltas("c")
	defer func() { a.Close(); b.Close(); da.Close(); dc.Close() }()
	h.NotifyAll()
	if pending(a.C) != 1 || pending(b.C) != 1 {
		t.Fatal("NotifyAll must signal the tails of every execution")
	}
	if pending(da.Wake) != 1 || pending(dc.Wake) != 1 {
		t.Fatal("NotifyAll must wake the delta consumers of every execution, tailed or not")
	}
	if tails, _, deltas := h.Counts(); tails != 2 || deltas != 2 {
		t.Fatalf("NotifyAll changed the subscriptions: %d tails, %d delta executions", tails, deltas)
	}
}
