package api

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/rebuno/rebuno/internal/jsonx"
	"github.com/rebuno/rebuno/internal/wire"
)

func hdr(kv ...string) http.Header {
	h := http.Header{}
	for i := 0; i+1 < len(kv); i += 2 {
		h.Add(kv[i], kv[i+1])
	}
	return h
}

// A request addressed to a name the kernel does not serve is refused before
// anything else, whatever the route: a DNS-rebinding page sends its own name.
func TestHostCheck(t *testing.T) {
	for _, tt := range []struct {
		name, listen string
		allowed      []string
		host         string
		ok           bool
	}{
		{"localhost", "127.0.0.1:8080", nil, "localhost:8080", true},
		{"loopback IP", "127.0.0.1:8080", nil, "127.0.0.1:8080", true},
		{"loopback IPv6", "127.0.0.1:8080", nil, "[::1]:8080", true},
		{"another loopback IP", "127.0.0.1:8080", nil, "127.0.0.2:8080", true},
		{"rebinding name", "127.0.0.1:8080", nil, "attacker.example:8080", false},
		{"rebinding name without port", "127.0.0.1:8080", nil, "attacker.example", false},
		{"listed name", "127.0.0.1:8080", []string{"Rebuno.Internal"}, "rebuno.internal.:8080", true},
		{"any name", "127.0.0.1:8080", []string{"*"}, "whatever.example", true},
		{"other IP on a loopback listener", "127.0.0.1:8080", nil, "10.1.2.3:8080", false},
		{"IP on an all-interfaces listener", ":8080", nil, "10.1.2.3:8080", true},
		{"name on an all-interfaces listener", "0.0.0.0:8080", nil, "kernel.example", false},
		{"the listener's own name", "devbox:8080", nil, "DEVBOX:8080", true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			v := newEnv(t, func(o *Options) { o.ListenAddr, o.AllowedHosts = tt.listen, tt.allowed })
			rec := v.do(req{method: "GET", target: "/v0/health", header: hdr("Host", tt.host)})
			if tt.ok && rec.Code != 200 {
				t.Fatalf("status %d, want 200: %s", rec.Code, rec.Body)
			}
			if !tt.ok {
				e := errorOf(t, rec, 403, wire.CodeForbidden)
				if !strings.Contains(e.Get("message").Str, "--allowed-hosts") {
					t.Fatalf("the refusal does not say how to allow the name: %s", rec.Body)
				}
			}
		})
	}
	// Before routing: an unknown path on a refused host is 403, not 404.
	v := newEnv(t, func(o *Options) { o.ListenAddr = "127.0.0.1:8080" })
	errorOf(t, v.do(req{method: "GET", target: "/nowhere", header: hdr("Host", "attacker.example")}), 403, wire.CodeForbidden)
}

// The shapes a page can send without a preflight, and the marks browsers put
// on cross-site requests: none of them reaches a verb. Non-browser clients
// (no Origin, JSON bodies) and the kernel's own origin are served.
func TestBrowserRequests(t *testing.T) {
	v := newEnv(t, func(o *Options) {
		o.ListenAddr = "127.0.0.1:8080"
		o.AllowedOrigins = []string{"https://console.example.com"}
	})
	v.agent("a1")
	create := `{"agent_id":"a1"}`
	refused := []struct {
		name   string
		header http.Header
		status int
		code   string
	}{
		{"simple form POST", hdr("Origin", "http://attacker.example", "Content-Type", "application/x-www-form-urlencoded"), 403, wire.CodeForbidden},
		{"text/plain fetch", hdr("Origin", "http://attacker.example", "Content-Type", "text/plain"), 403, wire.CodeForbidden},
		{"JSON from another origin", hdr("Origin", "http://attacker.example"), 403, wire.CodeForbidden},
		{"another port of localhost", hdr("Origin", "http://localhost:3000"), 403, wire.CodeForbidden},
		{"a sandboxed page", hdr("Origin", "null"), 403, wire.CodeForbidden},
		{"cross-site without Origin", hdr("Sec-Fetch-Site", "cross-site"), 403, wire.CodeForbidden},
		{"text/plain body without Origin", hdr("Content-Type", "text/plain"), 415, wire.CodeUnsupportedMedia},
		{"form body without Origin", hdr("Content-Type", "multipart/form-data; boundary=x"), 415, wire.CodeUnsupportedMedia},
	}
	for _, c := range refused {
		rec := v.do(req{method: "POST", target: "/v0/executions", body: create, header: c.header})
		errorOf(t, rec, c.status, c.code)
	}
	list := v.do(req{method: "GET", target: "/v0/executions"})
	if !strings.Contains(list.Body.String(), `"executions":[]`) {
		t.Fatalf("a refused request created an execution: %s", list.Body)
	}
	accepted := []http.Header{
		nil, // SDKs, the CLI, curl: no Origin
		hdr("Origin", "http://localhost:8080", "Host", "localhost:8080"), // the kernel's own console
		hdr("Origin", "https://console.example.com"),                     // a listed origin
		hdr("Content-Type", "application/json; charset=utf-8", "Sec-Fetch-Site", "same-origin"),
	}
	for i, h := range accepted {
		if rec := v.do(req{method: "POST", target: "/v0/executions", body: create, header: h}); rec.Code != 201 {
			t.Fatalf("accepted[%d]: status %d: %s", i, rec.Code, rec.Body)
		}
	}
	// Reads from another origin are not refused: the browser keeps their
	// answers from the page (no CORS headers), and the Host check stops
	// rebinding.
	if rec := v.do(req{method: "GET", target: "/v0/executions", header: hdr("Origin", "http://attacker.example")}); rec.Code != 200 {
		t.Fatalf("cross-origin read: status %d", rec.Code)
	}
}

// The HTTP server's own answers to requests it cannot parse carry the JSON
// envelope too, except 431.
func TestServerErrorsUseTheEnvelope(t *testing.T) {
	v := newEnv(t)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := &http.Server{Handler: v.s, MaxHeaderBytes: 4 << 10, ReadHeaderTimeout: 5 * time.Second}
	go srv.Serve(Listener(ln))
	defer srv.Close()
	raw := func(request string) (*http.Response, []byte) {
		t.Helper()
		c, err := net.Dial("tcp", ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		c.SetDeadline(time.Now().Add(10 * time.Second))
		if _, err := io.WriteString(c, request); err != nil {
			t.Fatal(err)
		}
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		if err != nil {
			t.Fatal(err)
		}
		defer resp.Body.Close()
		body, _ := io.ReadAll(resp.Body)
		return resp, body
	}
	for name, request := range map[string]string{
		"control byte in a header": "GET /v0/health HTTP/1.1\r\nHost: localhost\r\nX-Bad: a\x01b\r\n\r\n",
		"malformed request line":   "GET\r\nHost: localhost\r\n\r\n",
		"bad header name":          "GET /v0/health HTTP/1.1\r\nHost: localhost\r\nBad Name: x\r\n\r\n",
	} {
		resp, body := raw(request)
		if resp.StatusCode != 400 || resp.Header.Get("Content-Type") != "application/json; charset=utf-8" ||
			resp.Header.Get(wire.HeaderRequestID) == "" {
			t.Fatalf("%s: %d %v %q", name, resp.StatusCode, resp.Header, body)
		}
		e, err := jsonx.Parse(body, 8)
		if err != nil || e.Get("code") == nil || e.Get("code").Str != wire.CodeValidation ||
			!strings.HasPrefix(e.Get("message").Str, "validation error: malformed request") {
			t.Fatalf("%s: body %q", name, body)
		}
	}
	resp, _ := raw("GET /v0/health HTTP/1.1\r\nHost: localhost\r\nX-Big: " + strings.Repeat("a", 8<<10) + "\r\n\r\n")
	if resp.StatusCode != 431 {
		t.Fatalf("oversized headers: status %d, want 431", resp.StatusCode)
	}
	// A well-formed request is untouched by the listener.
	resp, body := raw("GET /v0/health HTTP/1.1\r\nHost: localhost\r\nConnection: close\r\n\r\n")
	if resp.StatusCode != 200 || !strings.Contains(string(body), `"ok"`) {
		t.Fatalf("health through the listener: %d %q", resp.StatusCode, body)
	}
}
