package main

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"strconv"
	"strings"
	"sync"
	"text/tabwriter"
	"time"
)

// Report is everything one run measured; -json writes it.
type Report struct {
	Date          string          `json:"date"`
	Host          string          `json:"host"`
	CPUModel      string          `json:"cpu_model"`
	CPUs          int             `json:"cpus"`
	OSRelease     string          `json:"os_release"`
	GoVersion     string          `json:"go_version"`
	KernelBinary  string          `json:"kernel_binary"`
	KernelVersion string          `json:"kernel_version"`
	Store         string          `json:"store"`
	Durability    string          `json:"durability"`
	Pinning       string          `json:"pinning"`
	Pinned        bool            `json:"pinned"`
	Disk          string          `json:"disk"`
	FsyncP50ms    float64         `json:"fsync_p50_ms"`
	FsyncP99ms    float64         `json:"fsync_p99_ms"`
	FsyncSamples  int             `json:"fsync_samples"`
	LoadAvgBefore string          `json:"load_average_before"`
	WarmupSeconds float64         `json:"warmup_seconds"`
	WindowSeconds float64         `json:"window_seconds"`
	Long          bool            `json:"long"`
	Metrics       []*metricResult `json:"metrics"`
}

// metricResult is one metric of docs/protocol/conformance.md §4.
type metricResult struct {
	ID         string    `json:"id"`
	Title      string    `json:"title"`
	Conditions []string  `json:"conditions"`
	Latencies  []latency `json:"latencies,omitempty"`
	Values     []value   `json:"values,omitempty"`
	Targets    []target  `json:"targets"`
	WindowSec  float64   `json:"window_seconds"`
	KernelCPU  float64   `json:"kernel_cpu_cores"`
	KernelWait float64   `json:"kernel_runqueue_wait_fraction"`
	// Other work on the kernel's core: busy time not spent by the kernel,
	// and time stolen by the hypervisor, as fractions of the window.
	CoreOthers float64 `json:"kernel_core_other_work_fraction"`
	CoreSteal  float64 `json:"kernel_core_steal_fraction"`
	LoadGenCPU float64 `json:"load_generator_cpu_cores"`
	KernelRSS  float64 `json:"kernel_rss_mib"`
	KernelPeak float64 `json:"kernel_peak_rss_mib"`
	KernelCPUs string  `json:"kernel_cpus_allowed"`
	// Group commit as the kernel's own metrics saw it over the window.
	Commits      float64     `json:"commits,omitempty"`
	CommitBatch  float64     `json:"mean_transactions_per_commit,omitempty"`
	CommitMeanMs float64     `json:"mean_commit_ms,omitempty"`
	Errors       int64       `json:"errors"`
	ErrorList    []string    `json:"first_errors,omitempty"`
	Notes        []string    `json:"notes,omitempty"`
	Failed       string      `json:"failed,omitempty"`
	errs         *errorLog   // collected while running
	cpu          *cpuSampler // kernel and generator CPU over the window
}

type latency struct {
	Name   string  `json:"name"`
	N      int     `json:"n"`
	P50ms  float64 `json:"p50_ms"`
	P90ms  float64 `json:"p90_ms"`
	P99ms  float64 `json:"p99_ms"`
	MaxMs  float64 `json:"max_ms"`
	MeanMs float64 `json:"mean_ms"`
	text   string
}

type value struct {
	Name  string  `json:"name"`
	Value float64 `json:"value"`
	Unit  string  `json:"unit"`
}

type target struct {
	Name   string `json:"name"`
	Target string `json:"target"`
	Actual string `json:"actual"`
	Met    bool   `json:"met"`
	// Calibration marks a reading with no target of its own (CEIL), listed
	// in the summary beside the targets it helps to read.
	Calibration bool `json:"calibration,omitempty"`
}

func newMetric(id, title string) *metricResult {
	return &metricResult{ID: id, Title: title, errs: &errorLog{}}
}

func (m *metricResult) addLatency(name string, samples []time.Duration) summary {
	s := summarize(samples)
	m.Latencies = append(m.Latencies, latency{Name: name, N: s.N, P50ms: msf(s.P50), P90ms: msf(s.P90), P99ms: msf(s.P99),
		MaxMs: msf(s.Max), MeanMs: msf(s.Mean), text: s.String()})
	return s
}

func (m *metricResult) addValue(name string, v float64, unit string) {
	m.Values = append(m.Values, value{Name: name, Value: v, Unit: unit})
}

func (m *metricResult) addTarget(name, want, actual string, met bool) {
	m.Targets = append(m.Targets, target{Name: name, Target: want, Actual: actual, Met: met})
}

func (m *metricResult) addCalibration(name, actual string) {
	m.Targets = append(m.Targets, target{Name: name, Target: "none", Actual: actual, Calibration: true})
}

func (m *metricResult) note(format string, args ...any) {
	m.Notes = append(m.Notes, fmt.Sprintf(format, args...))
}

// finishKernel records the kernel's memory and pinning before it stops.
func (m *metricResult) finishKernel(k *kernelProc) {
	cur, peak := k.RSS()
	m.KernelRSS, m.KernelPeak = mib(cur), mib(peak)
	m.KernelCPUs = k.AllowedCPUs()
}

func (m *metricResult) collect() {
	m.Errors, m.ErrorList = m.errs.snapshot()
	if m.cpu != nil {
		m.KernelCPU, m.LoadGenCPU, m.WindowSec = m.cpu.result()
		m.Commits, m.CommitBatch, m.CommitMeanMs = m.cpu.commits()
		m.KernelWait = m.cpu.waitFraction()
		m.CoreOthers, m.CoreSteal = m.cpu.coreShare()
	}
}

func mib(b int64) float64 { return float64(b) / (1 << 20) }

// errorLog counts failures and keeps the first few.
type errorLog struct {
	mu    sync.Mutex
	n     int64
	first []string
}

func (e *errorLog) add(err error) {
	e.mu.Lock()
	defer e.mu.Unlock()
	e.n++
	if len(e.first) < 5 {
		e.first = append(e.first, err.Error())
	}
}

func (e *errorLog) count() int64 {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n
}

func (e *errorLog) snapshot() (int64, []string) {
	e.mu.Lock()
	defer e.mu.Unlock()
	return e.n, append([]string(nil), e.first...)
}

// cpuSampler measures the CPU the kernel and this process use over a window.
type cpuSampler struct {
	mu                sync.Mutex
	k                 *kernelProc
	t0, t1            time.Time
	k0, k1, s0, s1    time.Duration
	w0, w1            time.Duration
	core              int
	b0, b1, st0, st1  time.Duration
	coreOK            bool
	c0, c1            commitCounters
	started, finished bool
}

func (c *cpuSampler) start(k *kernelProc) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.c0 = scrapeCommits(k.URL)
	c.k, c.t0, c.k0, c.s0, c.started = k, time.Now(), k.CPU(), selfCPU(), true
	c.w0 = runqueueWait(k.Pid)
	c.core = k.pin.KernelCPU
	c.b0, c.st0, c.coreOK = coreTimes(c.core)
}

func (c *cpuSampler) stop() {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.started || c.finished {
		return
	}
	c.t1, c.k1, c.s1, c.finished = time.Now(), c.k.CPU(), selfCPU(), true
	c.w1 = runqueueWait(c.k.Pid)
	var ok bool
	c.b1, c.st1, ok = coreTimes(c.core)
	c.coreOK = c.coreOK && ok
	c.c1 = scrapeCommits(c.k.URL)
}

// waitFraction is the share of the window the kernel's threads spent
// runnable but waiting for a CPU (summed over threads).
func (c *cpuSampler) waitFraction() float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.t1.Sub(c.t0)
	if !c.finished || w <= 0 || c.w1 < c.w0 {
		return 0
	}
	return float64(c.w1-c.w0) / float64(w)
}

// coreShare returns, as fractions of the window, the busy time of the
// kernel's core that the kernel did not use (other processes, interrupts)
// and the time the hypervisor stole from it.
func (c *cpuSampler) coreShare() (others, steal float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	w := c.t1.Sub(c.t0)
	if !c.finished || !c.coreOK || w <= 0 {
		return 0, 0
	}
	others = float64((c.b1-c.b0)-(c.k1-c.k0)) / float64(w)
	if others < 0 {
		others = 0
	}
	return others, float64(c.st1-c.st0) / float64(w)
}

// commits returns the physical commits over the window, the mean number of
// transactions each carried, and their mean duration in milliseconds.
func (c *cpuSampler) commits() (n, batch, meanMs float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.finished || !c.c0.ok || !c.c1.ok {
		return 0, 0, 0
	}
	n = c.c1.count - c.c0.count
	if n <= 0 {
		return 0, 0, 0
	}
	return n, (c.c1.batchSum - c.c0.batchSum) / n, 1000 * (c.c1.secondsSum - c.c0.secondsSum) / n
}

// result returns the kernel's and this process's CPU use in cores (1.0 = one
// core busy all the time) and the window length in seconds.
func (c *cpuSampler) result() (kernel, self, window float64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if !c.finished {
		return 0, 0, 0
	}
	w := c.t1.Sub(c.t0).Seconds()
	if w <= 0 {
		return 0, 0, 0
	}
	return (c.k1 - c.k0).Seconds() / w, (c.s1 - c.s0).Seconds() / w, w
}

// schedule runs the sampler over [from, to) in the background.
func (c *cpuSampler) schedule(k *kernelProc, from, to time.Time, done <-chan struct{}) {
	go func() {
		select {
		case <-time.After(time.Until(from)):
		case <-done:
			return
		}
		c.start(k)
		select {
		case <-time.After(time.Until(to)):
		case <-done:
		}
		c.stop()
	}()
}

func metOrMissed(t target) string {
	if t.Calibration {
		return "calibration"
	}
	if t.Met {
		return "target met"
	}
	return "target MISSED"
}

// printHeader prints the conditions every metric shares.
func printHeader(w io.Writer, r *Report) {
	fmt.Fprintf(w, "rebuno-bench — docs/protocol/conformance.md §4 performance run, %s\n", r.Date)
	fmt.Fprintf(w, "  machine:        %s, %s, %d CPUs, Linux %s\n", r.Host, r.CPUModel, r.CPUs, r.OSRelease)
	fmt.Fprintf(w, "  kernel:         %s (%s)\n", r.KernelVersion, r.KernelBinary)
	fmt.Fprintf(w, "  store:          %s\n", r.Store)
	fmt.Fprintf(w, "  durability:     %s\n", r.Durability)
	fmt.Fprintf(w, "  pinning:        %s\n", r.Pinning)
	fmt.Fprintf(w, "  disk:           %s\n", r.Disk)
	fmt.Fprintf(w, "  fsync latency:  p50 %.3f ms, p99 %.3f ms (%d × 4 KiB write+fsync in the bench folder)\n", r.FsyncP50ms, r.FsyncP99ms, r.FsyncSamples)
	fmt.Fprintf(w, "  load average:   %s (before the run; other work on the machine skews results)\n", r.LoadAvgBefore)
	fmt.Fprintf(w, "  timing:         %gs warm-up, %gs measured per metric%s\n", r.WarmupSeconds, r.WindowSeconds, map[bool]string{true: " (-long)", false: ""}[r.Long])
	fmt.Fprintf(w, "  load generator: %s, in this process (HTTP/1.1 keep-alive, v1 signatures, dispatch headers)\n", r.GoVersion)
	if f := strings.Fields(r.LoadAvgBefore); len(f) > 0 {
		if l, err := strconv.ParseFloat(f[0], 64); err == nil && l > 1 {
			fmt.Fprintf(w, "WARNING: the machine was busy before the run (load average %.2f); see each metric's line on the kernel's core\n", l)
		}
	}
	fmt.Fprintln(w)
}

// printMetric prints one metric with its conditions.
func printMetric(w io.Writer, m *metricResult) {
	fmt.Fprintf(w, "=== %s  %s ===\n", m.ID, m.Title)
	for _, c := range m.Conditions {
		fmt.Fprintf(w, "  condition: %s\n", c)
	}
	if m.Failed != "" {
		fmt.Fprintf(w, "  FAILED: %s\n", m.Failed)
	}
	for _, l := range m.Latencies {
		fmt.Fprintf(w, "  %-50s %s\n", l.Name, l.text)
	}
	for _, v := range m.Values {
		fmt.Fprintf(w, "  %-50s %s %s\n", v.Name, num(v.Value), v.Unit)
	}
	for _, t := range m.Targets {
		if t.Calibration {
			continue // its value is printed above
		}
		fmt.Fprintf(w, "  target %-43s %-16s actual %-14s %s\n", t.Name, t.Target, t.Actual, metOrMissed(t))
	}
	if m.WindowSec > 0 {
		fmt.Fprintf(w, "  %-50s kernel %.2f core (%.0f%%), load generator %.2f core (%.0f%%)\n",
			fmt.Sprintf("CPU over the %.1fs window:", m.WindowSec), m.KernelCPU, 100*m.KernelCPU, m.LoadGenCPU, 100*m.LoadGenCPU)
	}
	if m.WindowSec > 0 {
		fmt.Fprintf(w, "  %-50s other processes %.0f%%, stolen by the hypervisor %.0f%%%s\n", "the kernel's core, besides the kernel:",
			100*m.CoreOthers, 100*m.CoreSteal, contention(m.CoreOthers+m.CoreSteal))
		fmt.Fprintf(w, "  %-50s %.0f%% of the window (summed over its threads)\n", "kernel threads runnable but waiting for the core:", 100*m.KernelWait)
	}
	if m.Commits > 0 {
		fmt.Fprintf(w, "  %-50s %.0f commits (%.0f/s), %.1f transactions per commit, %.3f ms per commit\n", "group commit over the window (kernel metrics):",
			m.Commits, m.Commits/m.WindowSec, m.CommitBatch, m.CommitMeanMs)
	}
	fmt.Fprintf(w, "  %-50s RSS %.1f MiB, peak (VmHWM) %.1f MiB; kernel CPUs allowed: %s\n", "kernel memory at the end:", m.KernelRSS, m.KernelPeak, m.KernelCPUs)
	fmt.Fprintf(w, "  %-50s %d\n", "errors:", m.Errors)
	for _, e := range m.ErrorList {
		fmt.Fprintf(w, "    %s\n", e)
	}
	for _, n := range m.Notes {
		fmt.Fprintf(w, "  note: %s\n", n)
	}
	fmt.Fprintln(w)
}

func num(v float64) string {
	switch {
	case v == float64(int64(v)) && v < 1e15 && v > -1e15:
		return fmt.Sprintf("%d", int64(v))
	case v >= 100 || v <= -100:
		return fmt.Sprintf("%.0f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// printTable prints the short summary table.
func printTable(w io.Writer, r *Report) {
	fmt.Fprintln(w, "=== summary ===")
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "metric\tmeasured\ttarget\tresult\tkernel CPU\tgen CPU\tothers on kernel core\tpeak RSS")
	for _, m := range r.Metrics {
		if m.Failed != "" {
			fmt.Fprintf(tw, "%s\tFAILED: %s\t\t\t\t\t\t\n", m.ID, firstLine(m.Failed))
			continue
		}
		for i, t := range m.Targets {
			cpuK, cpuG, others, peak := "", "", "", ""
			if i == 0 {
				if m.WindowSec > 0 {
					cpuK, cpuG = fmt.Sprintf("%.0f%%", 100*m.KernelCPU), fmt.Sprintf("%.0f%%", 100*m.LoadGenCPU)
					others = fmt.Sprintf("%.0f%%", 100*(m.CoreOthers+m.CoreSteal))
				}
				peak = fmt.Sprintf("%.1f MiB", m.KernelPeak)
			}
			fmt.Fprintf(tw, "%s %s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n", m.ID, t.Name, t.Actual, t.Target, metOrMissed(t), cpuK, cpuG, others, peak)
		}
	}
	tw.Flush()
	fmt.Fprintf(w, "conditions: %s; %s; fsync p50 %.3f ms; kernel %s\n", r.Store, r.Pinning, r.FsyncP50ms, r.KernelVersion)
}

func firstLine(s string) string {
	if i := strings.IndexByte(s, '\n'); i >= 0 {
		return s[:i]
	}
	return s
}

func writeJSON(path string, r *Report) error {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return err
	}
	return os.WriteFile(path, append(b, '\n'), 0o644)
}

// commitCounters are the kernel's group-commit histograms' sums and count.
type commitCounters struct {
	ok                          bool
	batchSum, count, secondsSum float64
}

// scrapeCommits reads rebuno_store_commit_* from the kernel's /metrics.
func scrapeCommits(base string) commitCounters {
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		return commitCounters{}
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil || resp.StatusCode != 200 {
		return commitCounters{}
	}
	var c commitCounters
	found := 0
	for _, line := range strings.Split(string(b), "\n") {
		name, val, ok := strings.Cut(line, " ")
		if !ok {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil {
			continue
		}
		switch name {
		case "rebuno_store_commit_batch_size_sum":
			c.batchSum = v
			found++
		case "rebuno_store_commit_batch_size_count":
			c.count = v
			found++
		case "rebuno_store_commit_seconds_sum":
			c.secondsSum = v
			found++
		}
	}
	c.ok = found == 3
	return c
}

func contention(wait float64) string {
	if wait >= 0.10 {
		return " — OTHER WORK COMPETED FOR THE KERNEL'S CORE: numbers are pessimistic"
	}
	return ""
}
