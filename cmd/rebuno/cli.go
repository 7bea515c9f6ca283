package main

import (
	"io"
	"net"
	"os"
	"os/signal"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"golang.org/x/term"

	"github.com/rebuno/rebuno/internal/cli"
	"github.com/rebuno/rebuno/internal/repl"
)

// clientCommands are the operator commands of docs/protocol/configuration.md §6.2 (`rebuno exec …`,
// `rebuno agent …`, and the nouns later features register). Their errors
// are printed here with the exit codes of docs/protocol/configuration.md §6.2 (1 kernel error, 2 usage,
// 3 unreachable, 4 a watched execution failed), never as a stack trace.
func clientCommands() []*cobra.Command {
	app := cli.New(cli.Options{Version: version})
	cmds := app.Commands()
	for _, c := range cmds {
		exitOnError(c)
	}
	return cmds
}

// exitOnError makes every command of the tree report its own errors and
// exit with their code.
func exitOnError(c *cobra.Command) {
	if run := c.RunE; run != nil {
		c.RunE = func(cmd *cobra.Command, args []string) error {
			return finish(run(cmd, args))
		}
	}
	if args := c.Args; args != nil {
		c.Args = func(cmd *cobra.Command, a []string) error { return finish(args(cmd, a)) }
	}
	c.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return finish(&cli.UsageError{Msg: err.Error(), Cmd: cmd.CommandPath()})
	})
	for _, sub := range c.Commands() {
		exitOnError(sub)
	}
}

func finish(err error) error {
	if err == nil {
		return nil
	}
	os.Exit(cli.Report(os.Stderr, err))
	return err
}

// replLog routes the kernel's log lines through the REPL while it runs, so
// that they do not garble the prompt.
var replLog struct {
	sync.Mutex
	r *repl.REPL
}

type replLogWriter struct{ w io.Writer }

func (l replLogWriter) Write(b []byte) (int, error) {
	replLog.Lock()
	r := replLog.r
	replLog.Unlock()
	if r != nil {
		return r.LogWriter(l.w).Write(b)
	}
	return l.w.Write(b)
}

// logSink wraps the kernel's log writer for the REPL.
func logSink(w io.Writer) io.Writer { return replLogWriter{w: w} }

// startREPL starts the dev REPL (docs/protocol/configuration.md §7) when stdin is a terminal and --no-repl
// is absent. done is closed when the operator quits (nil when no REPL runs);
// stop closes the REPL and restores the terminal.
func startREPL(s *settings, addr string) (done <-chan struct{}, stop func()) {
	if s.NoREPL || !term.IsTerminal(int(os.Stdin.Fd())) {
		return nil, func() {}
	}
	// The REPL owns SIGINT from now on: Ctrl-C stops a running command,
	// never the kernel (quit, Ctrl-D or SIGTERM do).
	intr := make(chan os.Signal, 1)
	signal.Notify(intr, syscall.SIGINT)
	width := 0
	if w, _, err := term.GetSize(int(os.Stdout.Fd())); err == nil {
		width = w
	}
	r := repl.New(repl.Options{URL: "http://" + loopbackAddr(addr), Token: s.BearerToken, Version: version,
		Interrupt: intr, Width: width})
	replLog.Lock()
	replLog.r = r
	replLog.Unlock()
	ch := make(chan struct{})
	go func() {
		defer close(ch)
		r.Run()
	}()
	return ch, func() {
		r.Close()
		select {
		case <-ch:
		case <-time.After(2 * time.Second):
		}
		replLog.Lock()
		replLog.r = nil
		replLog.Unlock()
		signal.Stop(intr)
	}
}

// shutdownSignals are the signals that stop the kernel: SIGTERM, and SIGINT
// unless the REPL handles it.
func shutdownSignals(withREPL bool) []os.Signal {
	if withREPL {
		return []os.Signal{syscall.SIGTERM}
	}
	return []os.Signal{syscall.SIGINT, syscall.SIGTERM}
}

// loopbackAddr turns the listener's address into one this process can dial:
// an unspecified host (":8080", "[::]:8080") becomes 127.0.0.1.
func loopbackAddr(addr string) string {
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		return addr
	}
	if ip := net.ParseIP(host); host == "" || (ip != nil && ip.IsUnspecified()) {
		host = "127.0.0.1"
	}
	return net.JoinHostPort(host, port)
}
