// Package cli is the operator's command-line client of a Rebuno kernel
// (docs/protocol/configuration.md §6.2): `rebuno exec …` and `rebuno agent …`, the live
// timeline that `exec watch` and `exec events` print, and the error and exit
// code conventions that scripts rely on. The dev REPL (internal/repl) runs the
// very same commands in process.
//
// Commands are grouped by noun, like `gh`: later nouns (approvals, policy) and
// later exec verbs (fork, forks, coverage) slot in through RegisterNoun and
// RegisterExecVerb.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/url"
	"os"
	"strings"
	"sync"
	"time"

	"github.com/charmbracelet/lipgloss"
	"github.com/muesli/termenv"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// Environment variables read by the client (docs/protocol/configuration.md §6.2).
const (
	EnvURL         = "REBUNO_URL"
	EnvAPIKey      = "REBUNO_API_KEY"
	EnvBearerToken = "REBUNO_BEARER_TOKEN"
	DefaultURL     = "http://localhost:8080"
	DefaultTimeout = 35 * time.Second
)

// Options describe where a command reads and writes and which kernel it
// talks to.
type Options struct {
	In       io.Reader
	Out, Err io.Writer
	// Getenv reads the environment (os.Getenv when nil).
	Getenv func(string) string
	// Version is the client's version, sent as User-Agent.
	Version string
	// TTY says that Out is a terminal: aligned tables, relative times and
	// colour. Nil means: detect it from Out.
	TTY *bool
	// Color forces colour on or off; nil means: on for a terminal unless
	// NO_COLOR is set or TERM is dumb.
	Color *bool
	// Width is the terminal width used to fit timeline lines (0: detect,
	// else 120 off a terminal).
	Width int
	// Fixed, when set, is the kernel every command talks to regardless of
	// --url and the environment (the REPL talks to its own kernel). The
	// token is FixedToken.
	FixedURL   string
	FixedToken string
	// Now is the clock for relative times (time.Now when nil).
	Now func() time.Time
	// InREPL drops the leading `rebuno` from the commands that hints
	// suggest.
	InREPL bool
}

// App holds one invocation's configuration: the Options plus the global
// flags. Build a fresh App (and command tree) for every invocation.
type App struct {
	opt Options

	url     string
	token   string
	timeout time.Duration
	json    bool

	reconnectFor time.Duration

	tty    bool
	color  bool
	width  int
	styles styles

	clientOnce sync.Once
	client     *Client
}

// New returns an App for opt.
func New(opt Options) *App {
	if opt.In == nil {
		opt.In = os.Stdin
	}
	if opt.Out == nil {
		opt.Out = os.Stdout
	}
	if opt.Err == nil {
		opt.Err = os.Stderr
	}
	if opt.Getenv == nil {
		opt.Getenv = os.Getenv
	}
	if opt.Now == nil {
		opt.Now = time.Now
	}
	if opt.Version == "" {
		opt.Version = "dev"
	}
	a := &App{opt: opt, timeout: DefaultTimeout, reconnectFor: 5 * time.Minute}
	fd, isFile := fileFD(opt.Out)
	switch {
	case opt.TTY != nil:
		a.tty = *opt.TTY
	default:
		a.tty = isFile && term.IsTerminal(fd)
	}
	switch {
	case opt.Color != nil:
		a.color = *opt.Color
	default:
		_, noColor := lookupEnv(opt.Getenv, "NO_COLOR")
		a.color = a.tty && !noColor && opt.Getenv("TERM") != "dumb"
	}
	a.width = opt.Width
	if a.width == 0 && a.tty && isFile {
		if w, _, err := term.GetSize(fd); err == nil && w > 0 {
			a.width = w
		}
	}
	if a.width == 0 {
		a.width = 120
	}
	a.styles = newStyles(opt.Out, a.color)
	return a
}

func lookupEnv(getenv func(string) string, name string) (string, bool) {
	v := getenv(name)
	return v, v != ""
}

func fileFD(w io.Writer) (int, bool) {
	if f, ok := w.(interface{ Fd() uintptr }); ok {
		return int(f.Fd()), true
	}
	return 0, false
}

// Commands returns the client command tree: exec, agent and every noun
// registered by later features. Each call builds fresh commands bound to a.
func (a *App) Commands() []*cobra.Command {
	cmds := []*cobra.Command{a.execCommand(), a.agentCommand()}
	registry.Lock()
	nouns := append([]func(*App) *cobra.Command(nil), registry.nouns...)
	registry.Unlock()
	for _, n := range nouns {
		cmds = append(cmds, n(a))
	}
	for _, c := range cmds {
		a.bindGlobalFlags(c)
		a.prepare(c)
	}
	return cmds
}

var registry struct {
	sync.Mutex
	nouns     []func(*App) *cobra.Command
	execVerbs []func(*App) *cobra.Command
}

// RegisterNoun adds a top-level client noun (for example `approvals` or
// `policy`) built for each App. Call it from an init function.
func RegisterNoun(build func(*App) *cobra.Command) {
	registry.Lock()
	registry.nouns = append(registry.nouns, build)
	registry.Unlock()
}

// RegisterExecVerb adds a verb under `rebuno exec` (for example `fork`).
func RegisterExecVerb(build func(*App) *cobra.Command) {
	registry.Lock()
	registry.execVerbs = append(registry.execVerbs, build)
	registry.Unlock()
}

// bindGlobalFlags adds --url, --token, --timeout and --json to a noun; they
// are inherited by its verbs, so both `rebuno exec --json ls` and
// `rebuno exec ls --json` work.
func (a *App) bindGlobalFlags(c *cobra.Command) {
	f := c.PersistentFlags()
	f.StringVar(&a.url, "url", "", "kernel URL (env REBUNO_URL, default "+DefaultURL+")")
	f.StringVar(&a.token, "token", "", "bearer token (env REBUNO_API_KEY, else REBUNO_BEARER_TOKEN)")
	f.DurationVar(&a.timeout, "timeout", DefaultTimeout, "timeout of each request to the kernel")
	f.BoolVar(&a.json, "json", false, "print the kernel's JSON (streams: one object per line)")
}

// prepare makes every command of the tree report argument and flag mistakes
// as usage errors (exit 2) and reject unknown verbs.
func (a *App) prepare(c *cobra.Command) {
	c.SilenceErrors = true
	c.SilenceUsage = true
	c.SetFlagErrorFunc(func(cmd *cobra.Command, err error) error {
		return usagef(cmd, "%v", err)
	})
	if run := c.RunE; run != nil {
		// Usage errors found while running (a malformed id, say) point at
		// this command's help.
		c.RunE = func(cmd *cobra.Command, args []string) error {
			err := run(cmd, args)
			var ue *UsageError
			if errors.As(err, &ue) && ue.Cmd == "" {
				ue.Cmd = cmd.CommandPath()
			}
			return err
		}
	}
	if c.ValidArgsFunction == nil && c.Parent() != nil && !c.HasSubCommands() {
		switch c.Parent().Name() + " " + c.Name() {
		case "exec get", "exec events", "exec watch", "exec cancel":
			c.ValidArgsFunction = a.completeExecutions
		case "exec create", "agent get", "agent rm":
			c.ValidArgsFunction = a.completeAgents
		}
	}
	if c.HasSubCommands() && c.RunE == nil && c.Run == nil {
		c.SuggestionsMinimumDistance = 2
		c.Args = cobra.ArbitraryArgs
		c.RunE = func(cmd *cobra.Command, args []string) error {
			if len(args) == 0 {
				return cmd.Help()
			}
			msg := fmt.Sprintf("unknown command %q for %q", args[0], cmd.CommandPath())
			if s := cmd.SuggestionsFor(args[0]); len(s) > 0 {
				msg += "; did you mean " + strings.Join(s, " or ") + "?"
			}
			return &UsageError{Msg: msg, Cmd: cmd.CommandPath()}
		}
	}
	for _, sub := range c.Commands() {
		a.prepare(sub)
	}
}

// resolveTarget returns the kernel URL and token after flags, the
// environment and the REPL's fixed kernel.
func (a *App) resolveTarget() (base, token, tokenSource string, err error) {
	if a.opt.FixedURL != "" {
		base, token, tokenSource = a.opt.FixedURL, a.opt.FixedToken, "the kernel's --bearer-token"
		if a.url != "" {
			base = a.url
		}
		if a.token != "" {
			token, tokenSource = a.token, "--token"
		}
	} else {
		base = a.url
		if base == "" {
			base = a.opt.Getenv(EnvURL)
		}
		if base == "" {
			base = DefaultURL
		}
		switch {
		case a.token != "":
			token, tokenSource = a.token, "--token"
		case a.opt.Getenv(EnvAPIKey) != "":
			token, tokenSource = a.opt.Getenv(EnvAPIKey), EnvAPIKey
		case a.opt.Getenv(EnvBearerToken) != "":
			token, tokenSource = a.opt.Getenv(EnvBearerToken), EnvBearerToken
		}
	}
	u, perr := url.Parse(base)
	if perr != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return "", "", "", &UsageError{Msg: fmt.Sprintf("invalid kernel URL %q: use http://HOST:PORT (--url or REBUNO_URL)", base)}
	}
	return strings.TrimRight(base, "/"), token, tokenSource, nil
}

// Client returns the HTTP client of this invocation.
func (a *App) Client() (*Client, error) {
	var err error
	a.clientOnce.Do(func() {
		var base, token, src string
		base, token, src, err = a.resolveTarget()
		if err != nil {
			return
		}
		if a.timeout <= 0 {
			err = &UsageError{Msg: "--timeout must be positive"}
			return
		}
		a.client = NewClient(base, token, src, a.timeout, a.opt.Version)
	})
	if err != nil {
		return nil, err
	}
	if a.client == nil {
		return nil, &UsageError{Msg: "invalid kernel URL"}
	}
	return a.client, nil
}

// JSON reports whether --json is on.
func (a *App) JSON() bool { return a.json }

// TTY reports whether output goes to a terminal.
func (a *App) TTY() bool { return a.tty }

// Out and Err are the invocation's writers.
func (a *App) Out() io.Writer { return a.opt.Out }
func (a *App) Err() io.Writer { return a.opt.Err }

func (a *App) now() time.Time { return a.opt.Now() }

// cmdline spells a command for a hint: `rebuno exec watch X` on the command
// line, `exec watch X` in the REPL.
func (a *App) cmdline(s string) string {
	if a.opt.InREPL {
		return s
	}
	return "rebuno " + s
}

func (a *App) printf(format string, args ...any) { fmt.Fprintf(a.opt.Out, format, args...) }

func (a *App) errf(format string, args ...any) { fmt.Fprintf(a.opt.Err, format, args...) }

// ctx returns the command's context (Background when it has none).
func ctxOf(cmd *cobra.Command) context.Context {
	if ctx := cmd.Context(); ctx != nil {
		return ctx
	}
	return context.Background()
}

// styles are the colours of the human output. With colour off every style
// renders its text unchanged.
type styles struct {
	on                                   bool
	dim, bold, ok, bad, warn, info, mark lipgloss.Style
	id, key                              lipgloss.Style
}

func newStyles(w io.Writer, on bool) styles {
	r := lipgloss.NewRenderer(w)
	if on {
		r.SetColorProfile(termenv.ANSI256)
	} else {
		r.SetColorProfile(termenv.Ascii)
	}
	s := r.NewStyle()
	return styles{
		on:   on,
		dim:  s.Faint(true),
		bold: s.Bold(true),
		ok:   s.Foreground(lipgloss.Color("2")),
		bad:  s.Foreground(lipgloss.Color("1")),
		warn: s.Foreground(lipgloss.Color("3")),
		info: s.Foreground(lipgloss.Color("6")),
		mark: s.Foreground(lipgloss.Color("5")),
		id:   s.Foreground(lipgloss.Color("4")),
		key:  s.Faint(true),
	}
}

// paint renders text with st when colour is on.
func (s styles) paint(st lipgloss.Style, text string) string {
	if !s.on || text == "" {
		return text
	}
	return st.Render(text)
}

// statusStyle is the colour of an execution or step status.
func (s styles) status(status string) string {
	switch status {
	case "completed", "succeeded", "granted":
		return s.paint(s.ok, status)
	case "failed", "denied", "cancelled", "expired":
		return s.paint(s.bad, status)
	case "blocked", "awaiting_approval", "pending":
		return s.paint(s.warn, status)
	case "running", "executing":
		return s.paint(s.info, status)
	}
	return status
}
