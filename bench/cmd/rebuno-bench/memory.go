package main

import (
	"context"
	"fmt"
	"os"
	"slices"
	"sync"
	"sync/atomic"
	"time"
)

// rssSample is the kernel's resident memory when count executions had
// completed.
type rssSample struct {
	count int64
	rss   int64
}

// rssAt is the median of the samples taken while the completed count was in
// the last tenth before mark (the same load, just before the mark), or the
// first sample at or after mark when there is none.
func rssAt(samples []rssSample, mark int64) int64 {
	var in []int64
	for _, s := range samples {
		if s.count >= mark-mark/10 && s.count <= mark {
			in = append(in, s.rss)
		}
	}
	if len(in) == 0 {
		for _, s := range samples {
			if s.count >= mark {
				return s.rss
			}
		}
		if len(samples) > 0 {
			return samples[len(samples)-1].rss
		}
		return 0
	}
	slices.Sort(in)
	return in[len(in)/2]
}

func (b *bench) runP5(ctx context.Context) *metricResult {
	base, large := int64(b.cfg.P5Base), int64(b.cfg.P5Large)
	marks := []int64{base}
	if large > 100000 && base < 100000 {
		marks = append(marks, 100000)
	}
	marks = append(marks, large)
	n := b.cfg.Concurrency
	m := newMetric("P5", fmt.Sprintf("kernel memory after %d vs %d completed executions (%d step(s) each)", base, large, b.cfg.P5Steps))
	m.Conditions = b.conditions(fmt.Sprintf("%d executions in flight: create, webhook, submit, complete, complete the execution", n))
	k, c, err := b.freshKernel("p5")
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer b.stopKernel(k)

	var completed atomic.Int64
	var mu sync.Mutex
	var samples []rssSample
	sample := func() {
		cur, _ := k.RSS()
		mu.Lock()
		samples = append(samples, rssSample{count: completed.Load(), rss: cur})
		mu.Unlock()
	}
	done := make(chan struct{})
	var samplerDone sync.WaitGroup
	samplerDone.Add(1)
	go func() {
		defer samplerDone.Done()
		t := time.NewTicker(100 * time.Millisecond)
		defer t.Stop()
		for {
			select {
			case <-done:
				return
			case <-t.C:
				sample()
			}
		}
	}()

	m.cpu = &cpuSampler{}
	m.cpu.start(k)
	begin := time.Now()
	var progressMu sync.Mutex
	nextReport := large / 10
	var wg sync.WaitGroup
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func(worker int) {
			defer wg.Done()
			body := make([]byte, 0, 128)
			for j := 0; ctx.Err() == nil && completed.Load() < large; j++ {
				id, wh, _, err := start(ctx, c, b.recv, `{"bench":"memory"}`)
				if err != nil {
					m.errs.add(err)
					pause(ctx)
					continue
				}
				l := wh.lease()
				for step := 0; step < b.cfg.P5Steps && err == nil; step++ {
					body = fmt.Appendf(body[:0], `{"kind":"tool_call","target":"bench.memory","args":{"w":%d,"j":%d,"s":%d}}`, worker, j, step)
					var d decision
					d, err = c.submit(id, l, body, 0)
					if err == nil && d.Decision != "proceed" {
						err = fmt.Errorf("submit: decision %q, want proceed", d.Decision)
					}
					if err == nil {
						_, err = c.complete(id, d.StepID, l, `{"ok":true}`)
					}
				}
				if err == nil {
					err = c.finish(id, l, `{"done":true}`)
				}
				if err != nil {
					m.errs.add(err)
					pause(ctx)
					continue
				}
				if done := completed.Add(1); done%10000 == 0 {
					progressMu.Lock()
					if done >= nextReport {
						cur, _ := k.RSS()
						fmt.Fprintf(os.Stderr, "  P5: %d executions completed, kernel RSS %.1f MiB, %.0fs\n", done, mib(cur), time.Since(begin).Seconds())
						nextReport += large / 10
					}
					progressMu.Unlock()
				}
			}
		}(i)
	}
	wg.Wait()
	elapsed := time.Since(begin)
	m.cpu.stop()
	sample()
	close(done)
	samplerDone.Wait()
	m.finishKernel(k)

	total := completed.Load()
	m.addValue("executions completed", float64(total), "")
	m.addValue("rate", float64(total)/elapsed.Seconds(), "executions/s")
	m.addValue("database size at the end", mib(dbSize(k.db)), "MiB")
	rssMarks := make([]int64, len(marks))
	for i, mark := range marks {
		rssMarks[i] = rssAt(samples, mark)
		m.addValue(fmt.Sprintf("kernel RSS after %d executions", mark), mib(rssMarks[i]), "MiB")
	}
	if total < large || rssMarks[0] == 0 {
		m.addTarget("RSS ratio", "≤ 1.2×", "incomplete", false)
		return m
	}
	first, last := rssMarks[0], rssMarks[len(rssMarks)-1]
	ratio := float64(last) / float64(first)
	slope := float64(last-first) / float64(large-base)
	m.addValue(fmt.Sprintf("RSS ratio %d / %d", large, base), ratio, "×")
	m.addValue("slope", slope, "bytes per completed execution")
	name := fmt.Sprintf("RSS %s / %s", short(large), short(base))
	want := "≤ 1.2×"
	if !b.cfg.Long || large < 1000000 {
		m.note("docs/protocol/conformance.md §4 sets the 1.2× target on 1,000,000 vs 10,000 executions (make bench-long); this run reports %d vs %d and the slope", large, base)
	}
	m.addTarget(name, want, fmt.Sprintf("%.2f×", ratio), ratio <= 1.2)
	m.note("RSS at a mark is the median of 100 ms samples of VmRSS taken while the last tenth of the executions before it completed, under the same load")
	return m
}

func short(n int64) string {
	switch {
	case n >= 1000000 && n%1000000 == 0:
		return fmt.Sprintf("%dM", n/1000000)
	case n >= 1000 && n%1000 == 0:
		return fmt.Sprintf("%dk", n/1000)
	}
	return fmt.Sprint(n)
}
