package api

import (
	"net/http"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

// Execution summaries (docs/protocol/executions.md §4.1): the list of
// executions as an operator's screen shows it, one small row each (no input
// or output), with the counts the kernel keeps on the row; and a stream that
// says when to read it again.

// summaryInterval is the least time between two frames of the summary
// stream: a busy kernel changes executions far faster than anyone reads a
// list, and every frame costs each client a page read.
const summaryInterval = 200 * time.Millisecond

func renderSummary(e *store.Execution) *jsonx.Object {
	o := (&jsonx.Object{}).
		String("id", e.ID).
		String("agent_id", e.AgentID).
		String("status", e.Status).
		String("created_at", wire.FormatTime(e.CreatedAt)).
		String("updated_at", wire.FormatTime(e.UpdatedAt)).
		Int("step_count", e.StepOrder).
		Int("last_event_seq", e.LastSeq)
	optString(o, "agent_version", e.AgentVersion)
	optString(o, "failure_reason", e.FailureReason)
	optString(o, "parent_execution_id", e.ParentID)
	if e.ForkedFrom != "" {
		o.String("forked_from", e.ForkedFrom).Int("fork_seq", e.ForkSeq)
	}
	return o
}

func handleSummaries(c *call) error {
	return c.listExecutions(renderSummary)
}

// handleSummaryStream sends a frame at once and then whenever an execution's
// log has grown, at most one per summaryInterval: each frame means "read
// the list again". The first frame lets a client read after subscribing, so
// that no change is lost between its read and the stream.
func handleSummaryStream(c *call) error {
	all := c.s.k.SubscribeExecutions()
	defer all.Close()
	sw, done, err := c.openStream("executions")
	if err != nil || sw == nil {
		return err
	}
	defer done()
	pause := time.NewTimer(0)
	defer pause.Stop()
	idle := time.NewTimer(keepAlive)
	defer idle.Stop()
	for {
		if sw.write([]byte("data: {}\n\n")) != nil {
			return nil
		}
		pause.Reset(summaryInterval)
		select {
		case <-pause.C:
		case <-c.ctx().Done():
			return nil
		case <-c.s.shutdown:
			return nil
		}
		idle.Reset(keepAlive)
	wait:
		for {
			select {
			case <-all.C:
				break wait
			case <-idle.C:
				if sw.write([]byte(": keep-alive\n\n")) != nil {
					return nil
				}
				idle.Reset(keepAlive)
			case <-c.ctx().Done():
				return nil
			case <-c.s.shutdown:
				return nil
			}
		}
	}
}

// listExecutions answers a page of executions read with the list's
// parameters (docs/protocol/executions.md §4), each row rendered by render.
func (c *call) listExecutions(render func(*store.Execution) *jsonx.Object) error {
	var f store.ExecutionFilter
	var err error
	if f.AgentID, err = c.query("agent_id"); err != nil {
		return err
	}
	if f.Status, err = c.query("status"); err != nil {
		return err
	}
	if err = c.page(&f); err != nil {
		return err
	}
	res, err := c.s.k.ListExecutions(c.ctx(), f)
	if err != nil {
		return err
	}
	o := (&jsonx.Object{}).Raw("executions", renderList(res.Executions, render))
	optString(o, "next_cursor", res.NextCursor)
	c.writeJSON(http.StatusOK, o.Bytes())
	return nil
}
