package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"sort"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/store/postgres"
	"github.com/rebuno/rebuno/internal/store/sqlite"
)

func storeCommand() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "store",
		Short: "Move a kernel's database",
		Args:  cobra.NoArgs,
	}
	cmd.AddCommand(storeCopyCommand())
	return cmd
}

// copyLeaderKey is the leader lock the copy's connection to the destination
// competes for: none that replicas use, so a running deployment keeps its
// leader.
const copyLeaderKey = "rebuno_store_copy"

func storeCopyCommand() *cobra.Command {
	var from, to string
	var force bool
	cmd := &cobra.Command{
		Use:   "copy --from sqlite:PATH --to postgres://…",
		Short: "Copy a rebuno dev database into a server-mode database, row for row",
		Long: "Copies every execution with its events, steps, dispatches, resources and checkpoints, every agent " +
			"(secrets included), approval, idempotency key, API key, session, setting and audit log entry of a " +
			"`rebuno dev` SQLite file into a Postgres database, in one transaction: on any error nothing is written. " +
			"The source must not be in use (stop its rebuno dev first); it is brought to this rebuno's schema " +
			"version, as rebuno dev would. The destination is migrated, and must be empty unless --force is given.",
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			var missing []string
			for _, f := range []struct{ name, v string }{{"--from", from}, {"--to", to}} {
				if f.v == "" {
					missing = append(missing, f.name)
				}
			}
			if len(missing) > 0 {
				return &configError{msg: "missing required settings: " + strings.Join(missing, ", ")}
			}
			path, ok := strings.CutPrefix(from, "sqlite:")
			if !ok || path == "" {
				return &configError{msg: "invalid --from: must be sqlite:PATH"}
			}
			if !strings.HasPrefix(to, "postgres://") && !strings.HasPrefix(to, "postgresql://") {
				return &configError{msg: "invalid --to: must be a postgres:// URL"}
			}
			return copyStore(cmd.Context(), path, to, force, cmd.OutOrStdout())
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "the source, sqlite:PATH of a rebuno dev database")
	cmd.Flags().StringVar(&to, "to", "", "the destination, a postgres:// URL (as rebuno server's --db-url)")
	cmd.Flags().BoolVar(&force, "force", false, "copy into a database that already holds data (a row whose key is taken there fails the copy)")
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return &usageError{err} })
	return cmd
}

func copyStore(ctx context.Context, path, url string, force bool, out io.Writer) error {
	// Opening a missing file would create an empty database.
	if st, err := os.Stat(path); err != nil || st.IsDir() {
		return fmt.Errorf("no rebuno database at %s", path)
	}
	quiet := slog.New(slog.DiscardHandler)
	// Open takes the file's lock: a database in use is refused.
	src, err := sqlite.Open(sqlite.Options{Path: path, Logger: quiet})
	if err != nil {
		return err
	}
	defer src.Close()
	dst, err := postgres.Open(ctx, postgres.Options{URL: url, MaxConns: postgres.MinMaxConns, LeaderLockKey: copyLeaderKey,
		Migrate: true, Logger: quiet})
	if err != nil {
		return err
	}
	defer dst.Close()
	counts, err := dst.Import(ctx, src, force)
	if err != nil {
		return fmt.Errorf("copy %s to %s: %w (nothing was written)", path, databaseName(url), err)
	}
	tables := make([]string, 0, len(counts))
	for t := range counts {
		tables = append(tables, t)
	}
	sort.Strings(tables)
	fmt.Fprintf(out, "copied %s to %s:\n", path, databaseName(url))
	for _, t := range tables {
		fmt.Fprintf(out, "  %-18s %d rows\n", t, counts[t])
	}
	return nil
}
