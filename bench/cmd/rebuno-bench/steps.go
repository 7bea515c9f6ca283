package main

import (
	"context"
	"fmt"
	"sync"
	"time"
)

// pause waits a little after a failed request so that a persistent failure
// does not spin, returning early when ctx ends.
func pause(ctx context.Context) {
	t := time.NewTimer(20 * time.Millisecond)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-t.C:
	}
}

// stepWorker runs one execution at a time, each a loop of tool steps: submit
// (→ proceed) then complete (→ recorded). Every submit carries distinct args,
// so each is a new step, and Rebuno-Step-Occurrence as this project's SDKs
// send it. With carried, a step is one request: each submit carries the
// previous step's outcome, and the execution's complete the last one
// (docs/protocol/steps.md §13), as this project's SDKs send them.
type stepWorker struct {
	c       *client
	r       *receiver
	errs    *errorLog
	from    time.Time // measured window
	to      time.Time
	perExec int
	carried bool

	sub, comp, pair []time.Duration
	steps           int64 // steps whose complete returned inside the window
	executions      int
}

func (w *stepWorker) run(ctx context.Context) {
	var (
		id      string
		l       lease
		n       int
		buf     = make([]byte, 0, 256)
		pending string // the outcome member the next request carries
	)
	finish := func() {
		if id != "" {
			if err := w.c.finish(id, l, fmt.Sprintf(`{"steps":%d}%s`, n, pending)); err != nil {
				w.errs.add(err)
			}
			id, pending = "", ""
		}
	}
	defer finish()
	for ctx.Err() == nil && time.Now().Before(w.to) {
		if id == "" || n >= w.perExec {
			finish()
			newID, wh, _, err := start(ctx, w.c, w.r, `{"bench":"steps"}`)
			if err != nil {
				w.errs.add(err)
				pause(ctx)
				continue
			}
			id, l, n = newID, wh.lease(), 0
			w.executions++
		}
		buf = fmt.Appendf(buf[:0], `{"kind":"tool_call","target":"bench.echo","args":{"i":%d}%s}`, n, pending)
		t0 := time.Now()
		d, err := w.c.submit(id, l, buf, 0)
		t1 := time.Now()
		if err == nil && (d.Decision != "proceed" || d.StepID == "") {
			err = fmt.Errorf("submit: decision %q, want proceed", d.Decision)
		}
		if err != nil {
			w.errs.add(err)
			id, pending = "", "" // abandon the execution; its lease simply lapses
			pause(ctx)
			continue
		}
		if w.carried {
			pending = `,"outcome":{"step_id":"` + d.StepID + `","result":{"ok":true}}`
			n++
			if !t1.Before(w.from) && t1.Before(w.to) {
				w.steps++
			}
			if !t0.Before(w.from) && t1.Before(w.to) {
				w.sub = append(w.sub, t1.Sub(t0))
			}
			continue
		}
		cd, err := w.c.complete(id, d.StepID, l, `{"ok":true}`)
		t2 := time.Now()
		if err == nil && cd.Decision != "recorded" {
			err = fmt.Errorf("complete: decision %q, want recorded", cd.Decision)
		}
		if err != nil {
			w.errs.add(err)
			id = ""
			pause(ctx)
			continue
		}
		n++
		if !t2.Before(w.from) && t2.Before(w.to) {
			w.steps++
		}
		if !t0.Before(w.from) && t2.Before(w.to) {
			w.sub = append(w.sub, t1.Sub(t0))
			w.comp = append(w.comp, t2.Sub(t1))
			w.pair = append(w.pair, t2.Sub(t0))
		}
	}
}

// dispatchProbe creates executions and times create → webhook received. With
// interval 0 it runs them back to back, one at a time; otherwise it starts
// one every interval. Each execution is completed at once.
type dispatchProbe struct {
	c        *client
	r        *receiver
	errs     *errorLog
	from, to time.Time
	interval time.Duration

	dispatch []time.Duration // create sent → webhook received
	created  []time.Duration // create sent → 201 received
}

func (p *dispatchProbe) run(ctx context.Context) {
	next := time.Now()
	for ctx.Err() == nil && time.Now().Before(p.to) {
		if p.interval > 0 {
			if wait := time.Until(next); wait > 0 {
				t := time.NewTimer(wait)
				select {
				case <-ctx.Done():
					t.Stop()
					return
				case <-t.C:
				}
			}
			next = next.Add(p.interval)
			if now := time.Now(); next.Before(now) {
				next = now
			}
		}
		sent := time.Now()
		id, err := p.c.create(`{"bench":"dispatch"}`)
		answered := time.Now()
		if err != nil {
			p.errs.add(err)
			pause(ctx)
			continue
		}
		wh, err := p.r.wait(ctx, id, 30*time.Second)
		if err != nil {
			p.errs.add(err)
			continue
		}
		if !sent.Before(p.from) && wh.At.Before(p.to) {
			p.dispatch = append(p.dispatch, wh.At.Sub(sent))
			p.created = append(p.created, answered.Sub(sent))
		}
		if err := p.c.finish(id, wh.lease(), "null"); err != nil {
			p.errs.add(err)
		}
	}
}

// window returns the measured window of a metric that starts now.
func (b *bench) window() (from, to time.Time) {
	from = time.Now().Add(b.cfg.Warmup)
	return from, from.Add(b.cfg.Duration)
}

func (b *bench) runP1(ctx context.Context) *metricResult {
	m := newMetric("P1", "per-step round trip: submit (→ proceed) + complete (→ recorded), one execution at a time")
	m.Conditions = b.conditions("1 (one execution, one request in flight at a time)")
	k, c, err := b.freshKernel("p1")
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer b.stopKernel(k)
	from, to := b.window()
	m.cpu = &cpuSampler{}
	done := make(chan struct{})
	defer close(done)
	m.cpu.schedule(k, from, to, done)
	w := &stepWorker{c: c, r: b.recv, errs: m.errs, from: from, to: to, perExec: b.cfg.StepsPerExec}
	w.run(ctx)
	m.cpu.stop()
	m.finishKernel(k)

	pair := m.addLatency("pair (submit + complete)", w.pair)
	m.addLatency("submit (→ proceed)", w.sub)
	m.addLatency("complete (→ recorded)", w.comp)
	m.addValue("steps in window", float64(w.steps), "")
	m.addValue("rate (sequential)", float64(w.steps)/b.cfg.Duration.Seconds(), "steps/s")

	// The same load with carried outcomes, in a window of its own on the
	// same kernel: one request and one durable commit per step.
	from, to = b.window()
	cw := &stepWorker{c: c, r: b.recv, errs: m.errs, from: from, to: to, perExec: b.cfg.StepsPerExec, carried: true}
	cw.run(ctx)
	m.addLatency("carried step (one submit carrying the previous outcome)", cw.sub)
	m.addValue("carried rate (sequential)", float64(cw.steps)/b.cfg.Duration.Seconds(), "steps/s")
	if pair.N > 0 {
		m.addTarget("pair p50", "≤ 1 ms", ms(pair.P50), pair.P50 <= time.Millisecond)
		m.addTarget("pair p99", "≤ 5 ms", ms(pair.P99), pair.P99 <= 5*time.Millisecond)
	} else {
		m.addTarget("pair p50", "≤ 1 ms", "no samples", false)
	}
	m.note("Postgres: the same pair on rebuno server is PG1's (make bench runs it on a throwaway cluster)")
	m.note("each step is a new tool_call with distinct args; two durable commits per step (submit, complete); with carried outcomes (docs/protocol/steps.md §13) one")
	return m
}

func (b *bench) runP2(ctx context.Context) *metricResult {
	n := b.cfg.Concurrency
	m := newMetric("P2", fmt.Sprintf("sustained throughput, %d concurrent executions each looping steps", n))
	m.Conditions = b.conditions(fmt.Sprintf("%d executions, one request in flight each (+ P3 probe: one create every %s); then the same carried, in a window of its own", n, b.cfg.P3Interval))
	k, c, err := b.freshKernel("p2")
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer b.stopKernel(k)
	l := b.stepLoad(ctx, m, k, c, b.cfg.P3Interval, false)
	rate := float64(l.steps) / b.cfg.Duration.Seconds()
	m.addValue("throughput", rate, "steps/s (one step = submit + complete)")
	m.addValue("steps in window", float64(l.steps), "")
	m.addLatency("submit under load", l.sub)
	m.addLatency("complete under load", l.comp)
	m.addLatency("pair under load", l.pair)
	m.addTarget("throughput", "≥ 5,000 steps/s", fmt.Sprintf("%.0f steps/s", rate), rate >= 5000)
	if l.probe != nil {
		b.p3UnderLoad = l.probe.dispatch
		b.p3UnderLoadCreate = l.probe.created
	}
	kcpu, gen, _ := m.cpu.result()

	// The same executions as this project's SDKs send them, in a window of
	// their own on the same kernel: each submit carries the previous step's
	// outcome (docs/protocol/steps.md §13), one request and one transaction a
	// step. The metric's CPU and commit lines stay the pair load's.
	pairCPU := m.cpu
	cl := b.stepLoad(ctx, m, k, c, 0, true)
	carriedCPU := m.cpu
	m.cpu = pairCPU
	carried := float64(cl.steps) / b.cfg.Duration.Seconds()
	m.addValue("carried throughput", carried, "steps/s (one step = one submit carrying the previous outcome)")
	m.addLatency("carried submit under load", cl.sub)
	for _, w := range []struct {
		name  string
		cpu   *cpuSampler
		steps int64
	}{{"pair", pairCPU, l.steps}, {"carried", carriedCPU, cl.steps}} {
		if core, _, window := w.cpu.result(); w.steps > 0 && window > 0 {
			m.addValue("kernel CPU per step, "+w.name, core*window/float64(w.steps)*1e6, "µs of its core")
		}
	}
	if gen >= 0.95 {
		m.note("the load generator used %.0f%% of its core: throughput may be limited by the generator, not the kernel", 100*gen)
	} else if kcpu >= 0.95 {
		m.note("the kernel used %.0f%% of its core: throughput is CPU-bound in the kernel", 100*kcpu)
	}
	return m
}

// runCEIL drives a null kernel (nullkernel.go), pinned and limited as the
// kernel is, with P2's load. What it measures is not Rebuno: it is the most
// P2 could show on this machine with a kernel whose work took no time, so
// that P2's number can be read against what the machine allows.
func (b *bench) runCEIL(ctx context.Context) *metricResult {
	n := b.cfg.Concurrency
	m := newMetric("CEIL", fmt.Sprintf("P2's load (%d executions looping steps), then P1's, against a null kernel that records nothing", n))
	m.Conditions = append([]string{"store: none; the null kernel checks signatures, parses JSON, hashes step identities and answers, recording nothing"},
		b.conditions(fmt.Sprintf("%d executions, one request in flight each", n))[1:]...)
	k, err := startNullKernel(b.token, b.pin, b.cfg.GOMAXPROCS)
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	b.running[k] = true
	defer b.stopKernel(k)
	c := newClient(k.URL, b.token, b.agentID, b.secret)
	if err := c.register(b.recv.URL, leaseSeconds); err != nil {
		m.Failed = fmt.Sprintf("register agent: %v", err)
		return m
	}
	l := b.stepLoad(ctx, m, k, c, 0, false)
	rate := float64(l.steps) / b.cfg.Duration.Seconds()
	m.addValue("throughput", rate, "steps/s (one step = submit + complete)")
	m.addLatency("pair under load", l.pair)
	m.addCalibration("throughput", fmt.Sprintf("%.0f steps/s", rate))
	kcpu, gen, _ := m.cpu.result()
	if l.steps > 0 {
		m.addValue("null kernel CPU per step", kcpu*b.cfg.Duration.Seconds()/float64(l.steps)*1e6, "µs of its core")
		m.addValue("load generator CPU per step", gen*b.cfg.Duration.Seconds()/float64(l.steps)*1e6, "µs of its core")
	}
	// P1's load too: what two round trips cost with nothing recorded.
	from, to := b.window()
	w := &stepWorker{c: c, r: b.recv, errs: m.errs, from: from, to: to, perExec: b.cfg.StepsPerExec}
	w.run(ctx)
	m.addLatency("pair, one at a time (P1's load)", w.pair)
	m.note("a calibration, not a target: P2's 5,000 steps/s is reachable here only if this is well above it, and the kernel's own work must fit in what the null kernel leaves of its core; P1's pair cannot be faster than the null kernel's pair plus two durable commits")
	return m
}

// load is what a step load measured in its window.
type load struct {
	steps           int64
	sub, comp, pair []time.Duration
	probe           *dispatchProbe
}

// stepLoad runs the configured number of step loops against k through c for
// one warm-up and window, with a P3 probe every probeInterval unless 0, and
// samples the CPU into m.
func (b *bench) stepLoad(ctx context.Context, m *metricResult, k *kernelProc, c *client, probeInterval time.Duration, carried bool) load {
	n := b.cfg.Concurrency
	from, to := b.window()
	m.cpu = &cpuSampler{}
	done := make(chan struct{})
	defer close(done)
	m.cpu.schedule(k, from, to, done)

	workers := make([]*stepWorker, n)
	var wg sync.WaitGroup
	for i := range workers {
		workers[i] = &stepWorker{c: c, r: b.recv, errs: m.errs, from: from, to: to, perExec: b.cfg.StepsPerExec, carried: carried}
		wg.Add(1)
		go func(w *stepWorker) { defer wg.Done(); w.run(ctx) }(workers[i])
	}
	var l load
	if probeInterval > 0 {
		l.probe = &dispatchProbe{c: c, r: b.recv, errs: m.errs, from: from, to: to, interval: probeInterval}
		wg.Add(1)
		go func() { defer wg.Done(); l.probe.run(ctx) }()
	}
	wg.Wait()
	m.cpu.stop()
	m.finishKernel(k)
	for _, w := range workers {
		l.steps += w.steps
		l.sub = append(l.sub, w.sub...)
		l.comp = append(l.comp, w.comp...)
		l.pair = append(l.pair, w.pair...)
	}
	return l
}

func (b *bench) runP3(ctx context.Context) *metricResult {
	m := newMetric("P3", "dispatch latency: client sends create → agent receives the webhook")
	m.Conditions = b.conditions("1 (one execution at a time: create, webhook, complete, next)")
	k, c, err := b.freshKernel("p3")
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer b.stopKernel(k)
	from, to := b.window()
	m.cpu = &cpuSampler{}
	done := make(chan struct{})
	defer close(done)
	m.cpu.schedule(k, from, to, done)
	p := &dispatchProbe{c: c, r: b.recv, errs: m.errs, from: from, to: to}
	p.run(ctx)
	m.cpu.stop()
	m.finishKernel(k)

	s := m.addLatency("create → webhook (one at a time)", p.dispatch)
	m.addLatency("create → 201 (one at a time)", p.created)
	if s.N > 0 {
		m.addTarget("p50 one at a time", "≤ 5 ms", ms(s.P50), s.P50 <= 5*time.Millisecond)
	} else {
		m.addTarget("p50 one at a time", "≤ 5 ms", "no samples", false)
	}
	if b.p3UnderLoad != nil {
		l := m.addLatency("create → webhook (under P2 load)", b.p3UnderLoad)
		m.addLatency("create → 201 (under P2 load)", b.p3UnderLoadCreate)
		if l.N > 0 {
			m.addTarget("p50 under P2 load", "≤ 5 ms", ms(l.P50), l.P50 <= 5*time.Millisecond)
		}
		m.note("the under-load figures were taken during P2 (its kernel, its CPU figures): one probe create every %s beside %d step loops", b.cfg.P3Interval, b.cfg.Concurrency)
	} else {
		m.note("run P2 as well to measure dispatch latency under load")
	}
	m.note("the webhook is timed when the receiver's handler starts; each execution is then completed, so nothing accumulates")
	return m
}
