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

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/api"
	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/config"
	"github.com/rebuno/rebuno/internal/dispatch"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/metrics"
	"github.com/rebuno/rebuno/internal/store/sqlite"
)

func devCommand() *cobra.Command {
	var s settings
	list := s.devSettings()
	cmd := &cobra.Command{
		Use:   "dev",
		Short: "Run the kernel on an embedded, durable SQLite file",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := s.resolve(cmd.Flags(), list); err != nil {
				return err
			}
			return runDev(&s, cmd.ErrOrStderr())
		},
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	register(cmd.Flags(), list)
	return cmd
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

func runDev(s *settings, stderr io.Writer) error {
	log := newLogger(s, logSink(stderr))
	// The kernel's heap is small and nearly all garbage is per request:
	// collecting half as often costs little memory and saves CPU on the
	// request path. GOGC still wins when set.
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(200)
	}
	if !isLoopback(s.ListenAddr) && s.BearerToken == "" {
		return &configError{msg: fmt.Sprintf("refusing to listen on %s without --bearer-token: with auth off anyone who can "+
			"reach the port could register agents and make the kernel call any URL; listen on 127.0.0.1 or set a token", s.ListenAddr)}
	}
	manual, limiter, err := testSettings(log)
	if err != nil {
		return &configError{msg: err.Error()}
	}
	var clk clock.Clock = clock.Real{}
	if manual != nil {
		clk = manual
	}

	var manifest []config.ManifestAgent
	if s.Config != "" {
		if manifest, err = config.LoadManifest(s.Config, os.LookupEnv); err != nil {
			return &configError{msg: err.Error()}
		}
	}

	m := metrics.New()
	st, err := sqlite.Open(sqlite.Options{Path: s.DB, Observer: m, Logger: log})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()

	cfg := kernel.Config{
		DispatchMaxAttempts: s.DispatchMaxAttempts, DispatchTimeout: s.DispatchTimeout,
		DispatchLeaseTimeout: s.DispatchLeaseTimeout, BackoffBase: s.BackoffBase, BackoffMax: s.BackoffMax,
		DeadlineTimeout: s.DeadlineTimeout, ApprovalTimeout: s.ApprovalTimeout, Retention: s.Retention,
		CleanupInterval: s.CleanupInterval, MaxStepsPerExecution: s.MaxSteps, MaxExecutionBytes: s.MaxExecutionBytes,
		RequireDispatchHeaders: s.RequireV1, ReplicaID: "dev",
	}
	k := kernel.New(kernel.Options{Store: st, Clock: clk, Config: cfg, Metrics: m, Logger: log, Limiter: limiter})

	ctx := context.Background()
	if len(manifest) > 0 {
		specs := make([]kernel.AgentSpec, len(manifest))
		for i, a := range manifest {
			specs[i] = kernel.AgentSpec{ID: a.ID, WebhookURL: a.WebhookURL, Secret: a.Secret,
				LeaseTimeoutSeconds: a.LeaseTimeoutSeconds, Policy: a.Policy, SetPolicy: a.HasPolicy}
		}
		if err := k.Provision(ctx, specs); err != nil {
			return &configError{msg: "provisioning " + s.Config + ": " + err.Error()}
		}
	}

	handler := api.New(k, api.Options{BearerToken: s.BearerToken, RequireV1: s.RequireV1, MaxBodyBytes: s.MaxBodyBytes,
		MaxStreams: s.MaxStreams, Logger: log, ManualClock: manual,
		ListenAddr: s.ListenAddr, AllowedHosts: s.AllowedHosts, AllowedOrigins: s.AllowedOrigins})
	ln, err := net.Listen("tcp", s.ListenAddr)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", s.ListenAddr, err)
	}
	ln = api.Listener(ln)
	srv := &http.Server{
		Handler:           handler,
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
	printBanner(stderr, s, ln.Addr().String(), st.Durable, len(manifest), manual != nil, limiter != nil)
	replDone, stopREPL := startREPL(s, ln.Addr().String())
	defer stopREPL()

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

func printBanner(w io.Writer, s *settings, addr string, durable bool, agents int, manualClock, limiterFault bool) {
	store := s.DB + " (durable: WAL, synchronous commits)"
	if !durable {
		store = ":memory: (throwaway: deleted at shutdown)"
	}
	authState := "off (no --bearer-token)"
	if s.BearerToken != "" {
		authState = "bearer token required"
	}
	legacy := "accepted"
	if s.RequireV1 {
		legacy = "refused"
	}
	fmt.Fprintf(w, "rebuno %s dev kernel\n", version)
	fmt.Fprintf(w, "  url:      http://%s\n", addr)
	fmt.Fprintf(w, "  store:    %s\n", store)
	fmt.Fprintf(w, "  auth:     %s\n", authState)
	fmt.Fprintf(w, "  legacy agent signatures: %s\n", legacy)
	if manualClock {
		fmt.Fprintf(w, "  TEST SETTING: REBUNO_TEST_CLOCK=manual (time moves only through POST /v0/test/clock)\n")
	}
	if limiterFault {
		fmt.Fprintf(w, "  TEST SETTING: REBUNO_TEST_LIMITER_FAULT=%s (every rate-limit check fails)\n", os.Getenv("REBUNO_TEST_LIMITER_FAULT"))
	}
	// Last line of the banner: tools that read it wait for this line.
	fmt.Fprintf(w, "  provisioned agents: %d\n", agents)
}
