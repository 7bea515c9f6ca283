package main

// Server mode: `rebuno server` replicas on one Postgres database, driven over
// HTTP like the SQLite metrics. The replicas, Postgres and the load
// generator share the machine's cores (nothing is pinned: three kernels and
// a database server cannot each have a core of their own on two), so these
// metrics report what every process used instead.
//
//	PG1     one replica: steps one at a time (submit+complete p50/p99),
//	        then -concurrency executions at once (steps/s), and dispatch
//	        latency one at a time and under that load
//	PG3     the same with three replicas, each request sent to the next
//	        replica in turn as a load balancer would
//	PGFORK  forks of a -fork-steps execution written through the store

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/jackc/pgx/v5"

	"github.com/rebuno/rebuno/internal/store/postgres"
)

// pgTargets are issue #21's targets on this machine.
const (
	pgStepsTarget    = 1500 // steps/s, one replica
	pgPairP99Target  = 10 * time.Millisecond
	pgDispatchTarget = 10 * time.Millisecond
	pgForkP95Target  = 500 * time.Millisecond
)

// pgDatabase creates a fresh database on the -postgres server and returns
// its URL and a function that drops it.
func (b *bench) pgDatabase(ctx context.Context) (string, func(), error) {
	server := b.cfg.Postgres
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return "", nil, fmt.Errorf("connect to -postgres: %w", err)
	}
	name := "rebuno_bench_" + randomHex(6)
	if _, err := conn.Exec(ctx, `CREATE DATABASE `+pgx.Identifier{name}.Sanitize()); err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	u, err := url.Parse(server)
	if err != nil {
		conn.Close(ctx)
		return "", nil, err
	}
	u.Path = "/" + name
	drop := func() {
		conn.Exec(context.Background(), `DROP DATABASE IF EXISTS `+pgx.Identifier{name}.Sanitize()+` WITH (FORCE)`)
		conn.Close(context.Background())
	}
	return u.String(), drop, nil
}

// unpinned is how the server-mode metrics place their processes: anywhere,
// each replica with as many Go threads as the machine has CPUs unless
// -kernel-gomaxprocs says otherwise.
func (b *bench) unpinned() pinning {
	return pinning{KernelCPU: -1, SelfCPU: -1, GOMAXPROCS: b.replicaProcs(), Impossible: "server mode shares the cores"}
}

func (b *bench) replicaProcs() int {
	if b.cfg.GOMAXPROCSSet {
		return b.cfg.GOMAXPROCS
	}
	return b.report.CPUs
}

// replicas starts n replicas on a fresh database and registers the bench
// agent through them.
func (b *bench) replicas(ctx context.Context, n int) ([]*kernelProc, *client, string, func(), error) {
	dbURL, drop, err := b.pgDatabase(ctx)
	if err != nil {
		return nil, nil, "", nil, err
	}
	var ks []*kernelProc
	stop := func() {
		for _, k := range ks {
			b.stopKernel(k)
		}
		drop()
	}
	var urls []string
	for i := range n {
		k, err := startReplica(b.kernelBin, dbURL, fmt.Sprintf("bench-%d", i+1), b.token, b.unpinned(), b.replicaProcs())
		if err != nil {
			stop()
			return nil, nil, "", nil, err
		}
		b.running[k] = true
		ks = append(ks, k)
		urls = append(urls, k.URL)
	}
	c := newClient(urls[0], b.token, b.agentID, b.secret)
	c.SetBases(urls)
	if err := c.register(b.recv.URL, leaseSeconds); err != nil {
		stop()
		return nil, nil, "", nil, fmt.Errorf("register agent: %w", err)
	}
	return ks, c, dbURL, stop, nil
}

// pgCPU is the CPU every process of a server-mode run used over a window.
type pgCPU struct {
	kernels   []*kernelProc
	postgres  int // the postmaster's pid; 0 when Postgres is not local
	t0        time.Time
	k0, p0    time.Duration
	s0        time.Duration
	busy0     int64
	total0    int64
	Window    time.Duration
	Kernels   time.Duration // all replicas
	Postgres  time.Duration // the server with all its backends
	Generator time.Duration // this process
	Busy      float64       // the machine's busy share of all its cores
}

func (c *pgCPU) start() {
	c.t0 = time.Now()
	c.k0, c.p0, c.s0 = c.kernelCPU(), postgresCPU(c.postgres), selfCPU()
	c.busy0, c.total0 = machineTicks()
}

func (c *pgCPU) stop() {
	c.Window = time.Since(c.t0)
	c.Kernels, c.Postgres, c.Generator = c.kernelCPU()-c.k0, postgresCPU(c.postgres)-c.p0, selfCPU()-c.s0
	busy, total := machineTicks()
	if total > c.total0 {
		c.Busy = float64(busy-c.busy0) / float64(total-c.total0)
	}
}

func (c *pgCPU) kernelCPU() time.Duration {
	var d time.Duration
	for _, k := range c.kernels {
		d += k.CPU()
	}
	return d
}

// perStep is a CPU time per step in microseconds.
func perStep(d time.Duration, steps int64) float64 {
	if steps == 0 {
		return 0
	}
	return float64(d.Microseconds()) / float64(steps)
}

// postmaster finds the pid of the local Postgres server behind dbURL: the
// parent of the backend serving a connection. 0 when it is not on this
// machine (its /proc entry is not readable).
func postmaster(ctx context.Context, dbURL string) int {
	conn, err := pgx.Connect(ctx, dbURL)
	if err != nil {
		return 0
	}
	defer conn.Close(ctx)
	var backend int
	if err := conn.QueryRow(ctx, `SELECT pg_backend_pid()`).Scan(&backend); err != nil {
		return 0
	}
	f, err := statFields(backend)
	if err != nil || len(f) < 2 {
		return 0
	}
	ppid, _ := strconv.Atoi(f[1])
	return ppid
}

// postgresCPU is the CPU a Postgres server has used: the postmaster's own,
// what its finished children used (cutime, cstime) and what its live ones
// have used so far.
func postgresCPU(pm int) time.Duration {
	if pm == 0 {
		return 0
	}
	f, err := statFields(pm)
	if err != nil {
		return 0
	}
	ticks := sumFields(f, 11, 12, 13, 14) // utime stime cutime cstime
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		if cf, err := statFields(pid); err == nil && len(cf) > 12 && cf[1] == strconv.Itoa(pm) {
			ticks += sumFields(cf, 11, 12)
		}
	}
	return time.Duration(ticks / clockTicks * float64(time.Second))
}

// statFields are the fields of /proc/<pid>/stat after the command name
// (state first: field 3 of proc(5) is index 0).
func statFields(pid int) ([]string, error) {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return nil, err
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return nil, fmt.Errorf("malformed /proc/%d/stat", pid)
	}
	return strings.Fields(s[i+1:]), nil
}

func sumFields(f []string, idx ...int) float64 {
	var t float64
	for _, i := range idx {
		if i < len(f) {
			v, _ := strconv.ParseFloat(f[i], 64)
			t += v
		}
	}
	return t
}

// machineTicks reads the busy and total ticks of all CPUs from /proc/stat.
func machineTicks() (busy, total int64) {
	f, err := os.Open("/proc/stat")
	if err != nil {
		return 0, 0
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	if !sc.Scan() {
		return 0, 0
	}
	fields := strings.Fields(sc.Text())
	for i, v := range fields[1:] {
		n, _ := strconv.ParseInt(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return busy, total
}

// pgConditions are the conditions of a server-mode metric.
func (b *bench) pgConditions(replicas int, concurrency string) []string {
	return []string{
		fmt.Sprintf("store: %s; %d rebuno server replica(s), each request sent to the next replica in turn",
			b.pgVersion, replicas),
		fmt.Sprintf("cores: not pinned — the replicas (GOMAXPROCS=%d each), Postgres and the load generator share the machine's %d CPUs",
			b.replicaProcs(), b.report.CPUs),
		"concurrency: " + concurrency,
		"kernel " + b.report.KernelVersion,
	}
}

// pgLoaded is what one loaded window of runPGReplicas measured.
type pgLoaded struct {
	steps     int64
	pair, sub []time.Duration
	probe     *dispatchProbe
	cpu       *pgCPU
}

// pgLoad runs the configured number of step loops (carried or as pairs)
// with a create every P3 interval for one warm-up and window, sampling
// every process's CPU over the window.
func (b *bench) pgLoad(ctx context.Context, m *metricResult, ks []*kernelProc, dbURL string, c *client, carried bool) pgLoaded {
	cpu := &pgCPU{kernels: ks, postgres: postmaster(ctx, dbURL)}
	from, to := b.window()
	done, sampled := make(chan struct{}), make(chan struct{})
	go func() {
		defer close(sampled)
		select {
		case <-time.After(time.Until(from)):
			cpu.start()
		case <-done:
			return
		}
		select {
		case <-time.After(time.Until(to)):
		case <-done:
		}
		cpu.stop()
	}()
	workers := make([]*stepWorker, b.cfg.Concurrency)
	var wg sync.WaitGroup
	for i := range workers {
		workers[i] = &stepWorker{c: c, r: b.recv, errs: m.errs, from: from, to: to, perExec: b.cfg.StepsPerExec, carried: carried}
		wg.Add(1)
		go func(w *stepWorker) { defer wg.Done(); w.run(ctx) }(workers[i])
	}
	l := pgLoaded{cpu: cpu, probe: &dispatchProbe{c: c, r: b.recv, errs: m.errs, from: from, to: to, interval: b.cfg.P3Interval}}
	wg.Add(1)
	go func() { defer wg.Done(); l.probe.run(ctx) }()
	wg.Wait()
	close(done)
	<-sampled
	for _, w := range workers {
		l.steps += w.steps
		l.pair = append(l.pair, w.pair...)
		l.sub = append(l.sub, w.sub...)
	}
	return l
}

// pgCPUPerStep reports each process's CPU per step over a loaded window.
func (b *bench) pgCPUPerStep(m *metricResult, cpu *pgCPU, steps int64, suffix string) {
	if cpu.Window <= 0 || steps == 0 {
		return
	}
	inWindow := int64(float64(steps) * cpu.Window.Seconds() / b.cfg.Duration.Seconds())
	m.addValue("kernel CPU per step (all replicas)"+suffix, perStep(cpu.Kernels, inWindow), "µs")
	if cpu.postgres != 0 {
		m.addValue("Postgres CPU per step"+suffix, perStep(cpu.Postgres, inWindow), "µs")
	}
	m.addValue("load generator CPU per step"+suffix, perStep(cpu.Generator, inWindow), "µs")
	m.addValue("machine busy"+suffix, 100*cpu.Busy, "% of all CPUs")
}

// pgStepsPerSecond holds PG1's throughput for PG3's comparison.
var pgStepsPerSecond float64

func (b *bench) runPG1(ctx context.Context) *metricResult { return b.runPGReplicas(ctx, "PG1", 1) }
func (b *bench) runPG3(ctx context.Context) *metricResult { return b.runPGReplicas(ctx, "PG3", 3) }

func (b *bench) runPGReplicas(ctx context.Context, id string, n int) *metricResult {
	m := newMetric(id, fmt.Sprintf("server mode, %d replica(s) on one Postgres: steps one at a time, %d executions at once, dispatch latency", n, b.cfg.Concurrency))
	m.Conditions = b.pgConditions(n, fmt.Sprintf("1, then %d executions looping steps (+ one create every %s), as pairs and then carried, then creates one at a time", b.cfg.Concurrency, b.cfg.P3Interval))
	if b.cfg.Postgres == "" {
		m.Failed = "no -postgres server given"
		return m
	}
	ks, c, dbURL, stop, err := b.replicas(ctx, n)
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer stop()
	// Steps one at a time.
	from, to := b.window()
	w := &stepWorker{c: c, r: b.recv, errs: m.errs, from: from, to: to, perExec: b.cfg.StepsPerExec}
	w.run(ctx)
	pair := m.addLatency("pair (submit + complete), one at a time", w.pair)
	m.addLatency("submit, one at a time", w.sub)
	m.addLatency("complete, one at a time", w.comp)
	m.addValue("rate, one at a time", float64(w.steps)/b.cfg.Duration.Seconds(), "steps/s")

	// Many executions at once, with a create now and then; then the same
	// executions as this project's SDKs send them, each submit carrying the
	// previous step's outcome (docs/protocol/steps.md §13).
	l := b.pgLoad(ctx, m, ks, dbURL, c, false)
	rate := float64(l.steps) / b.cfg.Duration.Seconds()
	m.addValue("throughput", rate, "steps/s (one step = submit + complete)")
	m.addLatency(fmt.Sprintf("pair under load (%d at once)", b.cfg.Concurrency), l.pair)
	under := m.addLatency("create → webhook, under load", l.probe.dispatch)
	b.pgCPUPerStep(m, l.cpu, l.steps, "")
	cl := b.pgLoad(ctx, m, ks, dbURL, c, true)
	m.addValue("carried throughput", float64(cl.steps)/b.cfg.Duration.Seconds(), "steps/s (one step = one submit carrying the previous outcome)")
	m.addLatency(fmt.Sprintf("carried submit under load (%d at once)", b.cfg.Concurrency), cl.sub)
	b.pgCPUPerStep(m, cl.cpu, cl.steps, ", carried")

	// Creates one at a time: create on one replica, delivered by whichever
	// claims it.
	from, to = b.window()
	one := &dispatchProbe{c: c, r: b.recv, errs: m.errs, from: from, to: to}
	one.run(ctx)
	alone := m.addLatency("create → webhook, one at a time", one.dispatch)

	if pair.N > 0 {
		m.addTarget("pair p99, one at a time", "≤ 10 ms", ms(pair.P99), pair.P99 <= pgPairP99Target)
	} else {
		m.addTarget("pair p99, one at a time", "≤ 10 ms", "no samples", false)
	}
	if n == 1 {
		pgStepsPerSecond = rate
		m.addTarget("throughput, one replica", fmt.Sprintf("≥ %d steps/s", pgStepsTarget), fmt.Sprintf("%.0f steps/s", rate), rate >= pgStepsTarget)
	} else if pgStepsPerSecond > 0 {
		ratio := rate / pgStepsPerSecond
		m.addValue(fmt.Sprintf("throughput against PG1's in this run (%.0f steps/s)", pgStepsPerSecond), ratio, "×")
		m.addTarget(fmt.Sprintf("throughput, %d replicas against one", n), "≥ 1.0× PG1", fmt.Sprintf("%.2f×", ratio), ratio >= 1)
	} else {
		m.note("run PG1 in the same run to compare %d replicas' throughput with one's", n)
	}
	if alone.N > 0 {
		m.addTarget("dispatch p50, one at a time", "≤ 10 ms", ms(alone.P50), alone.P50 <= pgDispatchTarget)
	}
	if under.N > 0 {
		m.addTarget("dispatch p50, under load", "≤ 10 ms", ms(under.P50), under.P50 <= pgDispatchTarget)
	}
	m.note("replicas, Postgres and the load generator share the cores; CPU per step is each one's time over the loaded window divided by the steps in it")
	if n > 1 {
		m.note("a step's submit and complete usually reach different replicas; a create is delivered by whichever replica claims it first (woken by LISTEN/NOTIFY)")
	}
	m.finishKernel(ks[0])
	return m
}

func (b *bench) runPGFORK(ctx context.Context) *metricResult {
	n, samples := b.cfg.ForkSteps, b.cfg.ForkSamples
	m := newMetric("PGFORK", fmt.Sprintf("server mode: fork of a %d-step execution on Postgres", n))
	m.Conditions = b.pgConditions(1, "1 (one fork at a time; each fork's first delivery is awaited before the next)")
	if b.cfg.Postgres == "" {
		m.Failed = "no -postgres server given"
		return m
	}
	ks, c, dbURL, stop, err := b.replicas(ctx, 1)
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	defer stop()
	st, err := postgres.Open(ctx, postgres.Options{URL: dbURL, MaxConns: postgres.MinMaxConns, Logger: slog.New(slog.DiscardHandler)})
	if err != nil {
		m.Failed = err.Error()
		return m
	}
	var cases []*forkCase
	for _, steps := range []int{min(1000, n), n} {
		t0 := time.Now()
		src, err := insertForkSource(st, b.agentID, steps, 4<<10, max(steps/forkStepsPerCheckpoint, 1))
		if err != nil {
			st.Close()
			m.Failed = "insert source: " + err.Error()
			return m
		}
		m.addValue(fmt.Sprintf("source of %d steps: %d events, %d checkpoints, written in", steps, src.events, src.ckpts), time.Since(t0).Seconds(), "s")
		cases = append(cases, &forkCase{src: src, name: fmt.Sprintf("fork at the last event, %d steps, 4 KiB results", steps)})
	}
	st.Close()
	fork := func(src *forkSource) (time.Duration, error) {
		t0 := time.Now()
		body, err := c.bearer("POST", "/v0/executions/"+src.id+"/fork", fmt.Appendf(nil, `{"at_seq":%d}`, src.lastSeq), http.StatusCreated)
		took := time.Since(t0)
		if err != nil {
			return took, err
		}
		id, err := idOf(body)
		if err != nil {
			return took, err
		}
		_, err = b.recv.wait(ctx, id, 30*time.Second)
		return took, err
	}
	for _, fc := range cases {
		if _, err := fork(fc.src); err != nil {
			m.Failed = "first fork: " + err.Error()
			return m
		}
	}
	for i := 0; i < samples && ctx.Err() == nil; i++ {
		for _, fc := range cases {
			took, err := fork(fc.src)
			if err != nil {
				m.errs.add(err)
				continue
			}
			fc.times = append(fc.times, took)
		}
	}
	for _, fc := range cases {
		m.addLatency(fc.name, fc.times)
	}
	long := cases[len(cases)-1]
	p95 := percentile(long.times, 0.95)
	m.addValue(fmt.Sprintf("fork p95, %d steps", n), msf(p95), "ms")
	m.addTarget(fmt.Sprintf("fork p95, %d steps", n), "≤ 500 ms", ms(p95), len(long.times) > 0 && p95 <= pgForkP95Target)
	m.note("the sources were written with internal/store/postgres while the replica ran (it never delivers them: they are completed)")
	m.finishKernel(ks[0])
	return m
}

// idOf reads the id of an Execution answer.
func idOf(body []byte) (string, error) {
	var e struct {
		ID string `json:"id"`
	}
	if err := json.Unmarshal(body, &e); err != nil || e.ID == "" {
		return "", fmt.Errorf("no id in %s", body)
	}
	return e.ID, nil
}

// postgresVersion describes the -postgres server.
func postgresVersion(ctx context.Context, server string) string {
	conn, err := pgx.Connect(ctx, server)
	if err != nil {
		return "unreachable: " + err.Error()
	}
	defer conn.Close(ctx)
	var version, sync, fsync string
	if err := conn.QueryRow(ctx, `SELECT current_setting('server_version'), current_setting('synchronous_commit'), current_setting('fsync')`).
		Scan(&version, &sync, &fsync); err != nil {
		return "unknown: " + err.Error()
	}
	return fmt.Sprintf("PostgreSQL %s, synchronous_commit=%s, fsync=%s", version, sync, fsync)
}
