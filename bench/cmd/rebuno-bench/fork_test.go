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

func TestParseFlagsFork(t *testing.T) {
	c, err := parseFlags([]string{"-only", "fork", "-fork-steps", "500", "-fork-samples", "3"}, &bytes.Buffer{})
	if err != nil || !c.runs("FORK") || c.runs("P1") || c.ForkSteps != 500 || c.ForkSamples != 3 {
		t.Fatalf("-only fork: %+v %v", c, err)
	}
	// FORK is opt-in: not part of the default set.
	c, err = parseFlags(nil, &bytes.Buffer{})
	if err != nil || c.runs("FORK") || !c.runs("P4") || c.ForkSteps != 10000 || c.ForkSamples != 20 {
		t.Fatalf("defaults: %+v %v", c, err)
	}
	for _, bad := range [][]string{{"-fork-steps", "99"}, {"-fork-samples", "0"}} {
		if _, err := parseFlags(bad, &bytes.Buffer{}); err == nil {
			t.Fatalf("%v accepted", bad)
		}
	}
}

// TestForkMetricSmoke runs FORK on small sources against the real kernel
// and checks that it produced every number without errors.
func TestForkMetricSmoke(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a kernel")
	}
	jsonPath := filepath.Join(t.TempDir(), "bench.json")
	cfg := &config{
		Kernel: kt.Binary(t), Warmup: 0, Duration: time.Second, Only: map[string]bool{"FORK": true}, Concurrency: 1,
		StepsPerExec: 1, P4Large: 1, P5Base: 1, P5Large: 2, ForkSteps: 300, ForkSamples: 3, JSON: jsonPath, TmpDir: t.TempDir(), GOMAXPROCS: 1,
	}
	var out bytes.Buffer
	pin := pinning{KernelCPU: -1, SelfCPU: -1, Impossible: "not pinned in tests"}
	if err := run(context.Background(), cfg, pin, &out); err != nil {
		t.Fatalf("run: %v\n%s", err, out.String())
	}
	b, err := os.ReadFile(jsonPath)
	if err != nil {
		t.Fatal(err)
	}
	var r Report
	if err := json.Unmarshal(b, &r); err != nil {
		t.Fatal(err)
	}
	if len(r.Metrics) != 1 || r.Metrics[0].ID != "FORK" {
		t.Fatalf("metrics %+v", r.Metrics)
	}
	m := r.Metrics[0]
	if m.Failed != "" || m.Errors != 0 || len(m.Latencies) != 4 || len(m.Targets) != 4 {
		t.Fatalf("FORK: failed %q, errors %v, latencies %+v, targets %+v\n%s", m.Failed, m.ErrorList, m.Latencies, m.Targets, out.String())
	}
	for i, l := range m.Latencies {
		if want := []int{3, 3, 60, 6}[i]; l.N != want || l.P50ms <= 0 {
			t.Errorf("%s: %d samples (want %d), p50 %v", l.Name, l.N, want, l.P50ms)
		}
	}
	var ratio bool
	for _, v := range m.Values {
		ratio = ratio || (strings.Contains(v.Name, "ratio") && v.Value > 0)
	}
	if !ratio {
		t.Errorf("no 64 KiB / 4 KiB ratio in %+v", m.Values)
	}
}
