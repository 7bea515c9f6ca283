package sqlstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rebuno/rebuno/internal/store"
)

// An append of at least runMinEvents events of one execution, in increasing
// seq order, is stored as runs of at most runMaxEvents: one row per run
// instead of one per event. A fork copies tens of thousands of events in one
// transaction, and a row costs several times the bytes it holds in bound
// values, index work and driver calls; the everyday append of a few events
// stays a row each. Runs are small enough that a page of events starting
// inside one decodes little it does not return.
const (
	runMinEvents = 64
	runMaxEvents = 256
)

// encodeRun lays events out one after another: the seq as the step from the
// previous one (from first-1 for the first), occurred_at, then the type and
// the payload, each with its length.
func encodeRun(events []*store.Event) []byte {
	size := 0
	for _, ev := range events {
		size += 3*binary.MaxVarintLen64 + len(ev.Type) + len(ev.Payload)
	}
	b := make([]byte, 0, size)
	prev := events[0].Seq - 1
	for _, ev := range events {
		b = binary.AppendUvarint(b, uint64(ev.Seq-prev))
		b = binary.AppendVarint(b, ts(ev.OccurredAt))
		b = binary.AppendUvarint(b, uint64(len(ev.Type)))
		b = append(b, ev.Type...)
		b = binary.AppendUvarint(b, uint64(len(ev.Payload)))
		b = append(b, ev.Payload...)
		prev = ev.Seq
	}
	return b
}

var errRunDamaged = errors.New("damaged event run")

// decodeRun calls each for the events of a run with seq > after, in order,
// until it returns false.
func decodeRun(executionID string, first int64, data []byte, after int64, each func(*store.Event) bool) error {
	prev := first - 1
	for len(data) > 0 {
		step, n := binary.Uvarint(data)
		if n <= 0 || step == 0 {
			return fmt.Errorf("%w of %s at %d", errRunDamaged, executionID, first)
		}
		data = data[n:]
		at, n := binary.Varint(data)
		if n <= 0 {
			return fmt.Errorf("%w of %s at %d", errRunDamaged, executionID, first)
		}
		data = data[n:]
		typ, rest, ok := lengthPrefixed(data)
		if !ok {
			return fmt.Errorf("%w of %s at %d", errRunDamaged, executionID, first)
		}
		payload, rest, ok := lengthPrefixed(rest)
		if !ok {
			return fmt.Errorf("%w of %s at %d", errRunDamaged, executionID, first)
		}
		data = rest
		seq := prev + int64(step)
		prev = seq
		if seq <= after {
			continue
		}
		ev := &store.Event{ExecutionID: executionID, Seq: seq, Type: string(typ),
			Payload: append([]byte(nil), payload...), OccurredAt: fromTS(at)}
		if !each(ev) {
			return nil
		}
	}
	return nil
}

func lengthPrefixed(data []byte) (field, rest []byte, ok bool) {
	n, k := binary.Uvarint(data)
	if k <= 0 || n > uint64(len(data)-k) {
		return nil, nil, false
	}
	return data[k : k+int(n)], data[k+int(n):], true
}

// packable reports whether events go into runs: enough of them, of one
// execution, in increasing seq order.
func packable(events []*store.Event) bool {
	if len(events) < runMinEvents {
		return false
	}
	for i := 1; i < len(events); i++ {
		if events[i].ExecutionID != events[0].ExecutionID || events[i].Seq <= events[i-1].Seq {
			return false
		}
	}
	return true
}
