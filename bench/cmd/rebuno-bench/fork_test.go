package main

import (
	"bytes"
	"database/sql"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/store/sqlite"
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
	r, out := runHarness(t, cfg)
	if len(r.Metrics) != 1 || r.Metrics[0].ID != "FORK" {
		t.Fatalf("metrics %+v", r.Metrics)
	}
	m := r.Metrics[0]
	// -fork-steps 300: the ladder is 100 and 300 steps (4 KiB), then 300
	// steps with 64 KiB results, then the two coverage queries.
	if m.Failed != "" || m.Errors != 0 || len(m.Latencies) != 5 || len(m.Targets) != 5 {
		t.Fatalf("FORK: failed %q, errors %v, latencies %+v, targets %+v\n%s", m.Failed, m.ErrorList, m.Latencies, m.Targets, out.String())
	}
	wantNames := []string{"fork at the last event, 100 steps, 4 KiB results", "fork at the last event, 300 steps, 4 KiB results",
		"fork at the last event, 300 steps, 64 KiB results", "coverage point query, 300 steps", "coverage ranges query, 300 steps, 3 checkpoints"}
	for i, l := range m.Latencies {
		if want := []int{3, 3, 3, 60, 6}[i]; l.Name != wantNames[i] || l.N != want || l.P50ms <= 0 {
			t.Errorf("latency %d: %q with %d samples, p50 %v; want %q with %d", i, l.Name, l.N, l.P50ms, wantNames[i], want)
		}
	}
	values := map[string]float64{}
	for _, v := range m.Values {
		values[v.Name] = v.Value
	}
	for _, name := range []string{"fork p50, 100 steps, 4 KiB results", "fork p95, 100 steps, 4 KiB results",
		"fork p50, 300 steps, 4 KiB results", "fork p95, 300 steps, 4 KiB results", "fork p95, 300 steps, 64 KiB results",
		"fork p95 ratio, 64 KiB / 4 KiB results"} {
		if values[name] <= 0 {
			t.Errorf("value %q missing or not positive in %+v", name, m.Values)
		}
	}
	if _, ok := values["fork p50 growth from 100 to 300 steps, per 1,000 steps"]; !ok {
		t.Errorf("no growth value in %+v", m.Values)
	}
	// The sources: one checkpoint every 100 steps, four events per step.
	for _, want := range []string{"source of 100 steps with 4 KiB results: 405 events, 1 checkpoints, written in",
		"source of 300 steps with 4 KiB results: 1207 events, 3 checkpoints, written in",
		"source of 300 steps with 64 KiB results: 1207 events, 3 checkpoints, written in"} {
		if _, ok := values[want]; !ok {
			t.Errorf("no value %q in %+v", want, m.Values)
		}
	}
	wantTargets := []string{"fork p95, 300 steps (4 KiB), docs/protocol/forks.md §6", "fork p95, 300 steps (4 KiB), aim", "fork p95 64 KiB / 4 KiB",
		"coverage point p95", "coverage ranges p95"}
	for i, tg := range m.Targets {
		if tg.Name != wantTargets[i] || strings.Contains(tg.Actual, "no samples") {
			t.Errorf("target %d: %+v, want %q with samples", i, tg, wantTargets[i])
		}
	}
	if !strings.Contains(out.String(), "target fork p95, 300 steps (4 KiB), aim") {
		t.Errorf("the aim is not printed:\n%s", out.String())
	}
}

func TestForkLadder(t *testing.T) {
	for _, c := range []struct {
		n    int
		want []int
	}{
		{10000, []int{100, 1000, 10000}},
		{20000, []int{100, 1000, 10000, 20000}},
		{5000, []int{100, 1000, 5000}},
		{1000, []int{100, 1000}},
		{300, []int{100, 300}},
		{100, []int{100}},
	} {
		if got := forkLadder(c.n); !slices.Equal(got, c.want) {
			t.Errorf("forkLadder(%d) = %v, want %v", c.n, got, c.want)
		}
	}
	if got := perThousandSteps(1000, 100*time.Millisecond, 10000, 910*time.Millisecond); got < 89.999 || got > 90.001 {
		t.Errorf("growth 100 → 910 ms over 9,000 steps = %v ms per 1,000, want 90", got)
	}
	if got := perThousandSteps(100, time.Millisecond, 100, 2*time.Millisecond); got != 0 {
		t.Errorf("growth over no steps = %v", got)
	}
}

// TestForkSourcesAreStoredAsLiveLogsAre: the sources' events are appended a
// step's worth at a time, so the store keeps them as it keeps a live
// execution's log, not as one large append (whose runs read faster).
func TestForkSourcesAreStoredAsLiveLogsAre(t *testing.T) {
	path := filepath.Join(t.TempDir(), "src.db")
	st, err := sqlite.Open(sqlite.Options{Path: path, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	src, err := insertForkSource(st, "agent-a", 300, 64, 3)
	st.Close()
	if err != nil {
		t.Fatal(err)
	}
	db, err := sql.Open("sqlite", "file:"+filepath.ToSlash(path)+"?mode=ro")
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	var rows, inRuns, largest int64
	if err := db.QueryRow(`SELECT COUNT(*) FROM events WHERE execution_id = ?`, src.id).Scan(&rows); err != nil {
		t.Fatal(err)
	}
	err = db.QueryRow(`SELECT COALESCE(SUM(last_seq - first_seq + 1), 0), COALESCE(MAX(last_seq - first_seq + 1), 0)
 FROM event_runs WHERE execution_id = ?`, src.id).Scan(&inRuns, &largest)
	if err != nil {
		t.Fatal(err)
	}
	if rows+inRuns != src.lastSeq || largest > 4 {
		t.Fatalf("source of %d events: %d rows, %d events in runs of up to %d", src.lastSeq, rows, inRuns, largest)
	}
}
