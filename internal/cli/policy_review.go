package cli

import (
	"context"
	"encoding/json"
	"fmt"
	"net/url"
	"sort"
	"strconv"
	"strings"

	"github.com/spf13/cobra"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/wire"
)

// `rebuno policy test`: replay a candidate bundle over the steps an agent's
// recent executions recorded, and report every decision it would change.
// Everything is read through the public API: the execution list, each
// execution's steps (kind, target, args) and its event log, whose
// step.allowed / step.denied / step.awaiting_approval events carry the
// decision recorded when the step was new and the rule that made it.

// DefaultPolicyTestLast is how many recent executions `policy test` reads
// by default.
const DefaultPolicyTestLast = 20

// maxPolicyTestLast bounds --last.
const maxPolicyTestLast = 10000

// recordedDecision is the policy decision a step got when it was new.
type recordedDecision struct {
	Decision string `json:"decision"`
	RuleID   string `json:"rule_id"`
	Reason   string `json:"reason,omitempty"`
}

// PolicyTestChange is one step whose decision the candidate would change.
type PolicyTestChange struct {
	ExecutionID string           `json:"execution_id"`
	Index       int              `json:"index"` // 1-based position among the execution's decided steps
	StepID      string           `json:"step_id"`
	Kind        string           `json:"kind"`
	Target      string           `json:"target"`
	Args        json.RawMessage  `json:"args"`
	Old         recordedDecision `json:"old"`
	New         recordedDecision `json:"new"`
}

// PolicyTestTransition counts the changes from one decision to another.
type PolicyTestTransition struct {
	From  string `json:"from"`
	To    string `json:"to"`
	Count int    `json:"count"`
}

// PolicyTestReport is the outcome of `policy test` (its --json output).
type PolicyTestReport struct {
	File        string                 `json:"file"`
	AgentID     string                 `json:"agent_id"`
	Executions  int                    `json:"executions"`
	Steps       int                    `json:"steps"`
	Changed     int                    `json:"changed"`
	Unchanged   int                    `json:"unchanged"`
	RuleChanged int                    `json:"rule_changed"` // unchanged decision, decided by another rule
	Skipped     int                    `json:"skipped"`      // steps not decided by policy
	Transitions []PolicyTestTransition `json:"transitions"`
	Changes     []PolicyTestChange     `json:"changes"`
}

func (a *App) policyTest() *cobra.Command {
	var agent string
	var last int
	c := &cobra.Command{
		Use:   "test <file> --agent A",
		Short: "Replay a candidate bundle over an agent's recorded steps; show what would change",
		Long: "Evaluate a candidate policy bundle against every step recorded in the agent's last N\n" +
			"executions (read through the API) and print each step whose decision would change\n" +
			"(old → new, with the rules), then a summary. Nothing is loaded or changed: use it to\n" +
			"review a policy change before `policy set`.\n\n" +
			"Each step is compared with the decision recorded when it was new (a step that was\n" +
			"held for approval counts as require_approval, whatever the human decided). Rate\n" +
			"limits are not simulated, and steps that were rate-limited were never recorded.",
		Example: "  rebuno policy test policies/researcher.yaml --agent researcher\n" +
			"  rebuno policy test policies/researcher.yaml --agent researcher --last 200 --json | jq '.changes[]'",
		Args: exactArgs("file"),
		RunE: func(cmd *cobra.Command, args []string) error {
			if agent == "" {
				return usagef(cmd, "missing --agent: the agent whose recorded steps the bundle is tested against")
			}
			if last < 1 || last > maxPolicyTestLast {
				return usagef(cmd, "invalid --last %d: 1 to %d executions", last, maxPolicyTestLast)
			}
			b, _, file, err := a.loadBundle(args[0], a.Err())
			if err != nil {
				return err
			}
			rep, err := a.runPolicyTest(ctxOf(cmd), b, agent, last)
			if err != nil {
				return err
			}
			rep.File = file
			if a.json {
				writeJSONLine(a.Out(), mustJSON(rep))
				return nil
			}
			a.printPolicyTest(rep)
			return nil
		},
	}
	c.Flags().StringVar(&agent, "agent", "", "the agent whose recorded steps to test against (required)")
	c.Flags().IntVar(&last, "last", DefaultPolicyTestLast, "how many of the agent's most recent executions to read")
	return c
}

func (a *App) runPolicyTest(ctx context.Context, b *policy.Bundle, agent string, last int) (*PolicyTestReport, error) {
	cl, err := a.Client()
	if err != nil {
		return nil, err
	}
	rep := &PolicyTestReport{AgentID: agent, Transitions: []PolicyTestTransition{}, Changes: []PolicyTestChange{}}
	var execs []Execution
	cursor := ""
	for len(execs) < last {
		q := url.Values{}
		q.Set("agent_id", agent)
		q.Set("limit", strconv.Itoa(min(last-len(execs), 200)))
		if cursor != "" {
			q.Set("cursor", cursor)
		}
		var page Page
		if _, err := cl.GetJSON(ctx, "/v0/executions?"+q.Encode(), &page); err != nil {
			return nil, err
		}
		for _, raw := range page.Executions {
			var e Execution
			if json.Unmarshal(raw, &e) == nil {
				execs = append(execs, e)
			}
		}
		cursor = page.NextCursor
		if cursor == "" || len(page.Executions) == 0 {
			break
		}
	}
	if len(execs) > last {
		execs = execs[:last]
	}
	rep.Executions = len(execs)
	counts := map[[2]string]int{}
	for _, e := range execs {
		changes, err := a.testExecution(ctx, cl, b, &e, rep)
		if err != nil {
			return nil, err
		}
		for _, ch := range changes {
			counts[[2]string{ch.Old.Decision, ch.New.Decision}]++
		}
		rep.Changes = append(rep.Changes, changes...)
	}
	for k, n := range counts {
		rep.Transitions = append(rep.Transitions, PolicyTestTransition{From: k[0], To: k[1], Count: n})
	}
	sort.Slice(rep.Transitions, func(i, j int) bool {
		x, y := rep.Transitions[i], rep.Transitions[j]
		if x.Count != y.Count {
			return x.Count > y.Count
		}
		if x.From != y.From {
			return x.From < y.From
		}
		return x.To < y.To
	})
	return rep, nil
}

// testExecution evaluates the candidate for each step of one execution.
func (a *App) testExecution(ctx context.Context, cl *Client, b *policy.Bundle, e *Execution, rep *PolicyTestReport) ([]PolicyTestChange, error) {
	var steps []Step
	if _, err := cl.GetJSON(ctx, "/v0/executions/"+e.ID+"/steps", &steps); err != nil {
		return nil, err
	}
	byID := make(map[string]*Step, len(steps))
	for i := range steps {
		byID[steps[i].StepID] = &steps[i]
	}
	// The first decision event of each step is the one policy made.
	decided := map[string]recordedDecision{}
	var order []string
	after := int64(0)
	for {
		var page []Event
		if _, err := cl.GetJSON(ctx, fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", e.ID, after), &page); err != nil {
			return nil, err
		}
		for _, ev := range page {
			after = ev.Seq
			var d string
			switch ev.Type {
			case wire.EventStepAllowed:
				d = policy.Allow
			case wire.EventStepDenied:
				d = policy.Deny
			case wire.EventStepAwaitingApproval:
				d = policy.RequireApproval
			default:
				continue
			}
			var p payload
			json.Unmarshal(ev.Payload, &p)
			id := p.str("step_id")
			if _, seen := decided[id]; seen || id == "" {
				continue
			}
			rd := recordedDecision{Decision: d, RuleID: p.str("rule_id")}
			if d == policy.Deny {
				rd.Reason = errorReason(p["error"])
			}
			decided[id] = rd
			order = append(order, id)
		}
		if len(page) < 1000 {
			break
		}
	}
	var changes []PolicyTestChange
	for i, id := range order {
		old := decided[id]
		s := byID[id]
		if s == nil || old.RuleID == wire.RuleIndeterminateRetry {
			// Not a policy decision (a refused retry of an indeterminate
			// step), or a step the log names but the store no longer has.
			rep.Skipped++
			continue
		}
		rep.Steps++
		var args *jsonx.Value
		if len(s.Args) > 0 {
			v, err := jsonx.Parse(s.Args, wire.MaxNesting)
			if err != nil {
				rep.Skipped++
				rep.Steps--
				continue
			}
			if v.Kind != jsonx.KindNull {
				args = v
			}
		}
		res := b.Evaluate(policy.Facts{AgentID: e.AgentID, Kind: s.Kind, Target: s.Target, Args: args})
		switch {
		case res.Decision != old.Decision:
			rep.Changed++
			changes = append(changes, PolicyTestChange{ExecutionID: e.ID, Index: i + 1, StepID: id, Kind: s.Kind, Target: s.Target,
				Args: s.Args, Old: old, New: recordedDecision{Decision: res.Decision, RuleID: res.RuleID, Reason: res.Reason}})
		case res.RuleID != old.RuleID:
			rep.Unchanged++
			rep.RuleChanged++
		default:
			rep.Unchanged++
		}
	}
	return changes, nil
}

func (a *App) printPolicyTest(rep *PolicyTestReport) {
	st := a.styles
	paintDecision := func(d string) string {
		switch d {
		case policy.Allow:
			return st.paint(st.ok, d)
		case policy.Deny:
			return st.paint(st.bad, d)
		}
		return st.paint(st.warn, d)
	}
	of := fmt.Sprintf("%d step%s in %d execution%s of agent %s", rep.Steps, plural(rep.Steps), rep.Executions, plural(rep.Executions), rep.AgentID)
	if rep.Executions == 0 {
		a.printf("No executions of agent %s to test against.\n", rep.AgentID)
		return
	}
	if rep.Changed == 0 {
		a.printf("No decision would change: %s.\n", of)
	} else {
		a.printf("%s %d of %s would change:\n\n", st.paint(st.bold, rep.File+":"), rep.Changed, of)
		for _, ch := range rep.Changes {
			tgt := ch.Target
			if tgt == "" {
				tgt = `""`
			}
			a.printf("  %s %s  %s %s  %s %s  %s\n", st.paint(st.dim, "execution"), st.paint(st.id, ShortID(ch.ExecutionID)),
				st.paint(st.dim, "step"), strconv.Itoa(ch.Index), ch.Kind, st.paint(st.bold, tgt),
				st.paint(st.dim, Truncate(argsText(ch.Args), max(a.width-60, 20))))
			rules := ch.Old.RuleID + " → " + ch.New.RuleID
			if ch.Old.RuleID == ch.New.RuleID {
				rules = ch.New.RuleID
			}
			a.printf("    %s → %s  %s %s\n", paintDecision(ch.Old.Decision), paintDecision(ch.New.Decision), st.paint(st.dim, "rule"), rules)
		}
		a.printf("\n")
	}
	var parts []string
	parts = append(parts, fmt.Sprintf("%d would change", rep.Changed))
	un := fmt.Sprintf("%d unchanged", rep.Unchanged)
	if rep.RuleChanged > 0 {
		un += fmt.Sprintf(" (%d decided by another rule)", rep.RuleChanged)
	}
	parts = append(parts, un)
	if rep.Skipped > 0 {
		parts = append(parts, fmt.Sprintf("%d skipped (not decided by policy)", rep.Skipped))
	}
	a.printf("%s %s: %s.\n", st.paint(st.bold, "Summary:"), of, strings.Join(parts, ", "))
	w := 0
	for _, t := range rep.Transitions {
		w = max(w, len([]rune(t.From+" → "+t.To)))
	}
	for _, t := range rep.Transitions {
		a.printf("  %-*s  %d\n", w, t.From+" → "+t.To, t.Count)
	}
}
