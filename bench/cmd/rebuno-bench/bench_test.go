package main

import (
	"bytes"
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

func TestPercentileNearestRank(t *testing.T) {
	var samples []time.Duration
	for i := 100; i >= 1; i-- { // 1..100 ms, unsorted
		samples = append(samples, time.Duration(i)*time.Millisecond)
	}
	s := summarize(samples)
	if s.N != 100 || s.P50 != 50*time.Millisecond || s.P90 != 90*time.Millisecond || s.P99 != 99*time.Millisecond || s.Max != 100*time.Millisecond {
		t.Fatalf("summary %+v", s)
	}
	if s.Mean != 50500*time.Microsecond {
		t.Fatalf("mean %v", s.Mean)
	}
	if got := percentile([]time.Duration{7}, 0.99); got != 7 {
		t.Fatalf("single sample p99 = %v", got)
	}
	if got := percentile([]time.Duration{1, 2, 3}, 0.5); got != 2 {
		t.Fatalf("p50 of 1,2,3 = %v", got)
	}
	if got := summarize(nil); got.N != 0 || got.P50 != 0 {
		t.Fatalf("empty summary %+v", got)
	}
}

func TestRSSAtMark(t *testing.T) {
	samples := []rssSample{{0, 10}, {850, 11}, {900, 30}, {950, 20}, {990, 25}, {1000, 40}, {1100, 99}, {5000, 77}}
	// Samples between 900 and 1000 completed: 30, 20, 25, 40 → median (upper) 30.
	if got := rssAt(samples, 1000); got != 30 {
		t.Fatalf("rssAt(1000) = %d", got)
	}
	// No sample in [3600, 4000]: the first one at or after the mark.
	if got := rssAt(samples, 4000); got != 77 {
		t.Fatalf("rssAt(4000) = %d", got)
	}
	if got := rssAt(samples, 9000); got != 77 {
		t.Fatalf("rssAt past the end = %d", got)
	}
}

func TestProcReadings(t *testing.T) {
	deadline := time.Now().Add(50 * time.Millisecond)
	for x := 0; time.Now().Before(deadline); x++ {
		_ = x * x
	}
	cpu, err := procCPU(os.Getpid())
	if err != nil || cpu <= 0 {
		t.Fatalf("procCPU = %v, %v", cpu, err)
	}
	cur, peak := rss(os.Getpid())
	if cur <= 0 || peak < cur {
		t.Fatalf("rss = %d, peak %d", cur, peak)
	}
}

func TestParseFlags(t *testing.T) {
	c, err := parseFlags([]string{"-long", "-only", "p2, P4"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if c.Duration != 60*time.Second || c.Warmup != 10*time.Second || c.P5Large != 1000000 {
		t.Fatalf("-long defaults: %+v", c)
	}
	if !c.runs("P2") || !c.runs("P4") || c.runs("P1") {
		t.Fatalf("-only: %v", c.Only)
	}
	c, err = parseFlags([]string{"-long", "-duration", "2s"}, &bytes.Buffer{})
	if err != nil || c.Duration != 2*time.Second || c.Warmup != 10*time.Second {
		t.Fatalf("explicit -duration with -long: %+v %v", c, err)
	}
	// FORK and CEIL run only when named.
	c, err = parseFlags(nil, &bytes.Buffer{})
	if err != nil || !c.runs("P1") || c.runs("FORK") || c.runs("CEIL") {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	c, err = parseFlags([]string{"-only", "ceil"}, &bytes.Buffer{})
	if err != nil || !c.runs("CEIL") || c.runs("P2") {
		t.Fatalf("-only ceil: %+v %v", c, err)
	}
	if _, err := parseFlags([]string{"-only", "P9"}, &bytes.Buffer{}); err == nil {
		t.Fatal("-only P9 accepted")
	}
}

// runHarness runs the harness unpinned with cfg, whose JSON must name a
// file, and returns the report read back from it and what it printed.
func runHarness(t *testing.T, cfg *config) (*Report, *bytes.Buffer) {
	t.Helper()
	var out bytes.Buffer
	pin := pinning{KernelCPU: -1, SelfCPU: -1, Impossible: "not pinned in tests"}
	if err := run(context.Background(), cfg, pin, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	b, err := os.ReadFile(cfg.JSON)
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	return &r, &out
}

// TestHarnessSmoke runs every metric for a fraction of a second against the
// real kernel and checks that each produced numbers without errors.
func TestHarnessSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts several kernels")
	}
	bin := kt.Binary(t)
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	cfg := &config{
		Kernel: bin, Warmup: 100 * time.Millisecond, Duration: 500 * time.Millisecond, Only: map[string]bool{},
		Concurrency: 8, StepsPerExec: 40, P3Interval: 20 * time.Millisecond, P4Large: 3000,
		P5Base: 100, P5Large: 500, P5Steps: 1, JSON: jsonPath, TmpDir: t.TempDir(), GOMAXPROCS: 1,
	}
	r, out := runHarness(t, cfg)
	if len(r.Metrics) != 6 || r.KernelVersion == "" || strings.HasPrefix(r.KernelVersion, "unknown") || r.FsyncSamples == 0 {
		t.Fatalf("report header: %+v\n%s", r, out.String())
	}
	byID := map[string]*metricResult{}
	for _, m := range r.Metrics {
		byID[m.ID] = m
		if m.Failed != "" || m.Errors != 0 {
			t.Errorf("%s: failed %q, %d errors %v", m.ID, m.Failed, m.Errors, m.ErrorList)
		}
		if len(m.Targets) == 0 || m.KernelPeak <= 0 {
			t.Errorf("%s: targets %v, peak RSS %v", m.ID, m.Targets, m.KernelPeak)
		}
	}
	if t.Failed() {
		t.Fatal(out.String())
	}
	lat := func(id string, i int) latency { return byID[id].Latencies[i] }
	if p1 := lat("P1", 0); p1.N == 0 || p1.P50ms <= 0 || p1.P99ms < p1.P50ms {
		t.Errorf("P1 pair latency %+v", p1)
	}
	if v := byID["P2"].Values[0]; v.Name != "throughput" || v.Value <= 0 {
		t.Errorf("P2 throughput %+v", v)
	}
	if byID["P2"].WindowSec <= 0 || byID["P2"].KernelCPU <= 0 {
		t.Errorf("P2 CPU not measured: %+v", byID["P2"])
	}
	p3 := byID["P3"]
	if len(p3.Latencies) != 4 || p3.Latencies[0].N == 0 || p3.Latencies[2].N == 0 {
		t.Errorf("P3 latencies %+v", p3.Latencies)
	}
	wait := byID["WAIT"]
	if len(wait.Latencies) != 6 || wait.Latencies[0].N == 0 || wait.Latencies[3].N == 0 {
		t.Errorf("WAIT latencies %+v", wait.Latencies)
	}
	if v := wait.Values[0]; !strings.HasPrefix(v.Name, "requests per result, create and wait") || v.Value != 1 {
		t.Errorf("WAIT: %+v, want exactly one request per result", v)
	}
	if v := wait.Values[1]; !strings.HasPrefix(v.Name, "requests per result, create then") || v.Value != 2 {
		t.Errorf("WAIT: %+v, want two requests per result", v)
	}
	p4 := byID["P4"]
	if len(p4.Latencies) != 4 || !strings.Contains(p4.Latencies[3].Name, "3000 steps") {
		t.Fatalf("P4 latencies %+v", p4.Latencies)
	}
	for _, l := range p4.Latencies {
		if l.N == 0 {
			t.Errorf("P4 %s: no samples", l.Name)
		}
	}
	p5 := byID["P5"]
	if p5.Values[0].Name != "executions completed" || p5.Values[0].Value < 500 {
		t.Errorf("P5 values %+v", p5.Values)
	}
	if !strings.Contains(out.String(), "=== summary ===") || !strings.Contains(out.String(), "target") {
		t.Errorf("no summary table:\n%s", out.String())
	}
}
