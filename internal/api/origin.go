package api

import (
	"fmt"
	"mime"
	"net"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"github.com/rebuno/rebuno/internal/kernel"
	"github.com/rebuno/rebuno/internal/wire"
)

// A kernel on a developer's machine runs with auth off, and any web page the
// developer visits can send requests to it. Three checks keep browsers out
// while leaving every non-browser client (SDKs, the CLI, curl, the published
// client) untouched:
//
//   - Host: a page on a name the attacker controls can rebind that name to
//     127.0.0.1 and read the answers, but its requests still carry the
//     attacker's name in Host. Only the listen address's host, localhost, IP
//     addresses and names the operator lists are served.
//   - Origin / Sec-Fetch-Site: a cross-site form or fetch can change state
//     without reading the answer (CSRF). Browsers mark such requests; those
//     marked as coming from another origin are refused unless listed.
//   - Content-Type: a cross-site "simple" request can only send form or
//     text/plain bodies without a preflight, so JSON routes require
//     application/json, which no simple request can carry.
//
// docs/protocol describes the rules; docs/configuration.md how to allow a name.

// originPolicy holds what the checks allow.
type originPolicy struct {
	anyHost    bool
	hosts      []string // lowercase names besides localhost and IPs
	listenIP   net.IP   // the listener's IP; nil when it listens on a name or on every interface
	allIfaces  bool     // the listener accepts every interface: any IP literal addresses it
	origins    []string // lowercase scheme://host[:port]
	listenName string   // the listener's host when it is a name
}

func newOriginPolicy(listenAddr string, hosts, origins []string) *originPolicy {
	p := &originPolicy{}
	for _, h := range hosts {
		if h == "*" {
			p.anyHost = true
		}
		p.hosts = append(p.hosts, strings.TrimSuffix(strings.ToLower(h), "."))
	}
	for _, o := range origins {
		p.origins = append(p.origins, strings.TrimSuffix(strings.ToLower(o), "/"))
	}
	host, _, err := net.SplitHostPort(listenAddr)
	switch ip := net.ParseIP(host); {
	case err != nil, host == "", ip != nil && ip.IsUnspecified():
		p.allIfaces = true
	case ip != nil:
		p.listenIP = ip
	default:
		p.listenName = strings.ToLower(host)
	}
	return p
}

// check refuses a request a browser page may have sent on someone else's
// behalf.
func (p *originPolicy) check(r *http.Request) error {
	if !p.hostAllowed(r.Host) {
		return &kernel.Error{Code: wire.CodeForbidden, Message: fmt.Sprintf("forbidden: host %q is not served here; "+
			"add it with --allowed-hosts (REBUNO_ALLOWED_HOSTS) if clients reach the kernel by that name", hostOnly(r.Host))}
	}
	switch r.Method {
	case http.MethodGet, http.MethodHead, http.MethodOptions:
		return nil
	}
	if origins := r.Header.Values("Origin"); len(origins) > 0 {
		if len(origins) == 1 && p.originAllowed(origins[0], r.Host) {
			return nil
		}
		return &kernel.Error{Code: wire.CodeForbidden, Message: fmt.Sprintf("forbidden: cross-origin request from %q refused; "+
			"add the origin with --allowed-origins (REBUNO_ALLOWED_ORIGINS) to let that page make changes", strings.Join(origins, ", "))}
	}
	if r.Header.Get("Sec-Fetch-Site") == "cross-site" {
		return &kernel.Error{Code: wire.CodeForbidden, Message: "forbidden: cross-site request refused"}
	}
	return nil
}

func (p *originPolicy) hostAllowed(hostport string) bool {
	if p.anyHost || hostport == "" {
		// An empty Host comes only from HTTP/1.0 clients, never a browser.
		return true
	}
	host := strings.TrimSuffix(strings.ToLower(hostOnly(hostport)), ".")
	if host == "localhost" || host == p.listenName || slices.Contains(p.hosts, host) {
		return true
	}
	ip := net.ParseIP(host)
	if ip == nil {
		return false
	}
	// An IP literal cannot be rebound; it still has to address this listener.
	return ip.IsLoopback() || p.allIfaces || ip.Equal(p.listenIP)
}

// originAllowed accepts the request's own origin (the console served by this
// kernel) and the listed ones.
func (p *originPolicy) originAllowed(origin, requestHost string) bool {
	o := strings.ToLower(origin)
	if slices.Contains(p.origins, o) {
		return true
	}
	u, err := url.Parse(o)
	if err != nil || u.Host == "" || (u.Scheme != "http" && u.Scheme != "https") {
		return false // includes "null", sent by sandboxed and file:// pages
	}
	return u.Host == strings.ToLower(requestHost)
}

func hostOnly(hostport string) string {
	if h, _, err := net.SplitHostPort(hostport); err == nil {
		return h
	}
	return strings.Trim(hostport, "[]")
}

// checkContentType insists on application/json for a route with a JSON body.
// An empty body without a type is left to the body rules (400): it is no
// JSON object whatever its type says, and it changes nothing.
func (c *call) checkContentType() error {
	ct := c.r.Header.Get("Content-Type")
	if c.route.body != bodyJSON || (ct == "" && len(c.body) == 0) {
		return nil
	}
	if mt, _, err := mime.ParseMediaType(ct); err == nil && mt == "application/json" {
		return nil
	}
	if ct == "" {
		ct = "none"
	}
	return &kernel.Error{Code: wire.CodeUnsupportedMedia,
		Message: fmt.Sprintf("unsupported media type: the body must be sent as application/json (got %s)", ct)}
}
