package main

// FORK: the fork target of docs/protocol/forks.md §6 and the coverage query
// targets of docs/protocol/resources.md §5.2, measured over HTTP against the real kernel. The source
// executions are written through the store while the kernel is stopped, as
// P4 writes its long history.

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/store/sqlite"
	"github.com/rebuno/rebuno/internal/wire"
)

// forkSource is a completed execution written through the store.
type forkSource struct {
	id       string
	steps    int
	body     int   // result bytes per step
	lastSeq  int64 // its last event
	events   int64
	ckpts    int
	bodySize int64 // all result bytes
}

const (
	forkTarget = "bench.write"
	forkArgs   = `{"path":"f.txt"}`
	forkKey    = "workspace"
)

// insertForkSource writes an execution of agentID with n succeeded tool
// steps declaring one resource, each with a result of body bytes and the
// four events the kernel appends for it, and ckpts checkpoints accepted with
// the outcomes of evenly spaced steps (the last one, after the last step,
// still open), then completes it.
func insertForkSource(st store.Store, agentID string, n, body, ckpts int) (*forkSource, error) {
	ctx := context.Background()
	now := time.Now().UTC().Truncate(time.Microsecond)
	src := &forkSource{id: uuid.Must(uuid.NewV7()).String(), steps: n, body: body, ckpts: ckpts}
	argsHash, err := identity.ArgsHashBytes([]byte(forkArgs))
	if err != nil {
		return nil, err
	}
	input := []byte(fmt.Sprintf(`{"bench":"fork","steps":%d,"body":%d}`, n, body))
	// Marked as the kernel marks a log, so that forks read it in place
	// (docs/architecture.md, "Forks").
	e := &store.Execution{ID: src.id, AgentID: agentID, Input: input, Status: wire.ExecRunning, CreatedAt: now, UpdatedAt: now,
		ResourceKeys: []string{forkKey}, ByteCount: int64(len(input)), Mark: &store.Mark{}}
	every := max(n/max(ckpts, 1), 1)
	res := &store.Resource{ExecutionID: src.id, Key: forkKey, DriverID: "rebuno.local_directory.v1", Configuration: []byte(`{"template":null}`),
		EverySteps: int64(every), OnCompletion: true}
	var evs []*store.Event
	var markErr error
	emit := func(typ string, p *jsonx.Object) {
		b := p.Bytes()
		e.LastSeq++
		e.ByteCount += int64(len(b))
		evs = append(evs, &store.Event{ExecutionID: src.id, Seq: e.LastSeq, Type: typ, Payload: b, OccurredAt: now, Mark: e.Mark})
		if next, err := kernel.NextMark(e.Mark, typ, b); err != nil {
			markErr = err
		} else {
			e.Mark = next
		}
	}
	emit(wire.EventExecutionCreated, (&jsonx.Object{}).String("execution_id", src.id).String("status", wire.ExecPending).String("agent_id", agentID))
	emit(wire.EventExecutionStarted, (&jsonx.Object{}).String("execution_id", src.id).String("status", wire.ExecRunning))
	emit("resource.registered", (&jsonx.Object{}).String("key", forkKey).String("driver_id", res.DriverID).Raw("configuration", res.Configuration).
		Bool("coverage_reuse", false).Int("every_steps", res.EverySteps).Bool("on_completion", true))
	res.RegisteredSeq = e.LastSeq
	err = st.Update(ctx, "", func(ctx context.Context, tx store.Tx) error {
		if err := tx.InsertExecution(ctx, e); err != nil {
			return err
		}
		if err := tx.InsertResource(ctx, res); err != nil {
			return err
		}
		return tx.AppendEvents(ctx, evs)
	})
	if err != nil {
		return nil, err
	}
	args := []byte(forkArgs)
	result := []byte(`"` + strings.Repeat("x", max(body-2, 0)) + `"`)
	chunk := max(1, min(1000, (64<<20)/max(body, 1))) // keep one transaction's bodies under 64 MiB
	var open *store.Checkpoint                        // the checkpoint that still covers
	openWritten, made := false, 0
	for lo := 0; lo < n; lo += chunk {
		evs = evs[:0]
		var steps []*store.Step
		var rows []*store.Checkpoint
		closeWritten, closeKept := int64(0), int64(0) // a start closing a row an earlier transaction wrote, and its kept count
		for i := lo; i < min(lo+chunk, n); i++ {
			s := &store.Step{ExecutionID: src.id, StepID: identity.StepID(src.id, wire.KindToolCall, forkTarget, argsHash, int64(i)),
				Kind: wire.KindToolCall, Target: forkTarget, ArgsHash: argsHash, Occurrence: int64(i), Status: wire.StepSucceeded,
				Idempotency: wire.SafeToRetry, Args: args, Result: result, Resources: []string{forkKey}, StartedAt: now, CompletedAt: now}
			e.StepOrder++
			e.StepCount++
			s.Order = e.StepOrder
			e.ByteCount += int64(len(args) + len(result))
			src.bodySize += int64(len(result))
			res.Generation++
			res.StartsSinceCheckpoint++
			p := func() *jsonx.Object {
				return (&jsonx.Object{}).String("step_id", s.StepID).String("step_type", s.Kind).String("target", s.Target)
			}
			s.SubmittedSeq = e.LastSeq + 1
			emit(wire.EventStepProposed, p())
			emit(wire.EventStepAllowed, p())
			emit(wire.EventStepExecuting, p().Strings("resources", []string{forkKey}).Raw("generations",
				(&jsonx.Object{}).Int(forkKey, res.Generation).Bytes()))
			if open != nil {
				open.InvalidatedSeq, open.InvalidatedKept = e.LastSeq, e.Mark.Kept
				if openWritten {
					closeWritten, closeKept = e.LastSeq, e.Mark.Kept
				}
				open = nil
			}
			emit(wire.EventStepSucceeded, p())
			s.TerminalSeq = e.LastSeq
			if (i+1)%every == 0 && made < ckpts {
				// A capture accepted with this step's outcome. Its row keeps
				// the kept count after each of its seqs (the mark's Kept after
				// the event), as the kernel's rows do (store.Checkpoint).
				c := &store.Checkpoint{ExecutionID: src.id, Key: forkKey, CoveredSeq: e.LastSeq, Generation: res.Generation,
					CheckpointRef: fmt.Sprintf("sha256:%064x", i), CoveredKept: e.Mark.Kept}
				emit("resource.checkpointed", (&jsonx.Object{}).String("key", forkKey).Int("generation", c.Generation).
					String("checkpoint_ref", c.CheckpointRef).Int("covered_seq", c.CoveredSeq))
				rows = append(rows, c)
				open, openWritten = c, false
				res.StartsSinceCheckpoint = 0
				made++
			}
			steps = append(steps, s)
		}
		err := st.Update(ctx, src.id, func(ctx context.Context, tx store.Tx) error {
			if closeWritten != 0 {
				if err := tx.InvalidateCheckpoints(ctx, src.id, forkKey, closeWritten, closeKept); err != nil {
					return err
				}
			}
			for _, s := range steps {
				if err := tx.InsertStep(ctx, s); err != nil {
					return err
				}
			}
			for _, c := range rows {
				if err := tx.InsertCheckpoint(ctx, c); err != nil {
					return err
				}
			}
			return appendLikeTheKernel(ctx, tx, evs)
		})
		if err != nil {
			return nil, err
		}
		openWritten = open != nil
	}
	if markErr != nil {
		return nil, markErr
	}
	evs = evs[:0]
	e.Status, e.Output, e.UpdatedAt = wire.ExecCompleted, []byte(`{"done":true}`), now
	emit(wire.EventExecutionCompleted, (&jsonx.Object{}).String("execution_id", src.id).String("status", wire.ExecCompleted).Raw("output", e.Output))
	err = st.Update(ctx, src.id, func(ctx context.Context, tx store.Tx) error {
		if err := tx.AppendEvents(ctx, evs); err != nil {
			return err
		}
		if err := tx.UpdateResource(ctx, res); err != nil {
			return err
		}
		rows, err := tx.Checkpoints(ctx, src.id)
		if err != nil {
			return err
		}
		src.ckpts = len(rows)
		return tx.UpdateExecution(ctx, e)
	})
	if err != nil {
		return nil, err
	}
	src.lastSeq, src.events = e.LastSeq, e.LastSeq
	return src, nil
}

// appendLikeTheKernel appends events a step's worth at a time, as the
// kernel's own operations do, so that the store keeps them as it keeps a live
// execution's log: one large append would be stored as runs of 256 events,
// which read faster than the short runs a real history has.
func appendLikeTheKernel(ctx context.Context, tx store.Tx, evs []*store.Event) error {
	for len(evs) > 0 {
		n := min(len(evs), 4)
		if err := tx.AppendEvents(ctx, evs[:n]); err != nil {
			return err
		}
		evs = evs[n:]
	}
	return nil
}

// forkLadder is the history lengths FORK forks with 4 KiB results: 100,
// 1,000 and 10,000 steps, each only when shorter than n (-fork-steps), then n.
func forkLadder(n int) []int {
	var out []int
	for _, s := range []int{100, 1000, 10000} {
		if s < n {
			out = append(out, s)
		}
	}
	return append(out, n)
}

// forkStepsPerCheckpoint is the sources' checkpoint cadence: the docs/protocol/forks.md §6 source
// (10,000 steps, 100 checkpoints) has one every 100 steps, and every rung of
// the ladder is built the same way (every_steps 100).
const forkStepsPerCheckpoint = 100

// forkCase is one source FORK forks, with the latencies measured on it.
type forkCase struct {
	src   *forkSource
	name  string // the latency's name
	times []time.Duration
}

// perThousandSteps is the growth of a p50 between two history lengths, in
// milliseconds per 1,000 further steps.
func perThousandSteps(shortSteps int, short time.Duration, longSteps int, long time.Duration) float64 {
	if longSteps <= shortSteps {
		return 0
	}
	return msf(long-short) * 1000 / float64(longSteps-shortSteps)
}

func (b *bench) runFORK(ctx context.Context) *metricResult {
	m := newMetric("FORK", "fork cost and coverage queries (docs/protocol/forks.md §6, docs/protocol/resources.md §5.2)")
	m.Conditions = b.conditions("1 (one request at a time; each fork's first delivery is awaited before the next sample)")
	n, samples := b.cfg.ForkSteps, b.cfg.ForkSamples
	k, c, err := b.freshKernel("fork")
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer b.stopKernel(k)
	k.Stop()
	// The ladder with 4 KiB results, then the longest history again with
	// 64 KiB results (bodies are shared, so the fork should barely notice).
	ladder := forkLadder(n)
	var cases []*forkCase
	add := func(steps, body int) error {
		t0 := time.Now()
		st, err := sqlite.Open(sqlite.Options{Path: k.db, Logger: slog.New(slog.DiscardHandler)})
		if err != nil {
			return err
		}
		src, err := insertForkSource(st, b.agentID, steps, body, max(steps/forkStepsPerCheckpoint, 1))
		st.Close()
		if err != nil {
			return err
		}
		m.addValue(fmt.Sprintf("source of %d steps with %d KiB results: %d events, %d checkpoints, written in", src.steps, body>>10, src.events, src.ckpts),
			time.Since(t0).Seconds(), "s")
		cases = append(cases, &forkCase{src: src, name: fmt.Sprintf("fork at the last event, %d steps, %d KiB results", steps, body>>10)})
		return nil
	}
	for _, steps := range ladder {
		if err := add(steps, 4<<10); err != nil {
			m.Failed = "insert source: " + err.Error()
			return m
		}
	}
	if err := add(n, 64<<10); err != nil {
		m.Failed = "insert source: " + err.Error()
		return m
	}
	long4, long64 := cases[len(ladder)-1], cases[len(ladder)]
	m.addValue("database size after insert", mib(dbSize(k.db)), "MiB")
	if err := k.start(); err != nil {
		m.Failed = "restart kernel: " + err.Error()
		return m
	}
	c.SetBase(k.URL)

	fork := func(src *forkSource, at int64) (time.Duration, error) {
		t0 := time.Now()
		body, err := c.bearer("POST", "/v0/executions/"+src.id+"/fork", fmt.Appendf(nil, `{"at_seq":%d}`, at), http.StatusCreated)
		took := time.Since(t0)
		if err != nil {
			return took, err
		}
		var f struct {
			ID      string `json:"id"`
			ForkSeq int64  `json:"fork_seq"`
		}
		if err := json.Unmarshal(body, &f); err != nil || f.ForkSeq != at || f.ID == "" {
			return took, fmt.Errorf("fork answer %s: %v", body, err)
		}
		if _, err := b.recv.wait(ctx, f.ID, 30*time.Second); err != nil {
			return took, err
		}
		return took, nil
	}
	// One fork of each warms the caches; then the samples go round the
	// sources, so that a slow spell of the machine hits every length alike.
	for _, fc := range cases {
		if _, err := fork(fc.src, fc.src.lastSeq); err != nil {
			m.Failed = "first fork: " + err.Error()
			return m
		}
	}
	m.cpu = &cpuSampler{}
	m.cpu.start(k)
	for i := 0; i < samples && ctx.Err() == nil; i++ {
		for _, fc := range cases {
			took, err := fork(fc.src, fc.src.lastSeq)
			if err != nil {
				m.errs.add(err)
				continue
			}
			fc.times = append(fc.times, took)
		}
	}
	// Coverage queries on the longest 4 KiB source: the point answer at
	// random seqs and the ranges over the whole log.
	rng := rand.New(rand.NewPCG(3, 4))
	var points, ranges []time.Duration
	src := long4.src
	for i := 0; i < 20*samples && ctx.Err() == nil; i++ {
		at := 1 + rng.Int64N(src.lastSeq)
		t0 := time.Now()
		_, err := c.bearer("GET", fmt.Sprintf("/v0/executions/%s/coverage?at_seq=%d", src.id, at), nil, http.StatusOK)
		if err != nil {
			m.errs.add(err)
			continue
		}
		points = append(points, time.Since(t0))
	}
	for i := 0; i < 2*samples && ctx.Err() == nil; i++ {
		t0 := time.Now()
		body, err := c.bearer("GET", "/v0/executions/"+src.id+"/coverage", nil, http.StatusOK)
		if err != nil {
			m.errs.add(err)
			continue
		}
		ranges = append(ranges, time.Since(t0))
		if i == 0 {
			var r struct {
				Ranges [][2]int64 `json:"covered_ranges"`
			}
			if err := json.Unmarshal(body, &r); err != nil || len(r.Ranges) != src.ckpts+1 {
				m.errs.add(fmt.Errorf("ranges answer has %d ranges, want %d (%v)", len(r.Ranges), src.ckpts+1, err))
			}
		}
	}
	m.cpu.stop()
	m.finishKernel(k)

	sums := make([]summary, len(cases))
	for i, fc := range cases {
		sums[i] = m.addLatency(fc.name, fc.times) // sorts fc.times
	}
	pp := summarize(points)
	pr := summarize(ranges)
	m.addLatency(fmt.Sprintf("coverage point query, %d steps", n), points)
	m.addLatency(fmt.Sprintf("coverage ranges query, %d steps, %d checkpoints", n, src.ckpts), ranges)
	for i, fc := range cases {
		kib := fc.src.body >> 10
		m.addValue(fmt.Sprintf("fork p50, %d steps, %d KiB results", fc.src.steps, kib), msf(sums[i].P50), "ms")
		m.addValue(fmt.Sprintf("fork p95, %d steps, %d KiB results", fc.src.steps, kib), msf(percentile(fc.times, 0.95)), "ms")
	}
	if len(ladder) > 1 {
		a, z := cases[len(ladder)-2], long4
		if len(a.times) > 0 && len(z.times) > 0 {
			m.addValue(fmt.Sprintf("fork p50 growth from %d to %d steps, per 1,000 steps", a.src.steps, z.src.steps),
				perThousandSteps(a.src.steps, sums[len(ladder)-2].P50, z.src.steps, sums[len(ladder)-1].P50), "ms")
		}
	}
	p4, p64 := percentile(long4.times, 0.95), percentile(long64.times, 0.95)
	if len(long4.times) > 0 {
		m.addTarget(fmt.Sprintf("fork p95, %d steps (4 KiB), docs/protocol/forks.md §6", n), "< 500 ms", ms(p4), p4 < 500*time.Millisecond)
		m.addTarget(fmt.Sprintf("fork p95, %d steps (4 KiB), aim", n), "< 100 ms", ms(p4), p4 < 100*time.Millisecond)
	} else {
		m.addTarget(fmt.Sprintf("fork p95, %d steps (4 KiB), docs/protocol/forks.md §6", n), "< 500 ms", "no samples", false)
		m.addTarget(fmt.Sprintf("fork p95, %d steps (4 KiB), aim", n), "< 100 ms", "no samples", false)
	}
	if len(long4.times) > 0 && len(long64.times) > 0 && p4 > 0 {
		ratio := float64(p64) / float64(p4)
		m.addValue("fork p95 ratio, 64 KiB / 4 KiB results", ratio, "×")
		m.addTarget("fork p95 64 KiB / 4 KiB", "≤ 1.5×", fmt.Sprintf("%.2f×", ratio), ratio <= 1.5)
	} else {
		m.addTarget("fork p95 64 KiB / 4 KiB", "≤ 1.5×", "no samples", false)
	}
	p95p, p95r := percentile(points, 0.95), percentile(ranges, 0.95)
	m.addTarget("coverage point p95", "< 10 ms", ms(p95p), pp.N > 0 && p95p < 10*time.Millisecond)
	m.addTarget("coverage ranges p95", "< 50 ms", ms(p95r), pr.N > 0 && p95r < 50*time.Millisecond)
	m.note("each fork is POST /v0/executions/{id}/fork at the source's last event (covered, so every step and checkpoint is copied), timed at the client; its first delivery is awaited before the next; the samples go round the sources")
	m.note("the sources (steps with their four events each, one resource, a checkpoint every %d steps) were written with internal/store/sqlite while the kernel was stopped", forkStepsPerCheckpoint)
	m.note("the docs/protocol/forks.md §6 target (< 500 ms) and the aim (< 100 ms) are stated for 10,000 steps; the shorter histories are reported without targets")
	if n != 10000 {
		m.note("-fork-steps is %d: the docs/protocol/forks.md §6 target is stated for 10,000 steps", n)
	}
	return m
}
