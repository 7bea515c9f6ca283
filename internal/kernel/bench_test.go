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
// take per step.
func BenchmarkStepRoundTrip(b *testing.B) {
	ctx := context.Background()
	k, _, e, h := benchExecution(b, ":memory:")
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		raw := fmt.Appendf(nil, `{"q":%d}`, i)
		v, _ := jsonx.Parse(raw, 128)
		d, err := k.SubmitStep(ctx, Caller{Agent: "a"}, e.ID, h, SubmitRequest{Kind: wire.KindToolCall, Target: "t", Args: raw, ArgsValue: v})
		if err != nil || d.Decision != wire.DecisionProceed {
			b.Fatal(err, d)
		}
		out, err := k.RecordOutcome(ctx, Caller{Agent: "a"}, e.ID, d.StepID, h, OutcomeRequest{Succeeded: true, Value: []byte(`{"ok":true}`)})
		if err != nil || out.Decision != wire.DecisionRecorded {
			b.Fatal(err, out)
		}
	}
}

// BenchmarkFork10000 measures a fork at the last event of a 10,000-step
// history with 4 KiB results (RESOURCES-AND-FORKS §5.6) in process, on a
// file store: planning and the write transaction, without HTTP.
func BenchmarkFork10000(b *testing.B) {
	ctx := context.Background()
	k, st, e, h := benchExecution(b, b.TempDir()+"/fork.db")
	result := []byte(`"` + strings.Repeat("x", 4096) + `"`)
	for i := 0; i < 10000; i++ {
		raw := fmt.Appendf(nil, `{"q":%d}`, i)
		v, _ := jsonx.Parse(raw, 128)
		d, err := k.SubmitStep(ctx, Caller{Agent: "a"}, e.ID, h, SubmitRequest{Kind: wire.KindToolCall, Target: "t", Args: raw, ArgsValue: v})
		if err != nil || d.Decision != wire.DecisionProceed {
			b.Fatal(err, d)
		}
		if _, err := k.RecordOutcome(ctx, Caller{Agent: "a"}, e.ID, d.StepID, h, OutcomeRequest{Succeeded: true, Value: result}); err != nil {
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
	refs, _ := st.Read().DueDispatches(ctx, k.clock.Now(), 10)
	del, err := k.ClaimDispatch(ctx, refs[0])
	if err != nil || del == nil {
		b.Fatal(err)
	}
	return k, st, e, DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}
}
