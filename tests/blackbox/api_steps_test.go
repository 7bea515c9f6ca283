package blackbox

import (
	"fmt"
	"strings"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- docs/protocol/events.md §1 ----

// TestAPIEventsPaging reads a log of more than 1,000 events with every
// combination of after_seq and limit.
func TestAPIEventsPaging(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("pager", "")
	run := hsStartRun(t, k, a, `null`)
	const steps = 334 // 3 events each, plus 4 from the start: 1,006 events
	for i := 0; i < steps; i++ {
		r := a.Request("POST", "/v0/executions/"+run.id+"/steps", fmt.Appendf(nil, `{"kind":"local","target":"s","args":%d}`, i), run.lease)
		k.Must(200, r)
	}
	const total = 4 + 3*steps

	read := func(q string) []kt.Event {
		t.Helper()
		r := k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/events"+q, nil, nil))
		hsWantJSON(t, r)
		var evs []kt.Event
		r.JSON(t, &evs)
		if evs == nil {
			t.Fatalf("%s: not an array: %.80s", q, r.Body)
		}
		for i := 1; i < len(evs); i++ {
			if evs[i].Seq != evs[i-1].Seq+1 {
				t.Fatalf("%s: gap or disorder at %d", q, i)
			}
		}
		return evs
	}
	cases := []struct {
		q           string
		first, size int64
	}{
		{"", 1, 100},
		{"?limit=0", 1, 100},
		{"?limit=", 1, 100},
		{"?after_seq=", 1, 100},
		{"?limit=1", 1, 1},
		{"?limit=1000", 1, 1000},
		{"?limit=100000", 1, 1000},
		{"?limit=9223372036854775807", 1, 1000},
		{"?after_seq=0&limit=5", 1, 5},
		{"?after_seq=5&limit=3", 6, 3},
		{"?after_seq=1000&limit=1000", 1001, total - 1000},
		{"?after_seq=900", 901, 100},
		{fmt.Sprintf("?after_seq=%d", total-1), total, 1},
		{fmt.Sprintf("?after_seq=%d", total), 0, 0},
		{"?after_seq=9223372036854775807", 0, 0},
		{"?after_seq=3&limit=2&unknown=1", 4, 2},
	}
	for _, c := range cases {
		evs := read(c.q)
		if int64(len(evs)) != c.size || (c.size > 0 && evs[0].Seq != c.first) {
			first := int64(-1)
			if len(evs) > 0 {
				first = evs[0].Seq
			}
			t.Errorf("%q: %d events from %d, want %d from %d", c.q, len(evs), first, c.size, c.first)
		}
	}
	if r := k.Do("GET", "/v0/executions/"+run.id+fmt.Sprintf("/events?after_seq=%d", total), nil, nil); string(r.Body) != "[]\n" {
		t.Fatalf("no events must be []: %q", r.Body)
	}
	hsWantErr(t, k.Do("GET", "/v0/executions/0190a5b0-0000-7000-8000-000000000002/events", nil, nil), 404, "not_found")
}

// ---- docs/protocol/executions.md §3 steps ----

// TestAPISteps checks the steps list (recording order, every status filter,
// streaming framing) and single step reads, including a step named under
// another execution.
func TestAPISteps(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("stepper", "")
	run := hsStartRun(t, k, a, `null`)
	run2 := hsStartRun(t, k, a, `null`)
	sub := func(target, args string) string {
		d := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"`+target+`","args":`+args+`}`)
		if d.Decision != "proceed" {
			t.Fatalf("submit %s: %+v", target, d)
		}
		return d.StepID
	}
	// Recording order differs from step id order with near certainty; use
	// enough steps that the check means something.
	var order []string
	for i := 0; i < 6; i++ {
		order = append(order, sub(fmt.Sprintf("t%d", i), fmt.Sprintf(`{"i":%d}`, i)))
	}
	result := `{"rows": [1, 2.50, "x"]}`
	errVal := `{"reason" : "boom", "code": 7}`
	k.Must(200, a.Request("POST", "/v0/executions/"+run.id+"/steps/"+order[0]+"/complete", []byte(`{"result":`+result+`}`), run.lease))
	k.Must(200, a.Request("POST", "/v0/executions/"+run.id+"/steps/"+order[1]+"/fail", []byte(`{"error":`+errVal+`}`), run.lease))
	a.Complete(run.id, order[3], run.lease, `null`)
	a.Complete(run.id, order[5], run.lease, `7`)
	other := a.Submit(run2.id, run2.lease, `{"kind":"tool_call","target":"t0","args":{"i":0}}`).StepID

	list := func(q string) []map[string]any {
		t.Helper()
		r := k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps"+q, nil, nil))
		hsWantJSON(t, r)
		var steps []map[string]any
		r.JSON(t, &steps)
		if steps == nil {
			t.Fatalf("%s: not an array: %s", q, r.Body)
		}
		return steps
	}
	ids := func(steps []map[string]any) string {
		var out []string
		for _, s := range steps {
			out = append(out, s["step_id"].(string))
		}
		return strings.Join(out, ",")
	}
	pick := func(idx ...int) string {
		var out []string
		for _, i := range idx {
			out = append(out, order[i])
		}
		return strings.Join(out, ",")
	}
	filters := map[string]string{
		"":                          pick(0, 1, 2, 3, 4, 5),
		"?status=":                  pick(0, 1, 2, 3, 4, 5),
		"?status=terminal":          pick(0, 1, 3, 5),
		"?status=pending":           pick(2, 4),
		"?status=executing":         pick(2, 4),
		"?status=succeeded":         pick(0, 3, 5),
		"?status=failed":            pick(1),
		"?status=denied":            "",
		"?status=cancelled":         "",
		"?status=proposed":          "",
		"?status=allowed":           "",
		"?status=awaiting_approval": "",
		"?status=terminal&x=y":      pick(0, 1, 3, 5),
	}
	for q, want := range filters {
		if got := ids(list(q)); got != want {
			t.Errorf("steps%s:\n got %s\nwant %s", q, got, want)
		}
	}
	if r := k.Do("GET", "/v0/executions/"+run.id+"/steps?status=denied", nil, nil); string(r.Body) != "[]\n" {
		t.Fatalf("empty steps list must be []: %q", r.Body)
	}

	// Step shapes.
	steps := list("")
	for i, s := range steps {
		if s["execution_id"] != run.id || s["kind"] != "tool_call" || s["target"] != fmt.Sprintf("t%d", i) ||
			s["occurrence"] != 0.0 || s["idempotency"] != "safe_to_retry" || len(s["args_hash"].(string)) != 64 {
			t.Fatalf("step %d: %v", i, s)
		}
		if rs, ok := s["resources"].([]any); !ok || len(rs) != 0 {
			t.Fatalf("step %d resources: %v", i, s["resources"])
		}
		hsWantTime(t, "started_at", s["started_at"])
		_, hasResult := s["result"]
		_, hasError := s["error"]
		_, hasCompleted := s["completed_at"]
		switch s["status"] {
		case "succeeded":
			if !hasResult || hasError || !hasCompleted {
				t.Fatalf("succeeded step fields %v", hsKeys(s))
			}
		case "failed":
			if hasResult || !hasError || !hasCompleted {
				t.Fatalf("failed step fields %v", hsKeys(s))
			}
		case "executing":
			if hasResult || hasError || hasCompleted {
				t.Fatalf("executing step fields %v", hsKeys(s))
			}
		}
	}
	wantArgsHash := hsSHA256(`{"i":0}`)
	r := k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+order[0], nil, nil))
	hsWantJSON(t, r)
	raw := hsRawMembers(t, r.Body)
	if string(raw["result"]) != result || string(raw["args"]) != `{"i":0}` || string(raw["args_hash"]) != `"`+wantArgsHash+`"` {
		t.Fatalf("step read %s", r.Body)
	}
	raw = hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+order[1], nil, nil)).Body)
	if string(raw["error"]) != errVal {
		t.Fatalf("failed step error %s", raw["error"])
	}
	// Reads of a step under the wrong execution, and of unknown steps.
	hsWantErr(t, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+other, nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/"+run2.id+"/steps/"+order[2], nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+strings.Repeat("0", 64), nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/0190a5b0-0000-7000-8000-000000000003/steps/"+order[0], nil, nil), 404, "not_found")
	hsWantErr(t, k.Do("GET", "/v0/executions/0190a5b0-0000-7000-8000-000000000003/steps", nil, nil), 404, "not_found")
	k.Must(200, k.Do("GET", "/v0/executions/"+run2.id+"/steps/"+other, nil, nil))

	// After a cancel the executing steps are cancelled (docs/protocol/executions.md §9) and the
	// filters follow.
	k.Must(204, k.Do("POST", "/v0/executions/"+run.id+"/cancel", nil, nil))
	if got, want := ids(list("?status=cancelled")), pick(2, 4); got != want {
		t.Fatalf("cancelled filter %s, want %s", got, want)
	}
	if got := ids(list("?status=pending")); got != "" {
		t.Fatalf("pending after cancel: %s", got)
	}
	if got, want := ids(list("?status=terminal")), pick(0, 1, 2, 3, 4, 5); got != want {
		t.Fatalf("terminal after cancel %s, want %s", got, want)
	}
	raw = hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+order[2], nil, nil)).Body)
	if string(raw["error"]) != `{"reason":"execution_cancelled"}` || raw["completed_at"] == nil {
		t.Fatalf("cancelled step %v", raw)
	}
}
