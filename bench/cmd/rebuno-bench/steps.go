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
// send it.
type stepWorker struct {
	c       *client
	r       *receiver
	errs    *errorLog
	from    time.Time // measured window
	to      time.Time
	perExec int

	sub, comp, pair []time.Duration
	steps           int64 // steps whose complete returned inside the window
	executions      int
}

func (w *stepWorker) run(ctx context.Context) {
	var (
		id  string
		l   lease
		n   int
		buf = make([]byte, 0, 128)
	)
	finish := func() {
		if id != "" {
			if err := w.c.finish(id, l, fmt.Sprintf(`{"steps":%d}`, n)); err != nil {
				w.errs.add(err)
			}
			id = ""
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
		buf = fmt.Appendf(buf[:0], `{"kind":"tool_call","target":"bench.echo","args":{"i":%d}}`, n)
		t0 := time.Now()
		d, err := w.c.submit(id, l, buf, 0)
		t1 := time.Now()
		if err == nil && (d.Decision != "proceed" || d.StepID == "") {
			err = fmt.Errorf("submit: decision %q, want proceed", d.Decision)
		}
		if err != nil {
			w.errs.add(err)
			id = "" // abandon the execution; its lease simply lapses
			pause(ctx)
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
	if pair.N > 0 {
		m.addTarget("pair p50", "≤ 1 ms", ms(pair.P50), pair.P50 <= time.Millisecond)
		m.addTarget("pair p99", "≤ 5 ms", ms(pair.P99), pair.P99 <= 5*time.Millisecond)
	} else {
		m.addTarget("pair p50", "≤ 1 ms", "no samples", false)
	}
	m.note("Postgres: not measured — this build has no Postgres store (`rebuno server` is not available yet)")
	m.note("each step is a new tool_call with distinct args; two durable commits per step (submit, complete)")
	return m
}

func (b *bench) runP2(ctx context.Context) *metricResult {
	n := b.cfg.Concurrency
	m := newMetric("P2", fmt.Sprintf("sustained throughput, %d concurrent executions each looping steps", n))
	m.Conditions = b.conditions(fmt.Sprintf("%d executions, one request in flight each (+ P3 probe: one create every %s)", n, b.cfg.P3Interval))
	k, c, err := b.freshKernel("p2")
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

	workers := make([]*stepWorker, n)
	var wg sync.WaitGroup
	for i := range workers {
		workers[i] = &stepWorker{c: c, r: b.recv, errs: m.errs, from: from, to: to, perExec: b.cfg.StepsPerExec}
		wg.Add(1)
		go func(w *stepWorker) { defer wg.Done(); w.run(ctx) }(workers[i])
	}
	var probe *dispatchProbe
	if b.cfg.P3Interval > 0 {
		probe = &dispatchProbe{c: c, r: b.recv, errs: m.errs, from: from, to: to, interval: b.cfg.P3Interval}
		wg.Add(1)
		go func() { defer wg.Done(); probe.run(ctx) }()
	}
	wg.Wait()
	m.cpu.stop()
	m.finishKernel(k)

	var steps int64
	var sub, comp, pair []time.Duration
	for _, w := range workers {
		steps += w.steps
		sub = append(sub, w.sub...)
		comp = append(comp, w.comp...)
		pair = append(pair, w.pair...)
	}
	rate := float64(steps) / b.cfg.Duration.Seconds()
	m.addValue("throughput", rate, "steps/s (one step = submit + complete)")
	m.addValue("steps in window", float64(steps), "")
	m.addLatency("submit under load", sub)
	m.addLatency("complete under load", comp)
	m.addLatency("pair under load", pair)
	m.addTarget("throughput", "≥ 5,000 steps/s", fmt.Sprintf("%.0f steps/s", rate), rate >= 5000)
	if probe != nil {
		b.p3UnderLoad = probe.dispatch
		b.p3UnderLoadCreate = probe.created
	}
	if kcpu, gen, _ := m.cpu.result(); gen >= 0.95 {
		m.note("the load generator used %.0f%% of its core: throughput may be limited by the generator, not the kernel", 100*gen)
	} else if kcpu >= 0.95 {
		m.note("the kernel used %.0f%% of its core: throughput is CPU-bound in the kernel", 100*kcpu)
	}
	return m
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
