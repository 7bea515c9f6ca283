package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/testvectors"
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

// Every body of docs/protocol/vectors/carried-outcomes.json is accepted, and
// records the outcome it carries. The vectors name fixed step ids; each case
// carries the outcome of a step started here instead.
func TestCarriedOutcomeVectors(t *testing.T) {
	cases := testvectors.LoadCarriedOutcomes().Cases
	if len(cases) == 0 {
		t.Fatal("no vectors")
	}
	for _, tc := range cases {
		t.Run(tc.Name, func(t *testing.T) {
			v := newEnv(t)
			e, del := v.start("a1")
			steps := "/v0/executions/" + e.ID + "/steps"
			started := jsonOf(t, v.do(req{method: "POST", target: steps, body: `{"kind":"tool_call","target":"first"}`, agent: "a1", header: dispatchHeader(del)}), 200)
			stepID := started.Get("step_id").Str
			body := strings.ReplaceAll(tc.Body, tc.Outcome.StepID, stepID)
			if strings.Contains(body, `"resources":["workspace"]`) {
				body = strings.Replace(body, `"resources":["workspace"]`, `"resources":[]`, 1) // no resource registered here
			}
			target := map[string]string{"submit": steps, "complete": "/v0/executions/" + e.ID + "/complete", "fail": "/v0/executions/" + e.ID + "/fail"}[tc.Carrier]
			rec := v.do(req{method: "POST", target: target, body: body, agent: "a1", header: dispatchHeader(del)})
			if rec.Code != 200 && rec.Code != 204 {
				t.Fatalf("carrier answered %d %s", rec.Code, rec.Body.String())
			}
			got := jsonOf(t, v.do(req{method: "GET", target: steps + "/" + stepID}), 200)
			status, value := wire.StepFailed, got.Get("error")
			if tc.Outcome.Succeeded {
				status, value = wire.StepSucceeded, got.Get("result")
			}
			if got.Get("status").Str != status || value == nil || string(value.Raw) != tc.Outcome.Value {
				t.Fatalf("carried step = %s, want %s with %s", got.Raw, status, tc.Outcome.Value)
			}
		})
	}
}
