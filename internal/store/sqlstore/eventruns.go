package sqlstore

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/rebuno/rebuno/internal/store"
)

// An execution's log is stored as runs: each append of its events (in
// increasing seq order, as the kernel's operations make them) is one row of
// at most runMaxEvents encoded events, not a row per event. A row costs
// several times the bytes it holds in index entries, bound values and driver
// calls: an operation's three or four events cost one row, a fork's copied
// log of tens of thousands a few hundred, and reading a log decodes runs
// instead of fetching rows (about three times faster). Runs are small enough
// that a page of events starting inside one decodes little it does not
// return. The events table keeps rows written before runs existed, and any
// append that is not one execution's in seq order.
const runMaxEvents = 256

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

// packable reports whether events go into runs: all of one execution, in
// increasing seq order.
func packable(events []*store.Event) bool {
	for i := 1; i < len(events); i++ {
		if events[i].ExecutionID != events[0].ExecutionID || events[i].Seq <= events[i-1].Seq {
			return false
		}
	}
	return len(events) > 0
}
