package sqlstore

import (
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store"
)

func runEvents(from, to int64) []*store.Event {
	var out []*store.Event
	for seq := from; seq <= to; seq++ {
		out = append(out, &store.Event{ExecutionID: "e", Seq: seq, Type: "step.proposed",
			Payload: fmt.Appendf(nil, `{"seq":%d}`, seq), OccurredAt: time.UnixMicro(1_700_000_000_000_000 + seq)})
	}
	return out
}

func decodeAll(t *testing.T, data []byte, first, after int64) ([]*store.Event, error) {
	t.Helper()
	var got []*store.Event
	err := decodeRun("e", first, data, after, func(ev *store.Event) bool { got = append(got, ev); return true })
	return got, err
}

func TestRunRoundTrip(t *testing.T) {
	evs := runEvents(7, 40)
	evs = append(evs, &store.Event{ExecutionID: "e", Seq: 1000, Type: "", Payload: []byte(`{}`)})
	data := encodeRun(evs)
	for _, after := range []int64{0, 6, 7, 20, 40, 999, 1000} {
		got, err := decodeAll(t, data, 7, after)
		if err != nil {
			t.Fatal(err)
		}
		var want []*store.Event
		for _, ev := range evs {
			if ev.Seq > after {
				want = append(want, ev)
			}
		}
		if len(got) != len(want) {
			t.Fatalf("after %d: %d events, want %d", after, len(got), len(want))
		}
		for i := range got {
			g, w := got[i], want[i]
			if g.Seq != w.Seq || g.Type != w.Type || string(g.Payload) != string(w.Payload) || !g.OccurredAt.Equal(fromTS(ts(w.OccurredAt))) {
				t.Fatalf("after %d, event %d: got %+v, want %+v", after, i, g, w)
			}
		}
	}
	// The callback stops the decoding.
	n := 0
	if err := decodeRun("e", 7, data, 0, func(*store.Event) bool { n++; return n < 3 }); err != nil || n != 3 {
		t.Fatalf("stopped after %d events (%v), want 3", n, err)
	}
}

func TestRunDamaged(t *testing.T) {
	data := encodeRun(runEvents(1, 5))
	// Every cut short of the end is refused or ends on an event boundary;
	// none panics.
	for cut := 0; cut < len(data); cut++ {
		got, err := decodeAll(t, data[:cut], 1, 0)
		if err != nil && !errors.Is(err, errRunDamaged) {
			t.Fatalf("cut at %d: %v", cut, err)
		}
		if err == nil && len(got) == 5 {
			t.Fatalf("cut at %d decoded every event", cut)
		}
	}
	if _, err := decodeAll(t, []byte{0}, 1, 0); !errors.Is(err, errRunDamaged) {
		t.Fatalf("a zero seq step: %v", err)
	}
	if _, err := decodeAll(t, []byte{1, 0, 0xff, 0xff, 0xff, 0xff, 0x0f}, 1, 0); !errors.Is(err, errRunDamaged) {
		t.Fatalf("a length past the end: %v", err)
	}
}
