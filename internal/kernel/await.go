package kernel

import (
	"context"
	"time"

	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// MaxWait bounds one waiting read (docs/protocol/executions.md §3.1): a
// longer wait is cut to it, and a client that wants to wait longer asks
// again. It stays within the 60 s a plain answer may take to write
// (docs/protocol/http.md §9), which the HTTP layer renews after the wait.
const MaxWait = 60 * time.Second

// awaitRecheck is how often a waiting read re-reads an execution nothing
// woke it for: the notification of its end is best effort (store.Notifier),
// so this bounds how late a lost one can make the answer. A variable only
// so that tests can isolate the wake-up from the re-read.
var awaitRecheck = 5 * time.Second

// AwaitExecution reads an execution as soon as it is terminal, or as it is
// once wait (cut to MaxWait) has passed or stop is closed (docs/protocol/executions.md §3.1).
// It is woken by the commit that ends the execution, on this process or,
// through the store's notifier, on another one; it never polls the store
// but for the slow awaitRecheck. When ctx ends first (the client went
// away) it returns ctx's error and reads nothing more.
//
// The wait is wall-clock time, not the kernel's clock: it bounds how long a
// request is held, like any other timeout of the HTTP layer.
func (k *Kernel) AwaitExecution(ctx context.Context, c Caller, id string, wait time.Duration, stop <-chan struct{}) (*store.Execution, error) {
	// Subscribe before the first read, so that an end committed between
	// the read and the subscription still wakes the wait.
	end := k.hub.SubscribeEnd(id)
	defer end.Close()
	e, err := k.GetExecution(ctx, c, id)
	if err != nil || wait <= 0 || wire.ExecTerminal(e.Status) {
		return e, err
	}
	deadline := time.NewTimer(min(wait, MaxWait))
	defer deadline.Stop()
	recheck := time.NewTicker(awaitRecheck)
	defer recheck.Stop()
	for {
		select {
		case <-end.C:
		case <-recheck.C:
		case <-deadline.C:
			return k.GetExecution(ctx, c, id)
		case <-stop:
			return k.GetExecution(ctx, c, id)
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		if e, err = k.GetExecution(ctx, c, id); err != nil || wire.ExecTerminal(e.Status) {
			return e, err
		}
	}
}
