package kernel

import (
	"context"
	"encoding/json"

	"github.com/rebuno/rebuno/internal/events"
	"github.com/rebuno/rebuno/internal/store"
)

// The stream routes (the SSE tail and the delta side channel, docs/protocol/events.md §4 and §5)
// subscribe here before their first read, so that no commit between that
// read and the subscription is missed, then read the store through the
// methods below each time they are woken. Wake-ups come from this process's
// commits and, through the store's notifier, from other processes'.

// SubscribeTail registers interest in the growth of an execution's log.
func (k *Kernel) SubscribeTail(executionID string) *events.Tail {
	return k.hub.SubscribeTail(executionID)
}

// SubscribeDeltas registers a consumer of an execution's live deltas.
func (k *Kernel) SubscribeDeltas(executionID string) *events.DeltaSub {
	return k.hub.SubscribeDeltas(executionID)
}

// Subscriptions counts the executions with open tails, waiting reads and
// delta consumers, for tests of the memory bound (docs/protocol/operations.md §2.3).
func (k *Kernel) Subscriptions() (tails, waits, deltas int) { return k.hub.Counts() }

// StreamEvents reads events after afterSeq for a stream whose caller was
// authorised when it opened (GetExecution): each page is its own short read.
func (k *Kernel) StreamEvents(ctx context.Context, executionID string, afterSeq int64, limit int) ([]*store.Event, error) {
	rd := k.store.Read()
	v, err := k.viewByID(ctx, rd, executionID)
	if err != nil {
		return nil, err
	}
	return k.readEvents(ctx, rd, v, executionID, afterSeq, limit)
}

// StreamHead reads the execution a stream follows (status and last seq), for
// a caller authorised when the stream opened.
func (k *Kernel) StreamHead(ctx context.Context, executionID string) (*store.Execution, error) {
	return k.store.Read().ExecutionHead(ctx, executionID)
}

// wireDelta is a delta as notifications carry it between processes.
type wireDelta struct {
	StepID string `json:"s"`
	Seq    int64  `json:"q"`
	Data   string `json:"d"`
}

func encodeDelta(d events.Delta) []byte {
	b, _ := json.Marshal(wireDelta{StepID: d.StepID, Seq: d.Seq, Data: d.Data})
	return b
}

func decodeDelta(b []byte) (events.Delta, bool) {
	var w wireDelta
	if err := json.Unmarshal(b, &w); err != nil {
		return events.Delta{}, false
	}
	return events.Delta{StepID: w.StepID, Seq: w.Seq, Data: w.Data}, true
}

// SubscribeExecutions registers interest in the growth of every execution's
// log, for the live execution list: news of which one is not kept, since
// the list is read again whole.
func (k *Kernel) SubscribeExecutions() *events.Tail { return k.hub.SubscribeAll() }
