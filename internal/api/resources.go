package api

import (
	"net/http"
	"strconv"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/store"
)

// parseCaptures reads the capture lists of a step outcome or a publish
// (docs/protocol/resources.md §4). A ref that is not a string is taken as "",
// so that a driver bug costs a refused capture, not the outcome.
func parseCaptures(f *fields, prefix string) (kernel.Captures, error) {
	var caps kernel.Captures
	for _, member := range []string{"captures", "capture_failures"} {
		v := f.get(member)
		name := prefix + member
		if v == nil {
			continue
		}
		if v.Kind != jsonx.KindArray || len(v.Elems) > kernel.MaxCapturesPerList {
			return caps, invalid(name, "%s must be an array of at most %d entries", name, kernel.MaxCapturesPerList)
		}
		known := []string{"key", "generation", "checkpoint_ref"}
		if member == "capture_failures" {
			known = []string{"key", "generation", "error"}
		}
		for _, e := range v.Elems {
			if e.Kind != jsonx.KindObject {
				return caps, invalid(name, "%s entries must be objects", name)
			}
			for _, m := range e.Members {
				if !contains(known, m.Key) {
					return caps, invalid(name+"."+m.Key, "unknown field %q", m.Key)
				}
			}
			key := e.Get("key")
			if key == nil || key.Kind != jsonx.KindString {
				return caps, invalid(name+".key", "key must be a string")
			}
			g := e.Get("generation")
			if g == nil || g.Kind != jsonx.KindNumber {
				return caps, invalid(name+".generation", "generation must be an integer")
			}
			gen, err := strconv.ParseInt(string(g.Raw), 10, 64)
			if err != nil || gen < 0 {
				return caps, invalid(name+".generation", "generation must be an integer >= 0")
			}
			if member == "captures" {
				ref := ""
				if r := e.Get("checkpoint_ref"); r != nil && r.Kind == jsonx.KindString {
					ref = r.Str
				}
				caps.Captures = append(caps.Captures, kernel.Capture{Key: key.Str, Generation: gen, Ref: ref})
				continue
			}
			msg := ""
			if er := e.Get("error"); er != nil && er.Kind != jsonx.KindNull {
				if er.Kind != jsonx.KindString {
					return caps, invalid(name+".error", "error must be a string")
				}
				msg = er.Str
			}
			caps.Failures = append(caps.Failures, kernel.CaptureFailure{Key: key.Str, Generation: gen, Error: msg})
		}
	}
	return caps, nil
}

func (c *call) resourceKey() (string, error) {
	key := c.params["key"]
	if !kernel.ValidResourceKey(key) {
		return "", invalid("key", "invalid resource key")
	}
	return key, nil
}

// canonical returns a user value's canonical JSON: configurations and
// bindings are compared as canonical JSON (docs/protocol/resources.md §1).
func canonical(v *jsonx.Value) []byte {
	if v == nil {
		return nil
	}
	return jsonx.Canonical(v)
}

func handleRegisterResource(c *call) error {
	w, err := c.agentWrite(false, "key", "driver_id", "configuration", "coverage_reuse", "every_steps", "on_completion")
	if err != nil {
		return err
	}
	f := w.f
	r := kernel.RegisterRequest{Key: f.str("key"), DriverID: f.str("driver_id"), Configuration: canonical(f.value("configuration")),
		CoverageReuse: f.boolean("coverage_reuse"), OnCompletion: f.boolean("on_completion")}
	r.EverySteps, _ = f.integer("every_steps", 0, kernel.MaxEverySteps)
	if f.err != nil {
		return f.err
	}
	if f.get("key") == nil {
		return invalid("key", "key is required")
	}
	if f.get("driver_id") == nil {
		return invalid("driver_id", "driver_id is required")
	}
	view, err := c.s.k.RegisterResource(c.ctx(), c.caller, w.id, w.h, r)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderResource(view).Bytes())
	return nil
}

func handleBind(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	key, err := c.resourceKey()
	if err != nil {
		return err
	}
	h, err := c.dispatchHeaders()
	if err != nil {
		return err
	}
	f, err := parseBody(c.body, "binding")
	if err != nil {
		return err
	}
	if err := c.s.k.BindResource(c.ctx(), c.caller, id, key, h, canonical(f.value("binding"))); err != nil {
		return err
	}
	c.noContent()
	return nil
}

func handlePublish(c *call) error {
	w, err := c.agentWrite(false, "captures", "capture_failures")
	if err != nil {
		return err
	}
	caps, err := parseCaptures(w.f, "")
	if err != nil {
		return err
	}
	if err := c.s.k.PublishCheckpoints(c.ctx(), c.caller, w.id, w.h, caps); err != nil {
		return err
	}
	c.noContent()
	return nil
}

func handleCoverage(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	at, err := c.query("at_seq")
	if err != nil {
		return err
	}
	if at == "" {
		res, err := c.s.k.CoverageRangesOf(c.ctx(), c.caller, id)
		if err != nil {
			return err
		}
		c.writeJSON(http.StatusOK, renderRanges(res).Bytes())
		return nil
	}
	seq, err := parseInt("at_seq", at)
	if err != nil {
		return err
	}
	res, err := c.s.k.CoverageAt(c.ctx(), c.caller, id, seq)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusOK, renderPoint(res).Bytes())
	return nil
}

func handleFork(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	f, err := parseBody(c.body, "at_seq", "session", "policy_bundle")
	if err != nil {
		return err
	}
	atSeq, hasAt := f.integer("at_seq", -1<<63, 1<<63-1)
	if f.str("session") != "" {
		f.fail(invalid("session", "session: sessions are not supported by this kernel"))
	}
	if f.str("policy_bundle") != "" {
		f.fail(invalid("policy_bundle", "policy_bundle: per-execution policies are not supported by this kernel"))
	}
	if f.err != nil {
		return f.err
	}
	if !hasAt {
		return invalid("at_seq", "at_seq is required")
	}
	r := kernel.ForkRequest{AtSeq: atSeq}
	if key, err := c.idempotencyKey("", false); err != nil {
		return err
	} else if key != "" {
		r.IdempotencyKey, r.BodyHash = key, bodyHash(f.obj, "")
	}
	e, err := c.s.k.Fork(c.ctx(), id, r)
	if err != nil {
		return err
	}
	c.writeJSON(http.StatusCreated, renderExecution(e).Bytes())
	return nil
}

func handleForks(c *call) error {
	id, err := c.executionID()
	if err != nil {
		return err
	}
	var f store.ExecutionFilter
	if err := c.page(&f); err != nil {
		return err
	}
	res, err := c.s.k.ListForks(c.ctx(), c.caller, id, f)
	if err != nil {
		return err
	}
	o := (&jsonx.Object{}).Raw("executions", renderList(res.Executions, renderExecution))
	optString(o, "next_cursor", res.NextCursor)
	c.writeJSON(http.StatusOK, o.Bytes())
	return nil
}

func renderResource(v *kernel.ResourceView) *jsonx.Object {
	r := v.Resource
	return (&jsonx.Object{}).
		String("key", r.Key).
		String("driver_id", r.DriverID).
		Raw("configuration", r.Configuration).
		Bool("coverage_reuse", r.CoverageReuse).
		Int("every_steps", r.EverySteps).
		Bool("on_completion", r.OnCompletion).
		Int("registered_seq", r.RegisteredSeq).
		Int("generation", r.Generation).
		Raw("binding", r.Binding).
		String("checkpoint_ref", r.CheckpointRef).
		Bool("covered", v.Covered)
}

func renderPoint(p *kernel.CoveragePoint) *jsonx.Object {
	res := make([][]byte, 0, len(p.Resources))
	for _, r := range p.Resources {
		o := (&jsonx.Object{}).String("key", r.Key).Bool("covered", r.Covered).String("reason", r.Reason)
		if r.CheckpointSeq != 0 {
			o.String("checkpoint_ref", r.CheckpointRef).Int("checkpoint_seq", r.CheckpointSeq)
		}
		res = append(res, o.Bytes())
	}
	return (&jsonx.Object{}).String("execution_id", p.ExecutionID).Int("at_seq", p.AtSeq).Bool("covered", p.Covered).
		Raw("resources", rawArray(res))
}

func renderRanges(r *kernel.CoverageRanges) *jsonx.Object {
	res := make([][]byte, 0, len(r.Resources))
	for _, k := range r.Resources {
		res = append(res, (&jsonx.Object{}).String("key", k.Key).Int("registered_seq", k.RegisteredSeq).
			Raw("covered_ranges", rangesJSON(k.Ranges)).Bytes())
	}
	return (&jsonx.Object{}).String("execution_id", r.ExecutionID).Int("last_event_seq", r.LastEventSeq).
		Raw("covered_ranges", rangesJSON(r.Ranges)).Raw("resources", rawArray(res))
}

func rangesJSON(ranges []kernel.Range) []byte {
	b := []byte{'['}
	for i, r := range ranges {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, '[')
		b = strconv.AppendInt(b, r[0], 10)
		b = append(b, ',')
		b = strconv.AppendInt(b, r[1], 10)
		b = append(b, ']')
	}
	return append(b, ']')
}

func rawArray(items [][]byte) []byte {
	b := []byte{'['}
	for i, it := range items {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, it...)
	}
	return append(b, ']')
}
