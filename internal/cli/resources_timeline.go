package cli

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
)

// The timeline's lines for resources and forks (docs/protocol/resources.md §6): registrations with their driver and checkpoint policy, bindings,
// accepted captures with the event they cover from, refused captures with
// the refusal explained, the restores of a fork, and what a step start
// declares and which generations it raised.

// refusals explain, briefly enough to fit a timeline line, the tokens with
// which the kernel refuses a capture (docs/protocol/resources.md §4).
var refusals = map[string]string{
	"unknown_resource":        "the key is not registered",
	"missing_checkpoint_ref":  "the ref is empty",
	"checkpoint_ref_too_long": "over 1,024 bytes",
	"duplicate_capture":       "repeated in one request",
	"stale_generation":        "a step began after the capture",
	"writers_active":          "a step changing it was running",
}

// RefusalText explains a refusal token ("" for anything else, such as a
// client's own error text).
func RefusalText(token string) string { return refusals[token] }

// checkpointPolicy describes every_steps and on_completion.
func checkpointPolicy(every int64, onCompletion bool) string {
	var s string
	switch {
	case every == 1:
		s = "checkpoint every step"
	case every > 1:
		s = fmt.Sprintf("checkpoint every %d steps", every)
	case onCompletion:
		return "checkpoint on completion"
	default:
		return "no checkpoints"
	}
	if onCompletion {
		s += " + on completion"
	}
	return s
}

// describeResource renders the resource.* events.
func (t *Timeline) describeResource(ev Event, p payload) (string, func(string) string, string) {
	st := t.st
	dim := func(s string) string { return st.paint(st.dim, s) }
	ok := func(s string) string { return st.paint(st.ok, s) }
	bad := func(s string) string { return st.paint(st.bad, s) }
	warn := func(s string) string { return st.paint(st.warn, s) }
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
	add(st.paint(st.bold, p.str("key")))

	switch ev.Type {
	case "resource.registered":
		add(labeled(st, "driver", p.str("driver_id")), checkpointPolicy(p.int("every_steps"), p.bool("on_completion")))
		if p.bool("coverage_reuse") {
			add(dim("coverage_reuse"))
		}
		// The configuration last: it is the longest and least telling.
		if c := CompactJSON(p["configuration"]); c != "" && c != "null" {
			add(labeled(st, "config", c))
		}
		return "◆", mark, join()
	case "resource.bound":
		add(labeled(st, "binding", CompactJSON(p["binding"])))
		return "◆", mark, join()
	case "resource.checkpointed":
		add(labeled(st, "checkpoint", strconv.Quote(p.str("checkpoint_ref"))), labeled(st, "gen", strconv.FormatInt(p.int("generation"), 10)))
		from := p.int("covered_seq")
		if until := p.int("invalidated_seq"); until > 0 {
			if until-1 > from {
				add(fmt.Sprintf("covered %d-%d", from, until-1))
			} else {
				add(fmt.Sprintf("covered %d", from))
			}
		} else {
			add(fmt.Sprintf("covers from %d", from))
		}
		return "◆", ok, join()
	case "resource.checkpoint_failed":
		add(labeled(st, "gen", strconv.FormatInt(p.int("generation"), 10)))
		msg := p.str("error")
		if why := RefusalText(msg); why != "" {
			add(bad("refused "+msg) + ": " + why)
			return "⊘", bad, join()
		}
		add(warn("capture failed") + ": " + strconv.Quote(msg))
		return "⚠", warn, join()
	case "resource.initialized":
		add(labeled(st, "gen", strconv.FormatInt(p.int("generation"), 10)))
		if ref, has := p["checkpoint_ref"]; has {
			var s string
			json.Unmarshal(ref, &s)
			add(dim("restored from checkpoint") + " " + strconv.Quote(s))
		} else {
			add(dim("starts from the initial environment"))
		}
		return "◆", mark, join()
	}
	add(dim(CompactJSON(ev.Payload)))
	return "◆", mark, join()
}

// describeForked renders execution.forked: the source and fork point, the
// coverage there and what each resource restores.
func (t *Timeline) describeForked(p payload) string {
	st := t.st
	d := []string{st.paint(st.dim, "from") + " " + ShortID(p.str("source_execution_id")), labeled(st, "at seq", strconv.FormatInt(p.int("fork_seq"), 10))}
	rs := parseRestoration(p["restoration"])
	if len(rs) > 0 {
		d = append(d, st.restorationWord(rs))
		var parts []string
		for _, r := range rs {
			parts = append(parts, restoreCompact(r.Key, r.Ref, r.Seq))
		}
		d = append(d, labeled(st, "restores", strings.Join(parts, " ")))
	}
	return strings.Join(d, "  ")
}

// stepResources is what a step.executing adds for resources: the keys the
// step declares and the generations its start raised (each one ends that
// resource's coverage).
func (t *Timeline) stepResources(p payload) []string {
	st := t.st
	var out []string
	var keys []string
	if json.Unmarshal(p["resources"], &keys) == nil && len(keys) > 0 {
		out = append(out, labeled(st, "changes", strings.Join(keys, ",")))
	}
	var gens []string
	for _, m := range members(p["generations"]) {
		gens = append(gens, m.Key+"→"+CompactJSON(m.Value))
	}
	if len(gens) > 0 {
		out = append(out, labeled(st, "gen", strings.Join(gens, " ")))
	}
	return out
}
