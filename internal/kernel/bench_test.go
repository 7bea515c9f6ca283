package kernel

import (
	"context"
	"fmt"
	"testing"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

// BenchmarkStepRoundTrip measures the kernel's own cost of one step (submit
// answered proceed + complete answered recorded), without HTTP, on a
// throwaway store with synchronous commits off: the CPU the verbs and the SQL
// take per step.
func BenchmarkStepRoundTrip(b *testing.B) {
	st, err := sqlite.Open(sqlite.Options{Path: ":memory:"})
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
	h := DispatchHeaders{ID: del.DispatchID, Attempt: del.Attempt}
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
