package main

import (
	"fmt"
	"io"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/console"
	"github.com/rebuno/rebuno/internal/store/sqlite"
)

func devCommand() *cobra.Command {
	var s settings
	return settingsCommand(&cobra.Command{Use: "dev", Short: "Run the kernel on an embedded, durable SQLite file"},
		&s, s.devSettings(), func(cmd *cobra.Command) error {
			if err := s.check(); err != nil {
				return err
			}
			return runDev(&s, cmd.ErrOrStderr())
		})
}

func runDev(s *settings, stderr io.Writer) error {
	if !isLoopback(s.ListenAddr) && s.BearerToken == "" {
		return &configError{msg: fmt.Sprintf("refusing to listen on %s without --bearer-token: with auth off anyone who can "+
			"reach the port could register agents and make the kernel call any URL; listen on 127.0.0.1 or set a token", s.ListenAddr)}
	}
	p, err := prepare(s, stderr)
	if err != nil {
		return err
	}
	st, err := sqlite.Open(sqlite.Options{Path: s.DB, Observer: p.metrics, Logger: p.log})
	if err != nil {
		return fmt.Errorf("open store: %w", err)
	}
	defer st.Close()
	return p.run(opened{store: st, replicaID: "dev", repl: true, banner: func(w io.Writer, addr string, agents int) {
		store := s.DB + " (durable: WAL, synchronous commits)"
		if !st.Durable {
			store = ":memory: (throwaway: deleted at shutdown)"
		}
		fmt.Fprintf(w, "rebuno %s dev kernel\n", version)
		fmt.Fprintf(w, "  url:      http://%s\n", addr)
		fmt.Fprintf(w, "  console:  http://%s%s\n", addr, console.Path)
		fmt.Fprintf(w, "  store:    %s\n", store)
		bannerTail(w, s, p.manual != nil, p.fault != nil, agents)
	}})
}
