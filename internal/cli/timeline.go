package cli

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"
)

// StepSource gives the timeline a step's args and outcome. fresh asks for
// the stored step as it is now (the step has just reached a terminal
// status); otherwise a cached copy will do. It returns nil when the step
// cannot be read: the timeline then shows what the events carry.
type StepSource func(stepID string, fresh bool) *Step

// Timeline renders an execution's events for a person, one line per event:
// sequence number, time since the execution was created, a symbol per kind,
// the event type and what matters about it — a step's kind and target, its
// args, the decision and rule, how long it ran and its result; dispatch
// attempts, lease expiries and redeliveries; the final output or failure
// reason. `exec watch`, `exec events`, the REPL and the demo share it.
type Timeline struct {
	w      io.Writer
	st     styles
	width  int
	origin time.Time
	steps  StepSource

	executing map[string]time.Time // step id → time of its latest start
	lastSeq   int64
	queued    int
	appr      *approvalTrack // approvals requested so far (approvals_timeline.go)
}

// TimelineOptions configure a Timeline.
type TimelineOptions struct {
	// Origin is the execution's created_at: offsets are measured from it.
	Origin time.Time
	// Steps reads steps (nil: show only what events carry).
	Steps StepSource
	// Width bounds each line (0: 120).
	Width int
	// Color turns colour on.
	Color bool
}

// NewTimeline returns a renderer writing to w.
func NewTimeline(w io.Writer, opt TimelineOptions) *Timeline {
	if opt.Width <= 0 {
		opt.Width = 120
	}
	return &Timeline{w: w, st: newStyles(w, opt.Color), width: opt.Width, origin: opt.Origin,
		steps: opt.Steps, executing: map[string]time.Time{}}
}

func (a *App) newTimeline(origin time.Time, steps StepSource) *Timeline {
	t := NewTimeline(a.opt.Out, TimelineOptions{Origin: origin, Steps: steps, Width: a.width})
	t.st = a.styles
	t.appr = a.timelineApprovals()
	return t
}

// LastSeq is the sequence number of the last event rendered.
func (t *Timeline) LastSeq() int64 { return t.lastSeq }

// Header prints the line that introduces an execution's timeline.
func (t *Timeline) Header(e *Execution, verb string) {
	st := t.st
	fmt.Fprintf(t.w, "%s %s %s %s\n", verb, st.paint(st.id, e.ID), st.paint(st.dim, "agent"), st.paint(st.bold, e.AgentID))
}

// payload gives typed access to an event payload.
type payload map[string]json.RawMessage

func (p payload) str(k string) string {
	var s string
	if json.Unmarshal(p[k], &s) != nil {
		return ""
	}
	return s
}

func (p payload) int(k string) int64 {
	var n int64
	if json.Unmarshal(p[k], &n) != nil {
		return 0
	}
	return n
}

func (p payload) bool(k string) bool {
	var b bool
	json.Unmarshal(p[k], &b)
	return b
}

// reason reads the "reason" of an error object value.
func errorReason(raw json.RawMessage) string {
	var m map[string]json.RawMessage
	if json.Unmarshal(raw, &m) != nil {
		return ""
	}
	return payload(m).str("reason")
}

// Event renders one event. Events at or below the last rendered sequence
// number are ignored, so a caller that resumes a stream cannot print one
// twice.
func (t *Timeline) Event(ev Event) {
	if ev.Seq <= t.lastSeq {
		return
	}
	t.lastSeq = ev.Seq
	var p payload
	json.Unmarshal(ev.Payload, &p)
	st := t.st
	sym, paint, detail := t.describe(ev, p)

	offset := ""
	if !t.origin.IsZero() && !ev.OccurredAt.IsZero() {
		// A fork's copied events keep their source's times: before the origin.
		sign, d := "+", ev.OccurredAt.Sub(t.origin)
		if d < 0 {
			sign = "-"
		}
		offset = sign + FormatDuration(d)
	}
	prefix := fmt.Sprintf("%4d  %8s  ", ev.Seq, offset)
	typ := ev.Type
	if detail != "" {
		typ = fmt.Sprintf("%-23s", ev.Type) + " "
	}
	line := st.paint(st.dim, prefix) + paint(sym) + " " + paint(typ) + detail
	fmt.Fprintln(t.w, strings.TrimRight(Truncate(line, t.width), " "))
}

func (t *Timeline) stepLabel(p payload) string {
	kind, target := p.str("step_type"), p.str("target")
	if target == "" {
		target = `""`
	}
	return t.st.paint(t.st.dim, kind) + " " + t.st.paint(t.st.bold, target)
}

// describe returns the symbol, the colour of the symbol and type, and the
// detail of an event.
func (t *Timeline) describe(ev Event, p payload) (string, func(string) string, string) {
	st := t.st
	plain := func(s string) string { return s }
	dim := func(s string) string { return st.paint(st.dim, s) }
	ok := func(s string) string { return st.paint(st.ok, s) }
	bad := func(s string) string { return st.paint(st.bad, s) }
	warn := func(s string) string { return st.paint(st.warn, s) }
	info := func(s string) string { return st.paint(st.info, s) }
	mark := func(s string) string { return st.paint(st.mark, s) }
	var d []string
	add := func(s ...string) {
		for _, x := range s {
			if x != "" {
				d = append(d, x)
			}
		}
	}
	join := func() string { return strings.Join(d, "  ") }
	stepID := p.str("step_id")

	switch ev.Type {
	case "execution.created":
		add(dim("agent")+" "+st.paint(st.bold, p.str("agent_id")), labeled(st, "version", p.str("agent_version")),
			labeled(st, "deadline", p.str("deadline_at")))
		return "●", info, join()
	case "execution.forked":
		add(t.describeForked(p)) // resources_timeline.go
		return "⑂", mark, join()
	case "execution.started":
		return "▶", info, ""
	case "execution.blocked":
		return t.describeApproval(ev, p)
	case "execution.resumed":
		return "▶", info, ""
	case "execution.completed":
		add(dim("output") + " " + CompactJSON(p["output"]))
		return "✔", ok, join()
	case "execution.failed":
		r := p.str("reason")
		if r == "" {
			r = "(no reason given)"
		}
		return "✘", bad, bad(r)
	case "execution.cancelled":
		return "✘", bad, bad(p.str("reason"))

	case "step.proposed":
		add(t.stepLabel(p))
		if s := t.step(stepID, false); s != nil {
			add(dim(argsText(s.Args)))
		}
		return "·", dim, join()
	case "step.allowed":
		add(t.stepLabel(p))
		if id := p.str("approval_id"); id != "" {
			add(ok("approved"), labeled(st, "approval", ShortID(id)))
		} else {
			add(labeled(st, "rule", p.str("rule_id")))
		}
		return "·", dim, join()
	case "step.executing":
		t.executing[stepID] = ev.OccurredAt
		add(t.stepLabel(p))
		add(t.stepResources(p)...)
		if p.bool("retry") {
			add(warn("re-run: its earlier run never reported an outcome"))
			return "↻", warn, join()
		}
		return "▸", info, join()
	case "step.succeeded", "step.failed":
		add(t.stepLabel(p))
		s := t.step(stepID, true)
		if dur, ok := t.stepDuration(stepID, ev.OccurredAt, s); ok {
			add(FormatDuration(dur))
		}
		if ev.Type == "step.succeeded" {
			if s != nil && s.Result != nil {
				add("→ " + CompactJSON(s.Result))
			}
			return "✔", ok, join()
		}
		if errorReason(p["error"]) == "indeterminate" {
			add(bad("→ indeterminate: re-submitted after a crash, its outcome is unknown (at_most_once)"))
		} else {
			add(bad("→ error " + CompactJSON(p["error"])))
		}
		return "✘", bad, join()
	case "step.denied":
		add(t.stepLabel(p))
		if r := errorReason(p["error"]); r != "" {
			add(bad(r))
		} else {
			add(bad(CompactJSON(p["error"])))
		}
		add(labeled(st, "rule", p.str("rule_id")))
		return "⊘", bad, join()
	case "step.cancelled":
		add(t.stepLabel(p), bad(errorReason(p["error"])))
		return "⊘", bad, join()
	case "step.awaiting_approval":
		add(t.stepLabel(p), labeled(st, "rule", p.str("rule_id")))
		return "⏸", warn, join()
	case "step.rate_limited":
		add(t.stepLabel(p), labeled(st, "rule", p.str("rule_id")), warn(p.str("reason")))
		if ms := p.int("retry_after_ms"); ms > 0 {
			add(dim("retry in") + " " + FormatDuration(time.Duration(ms)*time.Millisecond))
		}
		return "⧗", warn, join()

	case "approval.requested", "approval.granted", "approval.denied", "approval.expired":
		return t.describeApproval(ev, p)

	case "dispatch.queued":
		t.queued++
		add(labeled(st, "dispatch", ShortID(p.str("dispatch_id"))))
		if t.queued > 1 {
			add(dim("(new dispatch)"))
		}
		return "→", dim, join()
	case "dispatch.acked":
		n := p.int("attempt")
		add(fmt.Sprintf("attempt %d delivered", n))
		if n > 1 {
			add(warn("(redelivery)"))
		}
		return "→", dim, join()
	case "dispatch.failed":
		add(warn(fmt.Sprintf("attempt %d failed", p.int("attempt"))))
		if hs := p.int("http_status"); hs != 0 {
			add(fmt.Sprintf("HTTP %d", hs))
		}
		add(p.str("error"))
		return "⚠", warn, join()
	case "dispatch.lease_expired":
		add(warn(fmt.Sprintf("attempt %d: lease expired", p.int("attempt"))))
		if p.str("status") == "exhausted" {
			add(bad("attempts exhausted"))
		} else {
			add("reclaimed → redelivering")
		}
		return "⚠", warn, join()
	case "dispatch.discarded":
		return "⚠", warn, p.str("status")
	}
	if strings.HasPrefix(ev.Type, "resource.") {
		return t.describeResource(ev, p) // resources_timeline.go
	}
	return "·", plain, dim(CompactJSON(ev.Payload))
}

func labeled(st styles, label, value string) string {
	if value == "" {
		return ""
	}
	return st.paint(st.dim, label) + " " + value
}

func quoted(s string) string {
	if s == "" {
		return ""
	}
	return fmt.Sprintf("%q", s)
}

func argsText(raw json.RawMessage) string {
	c := CompactJSON(raw)
	if c == "" || c == "null" {
		return "(no args)"
	}
	return c
}

func (t *Timeline) step(id string, fresh bool) *Step {
	if t.steps == nil || id == "" {
		return nil
	}
	return t.steps(id, fresh)
}

// stepDuration is the time from the step's latest start to now; from the
// stored step's times when the start is not in view.
func (t *Timeline) stepDuration(id string, end time.Time, s *Step) (time.Duration, bool) {
	if start, ok := t.executing[id]; ok {
		return end.Sub(start), true
	}
	if s != nil && s.StartedAt != nil && s.CompletedAt != nil {
		return s.CompletedAt.Sub(*s.StartedAt), true
	}
	return 0, false
}

// Footer prints how the execution ended: status, total time, and the output
// or the failure reason in full.
func (t *Timeline) Footer(e *Execution) {
	st := t.st
	took := ""
	if !e.CreatedAt.IsZero() && !e.UpdatedAt.IsZero() {
		took = " after " + FormatDuration(e.UpdatedAt.Sub(e.CreatedAt))
	}
	switch e.Status {
	case "completed":
		fmt.Fprintf(t.w, "%s execution %s %s%s\n", st.paint(st.ok, "✔"), ShortID(e.ID), st.status(e.Status), took)
		labelJSON(t.w, "  output:", e.Output, t.width-12)
	case "failed", "cancelled":
		fmt.Fprintf(t.w, "%s execution %s %s%s: %s\n", st.paint(st.bad, "✘"), ShortID(e.ID), st.status(e.Status), took,
			st.paint(st.bad, orNone(e.FailureReason)))
	default:
		fmt.Fprintf(t.w, "%s execution %s is %s\n", st.paint(st.info, "…"), ShortID(e.ID), st.status(e.Status))
	}
}

func orNone(s string) string {
	if s == "" {
		return "(no reason given)"
	}
	return s
}
