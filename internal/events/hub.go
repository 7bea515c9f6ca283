// Package events fans out news to HTTP requests waiting on this replica:
// "an execution's log grew" (the SSE tail then reads the store, which stays
// the source of truth), "an execution ended" (a waiting read then reads it)
// and live step deltas, which are never stored.
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
	tails  signalSets
	ends   signalSets
	deltas map[string]map[*DeltaSub]struct{}
}

// signalSets holds the Tails of each execution for one kind of news.
type signalSets map[string]map[*Tail]struct{}

// NewHub returns an empty hub.
func NewHub() *Hub {
	return &Hub{tails: signalSets{}, ends: signalSets{}, deltas: map[string]map[*DeltaSub]struct{}{}}
}

// Tail is a subscription to one kind of news about one execution: the
// growth of its log (SubscribeTail) or its end (SubscribeEnd).
type Tail struct {
	// C receives a value when the news may have happened. It holds at most
	// one pending signal: several commits before the reader wakes coalesce.
	C    chan struct{}
	hub  *Hub
	sets signalSets
	id   string
}

// SubscribeTail registers interest in executionID's log.
func (h *Hub) SubscribeTail(executionID string) *Tail { return h.subscribe(h.tails, executionID) }

// SubscribeEnd registers interest in executionID becoming terminal.
func (h *Hub) SubscribeEnd(executionID string) *Tail { return h.subscribe(h.ends, executionID) }

func (h *Hub) subscribe(sets signalSets, executionID string) *Tail {
	t := &Tail{C: make(chan struct{}, 1), hub: h, sets: sets, id: executionID}
	h.mu.Lock()
	defer h.mu.Unlock()
	set := sets[executionID]
	if set == nil {
		set = map[*Tail]struct{}{}
		sets[executionID] = set
	}
	set[t] = struct{}{}
	return t
}

// Close unregisters the subscription.
func (t *Tail) Close() {
	t.hub.mu.Lock()
	defer t.hub.mu.Unlock()
	if set := t.sets[t.id]; set != nil {
		delete(set, t)
		if len(set) == 0 {
			delete(t.sets, t.id)
		}
	}
}

// allExecutions keys the tails that follow every execution; no execution
// id (a UUID) can take it.
const allExecutions = "*"

// SubscribeAll registers interest in the growth of every execution's log.
func (h *Hub) SubscribeAll() *Tail { return h.SubscribeTail(allExecutions) }

// signal wakes every Tail of executionID in sets; the caller holds h.mu.
func (sets signalSets) signal(executionID string) {
	for t := range sets[executionID] {
		select {
		case t.C <- struct{}{}:
		default:
		}
	}
}

// NotifyEnd signals every end subscription of executionID that it may
// have become terminal.
func (h *Hub) NotifyEnd(executionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.ends.signal(executionID)
}

// Notify signals every tail of executionID, and every tail of all
// executions, that its log grew.
func (h *Hub) Notify(executionID string) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.wake(executionID)
}

// NotifyAll signals every subscription of every execution (tails, ends and
// delta consumers), for when news may have been lost: each re-reads the
// store.
func (h *Hub) NotifyAll() {
	h.mu.Lock()
	defer h.mu.Unlock()
	for id := range h.tails {
		h.wake(id)
	}
	for id := range h.ends {
		h.ends.signal(id)
	}
	for id := range h.deltas {
		h.wake(id) // a second signal to a tail just signalled coalesces
	}
}

// wake signals the tails of executionID and of all executions, and its
// delta consumers; the caller holds h.mu.
func (h *Hub) wake(executionID string) {
	h.tails.signal(executionID)
	h.tails.signal(allExecutions)
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

// Counts reports the executions with open subscriptions of each kind, for
// tests of the memory bound.
func (h *Hub) Counts() (tails, ends, deltas int) {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.tails), len(h.ends), len(h.deltas)
}
