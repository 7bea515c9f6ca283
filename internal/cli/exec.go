package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/wire"
)

var execStatuses = wire.ExecutionStatuses

func (a *App) execCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "exec <command>",
		Aliases: []string{"execution", "executions"},
		Short:   "Create, inspect, follow and cancel executions",
		Long: "Work with executions: one run of one agent on one input.\n\n" +
			"An execution id may be given in full or as a unique suffix of at least six hex digits\n" +
			"(the short id `rebuno exec ls` shows).",
		Example: "  rebuno exec create researcher '{\"topic\":\"durable agents\"}' --watch\n" +
			"  rebuno exec create researcher '{\"topic\":\"durable agents\"}' --wait | jq .summary\n" +
			"  rebuno exec ls --status running\n" +
			"  rebuno exec watch 9c2e41f7\n" +
			"  rebuno exec events 9c2e41f7 --json | jq .type",
	}
	c.AddCommand(a.execCreate(), a.execRun(), a.execGet(), a.execLs(), a.execEvents(), a.execWatch(), a.execCancel())
	registry.Lock()
	verbs := append([]func(*App) *cobra.Command(nil), registry.execVerbs...)
	registry.Unlock()
	for _, v := range verbs {
		c.AddCommand(v(a))
	}
	return c
}

// exactArgs is cobra.ExactArgs reported as a usage error naming the
// arguments.
func exactArgs(names ...string) cobra.PositionalArgs {
	return func(cmd *cobra.Command, args []string) error {
		if len(args) != len(names) {
			return usagef(cmd, "%s takes %d argument%s (%s), got %d", cmd.CommandPath(), len(names), plural(len(names)),
				strings.Join(names, ", "), len(args))
		}
		return nil
	}
}

func plural(n int) string {
	if n == 1 {
		return ""
	}
	return "s"
}

func (a *App) execCreate() *cobra.Command {
	var version string
	var watch, wait bool
	c := &cobra.Command{
		Use:   "create <agent_id> [input]",
		Short: "Start an execution of an agent",
		Long: "Start an execution of an agent on an input.\n\n" +
			"The input is JSON text, - to read it from standard input, or @FILE to read it from a\n" +
			"file; it defaults to {}. With --watch the timeline follows until the execution ends.\n" +
			"With --wait nothing is printed until the execution ends; then its output (JSON) is\n" +
			"printed, or, when it failed or was cancelled, the reason, with exit status 4. The\n" +
			"kernel holds each request until the execution ends (no polling), for at most\n" +
			"--timeout minus 5 s at a time.",
		Example: "  rebuno exec create researcher '{\"topic\":\"durable agents\"}'\n" +
			"  echo '{\"topic\":\"x\"}' | rebuno exec create researcher -\n" +
			"  rebuno exec create researcher @input.json --watch\n" +
			"  rebuno exec create researcher @input.json --wait > output.json",
		Args: func(cmd *cobra.Command, args []string) error {
			if len(args) < 1 || len(args) > 2 {
				return usagef(cmd, "%s takes an agent id and an optional input, got %d arguments", cmd.CommandPath(), len(args))
			}
			return nil
		},
		RunE: func(cmd *cobra.Command, args []string) error {
			if watch && wait {
				return usagef(cmd, "--watch and --wait cannot be used together")
			}
			input := []byte("{}")
			if len(args) == 2 {
				var err error
				if input, err = a.readInput(args[1]); err != nil {
					return usagef(cmd, "%v", err)
				}
			}
			body := map[string]json.RawMessage{"agent_id": mustJSON(args[0]), "input": input}
			if version != "" {
				body["agent_version"] = mustJSON(version)
			}
			b := encodeOrdered(body, "agent_id", "input", "agent_version")
			cl, err := a.Client()
			if err != nil {
				return err
			}
			ctx := ctxOf(cmd)
			path := "/v0/executions"
			if wait {
				path += "?wait=" + a.waitParam()
			}
			r, err := cl.Do(ctx, http.MethodPost, path, b)
			if err == ErrInterrupted && wait {
				a.errf("stopped waiting; the execution goes on (%s lists it)\n", a.cmdline("exec ls --agent "+args[0]))
				return nil
			}
			if err != nil {
				var ae *APIError
				if asAPI(err, &ae) && ae.Status == 404 {
					ae.Hint = "no agent " + strconv.Quote(args[0]) + " is registered; `" + a.cmdline("agent ls") + "` lists them, `" +
						a.cmdline("agent add") + "` registers one"
				}
				return err
			}
			var e Execution
			json.Unmarshal(r.Body, &e)
			if wait {
				return a.awaitEnd(ctx, cl, &e, r.Body)
			}
			switch {
			case a.json:
				writeJSONLine(a.Out(), r.Body)
			case a.tty:
				a.printf("%s Created execution %s %s %s (%s)\n", a.styles.paint(a.styles.ok, "✔"), a.styles.paint(a.styles.id, e.ID),
					a.styles.paint(a.styles.dim, "of"), a.styles.paint(a.styles.bold, e.AgentID), a.styles.status(e.Status))
				if !watch {
					a.printf("  %s\n", a.styles.paint(a.styles.dim, "follow it: "+a.cmdline("exec watch "+ShortID(e.ID))))
				}
			default:
				a.printf("%s\n", e.ID)
			}
			if !watch {
				return nil
			}
			return a.watch(cmd, &e, 0, false)
		},
	}
	c.Flags().StringVar(&version, "agent-version", "", "agent version to record on the execution")
	c.Flags().BoolVar(&watch, "watch", false, "follow the timeline until the execution ends (exit 4 if it fails or is cancelled)")
	c.Flags().BoolVar(&wait, "wait", false, "wait until the execution ends and print its output (exit 4 if it fails or is cancelled)")
	return c
}

// execRun is `exec create --wait` under the name the SDKs give it
// (Client.run): an agent called like a function.
func (a *App) execRun() *cobra.Command {
	c := a.execCreate()
	c.Use = "run <agent_id> [input]"
	c.Short = "Run an agent on an input and print its output (exec create --wait)"
	c.Long = "Start an execution and wait until it ends, as `exec create --wait` does: its output\n" +
		"(JSON) is printed, or, when it failed or was cancelled, the reason, with exit status 4.\n" +
		"The kernel holds each request until the execution ends (no polling)."
	c.Example = "  rebuno exec run researcher '{\"topic\":\"durable agents\"}' | jq .summary\n" +
		"  rebuno exec run researcher @input.json > output.json"
	c.Flags().Set("wait", "true")
	c.Flags().MarkHidden("wait")
	c.Flags().MarkHidden("watch")
	return c
}

// waitParam is the wait= of one request the kernel holds (docs/protocol/executions.md §3.1):
// --timeout less a margin for the answer (5 s, or half of a shorter
// timeout), and at most the kernel's 60 s.
func (a *App) waitParam() string {
	held := min(a.timeout-min(5*time.Second, a.timeout/2), kernelMaxWait)
	return strconv.FormatInt(held.Milliseconds(), 10) + "ms"
}

// kernelMaxWait is the longest the kernel holds a waiting request.
const kernelMaxWait = 60 * time.Second

// awaitEnd waits until execution e (raw as read) has ended, through reads
// the kernel holds, then prints its output, or the whole execution with
// --json. A failed or cancelled execution is exit 4 with its reason.
func (a *App) awaitEnd(ctx context.Context, cl *Client, e *Execution, raw []byte) error {
	for !wire.ExecTerminal(e.Status) {
		var next Execution
		var err error
		raw, err = cl.GetJSON(ctx, "/v0/executions/"+e.ID+"?wait="+a.waitParam(), &next)
		if err == nil {
			*e = next
		}
		if err == ErrInterrupted {
			a.errf("stopped waiting for %s (it goes on; %s shows it)\n", ShortID(e.ID), a.cmdline("exec get "+ShortID(e.ID)))
			return nil
		}
		if err != nil {
			return err
		}
	}
	switch {
	case a.json:
		writeJSONLine(a.Out(), raw)
	case e.Status == wire.ExecCompleted && a.tty:
		a.printf("%s\n", indentJSON(e.Output))
	case e.Status == wire.ExecCompleted:
		writeJSONLine(a.Out(), e.Output)
	}
	if e.Status != wire.ExecCompleted {
		return &EndedError{ID: e.ID, Status: e.Status, Reason: e.FailureReason, Explain: true}
	}
	return nil
}

// readInput reads the input argument: JSON text, - (stdin) or @file.
func (a *App) readInput(arg string) ([]byte, error) {
	var b []byte
	var err error
	src := "input"
	switch {
	case arg == "-":
		src = "standard input"
		b, err = io.ReadAll(a.opt.In)
	case strings.HasPrefix(arg, "@"):
		src = arg[1:]
		b, err = os.ReadFile(arg[1:])
	default:
		b = []byte(arg)
	}
	if err != nil {
		return nil, fmt.Errorf("read %s: %v", src, err)
	}
	b = bytes.TrimSpace(b)
	if len(b) == 0 {
		return nil, fmt.Errorf("the %s is empty; give JSON such as '{}'", src)
	}
	if !json.Valid(b) {
		var v any
		err := json.Unmarshal(b, &v)
		return nil, fmt.Errorf("the %s is not valid JSON (%v); quote it for the shell, e.g. '{\"topic\":\"x\"}'", src, err)
	}
	return b, nil
}

func mustJSON(v any) json.RawMessage {
	b, _ := json.Marshal(v)
	return b
}

// encodeOrdered writes an object with keys in the given order, skipping
// absent ones; values are written verbatim.
func encodeOrdered(m map[string]json.RawMessage, keys ...string) []byte {
	var b bytes.Buffer
	b.WriteByte('{')
	first := true
	for _, k := range keys {
		v, ok := m[k]
		if !ok {
			continue
		}
		if !first {
			b.WriteByte(',')
		}
		first = false
		b.Write(mustJSON(k))
		b.WriteByte(':')
		b.Write(v)
	}
	b.WriteByte('}')
	return b.Bytes()
}

func asAPI(err error, target **APIError) bool { return errors.As(err, target) }

// getExecution resolves an id argument and reads the execution.
func (a *App) getExecution(cmd *cobra.Command, arg string) (*Execution, []byte, error) {
	ctx := ctxOf(cmd)
	id, err := a.ResolveExecution(ctx, arg)
	if err != nil {
		return nil, nil, err
	}
	cl, err := a.Client()
	if err != nil {
		return nil, nil, err
	}
	var e Execution
	raw, err := cl.GetJSON(ctx, "/v0/executions/"+id, &e)
	if err != nil {
		var ae *APIError
		if asAPI(err, &ae) && ae.Status == 404 {
			ae.Hint = "no execution " + id + " on this kernel (it may have been removed by retention)"
		}
		return nil, nil, err
	}
	return &e, raw, nil
}

func (a *App) execGet() *cobra.Command {
	return &cobra.Command{
		Use:   "get <id>",
		Short: "Show an execution",
		Args:  exactArgs("id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, raw, err := a.getExecution(cmd, args[0])
			if err != nil {
				return err
			}
			if a.json {
				writeJSONLine(a.Out(), raw)
				return nil
			}
			a.printExecution(e)
			return nil
		},
	}
}

func (a *App) printExecution(e *Execution) {
	st := a.styles
	a.printf("%s %s\n", st.paint(st.bold, "execution"), st.paint(st.id, e.ID))
	row := func(k, v string) {
		if strings.HasPrefix(v, "\n") {
			a.printf("  %s%s\n", st.paint(st.key, k), v)
		} else if v != "" {
			a.printf("  %s %s\n", st.paint(st.key, fmt.Sprintf("%-14s", k)), v)
		}
	}
	width := a.width - 17
	row("agent", e.AgentID)
	row("agent version", e.AgentVersion)
	row("status", st.status(e.Status))
	if e.FailureReason != "" {
		row("reason", st.paint(st.bad, e.FailureReason))
	}
	row("created", a.when(e.CreatedAt))
	row("updated", a.when(e.UpdatedAt))
	if e.DeadlineAt != nil {
		row("deadline", a.when(*e.DeadlineAt))
	}
	row("parent", e.Parent)
	a.lineageRows(e, row) // fork.go
	row("idempotency", e.Idempotency)
	row("on behalf of", e.OnBehalfOf)
	if len(e.ResourceKeys) > 0 {
		row("resources", strings.Join(e.ResourceKeys, ", "))
	}
	row("input", prettyJSON(e.Input, width))
	if e.Status == "completed" {
		row("output", prettyJSON(e.Output, width))
	}
}

func derefInt(p *int64) int64 {
	if p == nil {
		return 0
	}
	return *p
}

func (a *App) execLs() *cobra.Command {
	var agent, status, cursor string
	var limit int
	var all bool
	c := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List executions, newest first",
		Args:    exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if status != "" && !contains(execStatuses, status) {
				return usagef(cmd, "invalid --status %q: one of %s", status, strings.Join(execStatuses, ", "))
			}
			if limit < 0 || limit > 200 {
				return usagef(cmd, "invalid --limit %d: 1 to 200", limit)
			}
			if cursor != "" && !isFullUUID(cursor) {
				return usagef(cmd, "invalid --cursor %q: a full execution id (the next_cursor of a page)", cursor)
			}
			cl, err := a.Client()
			if err != nil {
				return err
			}
			ctx := ctxOf(cmd)
			t := &table{header: []string{"ID", "AGENT", "STATUS", "CREATED", "UPDATED"}}
			filters := url.Values{}
			if agent != "" {
				filters.Set("agent_id", agent)
			}
			if status != "" {
				filters.Set("status", status)
			}
			count, next, err := a.executionPages(ctx, cl, "/v0/executions", filters, cursor, limit, all, func(e Execution) {
				t.add(a.styles.paint(a.styles.id, ShortID(e.ID)), e.AgentID, a.styles.status(e.Status), a.when(e.CreatedAt), a.when(e.UpdatedAt))
			})
			if err != nil {
				return err
			}
			if a.json {
				return nil
			}
			if count == 0 {
				if a.tty {
					a.errf("No executions%s. Start one with: %s\n", filterText(agent, status), a.cmdline("exec create <agent_id> [input]"))
				}
				return nil
			}
			t.print(a.Out(), a.tty, a.styles)
			if next != "" {
				a.errf("more: %s (or --all)\n", a.cmdline("exec ls --cursor "+next+filterFlags(agent, status, limit)))
			}
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&agent, "agent", "", "only this agent's executions")
	f.StringVar(&status, "status", "", "only executions with this status ("+strings.Join(execStatuses, ", ")+")")
	f.IntVar(&limit, "limit", 0, "executions per page (1–200; default 50)")
	f.StringVar(&cursor, "cursor", "", "continue after this execution id (a page's next_cursor)")
	f.BoolVar(&all, "all", false, "follow next_cursor and list every matching execution")
	return c
}

func filterText(agent, status string) string {
	var parts []string
	if agent != "" {
		parts = append(parts, "of agent "+agent)
	}
	if status != "" {
		parts = append(parts, "with status "+status)
	}
	if len(parts) == 0 {
		return ""
	}
	return " " + strings.Join(parts, " ")
}

func filterFlags(agent, status string, limit int) string {
	s := ""
	if agent != "" {
		s += " --agent " + agent
	}
	if status != "" {
		s += " --status " + status
	}
	if limit > 0 {
		s += " --limit " + strconv.Itoa(limit)
	}
	return s
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func (a *App) execEvents() *cobra.Command {
	var after int64
	var follow bool
	c := &cobra.Command{
		Use:   "events <id>",
		Short: "Print an execution's timeline (all events so far)",
		Long: "Print an execution's event log as a timeline: every step with its kind, target,\n" +
			"decision, duration, args and result; dispatch attempts, lease expiries and\n" +
			"redeliveries; the final output or failure reason. --json prints one event per line.",
		Args: exactArgs("id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if after < 0 {
				return usagef(cmd, "invalid --after-seq %d: must be >= 0", after)
			}
			e, _, err := a.getExecution(cmd, args[0])
			if err != nil {
				return err
			}
			if follow {
				return a.watch(cmd, e, after, true)
			}
			cl, _ := a.Client()
			ctx := ctxOf(cmd)
			var tl *Timeline
			if !a.json {
				tl = a.newTimeline(e.CreatedAt, newStepCache(ctx, cl, e.ID).get)
				tl.Header(e, "events of")
			}
			last := after
			for {
				var page []json.RawMessage
				if _, err := cl.GetJSON(ctx, fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", e.ID, last), &page); err != nil {
					return err
				}
				for _, raw := range page {
					var ev Event
					json.Unmarshal(raw, &ev)
					if ev.Seq > last {
						last = ev.Seq
					}
					if a.json {
						writeJSONLine(a.Out(), raw)
					} else {
						tl.Event(ev)
					}
				}
				if len(page) < 1000 {
					break
				}
			}
			if tl != nil {
				// The execution may have moved on while the log was read.
				var now Execution
				if _, err := cl.GetJSON(ctx, "/v0/executions/"+e.ID, &now); err == nil {
					e = &now
				}
				tl.Footer(e)
			}
			return nil
		},
	}
	c.Flags().Int64Var(&after, "after-seq", 0, "only events after this sequence number")
	c.Flags().BoolVar(&follow, "follow", false, "keep following new events until the execution ends (like exec watch)")
	return c
}

func (a *App) execWatch() *cobra.Command {
	c := &cobra.Command{
		Use:   "watch <id>",
		Short: "Follow an execution's timeline live until it ends",
		Long: "Follow an execution's event log live and print its timeline until it ends. The\n" +
			"watch survives a kernel restart: it reconnects with Last-Event-ID and shows every\n" +
			"event exactly once. Exit status 4 when the execution fails or is cancelled.",
		Args: exactArgs("id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			e, _, err := a.getExecution(cmd, args[0])
			if err != nil {
				return err
			}
			return a.watch(cmd, e, 0, true)
		},
	}
	c.Flags().DurationVar(&a.reconnectFor, "reconnect-for", 5*time.Minute, "give up after the kernel has been unreachable this long (0: never)")
	return c
}

// watch follows e's events after seq `after` until it ends. Exit 4 when it
// ends failed or cancelled.
func (a *App) watch(cmd *cobra.Command, e *Execution, after int64, header bool) error {
	final, err := a.watchExecution(ctxOf(cmd), e, after, header, nil)
	if err != nil {
		if err == ErrInterrupted {
			if !a.json {
				a.errf("stopped watching %s (it goes on; resume with: %s)\n", ShortID(e.ID), a.cmdline("exec watch "+ShortID(e.ID)))
			}
			return nil
		}
		return err
	}
	if final.Status == "failed" || final.Status == "cancelled" {
		return &EndedError{ID: e.ID, Status: final.Status}
	}
	return nil
}

// watchExecution prints e's timeline (or its events as JSON lines) live
// until the execution ends, calling onEvent after each event, and returns
// the execution as it ended.
func (a *App) watchExecution(ctx context.Context, e *Execution, after int64, header bool, onEvent func(Event)) (*Execution, error) {
	cl, err := a.Client()
	if err != nil {
		return nil, err
	}
	var tl *Timeline
	if !a.json {
		tl = a.newTimeline(e.CreatedAt, newStepCache(ctx, cl, e.ID).get)
		if header {
			tl.Header(e, "watching")
		}
	}
	idle := max(a.timeout, 20*time.Second)
	status, err := a.follow(ctx, cl, e.ID, after, followOptions{ReconnectFor: a.reconnectFor, Idle: idle}, func(ev Event, raw []byte) {
		if a.json {
			writeJSONLine(a.Out(), raw)
		} else {
			tl.Event(ev)
		}
		if onEvent != nil {
			onEvent(ev)
		}
	})
	if err != nil {
		return nil, err
	}
	final := &Execution{ID: e.ID, AgentID: e.AgentID, Status: status}
	var now Execution
	if _, err := cl.GetJSON(ctx, "/v0/executions/"+e.ID, &now); err == nil {
		final = &now
	}
	if tl != nil {
		tl.Footer(final)
	}
	return final, nil
}

// WatchOptions configure Watch.
type WatchOptions struct {
	// URL and Token reach the kernel.
	URL, Token string
	// Out receives the timeline, Err reconnection notices.
	Out, Err io.Writer
	// OnEvent, when set, is called after each event is printed.
	OnEvent func(Event)
}

// Watch prints the live timeline of execution id — the output of
// `rebuno exec watch` — until the execution ends, and returns it as it
// ended. Programs such as the demo use it.
func Watch(ctx context.Context, id string, opt WatchOptions) (*Execution, error) {
	a := New(Options{Out: opt.Out, Err: opt.Err, FixedURL: opt.URL, FixedToken: opt.Token})
	cl, err := a.Client()
	if err != nil {
		return nil, err
	}
	var e Execution
	if _, err := cl.GetJSON(ctx, "/v0/executions/"+id, &e); err != nil {
		return nil, err
	}
	return a.watchExecution(ctx, &e, 0, false, opt.OnEvent)
}

func (a *App) execCancel() *cobra.Command {
	return &cobra.Command{
		Use:   "cancel <id>",
		Short: "Cancel an execution",
		Args:  exactArgs("id"),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			id, err := a.ResolveExecution(ctx, args[0])
			if err != nil {
				return err
			}
			cl, err := a.Client()
			if err != nil {
				return err
			}
			if _, err := cl.Do(ctx, http.MethodPost, "/v0/executions/"+id+"/cancel", nil); err != nil {
				var ae *APIError
				if asAPI(err, &ae) && ae.Code == "execution_terminal" {
					ae.Hint = "the execution has already ended; `" + a.cmdline("exec get "+ShortID(id)) + "` shows how"
				}
				return err
			}
			switch {
			case a.json:
				raw, err := cl.GetJSON(ctx, "/v0/executions/"+id, nil)
				if err != nil {
					return err
				}
				writeJSONLine(a.Out(), raw)
			case a.tty:
				a.printf("%s Cancelled execution %s\n", a.styles.paint(a.styles.ok, "✔"), a.styles.paint(a.styles.id, id))
			default:
				a.printf("cancelled %s\n", id)
			}
			return nil
		},
	}
}
