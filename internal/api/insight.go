package api

import (
	"net/http"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/policy"
	"github.com/rebuno/rebuno/internal/wire"
)

// Reads about an agent that no stored row holds as such: its last webhook
// delivery, found in the logs (docs/protocol/governance.md §4.5), and which
// rule of its policy would decide a step (docs/protocol/governance.md §2.6).

func handleLastDelivery(c *call) error {
	id, err := c.agentID()
	if err != nil {
		return err
	}
	d, err := c.s.k.LastDelivery(c.ctx(), id)
	if err != nil {
		return err
	}
	o := (&jsonx.Object{}).String("agent_id", id)
	if d != nil {
		do := (&jsonx.Object{}).String("execution_id", d.ExecutionID).Int("event_seq", d.Seq).String("type", d.Type).
			String("status", d.Status).Int("attempt", d.Attempt)
		if d.HTTPStatus != 0 {
			do.Int("http_status", d.HTTPStatus)
		}
		optString(do, "error", d.Error)
		o.Raw("delivery", do.String("at", wire.FormatTime(d.At)).Bytes())
	}
	c.writeJSON(http.StatusOK, o.Bytes())
	return nil
}

// handleExplain explains a step against the agent's stored policy. It is a
// POST because a step's arguments are JSON of any size, but it only reads.
func handleExplain(c *call) error {
	id, err := c.agentID()
	if err != nil {
		return err
	}
	f, err := parseBody(c.body, "kind", "target", "args")
	if err != nil {
		return err
	}
	facts := kernel.StepFacts{AgentID: id, Kind: f.str("kind"), Target: f.str("target"), Args: f.value("args")}
	if f.err != nil {
		return f.err
	}
	if f.get("kind") == nil {
		return invalid("kind", "kind is required")
	}
	report, err := c.s.k.ExplainPolicy(c.ctx(), facts)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderReport(report).Bytes())
	return nil
}

// renderReport writes an explanation in the shape of `rebuno policy explain
// --json`, keys in canonical order as every kernel-made object.
func renderReport(r policy.Report) *jsonx.Object {
	o := (&jsonx.Object{}).String("decision", r.Decision).String("rule_id", r.RuleID).String("reason", r.Reason).
		Int("not_tried", int64(r.NotTried))
	if r.Priority != nil {
		o.Int("priority", int64(*r.Priority)).Int("line", int64(r.Line))
	}
	if a := r.Approval; a != nil {
		ao := (&jsonx.Object{}).Strings("approvers", a.Approvers)
		optString(ao, "timeout", a.Timeout)
		optString(ao, "message", a.Message)
		o.Raw("approval", ao.Bytes())
	}
	if l := r.RateLimit; l != nil {
		o.Raw("rate_limit", (&jsonx.Object{}).Int("max_calls", l.MaxCalls).String("window", l.Window).
			String("per_what", l.PerWhat).String("on_limiter_error", l.OnLimiterError).Bytes())
	}
	o.Raw("trace", renderList(r.Trace, func(t policy.TraceReport) *jsonx.Object {
		to := (&jsonx.Object{}).String("rule_id", t.RuleID).Int("priority", int64(t.Priority)).Int("line", int64(t.Line)).Bool("matched", t.Matched)
		optString(to, "failed", t.Failed)
		return to
	}))
	return o
}
