package blackbox

// Black-box tests of authentication and authorisation (docs/protocol/auth.md) and the auth rows
// of docs/protocol/errors.md §4: bearer tokens, HMAC request signatures (v1 and legacy), dual
// routes, agent scope, and the dispatch headers that --require-v1-signatures
// (the default) makes mandatory.

import (
	"bytes"
	"net/http"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/auth"
	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

// legacyOn turns legacy body-only signatures back on, with the dispatch
// headers optional: the mode for agents written against older kernels.
const legacyOn = "--require-v1-signatures=false"

// hsWantUnauthorized asserts the fixed 401 of docs/protocol/auth.md §3: code and message are
// both "unauthorized" and nothing else is said.
func hsWantUnauthorized(t *testing.T, what string, r *kt.Response) {
	t.Helper()
	if r.Status != 401 {
		t.Errorf("%s: want 401, got %.300s", what, r)
		return
	}
	env := hsWantErr(t, r, 401, "unauthorized")
	if env.Message != "unauthorized" || env.Details != nil {
		t.Errorf("%s: the 401 says more than \"unauthorized\": %s", what, r.Body)
	}
}

// hsPlain builds a request without any credentials.
func hsPlain(t *testing.T, k *kt.Kernel, method, path, body string) *http.Request {
	t.Helper()
	req, err := http.NewRequest(method, k.URL+path, bytes.NewReader([]byte(body)))
	if err != nil {
		t.Fatal(err)
	}
	return req
}

// TestAuthBearer covers docs/protocol/auth.md §2 with a token configured: every malformed,
// missing or wrong Authorization is 401 on every bearer and dual route and
// writes nothing; the scheme word is case-insensitive, the token is not.
func TestAuthBearer(t *testing.T) {
	t.Parallel()
	const token = "tok-Secret-0123456789"
	k := kt.Start(t, kt.Options{Token: token})
	a := k.NewAgent("guarded", "")
	run := hsStartRun(t, k, a, `null`)
	sid := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"t"}`).StepID
	before := hsSnapshot(t, k, run.id)
	agents := hsAgentsBody(t, k)
	ex := "/v0/executions/" + run.id

	routes := []struct{ method, path, body string }{
		{"POST", "/v0/executions", `{"agent_id":"guarded"}`},
		{"GET", "/v0/executions", ""},
		{"POST", ex + "/cancel", ""},
		{"POST", "/v0/agents", `{"id":"intruder","webhook_url":"http://127.0.0.1:9/h","secret":"s"}`},
		{"GET", "/v0/agents", ""},
		{"GET", "/v0/agents/guarded", ""},
		{"DELETE", "/v0/agents/guarded", ""},
		{"POST", "/v0/policies/guarded", `{"bundle":""}`},
		{"POST", "/v0/keys", `{"name":"intruder","role":"admin"}`},
		{"GET", "/v0/keys", ""},
		{"DELETE", "/v0/keys/someone", ""},
		{"GET", "/v0/audit", ""},
		{"GET", "/v0/whoami", ""},
		{"GET", ex, ""},
		{"GET", ex + "/events", ""},
		{"GET", ex + "/steps", ""},
		{"GET", ex + "/steps/" + sid, ""},
		{"GET", ex + "/previous", ""},
		{"GET", ex + "/events/stream", ""},
		{"GET", ex + "/stream", ""},
	}
	bad := []struct {
		name  string
		value *string // nil: no header
	}{
		{"missing", nil},
		{"empty", hsPtr("")},
		{"scheme only", hsPtr("Bearer")},
		{"scheme and space", hsPtr("Bearer ")},
		{"two spaces", hsPtr("Bearer  " + token)},
		{"tab", hsPtr("Bearer\t" + token)},
		{"no scheme", hsPtr(token)},
		{"Basic scheme", hsPtr("Basic " + token)},
		{"Token scheme", hsPtr("Token " + token)},
		{"scheme glued", hsPtr("Bearer" + token)},
		{"wrong token", hsPtr("Bearer wrong-token")},
		{"wrong-case token", hsPtr("Bearer " + strings.ToUpper(token))},
		{"wrong-case token 2", hsPtr("Bearer " + strings.ToLower(token))},
		{"prefix of the token", hsPtr("Bearer " + token[:len(token)-1])},
		{"token with a suffix", hsPtr("Bearer " + token + "x")},
		{"token twice", hsPtr("Bearer " + token + " " + token)},
		{"quoted token", hsPtr(`Bearer "` + token + `"`)},
	}
	for _, rt := range routes {
		for _, b := range bad {
			req := hsPlain(t, k, rt.method, rt.path, rt.body)
			if b.value != nil {
				req.Header.Set("Authorization", *b.value)
			}
			hsWantUnauthorized(t, rt.method+" "+rt.path+" with "+b.name+" Authorization", hsSend(t, k, req))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	hsUnchanged(t, k, run.id, before, "an unauthenticated request")
	if got := hsAgentsBody(t, k); got != agents {
		t.Fatalf("agents changed: %s", got)
	}
	if ids := hsExecutionIDs(t, k, ""); len(ids) != 1 {
		t.Fatalf("unauthenticated creates made executions: %v", ids)
	}

	// The scheme word in any case, with the exact token.
	for _, scheme := range []string{"Bearer", "bearer", "BEARER", "bEaReR"} {
		req := hsPlain(t, k, "GET", "/v0/executions", "")
		req.Header.Set("Authorization", scheme+" "+token)
		if r := hsSend(t, k, req); r.Status != 200 {
			t.Fatalf("scheme %q: %s", scheme, r)
		}
	}

	// Route, method and body size are decided before authentication (docs/protocol/http.md §8).
	hsWantErr(t, hsSend(t, k, hsPlain(t, k, "DELETE", "/v0/executions", "")), 405, "method_not_allowed")
	hsWantErr(t, hsSend(t, k, hsPlain(t, k, "GET", "/v0/nowhere", "")), 404, "not_found")
	resp, body := hsRaw(t, k, []byte("POST /v0/executions HTTP/1.1\r\nHost: localhost\r\nContent-Length: 20000000\r\n\r\n{"))
	if resp.StatusCode != 413 || !strings.Contains(string(body), "payload_too_large") {
		t.Fatalf("oversized unauthenticated body: %d %s", resp.StatusCode, body)
	}
	// Authentication comes before syntax: a malformed id without a token is 401.
	hsWantUnauthorized(t, "malformed id without token", hsSend(t, k, hsPlain(t, k, "GET", "/v0/executions/abc", "")))
	// Health, readiness and metrics need nothing.
	for _, p := range []string{"/v0/health", "/v0/ready", "/metrics"} {
		if r := hsSend(t, k, hsPlain(t, k, "GET", p, "")); r.Status != 200 {
			t.Fatalf("%s without token: %s", p, r)
		}
	}

	// A bearer token does not satisfy an HMAC route.
	for _, rt := range []struct{ method, path, body string }{
		{"POST", ex + "/steps", `{"kind":"tool_call","target":"bearer"}`},
		{"POST", ex + "/heartbeat", ""},
		{"POST", ex + "/complete", `{}`},
		{"POST", ex + "/fail", `{}`},
		{"POST", ex + "/steps/" + sid + "/complete", `{"result":1}`},
		{"POST", ex + "/steps/" + sid + "/stream", `{"seq":1,"data":"x"}`},
		{"PUT", "/v0/agents/guarded/metadata", `{}`},
	} {
		hsWantUnauthorized(t, "bearer on "+rt.path, k.Do(rt.method, rt.path, []byte(rt.body), nil))
	}
	hsUnchanged(t, k, run.id, before, "a bearer request on an HMAC route")

	// An agent reads its own execution with HMAC alone, token or not.
	r := hsSend(t, k, hsAgentReq(t, k, a, "GET", ex, nil, hsSig{}))
	if r.Status != 200 || r.Map(t)["id"] != run.id {
		t.Fatalf("agent read with a token configured: %s", r)
	}
}

// TestAuthBearerOff covers docs/protocol/auth.md §2 without a token: bearer routes are open and
// ignore Authorization, but HMAC routes still need a signature.
func TestAuthBearerOff(t *testing.T) {
	t.Parallel()
	kt.SQLiteOnly(t, "rebuno server always requires a bearer token")
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("open", "")
	run := hsStartRun(t, k, a, `null`)
	for _, h := range []string{"", "Bearer whatever", "Basic Zm9vOmJhcg==", "garbage"} {
		req := hsPlain(t, k, "POST", "/v0/executions", `{"agent_id":"open"}`)
		if h != "" {
			req.Header.Set("Authorization", h)
		}
		k.Must(201, hsSend(t, k, req))
		req = hsPlain(t, k, "GET", "/v0/executions/"+run.id, "")
		if h != "" {
			req.Header.Set("Authorization", h)
		}
		k.Must(200, hsSend(t, k, req))
	}
	before := hsSnapshot(t, k, run.id)
	for _, h := range []string{"", "Bearer whatever"} {
		for _, p := range []string{"/steps", "/heartbeat", "/complete"} {
			body := `{}`
			if p == "/heartbeat" {
				body = ""
			} else if p == "/steps" {
				body = `{"kind":"tool_call"}`
			}
			req := hsPlain(t, k, "POST", "/v0/executions/"+run.id+p, body)
			req.Header.Set("Rebuno-Dispatch-Id", run.lease.DispatchID)
			if h != "" {
				req.Header.Set("Authorization", h)
			}
			hsWantUnauthorized(t, "unsigned "+p, hsSend(t, k, req))
		}
	}
	hsUnchanged(t, k, run.id, before, "an unsigned agent request")
}

// TestAuthHMAC covers docs/protocol/auth.md §3 on the HMAC and dual routes: each broken
// signature, timestamp, agent id or signed header is the same bare 401 and
// writes nothing; valid v1 and legacy signatures pass.
func TestAuthHMAC(t *testing.T) {
	t.Parallel()
	// Legacy signatures are refused by default (TestAuthRequireV1); this test
	// covers both formats, so it turns them on as an old agent's operator would.
	k := kt.Start(t, kt.Options{Args: []string{legacyOn}})
	a := k.NewAgent("signer", "")
	b := k.NewAgent("bystander", "")
	run := hsStartRun(t, k, a, `null`)
	run2 := hsStartRun(t, k, a, `null`)
	ex := "/v0/executions/" + run.id
	before := hsSnapshot(t, k, run.id)
	body := []byte(`{"kind":"tool_call","target":"auth"}`)
	sig := hsLeaseSig(run.lease)
	now := time.Now().Unix()
	ts := func(d int64) string { return strconv.FormatInt(now+d, 10) }

	// Each case builds a request for (method, path, body), breaking one thing.
	type builder func(method, path string, body []byte) *http.Request
	valid := func(method, path string, body []byte) *http.Request {
		return hsAgentReq(t, k, a, method, path, body, sig)
	}
	mutate := func(f func(req *http.Request)) builder {
		return func(method, path string, body []byte) *http.Request {
			req := valid(method, path, body)
			f(req)
			return req
		}
	}
	signed := func(s hsSig, f func(req *http.Request)) builder {
		return func(method, path string, body []byte) *http.Request {
			req := hsAgentReq(t, k, a, method, path, body, s)
			if f != nil {
				f(req)
			}
			return req
		}
	}
	withTS := func(v string) hsSig { s := sig; s.ts = v; return s }
	hexOf := func(req *http.Request) string {
		return strings.TrimPrefix(req.Header.Get("Rebuno-Signature"), "v1=")
	}
	cases := []struct {
		name  string
		build builder
	}{
		{"signature missing", mutate(func(r *http.Request) { r.Header.Del("Rebuno-Signature") })},
		{"signature empty", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "") })},
		{"signature repeated", mutate(func(r *http.Request) { r.Header.Add("Rebuno-Signature", r.Header.Get("Rebuno-Signature")) })},
		{"signature repeated, second wrong", mutate(func(r *http.Request) { r.Header.Add("Rebuno-Signature", "v1="+strings.Repeat("0", 64)) })},
		{"signature without prefix", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", hexOf(r)) })},
		{"prefix v2=", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "v2="+hexOf(r)) })},
		{"prefix V1=", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "V1="+hexOf(r)) })},
		{"prefix with a space", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "v1= "+hexOf(r)) })},
		{"v1 MAC under sha256=", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "sha256="+hexOf(r)) })},
		{"uppercase hex", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "v1="+strings.ToUpper(hexOf(r))) })},
		{"63 hex digits", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "v1="+hexOf(r)[:63]) })},
		{"65 hex digits", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "v1="+hexOf(r)+"0") })},
		{"non-hex digit", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Signature", "v1=g"+hexOf(r)[1:]) })},
		{"base64 MAC", mutate(func(r *http.Request) {
			r.Header.Set("Rebuno-Signature", "v1=3q2+7w==3q2+7w==3q2+7w==3q2+7w==3q2+7w==3q2+7w==3q2+7w==3q2+7w")
		})},
		{"signed with another secret", signed(hsSig{dispatchID: sig.dispatchID, attempt: sig.attempt, secret: "not-the-secret"}, nil)},
		{"signed with the other agent's secret", signed(hsSig{dispatchID: sig.dispatchID, attempt: sig.attempt, secret: b.Secret}, nil)},
		{"signed for another body", func(method, path string, body []byte) *http.Request {
			s := withTS(ts(0))
			req := hsAgentReq(t, k, a, method, path, body, s)
			other := hsAgentReq(t, k, a, method, path, append(append([]byte{}, body...), ' '), s)
			req.Header.Set("Rebuno-Signature", other.Header.Get("Rebuno-Signature"))
			return req
		}},
		{"signed for another path", func(method, path string, body []byte) *http.Request {
			s := withTS(ts(0))
			req := hsAgentReq(t, k, a, method, path, body, s)
			other := hsAgentReq(t, k, a, method, strings.Replace(path, run.id, run2.id, 1), body, s)
			req.Header.Set("Rebuno-Signature", other.Header.Get("Rebuno-Signature"))
			return req
		}},
		{"signed for another method", func(method, path string, body []byte) *http.Request {
			s := withTS(ts(0))
			req := hsAgentReq(t, k, a, method, path, body, s)
			other := hsAgentReq(t, k, a, "PUT", path, body, s)
			req.Header.Set("Rebuno-Signature", other.Header.Get("Rebuno-Signature"))
			return req
		}},
		{"query added after signing", func(method, path string, body []byte) *http.Request {
			req := valid(method, path, body)
			req.URL.RawQuery = "x=1"
			return req
		}},
		{"dispatch id changed after signing", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Dispatch-Id", run2.lease.DispatchID) })},
		{"dispatch id removed after signing", mutate(func(r *http.Request) { r.Header.Del("Rebuno-Dispatch-Id") })},
		{"attempt changed after signing", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Dispatch-Attempt", "2") })},
		{"attempt removed after signing", mutate(func(r *http.Request) { r.Header.Del("Rebuno-Dispatch-Attempt") })},
		{"dispatch id repeated", mutate(func(r *http.Request) { r.Header.Add("Rebuno-Dispatch-Id", r.Header.Get("Rebuno-Dispatch-Id")) })},
		{"attempt repeated", mutate(func(r *http.Request) {
			r.Header.Add("Rebuno-Dispatch-Attempt", r.Header.Get("Rebuno-Dispatch-Attempt"))
		})},
		{"timestamp missing", mutate(func(r *http.Request) { r.Header.Del("Rebuno-Timestamp") })},
		{"timestamp empty", signed(withTS(""), func(r *http.Request) { r.Header["Rebuno-Timestamp"] = []string{""} })},
		// One second past the signed timestamp, not past the test's start: a
		// request signed after a second boundary carries that one already.
		{"timestamp changed after signing", mutate(func(r *http.Request) {
			signedAt, err := strconv.ParseInt(r.Header.Get("Rebuno-Timestamp"), 10, 64)
			if err != nil {
				t.Fatal(err)
			}
			r.Header.Set("Rebuno-Timestamp", strconv.FormatInt(signedAt+1, 10))
		})},
		{"timestamp repeated", mutate(func(r *http.Request) { r.Header.Add("Rebuno-Timestamp", r.Header.Get("Rebuno-Timestamp")) })},
		{"timestamp with a letter", signed(withTS(ts(0)[:5]+"a"+ts(0)[6:]), nil)},
		{"timestamp with a plus sign", signed(withTS("+"+ts(0)), nil)},
		{"timestamp negative", signed(withTS("-"+ts(0)), nil)},
		{"timestamp with a fraction", signed(withTS(ts(0)+".0"), nil)},
		{"timestamp in milliseconds", signed(withTS(ts(0)+"000"), nil)},
		{"timestamp overflowing int64", signed(withTS("99999999999999999999999"), nil)},
		{"timestamp 310 s old", signed(withTS(ts(-310)), nil)},
		{"timestamp 310 s ahead", signed(withTS(ts(310)), nil)},
		{"timestamp zero", signed(withTS("0"), nil)},
		{"agent id missing", mutate(func(r *http.Request) { r.Header.Del("Rebuno-Agent-Id") })},
		{"agent id empty", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Agent-Id", "") })},
		{"agent id unknown", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Agent-Id", "ghost") })},
		{"agent id malformed", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Agent-Id", "bad id!") })},
		{"agent id with a leading dash", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Agent-Id", "-signer") })},
		{"agent id of 129 bytes", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Agent-Id", strings.Repeat("s", 129)) })},
		{"agent id repeated", mutate(func(r *http.Request) { r.Header.Add("Rebuno-Agent-Id", "signer") })},
		{"agent id in another case", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Agent-Id", "SIGNER") })},
		{"another agent's id", mutate(func(r *http.Request) { r.Header.Set("Rebuno-Agent-Id", b.ID) })},
		{"legacy MAC of another body", mutate(func(r *http.Request) {
			r.Header.Set("Rebuno-Signature", auth.SignBody([]byte(a.Secret), []byte("other")))
		})},
		{"legacy MAC in upper case", func(method, path string, body []byte) *http.Request {
			req := hsAgentReq(t, k, a, method, path, body, hsSig{dispatchID: sig.dispatchID, attempt: sig.attempt, legacy: true})
			req.Header.Set("Rebuno-Signature", "sha256="+strings.ToUpper(strings.TrimPrefix(req.Header.Get("Rebuno-Signature"), "sha256=")))
			return req
		}},
		{"legacy with a repeated signed header", func(method, path string, body []byte) *http.Request {
			req := hsAgentReq(t, k, a, method, path, body, hsSig{dispatchID: sig.dispatchID, attempt: sig.attempt, legacy: true})
			req.Header.Add("Rebuno-Dispatch-Id", sig.dispatchID)
			return req
		}},
		{"bearer token instead", func(method, path string, body []byte) *http.Request {
			req := hsPlain(t, k, method, path, string(body))
			req.Header.Set("Authorization", "Bearer anything")
			return req
		}},
		{"nothing at all", func(method, path string, body []byte) *http.Request {
			return hsPlain(t, k, method, path, string(body))
		}},
	}
	// Routes: an HMAC write with a body, one without, and a dual read (where
	// any Rebuno-Agent-Id or Rebuno-Signature selects HMAC, docs/protocol/auth.md §4).
	targets := []struct {
		method, path string
		body         []byte
		dual         bool
	}{
		{"POST", ex + "/steps", body, false},
		{"POST", ex + "/heartbeat", nil, false},
		{"GET", ex + "/events", nil, true},
	}
	for _, tg := range targets {
		for _, c := range cases {
			if tg.dual && (c.name == "bearer token instead" || c.name == "nothing at all") {
				continue // without Rebuno headers a dual route is a bearer route (open here)
			}
			hsWantUnauthorized(t, tg.method+" "+tg.path+": "+c.name, hsSend(t, k, c.build(tg.method, tg.path, tg.body)))
		}
	}
	if t.Failed() {
		t.FailNow()
	}
	hsUnchanged(t, k, run.id, before, "a request that failed authentication")

	// The dual route with only a timestamp is a bearer request.
	req := hsPlain(t, k, "GET", ex+"/events", "")
	k.Authorize(req)
	req.Header.Set("Rebuno-Timestamp", ts(0))
	k.Must(200, hsSend(t, k, req))
	// Only the agent id, only the signature: HMAC selected, and refused.
	req = hsPlain(t, k, "GET", ex, "")
	req.Header.Set("Rebuno-Agent-Id", "signer")
	hsWantUnauthorized(t, "dual with agent id only", hsSend(t, k, req))
	req = hsPlain(t, k, "GET", ex, "")
	req.Header.Set("Rebuno-Signature", "v1="+strings.Repeat("0", 64))
	hsWantUnauthorized(t, "dual with signature only", hsSend(t, k, req))

	// Accepted: v1 now, v1 within the window on either side, legacy (turned
	// on), and the signature over a target with a query.
	accept := []struct {
		name string
		s    hsSig
	}{
		{"v1", sig},
		{"v1 290 s old", withTS(ts(-290))},
		{"v1 290 s ahead", withTS(ts(290))},
		{"legacy", hsSig{dispatchID: sig.dispatchID, attempt: sig.attempt, legacy: true}},
	}
	for i, c := range accept {
		b := []byte(`{"kind":"tool_call","target":"ok-` + strconv.Itoa(i) + `"}`)
		r := hsSend(t, k, hsAgentReq(t, k, a, "POST", ex+"/steps", b, c.s))
		if r.Status != 200 || !strings.Contains(string(r.Body), `"decision":"proceed"`) {
			t.Fatalf("%s: %s", c.name, r)
		}
	}
	if steps := k.Must(200, k.Do("GET", ex+"/steps", nil, nil)); strings.Count(string(steps.Body), `"step_id"`) != len(accept) {
		t.Fatalf("steps after the accepted submits: %s", steps.Body)
	}
	r := hsSend(t, k, hsAgentReq(t, k, a, "GET", ex+"/events?after_seq=2&limit=1", nil, hsSig{}))
	if r.Status != 200 || !strings.Contains(string(r.Body), `"event_seq":3`) {
		t.Fatalf("signed GET with a query: %s", r)
	}
	r = hsSend(t, k, hsAgentReq(t, k, a, "GET", ex, nil, hsSig{legacy: true}))
	k.Must(200, r)
	k.Must(204, hsSend(t, k, hsAgentReq(t, k, a, "POST", ex+"/heartbeat", nil, hsSig{legacy: true})))
}

// TestAuthCRLF sends a CR inside a signed header, which docs/protocol/auth.md §3 refuses. The
// Go HTTP server rejects such a request line itself (400, before the kernel
// sees it), and unfolds obsolete line folding; either way the request fails
// and nothing is written.
func TestAuthCRLF(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("crlf", "")
	run := hsStartRun(t, k, a, `null`)
	before := hsSnapshot(t, k, run.id)
	addr := strings.TrimPrefix(k.URL, "http://")
	path := "/v0/executions/" + run.id + "/steps"
	body := `{"kind":"tool_call","target":"crlf"}`
	ts := strconv.FormatInt(time.Now().Unix(), 10)
	attempt := strconv.FormatInt(run.lease.Attempt, 10)

	raw := func(tsValue, dispatchValue string) []byte {
		mac := auth.SignV1([]byte(a.Secret), "POST", path, tsValue, dispatchValue, attempt, []byte(body))
		return []byte("POST " + path + " HTTP/1.1\r\nHost: " + addr + "\r\nContent-Type: application/json\r\n" +
			"Rebuno-Agent-Id: crlf\r\nRebuno-Timestamp: " + tsValue + "\r\n" +
			"Rebuno-Dispatch-Id: " + dispatchValue + "\r\nRebuno-Dispatch-Attempt: " + attempt + "\r\n" +
			"Rebuno-Signature: " + mac + "\r\nContent-Length: " + strconv.Itoa(len(body)) + "\r\n\r\n" + body)
	}
	// Control: the same raw request, well formed, is accepted.
	for name, req := range map[string][]byte{
		"CR in the timestamp":                raw(ts+"\r1", run.lease.DispatchID),
		"CR in the dispatch id":              raw(ts, run.lease.DispatchID+"\r"),
		"folded timestamp (CR LF SP)":        raw(ts+"\r\n 1", run.lease.DispatchID),
		"folded dispatch id (CR LF TAB)":     raw(ts, run.lease.DispatchID+"\r\n\tx"),
		"LF alone in the dispatch id (fold)": raw(ts, run.lease.DispatchID+"\n x"),
	} {
		resp, b := hsRaw(t, k, req)
		if resp.StatusCode != 400 && resp.StatusCode != 401 {
			t.Errorf("%s: want the request refused (400 from the HTTP server or 401), got %d %s", name, resp.StatusCode, b)
		}
		if resp.StatusCode == 401 && !strings.Contains(string(b), `"message":"unauthorized"`) {
			t.Errorf("%s: 401 body %s", name, b)
		}
	}
	hsUnchanged(t, k, run.id, before, "a signed header with CR or LF")
	resp, b := hsRaw(t, k, raw(ts, run.lease.DispatchID))
	if resp.StatusCode != 200 || !strings.Contains(string(b), `"decision":"proceed"`) {
		t.Fatalf("well-formed raw request: %d %s", resp.StatusCode, b)
	}
}

// TestAuthDual covers dual routes and agent scope (docs/protocol/auth.md §4, §5): an agent
// reads its own executions, is refused another agent's with 403 and learns
// 404 for unknown ones; a bearer client reads everything; an agent cannot
// write to another agent's execution.
func TestAuthDual(t *testing.T) {
	t.Parallel()
	const token = "dual-token"
	k := kt.Start(t, kt.Options{Token: token})
	a := k.NewAgent("owner", "")
	b := k.NewAgent("neighbour", "")
	run := hsStartRun(t, k, a, `{"mine":true}`)
	runB := hsStartRun(t, k, b, `null`)
	sid := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"t"}`).StepID
	ex := "/v0/executions/" + run.id
	before := hsSnapshot(t, k, run.id)
	unknown := "/v0/executions/" + hsUnknownUUID

	reads := []string{ex, ex + "/events", ex + "/steps", ex + "/steps/" + sid, ex + "/previous"}
	for _, p := range reads {
		// The owner, by HMAC.
		r := hsSend(t, k, hsAgentReq(t, k, a, "GET", p, nil, hsSig{}))
		if r.Status != 200 {
			t.Fatalf("owner GET %s: %s", p, r)
		}
		hsWantJSON(t, r)
		// Another agent.
		env := hsWantErr(t, hsSend(t, k, hsAgentReq(t, k, b, "GET", p, nil, hsSig{})), 403, "forbidden")
		if env.Message != "forbidden" {
			t.Fatalf("403 message %q", env.Message)
		}
		// A bearer client.
		k.Must(200, k.Do("GET", p, nil, nil))
		// Nobody.
		hsWantUnauthorized(t, "anonymous GET "+p, hsSend(t, k, hsPlain(t, k, "GET", p, "")))
		// Dispatch headers on GETs are ignored, even malformed ones (docs/protocol/http.md §10).
		r = hsSend(t, k, hsAgentReq(t, k, a, "GET", p, nil, hsSig{dispatchID: "abc", attempt: "x"}))
		if r.Status != 200 {
			t.Fatalf("GET %s with malformed dispatch headers: %s", p, r)
		}
	}
	// Unknown executions are 404 for agents and clients; syntax is 400.
	for _, s := range []string{"", "/events", "/steps", "/steps/" + sid, "/previous", "/events/stream", "/stream"} {
		hsWantErr(t, hsSend(t, k, hsAgentReq(t, k, a, "GET", unknown+s, nil, hsSig{})), 404, "not_found")
		hsWantErr(t, k.Do("GET", unknown+s, nil, nil), 404, "not_found")
		hsWantErr(t, hsSend(t, k, hsAgentReq(t, k, a, "GET", "/v0/executions/abc"+s, nil, hsSig{})), 400, "validation_error")
	}
	// The streams refuse another agent before streaming anything.
	for _, s := range []string{"/events/stream", "/stream"} {
		hsWantErr(t, hsSend(t, k, hsAgentReq(t, k, b, "GET", ex+s, nil, hsSig{})), 403, "forbidden")
		hsWantUnauthorized(t, "anonymous "+s, hsSend(t, k, hsPlain(t, k, "GET", ex+s, "")))
	}
	// The list of executions is bearer only: an agent's signature is not a
	// token (the Rebuno headers are ignored there).
	hsWantUnauthorized(t, "agent on the list", hsSend(t, k, hsAgentReq(t, k, a, "GET", "/v0/executions", nil, hsSig{})))

	// Another agent's writes are 403 and change nothing (docs/protocol/auth.md §5).
	lb := hsLeaseSig(runB.lease)
	for _, w := range []struct{ method, path, body string }{
		{"POST", ex + "/steps", `{"kind":"tool_call","target":"intrude"}`},
		{"POST", ex + "/steps/" + sid + "/complete", `{"result":"stolen"}`},
		{"POST", ex + "/steps/" + sid + "/fail", `{"error":"stolen"}`},
		{"POST", ex + "/steps/" + sid + "/stream", `{"seq":1,"data":"x"}`},
		{"POST", ex + "/heartbeat", ``},
		{"POST", ex + "/complete", `{"output":"stolen"}`},
		{"POST", ex + "/fail", `{"error":"stolen"}`},
	} {
		for _, s := range []hsSig{{}, lb, hsLeaseSig(run.lease)} {
			if w.path == ex+"/steps" && s.dispatchID == "" {
				continue // a submit without a dispatch id is 400 before ownership
			}
			r := hsSend(t, k, hsAgentReq(t, k, b, w.method, w.path, []byte(w.body), s))
			env := hsWantErr(t, r, 403, "forbidden")
			if env.Message != "forbidden" {
				t.Fatalf("403 message %q", env.Message)
			}
		}
	}
	hsUnchanged(t, k, run.id, before, "another agent's request")

	// The other agent's own execution is readable by it, and not by the owner.
	k.Must(200, hsSend(t, k, hsAgentReq(t, k, b, "GET", "/v0/executions/"+runB.id, nil, hsSig{})))
	hsWantErr(t, hsSend(t, k, hsAgentReq(t, k, a, "GET", "/v0/executions/"+runB.id, nil, hsSig{})), 403, "forbidden")
	// A step of b's execution named under a's execution is 404 for a.
	sidB := b.Submit(runB.id, runB.lease, `{"kind":"tool_call","target":"b"}`).StepID
	hsWantErr(t, hsSend(t, k, hsAgentReq(t, k, a, "GET", ex+"/steps/"+sidB, nil, hsSig{})), 404, "not_found")
	hsWantErr(t, hsSend(t, k, hsAgentReq(t, k, a, "POST", ex+"/steps/"+sidB+"/complete", []byte(`{"result":1}`), hsLeaseSig(run.lease))), 404, "not_found")
}

// TestAuthRequireV1 runs with the default settings, which require v1
// signatures: legacy signatures are 401, and every agent write must carry
// both dispatch headers (400 without either), while GETs and the metadata
// route ignore them.
func TestAuthRequireV1(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	if !strings.Contains(k.Stderr(), "legacy agent signatures: refused") {
		t.Fatalf("banner does not say legacy signatures are refused:\n%s", k.Stderr())
	}
	a := k.NewAgent("strict", "")
	run := hsStartRun(t, k, a, `null`)
	sid := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"t"}`).StepID
	ex := "/v0/executions/" + run.id
	before := hsSnapshot(t, k, run.id)
	full := hsLeaseSig(run.lease)

	writes := []struct{ name, path, body string }{
		{"submit", ex + "/steps", `{"kind":"tool_call","target":"new"}`},
		{"step complete", ex + "/steps/" + sid + "/complete", `{"result":1}`},
		{"step fail", ex + "/steps/" + sid + "/fail", `{"error":1}`},
		{"stream delta", ex + "/steps/" + sid + "/stream", `{"seq":1,"data":"x"}`},
		{"heartbeat", ex + "/heartbeat", ``},
		{"complete", ex + "/complete", `{"output":1}`},
		{"fail", ex + "/fail", `{"error":"x"}`},
	}
	for _, w := range writes {
		// Legacy signatures are refused, even with both headers.
		legacy := full
		legacy.legacy = true
		hsWantUnauthorized(t, "legacy "+w.name, hsSend(t, k, hsAgentReq(t, k, a, "POST", w.path, []byte(w.body), legacy)))
		// Dispatch id without attempt, attempt without id, neither.
		for _, s := range []hsSig{{dispatchID: full.dispatchID}, {attempt: full.attempt}, {}} {
			r := hsSend(t, k, hsAgentReq(t, k, a, "POST", w.path, []byte(w.body), s))
			env := hsWantErr(t, r, 400, "validation_error")
			if s.dispatchID == "" && env.Message != "validation error: missing dispatch_id" {
				t.Errorf("%s without dispatch id: message %q", w.name, env.Message)
			}
		}
	}
	hsWantUnauthorized(t, "legacy GET", hsSend(t, k, hsAgentReq(t, k, a, "GET", ex, nil, hsSig{legacy: true})))
	hsWantUnauthorized(t, "legacy metadata", hsSend(t, k, hsAgentReq(t, k, a, "PUT", "/v0/agents/strict/metadata", []byte(`{}`), hsSig{legacy: true})))
	hsUnchanged(t, k, run.id, before, "a refused request under --require-v1-signatures")

	// GETs and metadata need no dispatch headers and ignore malformed ones.
	k.Must(200, hsSend(t, k, hsAgentReq(t, k, a, "GET", ex+"/steps", nil, hsSig{})))
	k.Must(200, hsSend(t, k, hsAgentReq(t, k, a, "GET", ex, nil, hsSig{dispatchID: "abc"})))
	k.Must(204, hsSend(t, k, hsAgentReq(t, k, a, "PUT", "/v0/agents/strict/metadata", []byte(`{"description":"strict"}`), hsSig{})))
	// With both headers every write works.
	k.Must(204, hsSend(t, k, hsAgentReq(t, k, a, "POST", ex+"/steps/"+sid+"/stream", []byte(`{"seq":1,"data":"x"}`), full)))
	k.Must(204, hsSend(t, k, hsAgentReq(t, k, a, "POST", ex+"/heartbeat", nil, full)))
	if d := a.Submit(run.id, run.lease, `{"kind":"tool_call","target":"new"}`); d.Decision != "proceed" {
		t.Fatalf("submit with both headers: %+v", d)
	}
	if d := a.Complete(run.id, sid, run.lease, `1`); d.Decision != "recorded" {
		t.Fatalf("step complete with both headers: %+v", d)
	}
	a.Finish(run.id, run.lease, `"done"`)
	if e := k.Execution(run.id); e["status"] != "completed" {
		t.Fatalf("execution %v", e)
	}
}
