package blackbox

// Bad input on the agent routes, paths and queries, and the admin routes:
// the rows of docs/protocol/errors.md that name them.

import (
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"testing"

	"github.com/rebuno/rebuno/internal/auth"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// TestBadInputSubmit covers the submit body and headers (docs/protocol/steps.md §1, docs/protocol/http.md §10): every
// refusal leaves the execution, its log and its steps as they were, and the
// edge values just inside the rules are accepted.
func TestBadInputSubmit(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("submitter", "")
	run := hsStartRun(t, k, a, `null`)
	run2 := hsStartRun(t, k, a, `null`)
	path := "/v0/executions/" + run.id + "/steps"
	did := run.lease.DispatchID
	before := hsSnapshot(t, k, run.id)
	before2 := hsSnapshot(t, k, run2.id)

	bodyCases := []struct{ name, body, field string }{
		{"kind a number", `{"kind":5}`, "kind"},
		{"kind unknown", `{"kind":"shell"}`, "kind"},
		{"kind wrong case", `{"kind":"TOOL_CALL"}`, "kind"},
		{"kind missing", `{"target":"t"}`, "kind"},
		{"kind empty", `{"kind":""}`, "kind"},
		{"kind null", `{"kind":null}`, "kind"},
		{"idempotency unknown", `{"kind":"tool_call","idempotency":"maybe"}`, "idempotency"},
		{"idempotency a bool", `{"kind":"tool_call","idempotency":true}`, "idempotency"},
		{"target 1025 bytes", `{"kind":"tool_call","target":"` + strings.Repeat("t", 1025) + `"}`, "target"},
		{"target with LF", `{"kind":"tool_call","target":"a\nb"}`, "target"},
		{"target with NUL", `{"kind":"tool_call","target":"a\u0000b"}`, "target"},
		{"target with DEL", `{"kind":"tool_call","target":"a\u007fb"}`, "target"},
		{"target a number", `{"kind":"tool_call","target":5}`, "target"},
		{"target an array", `{"kind":"tool_call","target":["t"]}`, "target"},
		{"unknown field step_id", `{"kind":"tool_call","step_id":"` + strings.Repeat("a", 64) + `"}`, "step_id"},
		{"unknown field dispatch_id", `{"kind":"tool_call","dispatch_id":"` + did + `"}`, "dispatch_id"},
		{"unknown field occurrence", `{"kind":"tool_call","occurrence":0}`, "occurrence"},
		{"duplicate key in args", `{"kind":"tool_call","args":{"a":1,"a":1}}`, ""},
		{"duplicate key deep in args", `{"kind":"tool_call","args":[[{"x":{"y":1,"y":2}}]]}`, ""},
		{"NaN in args", `{"kind":"tool_call","args":{"a":NaN}}`, ""},
		{"nesting 129 in args", `{"kind":"tool_call","args":` + hsNest(128, "") + `}`, ""},
		{"invalid UTF-8 in args", "{\"kind\":\"tool_call\",\"args\":\"\xfe\"}", ""},
		{"resources not an array", `{"kind":"tool_call","resources":"ws"}`, "resources"},
	}
	for _, c := range bodyCases {
		r := hsAgentDo(t, k, a, "POST", path, []byte(c.body), run.lease, nil)
		if r.Status != 400 || r.Code() != "validation_error" {
			t.Errorf("%s: want 400, got %s", c.name, r)
			continue
		}
		if c.field != "" {
			hsWantField(t, r, c.field)
		}
	}

	valid := []byte(`{"kind":"tool_call","target":"never"}`)
	braced := "{" + did + "}"
	headerCases := []struct {
		name       string
		sig        hsSig
		occurrence string // Rebuno-Step-Occurrence; "" = absent
		message    string
	}{
		{name: "dispatch id missing", sig: hsSig{attempt: "1"}, message: "validation error: missing dispatch_id"},
		{name: "dispatch id missing, no attempt", sig: hsSig{}, message: "validation error: missing dispatch_id"},
		{name: "dispatch id abc", sig: hsSig{dispatchID: "abc", attempt: "1"}},
		{name: "dispatch id braced", sig: hsSig{dispatchID: braced, attempt: "1"}},
		{name: "dispatch id urn", sig: hsSig{dispatchID: "urn:uuid:" + did, attempt: "1"}},
		{name: "dispatch id 32 hex", sig: hsSig{dispatchID: strings.ReplaceAll(did, "-", ""), attempt: "1"}},
		{name: "dispatch id empty", sig: hsSig{dispatchID: "", attempt: "1"}},
		{name: "dispatch id unknown", sig: hsSig{dispatchID: hsUnknownUUID, attempt: "1"}, message: "validation error: unknown dispatch_id"},
		{name: "dispatch id of another execution", sig: hsSig{dispatchID: run2.lease.DispatchID, attempt: "1"}, message: "validation error: dispatch_id belongs to another execution"},
		{name: "attempt 0", sig: hsSig{dispatchID: did, attempt: "0"}},
		{name: "attempt -1", sig: hsSig{dispatchID: did, attempt: "-1"}},
		{name: "attempt x", sig: hsSig{dispatchID: did, attempt: "x"}},
		{name: "attempt +1", sig: hsSig{dispatchID: did, attempt: "+1"}},
		{name: "attempt 1.0", sig: hsSig{dispatchID: did, attempt: "1.0"}},
		{name: "attempt 2^31", sig: hsSig{dispatchID: did, attempt: "2147483648"}},
		{name: "attempt above current", sig: hsSig{dispatchID: did, attempt: "2"}, message: "validation error: dispatch attempt is ahead of the kernel"},
		{name: "occurrence -1", sig: hsLeaseSig(run.lease), occurrence: "-1"},
		{name: "occurrence x", sig: hsLeaseSig(run.lease), occurrence: "x"},
		{name: "occurrence 2^31", sig: hsLeaseSig(run.lease), occurrence: "2147483648"},
		{name: "occurrence ahead", sig: hsLeaseSig(run.lease), occurrence: "1", message: "validation error: occurrence is ahead of the kernel"},
	}
	for _, c := range headerCases {
		req := hsAgentReq(t, k, a, "POST", path, valid, c.sig)
		if c.sig.dispatchID == "" && c.name == "dispatch id empty" {
			// An empty header value is sent, and signed as empty.
			req.Header["Rebuno-Dispatch-Id"] = []string{""}
		}
		if c.occurrence != "" {
			req.Header.Set("Rebuno-Step-Occurrence", c.occurrence)
			req.Header.Set("Rebuno-Occurrence-Signature", auth.SignOccurrence([]byte(a.Secret), req.Header.Get("Rebuno-Signature"), c.occurrence))
		}
		r := hsSend(t, k, req)
		env := hsWantErr(t, r, 400, "validation_error")
		if c.message != "" && env.Message != c.message {
			t.Errorf("%s: message %q, want %q", c.name, env.Message, c.message)
		}
	}
	// Path and existence.
	hsWantField(t, hsAgentDo(t, k, a, "POST", "/v0/executions/abc/steps", valid, run.lease, nil), "id")
	hsWantErr(t, hsAgentDo(t, k, a, "POST", "/v0/executions/"+hsUnknownUUID+"/steps", valid, run.lease, nil), 404, "not_found")

	hsUnchanged(t, k, run.id, before, "a refused submit")
	hsUnchanged(t, k, run2.id, before2, "a refused submit")

	// Accepted edge values.
	d := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"`+strings.Repeat("t", 1024)+`"}`)
	if d.Decision != "proceed" {
		t.Fatalf("target of 1,024 bytes: %+v", d)
	}
	upper := kt.Lease{DispatchID: strings.ToUpper(did), Attempt: run.lease.Attempt, Occurrence: 0}
	r := hsAgentDo(t, k, a, "POST", path, []byte(`{"kind":"local","target":"upper"}`), upper, nil)
	if r.Status != 200 || r.Header.Get("Rebuno-Step-Occurrence") != "0" {
		t.Fatalf("upper-case dispatch id: %s", r)
	}
	// A lone surrogate is canonicalised as U+FFFD (docs/protocol/identity.md §5 D11), and stored as sent.
	d = a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"s","args":{"x":"\ud800"}}`)
	raw := hsRawMembers(t, k.Must(200, k.Do("GET", path+"/"+d.StepID, nil, nil)).Body)
	if string(raw["args"]) != `{"x":"\ud800"}` || string(raw["args_hash"]) != `"6587c929901f4acd02e8476793f8299067f1e19c0afc2201a6b4be08b18de706"` {
		t.Fatalf("lone surrogate: args %s hash %s", raw["args"], raw["args_hash"])
	}
	// A huge exponent is kept and hashed as its literal text.
	d = a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"e","args":1e999999}`)
	raw = hsRawMembers(t, k.Must(200, k.Do("GET", path+"/"+d.StepID, nil, nil)).Body)
	if string(raw["args"]) != `1e999999` || string(raw["args_hash"]) != `"`+hsSHA256("1e999999")+`"` {
		t.Fatalf("1e999999: args %s hash %s", raw["args"], raw["args_hash"])
	}
	// Null fields are absent fields.
	d = a.Submit(run.id, run.lease, `{"kind":"tool_call","target":null,"args":null,"idempotency":null,"resources":null}`)
	if d.Decision != "proceed" {
		t.Fatalf("null fields: %+v", d)
	}
	step := k.Must(200, k.Do("GET", path+"/"+d.StepID, nil, nil)).Map(t)
	if step["target"] != "" || step["args"] != nil || step["idempotency"] != "safe_to_retry" || step["args_hash"] != hsSHA256("null") {
		t.Fatalf("null fields step %v", step)
	}
	// Submit to a terminal execution is the execution_terminal decision.
	k.Must(204, k.Do("POST", "/v0/executions/"+run2.id+"/cancel", nil, nil))
	before2 = hsSnapshot(t, k, run2.id)
	r = hsAgentDo(t, k, a, "POST", "/v0/executions/"+run2.id+"/steps", valid, run2.lease, nil)
	if r.Status != 200 || strings.TrimSpace(string(r.Body)) != `{"decision":"execution_terminal"}` {
		t.Fatalf("submit on a terminal execution: %s", r)
	}
	hsUnchanged(t, k, run2.id, before2, "a submit on a terminal execution")
}

// TestBadInputAgentWrites covers the other agent routes (docs/protocol/http.md §10 rows 11–16):
// dispatch headers on each, body rules, step id syntax, stream deltas and
// the heartbeat's empty body.
func TestBadInputAgentWrites(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("writer", "")
	run := hsStartRun(t, k, a, `null`)
	run2 := hsStartRun(t, k, a, `null`)
	sid := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"t"}`).StepID
	sid2 := a.Submit(run2.id, run2.lease, `{"kind":"tool_call","target":"t2"}`).StepID
	ex := "/v0/executions/" + run.id
	did := run.lease.DispatchID
	before := hsSnapshot(t, k, run.id)
	before2 := hsSnapshot(t, k, run2.id)

	// Dispatch headers on every agent write.
	writes := []struct{ name, path, body string }{
		{"submit", ex + "/steps", `{"kind":"tool_call","target":"new"}`},
		{"step complete", ex + "/steps/" + sid + "/complete", `{"result":1}`},
		{"step fail", ex + "/steps/" + sid + "/fail", `{"error":1}`},
		{"stream delta", ex + "/steps/" + sid + "/stream", `{"seq":1,"data":"x"}`},
		{"heartbeat", ex + "/heartbeat", ``},
		{"complete", ex + "/complete", `{"output":1}`},
		{"fail", ex + "/fail", `{"error":"x"}`},
	}
	headers := []struct {
		name    string
		sig     hsSig
		message string
	}{
		{"dispatch id abc", hsSig{dispatchID: "abc", attempt: "1"}, ""},
		{"dispatch id braced", hsSig{dispatchID: "{" + did + "}", attempt: "1"}, ""},
		{"dispatch id urn", hsSig{dispatchID: "urn:uuid:" + did, attempt: "1"}, ""},
		{"dispatch id 32 hex", hsSig{dispatchID: strings.ReplaceAll(did, "-", ""), attempt: "1"}, ""},
		{"dispatch id unknown", hsSig{dispatchID: hsUnknownUUID, attempt: "1"}, "validation error: unknown dispatch_id"},
		{"dispatch id foreign", hsSig{dispatchID: run2.lease.DispatchID, attempt: "1"}, "validation error: dispatch_id belongs to another execution"},
		{"attempt 0", hsSig{dispatchID: did, attempt: "0"}, ""},
		{"attempt -1", hsSig{dispatchID: did, attempt: "-1"}, ""},
		{"attempt x", hsSig{dispatchID: did, attempt: "x"}, ""},
		{"attempt above current", hsSig{dispatchID: did, attempt: "2"}, "validation error: dispatch attempt is ahead of the kernel"},
	}
	for _, w := range writes {
		for _, h := range headers {
			r := hsSend(t, k, hsAgentReq(t, k, a, "POST", w.path, []byte(w.body), h.sig))
			if r.Status != 400 || r.Code() != "validation_error" {
				t.Errorf("%s, %s: want 400, got %s", w.name, h.name, r)
				continue
			}
			if env := hsWantErr(t, r, 400, "validation_error"); h.message != "" && env.Message != h.message {
				t.Errorf("%s, %s: message %q, want %q", w.name, h.name, env.Message, h.message)
			}
		}
	}
	hsUnchanged(t, k, run.id, before, "a write with bad dispatch headers")

	// Body and path rules.
	lease := run.lease
	post := func(path, body string) *kt.Response {
		return hsAgentDo(t, k, a, "POST", path, []byte(body), lease, nil)
	}
	upperSID := strings.ToUpper(sid)
	type bad struct {
		name, path, body string
		status           int
		code, field, msg string
	}
	cases := []bad{
		{name: "step complete, empty body", path: ex + "/steps/" + sid + "/complete", body: ""},
		{name: "step complete, unknown field", path: ex + "/steps/" + sid + "/complete", body: `{"result":1,"output":2}`, field: "output"},
		{name: "step complete, duplicate in result", path: ex + "/steps/" + sid + "/complete", body: `{"result":{"a":1,"a":2}}`},
		{name: "step complete, captures not an array", path: ex + "/steps/" + sid + "/complete", body: `{"result":1,"captures":{}}`},
		{name: "step complete, upper-case step id", path: ex + "/steps/" + upperSID + "/complete", body: `{"result":1}`, field: "step_id"},
		{name: "step complete, 63-char step id", path: ex + "/steps/" + sid[:63] + "/complete", body: `{"result":1}`, field: "step_id"},
		{name: "step complete, 65-char step id", path: ex + "/steps/" + sid + "0/complete", body: `{"result":1}`, field: "step_id"},
		{name: "step complete, non-hex step id", path: ex + "/steps/" + "g" + sid[1:] + "/complete", body: `{"result":1}`, field: "step_id"},
		{name: "step complete, step of another execution", path: ex + "/steps/" + sid2 + "/complete", body: `{"result":1}`, status: 404, code: "not_found"},
		{name: "step complete, unknown step", path: ex + "/steps/" + strings.Repeat("0", 64) + "/complete", body: `{"result":1}`, status: 404, code: "not_found"},
		{name: "step complete, unknown execution", path: "/v0/executions/" + hsUnknownUUID + "/steps/" + sid + "/complete", body: `{"result":1}`, status: 404, code: "not_found"},
		{name: "step fail, empty body", path: ex + "/steps/" + sid + "/fail", body: ""},
		{name: "step fail, NaN", path: ex + "/steps/" + sid + "/fail", body: `{"error":NaN}`},
		{name: "step fail, result field", path: ex + "/steps/" + sid + "/fail", body: `{"result":1}`, field: "result"},
		{name: "step fail, upper-case step id", path: ex + "/steps/" + upperSID + "/fail", body: `{}`, field: "step_id"},
		{name: "complete, empty body", path: ex + "/complete", body: ""},
		{name: "complete, unknown field", path: ex + "/complete", body: `{"output":1,"result":2}`, field: "result"},
		{name: "complete, array", path: ex + "/complete", body: `[]`},
		{name: "complete, unknown execution", path: "/v0/executions/" + hsUnknownUUID + "/complete", body: `{}`, status: 404, code: "not_found"},
		{name: "fail, empty body", path: ex + "/fail", body: ""},
		{name: "fail, error an object", path: ex + "/fail", body: `{"error":{}}`, field: "error"},
		{name: "fail, error a number", path: ex + "/fail", body: `{"error":5}`, field: "error"},
		{name: "fail, error an array", path: ex + "/fail", body: `{"error":["x"]}`, field: "error"},
		{name: "fail, unknown field", path: ex + "/fail", body: `{"reason":"x"}`, field: "reason"},
		{name: "heartbeat with {}", path: ex + "/heartbeat", body: `{}`, msg: "validation error: heartbeat body must be empty"},
		{name: "heartbeat with a space", path: ex + "/heartbeat", body: ` `, msg: "validation error: heartbeat body must be empty"},
		{name: "heartbeat, malformed id", path: "/v0/executions/abc/heartbeat", body: ``, field: "id"},
		{name: "heartbeat, unknown execution", path: "/v0/executions/" + hsUnknownUUID + "/heartbeat", body: ``, status: 404, code: "not_found"},
		{name: "delta, seq a string", path: ex + "/steps/" + sid + "/stream", body: `{"seq":"1","data":"x"}`, field: "seq"},
		{name: "delta, seq a fraction", path: ex + "/steps/" + sid + "/stream", body: `{"seq":1.5,"data":"x"}`, field: "seq"},
		{name: "delta, seq 1.0", path: ex + "/steps/" + sid + "/stream", body: `{"seq":1.0,"data":"x"}`, field: "seq"},
		{name: "delta, seq with exponent", path: ex + "/steps/" + sid + "/stream", body: `{"seq":1e2,"data":"x"}`, field: "seq"},
		{name: "delta, seq negative", path: ex + "/steps/" + sid + "/stream", body: `{"seq":-1,"data":"x"}`, field: "seq"},
		{name: "delta, seq 2^63", path: ex + "/steps/" + sid + "/stream", body: `{"seq":9223372036854775808,"data":"x"}`, field: "seq"},
		{name: "delta, seq missing", path: ex + "/steps/" + sid + "/stream", body: `{"data":"x"}`, field: "seq"},
		{name: "delta, data missing", path: ex + "/steps/" + sid + "/stream", body: `{"seq":1}`, field: "data"},
		{name: "delta, data a number", path: ex + "/steps/" + sid + "/stream", body: `{"seq":1,"data":5}`, field: "data"},
		{name: "delta, data 7001 bytes", path: ex + "/steps/" + sid + "/stream", body: `{"seq":1,"data":"` + strings.Repeat("d", 7001) + `"}`, field: "data"},
		{name: "delta, data 7002 bytes in 3501 characters", path: ex + "/steps/" + sid + "/stream", body: `{"seq":1,"data":"` + strings.Repeat("é", 3501) + `"}`, field: "data"},
		{name: "delta, unknown field", path: ex + "/steps/" + sid + "/stream", body: `{"seq":1,"data":"x","step_id":"s"}`, field: "step_id"},
		{name: "delta, upper-case step id", path: ex + "/steps/" + upperSID + "/stream", body: `{"seq":1,"data":"x"}`, field: "step_id"},
		{name: "delta, step of another execution", path: ex + "/steps/" + sid2 + "/stream", body: `{"seq":1,"data":"x"}`, status: 404, code: "not_found"},
		{name: "delta, unknown execution", path: "/v0/executions/" + hsUnknownUUID + "/steps/" + sid + "/stream", body: `{"seq":1,"data":"x"}`, status: 404, code: "not_found"},
	}
	for _, c := range cases {
		r := post(c.path, c.body)
		status, code := c.status, c.code
		if status == 0 {
			status, code = 400, "validation_error"
		}
		if r.Status != status || r.Code() != code {
			t.Errorf("%s: want %d %s, got %.300s", c.name, status, code, r)
			continue
		}
		env := hsWantErr(t, r, status, code)
		if c.field != "" {
			if f, _ := env.Details["field"].(string); f != c.field {
				t.Errorf("%s: details.field %q, want %q", c.name, f, c.field)
			}
		}
		if c.msg != "" && env.Message != c.msg {
			t.Errorf("%s: message %q, want %q", c.name, env.Message, c.msg)
		}
	}
	hsUnchanged(t, k, run.id, before, "a refused agent write")
	hsUnchanged(t, k, run2.id, before2, "a refused agent write")

	// Deltas at the limit are accepted and write nothing.
	for _, body := range []string{
		`{"seq":0,"data":""}`,
		`{"seq":9223372036854775807,"data":"x"}`,
		`{"seq":2,"data":"` + strings.Repeat("d", 7000) + `"}`,
		`{"seq":3,"data":"` + strings.Repeat("é", 3500) + `"}`,
	} {
		k.Must(204, post(ex+"/steps/"+sid+"/stream", body))
	}
	// A heartbeat with an empty body is accepted.
	k.Must(204, post(ex+"/heartbeat", ""))
	hsUnchanged(t, k, run.id, before, "a stream delta or heartbeat")

	// A failure reason over 8,192 bytes is truncated at a character boundary.
	reason := "a" + strings.Repeat("é", 5000)
	k.Must(204, post(ex+"/fail", `{"error":"`+reason+`"}`))
	e := k.Execution(run.id)
	if e["status"] != "failed" || e["failure_reason"] != reason[:1+2*4095] {
		t.Fatalf("truncated reason: %d bytes", len(fmt.Sprint(e["failure_reason"])))
	}
	// Once terminal: complete is 409 execution_terminal, and nothing is written.
	before = hsSnapshot(t, k, run.id)
	hsWantErr(t, post(ex+"/complete", `{}`), 409, "execution_terminal")
	hsWantErr(t, post(ex+"/heartbeat", ``), 409, "execution_terminal")
	if r := post(ex+"/steps/"+sid+"/complete", `{"result":1}`); r.Status != 200 || strings.TrimSpace(string(r.Body)) != `{"decision":"execution_terminal"}` {
		t.Fatalf("step complete on a terminal execution: %s", r)
	}
	hsUnchanged(t, k, run.id, before, "a write to a terminal execution")
}

// TestBadInputPathsAndQueries covers docs/protocol/http.md §6 and §7: path parameters, query
// parameters, unknown routes, wrong methods and oversized headers.
func TestBadInputPathsAndQueries(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("pather", "")
	run := hsStartRun(t, k, a, `null`)
	sid := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"t"}`).StepID
	before := hsSnapshot(t, k, run.id)
	id := run.id

	// Malformed execution ids on every route that names one.
	badIDs := []string{
		"abc", "%7B" + id + "%7D", "urn:uuid:" + id, strings.ReplaceAll(id, "-", ""), id + "0", id[:35],
		"%20" + id, "g" + id[1:], "0190a5b00-000-7000-8000-000000000001", "00000000-0000-0000-0000-0000000000000",
	}
	suffixes := []struct{ method, suffix string }{
		{"GET", ""}, {"GET", "/events"}, {"GET", "/steps"}, {"GET", "/steps/" + sid}, {"GET", "/previous"}, {"POST", "/cancel"},
	}
	for _, bad := range badIDs {
		for _, s := range suffixes {
			r := k.Do(s.method, "/v0/executions/"+bad+s.suffix, nil, nil)
			if r.Status != 400 || r.Code() != "validation_error" {
				t.Errorf("%s /v0/executions/%s%s: want 400, got %s", s.method, bad, s.suffix, r)
			}
		}
	}
	// Upper case is accepted and lowercased.
	upper := strings.ToUpper(id)
	if e := k.Must(200, k.Do("GET", "/v0/executions/"+upper, nil, nil)).Map(t); e["id"] != id {
		t.Fatalf("upper-case id read back as %v", e["id"])
	}
	for _, s := range []string{"/events", "/steps", "/steps/" + sid, "/previous"} {
		k.Must(200, k.Do("GET", "/v0/executions/"+upper+s, nil, nil))
	}
	// Malformed step ids.
	for _, bad := range []string{strings.ToUpper(sid), sid[:63], sid + "a", "g" + sid[1:], "-"} {
		hsWantField(t, k.Do("GET", "/v0/executions/"+id+"/steps/"+bad, nil, nil), "step_id")
	}
	// Malformed agent ids.
	for _, bad := range []string{"-x", ".x", "a%20b", "%C3%A9", strings.Repeat("x", 129)} {
		hsWantErr(t, k.Do("GET", "/v0/agents/"+bad, nil, nil), 400, "validation_error")
		hsWantErr(t, k.Do("DELETE", "/v0/agents/"+bad, nil, nil), 400, "validation_error")
		hsWantErr(t, k.Do("POST", "/v0/policies/"+bad, []byte(`{}`), nil), 400, "validation_error")
		hsWantErr(t, hsAgentDo(t, k, a, "PUT", "/v0/agents/"+bad+"/metadata", []byte(`{}`), kt.Lease{Occurrence: -1}, nil), 400, "validation_error")
	}
	k.Must(200, k.Do("GET", "/v0/agents/"+"pather", nil, nil))

	// Query parameters.
	queries := []struct{ path, field string }{
		{"/v0/executions?limit=-1", "limit"},
		{"/v0/executions?limit=abc", "limit"},
		{"/v0/executions?limit=1.5", "limit"},
		{"/v0/executions?limit=1e2", "limit"},
		{"/v0/executions?limit=%2B5", "limit"},
		{"/v0/executions?limit=%205", "limit"},
		{"/v0/executions?limit=0x10", "limit"},
		{"/v0/executions?limit=99999999999999999999", "limit"},
		{"/v0/executions?limit=1&limit=2", "limit"},
		{"/v0/executions?limit=5&limit=5", "limit"},
		{"/v0/executions?status=bogus", "status"},
		{"/v0/executions?status=RUNNING", "status"},
		{"/v0/executions?status=terminal", "status"},
		{"/v0/executions?status=running&status=failed", "status"},
		{"/v0/executions?cursor=abc", "cursor"},
		{"/v0/executions?cursor=" + strings.ReplaceAll(id, "-", ""), "cursor"},
		{"/v0/executions?cursor=%7B" + id + "%7D", "cursor"},
		{"/v0/executions?cursor=" + id + "&cursor=" + id, "cursor"},
		{"/v0/executions?agent_id=" + strings.Repeat("x", 129), "agent_id"},
		{"/v0/executions?agent_id=a&agent_id=b", "agent_id"},
		{"/v0/executions/" + id + "/events?after_seq=-5", "after_seq"},
		{"/v0/executions/" + id + "/events?after_seq=1.0", "after_seq"},
		{"/v0/executions/" + id + "/events?after_seq=abc", "after_seq"},
		{"/v0/executions/" + id + "/events?after_seq=1e3", "after_seq"},
		{"/v0/executions/" + id + "/events?after_seq=99999999999999999999", "after_seq"},
		{"/v0/executions/" + id + "/events?after_seq=1&after_seq=2", "after_seq"},
		{"/v0/executions/" + id + "/events?limit=-1", "limit"},
		{"/v0/executions/" + id + "/events?limit=abc", "limit"},
		{"/v0/executions/" + id + "/events?limit=2&limit=2", "limit"},
		{"/v0/executions/" + id + "/steps?status=bogus", "status"},
		{"/v0/executions/" + id + "/steps?status=TERMINAL", "status"},
		{"/v0/executions/" + id + "/steps?status=running", "status"},
		{"/v0/executions/" + id + "/steps?status=terminal&status=pending", "status"},
	}
	for _, q := range queries {
		r := k.Do("GET", q.path, nil, nil)
		if r.Status != 400 || r.Code() != "validation_error" {
			t.Errorf("%s: want 400, got %s", q.path, r)
			continue
		}
		hsWantField(t, r, q.field)
	}
	// Unknown parameters are ignored; empty values are absence.
	for _, p := range []string{
		"/v0/executions/" + id + "?verbose=1", "/v0/executions/" + id + "/events?x=1&after_seq=", "/v0/executions/" + id + "/steps?status=&x=y",
		"/v0/executions?cursor=&status=&agent_id=&limit=", "/v0/agents?limit=-1", "/v0/health?x=1",
	} {
		k.Must(200, k.Do("GET", p, nil, nil))
	}

	// Unknown routes: JSON 404, never a redirect.
	for _, p := range []string{
		"/v0/nothing", "/v0/executions/", "/v0/executions/" + id + "/", "/v0/executions/" + id + "/steps/", "/v0/executions/" + id + "/steps/" + sid + "/",
		"/v0/agents/", "/v0/health/", "/v0", "/", "/v0//health", "/V0/health", "/v0/executions/" + id + "/events/", "/metrics/", "/v1/health",
	} {
		req, _ := http.NewRequest("GET", k.URL+p, nil)
		r := hsSendWith(t, hsNoRedirect, req)
		env := hsWantErr(t, r, 404, "not_found")
		if env.Message != "route not found" {
			t.Errorf("GET %s: message %q", p, env.Message)
		}
	}
	for _, p := range []string{"/v0/executions/" + id + "/suspend", "/v0/executions/" + id + "/resume", "/v0/executions/" + id + "/fork-points"} {
		env := hsWantErr(t, k.Do("POST", p, []byte(`{}`), nil), 404, "not_found")
		if env.Message != "route not found" {
			t.Errorf("POST %s: message %q", p, env.Message)
		}
	}

	// Wrong methods: 405 with Allow.
	ex := "/v0/executions/" + id
	methods := []struct{ method, path, allow string }{
		{"DELETE", "/v0/executions", "GET, POST"},
		{"PUT", ex, "GET"},
		{"POST", ex, "GET"},
		{"GET", ex + "/cancel", "POST"},
		{"PUT", ex + "/steps", "GET, POST"},
		{"POST", ex + "/steps/" + sid, "GET"},
		{"GET", ex + "/steps/" + sid + "/complete", "POST"},
		{"GET", ex + "/heartbeat", "POST"},
		{"GET", ex + "/complete", "POST"},
		{"POST", ex + "/events", "GET"},
		{"POST", ex + "/previous", "GET"},
		{"PATCH", "/v0/agents/x", "DELETE, GET"},
		{"PUT", "/v0/agents", "GET, POST"},
		{"GET", "/v0/agents/x/metadata", "PUT"},
		{"GET", "/v0/policies/x", "POST"},
		{"POST", "/v0/health", "GET"},
		{"DELETE", "/v0/ready", "GET"},
		{"POST", "/metrics", "GET"},
		{"PUT", "/v0/keys", "GET, POST"},
		{"POST", "/v0/keys/x", "DELETE"},
	}
	for _, m := range methods {
		r := k.Do(m.method, m.path, nil, nil)
		if r.Status != 405 || r.Code() != "method_not_allowed" {
			t.Errorf("%s %s: want 405, got %s", m.method, m.path, r)
			continue
		}
		hsWantErr(t, r, 405, "method_not_allowed")
		if got := r.Header.Get("Allow"); got != m.allow {
			t.Errorf("%s %s: Allow %q, want %q", m.method, m.path, got, m.allow)
		}
	}

	// Headers: 60 KiB pass, over 64 KiB is 431 from the HTTP server.
	k.Must(200, k.Do("GET", "/v0/health", nil, map[string]string{"X-Padding": strings.Repeat("p", 60<<10)}))
	for _, h := range []map[string]string{
		{"X-Padding": strings.Repeat("p", 80<<10)},
		{"X-A": strings.Repeat("a", 40<<10), "X-B": strings.Repeat("b", 40<<10)},
	} {
		r := k.Do("GET", "/v0/health", nil, h)
		if r.Status != 431 {
			t.Fatalf("oversized headers: %s", r)
		}
	}
	resp, _ := hsRaw(t, k, []byte("POST /v0/executions HTTP/1.1\r\nHost: localhost\r\nX-Big: "+strings.Repeat("b", 70<<10)+"\r\nContent-Length: 20\r\n\r\n{\"agent_id\":\"pather\"}"))
	if resp.StatusCode != 431 {
		t.Fatalf("oversized headers on create: %d", resp.StatusCode)
	}

	hsUnchanged(t, k, run.id, before, "a refused path, query or method")
	if ids := hsExecutionIDs(t, k, ""); len(ids) != 1 {
		t.Fatalf("executions %v", ids)
	}
	// The upper-case cancel is the same execution.
	k.Must(204, k.Do("POST", "/v0/executions/"+upper+"/cancel", nil, nil))
	if e := k.Execution(id); e["status"] != "cancelled" {
		t.Fatalf("upper-case cancel: %v", e)
	}
}

// TestBadInputRegister covers agent registration (docs/protocol/governance.md §4.2): every refusal is
// 400 and leaves the agents as they were; the edges are accepted.
func TestBadInputRegister(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{Args: []string{"--dispatch-timeout", "30s"}})
	k.Must(201, k.Do("POST", "/v0/agents", []byte(`{"id":"keeper","webhook_url":"http://127.0.0.1:9/h","secret":"s3cret-s3cret-s3cret"}`), nil))
	agents := hsAgentsBody(t, k)
	body := func(id, url, secret, extra string) string {
		return `{"id":` + id + `,"webhook_url":` + url + `,"secret":` + secret + extra + `}`
	}
	q := strconv.Quote
	okURL, okSecret := q("http://127.0.0.1:9/h"), q("secret")
	cases := []struct{ name, body, field string }{
		{"id empty", body(q(""), okURL, okSecret, ""), "id"},
		{"id leading dash", body(q("-x"), okURL, okSecret, ""), "id"},
		{"id leading dot", body(q(".x"), okURL, okSecret, ""), "id"},
		{"id with a space", body(q("a b"), okURL, okSecret, ""), "id"},
		{"id with a slash", body(q("a/b"), okURL, okSecret, ""), "id"},
		{"id non-ASCII", body(q("caf\u00e9"), okURL, okSecret, ""), "id"},
		{"id 129 bytes", body(q(strings.Repeat("i", 129)), okURL, okSecret, ""), "id"},
		{"id a number", body("5", okURL, okSecret, ""), "id"},
		{"id missing", `{"webhook_url":"http://127.0.0.1:9/h","secret":"s"}`, "id"},
		{"relative URL", body(q("x"), q("/hook"), okSecret, ""), "webhook_url"},
		{"bare word URL", body(q("x"), q("hook"), okSecret, ""), "webhook_url"},
		{"ftp URL", body(q("x"), q("ftp://127.0.0.1/hook"), okSecret, ""), "webhook_url"},
		{"mailto URL", body(q("x"), q("mailto:a@b.c"), okSecret, ""), "webhook_url"},
		{"URL without host", body(q("x"), q("http:///hook"), okSecret, ""), "webhook_url"},
		{"URL of 2,049 bytes", body(q("x"), q("http://h/"+strings.Repeat("u", 2049-9)), okSecret, ""), "webhook_url"},
		{"URL a number", body(q("x"), "1", okSecret, ""), "webhook_url"},
		{"URL missing", `{"id":"x","secret":"s"}`, "webhook_url"},
		{"secret empty", body(q("x"), okURL, q(""), ""), "secret"},
		{"secret of 1,025 bytes", body(q("x"), okURL, q(strings.Repeat("s", 1025)), ""), "secret"},
		{"secret missing", `{"id":"x","webhook_url":"http://127.0.0.1:9/h"}`, "secret"},
		{"secret a number", body(q("x"), okURL, "12345", ""), "secret"},
		{"lease 0", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":0`), "lease_timeout_seconds"},
		{"lease -1", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":-1`), "lease_timeout_seconds"},
		{"lease 86401", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":86401`), "lease_timeout_seconds"},
		{"lease equal to the dispatch timeout", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":30`), "lease_timeout_seconds"},
		{"lease below the dispatch timeout", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":1`), "lease_timeout_seconds"},
		{"lease a fraction", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":60.5`), "lease_timeout_seconds"},
		{"lease 60.0", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":60.0`), "lease_timeout_seconds"},
		{"lease with exponent", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":6e1`), "lease_timeout_seconds"},
		{"lease a string", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":"60"`), "lease_timeout_seconds"},
		{"lease 2^63", body(q("x"), okURL, okSecret, `,"lease_timeout_seconds":9223372036854775808`), "lease_timeout_seconds"},
		{"unknown field", body(q("x"), okURL, okSecret, `,"policy_bundle":""`), "policy_bundle"},
		{"unknown field description", body(q("x"), okURL, okSecret, `,"description":"d"`), "description"},
	}
	for _, c := range cases {
		r := k.Do("POST", "/v0/agents", []byte(c.body), nil)
		if r.Status != 400 || r.Code() != "validation_error" {
			t.Errorf("%s: want 400, got %s", c.name, r)
			continue
		}
		hsWantField(t, r, c.field)
	}
	// An update refused keeps the agent as it was.
	r := k.Do("POST", "/v0/agents", []byte(body(q("keeper"), q("ftp://x/y"), okSecret, "")), nil)
	hsWantErr(t, r, 400, "validation_error")
	if got := hsAgentsBody(t, k); got != agents {
		t.Fatalf("refused registrations changed the agents:\n%s\n%s", agents, got)
	}

	// Edges accepted.
	accepted := []struct{ name, body string }{
		{"id of 128 bytes", body(q("A"+strings.Repeat("z", 127)), okURL, okSecret, "")},
		{"id with . _ -", body(q("a.b_c-d"), okURL, okSecret, "")},
		{"https URL with port, query and fragment", body(q("u1"), q("https://example.com:8443/a/b?c=d#e"), okSecret, "")},
		{"URL of 2,048 bytes", body(q("u2"), q("http://h/"+strings.Repeat("u", 2048-9)), okSecret, "")},
		{"secret of 1,024 bytes", body(q("s1"), okURL, q(strings.Repeat("s", 1024)), "")},
		{"secret of 1 byte", body(q("s2"), okURL, q("s"), "")},
		{"lease 31", body(q("l1"), okURL, okSecret, `,"lease_timeout_seconds":31`)},
		{"lease 86400", body(q("l2"), okURL, okSecret, `,"lease_timeout_seconds":86400`)},
		{"lease null", body(q("l3"), okURL, okSecret, `,"lease_timeout_seconds":null`)},
	}
	for _, c := range accepted {
		if r := k.Do("POST", "/v0/agents", []byte(c.body), nil); r.Status != 201 {
			t.Errorf("%s: want 201, got %.300s", c.name, r)
		}
	}
	var list []map[string]any
	k.Must(200, k.Do("GET", "/v0/agents", nil, nil)).JSON(t, &list)
	if len(list) != 1+len(accepted) {
		t.Fatalf("%d agents, want %d", len(list), 1+len(accepted))
	}
}

// TestBadInputMetadata covers PUT /v0/agents/{id}/metadata (docs/protocol/governance.md §4.4): another
// agent's metadata is 403, over-long or wrongly typed fields are 400, and
// none of them changes the agent.
func TestBadInputMetadata(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("meta-a", "")
	b := k.NewAgent("meta-b", "")
	put := func(who *kt.Agent, target, body string) *kt.Response {
		return hsAgentDo(t, k, who, "PUT", "/v0/agents/"+target+"/metadata", []byte(body), kt.Lease{Occurrence: -1}, nil)
	}
	k.Must(204, put(a, "meta-a", `{"description":"kept","input_schema":{"type":"object"}}`))
	agents := hsAgentsBody(t, k)

	env := hsWantErr(t, put(a, "meta-b", `{"description":"hijack"}`), 403, "forbidden")
	if env.Message != "forbidden" {
		t.Fatalf("message %q", env.Message)
	}
	hsWantErr(t, put(b, "meta-a", `{}`), 403, "forbidden")
	// An agent that does not exist is still someone else's name.
	hsWantErr(t, put(a, "nobody", `{}`), 403, "forbidden")
	bigSchema := `{"d":"` + strings.Repeat("s", 256<<10) + `"}`
	cases := []struct{ name, body, field string }{
		{"description of 4,097 bytes", `{"description":"` + strings.Repeat("d", 4097) + `"}`, "description"},
		{"description a number", `{"description":5}`, "description"},
		{"input_schema an array", `{"input_schema":[]}`, "input_schema"},
		{"input_schema a string", `{"input_schema":"{}"}`, "input_schema"},
		{"input_schema a number", `{"input_schema":1}`, "input_schema"},
		{"input_schema a bool", `{"input_schema":true}`, "input_schema"},
		{"output_schema an array", `{"output_schema":[{}]}`, "output_schema"},
		{"input_schema over 256 KiB", `{"input_schema":` + bigSchema + `}`, "input_schema"},
		{"output_schema over 256 KiB", `{"output_schema":` + bigSchema + `}`, "output_schema"},
		{"unknown field", `{"description":"d","name":"n"}`, "name"},
		{"duplicate key in a schema", `{"input_schema":{"type":"object","type":"array"}}`, ""},
		{"empty body", ``, ""},
	}
	for _, c := range cases {
		r := put(a, "meta-a", c.body)
		if r.Status != 400 || r.Code() != "validation_error" {
			t.Errorf("%s: want 400, got %.300s", c.name, r)
			continue
		}
		if c.field != "" {
			hsWantField(t, r, c.field)
		}
	}
	if got := hsAgentsBody(t, k); got != agents {
		t.Fatalf("refused metadata changed the agents:\n%s\n%s", agents, got)
	}
	// Edges accepted: 4,096 bytes of description, a schema of exactly 256 KiB.
	desc := strings.Repeat("é", 2048)
	schema := `{"d":"` + strings.Repeat("s", 256<<10-8) + `"}`
	k.Must(204, put(a, "meta-a", `{"description":"`+desc+`","output_schema":`+schema+`}`))
	raw := hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/agents/meta-a", nil, nil)).Body)
	if string(raw["description"]) != `"`+desc+`"` || string(raw["output_schema"]) != schema {
		t.Fatalf("metadata at the limits not stored")
	}
	if _, ok := raw["input_schema"]; ok {
		t.Fatalf("input_schema not cleared by a body without it")
	}
	// Dispatch headers are ignored on this route, even malformed ones.
	r := hsSend(t, k, hsAgentReq(t, k, a, "PUT", "/v0/agents/meta-a/metadata", []byte(`{}`), hsSig{dispatchID: "abc", attempt: "x"}))
	k.Must(204, r)
}
