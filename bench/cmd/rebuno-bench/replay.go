package main

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"math/rand/v2"
	"time"

	"github.com/google/uuid"

	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

// The replayed step: one identity repeated, so that occurrence n names the
// n-th call, as an agent calling the same tool in a loop produces.
const (
	replayKind   = wire.KindToolCall
	replayTarget = "bench.replay"
	replayArgs   = `{"q":"same"}`
)

func replaySubmitBody() []byte {
	return []byte(`{"kind":"` + replayKind + `","target":"` + replayTarget + `","args":` + replayArgs + `}`)
}

func replayResult(occ int) string { return fmt.Sprintf(`{"i":%d}`, occ) }

// history is one execution whose recorded steps are replayed.
type history struct {
	steps   int
	id      string
	lease   lease
	how     string
	samples []time.Duration
}

func (h *history) stepID(argsHash string, occ int) string {
	return identity.StepID(h.id, replayKind, replayTarget, argsHash, int64(occ))
}

func (b *bench) runP4(ctx context.Context) *metricResult {
	m := newMetric("P4", "replay cost: submit answered `replay`, by length of the recorded history")
	m.Conditions = b.conditions("1 (one request at a time, round robin over the histories, random recorded occurrence)")
	k, c, err := b.freshKernel("p4")
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer b.stopKernel(k)
	argsHash, err := identity.ArgsHashBytes([]byte(replayArgs))
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	body := replaySubmitBody()

	// Short histories are recorded over HTTP, as an agent records them.
	var hs []*history
	buildStart := time.Now()
	for _, n := range []int{10, 100, 1000} {
		h := &history{steps: n, how: "recorded over HTTP"}
		id, wh, _, err := start(ctx, c, b.recv, fmt.Sprintf(`{"bench":"replay","steps":%d}`, n))
		if err != nil {
			m.Failed = "create history: " + err.Error()
			return m
		}
		h.id, h.lease = id, wh.lease()
		for occ := 0; occ < n; occ++ {
			d, err := c.submit(id, h.lease, body, int64(occ))
			if err == nil && (d.Decision != "proceed" || d.StepID != h.stepID(argsHash, occ)) {
				err = fmt.Errorf("history step %d: got %s %s, want proceed %s", occ, d.Decision, d.StepID, h.stepID(argsHash, occ))
			}
			if err == nil {
				_, err = c.complete(id, d.StepID, h.lease, replayResult(occ))
			}
			if err != nil {
				m.Failed = "record history: " + err.Error()
				return m
			}
		}
		hs = append(hs, h)
	}
	m.addValue("short histories recorded in", time.Since(buildStart).Seconds(), "s")

	// The long history is inserted through the store while the kernel is
	// stopped, with its dispatch in flight at attempt 2 and that attempt's
	// counter at the last occurrence, as if the agent had replayed them all.
	k.Stop()
	insStart := time.Now()
	large, err := insertHistory(k.db, b.agentID, b.cfg.P4Large, argsHash)
	if err != nil {
		m.Failed = "insert history: " + err.Error()
		return m
	}
	m.addValue(fmt.Sprintf("%d steps inserted through the store in", b.cfg.P4Large), time.Since(insStart).Seconds(), "s")
	m.addValue("database size after insert", mib(dbSize(k.db)), "MiB")
	if err := k.start(); err != nil {
		m.Failed = "restart kernel: " + err.Error()
		return m
	}
	c.SetBase(k.URL)
	hs = append(hs, large)

	// Replay every history's last occurrence once. Each dispatch's counter
	// is at its maximum already (the short histories were recorded by their
	// dispatch), so a named occurrence up to it is accepted and no replay in
	// the window writes.
	replay := func(h *history, occ int) error {
		d, err := c.submit(h.id, h.lease, body, int64(occ))
		if err != nil {
			return err
		}
		if d.Decision != "replay" || d.StepID != h.stepID(argsHash, occ) {
			return fmt.Errorf("history %d occurrence %d: got %s %s, want replay %s", h.steps, occ, d.Decision, d.StepID, h.stepID(argsHash, occ))
		}
		if want := replayResult(occ); !bytes.Equal(d.Result, []byte(want)) {
			return fmt.Errorf("history %d occurrence %d: replayed result %s, want %s", h.steps, occ, d.Result, want)
		}
		return nil
	}
	for _, h := range hs {
		if err := replay(h, h.steps-1); err != nil {
			m.Failed = "first replay: " + err.Error()
			return m
		}
	}

	from, to := b.window()
	m.cpu = &cpuSampler{}
	done := make(chan struct{})
	defer close(done)
	m.cpu.schedule(k, from, to, done)
	rng := rand.New(rand.NewPCG(1, 2))
	for ctx.Err() == nil && time.Now().Before(to) {
		for _, h := range hs {
			occ := rng.IntN(h.steps)
			t0 := time.Now()
			err := replay(h, occ)
			t1 := time.Now()
			if err != nil {
				m.errs.add(err)
				pause(ctx)
				continue
			}
			if !t0.Before(from) && t1.Before(to) {
				h.samples = append(h.samples, t1.Sub(t0))
			}
		}
	}
	m.cpu.stop()
	m.finishKernel(k)
	for _, h := range hs {
		if err := c.finish(h.id, h.lease, "null"); err != nil {
			m.errs.add(err)
		}
	}

	var p50s []time.Duration
	for _, h := range hs {
		s := m.addLatency(fmt.Sprintf("replay, %d steps (%s)", h.steps, h.how), h.samples)
		p50s = append(p50s, s.P50)
	}
	first, last := p50s[0], p50s[len(p50s)-1]
	if first > 0 && last > 0 {
		ratio := float64(last) / float64(first)
		m.addValue(fmt.Sprintf("p50 ratio %d vs 10 steps", b.cfg.P4Large), ratio, "×")
		name := fmt.Sprintf("p50 %dk / 10", b.cfg.P4Large/1000)
		m.addTarget(name, "≤ 1.5×", fmt.Sprintf("%.2f×", ratio), ratio <= 1.5)
	} else {
		m.addTarget("p50 100k / 10", "≤ 1.5×", "no samples", false)
	}
	m.note("each replay sends Rebuno-Step-Occurrence (a random recorded occurrence) and is verified: decision replay, the step id of docs/protocol/identity.md §4, the recorded result")
	m.note("the long history (steps + their events) was written with internal/store/sqlite while the kernel was stopped, with its dispatch in flight at attempt 2 and that attempt's occurrence counter at the last step")
	return m
}

// insertHistory writes an execution with n succeeded steps of the replay
// identity directly through the store: the execution, its dispatch (recorded
// by attempt 1, whose lease expired, then claimed again as attempt 2, which
// holds a lease of an hour and has counted every occurrence), the steps and
// the events the kernel would have appended for them.
func insertHistory(path, agentID string, n int, argsHash string) (*history, error) {
	st, err := sqlite.Open(sqlite.Options{Path: path, Logger: slog.New(slog.NewTextHandler(io.Discard, nil))})
	if err != nil {
		return nil, err
	}
	defer st.Close()
	ctx := context.Background()
	now := time.Now().UTC()
	h := &history{steps: n, id: uuid.Must(uuid.NewV7()).String(), how: "inserted through the store"}
	dispatchID := uuid.Must(uuid.NewV7()).String()
	input := []byte(fmt.Sprintf(`{"bench":"replay","steps":%d}`, n))
	e := &store.Execution{
		ID: h.id, AgentID: agentID, Input: input, Status: wire.ExecRunning, CreatedAt: now, UpdatedAt: now,
		ResourceKeys: []string{}, DispatchID: dispatchID, ByteCount: int64(len(input)),
	}
	d := &store.Dispatch{
		ID: dispatchID, ExecutionID: h.id, Status: wire.DispatchPending, Attempt: 1, MaxAttempts: 5, ProgressAttempt: 1,
		LeaseTimeout: leaseSeconds, NextAttemptAt: now, ClaimedBy: "dev", CreatedAt: now, UpdatedAt: now,
	}
	var evs []*store.Event
	emit := func(typ string, payload *jsonx.Object) {
		b := payload.Bytes()
		e.LastSeq++
		e.ByteCount += int64(len(b))
		evs = append(evs, &store.Event{ExecutionID: h.id, Seq: e.LastSeq, Type: typ, Payload: b, OccurredAt: now})
	}
	dispatchEvent := func(status string, attempt int64) *jsonx.Object {
		return (&jsonx.Object{}).String("dispatch_id", dispatchID).String("execution_id", h.id).String("status", status).Int("attempt", attempt)
	}
	emit(wire.EventExecutionCreated, (&jsonx.Object{}).String("execution_id", h.id).String("status", wire.ExecPending).String("agent_id", agentID))
	emit(wire.EventExecutionStarted, (&jsonx.Object{}).String("execution_id", h.id).String("status", wire.ExecRunning))
	emit(wire.EventDispatchQueued, dispatchEvent(wire.DispatchPending, 0))
	emit(wire.EventDispatchAcked, dispatchEvent("acked", 1))
	err = st.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertExecution(ctx, e); err != nil {
			return err
		}
		if err := tx.InsertDispatch(ctx, d); err != nil {
			return err
		}
		return tx.AppendEvents(ctx, evs)
	})
	if err != nil {
		return nil, err
	}
	args := []byte(replayArgs)
	const chunk = 1000 // 4,000 events: one INSERT stays under SQLite's 32,766 variables
	for lo := 0; lo < n; lo += chunk {
		hi := min(lo+chunk, n)
		evs = evs[:0]
		steps := make([]*store.Step, 0, hi-lo)
		for occ := lo; occ < hi; occ++ {
			s := &store.Step{
				ExecutionID: h.id, StepID: h.stepID(argsHash, occ), Kind: replayKind, Target: replayTarget, ArgsHash: argsHash,
				Occurrence: int64(occ), Status: wire.StepSucceeded, Idempotency: wire.SafeToRetry, Args: args,
				Result: []byte(replayResult(occ)), Resources: []string{}, StartedAt: now, CompletedAt: now,
				DispatchID: dispatchID, Attempt: 1,
			}
			e.StepOrder++
			e.StepCount++
			s.Order = e.StepOrder
			e.ByteCount += int64(len(args) + len(s.Result))
			p := func() *jsonx.Object {
				return (&jsonx.Object{}).String("step_id", s.StepID).String("step_type", s.Kind).String("target", s.Target)
			}
			emit(wire.EventStepProposed, p())
			emit(wire.EventStepAllowed, p())
			emit(wire.EventStepExecuting, p())
			emit(wire.EventStepSucceeded, p())
			s.TerminalSeq = e.LastSeq
			steps = append(steps, s)
		}
		err := st.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
			for _, s := range steps {
				if err := tx.InsertStep(ctx, s); err != nil {
					return err
				}
			}
			return appendLikeTheKernel(ctx, tx, evs)
		})
		if err != nil {
			return nil, err
		}
	}
	evs = evs[:0]
	emit(wire.EventDispatchLeaseExpired, dispatchEvent(wire.DispatchPending, 1))
	emit(wire.EventDispatchAcked, dispatchEvent("acked", 2))
	d.Status, d.Attempt = wire.DispatchInFlight, 2
	d.LeaseExpiresAt = now.Add(time.Hour)
	h.lease = lease{DispatchID: dispatchID, Attempt: 2}
	err = st.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.AppendEvents(ctx, evs); err != nil {
			return err
		}
		if err := tx.UpdateDispatch(ctx, d); err != nil {
			return err
		}
		if err := tx.RaiseCounter(ctx, h.id, dispatchID, replayKind, replayTarget, argsHash, int64(n-1)); err != nil {
			return err
		}
		return tx.UpdateExecution(ctx, e)
	})
	if err != nil {
		return nil, err
	}
	return h, nil
}
