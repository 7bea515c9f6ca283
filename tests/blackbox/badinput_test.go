package blackbox

// Black-box tests of docs/protocol/errors.md §4 (bad input), in scope for the HTTP surface: every
// refused input is answered with its status and envelope code, and leaves the
// store as it was, which each test proves by reading the affected state back.

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

const hsUnknownUUID = "0190a5b0-0000-7000-8000-0000deadbeef"

func hsPtr(s string) *string { return &s }

// hsNest returns n opening and n closing brackets around v.
func hsNest(n int, v string) string {
	return strings.Repeat("[", n) + v + strings.Repeat("]", n)
}

// TestBadInputBodySize covers docs/protocol/http.md §3 with --max-body-bytes 65536: a declared
// length over the limit is refused before the body is read, a chunked body as
// soon as it crosses the limit, on bearer and HMAC routes alike (the body
// limit comes before authentication), and a body of exactly the limit is
// accepted.
func TestBadInputBodySize(t *testing.T) {
	t.Parallel()
	const limit = 65536
	k := kt.Start(t, kt.Options{Args: []string{"--max-body-bytes", strconv.Itoa(limit)}})
	a := k.NewAgent("big", "")
	run := hsStartRun(t, k, a, `null`)
	before := hsSnapshot(t, k, run.id)
	agents := hsAgentsBody(t, k)
	count := len(hsExecutionIDs(t, k, ""))

	// sized returns a create body of exactly n bytes.
	sized := func(n int) []byte {
		head, tail := `{"agent_id":"big","input":"`, `"}`
		return []byte(head + strings.Repeat("a", n-len(head)-len(tail)) + tail)
	}
	chunked := func(path string, body []byte) *http.Request {
		req, err := http.NewRequest("POST", k.URL+path, io.NopCloser(bytes.NewReader(body)))
		if err != nil {
			t.Fatal(err)
		}
		req.ContentLength = -1
		k.Authorize(req)
		return req
	}

	// Declared length one byte over.
	hsWantErr(t, k.Do("POST", "/v0/executions", sized(limit+1), nil), 413, "payload_too_large")
	// Streamed (chunked) one byte over.
	hsWantErr(t, hsSend(t, k, chunked("/v0/executions", sized(limit+1))), 413, "payload_too_large")
	// Agent register and policy load are bodies too.
	hsWantErr(t, k.Do("POST", "/v0/agents", bytes.Repeat([]byte(" "), limit+1), nil), 413, "payload_too_large")
	hsWantErr(t, k.Do("POST", "/v0/policies/big", bytes.Repeat([]byte(" "), limit+1), nil), 413, "payload_too_large")

	// A huge declared length is answered without waiting for the body: the
	// raw request sends a few bytes and then nothing.
	resp, body := hsRaw(t, k, []byte("POST /v0/executions HTTP/1.1\r\nHost: localhost\r\nContent-Type: application/json\r\n"+
		"Content-Length: 100000000\r\n\r\n{\"agent_id\":\"big\""))
	if resp.StatusCode != 413 || !strings.Contains(string(body), `"code":"payload_too_large"`) {
		t.Fatalf("declared 100 MB: %d %s", resp.StatusCode, body)
	}
	// A chunked body is answered as soon as it crosses the limit; the
	// terminating chunk is never sent.
	var raw bytes.Buffer
	raw.WriteString("POST /v0/executions HTTP/1.1\r\nHost: localhost\r\nTransfer-Encoding: chunked\r\n\r\n")
	first := `{"agent_id":"big","input":"`
	fmt.Fprintf(&raw, "%x\r\n%s\r\n", len(first), first)
	fmt.Fprintf(&raw, "%x\r\n%s\r\n", limit, strings.Repeat("a", limit))
	resp, body = hsRaw(t, k, raw.Bytes())
	if resp.StatusCode != 413 || !strings.Contains(string(body), `"code":"payload_too_large"`) {
		t.Fatalf("unterminated chunked body: %d %s", resp.StatusCode, body)
	}

	// HMAC routes read the body to sign it; the limit applies first, so an
	// unsigned oversized request is 413, not 401.
	ex := "/v0/executions/" + run.id
	for _, path := range []string{ex + "/steps", ex + "/heartbeat", ex + "/complete", ex + "/fail", "/v0/agents/big/metadata"} {
		method := "POST"
		if strings.HasSuffix(path, "/metadata") {
			method = "PUT"
		}
		hsWantErr(t, k.Do(method, path, bytes.Repeat([]byte(" "), limit+1), nil), 413, "payload_too_large")
		req := chunked(path, bytes.Repeat([]byte(" "), limit+1))
		req.Method = method
		hsWantErr(t, hsSend(t, k, req), 413, "payload_too_large")
	}
	// A correctly signed oversized submit is 413 as well.
	big := []byte(`{"kind":"tool_call","target":"t","args":"` + strings.Repeat("x", limit) + `"}`)
	hsWantErr(t, hsSend(t, k, hsAgentReq(t, k, a, "POST", ex+"/steps", big, hsLeaseSig(run.lease))), 413, "payload_too_large")

	hsUnchanged(t, k, run.id, before, "an oversized body")
	if got := hsAgentsBody(t, k); got != agents {
		t.Fatalf("agents changed: %s", got)
	}
	if n := len(hsExecutionIDs(t, k, "")); n != count {
		t.Fatalf("oversized creates made %d executions", n-count)
	}

	// Exactly at the limit: accepted, declared or chunked.
	k.Must(201, k.Do("POST", "/v0/executions", sized(limit), nil))
	k.Must(201, hsSend(t, k, chunked("/v0/executions", sized(limit))))
	if n := len(hsExecutionIDs(t, k, "")); n != count+2 {
		t.Fatalf("%d executions after two creates at the limit, want %d", n, count+2)
	}
}

// hsJSONRoute is a JSON route and how to call it.
type hsJSONRoute struct {
	name   string
	method string
	path   string
	agent  *kt.Agent // non-nil: HMAC, signed by this agent with lease
	lease  kt.Lease
}

func (r hsJSONRoute) do(t *testing.T, k *kt.Kernel, body []byte) *kt.Response {
	t.Helper()
	if r.agent == nil {
		return k.Do(r.method, r.path, body, nil)
	}
	return hsSend(t, k, hsAgentReq(t, k, r.agent, r.method, r.path, body, hsLeaseSig(r.lease)))
}

// TestBadInputJSONSyntax sends bodies that break the rules of docs/protocol/http.md §5 to every
// JSON route and expects 400 validation_error and no write.
func TestBadInputJSONSyntax(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{ManualClock: true})
	a := k.NewAgent("syntax", "")
	run := hsStartRun(t, k, a, `null`)
	sid := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"t"}`).StepID
	ex := "/v0/executions/" + run.id
	routes := []hsJSONRoute{
		{name: "create", method: "POST", path: "/v0/executions"},
		{name: "register", method: "POST", path: "/v0/agents"},
		{name: "policy", method: "POST", path: "/v0/policies/syntax"},
		{name: "test clock", method: "POST", path: "/v0/test/clock"},
		{name: "submit", method: "POST", path: ex + "/steps", agent: a, lease: run.lease},
		{name: "step complete", method: "POST", path: ex + "/steps/" + sid + "/complete", agent: a, lease: run.lease},
		{name: "step fail", method: "POST", path: ex + "/steps/" + sid + "/fail", agent: a, lease: run.lease},
		{name: "stream delta", method: "POST", path: ex + "/steps/" + sid + "/stream", agent: a, lease: run.lease},
		{name: "complete", method: "POST", path: ex + "/complete", agent: a, lease: run.lease},
		{name: "fail", method: "POST", path: ex + "/fail", agent: a, lease: run.lease},
		{name: "metadata", method: "PUT", path: "/v0/agents/syntax/metadata", agent: a},
	}
	bodies := []struct{ name, body string }{
		{"empty", ""},
		{"whitespace only", " \r\n\t "},
		{"truncated", `{"a":`},
		{"unterminated string", `{"a":"x}`},
		{"single quotes", `{'a':1}`},
		{"unquoted key", `{a:1}`},
		{"trailing comma", `{"a":1,}`},
		{"leading zero", `{"a":01}`},
		{"bare dot number", `{"a":.5}`},
		{"NaN", `{"a":NaN}`},
		{"Infinity", `{"a":Infinity}`},
		{"-Infinity", `{"a":-Infinity}`},
		{"undefined", `{"a":undefined}`},
		{"comment", `{"a":1 /* c */}`},
		{"trailing bytes", `{} x`},
		{"two values", `{}{}`},
		{"trailing NUL", "{}\x00"},
		{"byte order mark", "\xef\xbb\xbf{}"},
		{"array", `[]`},
		{"string", `"x"`},
		{"null", `null`},
		{"number", `1`},
		{"true", `true`},
		{"invalid UTF-8 in a value", "{\"a\":\"\xff\"}"},
		{"invalid UTF-8 in a key", "{\"\xc3\":1}"},
		{"overlong UTF-8", "{\"a\":\"\xc0\xaf\"}"},
		{"UTF-8 encoded surrogate", "{\"a\":\"\xed\xa0\x80\"}"},
		{"raw control character in a string", "{\"a\":\"x\x01\"}"},
		{"bad escape", `{"a":"\x"}`},
		{"duplicate key", `{"a":1,"a":1}`},
		{"duplicate key after decoding", `{"a":1,"\u0061":1}`},
		{"nesting 129", `{"a":` + hsNest(128, "") + `}`},
	}
	before := hsSnapshot(t, k, run.id)
	agents := hsAgentsBody(t, k)
	for _, rt := range routes {
		for _, b := range bodies {
			r := rt.do(t, k, []byte(b.body))
			if r.Status != 400 || r.Code() != "validation_error" {
				t.Errorf("%s, %s: want 400 validation_error, got %s", rt.name, b.name, r)
			}
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	hsUnchanged(t, k, run.id, before, "a malformed body")
	if got := hsAgentsBody(t, k); got != agents {
		t.Fatalf("agents changed: %s", got)
	}
	if ids := hsExecutionIDs(t, k, ""); len(ids) != 1 {
		t.Fatalf("malformed creates made executions: %v", ids)
	}
	// The clock did not move: an advance of 1s now lands one second after start.
	var c1, c2 struct{ Now string }
	k.Must(200, k.Do("POST", "/v0/test/clock", []byte(`{"advance":"1s"}`), nil)).JSON(t, &c1)
	k.Must(200, k.Do("POST", "/v0/test/clock", []byte(`{"advance":"1s"}`), nil)).JSON(t, &c2)
	t1, t2 := hsWantTime(t, "now", c1.Now), hsWantTime(t, "now", c2.Now)
	if d := t2.Sub(t1); d.Seconds() < 0.999 || d.Seconds() > 1.5 {
		t.Fatalf("manual clock advanced by %v", d)
	}
}

// TestBadInputCreate covers the create body (docs/protocol/executions.md §2): each refused body names
// its cause, nothing is created, and the edge values just inside the limits
// are accepted and returned verbatim.
func TestBadInputCreate(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	k.NewAgent("maker", "")
	const sessionMsg = "validation error: session: sessions are not supported by this kernel"
	const spawnMsg = "validation error: spawned_by: subagents are not supported by this kernel"
	long := func(n int) string { return strings.Repeat("v", n) }
	cases := []struct {
		name, body  string
		header      *string // Idempotency-Key, when non-nil
		status      int
		code, field string
		message     string
	}{
		{name: "NaN input", body: `{"agent_id":"maker","input":NaN}`},
		{name: "Infinity input", body: `{"agent_id":"maker","input":[Infinity]}`},
		{name: "trailing bytes", body: `{"agent_id":"maker"}]`},
		{name: "unknown field", body: `{"agent_id":"maker","labels":{"a":"b"}}`, field: "labels"},
		{name: "unknown field null", body: `{"agent_id":"maker","metadata":null}`, field: "metadata"},
		{name: "duplicate agent_id", body: `{"agent_id":"maker","agent_id":"maker"}`},
		{name: "duplicate key in input", body: `{"agent_id":"maker","input":{"k":1,"k":1}}`},
		{name: "duplicate key deep in input", body: `{"agent_id":"maker","input":[{"a":{"k":1,"j":2,"k":3}}]}`},
		{name: "invalid UTF-8 in input", body: "{\"agent_id\":\"maker\",\"input\":\"caf\xe9\"}"},
		{name: "nesting 129 in input", body: `{"agent_id":"maker","input":` + hsNest(128, "1") + `}`},
		{name: "agent_id a number", body: `{"agent_id":5}`, field: "agent_id"},
		{name: "agent_id empty", body: `{"agent_id":""}`, field: "agent_id"},
		{name: "agent_id missing", body: `{"input":1}`, field: "agent_id"},
		{name: "agent_id null", body: `{"agent_id":null}`, field: "agent_id"},
		{name: "agent_version a number", body: `{"agent_id":"maker","agent_version":7}`, field: "agent_version"},
		{name: "agent_version 257 bytes", body: `{"agent_id":"maker","agent_version":"` + long(257) + `"}`, field: "agent_version"},
		{name: "on_behalf_of 257 bytes", body: `{"agent_id":"maker","on_behalf_of":"` + long(257) + `"}`, field: "on_behalf_of"},
		{name: "on_behalf_of an object", body: `{"agent_id":"maker","on_behalf_of":{}}`, field: "on_behalf_of"},
		{name: "session", body: `{"agent_id":"maker","session":"s-1"}`, message: sessionMsg},
		{name: "session an object", body: `{"agent_id":"maker","session":{"id":"s"}}`},
		{name: "spawned_by", body: `{"agent_id":"maker","spawned_by":"0190a5b0-0000-7000-8000-000000000001"}`, message: spawnMsg},
		{name: "spawned_by empty", body: `{"agent_id":"maker","spawned_by":""}`, message: spawnMsg},
		{name: "spawned_by object", body: `{"agent_id":"maker","spawned_by":{}}`, message: spawnMsg},
		{name: "parent malformed", body: `{"agent_id":"maker","parent_execution_id":"abc"}`, field: "parent_execution_id"},
		{name: "parent a number", body: `{"agent_id":"maker","parent_execution_id":1}`, field: "parent_execution_id"},
		{name: "body key empty", body: `{"agent_id":"maker","idempotency_key":""}`},
		{name: "body key 129 bytes", body: `{"agent_id":"maker","idempotency_key":"` + long(129) + `"}`},
		{name: "body key with a space", body: `{"agent_id":"maker","idempotency_key":"a b"}`},
		{name: "body key with a control", body: `{"agent_id":"maker","idempotency_key":"a\u0001b"}`},
		{name: "body key non-ASCII", body: `{"agent_id":"maker","idempotency_key":"caf\u00e9"}`},
		{name: "body key DEL", body: `{"agent_id":"maker","idempotency_key":"a\u007f"}`},
		{name: "body key a number", body: `{"agent_id":"maker","idempotency_key":12}`},
		{name: "header key empty", body: `{"agent_id":"maker"}`, header: hsPtr("")},
		{name: "header key 129 bytes", body: `{"agent_id":"maker"}`, header: hsPtr(long(129))},
		{name: "header key with a space", body: `{"agent_id":"maker"}`, header: hsPtr("a b")},
		{name: "header key non-ASCII", body: `{"agent_id":"maker"}`, header: hsPtr("caf\xc3\xa9")},
		{name: "header and body keys differ", body: `{"agent_id":"maker","idempotency_key":"k-1"}`, header: hsPtr("k-2")},
		{name: "unknown agent", body: `{"agent_id":"nobody"}`, status: 404, code: "not_found", message: "agent not found"},
		{name: "unknown agent and parent", body: `{"agent_id":"nobody","parent_execution_id":"` + hsUnknownUUID + `"}`, status: 404, code: "not_found", message: "agent not found"},
	}
	for _, c := range cases {
		var h map[string]string
		if c.header != nil {
			h = map[string]string{"Idempotency-Key": *c.header}
		}
		r := k.Do("POST", "/v0/executions", []byte(c.body), h)
		status, code := c.status, c.code
		if status == 0 {
			status, code = 400, "validation_error"
		}
		if r.Status != status || r.Code() != code {
			t.Errorf("%s: want %d %s, got %s", c.name, status, code, r)
			continue
		}
		env := hsWantErr(t, r, status, code)
		if c.field != "" {
			if f, _ := env.Details["field"].(string); f != c.field {
				t.Errorf("%s: details.field %q, want %q", c.name, f, c.field)
			}
		}
		if c.message != "" && env.Message != c.message {
			t.Errorf("%s: message %q, want %q", c.name, env.Message, c.message)
		}
	}
	// A repeated Idempotency-Key header, even with equal values (docs/protocol/http.md §6).
	req := hsPlain(t, k, "POST", "/v0/executions", `{"agent_id":"maker"}`)
	k.Authorize(req)
	req.Header.Add("Idempotency-Key", "dup-1")
	req.Header.Add("Idempotency-Key", "dup-1")
	hsWantErr(t, hsSend(t, k, req), 400, "validation_error")
	if ids := hsExecutionIDs(t, k, ""); len(ids) != 0 {
		t.Fatalf("refused creates made executions: %v", ids)
	}

	// Accepted edge values, returned verbatim.
	accepted := []struct{ name, body, input string }{
		{"nesting 128 in total", `{"agent_id":"maker","input":` + hsNest(127, "1") + `}`, hsNest(127, "1")},
		{"escaped lone surrogate", `{"agent_id":"maker","input":"\ud800"}`, `"\ud800"`},
		{"lone low surrogate in a key", `{"agent_id":"maker","input":{"\udc00x":1}}`, `{"\udc00x":1}`},
		{"huge exponent", `{"agent_id":"maker","input":{"x":1e999999,"y":-1E-999999}}`, `{"x":1e999999,"y":-1E-999999}`},
		{"huge integer", `{"agent_id":"maker","input":123456789012345678901234567890}`, `123456789012345678901234567890`},
		{"agent_version 256 bytes", `{"agent_id":"maker","agent_version":"` + long(256) + `","input":1}`, `1`},
		{"on_behalf_of 256 bytes", `{"agent_id":"maker","on_behalf_of":"` + long(256) + `","input":2}`, `2`},
		{"session empty", `{"agent_id":"maker","session":"","input":3}`, `3`},
		{"session null, spawned_by null", `{"agent_id":"maker","session":null,"spawned_by":null,"input":4}`, `4`},
		{"null optional fields", `{"agent_id":"maker","agent_version":null,"on_behalf_of":null,"parent_execution_id":null,"idempotency_key":null,"input":5}`, `5`},
		{"key of 128 printable bytes", `{"agent_id":"maker","idempotency_key":"` + strings.Repeat("~!", 64) + `","input":6}`, `6`},
		{"whitespace around the body", " \n{\"agent_id\":\"maker\",\"input\": 7 }\r\n\t", `7`},
	}
	for _, c := range accepted {
		r := k.Do("POST", "/v0/executions", []byte(c.body), nil)
		if r.Status != 201 {
			t.Errorf("%s: want 201, got %s", c.name, r)
			continue
		}
		var id string
		json.Unmarshal(hsRawMembers(t, r.Body)["id"], &id)
		for _, b := range [][]byte{r.Body, k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil)).Body} {
			if got := string(hsRawMembers(t, b)["input"]); got != c.input {
				t.Errorf("%s: input %q, want %q", c.name, got, c.input)
			}
		}
	}
	if ids := hsExecutionIDs(t, k, ""); len(ids) != len(accepted) {
		t.Fatalf("%d executions, want %d", len(ids), len(accepted))
	}
}

// TestBadInputHugeVerbatim stores values of several MiB (within the default
// 10 MiB body limit) and reads them back byte for byte; the args hash is the
// hash of the canonical text.
func TestBadInputHugeVerbatim(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("huge", "")
	var in strings.Builder
	in.WriteString("{ \"rows\" : [")
	for i := 0; in.Len() < 3<<20; i++ {
		if i > 0 {
			in.WriteString(" ,\n ")
		}
		fmt.Fprintf(&in, `{"n": %d.50, "e": 1E+2, "s": "caf\u00e9 \/ %d"}`, i, i)
	}
	in.WriteString("] }")
	input := in.String()
	r := k.Must(201, k.Do("POST", "/v0/executions", []byte(`{"agent_id":"huge","input":`+input+`}`), nil))
	id := r.Map(t)["id"].(string)
	if got := string(hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/executions/"+id, nil, nil)).Body)["input"]); got != input {
		t.Fatalf("huge input not verbatim (%d bytes back, %d sent)", len(got), len(input))
	}
	run := hsStartRunFor(t, k, a, id)

	// Args already in canonical form, so their hash is the hash of the text.
	args := `{"blob":"` + strings.Repeat("x", 2<<20) + `","n":[1.0,1E2,-0]}`
	d := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"big","args":`+args+`}`)
	if d.Decision != "proceed" {
		t.Fatalf("huge args: %+v", d)
	}
	result := `[` + strings.Repeat(`"r" , `, 300000) + `0.000]`
	if got := a.Complete(run.id, d.StepID, run.lease, result); got.Decision != "recorded" {
		t.Fatalf("huge result: %+v", got)
	}
	raw := hsRawMembers(t, k.Must(200, k.Do("GET", "/v0/executions/"+run.id+"/steps/"+d.StepID, nil, nil)).Body)
	if string(raw["args"]) != args || string(raw["result"]) != result {
		t.Fatalf("huge args/result not verbatim")
	}
	if string(raw["args_hash"]) != `"`+hsSHA256(args)+`"` {
		t.Fatalf("args_hash %s, want sha256 of the canonical text", raw["args_hash"])
	}
	// Replaying the step returns the result verbatim too.
	replay := hsAgentDo(t, k, a, "POST", "/v0/executions/"+run.id+"/steps",
		[]byte(`{"kind":"tool_call","target":"big","args":`+args+`}`), kt.Lease{DispatchID: run.lease.DispatchID, Attempt: run.lease.Attempt, Occurrence: 0}, nil)
	if replay.Status != 200 || string(hsRawMembers(t, replay.Body)["result"]) != result {
		t.Fatalf("replay of the huge step: %d %.100s", replay.Status, replay.Body)
	}
}

// TestBadInputParent covers parent_execution_id: unknown 404, another
// agent's 400, not completed 409 conflict, with nothing created.
func TestBadInputParent(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("heir", "")
	b := k.NewAgent("outsider", "")
	running := hsStartRun(t, k, a, `null`)
	foreign := hsStartRun(t, k, b, `null`)
	k.Must(204, b.Request("POST", "/v0/executions/"+foreign.id+"/complete", []byte(`{"output":1}`), foreign.lease))
	cancelled := k.CreateExecution("heir", `null`)
	k.Must(204, k.Do("POST", "/v0/executions/"+cancelled+"/cancel", nil, nil))
	count := len(hsExecutionIDs(t, k, ""))

	create := func(parent string) *kt.Response {
		return k.Do("POST", "/v0/executions", []byte(`{"agent_id":"heir","parent_execution_id":"`+parent+`"}`), nil)
	}
	if env := hsWantErr(t, create(hsUnknownUUID), 404, "not_found"); !strings.Contains(env.Message, "not found") {
		t.Fatalf("unknown parent message %q", env.Message)
	}
	hsWantField(t, create(foreign.id), "parent_execution_id")
	for _, p := range []string{running.id, cancelled} {
		env := hsWantErr(t, create(p), 409, "conflict")
		if env.Message != "conflict: parent execution is not completed" {
			t.Fatalf("message %q", env.Message)
		}
	}
	if n := len(hsExecutionIDs(t, k, "")); n != count {
		t.Fatalf("refused creates made %d executions", n-count)
	}
	// A completed parent named in upper case is accepted and shown lowercase.
	k.Must(204, a.Request("POST", "/v0/executions/"+running.id+"/complete", []byte(`{"output":2}`), running.lease))
	r := k.Must(201, create(strings.ToUpper(running.id)))
	if got := r.Map(t)["parent_execution_id"]; got != running.id {
		t.Fatalf("parent_execution_id %v, want %s", got, running.id)
	}
}

// TestBadInputIdempotency covers the create Idempotency-Key (docs/protocol/executions.md §2): a retry
// with the same body returns the same execution and creates nothing, a
// different body is 409, and the key may move between header and body.
func TestBadInputIdempotency(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	k.NewAgent("idem", "")
	post := func(body, header string) *kt.Response {
		var h map[string]string
		if header != "" {
			h = map[string]string{"Idempotency-Key": header}
		}
		return k.Do("POST", "/v0/executions", []byte(body), h)
	}
	first := k.Must(201, post(`{"agent_id":"idem","input":{"a":1,"b":[1.0]}}`, "key-1")).Map(t)
	id := first["id"].(string)
	if first["idempotency_key"] != "key-1" {
		t.Fatalf("idempotency_key not shown: %v", first)
	}
	hsWaitEvent(t, k, id, "dispatch.acked")
	before := hsSnapshot(t, k, id)

	same := []struct{ name, body, header string }{
		{"identical", `{"agent_id":"idem","input":{"a":1,"b":[1.0]}}`, "key-1"},
		{"reordered and spaced", ` { "input" : { "b" : [1.0], "a" : 1 } , "agent_id" : "idem" } `, "key-1"},
		{"key moved to the body", `{"agent_id":"idem","input":{"a":1,"b":[1.0]},"idempotency_key":"key-1"}`, ""},
		{"key in both", `{"idempotency_key":"key-1","agent_id":"idem","input":{"a":1,"b":[1.0]}}`, "key-1"},
	}
	for _, c := range same {
		r := post(c.body, c.header)
		if r.Status != 201 {
			t.Fatalf("%s: want 201, got %s", c.name, r)
		}
		if got := r.Map(t)["id"]; got != id {
			t.Fatalf("%s: got execution %v, want %s", c.name, got, id)
		}
	}
	hsUnchanged(t, k, id, before, "an idempotent retry")

	different := []struct{ name, body, header string }{
		{"other input", `{"agent_id":"idem","input":{"a":2,"b":[1.0]}}`, "key-1"},
		{"number spelled differently", `{"agent_id":"idem","input":{"a":1,"b":[1]}}`, "key-1"},
		{"extra field", `{"agent_id":"idem","input":{"a":1,"b":[1.0]},"agent_version":"v2"}`, "key-1"},
		{"body key", `{"agent_id":"idem","input":null,"idempotency_key":"key-1"}`, ""},
	}
	for _, c := range different {
		env := hsWantErr(t, post(c.body, c.header), 409, "conflict")
		if env.Message != "conflict: idempotency key reused with a different body" {
			t.Fatalf("%s: message %q", c.name, env.Message)
		}
	}
	hsUnchanged(t, k, id, before, "an idempotency conflict")
	if ids := hsExecutionIDs(t, k, ""); len(ids) != 1 {
		t.Fatalf("executions %v, want only %s", ids, id)
	}

	// A key first used in the body, retried in the header.
	second := k.Must(201, post(`{"agent_id":"idem","idempotency_key":"key-2"}`, "")).Map(t)
	again := k.Must(201, post(`{"agent_id":"idem"}`, "key-2")).Map(t)
	if second["id"] != again["id"] || second["id"] == id {
		t.Fatalf("key moved from body to header: %v vs %v", second["id"], again["id"])
	}
	// Keys are case-sensitive strings: another spelling is another key.
	third := k.Must(201, post(`{"agent_id":"idem"}`, "KEY-2")).Map(t)
	if third["id"] == second["id"] {
		t.Fatalf("KEY-2 returned the execution of key-2")
	}
	// The retry answers with the execution in its current state.
	k.Must(204, k.Do("POST", "/v0/executions/"+id+"/cancel", nil, nil))
	if got := k.Must(201, post(`{"agent_id":"idem","input":{"a":1,"b":[1.0]}}`, "key-1")).Map(t); got["id"] != id || got["status"] != "cancelled" {
		t.Fatalf("retry after cancel: %v", got)
	}
	if ids := hsExecutionIDs(t, k, ""); len(ids) != 3 {
		t.Fatalf("%d executions, want 3", len(ids))
	}
}
