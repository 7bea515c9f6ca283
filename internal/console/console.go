// Package console serves the web console at /ui/: static files built into
// the binary, a page that calls the same /v0 API as every other client with
// the session cookie, so that every permission check is the API's own. The
// console holds no data and reads no store.
package console

import (
	"crypto/sha256"
	"embed"
	"encoding/hex"
	"fmt"
	"io/fs"
	"net/http"
	"path"
	"strings"
)

//go:embed ui
var files embed.FS

// Path is where the console is served; every page is under it.
const Path = "/ui/"

// securityHeaders keep the console's pages to themselves: scripts and styles
// from the console only (no inline code, so markup that slipped into a page
// could run nothing), requests to this origin only, no framing.
var securityHeaders = map[string]string{
	"Content-Security-Policy": "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; " +
		"connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
	"X-Content-Type-Options": "nosniff",
	"X-Frame-Options":        "DENY",
	"Referrer-Policy":        "no-referrer",
}

// contentTypes names the types of the console's files; the system's MIME
// tables are not consulted, so every machine serves the same.
var contentTypes = map[string]string{
	".html": "text/html; charset=utf-8",
	".js":   "text/javascript; charset=utf-8",
	".css":  "text/css; charset=utf-8",
	".svg":  "image/svg+xml",
}

// asset is one embedded file, ready to serve.
type asset struct {
	body        []byte
	contentType string
	etag        string
}

// Handler serves the console: files under /ui/assets/, and the page itself
// for every other path under /ui/ (the page routes in the browser).
type Handler struct {
	assets map[string]asset
	page   asset
}

// New loads the embedded files.
func New() *Handler {
	h := &Handler{assets: map[string]asset{}}
	err := fs.WalkDir(files, "ui", func(name string, d fs.DirEntry, err error) error {
		if err != nil || d.IsDir() {
			return err
		}
		body, err := files.ReadFile(name)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(body)
		a := asset{body: body, contentType: contentTypes[path.Ext(name)], etag: `"` + hex.EncodeToString(sum[:8]) + `"`}
		if a.contentType == "" {
			return fmt.Errorf("%s: no content type for its extension", name)
		}
		h.assets[strings.TrimPrefix(name, "ui/")] = a
		return nil
	})
	if err != nil {
		panic("console: reading the embedded files: " + err.Error()) // a broken build, never a runtime condition
	}
	h.page = h.assets["index.html"]
	return h
}

// Owns reports whether a request path belongs to the console.
func Owns(p string) bool { return p == strings.TrimSuffix(Path, "/") || strings.HasPrefix(p, Path) }

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		w.Header().Set("Allow", "GET, HEAD")
		http.Error(w, "method not allowed", http.StatusMethodNotAllowed)
		return
	}
	for k, v := range securityHeaders {
		w.Header().Set(k, v)
	}
	a := h.page
	if rest, ok := strings.CutPrefix(r.URL.Path, Path+"assets/"); ok {
		var found bool
		if a, found = h.assets["assets/"+rest]; !found {
			http.Error(w, "not found", http.StatusNotFound)
			return
		}
	}
	w.Header().Set("Content-Type", a.contentType)
	// Files change with the binary: a browser keeps them but asks again.
	w.Header().Set("Cache-Control", "no-cache")
	w.Header().Set("ETag", a.etag)
	if r.Header.Get("If-None-Match") == a.etag {
		w.WriteHeader(http.StatusNotModified)
		return
	}
	if r.Method == http.MethodHead {
		return
	}
	w.Write(a.body)
}

// Mount serves the console beside another handler (the API), which gets
// every path outside the console untouched.
func Mount(console, other http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if Owns(r.URL.Path) {
			console.ServeHTTP(w, r)
			return
		}
		other.ServeHTTP(w, r)
	})
}
