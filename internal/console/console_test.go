package console

import (
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
)

func serve(h http.Handler, method, target string, header ...string) *httptest.ResponseRecorder {
	r := httptest.NewRequest(method, target, nil)
	for i := 0; i+1 < len(header); i += 2 {
		r.Header.Set(header[i], header[i+1])
	}
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, r)
	return rec
}

// Every console path is the page, except the files under assets/, and every
// answer carries the headers that keep scripts to the console's own.
func TestHandler(t *testing.T) {
	h := New()
	for _, p := range []string{"/ui", "/ui/", "/ui/executions/0190aaaa-0000-7000-8000-000000000000", "/ui/sign-in", "/ui/no/such/page"} {
		rec := serve(h, "GET", p)
		if rec.Code != 200 || rec.Header().Get("Content-Type") != "text/html; charset=utf-8" || !strings.Contains(rec.Body.String(), `src="/ui/assets/app.js"`) {
			t.Fatalf("GET %s: %d %q", p, rec.Code, rec.Header().Get("Content-Type"))
		}
		if csp := rec.Header().Get("Content-Security-Policy"); !strings.Contains(csp, "script-src 'self'") || strings.Contains(csp, "unsafe") {
			t.Fatalf("GET %s: CSP %q", p, csp)
		}
		if rec.Header().Get("X-Content-Type-Options") != "nosniff" || rec.Header().Get("X-Frame-Options") != "DENY" {
			t.Fatalf("GET %s: headers %v", p, rec.Header())
		}
	}
	rec := serve(h, "GET", "/ui/assets/app.js")
	if rec.Code != 200 || !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/javascript") || rec.Header().Get("Cache-Control") != "no-cache" {
		t.Fatalf("app.js: %d %v", rec.Code, rec.Header())
	}
	etag := rec.Header().Get("ETag")
	if rec := serve(h, "GET", "/ui/assets/app.js", "If-None-Match", etag); rec.Code != 304 || rec.Body.Len() != 0 {
		t.Fatalf("a matching ETag: %d", rec.Code)
	}
	if rec := serve(h, "GET", "/ui/assets/style.css"); !strings.HasPrefix(rec.Header().Get("Content-Type"), "text/css") {
		t.Fatalf("style.css: %q", rec.Header().Get("Content-Type"))
	}
	if rec := serve(h, "GET", "/ui/assets/missing.js"); rec.Code != 404 {
		t.Fatalf("a missing asset: %d", rec.Code)
	}
	if rec := serve(h, "HEAD", "/ui/"); rec.Code != 200 || rec.Body.Len() != 0 {
		t.Fatalf("HEAD: %d, %d bytes", rec.Code, rec.Body.Len())
	}
	if rec := serve(h, "POST", "/ui/"); rec.Code != 405 || rec.Header().Get("Allow") != "GET, HEAD" {
		t.Fatalf("POST: %d %v", rec.Code, rec.Header())
	}
}

// Nothing in the console parses text as HTML: every page builds its nodes,
// and data only ever becomes text (dom.js).
func TestNoHTMLParsing(t *testing.T) {
	for name, a := range New().assets {
		if !strings.HasSuffix(name, ".js") {
			continue
		}
		for _, sink := range []string{"innerHTML", "outerHTML", "insertAdjacentHTML", "document.write", "eval(", "new Function", "DOMParser", "createContextualFragment"} {
			if strings.Contains(string(a.body), sink) {
				t.Errorf("%s uses %s", name, sink)
			}
		}
	}
}

// The console's paths go to the console; everything else reaches the API as
// it came (no cleaning, no redirects).
func TestMount(t *testing.T) {
	var got []string
	api := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { got = append(got, r.URL.Path) })
	h := Mount(New(), api)
	for _, p := range []string{"/v0/executions", "//v0/x", "/uix", "/", "/metrics"} {
		serve(h, "GET", p)
	}
	if strings.Join(got, " ") != "/v0/executions //v0/x /uix / /metrics" {
		t.Fatalf("the API got %q", got)
	}
	if rec := serve(h, "GET", "/ui/"); rec.Code != 200 || len(got) != 5 {
		t.Fatalf("the console path: %d, API calls %d", rec.Code, len(got))
	}
}

// The page asks for every module at once (modulepreload) instead of
// discovering them import by import.
func TestPagePreloadsEveryModule(t *testing.T) {
	h := New()
	page := string(h.page.body)
	for name := range h.assets {
		if strings.HasSuffix(name, ".js") && name != "assets/app.js" && !strings.Contains(page, `<link rel="modulepreload" href="/ui/`+name+`">`) {
			t.Errorf("index.html does not preload %s", name)
		}
	}
}
