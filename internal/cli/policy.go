package cli

import (
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/http"
	"net/url"
	"os"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/wire"
)

// `rebuno policy …` (docs/protocol/governance.md §2, docs/protocol/configuration.md §6.2): check and explain run the
// kernel's own validator and evaluator locally; test replays a candidate
// bundle over recorded steps read through the API; set, get and rm load,
// read back and remove an agent's bundle through the admin API.

func init() { RegisterNoun(func(a *App) *cobra.Command { return a.policyCommand() }) }

func (a *App) policyCommand() *cobra.Command {
	c := &cobra.Command{
		Use:     "policy <command>",
		Aliases: []string{"policies"},
		Short:   "Check, explain, test and load policy bundles",
		Long: "Work with policy bundles: the YAML rules that allow, deny, rate-limit or hold for a\n" +
			"human each step an agent takes.\n\n" +
			"`check` and `explain` run locally with the kernel's own validator and evaluator;\n" +
			"`test` replays a candidate bundle over an agent's recorded steps; `set`, `get` and\n" +
			"`rm` load, read back and remove an agent's bundle. FILE may be - for standard input.",
		Example: "  rebuno policy check policies/researcher.yaml\n" +
			"  rebuno policy explain policies/researcher.yaml --kind tool_call --target send_email --args '{\"to\":\"eve@example.org\"}'\n" +
			"  rebuno policy test policies/researcher.yaml --agent researcher --last 50\n" +
			"  rebuno policy set researcher policies/researcher.yaml",
	}
	c.AddCommand(a.policyCheck(), a.policyExplain(), a.policyTest(), a.policySet(), a.policyGet(), a.policyRm())
	return c
}

// readBundleFile reads a bundle from a file, or standard input for "-". It
// returns the text and the name to show in messages.
func (a *App) readBundleFile(name string) (string, string, error) {
	if name == "-" {
		b, err := io.ReadAll(a.opt.In)
		if err != nil {
			return "", "", &UsageError{Msg: fmt.Sprintf("read standard input: %v", err)}
		}
		return string(b), "<stdin>", nil
	}
	b, err := os.ReadFile(name)
	if err != nil {
		var pe *fs.PathError
		if errors.As(err, &pe) {
			err = pe.Err
		}
		return "", "", &UsageError{Msg: fmt.Sprintf("cannot read %s: %v", name, err)}
	}
	return string(b), name, nil
}

// InvalidBundleError reports a bundle that failed validation; its problems
// have been printed. Exit 1.
type InvalidBundleError struct {
	File     string
	Problems int
}

func (e *InvalidBundleError) Error() string {
	return fmt.Sprintf("%s: invalid policy bundle (%d problem%s)", e.File, e.Problems, plural(e.Problems))
}

// printBundleProblems prints one line per problem, compiler style
// (FILE:LINE: key.path: problem), so that editors can jump to it.
func (a *App) printBundleProblems(w io.Writer, file string, errs []*policy.ValidationError) {
	st := a.styles
	for _, e := range errs {
		loc := file
		if e.Line > 0 {
			loc += ":" + strconv.Itoa(e.Line)
		}
		path := ""
		if e.Path != "" {
			path = e.Path + ": "
		}
		fmt.Fprintf(w, "%s: %s%s\n", st.paint(st.bold, loc), path, st.paint(st.bad, e.Problem))
	}
}

// loadBundle reads and compiles a bundle file. An invalid bundle has its
// problems printed on problemsTo and yields an *InvalidBundleError.
func (a *App) loadBundle(name string, problemsTo io.Writer) (*policy.Bundle, string, string, error) {
	text, file, err := a.readBundleFile(name)
	if err != nil {
		return nil, "", "", err
	}
	if errs := policy.Check(text); len(errs) > 0 {
		a.printBundleProblems(problemsTo, file, errs)
		return nil, "", "", &InvalidBundleError{File: file, Problems: len(errs)}
	}
	b, err := policy.Parse(text)
	if err != nil { // unreachable: Check found nothing
		return nil, "", "", err
	}
	return b, text, file, nil
}

func bundleSummary(b *policy.Bundle) string {
	if b == nil {
		return "empty: no policy, every step is allowed"
	}
	return fmt.Sprintf("%d rule%s, default_action %s", len(b.Rules), plural(len(b.Rules)), b.DefaultAction)
}

// checkProblem is a validation problem in --json output.
type checkProblem struct {
	Line    int    `json:"line"`
	Path    string `json:"path"`
	Problem string `json:"problem"`
}

func (a *App) policyCheck() *cobra.Command {
	return &cobra.Command{
		Use:   "check <file>",
		Short: "Validate a policy bundle locally (every problem, with its line)",
		Long: "Validate a policy bundle exactly as the kernel does before it stores one\n" +
			"(docs/protocol/governance.md §2.3), without contacting a kernel. Prints ok, or every problem as\n" +
			"FILE:LINE: key.path: problem. Exit status 1 when the bundle is invalid.",
		Example: "  rebuno policy check examples/policies/coder.yaml",
		Args:    exactArgs("file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			text, file, err := a.readBundleFile(args[0])
			if err != nil {
				return err
			}
			errs := policy.Check(text)
			if a.json {
				out := struct {
					File          string         `json:"file"`
					Valid         bool           `json:"valid"`
					Rules         *int           `json:"rules,omitempty"`
					DefaultAction string         `json:"default_action,omitempty"`
					Errors        []checkProblem `json:"errors"`
				}{File: file, Valid: len(errs) == 0, Errors: []checkProblem{}}
				for _, e := range errs {
					out.Errors = append(out.Errors, checkProblem{Line: e.Line, Path: e.Path, Problem: e.Problem})
				}
				if len(errs) == 0 {
					if b, _ := policy.Parse(text); b != nil {
						n := len(b.Rules)
						out.Rules, out.DefaultAction = &n, b.DefaultAction
					}
				}
				writeJSONLine(a.Out(), mustJSON(out))
			} else if len(errs) > 0 {
				a.printBundleProblems(a.Out(), file, errs)
			} else if a.tty {
				b, _ := policy.Parse(text)
				a.printf("%s ok: %s (%s)\n", a.styles.paint(a.styles.ok, "✔"), a.styles.paint(a.styles.bold, file), bundleSummary(b))
			} else {
				a.printf("ok\n")
			}
			if len(errs) > 0 {
				return &InvalidBundleError{File: file, Problems: len(errs)}
			}
			return nil
		},
	}
}

// parseArgsFlag reads --args: JSON text or @FILE; empty means null.
func parseArgsFlag(s string) (*jsonx.Value, json.RawMessage, error) {
	raw := []byte(s)
	if strings.HasPrefix(s, "@") {
		b, err := os.ReadFile(s[1:])
		if err != nil {
			var pe *fs.PathError
			if errors.As(err, &pe) {
				err = pe.Err
			}
			return nil, nil, fmt.Errorf("cannot read --args file %s: %v", s[1:], err)
		}
		raw = b
	}
	if strings.TrimSpace(string(raw)) == "" {
		raw = []byte("null")
	}
	v, err := jsonx.Parse(raw, wire.MaxNesting)
	if err != nil {
		return nil, nil, fmt.Errorf("invalid --args: %v; quote the JSON for the shell, e.g. --args '{\"path\":\"/tmp\"}'", err)
	}
	if v.Kind == jsonx.KindNull {
		v = nil
	}
	return v, json.RawMessage(CompactJSON(raw)), nil
}

func approversText(list []string) string {
	if len(list) == 0 {
		return "anyone"
	}
	return strings.Join(list, ", ")
}

func approvalConfigText(c *policy.ApprovalConfig) string {
	if c == nil {
		c = &policy.ApprovalConfig{}
	}
	parts := []string{"approvers " + approversText(c.Approvers)}
	if c.Timeout > 0 {
		parts = append(parts, "timeout "+policy.ShortDuration(c.Timeout))
	} else {
		parts = append(parts, "timeout: the kernel's --approval-timeout")
	}
	if c.Message != "" {
		parts = append(parts, "message "+strconv.Quote(c.Message))
	}
	return strings.Join(parts, "; ")
}

func rateLimitText(r *policy.RateLimit) string {
	return fmt.Sprintf("%d call%s per %s per %s; on limiter error: %s", r.MaxCalls, plural(int(r.MaxCalls)), policy.ShortDuration(r.Window), r.PerWhat, r.OnLimiterError)
}

func (a *App) policyExplain() *cobra.Command {
	var kind, target, argsText, agent string
	c := &cobra.Command{
		Use:   "explain <file> --kind K --target T",
		Short: "Show which rule decides a step, and why the earlier rules do not",
		Long: "Evaluate a policy bundle locally for one step and explain the outcome: the winning\n" +
			"rule, its decision and reason (with its approval and rate-limit settings), and for\n" +
			"every rule tried before it the first condition the step did not meet.\n\n" +
			"--args is the step's JSON arguments (default null), or @FILE. Without --agent,\n" +
			"agent_id and agent_ids conditions never match.",
		Example: "  rebuno policy explain examples/policies/researcher.yaml --agent researcher \\\n" +
			"      --kind tool_call --target send_email --args '{\"to\":\"eve@elsewhere.org\"}'",
		Args: exactArgs("file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if !cmd.Flags().Changed("kind") {
				return usagef(cmd, "missing --kind (tool_call, llm_call or local)")
			}
			if !wire.ValidKind(kind) {
				return usagef(cmd, "invalid --kind %q: tool_call, llm_call or local", kind)
			}
			if !cmd.Flags().Changed("target") {
				return usagef(cmd, "missing --target (the tool name, model or local step name)")
			}
			argv, argsRaw, err := parseArgsFlag(argsText)
			if err != nil {
				return usagef(cmd, "%v", err)
			}
			b, _, file, err := a.loadBundle(args[0], a.Err())
			if err != nil {
				return err
			}
			facts := policy.Facts{AgentID: agent, Kind: kind, Target: target, Args: argv}
			if a.json {
				writeJSONLine(a.Out(), mustJSON(b.Report(facts)))
				return nil
			}
			res, trace := b.Explain(facts)
			notTried := 0
			if b != nil {
				notTried = len(b.Rules) - len(trace)
			}
			a.printExplanation(file, b, agent, kind, target, argsRaw, res, trace, notTried)
			return nil
		},
	}
	f := c.Flags()
	f.StringVar(&kind, "kind", "", "the step's kind: tool_call, llm_call or local")
	f.StringVar(&target, "target", "", "the step's target (tool name, model, local step name)")
	f.StringVar(&argsText, "args", "", "the step's arguments as JSON, or @FILE (default null)")
	f.StringVar(&agent, "agent", "", "the execution's agent id (for agent_id / agent_ids conditions)")
	return c
}

func (a *App) printExplanation(file string, b *policy.Bundle, agent, kind, target string, argsRaw json.RawMessage,
	res policy.Result, trace []policy.Trace, notTried int) {
	st := a.styles
	row := func(k, v string) { a.printf("%s  %s\n", st.paint(st.key, fmt.Sprintf("%-10s", k)), v) }
	tgt := target
	if tgt == "" {
		tgt = `""`
	}
	row("step", kind+" "+st.paint(st.bold, tgt)+"  "+st.paint(st.dim, "args")+" "+Truncate(argsText(argsRaw), max(a.width-40, 20)))
	if agent == "" {
		row("agent", st.paint(st.dim, "(not given)"))
	} else {
		row("agent", agent)
	}
	dec := res.Decision
	switch dec {
	case policy.Allow:
		dec = st.paint(st.ok, dec)
	case policy.Deny:
		dec = st.paint(st.bad, dec)
	default:
		dec = st.paint(st.warn, dec)
	}
	row("decision", dec)
	var winner *policy.Trace
	for i := range trace {
		if trace[i].Matched {
			winner = &trace[i]
		}
	}
	switch {
	case b == nil:
		row("rule", res.RuleID+st.paint(st.dim, " ("+file+" is empty: no policy, every step is allowed)"))
	case winner != nil:
		row("rule", st.paint(st.bold, res.RuleID)+st.paint(st.dim, fmt.Sprintf(" (priority %d, line %d)", winner.Priority, winner.Line)))
	case res.RuleID == policy.RuleLocal:
		row("rule", res.RuleID+st.paint(st.dim, " (no rule matched; local steps are allowed unless a rule says otherwise)"))
	default:
		row("rule", res.RuleID+st.paint(st.dim, " (no rule matched; default_action "+b.DefaultAction+")"))
	}
	if res.Reason != "" {
		row("reason", res.Reason)
	}
	if res.Decision == policy.RequireApproval {
		row("approval", approvalConfigText(res.Approval))
	}
	if res.RateLimit != nil {
		row("rate limit", rateLimitText(res.RateLimit))
	}
	if b == nil || len(b.Rules) == 0 {
		return
	}
	a.printf("\n%s\n", st.paint(st.bold, "Rules tried, lowest priority first:"))
	idW, prW, lnW := 0, 0, 0
	for _, t := range trace {
		idW = max(idW, len(t.RuleID))
		prW = max(prW, len(strconv.Itoa(int(t.Priority))))
		lnW = max(lnW, len(strconv.Itoa(t.Line)))
	}
	for _, t := range trace {
		verdict := st.paint(st.dim, "no   ")
		why := t.Failed
		if t.Matched {
			verdict, why = st.paint(st.ok, "MATCH"), "every condition holds"
		} else if agent == "" && strings.HasPrefix(why, "agent_id") {
			why += " (give --agent)"
		}
		a.printf("  %s  %-*s  %s  %s  %s\n", verdict, idW, t.RuleID,
			st.paint(st.dim, fmt.Sprintf("priority %*d", prW, t.Priority)), st.paint(st.dim, fmt.Sprintf("line %*d", lnW, t.Line)), why)
	}
	if notTried > 0 {
		a.printf("  %s\n", st.paint(st.dim, fmt.Sprintf("(%d later rule%s not tried)", notTried, plural(notTried))))
	}
}

func (a *App) policySet() *cobra.Command {
	return &cobra.Command{
		Use:   "set <agent_id> <file>",
		Short: "Load a policy bundle for an agent (replaces its current one)",
		Long: "Validate a bundle locally (printing every problem), then load it for the agent\n" +
			"through the admin API. It applies to the agent's new steps within two seconds;\n" +
			"recorded steps keep their decisions. Review a change first with `policy test`.",
		Example: "  rebuno policy test policies/researcher.yaml --agent researcher\n" +
			"  rebuno policy set researcher policies/researcher.yaml",
		Args:              exactArgs("agent_id", "file"),
		ValidArgsFunction: a.completeAgents,
		RunE: func(cmd *cobra.Command, args []string) error {
			agent := args[0]
			b, text, file, err := a.loadBundle(args[1], a.Err())
			if err != nil {
				return err
			}
			if b == nil {
				return usagef(cmd, "%s is empty; to remove the policy of %s use `%s`", file, agent, a.cmdline("policy rm "+agent))
			}
			if err := a.postPolicy(cmd, agent, text); err != nil {
				return err
			}
			switch {
			case a.json:
				return a.printAgentJSON(cmd, agent)
			case a.tty:
				a.printf("%s Loaded policy for agent %s: %s\n", a.styles.paint(a.styles.ok, "✔"), a.styles.paint(a.styles.bold, agent), bundleSummary(b))
			default:
				a.printf("policy set for %s (%s)\n", agent, bundleSummary(b))
			}
			return nil
		},
	}
}

func (a *App) postPolicy(cmd *cobra.Command, agent, text string) error {
	cl, err := a.Client()
	if err != nil {
		return err
	}
	body := encodeOrdered(map[string]json.RawMessage{"bundle": mustJSON(text)}, "bundle")
	if _, err := cl.Do(ctxOf(cmd), http.MethodPost, "/v0/policies/"+url.PathEscape(agent), body); err != nil {
		var ae *APIError
		if asAPI(err, &ae) && ae.Status == 404 {
			ae.Hint = "no agent " + strconv.Quote(agent) + " is registered; `" + a.cmdline("agent ls") + "` lists them"
		}
		return err
	}
	return nil
}

func (a *App) printAgentJSON(cmd *cobra.Command, agent string) error {
	cl, err := a.Client()
	if err != nil {
		return err
	}
	raw, err := cl.GetJSON(ctxOf(cmd), "/v0/agents/"+url.PathEscape(agent), nil)
	if err != nil {
		return err
	}
	writeJSONLine(a.Out(), raw)
	return nil
}

func (a *App) policyGet() *cobra.Command {
	return &cobra.Command{
		Use:   "get <agent_id>",
		Short: "Print an agent's policy bundle (the stored YAML, verbatim)",
		Long: "Print the policy bundle stored for an agent exactly as it was loaded, so that\n" +
			"`rebuno policy get A > policy.yaml` round-trips. An agent without a policy prints\n" +
			"nothing (every step of it is allowed, rule permissive).",
		Args:              exactArgs("agent_id"),
		ValidArgsFunction: a.completeAgents,
		RunE: func(cmd *cobra.Command, args []string) error {
			cl, err := a.Client()
			if err != nil {
				return err
			}
			var ag Agent
			if _, err := cl.GetJSON(ctxOf(cmd), "/v0/agents/"+url.PathEscape(args[0]), &ag); err != nil {
				var ae *APIError
				if asAPI(err, &ae) && ae.Status == 404 {
					ae.Hint = "`" + a.cmdline("agent ls") + "` lists the registered agents"
				}
				return err
			}
			if a.json {
				out := struct {
					AgentID      string `json:"agent_id"`
					PolicyBundle string `json:"policy_bundle"`
				}{ag.ID, ag.PolicyBundle}
				writeJSONLine(a.Out(), mustJSON(out))
				return nil
			}
			if ag.PolicyBundle == "" {
				a.errf("agent %s has no policy: every step is allowed (rule permissive)\n", ag.ID)
				return nil
			}
			io.WriteString(a.Out(), ag.PolicyBundle)
			if a.tty && !strings.HasSuffix(ag.PolicyBundle, "\n") {
				a.printf("\n")
			}
			return nil
		},
	}
}

func (a *App) policyRm() *cobra.Command {
	return &cobra.Command{
		Use:               "rm <agent_id>",
		Aliases:           []string{"delete"},
		Short:             "Remove an agent's policy bundle (its steps are then all allowed)",
		Args:              exactArgs("agent_id"),
		ValidArgsFunction: a.completeAgents,
		RunE: func(cmd *cobra.Command, args []string) error {
			agent := args[0]
			if err := a.postPolicy(cmd, agent, ""); err != nil {
				return err
			}
			switch {
			case a.json:
				return a.printAgentJSON(cmd, agent)
			case a.tty:
				a.printf("%s Removed the policy of agent %s %s\n", a.styles.paint(a.styles.ok, "✔"), a.styles.paint(a.styles.bold, agent),
					a.styles.paint(a.styles.dim, "(every step is now allowed)"))
			default:
				a.printf("policy removed for %s\n", agent)
			}
			return nil
		},
	}
}
