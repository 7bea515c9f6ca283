package kernel

import (
	"context"
	"fmt"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

// BenchmarkStepRoundTrip measures the kernel's own cost of one step (submit
// answered proceed + complete answered recorded), without HTTP, on a
// throwaway store with synchronous commits off: the CPU the verbs and the SQL
// take per step. Each submit names its occurrence, as the SDKs' do.
func BenchmarkStepRoundTrip(b *testing.B) {
	ctx := context.Background()
	k, _, e, h := benchExecution(b, ":memory:")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := roundTrip(ctx, k, e.ID, h, wire.KindToolCall, i, okResult); err != nil {
			b.Fatal(err)
		}
	}
}

// okResult is the result the benchmarks' steps record.
var okResult = []byte(`{"ok":true}`)

// roundTrip makes step i as an agent makes a new one: its submit, naming its
// occurrence, answered proceed, then its result, answered recorded.
func roundTrip(ctx context.Context, k *Kernel, id string, h DispatchHeaders, kind string, i int, result []byte) error {
	raw := fmt.Appendf(nil, `{"q":%d}`, i)
	v, _ := jsonx.Parse(raw, 128)
	d, err := k.SubmitStep(ctx, Caller{Agent: "a"}, id, h, SubmitRequest{Kind: kind, Target: "t", Args: raw, ArgsValue: v, HasOccurrence: true})
	if err != nil || d.Decision != wire.DecisionProceed {
		return fmt.Errorf("submit %d: %v %+v", i, err, d)
	}
	out, err := k.RecordOutcome(ctx, Caller{Agent: "a"}, id, d.StepID, h, OutcomeRequest{Succeeded: true, Value: result})
	if err != nil || out.Decision != wire.DecisionRecorded {
		return fmt.Errorf("complete %d: %v %+v", i, err, out)
	}
	return nil
}

// BenchmarkStepsConcurrent measures the same round trip made by 64
// executions at once, as P2 makes them but without HTTP: their transactions
// share the writer's group commits. Run it with GOMAXPROCS=1 to see the cost
// per step on the kernel's one core.
func BenchmarkStepsConcurrent(b *testing.B) {
	const executions = 64
	ctx := context.Background()
	k, st, _, _ := benchExecution(b, ":memory:")
	leases := map[string]DispatchHeaders{}
	for range executions {
		if _, err := k.CreateExecution(ctx, CreateRequest{AgentID: "a"}); err != nil {
			b.Fatal(err)
		}
	}
	refs, err := st.Read().DueDispatches(ctx, k.clock.Now(), 2*executions, nil)
	if err != nil || len(refs) != executions {
		b.Fatalf("%d due dispatches (%v), want %d", len(refs), err, executions)
	}
	for _, ref := range refs {
		del, err := k.ClaimDispatch(ctx, ref)
		if err != nil || del == nil {
			b.Fatal(err)
		}
		leases[del.ExecutionID] = DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}
	}
	per := (b.N + executions - 1) / executions
	errs := make(chan error, executions)
	b.ResetTimer()
	for id, h := range leases {
		go func() {
			for i := range per {
				if err := roundTrip(ctx, k, id, h, wire.KindToolCall, i, okResult); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range executions {
		if err := <-errs; err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkFork10000 measures a fork at the last event of a 10,000-step
// history with 4 KiB results (docs/protocol/forks.md §6) in process, on a
// file store: planning and the write transaction, without HTTP.
func BenchmarkFork10000(b *testing.B) {
	ctx := context.Background()
	k, st, e, h := benchExecution(b, b.TempDir()+"/fork.db")
	result := []byte(`"` + strings.Repeat("x", 4096) + `"`)
	for i := 0; i < 10000; i++ {
		if err := roundTrip(ctx, k, e.ID, h, wire.KindToolCall, i, result); err != nil {
			b.Fatal(err)
		}
	}
	src, err := st.Read().Execution(ctx, e.ID)
	if err != nil {
		b.Fatal(err)
	}
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if _, err := k.Fork(ctx, e.ID, ForkRequest{AtSeq: src.LastSeq}); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkForkCheckpoints measures an in-place fork at the last event of a
// 100,000-step history written through the store (fkLarge: a resource
// declared by every step), with 10 and with 1,000 checkpoints: every copied
// checkpoint's seqs are mapped to the fork's numbering while planning. The
// results are small; a fork shares them and never reads them.
func BenchmarkForkCheckpoints(b *testing.B) {
	for _, ckpts := range []int{10, 1000} {
		b.Run(fmt.Sprintf("steps=100000/checkpoints=%d", ckpts), func(b *testing.B) {
			ctx := context.Background()
			k, st, _, _ := benchExecution(b, b.TempDir()+"/fork.db")
			id := fkLarge(b, st, "a", 100000, 64, ckpts, true)
			src, err := st.Read().Execution(ctx, id)
			if err != nil {
				b.Fatal(err)
			}
			for b.Loop() {
				f, err := k.Fork(ctx, id, ForkRequest{AtSeq: src.LastSeq})
				if err != nil || !f.ForkInPlace {
					b.Fatalf("fork: %v (in place: %v)", err, err == nil && f.ForkInPlace)
				}
			}
		})
	}
}

// benchExecution opens a store at path with a kernel on it, and an execution
// of agent "a" whose first dispatch is claimed.
func benchExecution(b testing.TB, path string) (*Kernel, *sqlite.Store, *store.Execution, DispatchHeaders) {
	return benchExecutionOn(b, sqlite.Options{Path: path})
}

func benchExecutionOn(b testing.TB, opt sqlite.Options) (*Kernel, *sqlite.Store, *store.Execution, DispatchHeaders) {
	st, err := sqlite.Open(opt)
	if err != nil {
		b.Fatal(err)
	}
	b.Cleanup(func() { st.Close() })
	k := New(Options{Store: st, Clock: clock.Real{}, Config: DefaultConfig()})
	ctx := context.Background()
	if _, err := k.RegisterAgent(ctx, AgentSpec{ID: "a", WebhookURL: "http://127.0.0.1:1/w", Secret: "a-secret-of-16-bytes"}); err != nil {
		b.Fatal(err)
	}
	e, err := k.CreateExecution(ctx, CreateRequest{AgentID: "a"})
	if err != nil {
		b.Fatal(err)
	}
	refs, _ := st.Read().DueDispatches(ctx, k.clock.Now(), 10, nil)
	del, err := k.ClaimDispatch(ctx, refs[0])
	if err != nil || del == nil {
		b.Fatal(err)
	}
	return k, st, e, DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}
}
