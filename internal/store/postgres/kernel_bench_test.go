package postgres_test

import (
	"context"
	"fmt"
	"log/slog"
	"sort"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/rebuno/rebuno/internal/store/postgres/pgtest"
	"github.com/rebuno/rebuno/internal/wire"
)

// BenchmarkKernelSteps measures the step round trip (submit answered
// proceed, then complete answered recorded) of 64 executions at once
// through the kernel on a Postgres store, in process (no HTTP): what the
// store and the database allow. It reports steps/s and the p50/p99 of one
// submit+complete pair. With replicas=3, three stores (and kernels) on one
// database share the executions, as three replicas would.
func BenchmarkKernelSteps(b *testing.B) {
	for _, replicas := range []int{1, 3} {
		b.Run(fmt.Sprintf("replicas=%d", replicas), func(b *testing.B) { benchSteps(b, replicas) })
	}
}

func benchSteps(b *testing.B, replicas int) {
	const executions = 64
	ctx := context.Background()
	url := pgtest.NewDatabase(b)
	kernels := make([]*kernel.Kernel, replicas)
	var first store.Store
	for i := range replicas {
		s, err := postgres.Open(ctx, postgres.Options{URL: url, Migrate: true, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { s.Close() })
		if first == nil {
			first = s
		}
		cfg := kernel.DefaultConfig()
		cfg.ReplicaID = fmt.Sprintf("r%d", i)
		kernels[i] = kernel.New(kernel.Options{Store: s, Config: cfg, Limiter: s.Limiter(), Logger: slog.New(slog.DiscardHandler)})
	}
	k := kernels[0]
	if _, err := k.RegisterAgent(ctx, kernel.AgentSpec{ID: "a", WebhookURL: "http://127.0.0.1:1/w", Secret: "a-secret-of-16-bytes"}); err != nil {
		b.Fatal(err)
	}
	for range executions {
		if _, err := k.CreateExecution(ctx, kernel.CreateRequest{AgentID: "a"}); err != nil {
			b.Fatal(err)
		}
	}
	refs, err := first.Read().DueDispatches(ctx, time.Now(), 2*executions, nil)
	if err != nil || len(refs) != executions {
		b.Fatalf("%d due dispatches (%v), want %d", len(refs), err, executions)
	}
	type lease struct {
		k  *kernel.Kernel
		id string
		h  kernel.DispatchHeaders
	}
	var leases []lease
	for i, ref := range refs {
		owner := kernels[i%replicas]
		del, err := owner.ClaimDispatch(ctx, ref)
		if err != nil || del == nil {
			b.Fatal(err)
		}
		leases = append(leases, lease{owner, del.ExecutionID, kernel.DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}})
	}
	per := (b.N + executions - 1) / executions
	type result struct {
		pairs []time.Duration
		err   error
	}
	results := make(chan result, executions)
	b.ResetTimer()
	start := time.Now()
	for _, l := range leases {
		go func() {
			r := result{pairs: make([]time.Duration, 0, per)}
			for i := range per {
				t0 := time.Now()
				if r.err = roundTrip(ctx, l.k, l.id, l.h, i); r.err != nil {
					break
				}
				r.pairs = append(r.pairs, time.Since(t0))
			}
			results <- r
		}()
	}
	var all []time.Duration
	for range executions {
		r := <-results
		if r.err != nil {
			b.Fatal(r.err)
		}
		all = append(all, r.pairs...)
	}
	elapsed := time.Since(start)
	b.StopTimer()
	sort.Slice(all, func(i, j int) bool { return all[i] < all[j] })
	b.ReportMetric(float64(len(all))/elapsed.Seconds(), "steps/s")
	b.ReportMetric(float64(all[len(all)/2].Microseconds())/1000, "p50-ms")
	b.ReportMetric(float64(all[len(all)*99/100].Microseconds())/1000, "p99-ms")
}

// roundTrip makes step i of an execution as an agent makes a new one.
func roundTrip(ctx context.Context, k *kernel.Kernel, id string, h kernel.DispatchHeaders, i int) error {
	raw := fmt.Appendf(nil, `{"q":%d}`, i)
	v, _ := jsonx.Parse(raw, 128)
	c := kernel.Caller{Agent: "a"}
	d, err := k.SubmitStep(ctx, c, id, h, kernel.SubmitRequest{Kind: wire.KindToolCall, Target: "t", Args: raw, ArgsValue: v, HasOccurrence: true})
	if err != nil || d.Decision != wire.DecisionProceed {
		return fmt.Errorf("submit %d: %v %+v", i, err, d)
	}
	out, err := k.RecordOutcome(ctx, c, id, d.StepID, h, kernel.OutcomeRequest{Succeeded: true, Value: []byte(`{"ok":true}`)})
	if err != nil || out.Decision != wire.DecisionRecorded {
		return fmt.Errorf("complete %d: %v %+v", i, err, out)
	}
	return nil
}
