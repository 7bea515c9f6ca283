package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/console"
	"github.com/rebuno/rebuno/internal/store/postgres"
)

func serverCommand() *cobra.Command {
	var s settings
	return settingsCommand(&cobra.Command{Use: "server", Short: "Run the kernel on Postgres, as one of any number of stateless replicas"},
		&s, s.serverSettings(), func(cmd *cobra.Command) error {
			if err := s.check(); err != nil {
				return err
			}
			return runServer(&s, cmd.ErrOrStderr())
		})
}

func runServer(s *settings, stderr io.Writer) error {
	p, err := prepare(s, stderr)
	if err != nil {
		return err
	}
	st, err := postgres.Open(context.Background(), postgres.Options{URL: s.DBURL, MaxConns: int(s.DBMaxConns),
		MinConns: int(s.DBMinConns), LeaderLockKey: s.LeaderLockKey, Migrate: s.Migrate, Observer: p.metrics, Logger: p.log})
	if err != nil {
		return err
	}
	defer st.Close()
	return p.run(opened{store: st, limiter: st.Limiter(), replicaID: s.ReplicaID, banner: func(w io.Writer, addr string, agents int) {
		fmt.Fprintf(w, "rebuno %s server kernel\n", version)
		fmt.Fprintf(w, "  url:      http://%s\n", addr)
		fmt.Fprintf(w, "  console:  http://%s%s\n", addr, console.Path)
		fmt.Fprintf(w, "  store:    postgres %s (schema version %d)\n", databaseName(s.DBURL), postgres.SchemaVersion())
		fmt.Fprintf(w, "  replica:  %s\n", s.ReplicaID)
		bannerTail(w, s, p.manual != nil, p.fault != nil, agents)
	}})
}

// databaseName shows where a URL points, without its credentials.
func databaseName(dbURL string) string {
	u, err := url.Parse(dbURL)
	if err != nil {
		return "(unparsed URL)"
	}
	return u.Host + u.Path
}

func migrateCommand() *cobra.Command {
	var s settings
	return settingsCommand(&cobra.Command{
		Use:   "migrate",
		Short: "Bring a server-mode database's schema up to this rebuno's version",
		Long: "Applies the schema migrations this rebuno has and the database lacks, under the same advisory lock " +
			"`rebuno server` takes at start, for operators who start replicas with --migrate=false.",
	}, &s, s.migrateSettings(), func(cmd *cobra.Command) error {
		m, err := postgres.Migrate(context.Background(), s.DBURL)
		if err != nil {
			if errors.Is(err, postgres.ErrSchemaNewer) {
				return err
			}
			return fmt.Errorf("migrate %s: %w", databaseName(s.DBURL), err)
		}
		if m.From == m.To {
			fmt.Fprintf(cmd.OutOrStdout(), "%s is at schema version %d: nothing to do\n", databaseName(s.DBURL), m.To)
		} else {
			fmt.Fprintf(cmd.OutOrStdout(), "migrated %s from schema version %d to %d\n", databaseName(s.DBURL), m.From, m.To)
		}
		return nil
	})
}
