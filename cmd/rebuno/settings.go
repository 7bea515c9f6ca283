package main

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/spf13/cobra"
	"github.com/spf13/pflag"
)

// settings are the kernel's configuration (docs/protocol/configuration.md §2). Each value comes from its
// flag, else its environment variable, else its default; a value that does
// not parse or is out of range stops startup naming both spellings.
type settings struct {
	ListenAddr           string
	LogLevel             string
	LogFormat            string
	Config               string
	BearerToken          string
	RequireV1            bool
	DB                   string
	DispatchMaxAttempts  int64
	DispatchTimeout      time.Duration
	DispatchConcurrency  int64
	AgentConcurrency     int64
	DispatchLeaseTimeout time.Duration
	BackoffBase          time.Duration
	BackoffMax           time.Duration
	DeadlineTimeout      time.Duration
	ApprovalTimeout      time.Duration
	Retention            time.Duration
	CleanupInterval      time.Duration
	MaxBodyBytes         int64
	MaxStreams           int64
	MaxWaits             int64
	MaxSteps             int64
	MaxExecutionBytes    int64
	ShutdownTimeout      time.Duration
	NoREPL               bool
	AllowedHosts         []string
	AllowedOrigins       []string

	// Server mode (docs/protocol/configuration.md §3).
	DBURL         string
	DBMaxConns    int64
	DBMinConns    int64
	ReplicaID     string
	LeaderLockKey string
	Migrate       bool
}

// setting binds one flag and its variable to a parser.
type setting struct {
	flag, env, usage, def string
	isBool                bool
	// required settings must be given (flag or variable) and not be empty.
	required bool
	parse    func(string) error
}

// configError is a configuration mistake: exit code 2.
type configError struct{ msg string }

func (e *configError) Error() string { return e.msg }

func durationAtLeast(dst *time.Duration, min time.Duration, strict bool) func(string) error {
	return func(s string) error {
		d, err := time.ParseDuration(s)
		if err != nil {
			return fmt.Errorf("not a duration (use Go syntax such as 90s or 1h30m)")
		}
		if strict && d <= min {
			return fmt.Errorf("must be > %s", min)
		}
		if !strict && d < min {
			return fmt.Errorf("must be >= %s", min)
		}
		*dst = d
		return nil
	}
}

func intAtLeast(dst *int64, min int64) func(string) error {
	return func(s string) error {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("not an integer")
		}
		if n < min {
			return fmt.Errorf("must be >= %d", min)
		}
		*dst = n
		return nil
	}
}

func boolean(dst *bool) func(string) error {
	return func(s string) error {
		switch s {
		case "true", "1":
			*dst = true
		case "false", "0":
			*dst = false
		default:
			return fmt.Errorf("must be true, false, 1 or 0")
		}
		return nil
	}
}

func oneOf(dst *string, values ...string) func(string) error {
	return func(s string) error {
		for _, v := range values {
			if s == v {
				*dst = s
				return nil
			}
		}
		return fmt.Errorf("must be one of %s", strings.Join(values, ", "))
	}
}

func text(dst *string) func(string) error {
	return func(s string) error { *dst = s; return nil }
}

func nonEmpty(dst *string) func(string) error {
	return func(s string) error {
		if s == "" {
			return fmt.Errorf("must not be empty")
		}
		*dst = s
		return nil
	}
}

// list parses a comma-separated list, dropping empty items.
func list(dst *[]string) func(string) error {
	return func(s string) error {
		*dst = nil
		for _, item := range strings.Split(s, ",") {
			if item = strings.TrimSpace(item); item != "" {
				*dst = append(*dst, item)
			}
		}
		return nil
	}
}

// devSettings are the settings of `rebuno dev`.
func (s *settings) devSettings() []setting {
	return append(s.kernelSettings("127.0.0.1:8080", false),
		setting{flag: "db", env: "REBUNO_DB", def: ".rebuno/rebuno.db", usage: "SQLite file (:memory: for a throwaway database)", parse: func(v string) error {
			if v == "" {
				return fmt.Errorf("must not be empty")
			}
			s.DB = v
			return nil
		}},
		setting{flag: "no-repl", usage: "do not start the REPL", def: "false", isBool: true, parse: boolean(&s.NoREPL)},
	)
}

// serverSettings are the settings of `rebuno server`.
func (s *settings) serverSettings() []setting {
	host, _ := os.Hostname()
	return append(s.kernelSettings(":8080", true), s.databaseURL(),
		setting{flag: "db-max-conns", env: "REBUNO_DB_MAX_CONNS", def: "0", usage: fmt.Sprintf("database connections this replica may open, its LISTEN, leader and side connections included (0: %d; at least %d)", postgres.DefaultMaxConns, postgres.MinMaxConns), parse: func(v string) error {
			if err := intAtLeast(&s.DBMaxConns, 0)(v); err != nil {
				return err
			}
			if s.DBMaxConns != 0 && s.DBMaxConns < postgres.MinMaxConns {
				return fmt.Errorf("must be 0 (automatic) or >= %d", postgres.MinMaxConns)
			}
			return nil
		}},
		setting{flag: "db-min-conns", env: "REBUNO_DB_MIN_CONNS", def: "0", usage: "pooled connections kept open while idle", parse: intAtLeast(&s.DBMinConns, 0)},
		setting{flag: "replica-id", env: "REBUNO_REPLICA_ID", def: host, usage: "this replica's name, recorded on the dispatches it claims", parse: nonEmpty(&s.ReplicaID)},
		setting{flag: "leader-lock-key", env: "REBUNO_LEADER_LOCK_KEY", def: postgres.DefaultLeaderLockKey, usage: "advisory lock the replicas elect their leader with", parse: nonEmpty(&s.LeaderLockKey)},
		setting{flag: "migrate", env: "REBUNO_MIGRATE", def: "true", isBool: true, usage: "apply pending schema migrations at start (false: refuse to start unless `rebuno migrate` has)", parse: boolean(&s.Migrate)},
	)
}

// migrateSettings are the settings of `rebuno migrate`.
func (s *settings) migrateSettings() []setting { return []setting{s.databaseURL()} }

func (s *settings) databaseURL() setting {
	return setting{flag: "db-url", env: "REBUNO_DB_URL", required: true, usage: "Postgres database, postgres://user:password@host:port/database", parse: func(v string) error {
		if !strings.HasPrefix(v, "postgres://") && !strings.HasPrefix(v, "postgresql://") {
			return fmt.Errorf("must be a postgres:// URL")
		}
		s.DBURL = v
		return nil
	}}
}

// kernelSettings are the settings both kernel modes share; the listen
// address defaults differ, and server mode requires a bearer token.
func (s *settings) kernelSettings(listenAddr string, server bool) []setting {
	token := "token clients must send; auth is off without one"
	if server {
		token = "token clients must send"
	}
	return []setting{
		{flag: "listen-addr", env: "REBUNO_LISTEN_ADDR", def: listenAddr, usage: "host:port to listen on", parse: func(v string) error {
			if _, _, err := net.SplitHostPort(v); err != nil {
				return fmt.Errorf("must be host:port")
			}
			s.ListenAddr = v
			return nil
		}},
		{flag: "log-level", env: "REBUNO_LOG_LEVEL", def: "info", usage: "debug, info, warn or error", parse: oneOf(&s.LogLevel, "debug", "info", "warn", "error")},
		{flag: "log-format", env: "REBUNO_LOG_FORMAT", def: "text", usage: "text or json (to stderr)", parse: oneOf(&s.LogFormat, "text", "json")},
		{flag: "config", env: "REBUNO_CONFIG", usage: "provisioning manifest (YAML)", parse: text(&s.Config)},
		{flag: "bearer-token", env: "REBUNO_BEARER_TOKEN", required: server, usage: token, parse: text(&s.BearerToken)},
		{flag: "require-v1-signatures", env: "REBUNO_REQUIRE_V1_SIGNATURES", def: "true", isBool: true, usage: "refuse legacy body-only agent signatures (false accepts them, for old agents)", parse: boolean(&s.RequireV1)},
		{flag: "allowed-hosts", env: "REBUNO_ALLOWED_HOSTS", usage: "comma-separated host names requests may address besides localhost and IP addresses (* allows any)", parse: list(&s.AllowedHosts)},
		{flag: "allowed-origins", env: "REBUNO_ALLOWED_ORIGINS", usage: "comma-separated browser origins (scheme://host[:port]) allowed to make changes", parse: list(&s.AllowedOrigins)},
		{flag: "dispatch-max-attempts", env: "REBUNO_DISPATCH_MAX_ATTEMPTS", def: "5", usage: "deliveries without progress before an execution fails", parse: intAtLeast(&s.DispatchMaxAttempts, 1)},
		{flag: "dispatch-timeout", env: "REBUNO_DISPATCH_TIMEOUT", def: "30s", usage: "bound on one webhook delivery", parse: durationAtLeast(&s.DispatchTimeout, 0, true)},
		{flag: "dispatch-concurrency", env: "REBUNO_DISPATCH_CONCURRENCY", def: "64", usage: "deliveries in flight at once", parse: intAtLeast(&s.DispatchConcurrency, 1)},
		{flag: "dispatch-agent-concurrency", env: "REBUNO_DISPATCH_AGENT_CONCURRENCY", def: "0", usage: "deliveries in flight at once for any one agent (0: a quarter of --dispatch-concurrency)", parse: intAtLeast(&s.AgentConcurrency, 0)},
		{flag: "dispatch-lease-timeout", env: "REBUNO_DISPATCH_LEASE_TIMEOUT", def: "2m", usage: "lease of agents without their own", parse: durationAtLeast(&s.DispatchLeaseTimeout, 0, true)},
		{flag: "dispatch-backoff-base", env: "REBUNO_DISPATCH_BACKOFF_BASE", def: "1s", usage: "first retry delay", parse: durationAtLeast(&s.BackoffBase, 0, true)},
		{flag: "dispatch-backoff-max", env: "REBUNO_DISPATCH_BACKOFF_MAX", def: "30s", usage: "largest retry delay", parse: durationAtLeast(&s.BackoffMax, 0, true)},
		{flag: "deadline-timeout", env: "REBUNO_DEADLINE_TIMEOUT", def: "0", usage: "cancel executions older than this (0: never)", parse: durationAtLeast(&s.DeadlineTimeout, 0, false)},
		{flag: "approval-timeout", env: "REBUNO_APPROVAL_TIMEOUT", def: "15m", usage: "default approval timeout", parse: durationAtLeast(&s.ApprovalTimeout, 0, true)},
		{flag: "retention", env: "REBUNO_RETENTION", def: "0", usage: "delete terminal executions older than this (0: keep all)", parse: durationAtLeast(&s.Retention, 0, false)},
		{flag: "cleanup-interval", env: "REBUNO_CLEANUP_INTERVAL", def: "10m", usage: "retention sweep interval", parse: durationAtLeast(&s.CleanupInterval, 0, true)},
		{flag: "max-body-bytes", env: "REBUNO_MAX_BODY_BYTES", def: "10485760", usage: "largest request body", parse: intAtLeast(&s.MaxBodyBytes, 65536)},
		{flag: "max-streams", env: "REBUNO_MAX_STREAMS", def: "1000", usage: "open SSE connections", parse: intAtLeast(&s.MaxStreams, 1)},
		{flag: "max-waits", env: "REBUNO_MAX_WAITS", def: "1000", usage: "requests held waiting for an execution to end (wait=)", parse: intAtLeast(&s.MaxWaits, 1)},
		{flag: "max-steps-per-execution", env: "REBUNO_MAX_STEPS_PER_EXECUTION", def: "100000", usage: "steps one execution may record", parse: intAtLeast(&s.MaxSteps, 1)},
		{flag: "max-execution-bytes", env: "REBUNO_MAX_EXECUTION_BYTES", def: "1073741824", usage: "bytes one execution may store", parse: intAtLeast(&s.MaxExecutionBytes, 1)},
		{flag: "shutdown-timeout", env: "REBUNO_SHUTDOWN_TIMEOUT", def: "10s", usage: "grace for in-flight requests at shutdown", parse: durationAtLeast(&s.ShutdownTimeout, 0, true)},
	}
}

// settingsCommand gives cmd the flags of list, resolved into s (flag, then
// environment, then default) before run.
func settingsCommand(cmd *cobra.Command, s *settings, list []setting, run func(cmd *cobra.Command) error) *cobra.Command {
	cmd.Args = cobra.NoArgs
	cmd.RunE = func(cmd *cobra.Command, _ []string) error {
		if err := s.resolve(cmd.Flags(), list); err != nil {
			return err
		}
		return run(cmd)
	}
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	register(cmd.Flags(), list)
	return cmd
}

// register declares the flags on fs.
func register(fs *pflag.FlagSet, list []setting) {
	for _, st := range list {
		usage := st.usage
		if st.env != "" {
			usage += " (env " + st.env + ")"
		}
		fs.String(st.flag, st.def, usage)
		if st.isBool {
			fs.Lookup(st.flag).NoOptDefVal = "true"
		}
	}
}

// resolve applies flag > environment > default to every setting; every
// required one that is missing is named in one error.
func (s *settings) resolve(fs *pflag.FlagSet, list []setting) error {
	var missing []string
	for _, st := range list {
		val := st.def
		if env, ok := os.LookupEnv(st.env); ok && st.env != "" {
			val = env
		}
		if fs.Changed(st.flag) {
			val, _ = fs.GetString(st.flag)
		}
		if st.required && val == "" {
			missing = append(missing, "--"+st.flag+" ("+st.env+")")
			continue
		}
		if err := st.parse(val); err != nil {
			return &configError{msg: fmt.Sprintf("invalid %s: %v", name(st), err)}
		}
	}
	if len(missing) > 0 {
		return &configError{msg: "missing required settings: " + strings.Join(missing, ", ")}
	}
	return nil
}

// check applies the rules that relate a kernel's settings to each other.
func (s *settings) check() error {
	if s.BackoffBase > s.BackoffMax {
		return &configError{msg: "invalid REBUNO_DISPATCH_BACKOFF_BASE (--dispatch-backoff-base): must be <= --dispatch-backoff-max"}
	}
	if s.DispatchLeaseTimeout%time.Second != 0 {
		return &configError{msg: "invalid REBUNO_DISPATCH_LEASE_TIMEOUT (--dispatch-lease-timeout): must be whole seconds"}
	}
	if s.DispatchLeaseTimeout <= s.DispatchTimeout {
		return &configError{msg: "invalid REBUNO_DISPATCH_LEASE_TIMEOUT (--dispatch-lease-timeout): must be > --dispatch-timeout"}
	}
	if s.AgentConcurrency == 0 {
		s.AgentConcurrency = max(1, s.DispatchConcurrency/4)
	}
	if s.AgentConcurrency > s.DispatchConcurrency {
		return &configError{msg: "invalid REBUNO_DISPATCH_AGENT_CONCURRENCY (--dispatch-agent-concurrency): must be <= --dispatch-concurrency"}
	}
	if s.MaxExecutionBytes < s.MaxBodyBytes {
		return &configError{msg: "invalid REBUNO_MAX_EXECUTION_BYTES (--max-execution-bytes): must be >= --max-body-bytes"}
	}
	if pooled := postgres.PoolSize(int(s.DBMaxConns)); s.DBMinConns > int64(pooled) {
		return &configError{msg: fmt.Sprintf("invalid REBUNO_DB_MIN_CONNS (--db-min-conns): must be <= %d, the pooled share of --db-max-conns", pooled)}
	}
	return nil
}

func name(st setting) string {
	if st.env == "" {
		return "--" + st.flag
	}
	return st.env + " (--" + st.flag + ")"
}

// isLoopback reports whether a listen address only accepts local
// connections (docs/protocol/configuration.md §3): an empty host listens everywhere.
func isLoopback(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}
