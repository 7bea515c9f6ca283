package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/wire"
)

// The carried-outcome extension on the wire (docs/protocol/steps.md §13).
func TestCarriedOutcomeWire(t *testing.T) {
	v := newEnv(t)
	e, del := v.start("a1")
	steps := "/v0/executions/" + e.ID + "/steps"
	submit := func(body string) *httptest.ResponseRecorder {
		t.Helper()
		return v.do(req{method: "POST", target: steps, body: body, agent: "a1", header: dispatchHeader(del)})
	}

	rec := submit(`{"kind":"tool_call","target":"a"}`)
	if got := rec.Header().Get(wire.HeaderExtensions); got != wire.ExtCarriedOutcome {
		t.Fatalf("Rebuno-Extensions on a submit answer = %q, want %q", got, wire.ExtCarriedOutcome)
	}
	a := jsonOf(t, rec, 200).Get("step_id").Str

	for _, tc := range []struct{ name, outcome, field string }{
		{"not an object", `"x"`, "outcome"},
		{"no step id", `{"result":1}`, "outcome.step_id"},
		{"bad step id", `{"step_id":"ABC","result":1}`, "outcome.step_id"},
		{"step id not a string", `{"step_id":5,"result":1}`, "outcome.step_id"},
		{"neither result nor error", `{"step_id":"` + a + `"}`, "outcome"},
		{"both result and error", `{"step_id":"` + a + `","result":1,"error":2}`, "outcome"},
		{"unknown member", `{"step_id":"` + a + `","result":1,"extra":true}`, "outcome.extra"},
		{"bad captures", `{"step_id":"` + a + `","result":1,"captures":{}}`, "outcome.captures"},
		{"bad capture entry", `{"step_id":"` + a + `","result":1,"captures":[{"key":"w","generation":-1}]}`, "outcome.captures.generation"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := submit(`{"kind":"tool_call","target":"b","outcome":` + tc.outcome + `}`)
			body := errorOf(t, rec, 400, wire.CodeValidation)
			if got := field(body, "details", "field"); got == nil || got.Str != tc.field {
				t.Fatalf("details.field = %v, want %q (%s)", got, tc.field, rec.Body.String())
			}
		})
	}
	got := jsonOf(t, v.do(req{method: "GET", target: steps + "/" + a}), 200)
	if got.Get("status").Str != wire.StepExecuting {
		t.Fatalf("a refused carrier changed step a: %s", got.Raw)
	}

	rec = submit(`{"kind":"tool_call","target":"b","outcome":{"step_id":"` + a + `","result":null}}`)
	if dec := jsonOf(t, rec, 200); dec.Get("decision").Str != wire.DecisionProceed {
		t.Fatalf("carrier = %s", rec.Body.String())
	}
	got = jsonOf(t, v.do(req{method: "GET", target: steps + "/" + a}), 200)
	if got.Get("status").Str != wire.StepSucceeded || string(got.Get("result").Raw) != "null" {
		t.Fatalf("step a after its carrier = %s", got.Raw)
	}
	b := jsonOf(t, rec, 200).Get("step_id").Str

	complete := v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/complete", agent: "a1", header: dispatchHeader(del),
		body: `{"output":"done","outcome":{"step_id":"` + b + `","error":{"message":"x"}}}`})
	if complete.Code != http.StatusNoContent {
		t.Fatalf("complete carrying b = %d %s", complete.Code, complete.Body.String())
	}
	got = jsonOf(t, v.do(req{method: "GET", target: steps + "/" + b}), 200)
	if got.Get("status").Str != wire.StepFailed || !strings.Contains(string(got.Get("error").Raw), `"x"`) {
		t.Fatalf("step b after the complete = %s", got.Raw)
	}
}
