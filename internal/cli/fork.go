package cli

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"

	"github.com/spf13/cobra"
)

// `rebuno exec fork` and `rebuno exec forks` (docs/protocol/configuration.md §6.2 routes 32–33,
// docs/protocol/forks.md), and the lineage that `exec get` shows for a
// fork: where it came from and how its resources were restored.

func init() {
	RegisterExecVerb(func(a *App) *cobra.Command { return a.execFork() })
	RegisterExecVerb(func(a *App) *cobra.Command { return a.execForks() })
}

// member is one member of a JSON object, in the order the kernel wrote it.
type member struct {
	Key   string
	Value json.RawMessage
}

// members returns an object's members in their order (nil for anything but
// an object).
func members(raw json.RawMessage) []member {
	dec := json.NewDecoder(bytes.NewReader(raw))
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil
	}
	var out []member
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return out
		}
		key, _ := tok.(string)
		var v json.RawMessage
		if dec.Decode(&v) != nil {
			return out
		}
		out = append(out, member{Key: key, Value: v})
	}
	return out
}

// Restore is how a fork's copy of one resource was restored (the entries
// of `restoration`, docs/protocol/forks.md §3): from the checkpoint Ref taken at source event Seq,
// or from the initial environment when Seq is 0; Covered says whether that
// checkpoint holds exactly the state at the fork point.
type Restore struct {
	Key     string
	Ref     string
	Seq     int64
	Covered bool
}

// parseRestoration reads a `restoration` object, keeping the kernel's order
// (registration order).
func parseRestoration(raw json.RawMessage) []Restore {
	var out []Restore
	for _, m := range members(raw) {
		var v struct {
			Ref     string `json:"checkpoint_ref"`
			Seq     int64  `json:"checkpoint_seq"`
			Covered bool   `json:"covered"`
		}
		json.Unmarshal(m.Value, &v)
		out = append(out, Restore{Key: m.Key, Ref: v.Ref, Seq: v.Seq, Covered: v.Covered})
	}
	return out
}

// shortRef keeps a checkpoint ref readable in a table cell.
func shortRef(ref string) string {
	return Truncate(ref, 24)
}

// restoreCompact is the one-word form of a restore used in tables and on
// timeline lines: KEY=REF@SEQ (checkpoint REF covering from event SEQ), or
// KEY=(initial) for the initial environment.
func restoreCompact(key, ref string, seq int64) string {
	if seq == 0 {
		return key + "=(initial)"
	}
	return fmt.Sprintf("%s=%s@%d", key, shortRef(ref), seq)
}

// restorationCovered is the fork's coverage at its fork point: every
// resource covered (vacuously so with none).
func restorationCovered(rs []Restore) bool {
	for _, r := range rs {
		if !r.Covered {
			return false
		}
	}
	return true
}

// restorationWord is a fork's restoration in one short phrase for tables.
func (s styles) restorationWord(rs []Restore) string {
	switch {
	case len(rs) == 0:
		return s.paint(s.dim, "no resources")
	case restorationCovered(rs):
		return s.paint(s.ok, "covered")
	}
	return s.paint(s.warn, "uncovered")
}

// restoreLine explains the restore of one resource for a person.
func restoreLine(r Restore) string {
	switch {
	case r.Seq == 0:
		return "from the initial environment (no checkpoint at or before the fork point)"
	case r.Covered:
		return fmt.Sprintf("from checkpoint %s (event %d): exactly the state at the fork point", strconv.Quote(r.Ref), r.Seq)
	}
	return fmt.Sprintf("from checkpoint %s (event %d): older than the fork point; later steps replay without their changes",
		strconv.Quote(r.Ref), r.Seq)
}

// lineageRows adds a fork's lineage to `exec get`: the source and fork
// point, whether the fork point was covered, and how each resource was
// restored.
func (a *App) lineageRows(e *Execution, row func(k, v string)) {
	if e.ForkedFrom == "" {
		return
	}
	st := a.styles
	row("forked from", fmt.Sprintf("%s at event %d", e.ForkedFrom, derefInt(e.ForkSeq)))
	rs := parseRestoration(e.Restoration)
	switch {
	case len(rs) == 0:
		row("restoration", "nothing to restore (no resources at the fork point)")
	case restorationCovered(rs):
		row("restoration", st.paint(st.ok, "covered")+": every resource starts exactly as it was at the fork point")
	default:
		row("restoration", st.paint(st.warn, "not covered")+": a resource starts from an earlier state")
	}
	for _, r := range rs {
		row("  "+r.Key, restoreLine(r))
	}
}

func (a *App) execFork() *cobra.Command {
	var at int64
	var watch bool
	var idemKey string
	c := &cobra.Command{
		Use:   "fork <id> --at <event_seq>",
		Short: "Start a new execution from an execution's history up to an event",
		Long: "Fork an execution at one of its events: a new execution of the same agent and input\n" +
			"whose completed steps up to that event replay, and whose resources are restored from\n" +
			"the checkpoint that covers the event (or the newest earlier one, or the initial\n" +
			"environment). The source is not changed. `rebuno exec coverage <id>` shows, for every\n" +
			"event, whether a fork there is covered and what it would restore.\n\n" +
			"Prints the new execution with its restoration; --watch then follows its timeline until\n" +
			"it ends (exit 4 if it fails or is cancelled).",
		Example: "  rebuno exec coverage 9c2e41f7\n" +
			"  rebuno exec fork 9c2e41f7 --at 15\n" +
			"  rebuno exec fork 9c2e41f7 --at 15 --watch",
		Args:              exactArgs("id"),
		ValidArgsFunction: a.completeExecutions,
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("at") {
				return usagef(cmd, "--at is required: the event to fork at (`%s` lists the events)", a.cmdline("exec events "+args[0]))
			}
			if at < 1 {
				return usagef(cmd, "invalid --at %d: an event sequence number, 1 or more", at)
			}
			ctx := ctxOf(cmd)
			id, err := a.ResolveExecution(ctx, args[0])
			if err != nil {
				return err
			}
			cl, err := a.Client()
			if err != nil {
				return err
			}
			body := fmt.Appendf(nil, `{"at_seq":%d}`, at)
			var h http.Header
			if idemKey != "" {
				h = http.Header{"Idempotency-Key": []string{idemKey}}
			}
			r, err := doWithHeader(ctx, cl, http.MethodPost, "/v0/executions/"+id+"/fork", body, h)
			if err != nil {
				a.forkHint(err, id)
				return err
			}
			var e Execution
			json.Unmarshal(r.Body, &e)
			switch {
			case a.json:
				writeJSONLine(a.Out(), r.Body)
			case a.tty:
				a.printf("%s Forked %s at event %d → new execution %s (%s)\n", a.styles.paint(a.styles.ok, "✔"),
					a.styles.paint(a.styles.id, ShortID(id)), at, a.styles.paint(a.styles.id, e.ID), a.styles.status(e.Status))
				a.printExecution(&e)
				if !watch {
					a.printf("  %s\n", a.styles.paint(a.styles.dim, "follow it: "+a.cmdline("exec watch "+ShortID(e.ID))))
				}
			default:
				a.printExecution(&e)
			}
			if !watch {
				return nil
			}
			return a.watch(cmd, &e, 0, false)
		},
	}
	f := c.Flags()
	f.Int64Var(&at, "at", 0, "the event sequence number to fork at (required)")
	f.BoolVar(&watch, "watch", false, "follow the fork's timeline until it ends (exit 4 if it fails or is cancelled)")
	f.StringVar(&idemKey, "idempotency-key", "", "send this Idempotency-Key: repeating the command returns the same fork")
	return c
}

// forkHint adds what to do to a refused fork.
func (a *App) forkHint(err error, id string) {
	var ae *APIError
	if !asAPI(err, &ae) {
		return
	}
	switch {
	case ae.Status == 404 && ae.Code == "not_found":
		ae.Hint = "no execution " + id + " on this kernel (it may have been removed by retention)"
	case ae.Code == "validation_error" && strings.Contains(ae.Message, "at_seq"):
		ae.Hint = "--at must name one of the execution's events; `" + a.cmdline("exec coverage "+ShortID(id)) +
			"` lists them with what a fork at each would restore"
	case ae.Code == "conflict" && strings.Contains(ae.Message, "not registered"):
		ae.Hint = "a fork runs on its source's agent: register it again (`" + a.cmdline("agent add") + "`) to fork this execution"
	case ae.Code == "conflict":
		ae.Hint = "this --idempotency-key was used for another fork request; pick a new key"
	}
}

func (a *App) execForks() *cobra.Command {
	var cursor string
	var limit int
	var all bool
	c := &cobra.Command{
		Use:   "forks <id>",
		Short: "List an execution's direct forks, newest first",
		Long: "List the forks made directly from an execution (not forks of those forks; list them\n" +
			"in turn), newest first: each fork's id, status, the event it was forked at and whether\n" +
			"that point was covered.",
		Args:              exactArgs("id"),
		ValidArgsFunction: a.completeExecutions,
		RunE: func(cmd *cobra.Command, args []string) error {
			if limit < 0 || limit > 200 {
				return usagef(cmd, "invalid --limit %d: 1 to 200", limit)
			}
			if cursor != "" && !isFullUUID(cursor) {
				return usagef(cmd, "invalid --cursor %q: a full execution id (the next_cursor of a page)", cursor)
			}
			ctx := ctxOf(cmd)
			id, err := a.ResolveExecution(ctx, args[0])
			if err != nil {
				return err
			}
			cl, err := a.Client()
			if err != nil {
				return err
			}
			st := a.styles
			t := &table{header: []string{"ID", "STATUS", "FORK AT", "RESTORATION", "RESTORES", "CREATED"}}
			count, next, err := a.executionPages(ctx, cl, "/v0/executions/"+id+"/forks", nil, cursor, limit, all, func(e Execution) {
				rs := parseRestoration(e.Restoration)
				var restores []string
				for _, x := range rs {
					restores = append(restores, restoreCompact(x.Key, x.Ref, x.Seq))
				}
				t.add(st.paint(st.id, ShortID(e.ID)), st.status(e.Status), strconv.FormatInt(derefInt(e.ForkSeq), 10),
					st.restorationWord(rs), orDash(strings.Join(restores, " ")), a.when(e.CreatedAt))
			})
			if err != nil {
				var ae *APIError
				if asAPI(err, &ae) && ae.Status == 404 && ae.Code == "not_found" {
					ae.Hint = "no execution " + id + " on this kernel (it may have been removed by retention)"
				}
				return err
			}
			if a.json {
				return nil
			}
			if count == 0 {
				if a.tty {
					a.errf("No forks of %s. Make one with: %s\n", ShortID(id), a.cmdline("exec fork "+ShortID(id)+" --at <event_seq>"))
				}
				return nil
			}
			t.print(a.Out(), a.tty, a.styles)
			if next != "" {
				more := "exec forks " + ShortID(id) + " --cursor " + next
				if limit > 0 {
					more += " --limit " + strconv.Itoa(limit)
				}
				a.errf("more: %s (or --all)\n", a.cmdline(more))
			}
			return nil
		},
	}
	f := c.Flags()
	f.IntVar(&limit, "limit", 0, "forks per page (1–200; default 50)")
	f.StringVar(&cursor, "cursor", "", "continue after this fork id (a page's next_cursor)")
	f.BoolVar(&all, "all", false, "follow next_cursor and list every direct fork")
	return c
}

// doWithHeader is Client.Do with extra request headers.
func doWithHeader(ctx context.Context, c *Client, method, path string, body []byte, h http.Header) (*Response, error) {
	ctx, cancel := context.WithTimeout(ctx, c.timeout)
	defer cancel()
	resp, err := c.send(ctx, method, path, body, h)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, c.transportError(ctx, err)
	}
	if resp.StatusCode < 200 || resp.StatusCode > 299 {
		return nil, c.apiError(method, path, resp, b)
	}
	return &Response{Status: resp.StatusCode, Header: resp.Header, Body: b}, nil
}

func orDash(s string) string {
	if s == "" {
		return "-"
	}
	return s
}
