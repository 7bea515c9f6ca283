// Package dispatch delivers webhooks to agents. It claims due dispatches the
// moment the kernel enqueues them (no polling delay), delivers each on its own
// goroutine so a slow agent never delays another, and records the outcome.
//
// Capacity is shared fairly: at most Limits.Total deliveries run at once and
// at most Limits.PerAgent of them for any one agent, so an agent whose webhook
// hangs, crawls or fails can fill its own share and never another agent's.
// And however many agents misbehave, an agent with no delivery in flight may
// always start one, beyond the total if need be: a newcomer is never queued
// behind the others. When due work waits only for capacity, the dispatcher
// sleeps until a delivery ends or new work falls due; it never spins.
package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// pollInterval is the fallback for missed wake-ups (docs/protocol/dispatch.md §2: at least once a second).
const pollInterval = time.Second

// lockedRetry is how soon a claim that found its execution locked by another
// transaction (another process claiming it, or an agent request) is tried
// again.
const lockedRetry = 5 * time.Millisecond

// Limits bound concurrent deliveries.
type Limits struct {
	Total    int // across all agents (--dispatch-concurrency)
	PerAgent int // for any one agent (--dispatch-agent-concurrency)
}

// Dispatcher runs the delivery loop.
type Dispatcher struct {
	k       *kernel.Kernel
	client  *http.Client
	limits  Limits
	timeout time.Duration
	version string
	log     *slog.Logger

	mu        sync.Mutex
	inFlight  map[string]bool // dispatch ids being delivered by this process
	byAgent   map[string]int  // deliveries in flight per agent
	lastDepth time.Time
	rounds    atomic.Int64 // loop rounds, for the test that the loop does not spin
}

// New returns a dispatcher for k.
func New(k *kernel.Kernel, limits Limits, timeout time.Duration, version string, log *slog.Logger) *Dispatcher {
	limits.PerAgent = max(1, min(limits.PerAgent, limits.Total))
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = limits.PerAgent
	return &Dispatcher{
		k: k,
		client: &http.Client{
			Transport: transport,
			// A redirect is a failed attempt (docs/protocol/dispatch.md §4).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		limits:   limits,
		timeout:  timeout,
		version:  version,
		log:      log,
		inFlight: map[string]bool{},
		byAgent:  map[string]int{},
	}
}

// Run delivers until ctx ends. In-flight deliveries are abandoned on return:
// their leases expire and they are redelivered.
func (d *Dispatcher) Run(ctx context.Context) {
	c := d.k.Clock()
	idle := 0 // rounds in a row that found due work and claimed none of it
	for ctx.Err() == nil {
		d.rounds.Add(1)
		claimed, locked := d.claimDue(ctx)
		d.observeQueue(ctx)
		next := d.nextClaimable(ctx)
		switch {
		case locked:
			next = c.Now().Add(lockedRetry)
		case claimed > 0 || next.After(c.Now()):
			idle = 0
		default:
			// Work due, none of it claimed. Once is normal: work can fall
			// due (or the test clock move) between the claim and the look at
			// what comes next, so look again at once. Twice in a row means
			// it is not ours to take (another process takes it between the
			// query and the claim): wait for news rather than spin.
			if idle++; idle > 1 {
				next = time.Time{}
			}
		}
		clock.Wait(c, next, pollInterval, d.k.DispatchWake(), ctx.Done())
	}
}

// newcomerBatch bounds how many agents with nothing in flight a full
// dispatcher takes work from in one round.
const newcomerBatch = 16

// capacity is how many deliveries may start now and which agents may not
// start one: those at their share, or, when the total is reached, every agent
// with a delivery in flight.
func (d *Dispatcher) capacity() (free int, skip []string) {
	d.mu.Lock()
	defer d.mu.Unlock()
	free = d.limits.Total - len(d.inFlight)
	for agent, n := range d.byAgent {
		if n >= d.limits.PerAgent || free <= 0 {
			skip = append(skip, agent)
		}
	}
	slices.Sort(skip)
	if free <= 0 {
		free = newcomerBatch
	}
	return free, skip
}

// nextClaimable is when the next dispatch this process could take falls due.
func (d *Dispatcher) nextClaimable(ctx context.Context) time.Time {
	_, skip := d.capacity()
	next, err := d.k.NextDue(ctx, skip)
	if err != nil && ctx.Err() == nil {
		d.workerError(err)
	}
	return next
}

// claimDue claims what is due, as far as capacity allows, and starts each
// delivery. It reports how many it claimed and whether a claim found its
// execution locked.
func (d *Dispatcher) claimDue(ctx context.Context) (claimed int, locked bool) {
	free, skip := d.capacity()
	refs, err := d.k.DueDispatches(ctx, free, skip)
	if err != nil {
		if ctx.Err() == nil {
			d.workerError(err)
		}
		return 0, false
	}
	var (
		wg sync.WaitGroup
		mu sync.Mutex
	)
	for _, ref := range refs {
		if !d.reserve(ref) {
			continue
		}
		wg.Add(1)
		// Claims run concurrently so that they share a group commit.
		go func(ref store.DispatchRef) {
			defer wg.Done()
			del, err := d.k.ClaimDispatch(ctx, ref)
			if err != nil || del == nil {
				if errors.Is(err, store.ErrLocked) {
					mu.Lock()
					locked = true
					mu.Unlock()
				} else if err != nil && ctx.Err() == nil {
					d.workerError(err)
				}
				d.release(ref)
				return
			}
			mu.Lock()
			claimed++
			mu.Unlock()
			go d.deliver(ctx, ref, del)
		}(ref)
	}
	wg.Wait()
	return claimed, locked
}

// reserve takes a delivery slot for ref, within the total and its agent's
// share; past the total, only an agent with nothing in flight gets one.
func (d *Dispatcher) reserve(ref store.DispatchRef) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	n := d.byAgent[ref.AgentID]
	if d.inFlight[ref.ID] || n >= d.limits.PerAgent || (len(d.inFlight) >= d.limits.Total && n > 0) {
		return false
	}
	d.inFlight[ref.ID] = true
	d.byAgent[ref.AgentID]++
	return true
}

func (d *Dispatcher) release(ref store.DispatchRef) {
	d.mu.Lock()
	delete(d.inFlight, ref.ID)
	if d.byAgent[ref.AgentID]--; d.byAgent[ref.AgentID] <= 0 {
		delete(d.byAgent, ref.AgentID)
	}
	d.mu.Unlock()
	// Capacity is free again: due work that did not fit may now be claimed.
	d.k.WakeDispatcher()
}

func (d *Dispatcher) deliver(ctx context.Context, ref store.DispatchRef, del *kernel.Delivery) {
	defer d.release(ref)
	out := d.post(ctx, del)
	if ctx.Err() != nil {
		return
	}
	if out.Acked {
		d.k.Metrics().DispatchLatency.Observe(d.k.Clock().Now().Sub(del.DueAt).Seconds())
	} else {
		d.log.Warn("webhook delivery failed", slog.String("execution_id", del.ExecutionID),
			slog.String("dispatch_id", del.DispatchID), slog.Int64("attempt", del.Attempt),
			slog.Int("http_status", out.HTTPStatus), slog.String("error", out.Error))
	}
	if err := d.k.RecordDelivery(ctx, del, out); err != nil && ctx.Err() == nil {
		d.workerError(err)
	}
}

// Body is the exact webhook body of docs/protocol/dispatch.md §4: fixed key order, no whitespace.
func Body(del *kernel.Delivery) []byte {
	return fmt.Appendf(nil, `{"execution_id":"%s","dispatch_id":"%s","dispatch_attempt":%d,"lease_timeout_seconds":%d}`,
		del.ExecutionID, del.DispatchID, del.Attempt, del.LeaseTimeout)
}

func (d *Dispatcher) post(ctx context.Context, del *kernel.Delivery) kernel.DeliveryOutcome {
	ctx, cancel := context.WithTimeout(ctx, d.timeout)
	defer cancel()
	body := Body(del)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, del.WebhookURL, bytes.NewReader(body))
	if err != nil {
		return kernel.DeliveryOutcome{Error: "bad webhook url"}
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("User-Agent", "rebuno-kernel/"+d.version)
	req.Header.Set(wire.HeaderSignature, auth.SignBody([]byte(del.Secret), body))
	req.Header.Set(wire.HeaderAgentID, del.AgentID)
	req.Header.Set(wire.HeaderExecutionID, del.ExecutionID)
	req.Header.Set(wire.HeaderDispatchID, del.DispatchID)
	req.Header.Set(wire.HeaderDispatchAttempt, strconv.FormatInt(del.Attempt, 10))
	resp, err := d.client.Do(req)
	if err != nil {
		// The client's error names the URL, which may carry credentials;
		// the event only needs what went wrong.
		msg := err.Error()
		var ue *url.Error
		if errors.As(err, &ue) {
			msg = ue.Err.Error()
		}
		if errors.Is(err, context.DeadlineExceeded) {
			msg = "timeout after " + d.timeout.String()
		}
		return kernel.DeliveryOutcome{Error: msg}
	}
	// Drain a bounded part of the body within the same deadline so the
	// connection can be reused; the content is ignored.
	io.Copy(io.Discard, io.LimitReader(resp.Body, wire.MaxWebhookReadBytes))
	resp.Body.Close()
	if resp.StatusCode >= 200 && resp.StatusCode < 300 {
		return kernel.DeliveryOutcome{Acked: true, HTTPStatus: resp.StatusCode}
	}
	out := kernel.DeliveryOutcome{HTTPStatus: resp.StatusCode, Error: "webhook answered " + resp.Status}
	if s, err := strconv.Atoi(resp.Header.Get(wire.HeaderRetryAfter)); err == nil && s > 0 {
		out.RetryAfter = time.Duration(s) * time.Second
	}
	return out
}

func (d *Dispatcher) observeQueue(ctx context.Context) {
	if time.Since(d.lastDepth) < time.Second {
		return
	}
	d.lastDepth = time.Now()
	n, err := d.k.QueueDepth(ctx)
	if err == nil {
		d.k.Metrics().QueueDepth.Set(float64(n))
	}
}

func (d *Dispatcher) workerError(err error) {
	d.log.Error("dispatcher failed", slog.Any("error", err))
	d.k.Metrics().WorkerErrors.WithLabelValues("dispatcher").Inc()
}
