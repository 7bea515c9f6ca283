package cli

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/rebuno/rebuno/internal/wire"
)

// stepCache reads an execution's steps: all at once the first time one is
// needed, then one by one for steps recorded since or not yet terminal.
type stepCache struct {
	ctx    context.Context
	c      *Client
	execID string
	loaded bool
	m      map[string]*Step
}

func newStepCache(ctx context.Context, c *Client, execID string) *stepCache {
	return &stepCache{ctx: ctx, c: c, execID: execID, m: map[string]*Step{}}
}

func stepTerminal(status string) bool { return wire.StepTerminal(status) }

func (s *stepCache) get(id string, fresh bool) *Step {
	if !s.loaded {
		s.loaded = true
		var all []Step
		if _, err := s.c.GetJSON(s.ctx, "/v0/executions/"+s.execID+"/steps", &all); err == nil {
			for i := range all {
				s.m[all[i].StepID] = &all[i]
			}
			// The bulk read is at least as fresh as the caller needs.
			if st, ok := s.m[id]; ok {
				return st
			}
		}
	}
	if st, ok := s.m[id]; ok && (!fresh || stepTerminal(st.Status)) {
		return st
	}
	var st Step
	if _, err := s.c.GetJSON(s.ctx, "/v0/executions/"+s.execID+"/steps/"+id, &st); err != nil {
		return s.m[id]
	}
	s.m[id] = &st
	return &st
}

// followOptions tune the reconnecting SSE reader.
type followOptions struct {
	// ReconnectFor is how long the kernel may stay unreachable before
	// giving up (0: forever).
	ReconnectFor time.Duration
	// Idle is how long a silent connection is trusted (the kernel sends a
	// keep-alive every 15 s).
	Idle time.Duration
}

// follow tails the event log of id after seq `after` (docs/protocol/events.md §4) and calls onEvent
// for every event exactly once, in order, until the execution ends. When the
// connection drops — the kernel restarted, say — it reconnects with
// Last-Event-ID, backing off while the kernel is down, and fills any gap from
// the events route, so no event is lost or repeated. It returns the
// execution's final status.
func (a *App) follow(ctx context.Context, c *Client, id string, after int64, opt followOptions,
	onEvent func(ev Event, raw []byte)) (string, error) {
	last := after
	deliver := func(ev Event, raw []byte) {
		if ev.Seq <= last {
			return
		}
		last = ev.Seq
		onEvent(ev, raw)
	}
	// fill reads missed events [last+1, upTo) from the events route.
	fill := func(upTo int64) error {
		for last < upTo-1 {
			var page []json.RawMessage
			if _, err := c.GetJSON(ctx, fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", id, last), &page); err != nil {
				return err
			}
			if len(page) == 0 {
				return nil
			}
			for _, raw := range page {
				var ev Event
				if json.Unmarshal(raw, &ev) != nil || ev.Seq >= upTo {
					return nil
				}
				deliver(ev, raw)
			}
		}
		return nil
	}

	backoff := 100 * time.Millisecond
	var downSince time.Time
	announced := false
	for {
		if ctx.Err() != nil {
			return "", ErrInterrupted
		}
		h := http.Header{}
		path := "/v0/executions/" + id + "/events/stream"
		if last > 0 {
			h.Set(wire.HeaderLastEventID, strconv.FormatInt(last, 10))
		}
		resp, err := c.Stream(ctx, path, h)
		if err == nil && resp.StatusCode == http.StatusNoContent {
			resp.Body.Close()
			// Terminal and nothing after `last`: the end frame was lost
			// with the previous connection.
			var e Execution
			if _, err := c.GetJSON(ctx, "/v0/executions/"+id, &e); err != nil {
				return "", err
			}
			if announced {
				a.errf("reconnected; nothing was missed\n")
			}
			return e.Status, nil
		}
		if err == nil {
			if announced {
				a.errf("reconnected; resuming after event %d\n", last)
				announced = false
			}
			downSince = time.Time{}
			backoff = 100 * time.Millisecond
			var status string
			var ended bool
			status, ended, err = a.readStream(ctx, resp, opt.Idle, func(ev Event, raw []byte) error {
				if ev.Seq > last+1 {
					if err := fill(ev.Seq); err != nil {
						return err
					}
				}
				deliver(ev, raw)
				return nil
			})
			resp.Body.Close()
			if ended {
				// Nothing can follow the end frame (docs/protocol/executions.md §9); read the log once
				// more in case a frame was unreadable.
				if err := fill(math.MaxInt64); err != nil {
					return "", err
				}
				return status, nil
			}
			if err == nil {
				err = &UnreachableError{URL: c.Base, Cause: "the event stream closed before the execution ended"}
			}
		}
		if errors.Is(err, ErrInterrupted) || ctx.Err() != nil {
			return "", ErrInterrupted
		}
		if !retryable(err) {
			return "", err
		}
		if downSince.IsZero() {
			downSince = time.Now()
		}
		if opt.ReconnectFor > 0 && time.Since(downSince) > opt.ReconnectFor {
			return "", err
		}
		if !announced {
			a.errf("lost the event stream (%s); reconnecting…\n", shortCause(err))
			announced = true
		}
		select {
		case <-ctx.Done():
			return "", ErrInterrupted
		case <-time.After(backoff):
		}
		backoff = min(backoff*2, 2*time.Second)
	}
}

func retryable(err error) bool {
	var ne *UnreachableError
	var ae *APIError
	if errors.As(err, &ne) {
		return true
	}
	return errors.As(err, &ae) && (ae.Code == wire.CodeUnavailable || ae.Status >= 502 && ae.Status <= 504)
}

func shortCause(err error) string {
	var ne *UnreachableError
	if errors.As(err, &ne) {
		return ne.Cause
	}
	return err.Error()
}

// readStream reads SSE frames until the end frame (ended = true), the
// connection fails, or the connection stays silent longer than idle.
func (a *App) readStream(ctx context.Context, resp *http.Response, idle time.Duration,
	onEvent func(Event, []byte) error) (status string, ended bool, err error) {
	if idle <= 0 {
		idle = 45 * time.Second
	}
	var mu sync.Mutex
	timedOut := false
	watchdog := time.AfterFunc(idle, func() {
		mu.Lock()
		timedOut = true
		mu.Unlock()
		resp.Body.Close()
	})
	defer watchdog.Stop()

	sc := bufio.NewScanner(resp.Body)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	var evType string
	var data strings.Builder
	for sc.Scan() {
		watchdog.Reset(idle)
		line := sc.Text()
		switch {
		case line == "":
			if data.Len() == 0 {
				evType = ""
				continue
			}
			raw := []byte(data.String())
			data.Reset()
			if evType == "end" {
				var end struct {
					Status string `json:"status"`
				}
				json.Unmarshal(raw, &end)
				return end.Status, true, nil
			}
			evType = ""
			var ev Event
			if json.Unmarshal(raw, &ev) != nil {
				continue
			}
			if err := onEvent(ev, raw); err != nil {
				return "", false, err
			}
		case strings.HasPrefix(line, ":"):
		case strings.HasPrefix(line, "event:"):
			evType = strings.TrimSpace(strings.TrimPrefix(line, "event:"))
		case strings.HasPrefix(line, "data:"):
			if data.Len() > 0 {
				data.WriteByte('\n')
			}
			data.WriteString(strings.TrimPrefix(strings.TrimPrefix(line, "data:"), " "))
		}
	}
	if ctx.Err() != nil {
		return "", false, ErrInterrupted
	}
	mu.Lock()
	defer mu.Unlock()
	cause := "the connection was closed"
	if timedOut {
		cause = fmt.Sprintf("no data for %s", idle)
	} else if e := sc.Err(); e != nil {
		cause = e.Error()
	}
	return "", false, &UnreachableError{URL: "", Cause: cause}
}
