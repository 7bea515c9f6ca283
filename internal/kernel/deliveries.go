package kernel

import (
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// An agent's last delivery is read from the logs, where every webhook
// outcome already is: no write on the delivery path keeps it. The search is
// bounded, so it answers for an agent that is working now, not for one whose
// last delivery is buried under thousands of newer events.
const (
	// deliveryExecutions is how many of the agent's newest executions are
	// searched.
	deliveryExecutions = 20
	// deliveryEvents is how many of each one's last events are read.
	deliveryEvents = 100
)

// DeliveryResult is the outcome of one webhook delivery as its event records it.
type DeliveryResult struct {
	ExecutionID string
	Seq         int64
	Type        string // dispatch.acked, dispatch.failed or dispatch.lease_expired
	Status      string // the event's status: acked, failed, pending or exhausted
	Attempt     int64
	HTTPStatus  int64  // 0 when no answer arrived or the event has none
	Error       string // dispatch.failed only
	At          time.Time
}

// LastDelivery finds the newest delivery outcome among the agent's newest
// executions (docs/protocol/governance.md §4.5); nil when none is recorded there.
func (k *Kernel) LastDelivery(ctx context.Context, agentID string) (*DeliveryResult, error) {
	if _, err := k.GetAgent(ctx, agentID); err != nil {
		return nil, err
	}
	rd := k.store.Read()
	execs, err := rd.ListExecutions(ctx, store.ExecutionFilter{AgentID: agentID, Limit: deliveryExecutions})
	if err != nil {
		return nil, fmt.Errorf("list executions: %w", err)
	}
	var last *DeliveryResult
	for _, e := range execs {
		evs, err := rd.Events(ctx, e.ID, max(0, e.LastSeq-deliveryEvents), deliveryEvents)
		if err != nil {
			return nil, fmt.Errorf("read events: %w", err)
		}
		for i := len(evs) - 1; i >= 0; i-- {
			d := deliveryOf(evs[i])
			if d == nil {
				continue
			}
			if last == nil || d.At.After(last.At) {
				last = d
			}
			break
		}
	}
	return last, nil
}

// deliveryOf reads a delivery outcome from an event; nil for other events.
func deliveryOf(ev *store.Event) *DeliveryResult {
	switch ev.Type {
	case wire.EventDispatchAcked, wire.EventDispatchFailed, wire.EventDispatchLeaseExpired:
	default:
		return nil
	}
	// The payload is the kernel's own (docs/protocol/events.md §2).
	var p struct {
		Status     string `json:"status"`
		Attempt    int64  `json:"attempt"`
		HTTPStatus int64  `json:"http_status"`
		Error      string `json:"error"`
	}
	_ = json.Unmarshal(ev.Payload, &p)
	return &DeliveryResult{ExecutionID: ev.ExecutionID, Seq: ev.Seq, Type: ev.Type, Status: p.Status, Attempt: p.Attempt,
		HTTPStatus: p.HTTPStatus, Error: p.Error, At: ev.OccurredAt}
}
