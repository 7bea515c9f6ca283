// Package dispatch delivers webhooks to agents. It claims due dispatches the
// moment the kernel enqueues them (no polling delay), delivers each on its own
// goroutine so a slow agent never delays another, records the outcome, and
// reclaims leases that expire.
package dispatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// pollInterval is the fallback for missed wake-ups (§8.1: at least once a second).
const pollInterval = time.Second

// Dispatcher runs the delivery loop.
type Dispatcher struct {
	k           *kernel.Kernel
	client      *http.Client
	concurrency int
	timeout     time.Duration
	version     string
	log         *slog.Logger

	mu        sync.Mutex
	inFlight  map[string]bool // dispatch ids being delivered by this replica
	sem       chan struct{}
	lastDepth time.Time
}

// New returns a dispatcher for k.
func New(k *kernel.Kernel, concurrency int, timeout time.Duration, version string, log *slog.Logger) *Dispatcher {
	transport := http.DefaultTransport.(*http.Transport).Clone()
	transport.MaxIdleConnsPerHost = concurrency
	return &Dispatcher{
		k: k,
		client: &http.Client{
			Transport: transport,
			// A redirect is a failed attempt (§8.3).
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse },
		},
		concurrency: concurrency,
		timeout:     timeout,
		version:     version,
		log:         log,
		inFlight:    map[string]bool{},
		sem:         make(chan struct{}, concurrency),
	}
}

// Run delivers until ctx ends. In-flight deliveries are abandoned on return:
// their leases expire and they are redelivered.
func (d *Dispatcher) Run(ctx context.Context) {
	c := d.k.Clock()
	for ctx.Err() == nil {
		d.reclaim(ctx)
		d.claimDue(ctx)
		d.observeQueue(ctx)
		next, err := d.k.Store().Read().NextWake(ctx)
		if err != nil && ctx.Err() == nil {
			d.workerError(err)
		}
		clock.Wait(c, next, pollInterval, d.k.DispatchWake(), ctx.Done())
	}
}

func (d *Dispatcher) reclaim(ctx context.Context) {
	refs, err := d.k.Store().Read().ExpiredLeases(ctx, d.k.Clock().Now(), 100)
	if err != nil {
		if ctx.Err() == nil {
			d.workerError(err)
		}
		return
	}
	for _, ref := range refs {
		if err := d.k.ReclaimLease(ctx, ref); err != nil && ctx.Err() == nil {
			d.workerError(err)
		}
	}
}

func (d *Dispatcher) claimDue(ctx context.Context) {
	free := d.concurrency - len(d.sem)
	if free <= 0 {
		return
	}
	refs, err := d.k.Store().Read().DueDispatches(ctx, d.k.Clock().Now(), free)
	if err != nil {
		if ctx.Err() == nil {
			d.workerError(err)
		}
		return
	}
	var wg sync.WaitGroup
	for _, ref := range refs {
		if !d.reserve(ref.ID) {
			continue
		}
		wg.Add(1)
		// Claims run concurrently so that they share a group commit.
		go func(ref store.DispatchRef) {
			defer wg.Done()
			del, err := d.k.ClaimDispatch(ctx, ref)
			if err != nil || del == nil {
				if err != nil && ctx.Err() == nil {
					d.workerError(err)
				}
				d.release(ref.ID)
				return
			}
			go d.deliver(ctx, del)
		}(ref)
	}
	wg.Wait()
}

func (d *Dispatcher) reserve(id string) bool {
	d.mu.Lock()
	defer d.mu.Unlock()
	if d.inFlight[id] {
		return false
	}
	select {
	case d.sem <- struct{}{}:
	default:
		return false
	}
	d.inFlight[id] = true
	return true
}

func (d *Dispatcher) release(id string) {
	d.mu.Lock()
	delete(d.inFlight, id)
	d.mu.Unlock()
	<-d.sem
	// Capacity is free again: due work that did not fit may now be claimed.
	d.k.WakeDispatcher()
}

func (d *Dispatcher) deliver(ctx context.Context, del *kernel.Delivery) {
	defer d.release(del.DispatchID)
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

// Body is the exact webhook body of §8.3: fixed key order, no whitespace.
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
		return kernel.DeliveryOutcome{Error: "bad webhook url: " + err.Error()}
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
		msg := err.Error()
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
	n, err := d.k.Store().Read().QueueDepth(ctx, d.k.Clock().Now())
	if err == nil {
		d.k.Metrics().QueueDepth.Set(float64(n))
	}
}

func (d *Dispatcher) workerError(err error) {
	d.log.Error("dispatcher failed", slog.Any("error", err))
	d.k.Metrics().WorkerErrors.WithLabelValues("dispatcher").Inc()
}
