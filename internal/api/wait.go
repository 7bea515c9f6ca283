package api

import (
	"math"
	"net/http"
	"regexp"
	"strconv"
	"time"

	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

// Waiting requests (docs/protocol/executions.md §3.1): a read or a create with
// wait= is held until the execution is terminal or the wait has passed, then
// answered with the execution as it is. Each held request counts against
// --max-waits, so that waiters cannot exhaust the process.

// waitedRouteSuffix is appended to the route label of a waiting request in
// logs and metrics, so that held requests do not blur the route's latency.
const waitedRouteSuffix = "?wait"

// statusClientGone is recorded, never sent, for a waiting request whose
// client went away (nginx's "client closed request").
const statusClientGone = 499

// waitSeconds is the seconds form of wait=: digits, optionally a fraction.
var waitSeconds = regexp.MustCompile(`^[0-9]+(\.[0-9]+)?$`)

var errWaitSyntax = invalid("wait", "wait must be a duration such as 30s or 1m, or a number of seconds")

// waitParam reads wait=: a Go duration ("30s", "1m", "250ms") or a number of
// seconds ("30", "0.5"). Absent, empty or zero means no wait; a negative,
// malformed or out-of-range value is 400. A wait beyond kernel.MaxWait is
// cut to it.
func (c *call) waitParam() (time.Duration, error) {
	s, err := c.query("wait")
	if err != nil || s == "" {
		return 0, err
	}
	var d time.Duration
	if waitSeconds.MatchString(s) {
		// Like a Go duration, a number of seconds must fit in 64 bits of
		// nanoseconds (about 292 years).
		secs, err := strconv.ParseFloat(s, 64)
		if err != nil || secs >= math.MaxInt64/float64(time.Second) {
			return 0, errWaitSyntax
		}
		d = time.Duration(secs * float64(time.Second))
	} else if d, err = time.ParseDuration(s); err != nil {
		return 0, errWaitSyntax
	} else if d < 0 {
		return 0, invalid("wait", "wait must not be negative")
	}
	d = min(d, kernel.MaxWait)
	c.waited = d > 0
	return d, nil
}

// holdWait counts a waiting request against --max-waits, refusing it with
// 503 beyond the bound; release gives its place back.
func (c *call) holdWait() (release func(), err error) {
	if c.s.waits.Add(1) > c.s.opt.MaxWaits {
		c.s.waits.Add(-1)
		return nil, &kernel.Error{Code: wire.CodeUnavailable, Message: "unavailable: waiting request limit reached"}
	}
	gauge := c.s.k.Metrics().WaitingReads
	gauge.Inc()
	return func() {
		gauge.Dec()
		c.s.waits.Add(-1)
	}, nil
}

// answerWhenEnded holds the request until execution id is terminal, wait
// has passed or the kernel drains, then answers status with the execution
// as it is. A client that went away gets nothing, and nothing more is read.
func (c *call) answerWhenEnded(id string, wait time.Duration, status int) error {
	e, err := c.s.k.AwaitExecution(c.ctx(), c.caller, id, wait, c.s.shutdown)
	if c.ctx().Err() != nil {
		c.status = statusClientGone
		return nil
	}
	if err != nil {
		return err
	}
	// The write deadline ran from the request's arrival; the answer gets
	// the whole of its own.
	http.NewResponseController(c.w).SetWriteDeadline(time.Now().Add(answerWriteTimeout))
	c.writeJSON(status, renderExecution(e).Bytes())
	return nil
}
