// Package events fans out two kinds of news to HTTP streams on this replica:
// "an execution's log grew" (the SSE tail then reads the store, which stays
// the source of truth) and live step deltas, which are never stored.
package events

import "sync"

// Delta is one live chunk of a running step's output (docs/protocol/events.md §5).
type Delta struct {
	StepID string
	Seq    int64
	Data   string
}

// DeltaBuffer is the per-consumer buffer; a full buffer drops new deltas and
// consumers detect the gap by seq.
const DeltaBuffer = 64

// Hub holds the subscribers of each execution. Entries are removed when the
// last subscriber leaves, so nothing is kept for executions nobody watches.
type Hub struct {
	mu     sync.Mutex
	tails  map[string]map[*Tail]struct{}
	deltas map[string]map[*DeltaSub]struct{}
}

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{tails: map[string]map[*Tail]struct{}{}, deltas: map[string]map[*DeltaSub]struct{}{}}
}

// Tail is a subscription to log growth of one execution.
type Tail struct {
	// C receives a value when new events may exist. It holds at most one
	// pending signal: several commits before the reader wakes coalesce.
	C   chan struct{}
	hub *Hub
	id  string
}

// SubscribeTail registers interest in executionID's log.
func (h *Hub) SubscribeTail(executionID string) *Tail {
	t := &Tail{C: make(chan struct{}, 1), hub: h, id: executionID}
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.tails[executionID]
	if set == nil {
		set = map[*Tail]struct{}{}
		h.tails[executionID] = set
	}
	set[t] = struct{}{}
	return t
}

// Close unregisters the subscription.
func (t *Tail) Close() {
	t.hub.mu.Lock()
	defer t.hub.mu.Unlock()
	if set := t.hub.tails[t.id]; set != nil {
		delete(set, t)
		if len(set) == 0 {
			delete(t.hub.tails, t.id)
		}
	}
}

// Notify signals every tail of executionID that its log grew.
func (h *Hub) Notify(executionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wake(executionID)
}

// NotifyAll signals every tail and delta consumer of every execution, for
// when news may have been lost: each re-reads the store.
func (h *Hub) NotifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.tails {
		h.wake(id)
	}
	for id := range h.deltas {
		h.wake(id) // a second signal to a tail just signalled coalesces
	}
}

func (h *Hub) wake(executionID string) {
	for t := range h.tails[executionID] {
		select {
		case t.C <- struct{}{}:
		default:
		}
	}
	// A terminal execution's delta consumers end too; they wake on the same
	// news and check the status themselves.
	for d := range h.deltas[executionID] {
		select {
		case d.Wake <- struct{}{}:
		default:
		}
	}
}

// DeltaSub is a consumer of one execution's live deltas.
type DeltaSub struct {
	C    chan Delta
	Wake chan struct{}
	hub  *Hub
	id   string
}

// SubscribeDeltas registers a delta consumer for executionID.
func (h *Hub) SubscribeDeltas(executionID string) *DeltaSub {
	d := &DeltaSub{C: make(chan Delta, DeltaBuffer), Wake: make(chan struct{}, 1), hub: h, id: executionID}
	h.mu.Lock()
	defer h.mu.Unlock()
	set := h.deltas[executionID]
	if set == nil {
		set = map[*DeltaSub]struct{}{}
		h.deltas[executionID] = set
	}
	set[d] = struct{}{}
	return d
}

// Close unregisters the consumer.
func (d *DeltaSub) Close() {
	d.hub.mu.Lock()
	defer d.hub.mu.Unlock()
	if set := d.hub.deltas[d.id]; set != nil {
		delete(set, d)
		if len(set) == 0 {
			delete(d.hub.deltas, d.id)
		}
	}
}

// PublishDelta offers a delta to every consumer of executionID without
// blocking.
func (h *Hub) PublishDelta(executionID string, delta Delta) {
	h.mu.Lock()
	defer h.mu.Unlock()
	for d := range h.deltas[executionID] {
		select {
		case d.C <- delta:
		default:
		}
	}
}

// Counts reports open subscriptions, for tests of the memory bound.
func (h *Hub) Counts() (tails, deltas int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.tails), len(h.deltas)
}
