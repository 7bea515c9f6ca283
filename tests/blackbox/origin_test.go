package blackbox

// Black-box tests of the checks that keep web pages from driving a kernel
// whose auth is off (docs/protocol): what a page in a browser can send
// without a preflight, and a DNS-rebinding name.

import (
	"net/http"
	"strings"
	"testing"

	kt "github.com/rebuno/rebuno/tests/kerneltest"
)

func TestBrowserShapedRequests(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{})
	a := k.NewAgent("victim", "")
	run := hsStartRun(t, k, a, `null`)
	before := hsSnapshot(t, k, run.id)
	agents := hsAgentsBody(t, k)
	send := func(method, path, contentType, body string, header map[string]string) *kt.Response {
		t.Helper()
		req, err := http.NewRequest(method, k.URL+path, strings.NewReader(body))
		if err != nil {
			t.Fatal(err)
		}
		req.Header.Set("Content-Type", contentType)
		k.Authorize(req)
		for name, v := range header {
			if name == "Host" {
				req.Host = v
				continue
			}
			req.Header.Set(name, v)
		}
		return hsSend(t, k, req)
	}
	attacker := map[string]string{"Origin": "http://attacker.example", "Sec-Fetch-Site": "cross-site"}
	for _, c := range []struct {
		name, method, path, contentType, body string
		header                                map[string]string
		status                                int
		code                                  string
	}{
		// <form method=post action=http://127.0.0.1:8080/v0/agents>
		{"form POST registering an agent", "POST", "/v0/agents", "application/x-www-form-urlencoded",
			"id=evil&webhook_url=http://attacker.example/hook&secret=x", attacker, 403, "forbidden"},
		// fetch(url, {method: "POST", mode: "no-cors", body: JSON.stringify(...)}): text/plain
		{"text/plain fetch repointing an agent", "POST", "/v0/agents", "text/plain;charset=UTF-8",
			`{"id":"victim","webhook_url":"http://attacker.example/hook","secret":"stolen-secret-0001"}`, attacker, 403, "forbidden"},
		{"text/plain fetch dropping a policy", "POST", "/v0/policies/victim", "text/plain", `{"bundle":""}`, attacker, 403, "forbidden"},
		{"text/plain creating an execution", "POST", "/v0/executions", "text/plain", `{"agent_id":"victim"}`,
			map[string]string{"Origin": "http://attacker.example"}, 403, "forbidden"},
		{"a sandboxed page cancelling", "POST", "/v0/executions/" + run.id + "/cancel", "", "", map[string]string{"Origin": "null"}, 403, "forbidden"},
		{"a beacon without Origin", "POST", "/v0/executions", "text/plain", `{"agent_id":"victim"}`, nil, 415, "unsupported_media_type"},
		{"a multipart form without Origin", "POST", "/v0/agents", "multipart/form-data; boundary=b",
			"--b\r\nContent-Disposition: form-data; name=id\r\n\r\nevil\r\n--b--\r\n", nil, 415, "unsupported_media_type"},
		// A rebinding page reads through its own name: refused on reads too.
		{"rebinding read of executions", "GET", "/v0/executions", "", "", map[string]string{"Host": "attacker.example:8080"}, 403, "forbidden"},
		{"rebinding read of an agent", "GET", "/v0/agents/victim", "", "", map[string]string{"Host": "attacker.example"}, 403, "forbidden"},
		{"rebinding create with JSON", "POST", "/v0/executions", "application/json", `{"agent_id":"victim"}`,
			map[string]string{"Host": "attacker.example"}, 403, "forbidden"},
	} {
		r := send(c.method, c.path, c.contentType, c.body, c.header)
		hsWantErr(t, r, c.status, c.code)
	}
	hsUnchanged(t, k, run.id, before, "browser-shaped requests")
	if got := hsAgentsBody(t, k); got != agents {
		t.Fatalf("browser-shaped requests changed the agents: %s", got)
	}
	if n := len(hsExecutionIDs(t, k, "")); n != 1 {
		t.Fatalf("browser-shaped requests created executions: %d", n)
	}
	// Clients that are not browsers keep working: JSON without Origin, to
	// the listen address or localhost.
	k.Must(201, send("POST", "/v0/executions", "application/json", `{"agent_id":"victim"}`, nil))
	k.Must(200, send("GET", "/v0/executions", "", "", map[string]string{"Host": strings.Replace(strings.TrimPrefix(k.URL, "http://"), "127.0.0.1", "localhost", 1)}))
}

// A name the operator lists is served, and so is an origin the operator
// allows (a console on another host, say).
func TestAllowedHostsAndOrigins(t *testing.T) {
	t.Parallel()
	k := kt.Start(t, kt.Options{Args: []string{"--allowed-hosts", "rebuno.internal", "--allowed-origins", "https://console.example.com"}})
	k.NewAgent("listed", "")
	req, _ := http.NewRequest("POST", k.URL+"/v0/executions", strings.NewReader(`{"agent_id":"listed"}`))
	k.Authorize(req)
	req.Host = "rebuno.internal:8080"
	req.Header.Set("Origin", "https://console.example.com")
	k.Must(201, hsSend(t, k, req))
	req, _ = http.NewRequest("POST", k.URL+"/v0/executions", strings.NewReader(`{"agent_id":"listed"}`))
	k.Authorize(req)
	req.Header.Set("Origin", "https://other.example.com")
	hsWantErr(t, hsSend(t, k, req), 403, "forbidden")
}
