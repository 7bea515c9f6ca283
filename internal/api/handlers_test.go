package api

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/rebuno/rebuno/internal/clock"
	"github.com/rebuno/rebuno/internal/identity"
	"github.com/rebuno/rebuno/internal/store"
	"github.com/rebuno/rebuno/internal/wire"
)

func TestCreateHandler(t *testing.T) {
	v := newEnv(t)
	v.agent("a1")
	rec := v.do(req{method: "POST", target: "/v0/executions", body: `{"agent_id":"a1","input":{ "x" : [1, 2.0] },"agent_version":"v2","on_behalf_of":"bob","session":"","spawned_by":null}`})
	e := jsonOf(t, rec, 201)
	if string(e.Get("input").Raw) != `{ "x" : [1, 2.0] }` || e.Get("status").Str != wire.ExecRunning || e.Get("agent_version").Str != "v2" ||
		e.Get("on_behalf_of").Str != "bob" || string(e.Get("resource_keys").Raw) != "[]" {
		t.Fatalf("created = %s", rec.Body.String())
	}
	if e := jsonOf(t, v.do(req{method: "POST", target: "/v0/executions", body: `{"agent_id":"a1","input":null}`}), 201); string(e.Get("input").Raw) != "null" {
		t.Fatal("null input")
	}

	for _, tc := range []struct {
		body, field, msg string
	}{
		{`{}`, "agent_id", ""},
		{`{"agent_id":""}`, "agent_id", ""},
		{`{"agent_id":null}`, "agent_id", ""},
		{`{"agent_id":5}`, "agent_id", ""},
		{`{"agent_id":"a1","labels":{}}`, "labels", ""},
		{`{"agent_id":"a1","session":"s1"}`, "session", "validation error: session: sessions are not supported by this kernel"},
		{`{"agent_id":"a1","spawned_by":"x"}`, "spawned_by", "validation error: spawned_by: subagents are not supported by this kernel"},
		{`{"agent_id":"a1","spawned_by":{}}`, "spawned_by", ""},
		{`{"agent_id":"a1","parent_execution_id":"abc"}`, "parent_execution_id", ""},
		{`{"agent_id":"a1","agent_version":7}`, "agent_version", ""},
		{`{"agent_id":"a1","idempotency_key":""}`, "idempotency_key", ""},
		{`{"agent_id":"a1","idempotency_key":"has space"}`, "idempotency_key", ""},
	} {
		body := errorOf(t, v.do(req{method: "POST", target: "/v0/executions", body: tc.body}), 400, wire.CodeValidation)
		if got := field(body, "details", "field"); got == nil || got.Str != tc.field {
			t.Errorf("%s: details.field = %v, want %q", tc.body, got, tc.field)
		}
		if tc.msg != "" && body.Get("message").Str != tc.msg {
			t.Errorf("%s: message %q", tc.body, body.Get("message").Str)
		}
	}
}

func TestCreateIdempotency(t *testing.T) {
	v := newEnv(t)
	v.agent("a1")
	post := func(body string, keys ...string) (int, string) {
		t.Helper()
		h := http.Header{}
		for _, k := range keys {
			h.Add(wire.HeaderIdempotencyKey, k)
		}
		rec := v.do(req{method: "POST", target: "/v0/executions", body: body, header: h})
		if rec.Code != 201 {
			return rec.Code, rec.Body.String()
		}
		return rec.Code, jsonOf(t, rec, 201).Get("id").Str
	}
	code, first := post(`{"agent_id":"a1","input":{"n":1}}`, "key-1")
	if code != 201 {
		t.Fatalf("first = %d %s", code, first)
	}
	if e := jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + first}), 200); e.Get("idempotency_key").Str != "key-1" {
		t.Fatal("the key is not shown on the execution")
	}
	// The same request, with the key in the header, the body, or both.
	for _, tc := range []struct {
		body string
		keys []string
	}{
		{`{"agent_id":"a1","input":{"n":1}}`, []string{"key-1"}},
		{`{"input": {"n":1}, "agent_id":"a1"}`, []string{"key-1"}},
		{`{"agent_id":"a1","input":{"n":1},"idempotency_key":"key-1"}`, nil},
		{`{"idempotency_key":"key-1","agent_id":"a1","input":{"n":1}}`, []string{"key-1"}},
	} {
		if code, id := post(tc.body, tc.keys...); code != 201 || id != first {
			t.Fatalf("%s %v = %d %s, want 201 %s", tc.body, tc.keys, code, id, first)
		}
	}
	code, body := post(`{"agent_id":"a1","input":{"n":2}}`, "key-1")
	if code != 409 || !strings.Contains(body, `"code":"conflict"`) || !strings.Contains(body, "idempotency key reused with a different body") {
		t.Fatalf("other body = %d %s", code, body)
	}
	for _, tc := range []struct {
		body string
		keys []string
	}{
		{`{"agent_id":"a1","idempotency_key":"key-2"}`, []string{"key-1"}}, // disagree
		{`{"agent_id":"a1"}`, []string{"key-1", "key-1"}},                  // repeated
		{`{"agent_id":"a1"}`, []string{"bad key"}},
		{`{"agent_id":"a1"}`, []string{strings.Repeat("k", 129)}},
	} {
		if code, body := post(tc.body, tc.keys...); code != 400 {
			t.Fatalf("%s %v = %d %s, want 400", tc.body, tc.keys, code, body)
		}
	}
	res, _ := v.k.ListExecutions(v.ctx, store.ExecutionFilter{})
	if len(res.Executions) != 1 {
		t.Fatalf("%d executions, want 1", len(res.Executions))
	}
}

func TestParentExecution(t *testing.T) {
	v := newEnv(t)
	parent, del := v.start("a1")
	rec := v.do(req{method: "POST", target: "/v0/executions/" + parent.ID + "/complete", body: `{"output":1,"state":{"s": true}}`, agent: "a1", header: dispatchHeader(del)})
	if rec.Code != 204 {
		t.Fatalf("complete = %d %s", rec.Code, rec.Body.String())
	}
	upper := strings.ToUpper(parent.ID)
	child := jsonOf(t, v.do(req{method: "POST", target: "/v0/executions", body: `{"agent_id":"a1","parent_execution_id":"` + upper + `"}`}), 201)
	if child.Get("parent_execution_id").Str != parent.ID {
		t.Fatalf("parent = %q, want the lowercased id", child.Get("parent_execution_id").Str)
	}
	prev := jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + child.Get("id").Str + "/previous"}), 200)
	if string(prev.Get("state").Raw) != `{"s": true}` {
		t.Fatalf("previous = %s", prev.Get("state").Raw)
	}
	prev = jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + parent.ID + "/previous"}), 200)
	if string(prev.Get("state").Raw) != "null" {
		t.Fatalf("previous without parent = %s", prev.Get("state").Raw)
	}
}

func TestListHandler(t *testing.T) {
	v := newEnv(t)
	page := jsonOf(t, v.do(req{method: "GET", target: "/v0/executions"}), 200)
	if string(page.Get("executions").Raw) != "[]" || page.Get("next_cursor") != nil {
		t.Fatalf("empty page = %s", page.Get("executions").Raw)
	}
	var ids []string
	for i := 0; i < 3; i++ {
		e, _ := v.start("a1")
		ids = append(ids, e.ID)
	}
	page = jsonOf(t, v.do(req{method: "GET", target: "/v0/executions?limit=2&agent_id=a1&status=running&unknown=1"}), 200)
	if n := len(page.Get("executions").Elems); n != 2 || page.Get("next_cursor").Str != ids[1] {
		t.Fatalf("page = %d rows, cursor %v", n, page.Get("next_cursor"))
	}
	page = jsonOf(t, v.do(req{method: "GET", target: "/v0/executions?limit=2&cursor=" + strings.ToUpper(ids[1])}), 200)
	if n := len(page.Get("executions").Elems); n != 1 || page.Get("next_cursor") != nil || page.Get("executions").Elems[0].Get("id").Str != ids[0] {
		t.Fatalf("second page = %s", page.Get("executions").Raw)
	}
	page = jsonOf(t, v.do(req{method: "GET", target: "/v0/executions?limit=&status="}), 200)
	if n := len(page.Get("executions").Elems); n != 3 {
		t.Fatalf("empty parameters = %d rows", n)
	}
	for _, q := range []string{"limit=abc", "limit=-1", "limit=1&limit=2", "status=done", "cursor=abc", "limit=1.0"} {
		body := errorOf(t, v.do(req{method: "GET", target: "/v0/executions?" + q}), 400, wire.CodeValidation)
		if field(body, "details", "field") == nil {
			t.Errorf("%s: no details.field", q)
		}
	}
}

func TestEventsHandler(t *testing.T) {
	v := newEnv(t)
	e, _ := v.start("a1")
	evs := jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "/events"}), 200)
	if len(evs.Elems) != 3 || evs.Elems[0].Get("type").Str != wire.EventExecutionCreated || string(evs.Elems[0].Get("event_seq").Raw) != "1" {
		t.Fatalf("events = %s", evs.Raw)
	}
	evs = jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "/events?after_seq=2&limit=5"}), 200)
	if len(evs.Elems) != 1 || evs.Elems[0].Get("type").Str != wire.EventDispatchQueued {
		t.Fatalf("after 2 = %s", evs.Raw)
	}
	if body := jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "/events?after_seq=3"}), 200); string(body.Raw) != "[]" {
		t.Fatalf("after the last = %s", body.Raw)
	}
	for _, q := range []string{"after_seq=-5", "after_seq=1.0", "limit=-1", "after_seq=x", "after_seq=1&after_seq=2"} {
		errorOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID + "/events?" + q}), 400, wire.CodeValidation)
	}
	errorOf(t, v.do(req{method: "GET", target: "/v0/executions/0190aaaa-0000-7000-8000-000000000000/events"}), 404, wire.CodeNotFound)
}

func TestStepHandlers(t *testing.T) {
	v := newEnv(t)
	e, del := v.start("a1")
	other, _ := v.start("a1")
	steps := "/v0/executions/" + e.ID + "/steps"
	rec := v.do(req{method: "GET", target: steps})
	if rec.Code != 200 || rec.Body.String() != "[]\n" {
		t.Fatalf("no steps = %d %q", rec.Code, rec.Body.String())
	}
	submit := func(body string, h http.Header) *httptest.ResponseRecorder {
		t.Helper()
		if h == nil {
			h = dispatchHeader(del)
		}
		return v.do(req{method: "POST", target: steps, body: body, agent: "a1", header: h})
	}

	rec = submit(`{"kind":"tool_call","target":"read","args":{"path":"/tmp"}}`, nil)
	jsonOf(t, rec, 200)
	wantID := identity.StepID(e.ID, wire.KindToolCall, "read", "ef28a75876b54cb665beeb4cb10d72f463c59d196f5ee4a08e62ac67e7247639", 0)
	if got := rec.Body.String(); got != `{"decision":"proceed","resources":[],"step_id":"`+wantID+`"}`+"\n" {
		t.Fatalf("proceed = %s", got)
	}
	if rec.Header().Get(wire.HeaderStepOccurrence) != "0" {
		t.Fatalf("Rebuno-Step-Occurrence = %q", rec.Header().Get(wire.HeaderStepOccurrence))
	}
	rec = submit(`{"kind":"tool_call","target":"read","args":{"path":"/tmp"}}`, nil)
	if jsonOf(t, rec, 200).Get("step_id").Str == wantID || rec.Header().Get(wire.HeaderStepOccurrence) != "1" {
		t.Fatalf("second identical call = %s (occurrence %q)", rec.Body.String(), rec.Header().Get(wire.HeaderStepOccurrence))
	}
	h := dispatchHeader(del)
	h.Set(wire.HeaderStepOccurrence, "0")
	rec = submit(`{"kind":"tool_call","target":"read","args":{"path":"/tmp"}}`, h)
	if got := jsonOf(t, rec, 200); got.Get("step_id").Str != wantID || got.Get("decision").Str != wire.DecisionProceed {
		t.Fatalf("retry with occurrence 0 = %s", rec.Body.String())
	}

	for _, tc := range []struct {
		name, body string
		h          http.Header
		field, msg string
	}{
		{"no dispatch id", `{"kind":"tool_call"}`, http.Header{}, wire.HeaderDispatchID, "validation error: missing dispatch_id"},
		{"bad dispatch id", `{"kind":"tool_call"}`, http.Header{wire.HeaderDispatchID: {"nope"}}, wire.HeaderDispatchID, ""},
		{"bad attempt", `{"kind":"tool_call"}`, http.Header{wire.HeaderDispatchID: {del.DispatchID}, wire.HeaderDispatchAttempt: {"0"}}, wire.HeaderDispatchAttempt, ""},
		{"bad occurrence", `{"kind":"tool_call"}`, http.Header{wire.HeaderDispatchID: {del.DispatchID}, wire.HeaderStepOccurrence: {"-1"}}, wire.HeaderStepOccurrence, ""},
		{"occurrence ahead", `{"kind":"tool_call"}`, http.Header{wire.HeaderDispatchID: {del.DispatchID}, wire.HeaderStepOccurrence: {"5"}}, wire.HeaderStepOccurrence, "validation error: occurrence is ahead of the kernel"},
		{"no kind", `{"target":"x"}`, nil, "kind", ""},
		{"kind not a string", `{"kind":5}`, nil, "kind", ""},
		{"unknown kind", `{"kind":"shell"}`, nil, "kind", ""},
		{"step_id in the body", `{"kind":"tool_call","step_id":"x"}`, nil, "step_id", ""},
		{"resources not a list", `{"kind":"tool_call","resources":"w"}`, nil, "resources", ""},
		{"resources on llm_call", `{"kind":"llm_call","resources":["w"]}`, nil, "resources", ""},
		{"unregistered resource", `{"kind":"tool_call","resources":["w"]}`, nil, "resources", ""},
		{"duplicate args key", `{"kind":"tool_call","args":{"a":1,"a":1}}`, nil, "args", ""},
		{"bad idempotency", `{"kind":"tool_call","idempotency":"maybe"}`, nil, "idempotency", ""},
		{"empty body", ``, nil, "", ""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rec := submit(tc.body, tc.h)
			body := errorOf(t, rec, 400, wire.CodeValidation)
			if tc.field != "" {
				if got := field(body, "details", "field"); got == nil || got.Str != tc.field {
					t.Fatalf("details.field = %v, want %q (%s)", got, tc.field, rec.Body.String())
				}
			}
			if tc.msg != "" && body.Get("message").Str != tc.msg {
				t.Fatalf("message = %q", body.Get("message").Str)
			}
			if rec.Header().Get(wire.HeaderStepOccurrence) != "" {
				t.Fatal("an error carries Rebuno-Step-Occurrence")
			}
		})
	}
	// [] resources are allowed on every kind.
	jsonOf(t, submit(`{"kind":"llm_call","resources":[],"args":null,"target":null,"idempotency":null}`, nil), 200)

	list := jsonOf(t, v.do(req{method: "GET", target: steps}), 200)
	if len(list.Elems) != 3 || list.Elems[0].Get("step_id").Str != wantID || string(list.Elems[0].Get("args").Raw) != `{"path":"/tmp"}` {
		t.Fatalf("steps = %s", list.Raw)
	}
	if list := jsonOf(t, v.do(req{method: "GET", target: steps + "?status=terminal"}), 200); len(list.Elems) != 0 {
		t.Fatalf("terminal = %s", list.Raw)
	}
	errorOf(t, v.do(req{method: "GET", target: steps + "?status=bogus"}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "GET", target: "/v0/executions/0190aaaa-0000-7000-8000-000000000000/steps"}), 404, wire.CodeNotFound)
	one := jsonOf(t, v.do(req{method: "GET", target: steps + "/" + wantID}), 200)
	if one.Get("status").Str != wire.StepExecuting {
		t.Fatalf("step = %s", one.Raw)
	}
	errorOf(t, v.do(req{method: "GET", target: steps + "/" + strings.ToUpper(wantID)}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "GET", target: steps + "/" + wantID[:63]}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "GET", target: "/v0/executions/" + other.ID + "/steps/" + wantID}), 404, wire.CodeNotFound)

	t.Run("outcomes", func(t *testing.T) {
		base := steps + "/" + wantID
		for _, tc := range []struct {
			route, body, field string
		}{
			{"/complete", ``, ""},
			{"/complete", `{"error":1}`, "error"},
			{"/fail", `{"result":1}`, "result"},
			{"/complete", `{"captures":{}}`, "captures"},
			{"/complete", `{"captures":[1]}`, "captures"},
			{"/complete", `{"captures":[{"key":"w","generation":1,"bogus":1}]}`, "captures.bogus"},
			{"/complete", `{"captures":[{"generation":1}]}`, "captures.key"},
			{"/complete", `{"captures":[{"key":"w","generation":-1}]}`, "captures.generation"},
			{"/complete", `{"captures":[{"key":"w","generation":"1"}]}`, "captures.generation"},
			{"/fail", `{"capture_failures":[{"key":"w","generation":1,"error":5}]}`, "capture_failures.error"},
			{"/fail", `{"capture_failures":[{"key":"w","generation":1,"checkpoint_ref":"x"}]}`, "capture_failures.checkpoint_ref"},
		} {
			rec := v.do(req{method: "POST", target: base + tc.route, body: tc.body, agent: "a1", header: dispatchHeader(del)})
			body := errorOf(t, rec, 400, wire.CodeValidation)
			if tc.field != "" {
				if got := field(body, "details", "field"); got == nil || got.Str != tc.field {
					t.Errorf("%s %s: details.field = %v, want %q", tc.route, tc.body, got, tc.field)
				}
			}
		}
		ok := `{"result":{"rows": [1]},"captures":[{"key":"w","generation":1,"checkpoint_ref":"r"}],"capture_failures":[{"key":"w","generation":1,"error":null}]}`
		rec := v.do(req{method: "POST", target: base + "/complete", body: ok, agent: "a1", header: dispatchHeader(del)})
		if rec.Body.String() != `{"decision":"recorded"}`+"\n" {
			t.Fatalf("complete = %d %s", rec.Code, rec.Body.String())
		}
		rec = v.do(req{method: "POST", target: base + "/fail", body: `{"error":"late"}`, agent: "a1", header: dispatchHeader(del)})
		if rec.Body.String() != `{"decision":"replay","result":{"rows": [1]}}`+"\n" {
			t.Fatalf("fail after complete = %d %s", rec.Code, rec.Body.String())
		}
		errorOf(t, v.do(req{method: "POST", target: steps + "/" + strings.Repeat("0", 64) + "/complete", body: `{}`, agent: "a1"}), 404, wire.CodeNotFound)
	})
}

func TestDeltaAndHeartbeatHandlers(t *testing.T) {
	v := newEnv(t)
	e, del := v.start("a1")
	dec := v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/steps", body: `{"kind":"llm_call","target":"m"}`, agent: "a1", header: dispatchHeader(del)})
	step := jsonOf(t, dec, 200).Get("step_id").Str
	stream := "/v0/executions/" + e.ID + "/steps/" + step + "/stream"
	sub := v.k.SubscribeDeltas(e.ID)
	defer sub.Close()
	for _, body := range []string{`{"seq":"1","data":"x"}`, `{"seq":1.5,"data":"x"}`, `{"seq":-1,"data":"x"}`, `{"seq":9223372036854775808,"data":"x"}`,
		`{"data":"x"}`, `{"seq":1}`, `{"seq":1,"data":null}`, `{"seq":1,"data":5}`, `{"seq":1,"data":"` + strings.Repeat("x", 7001) + `"}`, ``, `{"seq":1,"data":"x","extra":1}`} {
		errorOf(t, v.do(req{method: "POST", target: stream, body: body, agent: "a1"}), 400, wire.CodeValidation)
	}
	if len(sub.C) != 0 {
		t.Fatal("a refused delta was published")
	}
	rec := v.do(req{method: "POST", target: stream, body: `{"seq":9223372036854775807,"data":"tok"}`, agent: "a1", header: dispatchHeader(del)})
	if rec.Code != 204 || rec.Body.Len() != 0 {
		t.Fatalf("delta = %d %q", rec.Code, rec.Body.String())
	}
	if d := <-sub.C; d.Seq != 1<<63-1 || d.Data != "tok" || d.StepID != step {
		t.Fatalf("delta = %+v", d)
	}

	hb := "/v0/executions/" + e.ID + "/heartbeat"
	body := errorOf(t, v.do(req{method: "POST", target: hb, body: "{}", agent: "a1"}), 400, wire.CodeValidation)
	if body.Get("message").Str != "validation error: heartbeat body must be empty" {
		t.Fatalf("message = %q", body.Get("message").Str)
	}
	if rec := v.do(req{method: "POST", target: hb, agent: "a1", header: dispatchHeader(del)}); rec.Code != 204 {
		t.Fatalf("heartbeat = %d", rec.Code)
	}
	h := dispatchHeader(del)
	h.Set(wire.HeaderDispatchAttempt, "2")
	errorOf(t, v.do(req{method: "POST", target: hb, agent: "a1", header: h}), 400, wire.CodeValidation)
}

func TestCompleteAndFailHandlers(t *testing.T) {
	v := newEnv(t)
	e, del := v.start("a1")
	complete := "/v0/executions/" + e.ID + "/complete"
	fail := "/v0/executions/" + e.ID + "/fail"
	for _, tc := range []struct{ target, body string }{
		{complete, ``}, {complete, `{"outcome":1}`}, {fail, ``}, {fail, `{"error":{}}`}, {fail, `{"error":1}`}, {fail, `{"reason":"x"}`},
	} {
		errorOf(t, v.do(req{method: "POST", target: tc.target, body: tc.body, agent: "a1", header: dispatchHeader(del)}), 400, wire.CodeValidation)
	}
	if rec := v.do(req{method: "POST", target: fail, body: `{"error":null}`, agent: "a1", header: dispatchHeader(del)}); rec.Code != 204 {
		t.Fatalf("fail = %d %s", rec.Code, rec.Body.String())
	}
	got := jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e.ID}), 200)
	if got.Get("status").Str != wire.ExecFailed || got.Get("failure_reason") != nil || got.Get("output") != nil {
		t.Fatalf("execution = %s", got.Raw)
	}
	errorOf(t, v.do(req{method: "POST", target: complete, body: `{}`, agent: "a1", header: dispatchHeader(del)}), 409, wire.CodeExecutionTerminal)
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/cancel", body: "ignored"}), 409, wire.CodeExecutionTerminal)

	e2, del2 := v.start("a1")
	if rec := v.do(req{method: "POST", target: "/v0/executions/" + e2.ID + "/complete", body: `{}`, agent: "a1", header: dispatchHeader(del2)}); rec.Code != 204 {
		t.Fatalf("complete = %d", rec.Code)
	}
	got = jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e2.ID}), 200)
	if got.Get("status").Str != wire.ExecCompleted || string(got.Get("output").Raw) != "null" {
		t.Fatalf("completed = %s", got.Raw)
	}
	e3, _ := v.start("a1")
	if rec := v.do(req{method: "POST", target: "/v0/executions/" + e3.ID + "/cancel", body: "not json at all"}); rec.Code != 204 {
		t.Fatalf("cancel = %d %s", rec.Code, rec.Body.String())
	}
	if got := jsonOf(t, v.do(req{method: "GET", target: "/v0/executions/" + e3.ID}), 200); got.Get("failure_reason").Str != wire.ReasonClientCancelled {
		t.Fatalf("cancelled = %s", got.Raw)
	}
	errorOf(t, v.do(req{method: "POST", target: "/v0/executions/0190aaaa-0000-7000-8000-000000000000/cancel"}), 404, wire.CodeNotFound)
}

func TestAgentHandlers(t *testing.T) {
	v := newEnv(t)
	rec := v.do(req{method: "POST", target: "/v0/agents", body: `{"id":"b1","webhook_url":"http://h/b","secret":"hidden-secret","lease_timeout_seconds":300}`})
	a := jsonOf(t, rec, 201)
	if a.Get("id").Str != "b1" || string(a.Get("lease_timeout_seconds").Raw) != "300" || a.Get("policy_bundle").Str != "" {
		t.Fatalf("agent = %s", rec.Body.String())
	}
	if strings.Contains(rec.Body.String(), "hidden-secret") || a.Get("secret") != nil {
		t.Fatal("the secret was echoed")
	}
	jsonOf(t, v.do(req{method: "POST", target: "/v0/agents", body: `{"id":"a1","webhook_url":"http://h/a","secret":"s","lease_timeout_seconds":null}`}), 201)
	for _, body := range []string{
		`{"id":"x","webhook_url":"http://h/","secret":"s","lease_timeout_seconds":"300"}`,
		`{"id":"x","webhook_url":"http://h/","secret":"s","lease_timeout_seconds":300.5}`,
		`{"id":"x","webhook_url":"http://h/","secret":"s","lease_timeout_seconds":0}`,
		`{"id":"x","webhook_url":"http://h/","secret":"s","lease_timeout_seconds":86401}`,
		`{"id":"x","webhook_url":"http://h/","secret":"s","lease_timeout_seconds":10}`,
		`{"id":"-x","webhook_url":"http://h/","secret":"s"}`,
		`{"id":"x","webhook_url":"/rel","secret":"s"}`,
		`{"id":"x","webhook_url":"ftp://h/","secret":"s"}`,
		`{"id":"x","webhook_url":"http://h/","secret":""}`,
		`{"id":"x","webhook_url":"http://h/"}`,
		`{"id":"x","webhook_url":"http://h/","secret":"s","policy":"x"}`,
	} {
		errorOf(t, v.do(req{method: "POST", target: "/v0/agents", body: body}), 400, wire.CodeValidation)
	}
	list := jsonOf(t, v.do(req{method: "GET", target: "/v0/agents"}), 200)
	if len(list.Elems) != 2 || list.Elems[0].Get("id").Str != "a1" || list.Elems[1].Get("id").Str != "b1" {
		t.Fatalf("agents = %s", list.Raw)
	}
	errorOf(t, v.do(req{method: "GET", target: "/v0/agents/-bad"}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "GET", target: "/v0/agents/ghost"}), 404, wire.CodeNotFound)
	errorOf(t, v.do(req{method: "DELETE", target: "/v0/agents/ghost"}), 404, wire.CodeNotFound)

	pol := "/v0/policies/b1"
	body := errorOf(t, v.do(req{method: "POST", target: pol, body: `{"bundle":"rules: ["}`}), 400, wire.CodeValidation)
	if !strings.HasPrefix(body.Get("message").Str, "invalid policy bundle: ") {
		t.Fatalf("message = %q", body.Get("message").Str)
	}
	errorOf(t, v.do(req{method: "POST", target: pol, body: `{"bundle":5}`}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "POST", target: "/v0/policies/ghost", body: `{"bundle":"default_action: allow\n"}`}), 404, wire.CodeNotFound)
	errorOf(t, v.do(req{method: "POST", target: "/v0/policies/-bad", body: `{}`}), 400, wire.CodeValidation)
	if rec := v.do(req{method: "POST", target: pol, body: `{"bundle":"default_action: allow\n"}`}); rec.Code != 204 {
		t.Fatalf("policy = %d %s", rec.Code, rec.Body.String())
	}
	if a := jsonOf(t, v.do(req{method: "GET", target: "/v0/agents/b1"}), 200); a.Get("policy_bundle").Str != "default_action: allow\n" {
		t.Fatalf("policy_bundle = %q", a.Get("policy_bundle").Str)
	}
	if rec := v.do(req{method: "POST", target: pol, body: `{}`}); rec.Code != 204 {
		t.Fatalf("policy removal = %d", rec.Code)
	}

	md := "/v0/agents/b1/metadata"
	for _, body := range []string{`{"input_schema":[]}`, `{"output_schema":"x"}`, `{"description":5}`, `{"tags":[]}`, ``} {
		errorOf(t, v.do(req{method: "PUT", target: md, body: body, agent: "b1", key: "hidden-secret"}), 400, wire.CodeValidation)
	}
	if rec := v.do(req{method: "PUT", target: md, body: `{"description":"d","input_schema":{ "type" : "object" }}`, agent: "b1", key: "hidden-secret",
		header: http.Header{wire.HeaderDispatchID: {"ignored"}}}); rec.Code != 204 {
		t.Fatalf("metadata = %d %s", rec.Code, rec.Body.String())
	}
	a = jsonOf(t, v.do(req{method: "GET", target: "/v0/agents/b1"}), 200)
	if a.Get("description").Str != "d" || string(a.Get("input_schema").Raw) != `{ "type" : "object" }` || a.Get("output_schema") != nil {
		t.Fatalf("agent = %s", a.Raw)
	}
	if rec := v.do(req{method: "DELETE", target: "/v0/agents/b1"}); rec.Code != 204 {
		t.Fatalf("delete = %d", rec.Code)
	}
}

func TestApprovalHandlers(t *testing.T) {
	v := newEnv(t)
	v.agent("a1")
	const bundle = "rules:\n  - id: ask\n    when: {target: pay}\n    then:\n      decision: require_approval\n      approval_config: {approvers: [alice]}\n"
	if err := v.k.SetPolicy(v.ctx, "a1", bundle); err != nil {
		t.Fatal(err)
	}
	e, del := v.start("a1")
	dec := jsonOf(t, v.do(req{method: "POST", target: "/v0/executions/" + e.ID + "/steps", body: `{"kind":"tool_call","target":"pay"}`, agent: "a1", header: dispatchHeader(del)}), 200)
	if dec.Get("decision").Str != wire.DecisionBlocked || dec.Get("resources") != nil {
		t.Fatalf("decision = %s", dec.Raw)
	}
	id := dec.Get("approval_id").Str
	list := jsonOf(t, v.do(req{method: "GET", target: "/v0/approvals"}), 200)
	if len(list.Elems) != 1 || list.Elems[0].Get("id").Str != id || string(list.Elems[0].Get("approvers").Raw) != `["alice"]` {
		t.Fatalf("approvals = %s", list.Raw)
	}
	if list := jsonOf(t, v.do(req{method: "GET", target: "/v0/approvals?status=granted"}), 200); string(list.Raw) != "[]" {
		t.Fatalf("granted = %s", list.Raw)
	}
	if list := jsonOf(t, v.do(req{method: "GET", target: "/v0/approvals?execution_id=" + strings.ToUpper(e.ID) + "&limit=0"}), 200); len(list.Elems) != 1 {
		t.Fatalf("by execution = %s", list.Raw)
	}
	for _, q := range []string{"status=open", "execution_id=x", "after=x", "limit=-1", "limit=a"} {
		errorOf(t, v.do(req{method: "GET", target: "/v0/approvals?" + q}), 400, wire.CodeValidation)
	}
	if a := jsonOf(t, v.do(req{method: "GET", target: "/v0/approvals/" + strings.ToUpper(id)}), 200); a.Get("status").Str != wire.ApprovalPending {
		t.Fatalf("approval = %s", a.Raw)
	}
	errorOf(t, v.do(req{method: "GET", target: "/v0/approvals/x"}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "GET", target: "/v0/approvals/0190aaaa-0000-7000-8000-000000000000"}), 404, wire.CodeNotFound)
	errorOf(t, v.do(req{method: "POST", target: "/v0/approvals/" + id + "/grant", body: `{"decided_by":5}`}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "POST", target: "/v0/approvals/" + id + "/grant", body: ``}), 400, wire.CodeValidation)
	errorOf(t, v.do(req{method: "POST", target: "/v0/approvals/" + id + "/grant", body: `{"who":"alice"}`}), 400, wire.CodeValidation)
	body := errorOf(t, v.do(req{method: "POST", target: "/v0/approvals/" + id + "/grant", body: `{"decided_by":"mallory"}`}), 403, wire.CodeForbidden)
	if body.Get("message").Str != `forbidden: "mallory" is not an approver for this approval` {
		t.Fatalf("message = %q", body.Get("message").Str)
	}
	errorOf(t, v.do(req{method: "POST", target: "/v0/approvals/0190aaaa-0000-7000-8000-000000000000/deny", body: `{}`}), 404, wire.CodeNotFound)
	if rec := v.do(req{method: "POST", target: "/v0/approvals/" + id + "/grant", body: `{"decided_by":"alice","rationale":"fine"}`}); rec.Code != 204 {
		t.Fatalf("grant = %d %s", rec.Code, rec.Body.String())
	}
	errorOf(t, v.do(req{method: "POST", target: "/v0/approvals/" + id + "/deny", body: `{"decided_by":"alice"}`}), 409, wire.CodeConflict)
	a := jsonOf(t, v.do(req{method: "GET", target: "/v0/approvals/" + id}), 200)
	if a.Get("status").Str != wire.ApprovalGranted || a.Get("decided_by").Str != "alice" || a.Get("rationale").Str != "fine" || a.Get("decided_at") == nil {
		t.Fatalf("approval = %s", a.Raw)
	}
}

func TestHealthReadyAndMetrics(t *testing.T) {
	v := newEnv(t)
	if rec := v.do(req{method: "GET", target: "/v0/health"}); rec.Body.String() != `{"status":"ok"}`+"\n" {
		t.Fatalf("health = %s", rec.Body.String())
	}
	if rec := v.do(req{method: "GET", target: "/v0/ready"}); rec.Code != 200 || rec.Body.String() != `{"status":"ready"}`+"\n" {
		t.Fatalf("ready = %d %s", rec.Code, rec.Body.String())
	}
	id := "0190aaaa-0000-7000-8000-000000000000"
	v.do(req{method: "GET", target: "/v0/executions/" + id})
	v.do(req{method: "GET", target: "/no/such/path"})
	m := v.k.Metrics().HTTPRequests
	if got := testutil.ToFloat64(m.WithLabelValues("GET /v0/executions/{id}", "404")); got != 1 {
		t.Fatalf("http_requests_total{route=GET /v0/executions/{id},status=404} = %v", got)
	}
	if got := testutil.ToFloat64(m.WithLabelValues("unmatched", "404")); got != 1 {
		t.Fatalf("http_requests_total{route=unmatched} = %v", got)
	}
	rec := v.do(req{method: "GET", target: "/metrics"})
	text := rec.Body.String()
	if rec.Code != 200 || !strings.Contains(text, `rebuno_http_requests_total{route="GET /v0/ready",status="200"} 1`) || strings.Contains(text, id) {
		t.Fatalf("metrics = %d, contains the ready series: %v, contains a raw path: %v", rec.Code,
			strings.Contains(text, `route="GET /v0/ready"`), strings.Contains(text, id))
	}
	for _, series := range []string{"rebuno_replay_total", "rebuno_dispatch_outcomes_total", "rebuno_queue_depth", "go_goroutines"} {
		if !strings.Contains(text, series) {
			t.Errorf("metrics lack %s", series)
		}
	}

	v.s.Drain()
	v.s.Drain() // idempotent
	rec = v.do(req{method: "GET", target: "/v0/ready"})
	if rec.Code != 503 || rec.Body.String() != `{"status":"unavailable"}`+"\n" {
		t.Fatalf("ready while draining = %d %s", rec.Code, rec.Body.String())
	}
	if rec := v.do(req{method: "GET", target: "/v0/health"}); rec.Code != 200 {
		t.Fatal("health must stay up while draining")
	}
}

func TestTestClockRoute(t *testing.T) {
	v := newEnv(t)
	errorOf(t, v.do(req{method: "POST", target: "/v0/test/clock", body: `{"advance":"90s"}`}), 404, wire.CodeNotFound)
	mc := clock.NewManual(t0)
	w := newEnv(t, func(o *Options) { o.ManualClock = mc })
	rec := w.do(req{method: "POST", target: "/v0/test/clock", body: `{"advance":"90s"}`})
	if rec.Code != 200 || rec.Body.String() != `{"now":"2026-12-02T09:01:30Z"}`+"\n" || !mc.Now().Equal(t0.Add(90e9)) {
		t.Fatalf("advance = %d %s", rec.Code, rec.Body.String())
	}
	for _, body := range []string{`{"advance":"-1s"}`, `{"advance":"0s"}`, `{"advance":"soon"}`, `{"advance":90}`, `{}`, `{"advance":"1s","x":1}`} {
		errorOf(t, w.do(req{method: "POST", target: "/v0/test/clock", body: body}), 400, wire.CodeValidation)
	}
	if !mc.Now().Equal(t0.Add(90e9)) {
		t.Fatal("a refused advance moved the clock")
	}
	withAuth := newEnv(t, withToken, func(o *Options) { o.ManualClock = mc })
	errorOf(t, withAuth.do(req{method: "POST", target: "/v0/test/clock", body: `{"advance":"1s"}`}), 401, wire.CodeUnauthorized)
}

// Credentials in a webhook URL are stored (deliveries need them) but never
// shown back.
func TestAgentWebhookCredentialsRedacted(t *testing.T) {
	v := newEnv(t)
	rec := v.do(req{method: "POST", target: "/v0/agents", body: `{"id":"cred","webhook_url":"https://bot:s3cret-pw@hooks.example.com/in","secret":"` + secret + `"}`})
	for _, body := range []string{rec.Body.String(), v.do(req{method: "GET", target: "/v0/agents/cred"}).Body.String(),
		v.do(req{method: "GET", target: "/v0/agents"}).Body.String()} {
		if strings.Contains(body, "s3cret-pw") || !strings.Contains(body, `"webhook_url":"https://bot:xxxxx@hooks.example.com/in"`) {
			t.Fatalf("agent answer shows the URL's credentials: %s", body)
		}
	}
	a, err := v.k.GetAgent(v.ctx, "cred")
	if err != nil || a.WebhookURL != "https://bot:s3cret-pw@hooks.example.com/in" {
		t.Fatalf("stored URL = %q (%v): deliveries need the credentials", a.WebhookURL, err)
	}
}
