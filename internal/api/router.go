package api

import (
	"sort"
	"strings"
)

// authKind says how a route authenticates its caller (docs/protocol/auth.md §1).
type authKind int

const (
	authNone authKind = iota
	authBearer
	authHMAC
	authDual
)

// bodyKind says what a route reads from its body.
type bodyKind int

const (
	bodyNone  bodyKind = iota // absent or ignored
	bodyJSON                  // one JSON object, sent as application/json
	bodyEmpty                 // read (to sign it) and required to be empty: the heartbeat
)

// route is one row of the route table (docs/protocol/http.md §10). Patterns are matched segment by
// segment; a segment in braces captures a parameter.
type route struct {
	method  string
	pattern string
	auth    authKind
	// body is what the route reads; bodyNone routes (GET, cancel, delete)
	// neither read nor limit theirs.
	body bodyKind
	// streaming routes have no overall write timeout.
	streaming bool
	// role is what a bearer caller's role must allow (wire.RoleAllows).
	role     string
	handle   func(c *call) error
	segments []string
}

// needs sets the role a bearer caller needs.
func (r *route) needs(role string) *route {
	r.role = role
	return r
}

// router matches paths exactly: no cleaning, no redirects, a trailing slash
// is a different (unknown) path, as docs/protocol/http.md §7 requires.
type router struct {
	routes []*route
}

func (rt *router) add(r *route) {
	r.segments = strings.Split(strings.TrimPrefix(r.pattern, "/"), "/")
	rt.routes = append(rt.routes, r)
}

// match returns the route for method and path, its parameters, and when the
// path is known but the method is not, the methods it allows.
func (rt *router) match(method, path string) (*route, map[string]string, []string) {
	if !strings.HasPrefix(path, "/") {
		return nil, nil, nil
	}
	segs := strings.Split(path[1:], "/")
	var allowed []string
	for _, r := range rt.routes {
		params, ok := matchSegments(r.segments, segs)
		if !ok {
			continue
		}
		if r.method == method {
			return r, params, nil
		}
		allowed = append(allowed, r.method)
	}
	sort.Strings(allowed)
	return nil, nil, allowed
}

func matchSegments(pattern, segs []string) (map[string]string, bool) {
	if len(pattern) != len(segs) {
		return nil, false
	}
	var params map[string]string
	for i, p := range pattern {
		if strings.HasPrefix(p, "{") {
			if segs[i] == "" {
				return nil, false
			}
			if params == nil {
				params = map[string]string{}
			}
			params[p[1:len(p)-1]] = segs[i]
			continue
		}
		if p != segs[i] {
			return nil, false
		}
	}
	return params, true
}

// allowHeader lists methods for a 405 answer.
func allowHeader(methods []string) string {
	out := methods[:0]
	for i, m := range methods {
		if i == 0 || m != methods[i-1] {
			out = append(out, m)
		}
	}
	return strings.Join(out, ", ")
}
