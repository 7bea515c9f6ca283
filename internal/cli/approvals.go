package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/spf13/cobra"
)

// `rebuno approvals …` (docs/protocol/governance.md §1, docs/protocol/configuration.md §6.2): list, show, grant and deny
// the approvals that require_approval rules create.

// Environment variables naming the person who decides (`--by`).
const (
	EnvUser = "REBUNO_USER"
)

var approvalStatuses = []string{"pending", "granted", "denied", "expired"}

// maxApprovalPage is the kernel's page size for approvals (docs/protocol/governance.md §1.2).
const maxApprovalPage = 1000

// Approval is the resource of docs/protocol/governance.md §1.1.
type Approval struct {
	ID          string     `json:"id"`
	StepID      string     `json:"step_id"`
	ExecutionID string     `json:"execution_id"`
	AgentID     string     `json:"agent_id"`
	Kind        string     `json:"kind"`
	Target      string     `json:"target"`
	Status      string     `json:"status"`
	Approvers   []string   `json:"approvers"`
	Message     string     `json:"message"`
	TimeoutAt   time.Time  `json:"timeout_at"`
	DecidedBy   string     `json:"decided_by"`
	DecidedAt   *time.Time `json:"decided_at"`
	Rationale   string     `json:"rationale"`
	CreatedAt   time.Time  `json:"created_at"`
}

func init() { RegisterNoun(func(a *App) *cobra.Command { return a.approvalsCommand() }) }

func (a *App) approvalsCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "approvals <command>",
		Aliases: []string{"approval"},
		Short:   "List, show, grant and deny approvals",
		Long: "Work with approvals: the steps a require_approval rule holds until a person decides.\n\n" +
			"An approval id may be given in full or as a unique suffix of at least six hex digits\n" +
			"(the short id `rebuno approvals ls` shows). --by names who decides; it defaults to\n" +
			"$" + EnvUser + ", else $USER, and must be one of the approval's approvers when it names any.",
		Example: "  rebuno approvals ls\n" +
			"  rebuno approvals get 5e0f12ab\n" +
			"  rebuno approvals grant 5e0f12ab --by alice --rationale \"recipient checked\"\n" +
			"  rebuno approvals deny 5e0f12ab --by alice --rationale \"wrong customer\"",
	}
	c.AddCommand(a.approvalsLs(), a.approvalsGet(), a.approvalsDecide(true), a.approvalsDecide(false))
	return c
}

// listApprovals reads every approval with status (all statuses for "all")
// of execution execID ("" for any), oldest first within each status.
func (a *App) listApprovals(ctx context.Context, status, execID string, maxPages int) ([]json.RawMessage, error) {
	cl, err := a.Client()
	if err != nil {
		return nil, err
	}
	statuses := []string{status}
	if status == "all" {
		statuses = approvalStatuses
	}
	var out []json.RawMessage
	for _, s := range statuses {
		after := ""
		for page := 0; maxPages <= 0 || page < maxPages; page++ {
			q := url.Values{}
			q.Set("status", s)
			if execID != "" {
				q.Set("execution_id", execID)
			}
			if after != "" {
				q.Set("after", after)
			}
			var list []json.RawMessage
			if _, err := cl.GetJSON(ctx, "/v0/approvals?"+q.Encode(), &list); err != nil {
				return nil, err
			}
			out = append(out, list...)
			if len(list) < maxApprovalPage {
				break
			}
			var last Approval
			json.Unmarshal(list[len(list)-1], &last)
			after = last.ID
		}
	}
	return out, nil
}

// ResolveApproval turns a full UUID or a unique suffix of at least six hex
// digits into an approval id. Suffixes are matched among the listed
// approvals: the pending ones first, then the decided ones.
func (a *App) ResolveApproval(ctx context.Context, arg string) (string, error) {
	arg = strings.TrimSpace(arg)
	if isFullUUID(arg) {
		return strings.ToLower(arg), nil
	}
	if !isHex(arg) || len(arg) < MinSuffixLen || len(arg) > 12 {
		return "", &UsageError{Msg: fmt.Sprintf("invalid approval id %q: give the full id, or the last %d to 12 hex digits of it (as `%s` shows)",
			arg, MinSuffixLen, a.cmdline("approvals ls"))}
	}
	suffix := strings.ToLower(arg)
	var matches []Approval
	for _, status := range approvalStatuses {
		list, err := a.listApprovals(ctx, status, "", 10)
		if err != nil {
			return "", err
		}
		for _, raw := range list {
			var ap Approval
			if json.Unmarshal(raw, &ap) == nil && strings.HasSuffix(ap.ID, suffix) {
				matches = append(matches, ap)
			}
		}
		if status == "pending" && len(matches) == 1 {
			// The common case (deciding a pending approval) needs no more.
			return matches[0].ID, nil
		}
	}
	switch len(matches) {
	case 1:
		return matches[0].ID, nil
	case 0:
		return "", notFound(fmt.Sprintf("no approval id ends with %q", suffix),
			"`"+a.cmdline("approvals ls --status all")+"` lists every approval")
	}
	var b strings.Builder
	fmt.Fprintf(&b, "ambiguous approval id %q: it ends %d approvals:", suffix, len(matches))
	for i, ap := range matches {
		if i == 10 {
			fmt.Fprintf(&b, "\n  … and %d more", len(matches)-10)
			break
		}
		fmt.Fprintf(&b, "\n  %s  %s  %s %s  %s", ap.ID, ap.Status, ap.Kind, ap.Target, ap.AgentID)
	}
	b.WriteString("\ngive more digits, or the full id")
	return "", &UsageError{Msg: b.String()}
}

// completeApprovals offers the short ids of pending approvals to shell
// completion.
func (a *App) completeApprovals(cmd *cobra.Command, args []string, _ string) ([]string, cobra.ShellCompDirective) {
	if len(args) > 0 {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	list, err := a.listApprovals(ctxOf(cmd), "pending", "", 1)
	if err != nil {
		return nil, cobra.ShellCompDirectiveNoFileComp
	}
	var out []string
	for _, raw := range list {
		var ap Approval
		if json.Unmarshal(raw, &ap) == nil {
			out = append(out, ShortID(ap.ID)+"\t"+ap.Kind+" "+ap.Target+" ("+ap.AgentID+")")
		}
	}
	return out, cobra.ShellCompDirectiveNoFileComp
}

func (a *App) approvalsLs() *cobra.Command {
	var status, execution string
	c := &cobra.Command{
		Use:     "ls",
		Aliases: []string{"list"},
		Short:   "List approvals (pending ones unless --status says otherwise)",
		Long: "List approvals, oldest first: by default the pending ones, waiting for a decision.\n" +
			"--status pending|granted|denied|expired|all; --execution ID lists one execution's.",
		Args: exactArgs(),
		RunE: func(cmd *cobra.Command, args []string) error {
			if status == "" {
				status = "pending"
			}
			if status != "all" && !contains(approvalStatuses, status) {
				return usagef(cmd, "invalid --status %q: one of %s, all", status, strings.Join(approvalStatuses, ", "))
			}
			ctx := ctxOf(cmd)
			execID := ""
			if execution != "" {
				var err error
				if execID, err = a.ResolveExecution(ctx, execution); err != nil {
					return err
				}
			}
			list, err := a.listApprovals(ctx, status, execID, 0)
			if err != nil {
				return err
			}
			if a.json {
				b := []byte{'['}
				for i, raw := range list {
					if i > 0 {
						b = append(b, ',')
					}
					b = append(b, []byte(CompactJSON(raw))...)
				}
				writeJSONLine(a.Out(), append(b, ']'))
				return nil
			}
			if len(list) == 0 {
				if a.tty {
					what := "No " + status + " approvals"
					if status == "all" {
						what = "No approvals"
					}
					if execID != "" {
						what += " for execution " + ShortID(execID)
					}
					a.errf("%s.\n", what)
				}
				return nil
			}
			st := a.styles
			var t *table
			if status == "pending" {
				t = &table{header: []string{"ID", "EXECUTION", "AGENT", "STEP", "APPROVERS", "CREATED", "EXPIRES"}}
			} else {
				t = &table{header: []string{"ID", "STATUS", "EXECUTION", "AGENT", "STEP", "APPROVERS", "DECIDED BY", "DECIDED"}}
			}
			for _, raw := range list {
				var ap Approval
				json.Unmarshal(raw, &ap)
				step := ap.Kind + " " + st.paint(st.bold, orQuotes(ap.Target))
				id := st.paint(st.id, ShortID(ap.ID))
				if status == "pending" {
					t.add(id, ShortID(ap.ExecutionID), ap.AgentID, step, approversText(ap.Approvers), a.when(ap.CreatedAt), a.when(ap.TimeoutAt))
					continue
				}
				by, decided := "-", "-"
				if ap.DecidedBy != "" {
					by = ap.DecidedBy
				}
				if ap.DecidedAt != nil {
					decided = a.when(*ap.DecidedAt)
				}
				t.add(id, st.status(ap.Status), ShortID(ap.ExecutionID), ap.AgentID, step, approversText(ap.Approvers), by, decided)
			}
			t.print(a.Out(), a.tty, st)
			if a.tty && status == "pending" {
				a.errf("%s\n", st.paint(st.dim, "decide: "+a.cmdline("approvals grant <id> --by NAME")+"  or  "+a.cmdline("approvals deny <id> --by NAME --rationale TEXT")))
			}
			return nil
		},
	}
	c.Flags().StringVar(&status, "status", "pending", "pending, granted, denied, expired or all")
	c.Flags().StringVar(&execution, "execution", "", "only this execution's approvals (full id or short id)")
	return c
}

func orQuotes(s string) string {
	if s == "" {
		return `""`
	}
	return s
}

// getApproval resolves an id argument and reads the approval.
func (a *App) getApproval(ctx context.Context, arg string) (*Approval, []byte, error) {
	id, err := a.ResolveApproval(ctx, arg)
	if err != nil {
		return nil, nil, err
	}
	cl, err := a.Client()
	if err != nil {
		return nil, nil, err
	}
	var ap Approval
	raw, err := cl.GetJSON(ctx, "/v0/approvals/"+id, &ap)
	if err != nil {
		var ae *APIError
		if asAPI(err, &ae) && ae.Status == 404 {
			ae.Hint = "`" + a.cmdline("approvals ls --status all") + "` lists every approval"
		}
		return nil, nil, err
	}
	return &ap, raw, nil
}

func (a *App) approvalsGet() *cobra.Command {
	return &cobra.Command{
		Use:               "get <id>",
		Short:             "Show an approval: the step it holds (with its args), approvers, message, outcome",
		Args:              exactArgs("id"),
		ValidArgsFunction: a.completeApprovals,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			ap, raw, err := a.getApproval(ctx, args[0])
			if err != nil {
				return err
			}
			if a.json {
				writeJSONLine(a.Out(), raw)
				return nil
			}
			st := a.styles
			a.printf("%s %s\n", st.paint(st.bold, "approval"), st.paint(st.id, ap.ID))
			row := func(k, v string) {
				if strings.HasPrefix(v, "\n") {
					a.printf("  %s%s\n", st.paint(st.key, k), v)
				} else if v != "" {
					a.printf("  %s %s\n", st.paint(st.key, fmt.Sprintf("%-11s", k)), v)
				}
			}
			row("status", st.status(ap.Status))
			row("execution", ap.ExecutionID)
			row("agent", ap.AgentID)
			row("step", ap.Kind+" "+st.paint(st.bold, orQuotes(ap.Target)))
			cl, _ := a.Client()
			var s Step
			if _, err := cl.GetJSON(ctx, "/v0/executions/"+ap.ExecutionID+"/steps/"+ap.StepID, &s); err == nil {
				row("args", prettyJSON(s.Args, a.width-14))
			}
			row("approvers", approversText(ap.Approvers))
			row("message", ap.Message)
			row("created", a.when(ap.CreatedAt))
			if ap.Status == "pending" {
				row("expires", a.when(ap.TimeoutAt))
			} else {
				row("timeout", a.when(ap.TimeoutAt))
			}
			row("decided by", ap.DecidedBy)
			if ap.DecidedAt != nil {
				row("decided", a.when(*ap.DecidedAt))
			}
			row("rationale", ap.Rationale)
			if ap.Status == "pending" && a.tty {
				short := ShortID(ap.ID)
				a.printf("  %s\n", st.paint(st.dim, "decide: "+a.cmdline("approvals grant "+short+" --by NAME")+"  or  "+
					a.cmdline("approvals deny "+short+" --by NAME --rationale TEXT")))
			}
			return nil
		},
	}
}

// decider is the name a grant or deny is recorded under: --by, else
// $REBUNO_USER, else $USER.
func (a *App) decider(by string) string {
	if by != "" {
		return by
	}
	if v := a.opt.Getenv(EnvUser); v != "" {
		return v
	}
	return a.opt.Getenv("USER")
}

func (a *App) approvalsDecide(grant bool) *cobra.Command {
	var by, rationale string
	verb, past := "grant", "granted"
	short := "Grant an approval: the held step may run"
	if !grant {
		verb, past = "deny", "denied"
		short = "Deny an approval: the held step is refused (with --rationale as the reason)"
	}
	c := &cobra.Command{
		Use:               verb + " <id>",
		Short:             short,
		Args:              exactArgs("id"),
		ValidArgsFunction: a.completeApprovals,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx := ctxOf(cmd)
			id, err := a.ResolveApproval(ctx, args[0])
			if err != nil {
				return err
			}
			cl, err := a.Client()
			if err != nil {
				return err
			}
			name := a.decider(by)
			body := map[string]json.RawMessage{"decided_by": mustJSON(name)}
			if rationale != "" {
				body["rationale"] = mustJSON(rationale)
			}
			if _, err := cl.Do(ctx, http.MethodPost, "/v0/approvals/"+id+"/"+verb, encodeOrdered(body, "decided_by", "rationale")); err != nil {
				a.decideHint(ctx, err, id, name)
				return err
			}
			var ap Approval
			raw, err := cl.GetJSON(ctx, "/v0/approvals/"+id, &ap)
			if err != nil {
				return err
			}
			switch {
			case a.json:
				writeJSONLine(a.Out(), raw)
			case a.tty:
				mark := a.styles.paint(a.styles.ok, "✔")
				if !grant {
					mark = a.styles.paint(a.styles.bad, "✘")
				}
				as := ""
				if name != "" {
					as = " as " + a.styles.paint(a.styles.bold, name)
				}
				a.printf("%s %s approval %s: %s %s of execution %s%s\n", mark, strings.ToUpper(past[:1])+past[1:],
					a.styles.paint(a.styles.id, ShortID(id)), ap.Kind, a.styles.paint(a.styles.bold, orQuotes(ap.Target)), ShortID(ap.ExecutionID), as)
				a.printf("  %s\n", a.styles.paint(a.styles.dim, "the execution resumes: "+a.cmdline("exec watch "+ShortID(ap.ExecutionID))))
			default:
				a.printf("%s %s\n", past, id)
			}
			return nil
		},
	}
	c.Flags().StringVar(&by, "by", "", "who decides (default $"+EnvUser+", else $USER)")
	c.Flags().StringVar(&rationale, "rationale", "", "why; on a denial it is the reason the agent sees")
	return c
}

// decideHint explains a refused grant or deny.
func (a *App) decideHint(ctx context.Context, err error, id, name string) {
	var ae *APIError
	if !asAPI(err, &ae) {
		return
	}
	cl, _ := a.Client()
	var ap Approval
	have := false
	if ae.Status == 403 || ae.Status == 409 {
		_, gerr := cl.GetJSON(ctx, "/v0/approvals/"+id, &ap)
		have = gerr == nil
	}
	switch {
	case ae.Status == 404:
		ae.Hint = "`" + a.cmdline("approvals ls --status all") + "` lists every approval"
	case ae.Status == 403 && have:
		who := "no name was given"
		if name != "" {
			who = "you decided as " + fmt.Sprintf("%q", name)
		}
		ae.Hint = fmt.Sprintf("only %s may decide this approval and %s: pass --by NAME (or set $%s)",
			strings.Join(ap.Approvers, ", "), who, EnvUser)
	case ae.Code == "execution_terminal":
		ae.Hint = "the execution has already ended"
	case ae.Status == 409 && have:
		switch ap.Status {
		case "expired":
			why := ap.Rationale
			if why == "timeout" {
				why = "it timed out"
			}
			ae.Hint = "the approval expired (" + why + ")"
			if ap.DecidedAt != nil {
				ae.Hint += " at " + Timestamp(*ap.DecidedAt)
			}
		default:
			ae.Hint = "the approval was already " + ap.Status
			if ap.DecidedBy != "" {
				ae.Hint += " by " + ap.DecidedBy
			}
			if ap.DecidedAt != nil {
				ae.Hint += " at " + Timestamp(*ap.DecidedAt)
			}
		}
	}
}
