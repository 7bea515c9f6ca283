// Package repl is the dev REPL that `rebuno dev` runs on a terminal
// (docs/protocol/configuration.md §7): the client commands of `rebuno exec …` and
// `rebuno agent …` without the leading `rebuno`, with line editing, history,
// tab completion of verbs, execution ids and agent ids, and `watch`. Every
// command runs the CLI's own code against the kernel's HTTP API with the
// configured token, so it goes through exactly the validation and
// configuration of the route it mirrors.
package repl

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"

	"github.com/chzyer/readline"
	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/cli"
)

// Prompt is the REPL's prompt (docs/protocol/configuration.md §7).
const Prompt = "rebuno> "

// HistoryName is the history file in the home directory.
const HistoryName = ".rebuno_repl_history"

// Options configure a REPL.
type Options struct {
	// URL and Token reach the kernel's own HTTP API.
	URL, Token string
	Version    string
	In         io.ReadCloser
	Out, Err   io.Writer
	// HistoryFile overrides ~/.rebuno_repl_history ("-" disables history).
	HistoryFile string
	// Interrupt delivers Ctrl-C while a command runs (the REPL owns SIGINT
	// while it is up): it stops the command, not the kernel.
	Interrupt <-chan os.Signal
	// Width of the terminal (0: detect).
	Width int
	// Plain forces plain line reading without editing.
	Plain bool
}

// REPL is a running read-eval-print loop.
type REPL struct {
	opt  Options
	rl   *readline.Instance
	comp *completer

	mu      sync.Mutex
	cancel  context.CancelFunc // of the running command
	closed  bool
	quitReq chan struct{}
}

// New prepares a REPL; Run starts it.
func New(opt Options) *REPL {
	if opt.In == nil {
		opt.In = os.Stdin
	}
	if opt.Out == nil {
		opt.Out = os.Stdout
	}
	if opt.Err == nil {
		opt.Err = os.Stderr
	}
	if opt.HistoryFile == "" {
		if home, err := os.UserHomeDir(); err == nil {
			opt.HistoryFile = filepath.Join(home, HistoryName)
		}
	}
	if opt.HistoryFile == "-" {
		opt.HistoryFile = ""
	}
	r := &REPL{opt: opt, quitReq: make(chan struct{})}
	r.comp = &completer{r: r}
	return r
}

// LogWriter returns a writer for log lines that keeps the prompt intact:
// while the REPL waits for input it clears the prompt line, writes, and draws
// the prompt again.
func (r *REPL) LogWriter(w io.Writer) io.Writer { return &logWriter{r: r, w: w} }

type logWriter struct {
	r *REPL
	w io.Writer
}

func (l *logWriter) Write(b []byte) (int, error) {
	l.r.mu.Lock()
	rl := l.r.rl
	closed := l.r.closed
	l.r.mu.Unlock()
	if rl != nil && !closed {
		return rl.Stderr().Write(b)
	}
	return l.w.Write(b)
}

// Close stops a running REPL and restores the terminal; Run then returns.
func (r *REPL) Close() {
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		return
	}
	r.closed = true
	rl, cancel := r.rl, r.cancel
	r.mu.Unlock()
	if cancel != nil {
		cancel()
	}
	if rl != nil {
		rl.Close()
	}
}

// Run reads and runs commands until quit, exit, Ctrl-D, Ctrl-C on an empty
// line, or Close.
func (r *REPL) Run() error {
	stop := make(chan struct{})
	defer close(stop)
	if r.opt.Interrupt != nil {
		go r.forwardInterrupts(stop)
	}
	fmt.Fprintf(r.opt.Err, "Type %s for commands, %s to stop the kernel.\n", "help", "quit")
	if r.opt.Plain {
		return r.runPlain()
	}
	hist, recall, err := openHistory(r.opt.HistoryFile)
	if err != nil {
		// History is a convenience: say why there is none and go on.
		fmt.Fprintf(r.opt.Err, "no history: %v\n", err)
	}
	defer hist.close()
	rl, err := readline.NewEx(&readline.Config{
		Prompt:                 Prompt,
		HistorySearchFold:      true,
		DisableAutoSaveHistory: true,
		AutoComplete:           r.comp,
		InterruptPrompt:        "^C",
		EOFPrompt:              "quit",
		Stdin:                  r.opt.In,
		Stdout:                 r.opt.Out,
		Stderr:                 r.opt.Err,
	})
	if err != nil {
		// No line editing here (no terminal, say): read plain lines.
		return r.runPlain()
	}
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		rl.Close()
		return nil
	}
	r.rl = rl
	r.mu.Unlock()
	defer r.Close()
	for _, line := range recall {
		rl.SaveHistory(line)
	}
	for {
		line, err := rl.Readline()
		switch {
		case errors.Is(err, readline.ErrInterrupt):
			if strings.TrimSpace(line) == "" {
				return nil
			}
			continue
		case err != nil: // io.EOF: Ctrl-D, or Close
			return nil
		}
		if hist.add(line) {
			rl.SaveHistory(strings.TrimSpace(line))
		}
		if r.Exec(line) {
			return nil
		}
	}
}

func (r *REPL) runPlain() error {
	sc := bufio.NewScanner(r.opt.In)
	sc.Buffer(make([]byte, 64<<10), 16<<20)
	for {
		fmt.Fprint(r.opt.Out, Prompt)
		if !sc.Scan() {
			fmt.Fprintln(r.opt.Out)
			return nil
		}
		if r.Exec(sc.Text()) {
			return nil
		}
	}
}

// forwardInterrupts turns Ctrl-C into the cancellation of the running
// command. With no command running (the terminal is in raw mode at the
// prompt, so this is a signal sent from outside) it quits.
func (r *REPL) forwardInterrupts(stop <-chan struct{}) {
	for {
		select {
		case <-stop:
			return
		case <-r.opt.Interrupt:
			r.mu.Lock()
			cancel := r.cancel
			r.mu.Unlock()
			if cancel != nil {
				cancel()
				continue
			}
			r.Close()
			return
		}
	}
}

// Exec runs one line; it reports whether the REPL should quit.
func (r *REPL) Exec(line string) (quit bool) {
	args, err := Split(line)
	if err != nil {
		fmt.Fprintf(r.opt.Err, "error: %v\n", err)
		return false
	}
	if len(args) == 0 {
		return false
	}
	switch args[0] {
	case "quit", "exit":
		return true
	case "help", "?":
		r.help(args[1:])
		return false
	}
	if _, ok := r.comp.tree()[args[0]]; !ok {
		fmt.Fprintf(r.opt.Err, "error: unknown command %q; type help for the list\n", args[0])
		return false
	}
	ctx, cancel := context.WithCancel(context.Background())
	r.mu.Lock()
	if r.closed {
		r.mu.Unlock()
		cancel()
		return true
	}
	r.cancel = cancel
	r.mu.Unlock()
	defer func() {
		r.mu.Lock()
		r.cancel = nil
		r.mu.Unlock()
		cancel()
	}()
	_, root := r.build()
	root.SetArgs(args)
	if err := root.ExecuteContext(ctx); err != nil {
		if errors.Is(err, cli.ErrInterrupted) {
			return false
		}
		var ue *cli.UsageError
		if errors.As(err, &ue) {
			ue.Cmd = strings.TrimPrefix(ue.Cmd, "rebuno ")
		}
		cli.Report(r.opt.Err, err)
	}
	r.comp.invalidate()
	return false
}

// build makes a fresh command tree bound to the kernel (flags are per
// invocation).
func (r *REPL) build() (*cli.App, *cobra.Command) {
	tty := true
	app := cli.New(cli.Options{In: io.NopCloser(strings.NewReader("")), Out: r.opt.Out, Err: r.opt.Err,
		Version: r.opt.Version, TTY: &tty, Width: r.opt.Width, FixedURL: r.opt.URL, FixedToken: r.opt.Token,
		InREPL: true})
	root := &cobra.Command{Use: "rebuno", SilenceErrors: true, SilenceUsage: true}
	root.SetOut(r.opt.Out)
	root.SetErr(r.opt.Err)
	root.CompletionOptions.DisableDefaultCmd = true
	root.SetHelpCommand(&cobra.Command{Hidden: true, Use: "no-help"})
	root.AddCommand(app.Commands()...)
	root.SetFlagErrorFunc(func(c *cobra.Command, err error) error { return &cli.UsageError{Msg: err.Error()} })
	return app, root
}

// help prints the command summary, or a command's help.
func (r *REPL) help(args []string) {
	_, root := r.build()
	if len(args) > 0 {
		root.SetArgs(append(args, "--help"))
		if err := root.Execute(); err != nil {
			cli.Report(r.opt.Err, err)
		}
		return
	}
	w := r.opt.Out
	fmt.Fprintln(w, "Commands (the same as `rebuno …` on the command line):")
	for _, noun := range root.Commands() {
		if noun.Hidden || !noun.HasSubCommands() {
			continue
		}
		for _, verb := range noun.Commands() {
			if verb.Hidden {
				continue
			}
			use := noun.Name() + " " + verb.Use
			fmt.Fprintf(w, "  %-36s %s\n", use, verb.Short)
		}
	}
	fmt.Fprintf(w, "  %-36s %s\n", "help [command]", "this summary, or a command's flags")
	fmt.Fprintf(w, "  %-36s %s\n", "quit | exit | Ctrl-D", "stop the kernel and leave")
	fmt.Fprintln(w, "Ids: a full execution id or its last 6+ hex digits. Tab completes commands and ids.")
	fmt.Fprintln(w, "Ctrl-C stops a running watch; on an empty line it quits.")
	fmt.Fprintln(w, "Aliases: agents, execution(s), list for ls, delete for rm.")
}

// nounNames returns the top-level words with their subcommand names.
func (r *REPL) tree() map[string][]string {
	_, root := r.build()
	m := map[string][]string{}
	for _, noun := range root.Commands() {
		if noun.Hidden || !noun.HasSubCommands() {
			continue
		}
		var verbs []string
		for _, v := range noun.Commands() {
			if !v.Hidden {
				verbs = append(verbs, v.Name())
				verbs = append(verbs, v.Aliases...)
			}
		}
		sort.Strings(verbs)
		for _, n := range append([]string{noun.Name()}, noun.Aliases...) {
			m[n] = verbs
		}
	}
	return m
}
