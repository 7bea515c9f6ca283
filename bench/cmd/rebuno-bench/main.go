// Command rebuno-bench is the benchmark harness of docs/protocol/conformance.md §4. It starts
// the kernel binary on a fresh SQLite file pinned to one core, drives it over
// HTTP loopback from this process (pinned to the other core) as a client and
// as an agent with a real webhook receiver, and reports P1–P5 and WAIT with the
// conditions they were measured under. Targets are reported, never asserted:
// the exit status is 0 whenever the measurements could be made.
//
//	rebuno-bench -kernel bin/rebuno            # make bench
//	rebuno-bench -kernel bin/rebuno -long      # make bench-long
//	rebuno-bench -kernel bin/rebuno -only P2 -duration 5s -warmup 1s
package main

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"time"
)

type config struct {
	Kernel       string
	Long         bool
	Warmup       time.Duration
	Duration     time.Duration
	Only         map[string]bool
	Concurrency  int
	StepsPerExec int
	P3Interval   time.Duration
	P4Large      int
	P5Base       int
	P5Large      int
	P5Steps      int
	ForkSteps    int
	ForkSamples  int
	JSON         string
	TmpDir       string
	Keep         bool
	NoPin        bool
	GOMAXPROCS   int
	// GOMAXPROCSSet: -kernel-gomaxprocs was given, which server mode
	// then applies to its replicas too (they default to every CPU).
	GOMAXPROCSSet bool
	Postgres      string
}

var allMetrics = []string{"P1", "P2", "P3", "WAIT", "P4", "P5"}

// optionalMetrics run only when -only names them; the PG ones need
// -postgres.
var optionalMetrics = []string{"FORK", "CEIL", "PG1", "PG3", "PGFORK"}

func parseFlags(args []string, stderr io.Writer) (*config, error) {
	fs := flag.NewFlagSet("rebuno-bench", flag.ContinueOnError)
	fs.SetOutput(stderr)
	c := &config{}
	fs.StringVar(&c.Kernel, "kernel", "bin/rebuno", "kernel binary to benchmark")
	fs.BoolVar(&c.Long, "long", false, "make bench-long: 60s windows after 10s warm-up, and P5 up to 1,000,000 executions")
	fs.DurationVar(&c.Warmup, "warmup", 5*time.Second, "warm-up before each measured window (default 10s with -long)")
	fs.DurationVar(&c.Duration, "duration", 20*time.Second, "measured window per metric (default 60s with -long)")
	only := fs.String("only", "", "comma-separated metrics to run (P1,P2,P3,WAIT,P4,P5, and FORK, CEIL, PG1, PG3 and PGFORK, which run only when named); all but those when empty")
	fs.IntVar(&c.Concurrency, "concurrency", 64, "concurrent executions for P2 and P5")
	fs.IntVar(&c.StepsPerExec, "steps-per-execution", 10000, "P1/P2: an execution is completed and replaced after this many steps")
	fs.DurationVar(&c.P3Interval, "p3-load-interval", 50*time.Millisecond, "P3 under load: one probe execution every this long")
	fs.IntVar(&c.P4Large, "p4-steps", 100000, "P4: recorded steps of the long history (inserted through the store)")
	fs.IntVar(&c.P5Base, "p5-base", 10000, "P5: completed executions at the first memory reading")
	fs.IntVar(&c.P5Large, "p5-executions", 100000, "P5: completed executions at the last memory reading (1,000,000 with -long)")
	fs.IntVar(&c.P5Steps, "p5-steps", 1, "P5: steps per execution")
	fs.IntVar(&c.ForkSteps, "fork-steps", 10000, "FORK: steps of each source execution (inserted through the store)")
	fs.IntVar(&c.ForkSamples, "fork-samples", 20, "FORK: forks measured per source")
	fs.StringVar(&c.JSON, "json", "", "also write every number as JSON to this file")
	fs.StringVar(&c.TmpDir, "tmpdir", "", "parent folder of the bench's temporary folder (the disk under test); default $TMPDIR")
	fs.BoolVar(&c.Keep, "keep", false, "keep the temporary folder with the databases")
	fs.BoolVar(&c.NoPin, "no-pin", false, "do not pin the kernel and the load generator to cores")
	fs.StringVar(&c.Postgres, "postgres", "", "PG1, PG3, PGFORK: a Postgres server (postgres://…) on which the bench may create and drop databases; tests/postgres/cluster.sh start makes one")
	fs.IntVar(&c.GOMAXPROCS, "kernel-gomaxprocs", 1, "GOMAXPROCS of the kernel (docs/protocol/conformance.md §4 conditions: 1; other values are for diagnosis only)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	c.GOMAXPROCSSet = set["kernel-gomaxprocs"]
	if c.Long {
		if !set["warmup"] {
			c.Warmup = 10 * time.Second
		}
		if !set["duration"] {
			c.Duration = 60 * time.Second
		}
		if !set["p5-executions"] {
			c.P5Large = 1000000
		}
	}
	c.Only = map[string]bool{}
	for _, m := range strings.Split(*only, ",") {
		m = strings.ToUpper(strings.TrimSpace(m))
		if m == "" {
			continue
		}
		ok := false
		for _, known := range append(append([]string{}, allMetrics...), optionalMetrics...) {
			ok = ok || m == known
		}
		if !ok {
			return nil, fmt.Errorf("-only: unknown metric %q (want P1..P5, WAIT, FORK, CEIL, PG1, PG3 or PGFORK)", m)
		}
		c.Only[m] = true
	}
	switch {
	case c.Duration <= 0 || c.Warmup < 0:
		return nil, errors.New("-duration must be > 0 and -warmup >= 0")
	case c.Concurrency < 1:
		return nil, errors.New("-concurrency must be >= 1")
	case c.P4Large < 1 || c.P5Base < 1 || c.P5Large <= c.P5Base:
		return nil, errors.New("-p4-steps and -p5-base must be >= 1 and -p5-executions > -p5-base")
	case c.GOMAXPROCS < 1:
		return nil, errors.New("-kernel-gomaxprocs must be >= 1")
	case c.P5Steps < 0:
		return nil, errors.New("-p5-steps must be >= 0")
	case c.StepsPerExec < 1:
		return nil, errors.New("-steps-per-execution must be >= 1")
	case c.ForkSteps < 100 || c.ForkSamples < 1:
		return nil, errors.New("-fork-steps must be >= 100 and -fork-samples >= 1")
	}
	return c, nil
}

// serverModeOnly reports whether every metric to run is a server-mode one.
func serverModeOnly(c *config) bool {
	for m := range c.Only {
		if !strings.HasPrefix(m, "PG") {
			return false
		}
	}
	return len(c.Only) > 0
}

func (c *config) runs(id string) bool {
	for _, o := range optionalMetrics {
		if id == o {
			return c.Only[id]
		}
	}
	return len(c.Only) == 0 || c.Only[id]
}

// bench holds what the metrics share.
type bench struct {
	cfg       *config
	kernelBin string
	pin       pinning
	tmp       string
	token     string
	agentID   string
	secret    string
	recv      *receiver
	out       io.Writer
	report    *Report
	running   map[*kernelProc]bool

	// P3 under load is measured during P2.
	p3UnderLoad, p3UnderLoadCreate []time.Duration

	pgVersion string // of the -postgres server
}

func main() {
	if len(os.Args) > 1 && os.Args[1] == nullKernelArg {
		// Pinned by the harness that started it, like the kernel.
		if err := runNullKernel(os.Args[2:]); err != nil {
			fmt.Fprintln(os.Stderr, "rebuno-bench:", err)
			os.Exit(1)
		}
		return
	}
	// Pin first, while the runtime has few threads.
	noPin := false
	for _, a := range os.Args[1:] {
		if a == "-no-pin" || a == "--no-pin" || a == "-no-pin=true" || a == "--no-pin=true" {
			noPin = true
		}
	}
	pin := planPinning(noPin)
	cfg, err := parseFlags(os.Args[1:], os.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			os.Exit(0)
		}
		fmt.Fprintln(os.Stderr, "rebuno-bench:", err)
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, cfg, pin, os.Stdout); err != nil {
		fmt.Fprintln(os.Stderr, "rebuno-bench:", err)
		os.Exit(1)
	}
}

func randomHex(n int) string {
	b := make([]byte, n)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func run(ctx context.Context, cfg *config, pin pinning, out io.Writer) error {
	kernelBin, err := filepath.Abs(cfg.Kernel)
	if err != nil {
		return err
	}
	if st, err := os.Stat(kernelBin); err != nil || st.IsDir() {
		return fmt.Errorf("kernel binary %s not found (run make build)", cfg.Kernel)
	}
	tmp, err := os.MkdirTemp(cfg.TmpDir, "rebuno-bench-")
	if err != nil {
		return err
	}
	if cfg.Keep {
		fmt.Fprintf(out, "keeping %s\n", tmp)
	} else {
		defer os.RemoveAll(tmp)
	}
	pin.GOMAXPROCS = cfg.GOMAXPROCS
	b := &bench{cfg: cfg, pin: pin, tmp: tmp, token: "bench-" + randomHex(16), agentID: "bench-agent",
		secret: "bench-secret-" + randomHex(16), out: out, running: map[*kernelProc]bool{}}
	defer b.stopAll()
	if b.recv, err = newReceiver(b.secret); err != nil {
		return err
	}
	defer b.recv.Close()

	if pin.Impossible == "" && !selfThreadsPinned(pin.SelfCPU) {
		pin.Impossible = "some load-generator threads escaped the pinning"
		b.pin = pin
	}
	host, _ := os.Hostname()
	fs := measureFsync(tmp, 3*time.Second, 2000)
	r := &Report{
		Date: time.Now().UTC().Format(time.RFC3339), Host: host, CPUModel: cpuModel(), CPUs: runtime.NumCPU(),
		OSRelease: osRelease(), GoVersion: runtime.Version(), KernelBinary: cfg.Kernel, KernelVersion: kernelVersion(kernelBin),
		Store:   "SQLite via modernc.org/sqlite (pure Go, embedded), WAL, synchronous=FULL, group commit",
		Pinning: b.pin.String(), Pinned: b.pin.Impossible == "", Disk: diskOf(tmp),
		FsyncP50ms: msf(fs.P50), FsyncP99ms: msf(fs.P99), FsyncSamples: fs.N, LoadAvgBefore: loadAverage(),
		WarmupSeconds: cfg.Warmup.Seconds(), WindowSeconds: cfg.Duration.Seconds(), Long: cfg.Long,
	}
	if fs.Err != nil {
		r.Disk += " (fsync probe failed: " + fs.Err.Error() + ")"
	}
	if n := ncpuOnline(); n > 0 {
		r.CPUs = n
	}
	b.report = r
	b.kernelBin = kernelBin
	// A first kernel states its store and durability in its banner, and
	// shows whether it really runs on the planned core.
	probe, err := startKernel(kernelBin, filepath.Join(tmp, "probe.db"), b.token, b.pin, cfg.GOMAXPROCS)
	if err != nil {
		return err
	}
	r.Durability = "kernel banner: " + probe.StoreLine()
	allowed := probe.AllowedCPUs()
	probe.Stop()
	printHeader(out, r)
	if b.pin.Impossible != "" {
		fmt.Fprintf(out, "WARNING: pinning impossible: %s\n\n", b.pin.Impossible)
	} else if allowed != fmt.Sprint(b.pin.KernelCPU) {
		fmt.Fprintf(out, "WARNING: the kernel may run on CPUs %q, not only on core %d\n\n", allowed, b.pin.KernelCPU)
	}
	if !strings.Contains(r.Durability, "durable") || strings.Contains(r.Durability, "throwaway") {
		fmt.Fprintf(out, "WARNING: the kernel does not report durable commits\n\n")
	}

	metrics := []struct {
		id  string
		run func(context.Context) *metricResult
	}{
		{"P1", b.runP1}, {"P2", b.runP2}, {"P3", b.runP3}, {"WAIT", b.runWAIT}, {"P4", b.runP4}, {"P5", b.runP5}, {"FORK", b.runFORK}, {"CEIL", b.runCEIL},
		{"PG1", b.runPG1}, {"PG3", b.runPG3}, {"PGFORK", b.runPGFORK},
	}
	if cfg.Postgres != "" {
		b.pgVersion = postgresVersion(ctx, cfg.Postgres)
		fmt.Fprintf(out, "  postgres:       %s\n\n", b.pgVersion)
		if serverModeOnly(cfg) {
			r.Store = b.pgVersion + ", rebuno server replicas"
			r.Pinning = b.unpinned().String()
		}
	}
	for _, m := range metrics {
		if !cfg.runs(m.id) {
			continue
		}
		if ctx.Err() != nil {
			break
		}
		res := m.run(ctx)
		res.collect()
		r.Metrics = append(r.Metrics, res)
		printMetric(out, res)
	}
	printTable(out, r)
	if cfg.JSON != "" {
		if err := writeJSON(cfg.JSON, r); err != nil {
			return fmt.Errorf("write %s: %w", cfg.JSON, err)
		}
		fmt.Fprintf(out, "wrote %s\n", cfg.JSON)
	}
	if ctx.Err() != nil {
		return ctx.Err()
	}
	// Missed targets are reported, not failed; a metric that could not be
	// measured at all is an error.
	var failed []string
	for _, m := range r.Metrics {
		if m.Failed != "" {
			failed = append(failed, m.ID)
		}
	}
	if len(failed) > 0 {
		return fmt.Errorf("could not measure %s", strings.Join(failed, ", "))
	}
	return nil
}

// ncpuOnline counts the machine's online CPUs (runtime.NumCPU only sees the
// cores this process is pinned to).
func ncpuOnline() int {
	b, err := os.ReadFile("/sys/devices/system/cpu/online")
	if err != nil {
		return 0
	}
	n := 0
	for _, part := range strings.Split(strings.TrimSpace(string(b)), ",") {
		var lo, hi int
		if c, _ := fmt.Sscanf(part, "%d-%d", &lo, &hi); c == 2 {
			n += hi - lo + 1
		} else if c, _ := fmt.Sscanf(part, "%d", &lo); c == 1 {
			n++
		}
	}
	return n
}

// freshKernel starts a kernel on a new database file and registers the
// bench agent with it.
func (b *bench) freshKernel(name string) (*kernelProc, *client, error) {
	db := filepath.Join(b.tmp, name+".db")
	k, err := startKernel(b.kernelBin, db, b.token, b.pin, b.cfg.GOMAXPROCS)
	if err != nil {
		return nil, nil, err
	}
	b.running[k] = true
	c := newClient(k.URL, b.token, b.agentID, b.secret)
	if err := c.register(b.recv.URL, leaseSeconds); err != nil {
		b.stopKernel(k)
		return nil, nil, fmt.Errorf("register agent: %w", err)
	}
	return k, c, nil
}

// leaseSeconds is the agent's lease: long enough that no lease expires while
// a metric runs, so that no redelivery perturbs it.
const leaseSeconds = 900

func (b *bench) stopKernel(k *kernelProc) {
	k.Stop()
	delete(b.running, k)
}

func (b *bench) stopAll() {
	for k := range b.running {
		k.Kill()
	}
}

// conditions common to all metrics.
func (b *bench) conditions(concurrency string) []string {
	return []string{
		"store: " + b.report.Store + "; durability: " + b.report.Durability,
		"cores: " + b.pin.String(),
		"concurrency: " + concurrency,
		fmt.Sprintf("fsync p50 %.3f ms; kernel %s", b.report.FsyncP50ms, b.report.KernelVersion),
	}
}
