package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/signal"
	"runtime/debug"
	"sync"
	"time"

	"github.com/rebuno/rebuno/internal/api"
	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/config"
	"github.com/rebuno/rebuno/internal/console"
	"github.com/rebuno/rebuno/internal/dispatch"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/metrics"
	"github.com/rebuno/rebuno/internal/store"
)

// A kernel process is the same in both modes once its store is open:
// `rebuno dev` opens SQLite, `rebuno server` Postgres, and each hands the
// store to run.

// process is what a kernel process has before it opens its store.
type process struct {
	s        *settings
	stderr   io.Writer
	log      *slog.Logger
	metrics  *metrics.Metrics
	manual   *clock.Manual  // the test-only manual clock, or nil
	fault    kernel.Limiter // the test-only failing limiter, or nil
	manifest []config.ManifestAgent
}

// prepare reads everything a kernel process needs besides its store; a
// mistake in it is a configuration error.
func prepare(s *settings, stderr io.Writer) (*process, error) {
	p := &process{s: s, stderr: stderr, log: newLogger(s, logSink(stderr)), metrics: metrics.New()}
	// The kernel's heap is small and nearly all garbage is per request:
	// collecting half as often costs little memory and saves CPU on the
	// request path. GOGC still wins when set.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
	var err error
	if p.manual, p.fault, err = testSettings(p.log); err != nil {
		return nil, &configError{msg: err.Error()}
	}
	if s.Config != "" {
		if p.manifest, err = config.LoadManifest(s.Config, os.LookupEnv); err != nil {
			return nil, &configError{msg: err.Error()}
		}
	}
	return p, nil
}

func newLogger(s *settings, w io.Writer) *slog.Logger {
	var level slog.Level
	level.UnmarshalText([]byte(s.LogLevel))
	opts := &slog.HandlerOptions{Level: level}
	if s.LogFormat == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}

// opened is a store a mode has opened, with what the rest of the process
// needs to know of it.
type opened struct {
	store store.Store
	// limiter holds the rate-limit buckets; nil keeps them in memory.
	limiter   kernel.Limiter
	replicaID string
	// banner prints the mode's banner once the listener is open.
	banner func(w io.Writer, addr string, agents int)
	// repl starts the dev REPL when the mode has one.
	repl bool
}

// run serves the kernel on an opened store until a signal (or the REPL)
// stops it, then shuts down in the order of docs/protocol/configuration.md §3.
func (p *process) run(o opened) error {
	s, log := p.s, p.log
	var clk clock.Clock = clock.Real{}
	if p.manual != nil {
		clk = p.manual
	}
	limiter := o.limiter
	if p.fault != nil {
		limiter = p.fault
	}
	cfg := kernel.Config{
		DispatchMaxAttempts: s.DispatchMaxAttempts, DispatchTimeout: s.DispatchTimeout,
		DispatchLeaseTimeout: s.DispatchLeaseTimeout, BackoffBase: s.BackoffBase, BackoffMax: s.BackoffMax,
		DeadlineTimeout: s.DeadlineTimeout, ApprovalTimeout: s.ApprovalTimeout, Retention: s.Retention,
		CleanupInterval: s.CleanupInterval, MaxStepsPerExecution: s.MaxSteps, MaxExecutionBytes: s.MaxExecutionBytes,
		RequireDispatchHeaders: s.RequireV1, ReplicaID: o.replicaID,
	}
	k := kernel.New(kernel.Options{Store: o.store, Clock: clk, Config: cfg, Metrics: p.metrics, Logger: log, Limiter: limiter})

	ctx := context.Background()
	if len(p.manifest) > 0 {
		specs := make([]kernel.AgentSpec, len(p.manifest))
		for i, a := range p.manifest {
			specs[i] = kernel.AgentSpec{ID: a.ID, WebhookURL: a.WebhookURL, Secret: a.Secret,
				LeaseTimeoutSeconds: a.LeaseTimeoutSeconds, Policy: a.Policy, SetPolicy: a.HasPolicy}
		}
		if err := k.Provision(ctx, specs); err != nil {
			return &configError{msg: "provisioning " + s.Config + ": " + err.Error()}
		}
	}

	handler := api.New(k, api.Options{BearerToken: s.BearerToken, RequireV1: s.RequireV1, MaxBodyBytes: s.MaxBodyBytes,
		MaxStreams: s.MaxStreams, MaxWaits: s.MaxWaits, Logger: log, ManualClock: p.manual,
		ListenAddr: s.ListenAddr, AllowedHosts: s.AllowedHosts, AllowedOrigins: s.AllowedOrigins})
	ln, err := net.Listen("tcp", s.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.ListenAddr, err)
	}
	ln = api.Listener(ln)
	srv := &http.Server{
		Handler:           console.Mount(console.New(), handler),
		ReadHeaderTimeout: 10 * time.Second,
		ReadTimeout:       70 * time.Second,
		IdleTimeout:       120 * time.Second,
		MaxHeaderBytes:    64 << 10,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelDebug),
	}

	workCtx, stopWork := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(2)
	go func() {
		defer wg.Done()
		limits := dispatch.Limits{Total: int(s.DispatchConcurrency), PerAgent: int(s.AgentConcurrency)}
		dispatch.New(k, limits, s.DispatchTimeout, version, log).Run(workCtx)
	}()
	go func() { defer wg.Done(); k.RunWorkers(workCtx) }()

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()
	o.banner(p.stderr, ln.Addr().String(), len(p.manifest))
	var replDone <-chan struct{}
	if o.repl {
		var stopREPL func()
		replDone, stopREPL = startREPL(s, ln.Addr().String())
		defer stopREPL()
	}

	sig := make(chan os.Signal, 1)
	signal.Notify(sig, shutdownSignals(replDone != nil)...)
	var runErr error
	select {
	case <-sig:
		log.Info("shutting down")
	case <-replDone:
		log.Info("shutting down")
	case err := <-serveErr:
		if !errors.Is(err, http.ErrServerClosed) {
			runErr = fmt.Errorf("serve: %w", err)
		}
	}
	handler.Drain()
	shutdownCtx, cancel := context.WithTimeout(ctx, s.ShutdownTimeout)
	defer cancel()
	srv.Shutdown(shutdownCtx)
	stopWork()
	wg.Wait()
	return runErr
}

// bannerTail prints the lines of the banner both modes share; the last line
// is the one tools that read the banner wait for.
func bannerTail(w io.Writer, s *settings, manualClock, limiterFault bool, agents int) {
	authState := "off (no --bearer-token)"
	if s.BearerToken != "" {
		authState = "bearer token required"
	}
	legacy := "accepted"
	if s.RequireV1 {
		legacy = "refused"
	}
	fmt.Fprintf(w, "  auth:     %s\n", authState)
	fmt.Fprintf(w, "  legacy agent signatures: %s\n", legacy)
	if manualClock {
		fmt.Fprintf(w, "  TEST SETTING: REBUNO_TEST_CLOCK=manual (time moves only through POST /v0/test/clock)\n")
	}
	if limiterFault {
		fmt.Fprintf(w, "  TEST SETTING: REBUNO_TEST_LIMITER_FAULT=%s (every rate-limit check fails)\n", os.Getenv("REBUNO_TEST_LIMITER_FAULT"))
	}
	fmt.Fprintf(w, "  provisioned agents: %d\n", agents)
}
