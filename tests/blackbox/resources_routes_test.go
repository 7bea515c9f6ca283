package blackbox

import (
	"encoding/json"
	"fmt"
	"reflect"
	"slices"
	"strings"
	"testing"
	"time"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// ---- register, bind and the resource routes ----

// rfErr checks an error answer.
func rfErr(t *testing.T, what string, r *kt.Response, status int, code, msg string) {
	t.Helper()
	if r.Status != status || r.Code() != code || (msg != "" && !strings.Contains(string(r.Body), msg)) {
		t.Fatalf("%s: %s, want %d %s %q", what, r, status, code, msg)
	}
}

// TestResourceRegister: new, identical, conflicting, the 32 limit and every
// validation rule of docs/protocol/resources.md §4.
func TestResourceRegister(t *testing.T) {
	k, a := rfStartKernel(t, "")
	r := rfBegin(t, k, a, "1")
	v := r.register(`{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"timeout": 600, "a":[1, 2]},"every_steps":5,"on_completion":true}`)
	if v.Key != "workspace" || v.DriverID != "example.e2b.v1" || string(v.Configuration) != `{"a":[1,2],"timeout":600}` ||
		v.CoverageReuse || v.EverySteps != 5 || !v.OnCompletion || v.RegisteredSeq != 5 || v.Generation != 0 ||
		string(v.Binding) != "null" || v.CheckpointRef != "" || v.Covered {
		t.Fatalf("view %+v", v)
	}
	evs := r.since(4)
	rfWantTypes(t, "register", evs, evReg)
	rfWantPayload(t, "register", evs[0], `{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"a":[1,2],"timeout":600},`+
		`"coverage_reuse":false,"every_steps":5,"on_completion":true}`)
	if keys := rfStrings(k.Execution(r.id)["resource_keys"]); !slices.Equal(keys, []string{"workspace"}) {
		t.Fatalf("resource_keys %v", keys)
	}
	seq := r.lastSeq()
	// Identical (canonically equal configuration): nothing written, and
	// the stored policy wins.
	v2 := r.register(`{"key":"workspace","driver_id":"example.e2b.v1","configuration":{ "timeout" : 600, "a":[ 1,2 ]},"coverage_reuse":false,"every_steps":9}`)
	if v2.EverySteps != 5 || !v2.OnCompletion || v2.RegisteredSeq != 5 {
		t.Fatalf("identical register %+v", v2)
	}
	// Conflicts: driver_id, configuration, coverage_reuse.
	for _, c := range []struct{ what, body, requested string }{
		{"driver_id", `{"key":"workspace","driver_id":"other","configuration":{"timeout":600,"a":[1,2]}}`,
			`{"configuration":{"a":[1,2],"timeout":600},"coverage_reuse":false,"driver_id":"other"}`},
		{"configuration", `{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"timeout":601,"a":[1,2]}}`,
			`{"configuration":{"a":[1,2],"timeout":601},"coverage_reuse":false,"driver_id":"example.e2b.v1"}`},
		{"number spelling (canonical JSON keeps literals)", `{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"timeout":600.0,"a":[1,2]}}`,
			`{"configuration":{"a":[1,2],"timeout":600.0},"coverage_reuse":false,"driver_id":"example.e2b.v1"}`},
		{"no configuration", `{"key":"workspace","driver_id":"example.e2b.v1"}`,
			`{"configuration":null,"coverage_reuse":false,"driver_id":"example.e2b.v1"}`},
		{"coverage_reuse", `{"key":"workspace","driver_id":"example.e2b.v1","configuration":{"timeout":600,"a":[1,2]},"coverage_reuse":true}`,
			`{"configuration":{"a":[1,2],"timeout":600},"coverage_reuse":true,"driver_id":"example.e2b.v1"}`},
	} {
		resp := r.call("POST", "/resources", c.body)
		rfErr(t, c.what, resp, 409, "conflict", `conflict: resource \"workspace\" is registered with another driver_id, configuration or coverage_reuse`)
		var env struct {
			Details struct{ Stored, Requested map[string]any }
		}
		resp.JSON(t, &env)
		var wantStored, wantReq map[string]any
		json.Unmarshal([]byte(`{"configuration":{"a":[1,2],"timeout":600},"coverage_reuse":false,"driver_id":"example.e2b.v1"}`), &wantStored)
		json.Unmarshal([]byte(c.requested), &wantReq)
		if !reflect.DeepEqual(env.Details.Stored, wantStored) || !reflect.DeepEqual(env.Details.Requested, wantReq) {
			t.Fatalf("%s: details %s", c.what, resp.Body)
		}
	}
	// Absent and null configuration are the same.
	r.register(`{"key":"plain","driver_id":"d"}`)
	if v := r.register(`{"key":"plain","driver_id":"d","configuration":null,"coverage_reuse":null,"every_steps":null}`); string(v.Configuration) != "null" || v.EverySteps != 0 || v.OnCompletion {
		t.Fatalf("plain view %+v", v)
	}
	if n := len(r.since(seq)); n != 1 {
		t.Fatalf("identical and refused registers wrote: %v", rfTypes(r.since(seq)))
	}
	// Validation (400, nothing written).
	seq = r.lastSeq()
	long := strings.Repeat("k", 129)
	for what, body := range map[string]string{
		"missing key":          `{"driver_id":"d"}`,
		"empty key":            `{"key":"","driver_id":"d"}`,
		"key with a space":     `{"key":"a b","driver_id":"d"}`,
		"key .":                `{"key":".","driver_id":"d"}`,
		"key ..":               `{"key":"..","driver_id":"d"}`,
		"key with a slash":     `{"key":"a/b","driver_id":"d"}`,
		"non-ASCII key":        `{"key":"é","driver_id":"d"}`,
		"129-byte key":         `{"key":"` + long + `","driver_id":"d"}`,
		"key not a string":     `{"key":5,"driver_id":"d"}`,
		"missing driver_id":    `{"key":"x"}`,
		"empty driver_id":      `{"key":"x","driver_id":""}`,
		"257-byte driver_id":   `{"key":"x","driver_id":"` + strings.Repeat("d", 257) + `"}`,
		"every_steps -1":       `{"key":"x","driver_id":"d","every_steps":-1}`,
		"every_steps 1000001":  `{"key":"x","driver_id":"d","every_steps":1000001}`,
		"every_steps 1.5":      `{"key":"x","driver_id":"d","every_steps":1.5}`,
		"every_steps string":   `{"key":"x","driver_id":"d","every_steps":"3"}`,
		"every_steps bool":     `{"key":"x","driver_id":"d","every_steps":true}`,
		"coverage_reuse 1":     `{"key":"x","driver_id":"d","coverage_reuse":1}`,
		"on_completion string": `{"key":"x","driver_id":"d","on_completion":"yes"}`,
		"configuration > 64K":  `{"key":"x","driver_id":"d","configuration":"` + strings.Repeat("c", 64*1024) + `"}`,
		"unknown field":        `{"key":"x","driver_id":"d","checkpoints":{}}`,
		"not an object":        `["x"]`,
		"empty body":           ``,
	} {
		rfErr(t, what, r.call("POST", "/resources", body), 400, "validation_error", "")
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("refused registers wrote %v", rfTypes(r.since(seq)))
	}
	// The limits themselves are accepted.
	r.register(`{"key":"` + strings.Repeat("k", 128) + `","driver_id":"` + strings.Repeat("d", 256) + `","every_steps":1000000,` +
		`"configuration":"` + strings.Repeat("c", 64*1024-10) + `"}`)
	r.register(`{"key":"A-Z.a_z-09..x","driver_id":"é"}`)
	// At most 32 resources per execution.
	for i := 5; i <= 32; i++ {
		r.register(fmt.Sprintf(`{"key":"k%d","driver_id":"d"}`, i))
	}
	rfErr(t, "33rd resource", r.call("POST", "/resources", `{"key":"k33","driver_id":"d"}`), 400, "validation_error", "32")
	r.register(`{"key":"k32","driver_id":"d","every_steps":4}`) // an existing key is still answered
	keys := rfStrings(k.Execution(r.id)["resource_keys"])
	if len(keys) != 32 || keys[0] != "workspace" || keys[1] != "plain" || keys[31] != "k32" {
		t.Fatalf("resource_keys %v", keys)
	}
	rfCheckCoverage(t, k, r.id)
}

// TestResourceBind: first bind, an equal retry, a different binding, and the
// validation rules (docs/protocol/resources.md §4).
func TestResourceBind(t *testing.T) {
	k, a := rfStartKernel(t, "")
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 1))
	seq := r.lastSeq()
	r.bind("workspace", `{"sandbox_id": "i8x", "n": [1, 2.0]}`)
	evs := r.since(seq)
	rfWantTypes(t, "bind", evs, evBound)
	rfWantPayload(t, "bind", evs[0], `{"key":"workspace","binding":{"n":[1,2.0],"sandbox_id":"i8x"}}`)
	if v := r.register(rfWS(false, 1)); string(v.Binding) != `{"n":[1,2.0],"sandbox_id":"i8x"}` {
		t.Fatalf("bound view binding %s", v.Binding)
	}
	seq = r.lastSeq()
	r.bind("workspace", `{"n":[1,2.0],"sandbox_id":"i8x"}`) // canonically equal: a retry
	rfErr(t, "rebind", r.call("POST", "/resources/workspace/binding", `{"binding":{"sandbox_id":"other"}}`), 409, "conflict", "conflict: resource already bound")
	for what, body := range map[string]string{
		"null":          `{"binding":null}`,
		"absent":        `{}`,
		"over 64 KiB":   `{"binding":"` + strings.Repeat("b", 64*1024) + `"}`,
		"unknown field": `{"binding":{},"extra":1}`,
	} {
		rfErr(t, what, r.call("POST", "/resources/workspace/binding", body), 400, "validation_error", "")
	}
	rfErr(t, "unknown key", r.call("POST", "/resources/nope/binding", `{"binding":{}}`), 404, "not_found", "")
	rfErr(t, "bad key", r.call("POST", "/resources/bad!key/binding", `{"binding":{}}`), 400, "validation_error", "")
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("retry and refusals wrote %v", rfTypes(r.since(seq)))
	}
	// Any non-null JSON binds, a bare string included.
	r.register(`{"key":"other","driver_id":"d"}`)
	r.bind("other", `"just-a-string"`)
}

// TestResourceRoutesFencing: the preconditions of docs/protocol/resources.md §4 on register, bind and
// publish, in order, and the dual coverage route's authorisation.
func TestResourceRoutesFencing(t *testing.T) {
	// With --require-v1-signatures (the default) both dispatch headers are required on
	// the resource routes (docs/protocol/sdk.md §5).
	k, a := rfStartKernel(t, `"lease_timeout_seconds":31`)
	other := rfNewAgent(t, k, "other", "")
	r := rfBegin(t, k, a, "1")
	r.register(rfWS(false, 1))
	routes := []struct{ what, path, body string }{
		{"register", "/resources", rfWS(false, 1)},
		{"bind", "/resources/workspace/binding", `{"binding":{"x":1}}`},
		{"publish", "/resources/checkpoints", rfCaps(rfCap("workspace", 0, "B"))},
	}
	seq := r.lastSeq()
	for _, rt := range routes {
		rfErr(t, rt.what+" without a dispatch id", r.callAs(kt.Lease{Occurrence: -1}, "POST", rt.path, rt.body), 400, "validation_error",
			"validation error: missing dispatch_id")
		rfErr(t, rt.what+" without an attempt", r.callAs(kt.Lease{DispatchID: r.lease.DispatchID, Occurrence: -1}, "POST", rt.path, rt.body),
			400, "validation_error", "")
		rfErr(t, rt.what+" on an unknown execution", r.a.Request("POST", "/v0/executions/0190aaaa-0000-7000-8000-000000000000"+rt.path,
			[]byte(rt.body), r.lease), 404, "not_found", "")
		rfErr(t, rt.what+" by another agent", other.Request("POST", r.path(rt.path), []byte(rt.body), r.lease), 403, "forbidden", "")
		rfErr(t, rt.what+" with an unknown dispatch", r.callAs(kt.Lease{DispatchID: "0190aaaa-0000-7000-8000-000000000000", Attempt: 1, Occurrence: -1},
			"POST", rt.path, rt.body), 400, "validation_error", "unknown dispatch_id")
		rfErr(t, rt.what+" with an attempt ahead", r.callAs(kt.Lease{DispatchID: r.lease.DispatchID, Attempt: 2, Occurrence: -1},
			"POST", rt.path, rt.body), 400, "validation_error", "")
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("refused requests wrote %v", rfTypes(r.since(seq)))
	}
	// The dual coverage route.
	k.Must(200, a.Request("GET", r.path("/coverage"), nil, kt.Lease{Occurrence: -1}))
	k.Must(200, a.Request("GET", r.path("/coverage?at_seq=1"), nil, kt.Lease{Occurrence: -1}))
	rfErr(t, "coverage of another agent's execution", other.Request("GET", r.path("/coverage"), nil, kt.Lease{Occurrence: -1}), 403, "forbidden", "")
	rfErr(t, "coverage of an unknown execution", k.Do("GET", "/v0/executions/0190aaaa-0000-7000-8000-000000000000/coverage", nil, nil), 404, "not_found", "")
	rfErr(t, "coverage at_seq=abc", k.Do("GET", r.path("/coverage?at_seq=abc"), nil, nil), 400, "validation_error", "")
	rfErr(t, "coverage at_seq=-1", k.Do("GET", r.path("/coverage?at_seq=-1"), nil, nil), 400, "validation_error", "")
	rfErr(t, "forks of another agent's execution", other.Request("GET", r.path("/forks"), nil, kt.Lease{Occurrence: -1}), 403, "forbidden", "")
	k.Must(200, a.Request("GET", r.path("/forks"), nil, kt.Lease{Occurrence: -1}))

	// A reclaimed attempt is superseded on every resource route.
	old := r.lease
	k.AdvanceClock(32 * time.Second)
	r2 := rfAttach(t, k, a, r.id)
	if r2.lease.Attempt != 2 {
		t.Fatalf("redelivery %+v", r2.lease)
	}
	seq = r.lastSeq()
	for _, rt := range routes {
		rfErr(t, rt.what+" superseded", r.callAs(old, "POST", rt.path, rt.body), 409, "lease_superseded", "lease superseded")
	}
	if n := len(r.since(seq)); n != 0 {
		t.Fatalf("superseded requests wrote %v", rfTypes(r.since(seq)))
	}
	r2.bind("workspace", `{"x":1}`)
	// Terminal wins over everything after the existence checks, superseded
	// included.
	r2.finish()
	for _, rt := range routes {
		rfErr(t, rt.what+" terminal", r.callAs(r2.lease, "POST", rt.path, rt.body), 409, "execution_terminal", "")
		rfErr(t, rt.what+" terminal, superseded", r.callAs(old, "POST", rt.path, rt.body), 409, "execution_terminal", "")
	}
	rfErr(t, "terminal, another agent", other.Request("POST", r.path("/resources"), []byte(rfWS(false, 1)), r2.lease), 403, "forbidden", "")
}
