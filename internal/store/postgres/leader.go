package postgres

import (
	"context"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/jackc/pgx/v5"
)

// The leader is the replica that holds a session-level advisory lock on a
// connection of its own; it runs the singleton duties (store.Leading). The
// others try to take the lock every leaderPoll, so when the leader closes
// or dies, and its session with it, another takes over within about that
// long. The leader checks its connection as often: a leader whose
// connection broke stops leading at once, and one whose session is gone
// without its knowing (a network partition) stops at the next check. A
// moment with two leaders is harmless: every duty re-checks its rows under
// the execution's lock.

const (
	leaderPoll  = 500 * time.Millisecond
	leaderCheck = 2 * time.Second // bound on one check of the connection
)

type leader struct {
	cfg  *pgx.ConnConfig
	key  int64
	log  *slog.Logger
	held atomic.Bool
}

func newLeader(cfg *pgx.ConnConfig, key int64, log *slog.Logger) *leader {
	return &leader{cfg: cfg, key: key, log: log}
}

func (l *leader) holding() bool { return l.held.Load() }

// run competes for the lock until ctx ends; closing the connection then
// releases it.
func (l *leader) run(ctx context.Context) {
	wait := retryMin
	for ctx.Err() == nil {
		conn, err := pgx.ConnectConfig(ctx, l.cfg)
		if err != nil {
			if !sleep(ctx, wait) {
				return
			}
			wait = min(2*wait, retryMax)
			continue
		}
		wait = retryMin
		l.hold(ctx, conn)
		conn.Close(context.Background())
	}
}

// hold takes the lock when it is free and keeps checking the connection
// while it holds it, until the connection fails or ctx ends.
func (l *leader) hold(ctx context.Context, conn *pgx.Conn) {
	defer func() {
		if l.held.Swap(false) {
			l.log.Info("no longer the leader: the singleton duties stop on this replica")
		}
	}()
	for {
		cctx, cancel := context.WithTimeout(ctx, leaderCheck)
		var err error
		if l.held.Load() {
			err = conn.Ping(cctx)
		} else {
			var got bool
			err = conn.QueryRow(cctx, `SELECT pg_try_advisory_lock($1)`, l.key).Scan(&got)
			if err == nil && got {
				l.held.Store(true)
				l.log.Info("leading: this replica runs the singleton duties (lease reclaim, deadlines, approval expiry, retention)")
			}
		}
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				l.log.Warn("lost the leader connection", slog.Any("error", err))
			}
			return
		}
		if !sleep(ctx, leaderPoll) {
			return
		}
	}
}
