package api

import (
	"encoding/json"
	"net/http"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

// Reads about an agent that no stored row holds as such: its last webhook
// delivery, found in the logs, and which rule of its policy would decide a
// step.

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
	b, err := json.Marshal(report)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, b)
	return nil
}
