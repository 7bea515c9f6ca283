package cli

import (
	"context"
	"time"

	"github.com/rebuno/rebuno/internal/policy"
)

// approvalTrack is what a timeline knows about an execution's approvals: it
// reads each requested approval once (approvers, timeout, message, whether
// it is still pending) and remembers when each was requested, so that the
// lines of `exec watch` and `exec events` say who may decide, how to, and
// how long the decision took.
type approvalTrack struct {
	// lookup reads an approval (nil: show what the events carry).
	lookup func(id string) *Approval
	// cmdline spells a command for a hint.
	cmdline func(string) string

	cache     map[string]*Approval
	requested map[string]time.Time
	last      string // the approval requested most recently
}

func newApprovalTrack(lookup func(string) *Approval, cmdline func(string) string) *approvalTrack {
	return &approvalTrack{lookup: lookup, cmdline: cmdline, cache: map[string]*Approval{}, requested: map[string]time.Time{}}
}

// timelineApprovals reads approvals for the timeline through the App's
// client; a failed read just leaves the details out.
func (a *App) timelineApprovals() *approvalTrack {
	return newApprovalTrack(func(id string) *Approval {
		cl, err := a.Client()
		if err != nil {
			return nil
		}
		var ap Approval
		if _, err := cl.GetJSON(context.Background(), "/v0/approvals/"+id, &ap); err != nil {
			return nil
		}
		return &ap
	}, a.cmdline)
}

func (tr *approvalTrack) get(id string, fresh bool) *Approval {
	if ap, ok := tr.cache[id]; ok && !fresh {
		return ap
	}
	if tr.lookup == nil || id == "" {
		return nil
	}
	ap := tr.lookup(id)
	if ap != nil {
		tr.cache[id] = ap
	}
	return ap
}

// describeApproval renders execution.blocked and the approval.* events.
func (t *Timeline) describeApproval(ev Event, p payload) (string, func(string) string, string) {
	st := t.st
	if t.appr == nil {
		t.appr = newApprovalTrack(nil, nil)
	}
	tr := t.appr
	dim := func(s string) string { return st.paint(st.dim, s) }
	ok := func(s string) string { return st.paint(st.ok, s) }
	bad := func(s string) string { return st.paint(st.bad, s) }
	warn := func(s string) string { return st.paint(st.warn, s) }
	var d []string
	add := func(s ...string) {
		for _, x := range s {
			if x != "" {
				d = append(d, x)
			}
		}
	}
	join := func() string {
		out := ""
		for i, s := range d {
			if i > 0 {
				out += "  "
			}
			out += s
		}
		return out
	}
	id := p.str("approval_id")
	short := ShortID(id)

	switch ev.Type {
	case "execution.blocked":
		if tr.last == "" {
			return "⏸", warn, "waiting for an approval"
		}
		short = ShortID(tr.last)
		add("waiting for approval " + short)
		if ap := tr.get(tr.last, false); ap != nil && ap.Status == "pending" && tr.cmdline != nil {
			add(dim("decide: " + tr.cmdline("approvals grant|deny "+short)))
		}
		return "⏸", warn, join()
	case "approval.requested":
		tr.last = id
		tr.requested[id] = ev.OccurredAt
		add(labeled(st, "approval", short))
		if ap := tr.get(id, true); ap != nil {
			if len(ap.Approvers) == 0 {
				add("anyone may decide")
			} else {
				add(labeled(st, "approvers", approversText(ap.Approvers)))
			}
			if !ap.TimeoutAt.IsZero() && !ap.CreatedAt.IsZero() {
				add(labeled(st, "timeout", policy.ShortDuration(ap.TimeoutAt.Sub(ap.CreatedAt))))
			}
			add(quoted(ap.Message))
		}
		return "?", warn, join()
	}
	add(labeled(st, "approval", short))
	switch ev.Type {
	case "approval.expired":
		if r := p.str("rationale"); r == "timeout" || r == "" {
			add(bad("timed out"))
		} else {
			add(bad("closed: " + r))
		}
	default:
		add(labeled(st, "by", p.str("decided_by")), quoted(p.str("rationale")))
	}
	if t0, seen := tr.requested[id]; seen && !ev.OccurredAt.IsZero() {
		add(dim("after " + FormatDuration(ev.OccurredAt.Sub(t0))))
	}
	if ap := tr.cache[id]; ap != nil {
		ap.Status = p.str("status")
	}
	switch ev.Type {
	case "approval.granted":
		return "✔", ok, join()
	case "approval.denied":
		return "✘", bad, join()
	}
	return "⌛", bad, join()
}
