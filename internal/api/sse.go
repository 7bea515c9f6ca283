package api

import (
	"fmt"
	"net/http"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

const (
	keepAlive    = 15 * time.Second
	writeTimeout = 30 * time.Second
)

// sseWriter writes frames with a per-write deadline: a client that does not
// read for 30 s is disconnected (docs/protocol/events.md §4) and resumes with Last-Event-ID.
type sseWriter struct {
	w  http.ResponseWriter
	rc *http.ResponseController
}

func (s *sseWriter) write(b []byte) error {
	s.rc.SetWriteDeadline(time.Now().Add(writeTimeout))
	if _, err := s.w.Write(b); err != nil {
		return err
	}
	return s.rc.Flush()
}

// openStream counts the connection against --max-streams and writes the
// stream headers.
func (c *call) openStream(kind string) (*sseWriter, func(), error) {
	if c.s.streams.Add(1) > c.s.opt.MaxStreams {
		c.s.streams.Add(-1)
		return nil, nil, &kernel.Error{Code: wire.CodeUnavailable, Message: "unavailable: stream connection limit reached"}
	}
	gauge := c.s.k.Metrics().StreamConnections.WithLabelValues(kind)
	gauge.Inc()
	done := func() {
		gauge.Dec()
		c.s.streams.Add(-1)
	}
	h := c.w.Header()
	h.Set("Content-Type", "text/event-stream")
	h.Set("Cache-Control", "no-cache")
	h.Set("Connection", "keep-alive")
	h.Set("X-Accel-Buffering", "no")
	c.w.WriteHeader(http.StatusOK)
	c.status = http.StatusOK
	sw := &sseWriter{w: c.w, rc: http.NewResponseController(c.w)}
	// A comment line opens the body at once: Firefox's EventSource reports the
	// stream open only when the first body bytes arrive, not the headers, and
	// would otherwise say "connecting" until the first event or keep-alive.
	if err := sw.write([]byte(": open\n\n")); err != nil {
		done()
		return nil, nil, nil
	}
	return sw, done, nil
}

// handleEventStream tails an execution's log (docs/protocol/events.md §4). The store is the source
// of truth: commits only wake the stream, which then reads what is new.
func handleEventStream(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	resume, err := c.resumePoint()
	if err != nil {
		return err
	}
	k := c.s.k
	// Subscribe before the first read so that no commit is missed.
	tail := k.SubscribeTail(id)
	defer tail.Close()
	e, err := k.GetExecution(c.ctx(), c.caller, id)
	if err != nil {
		return err
	}
	if wire.ExecTerminal(e.Status) && resume >= e.LastSeq {
		c.noContent()
		return nil
	}
	sw, done, err := c.openStream("events")
	if err != nil || sw == nil {
		return err
	}
	defer done()
	cursor := resume
	idle := time.NewTimer(keepAlive)
	defer idle.Stop()
	for {
		for {
			evs, err := k.StreamEvents(c.ctx(), id, cursor, wire.MaxEventsLimit)
			if err != nil {
				return nil
			}
			for _, ev := range evs {
				frame := fmt.Appendf(nil, "id: %d\ndata: ", ev.Seq)
				frame = append(frame, oneLine(renderEvent(ev).Bytes())...)
				frame = append(frame, '\n', '\n')
				if sw.write(frame) != nil {
					return nil
				}
				cursor = ev.Seq
			}
			if len(evs) < wire.MaxEventsLimit {
				break
			}
		}
		e, err := k.StreamHead(c.ctx(), id)
		if err != nil {
			return nil
		}
		if wire.ExecTerminal(e.Status) && cursor >= e.LastSeq {
			end := (&jsonx.Object{}).String("execution_id", id).String("status", e.Status).Bytes()
			sw.write(append(append([]byte("event: end\ndata: "), end...), '\n', '\n'))
			return nil
		}
		idle.Reset(keepAlive)
		select {
		case <-tail.C:
		case <-idle.C:
			if sw.write([]byte(": keep-alive\n\n")) != nil {
				return nil
			}
		case <-c.ctx().Done():
			return nil
		case <-c.s.shutdown:
			return nil
		}
	}
}

// oneLine keeps an event on one `data:` line (docs/protocol/events.md §4). Verbatim user JSON may
// hold line breaks, which in valid JSON are only ever insignificant
// whitespace: turning them into spaces leaves the same value.
func oneLine(b []byte) []byte {
	for i, c := range b {
		if c == '\n' || c == '\r' {
			b[i] = ' '
		}
	}
	return b
}

// resumePoint reads Last-Event-ID, else after_seq, else 0 (docs/protocol/events.md §4).
func (c *call) resumePoint() (int64, error) {
	if vals := c.r.Header.Values(wire.HeaderLastEventID); len(vals) > 0 {
		if len(vals) > 1 {
			return 0, invalid(wire.HeaderLastEventID, "Last-Event-ID is repeated")
		}
		n, err := parseInt(wire.HeaderLastEventID, vals[0])
		if err != nil || n < 0 {
			return 0, invalid(wire.HeaderLastEventID, "Last-Event-ID must be a non-negative integer")
		}
		return n, nil
	}
	n, _, err := c.queryInt("after_seq")
	return n, err
}

// handleDeltaStream relays live deltas of an execution's running steps (docs/protocol/events.md §5).
func handleDeltaStream(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	k := c.s.k
	sub := k.SubscribeDeltas(id)
	defer sub.Close()
	e, err := k.GetExecution(c.ctx(), c.caller, id)
	if err != nil {
		return err
	}
	if wire.ExecTerminal(e.Status) {
		c.noContent()
		return nil
	}
	sw, done, err := c.openStream("deltas")
	if err != nil || sw == nil {
		return err
	}
	defer done()
	idle := time.NewTimer(keepAlive)
	defer idle.Stop()
	for {
		idle.Reset(keepAlive)
		select {
		case d := <-sub.C:
			frame := append([]byte("data: "), (&jsonx.Object{}).String("step_id", d.StepID).Int("seq", d.Seq).String("data", d.Data).Bytes()...)
			if sw.write(append(frame, '\n', '\n')) != nil {
				return nil
			}
		case <-sub.Wake:
			e, err := k.StreamHead(c.ctx(), id)
			if err != nil || wire.ExecTerminal(e.Status) {
				return nil
			}
		case <-idle.C:
			if sw.write([]byte(": keep-alive\n\n")) != nil {
				return nil
			}
		case <-c.ctx().Done():
			return nil
		case <-c.s.shutdown:
			return nil
		}
	}
}
