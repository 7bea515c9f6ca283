package cli

import (
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"

	"github.com/charmbracelet/x/ansi"
	"github.com/spf13/cobra"
)

// `rebuno exec coverage` (docs/protocol/configuration.md §6.2 route 34, docs/protocol/resources.md §5.3, §5): for every event of an execution, whether a fork there would be
// covered — every resource restored exactly as it was — and which checkpoint
// it would restore.

func init() {
	RegisterExecVerb(func(a *App) *cobra.Command { return a.execCoverage() })
}

// CoverageRanges is the ranges answer of docs/protocol/resources.md §5.3.
type CoverageRanges struct {
	ExecutionID  string     `json:"execution_id"`
	LastEventSeq int64      `json:"last_event_seq"`
	Ranges       [][2]int64 `json:"covered_ranges"`
	Resources    []struct {
		Key           string     `json:"key"`
		RegisteredSeq int64      `json:"registered_seq"`
		Ranges        [][2]int64 `json:"covered_ranges"`
	} `json:"resources"`
}

// CoveragePoint is the point answer of docs/protocol/resources.md §5.3.
type CoveragePoint struct {
	ExecutionID string          `json:"execution_id"`
	AtSeq       int64           `json:"at_seq"`
	Covered     bool            `json:"covered"`
	Resources   []PointResource `json:"resources"`
}

// PointResource is one resource of a point answer. CheckpointSeq is 0 when
// there is no checkpoint at or before the point.
type PointResource struct {
	Key           string `json:"key"`
	Covered       bool   `json:"covered"`
	Reason        string `json:"reason"`
	CheckpointRef string `json:"checkpoint_ref,omitempty"`
	CheckpointSeq int64  `json:"checkpoint_seq,omitempty"`
}

// inRanges reports whether seq lies in one of the inclusive ranges.
func inRanges(ranges [][2]int64, seq int64) bool {
	for _, r := range ranges {
		if seq >= r[0] && seq <= r[1] {
			return true
		}
	}
	return false
}

// rangesText prints ranges as "1-4, 7-9, 15" ("none" when empty).
func rangesText(ranges [][2]int64) string {
	if len(ranges) == 0 {
		return "none"
	}
	parts := make([]string, len(ranges))
	for i, r := range ranges {
		if r[0] == r[1] {
			parts[i] = strconv.FormatInt(r[0], 10)
		} else {
			parts[i] = fmt.Sprintf("%d-%d", r[0], r[1])
		}
	}
	return strings.Join(parts, ", ")
}

// checkpointRow is what a resource.checkpointed event says of a checkpoint.
type checkpointRow struct {
	ref        string
	coveredSeq int64
}

// PointsFromLog computes the point answer for each event 1..last of an
// execution from its ranges answer and its log: coverage comes from the
// ranges, the checkpoint a fork would restore from the resource.checkpointed
// events (on a fork the copied checkpoints are written after the copied
// events, so each one's covered_seq, not its own seq, says where it starts).
// The result is what GET …/coverage?at_seq=N answers for every N, read with
// two requests instead of one per event.
func PointsFromLog(rg *CoverageRanges, events []Event) []CoveragePoint {
	cps := map[string][]checkpointRow{}
	for _, ev := range events {
		if ev.Type != "resource.checkpointed" {
			continue
		}
		var p payload
		json.Unmarshal(ev.Payload, &p)
		k := p.str("key")
		cps[k] = append(cps[k], checkpointRow{ref: p.str("checkpoint_ref"), coveredSeq: p.int("covered_seq")})
	}
	for k := range cps {
		rows := cps[k]
		// Stable: of two rows starting at the same seq the later written
		// one is the newer.
		sort.SliceStable(rows, func(i, j int) bool { return rows[i].coveredSeq < rows[j].coveredSeq })
	}
	out := make([]CoveragePoint, 0, rg.LastEventSeq)
	for s := int64(1); s <= rg.LastEventSeq; s++ {
		pt := CoveragePoint{ExecutionID: rg.ExecutionID, AtSeq: s, Covered: true, Resources: []PointResource{}}
		for _, r := range rg.Resources {
			if r.RegisteredSeq > s {
				continue
			}
			pr := PointResource{Key: r.Key, Covered: inRanges(r.Ranges, s)}
			var c *checkpointRow
			for i := range cps[r.Key] {
				if cps[r.Key][i].coveredSeq > s {
					break
				}
				c = &cps[r.Key][i]
			}
			if c != nil {
				pr.CheckpointRef, pr.CheckpointSeq = c.ref, c.coveredSeq
			}
			switch {
			case pr.Covered:
				pr.Reason = "covered"
			case c == nil:
				pr.Reason = "no_checkpoint"
			default:
				pr.Reason = "step_started"
			}
			pt.Covered = pt.Covered && pr.Covered
			pt.Resources = append(pt.Resources, pr)
		}
		out = append(out, pt)
	}
	return out
}

var reasonWords = map[string]string{
	"covered":       "covered",
	"no_checkpoint": "no checkpoint",
	"step_started":  "step started",
}

func reasonWord(r string) string {
	if w, ok := reasonWords[r]; ok {
		return w
	}
	return r
}

// forkCell says whether a fork at a point is covered, and if not why.
func (s styles) forkCell(pt CoveragePoint) string {
	if pt.Covered {
		return s.paint(s.ok, "✔ covered")
	}
	var parts []string
	for _, r := range pt.Resources {
		if r.Covered {
			continue
		}
		if len(pt.Resources) > 1 {
			parts = append(parts, r.Key+": "+reasonWord(r.Reason))
		} else {
			parts = append(parts, reasonWord(r.Reason))
		}
	}
	return s.paint(s.warn, "✘ "+strings.Join(parts, "; "))
}

// restoreCell names what a fork at a point restores, per resource.
func restoreCell(pt CoveragePoint) string {
	if len(pt.Resources) == 0 {
		return "-"
	}
	parts := make([]string, len(pt.Resources))
	for i, r := range pt.Resources {
		parts[i] = restoreCompact(r.Key, r.CheckpointRef, r.CheckpointSeq)
	}
	return strings.Join(parts, " ")
}

// eventBrief is an event's type and the little that identifies it.
func (s styles) eventBrief(ev Event) string {
	var p payload
	json.Unmarshal(ev.Payload, &p)
	detail := ""
	switch {
	case strings.HasPrefix(ev.Type, "step."):
		detail = p.str("step_type") + " " + p.str("target")
	case ev.Type == "resource.checkpointed":
		detail = p.str("key") + " " + shortRef(p.str("checkpoint_ref"))
	case ev.Type == "resource.checkpoint_failed":
		if msg := p.str("error"); RefusalText(msg) != "" {
			detail = p.str("key") + " refused " + msg
		} else {
			detail = p.str("key") + " failed " + strconv.Quote(Truncate(msg, 40))
		}
	case strings.HasPrefix(ev.Type, "resource."):
		detail = p.str("key")
	case ev.Type == "execution.forked":
		detail = fmt.Sprintf("from %s at %d", ShortID(p.str("source_execution_id")), p.int("fork_seq"))
	case ev.Type == "execution.failed", ev.Type == "execution.cancelled":
		detail = p.str("reason")
	}
	if detail = strings.TrimSpace(detail); detail == "" {
		return ev.Type
	}
	return ev.Type + "  " + s.paint(s.dim, detail)
}

func (a *App) execCoverage() *cobra.Command {
	var at int64
	c := &cobra.Command{
		Use:   "coverage <id>",
		Short: "Show where a fork would be covered, and what it would restore",
		Long: "Show an execution's coverage: the events at which a fork would be covered (every\n" +
			"resource restored exactly as it was there), overall and per resource, then every event\n" +
			"with whether a fork there is covered — or why not: a step started after the last\n" +
			"checkpoint, or there is no checkpoint yet — and the checkpoint it would restore\n" +
			"(KEY=REF@SEQ: checkpoint REF, covering from event SEQ; KEY=(initial): the\n" +
			"initial environment). --at N prints the kernel's answer for one event.\n\n" +
			"--json prints the kernel's ranges answer (with --at, its point answer).",
		Example: "  rebuno exec coverage 9c2e41f7\n" +
			"  rebuno exec coverage 9c2e41f7 --at 23\n" +
			"  rebuno exec coverage 9c2e41f7 --json | jq -c .covered_ranges",
		Args:              exactArgs("id"),
		ValidArgsFunction: a.completeExecutions,
		RunE: func(cmd *cobra.Command, args []string) error {
			if cmd.Flags().Changed("at") && at < 1 {
				return usagef(cmd, "invalid --at %d: an event sequence number, 1 or more", at)
			}
			e, _, err := a.getExecution(cmd, args[0])
			if err != nil {
				return err
			}
			if at > 0 {
				return a.coveragePoint(cmd, e, at)
			}
			return a.coverageTable(cmd, e)
		},
	}
	c.Flags().Int64Var(&at, "at", 0, "print the kernel's point answer for this event only")
	return c
}

func (a *App) coveragePoint(cmd *cobra.Command, e *Execution, at int64) error {
	cl, err := a.Client()
	if err != nil {
		return err
	}
	var pt CoveragePoint
	raw, err := cl.GetJSON(ctxOf(cmd), fmt.Sprintf("/v0/executions/%s/coverage?at_seq=%d", e.ID, at), &pt)
	if err != nil {
		var ae *APIError
		if asAPI(err, &ae) && ae.Code == "validation_error" {
			ae.Hint = "--at must name one of the execution's events; `" + a.cmdline("exec events "+ShortID(e.ID)) + "` lists them"
		}
		return err
	}
	if a.json {
		writeJSONLine(a.Out(), raw)
		return nil
	}
	st := a.styles
	verdict := st.paint(st.ok, "covered")
	if !pt.Covered {
		verdict = st.paint(st.warn, "not covered")
	}
	a.printf("event %d of %s: a fork there is %s\n", pt.AtSeq, st.paint(st.id, e.ID), verdict)
	if len(pt.Resources) == 0 {
		a.printf("  %s\n", "no resource is registered at this event: a fork has nothing to restore")
	}
	for _, r := range pt.Resources {
		var text string
		switch r.Reason {
		case "covered":
			text = st.paint(st.ok, "covered") + fmt.Sprintf(" by checkpoint %s (event %d): a fork starts from exactly this state",
				strconv.Quote(r.CheckpointRef), r.CheckpointSeq)
		case "no_checkpoint":
			text = st.paint(st.warn, "uncovered") + ": no checkpoint yet; a fork starts from the initial environment"
		case "step_started":
			text = st.paint(st.warn, "uncovered") + fmt.Sprintf(": a step started after checkpoint %s (event %d); a fork restores it "+
				"and replays the later steps without their changes", strconv.Quote(r.CheckpointRef), r.CheckpointSeq)
		default:
			text = r.Reason
		}
		a.printf("  %s %s\n", st.paint(st.key, fmt.Sprintf("%-14s", r.Key)), text)
	}
	if a.tty {
		a.printf("  %s\n", st.paint(st.dim, "fork it: "+a.cmdline(fmt.Sprintf("exec fork %s --at %d", ShortID(e.ID), at))))
	}
	return nil
}

// coverageTable prints the ranges, then every event with the point answer
// computed from the ranges and the log (two requests plus one per 1,000
// events). The log is read after the ranges and only up to their
// last_event_seq: the answers for those events never change.
func (a *App) coverageTable(cmd *cobra.Command, e *Execution) error {
	cl, err := a.Client()
	if err != nil {
		return err
	}
	ctx := ctxOf(cmd)
	var rg CoverageRanges
	raw, err := cl.GetJSON(ctx, "/v0/executions/"+e.ID+"/coverage", &rg)
	if err != nil {
		return err
	}
	if a.json {
		writeJSONLine(a.Out(), raw)
		return nil
	}
	var events []Event
	for after := int64(0); after < rg.LastEventSeq; {
		var page []Event
		if _, err := cl.GetJSON(ctx, fmt.Sprintf("/v0/executions/%s/events?after_seq=%d&limit=1000", e.ID, after), &page); err != nil {
			return err
		}
		if len(page) == 0 {
			break
		}
		for _, ev := range page {
			if ev.Seq <= rg.LastEventSeq {
				events = append(events, ev)
			}
			after = ev.Seq
		}
	}
	points := PointsFromLog(&rg, events)

	st := a.styles
	a.printf("coverage of %s %s %s  %s\n", st.paint(st.id, e.ID), st.paint(st.dim, "agent"), st.paint(st.bold, e.AgentID),
		st.paint(st.dim, fmt.Sprintf("(%d events)", rg.LastEventSeq)))
	kv := func(k, v string) { a.printf("  %s %s\n", st.paint(st.key, fmt.Sprintf("%-14s", k)), v) }
	kv("covered", rangesText(rg.Ranges))
	for _, r := range rg.Resources {
		kv(r.Key, rangesText(r.Ranges)+st.paint(st.dim, fmt.Sprintf("  (registered at %d)", r.RegisteredSeq)))
	}
	if len(rg.Resources) == 0 {
		kv("resources", "none: a fork at any event is covered, with nothing to restore")
	}
	a.printf("\n")

	type row struct{ seq, fork, restore, event string }
	rows := []row{{"SEQ", "FORK THERE", "RESTORES", "EVENT"}}
	byseq := map[int64]Event{}
	for _, ev := range events {
		byseq[ev.Seq] = ev
	}
	for _, pt := range points {
		ev, ok := byseq[pt.AtSeq]
		brief := st.paint(st.dim, "(not read)")
		if ok {
			brief = st.eventBrief(ev)
		}
		rows = append(rows, row{strconv.FormatInt(pt.AtSeq, 10), st.forkCell(pt), restoreCell(pt), brief})
	}
	w1, w2, w3 := 0, 0, 0
	for _, r := range rows {
		w1 = max(w1, ansi.StringWidth(r.seq))
		w2 = max(w2, ansi.StringWidth(r.fork))
		w3 = max(w3, ansi.StringWidth(r.restore))
	}
	pad := func(s string, w int) string { return s + strings.Repeat(" ", w-ansi.StringWidth(s)) }
	for i, r := range rows {
		seq := strings.Repeat(" ", w1-ansi.StringWidth(r.seq)) + r.seq
		line := seq + "  " + pad(r.fork, w2) + "  " + pad(r.restore, w3) + "  " + r.event
		if i == 0 {
			line = st.paint(st.bold, seq+"  "+pad(r.fork, w2)+"  "+pad(r.restore, w3)+"  "+r.event)
		}
		a.printf("%s\n", strings.TrimRight(Truncate(line, a.width), " "))
	}
	if a.tty {
		a.printf("%s\n", st.paint(st.dim, "fork at an event: "+a.cmdline("exec fork "+ShortID(e.ID)+" --at <seq>")))
	}
	return nil
}
